/* relayc's native CPU decoder: the layers of one paged Llama forward in one call.
 *
 * Built at run time by relayc/engine/native.py (cc -O3 -march=native, cached) and called
 * through ctypes, which releases the GIL. It runs what LlamaDecoderLayer does for the
 * uniform paged modes (decode, verify, padded extend: every request has Q new tokens):
 * RMSNorm, the fused q/k/v projection, rotary (rotate-half, signed sine table), the K/V
 * write, masked attention over the gathered slots with grouped KV heads, o_proj and the
 * residual, RMSNorm, the fused gate/up projection, SiLU * up, down_proj and the residual.
 *
 * Every output element of every product is one accumulator summed over k = 0..K-1 in
 * order, and every attention row is computed on its own, so a token's result does not
 * depend on how many rows the call has: a one-token decode and a verify row over the
 * same context give the same bits. Weights come packed in 16-column panels (see gemm);
 * the GEMMs stream each weight once for up to six rows at a time (eight with
 * AVX512-BF16, sixteen with AMX), which is what a small-batch forward is bound by.
 *
 * Three weight types, the same layer code:
 *   relayc_decoder       float32 weights and K/V cache.
 *   relayc_decoder_blocks_ex
 *                        a GGUF file's Q4/Q5/Q8 and Q4_K-Q6_K blocks (each weight its
 *                        own format, or float32 panels), rebuilt to float32 in
 *                        registers (see gemm_blocks): the bits of relayc_decoder over the
 *                        dequantized weights, at a sixth (Q4) or a quarter (Q8) of the
 *                        bytes. float32 activations and K/V cache.
 *   relayc_decoder_bf16  bfloat16 weights and K/V cache (half the bytes to stream). Each
 *                        GEMM rounds its input activations to bfloat16 and sums exact
 *                        bfloat16 products in float32 (as torch's bf16 matmul does), with
 *                        AMX tiles, AVX512-BF16 or widened weights: one kernel per process,
 *                        the best the CPU has (see gemm_bf16). The residual stream, norms,
 *                        rotary and attention are float32 throughout the call. The K/V
 *                        cache is bfloat16: new K/V are rounded to nearest-even on the
 *                        write (as torch's .to(bfloat16)), and every row, the new tokens'
 *                        included, reads them back from the cache, so the eager layers and
 *                        this code share one cache and a row never sees unrounded K/V.
 */
#if defined(__linux__)
#define _GNU_SOURCE /* syscall(), for AMX's arch_prctl: -std=c11 hides it */
#endif
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

static inline v8 splat(float s) { return (v8){s, s, s, s, s, s, s, s}; }

/* acc + a * b rounded once (a fused multiply-add) wherever the CPU has one, else rounded
 * twice: every float32 GEMM of one build sums the same way, so its rows agree bit for bit
 * across row counts and weight formats (float32 panels or GGUF blocks). */
static inline v8 fma8(v8 acc, v8 a, v8 b) {
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    return acc + a * b;
#endif
}

/* Weights come packed in panels of 16 columns: panel p holds w[k, 16p .. 16p + 16) for
 * k = 0..K-1, contiguous, so each panel is one sequential stream (a [K, N] row-major
 * weight read 16 columns at a time would touch a new page per k).
 *
 * block_MB_P: out[m, 16*p0 .. 16*(p0 + P)) (+)= x[m, :] @ panels p0 .. p0 + P, m < MB. */
#define GEMM_BLOCK(MB, P)                                                                  \
    static void block_##MB##_##P(const float *x, int K, const float *w, int p0, int N,      \
                                 float *out, int add) {                                    \
        v8 acc[MB][P][2];                                                                  \
        const float *panel[P];                                                             \
        for (int j = 0; j < P; j++) panel[j] = w + (size_t)(p0 + j) * K * 16;              \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j][0] = acc[m][j][1] = splat(0.0f);         \
        for (int k = 0; k < K; k++) {                                                      \
            v8 w0[P], w1[P];                                                               \
            for (int j = 0; j < P; j++) {                                                  \
                w0[j] = load8(panel[j] + (size_t)k * 16);                                  \
                w1[j] = load8(panel[j] + (size_t)k * 16 + 8);                              \
            }                                                                              \
            for (int m = 0; m < MB; m++) {                                                 \
                v8 s = splat(x[(size_t)m * K + k]);                                        \
                for (int j = 0; j < P; j++) {                                              \
                    acc[m][j][0] = fma8(acc[m][j][0], s, w0[j]);                           \
                    acc[m][j][1] = fma8(acc[m][j][1], s, w1[j]);                           \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++)                                                    \
                for (int h = 0; h < 2; h++) {                                              \
                    float *o = out + (size_t)m * N + (size_t)(p0 + j) * 16 + 8 * h;        \
                    store8(o, add ? load8(o) + acc[m][j][h] : acc[m][j][h]);               \
                }                                                                          \
    }

GEMM_BLOCK(1, 6)
GEMM_BLOCK(1, 1)
GEMM_BLOCK(2, 3)
GEMM_BLOCK(2, 1)
GEMM_BLOCK(3, 2)
GEMM_BLOCK(3, 1)
GEMM_BLOCK(4, 1)
GEMM_BLOCK(5, 1)
GEMM_BLOCK(6, 1)

typedef void (*block_fn)(const float *, int, const float *, int, int, float *, int);

/* out[M, N] (+)= x[M, K] @ w (packed, N a multiple of 16). Six panels (96 columns) at a
 * time, every block of up to six rows over them while they sit in L2, so the weight is
 * read from memory once whatever M is; as many panels per call as keep twelve
 * accumulators. */
static void gemm(const float *x, int M, int K, const float *w, int N, float *out, int add) {
    static const block_fn wide[7] = {0, block_1_6, block_2_3, block_3_2, block_4_1, block_5_1,
                                     block_6_1};
    static const block_fn narrow[7] = {0, block_1_1, block_2_1, block_3_1, block_4_1,
                                       block_5_1, block_6_1};
    static const int width[7] = {0, 6, 3, 2, 1, 1, 1};
    const int panels = N / 16;
    for (int g = 0; g < panels; g += 6) {
        const int end = g + 6 < panels ? g + 6 : panels;
        for (int m0 = 0, mb; m0 < M; m0 += mb) {
            /* four and five rows go as 2 + 2 and 3 + 2: twelve accumulators beat eight */
            mb = M - m0 >= 6 ? 6 : (M - m0 == 4 || M - m0 == 5) ? M - m0 - 2 : M - m0;
            const float *xr = x + (size_t)m0 * K;
            float *orow = out + (size_t)m0 * N;
            int p = g;
            for (; p + width[mb] <= end; p += width[mb]) wide[mb](xr, K, w, p, N, orow, add);
            for (; p < end; p++) narrow[mb](xr, K, w, p, N, orow, add);
        }
    }
}

/* float32 -> bfloat16, round to nearest even (torch's rounding; NaN stays a quiet NaN). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bfloat16 GEMMs: out[M, N] (+)= bf16(x)[M, K] @ w.
 *
 * The activations are rounded to bfloat16 (nearest even, to_bf16) at every GEMM's input,
 * as torch's bfloat16 matmul does, so each product is of two bfloat16s: exact in float32
 * (8 + 8 significant bits), and a fused and an unfused multiply-add give the same bits.
 * Three kernels compute it, one per process (relayc_bf16_kernel, chosen once: the best
 * the CPU and OS support), for every GEMM and row count, so a token's bits never depend on
 * the rows beside it nor on which shape picked which kernel:
 *
 *   BF16_AMX       AMX tiles (_tile_dpbf16ps: 16 rows x 16 columns x 32 k per
 *                  instruction), rows in tiles of 16 (padded with zero rows).
 *   BF16_AVX512    AVX512-BF16 (vdpbf16ps: 16 columns x one k pair per instruction).
 *   BF16_PORTABLE  widens the weights to float32 in registers (any CPU).
 *
 * Every kernel sums each output over the k pairs in order, each pair as acc += odd
 * product, then acc += even product, rounding after each (what vdpbf16ps does, measured
 * on AMD Zen 5: tests/engine/test_cpu_decoder_bf16.py), so BF16_AVX512 and BF16_PORTABLE
 * give the same bits but for subnormals (vdpbf16ps flushes them to zero). AMX's rounding
 * inside a tile op is the hardware's: its bits may differ from the other two in the last
 * place, never between rows or row counts (a tile row's sums read only that row of A).
 *
 * Weights come as bfloat16 panels of 16 columns in AMX's VNNI layout, packed once
 * (relayc.engine.cpu_decoder._pack): K is padded with zeros to Kp, a multiple of 32 (one
 * AMX tile's depth), and panel p is Kp / 2 pairs of 64 bytes; pair i holds 16 words,
 * column c's = w[2i, 16p + c] | w[2i + 1, 16p + c] << 16. The activations are rounded into
 * xb[rows, Kp] (zero past K, and past M up to a whole tile of rows), so the padding adds
 * 0 * 0 to every sum, for every kernel and row count alike. */
enum { BF16_PORTABLE = 0, BF16_AVX512 = 1, BF16_AMX = 2 };

static inline int padded_k(int K) { return (K + 31) / 32 * 32; }

/* Rows of xb a GEMM over M rows needs: from 16 rows AMX reads whole tiles of 16, below
 * it tiles of M rows (gemm_amx). */
static inline int padded_rows(int M) { return M < 16 ? M : (M + 15) / 16 * 16; }
/* The rows of gemm_amx's A and C tiles. */
static inline int amx_tile_rows(int M) { return M < 16 ? M : 16; }

/* x[n] <- x rounded to bfloat16 (to_bf16) and widened back: what a bfloat16 tensor holds. */
static inline void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = from_bf16(to_bf16(x[i]));
}

/* xb[padded_rows(M), Kp] <- bfloat16(x[M, K]), zero past K and past M. */
static void round_rows(const float *x, int M, int K, uint16_t *xb) {
    const int Kp = padded_k(K), rows = padded_rows(M);
    for (int m = 0; m < M; m++) {
        uint16_t *r = xb + (size_t)m * Kp;
        for (int k = 0; k < K; k++) r[k] = to_bf16(x[(size_t)m * K + k]);
        memset(r + K, 0, sizeof(uint16_t) * (size_t)(Kp - K));
    }
    memset(xb + (size_t)M * Kp, 0, sizeof(uint16_t) * (size_t)(rows - M) * Kp);
}

typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline v16 splat16(float s) { return (v16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

/* acc + a * b as gemm's fma8 computes it (one rounding wherever the CPU fuses), sixteen
 * lanes at a time. The bf16 kernels' products are exact (bfloat16 times bfloat16), so for
 * them a fused and an unfused multiply-add give the same bits anyway. */
static inline v16 fma16(v16 acc, v16 a, v16 b) {
#if defined(__AVX512F__)
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#else
    v8 halves[3][2];
    memcpy(halves[0], &acc, sizeof acc);
    memcpy(halves[1], &a, sizeof a);
    memcpy(halves[2], &b, sizeof b);
    for (int h = 0; h < 2; h++) halves[0][h] = fma8(halves[0][h], halves[1][h], halves[2][h]);
    memcpy(&acc, halves[0], sizeof acc);
    return acc;
#endif
}

/* One pair of a panel widened: shifting each word left by 16 gives w[2i] as a float32,
 * masking its low half gives w[2i + 1]. */
static inline void widen_pair(const uint16_t *p, v16 *even, v16 *odd) {
    u32x16 w;
    memcpy(&w, p, sizeof w);
    const u32x16 lo = w << 16, hi = w & 0xffff0000u;
    memcpy(even, &lo, sizeof lo);
    memcpy(odd, &hi, sizeof hi);
}

/* out[m, 16p .. 16p + 16) = r, or += r where add. */
static inline void store16(float *o, v16 r, int add) {
    if (add) {
        v16 prev;
        memcpy(&prev, o, sizeof prev);
        r = prev + r;
    }
    memcpy(o, &r, sizeof r);
}

/* portable_MB_P: out[m, 16*p0 .. 16*(p0 + P)) (+)= xb[m, :] @ panels p0 .. p0 + P. */
#define PORTABLE_BLOCK(MB, P)                                                              \
    static void portable_##MB##_##P(const uint16_t *x, int Kp, const uint16_t *w, int p0,   \
                                    int N, float *out, int add) {                          \
        v16 acc[MB][P];                                                                    \
        const uint16_t *panel[P];                                                          \
        for (int j = 0; j < P; j++) panel[j] = w + (size_t)(p0 + j) * Kp * 16;             \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = splat16(0.0f);                         \
        for (int i = 0; i < Kp / 2; i++) {                                                 \
            v16 even[P], odd[P];                                                           \
            for (int j = 0; j < P; j++) widen_pair(panel[j] + (size_t)i * 32, &even[j], &odd[j]); \
            for (int m = 0; m < MB; m++) {                                                 \
                const v16 s0 = splat16(from_bf16(x[(size_t)m * Kp + 2 * i]));              \
                const v16 s1 = splat16(from_bf16(x[(size_t)m * Kp + 2 * i + 1]));          \
                for (int j = 0; j < P; j++) {                                              \
                    acc[m][j] = fma16(acc[m][j], s1, odd[j]);                              \
                    acc[m][j] = fma16(acc[m][j], s0, even[j]);                             \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++)                                                    \
                store16(out + (size_t)m * N + (size_t)(p0 + j) * 16, acc[m][j], add);      \
    }

PORTABLE_BLOCK(1, 6)
PORTABLE_BLOCK(1, 1)
PORTABLE_BLOCK(2, 3)
PORTABLE_BLOCK(2, 1)
PORTABLE_BLOCK(3, 2)
PORTABLE_BLOCK(3, 1)
PORTABLE_BLOCK(4, 2)
PORTABLE_BLOCK(4, 1)
PORTABLE_BLOCK(5, 2)
PORTABLE_BLOCK(5, 1)
PORTABLE_BLOCK(6, 2)
PORTABLE_BLOCK(6, 1)

typedef void (*bf16_block_fn)(const uint16_t *, int, const uint16_t *, int, int, float *, int);

/* A kernel's blocks: wide[mb] covers width[mb] panels of mb rows, narrow[mb] one panel;
 * the walk takes `group` panels at a time (a multiple of every width). */
struct bf16_blocks {
    bf16_block_fn wide[9], narrow[9];
    int width[9], group, rows;
};

static const struct bf16_blocks portable_blocks = {
    {0, portable_1_6, portable_2_3, portable_3_2, portable_4_2, portable_5_2, portable_6_2},
    {0, portable_1_1, portable_2_1, portable_3_1, portable_4_1, portable_5_1, portable_6_1},
    {0, 6, 3, 2, 2, 2, 2},
    6,
    6,
};

/* The walk of gemm: `group` panels at a time, every block of up to six rows over them
 * while they sit in L2, so the weight is read from memory once whatever M is. */
static void walk_bf16(const struct bf16_blocks *b, const uint16_t *xb, int M, int Kp,
                      const uint16_t *w, int N, float *out, int add) {
    const int panels = N / 16;
    for (int g = 0; g < panels; g += b->group) {
        const int end = g + b->group < panels ? g + b->group : panels;
        for (int m0 = 0, mb; m0 < M; m0 += mb) {
            mb = M - m0 >= b->rows ? b->rows : M - m0;
            const uint16_t *xr = xb + (size_t)m0 * Kp;
            float *orow = out + (size_t)m0 * N;
            int p = g;
            for (; p + b->width[mb] <= end; p += b->width[mb]) b->wide[mb](xr, Kp, w, p, N, orow, add);
            for (; p < end; p++) b->narrow[mb](xr, Kp, w, p, N, orow, add);
        }
    }
}

/* The x86 kernels are compiled for their own instruction sets (per-function target
 * attributes), so the library builds with any -march and calls them only where CPUID and
 * the OS say they run (bf16_supported). */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define RELAYC_X86_BF16 1
#include <cpuid.h>
#if defined(__linux__)
#define RELAYC_AMX 1
#include <sys/syscall.h>
#include <unistd.h>
#endif
#define AVX512_BF16_TARGET __attribute__((target("avx512f,avx512bf16")))

/* dp_MB_P: portable_MB_P with vdpbf16ps, one instruction per 16 columns, k pair and row. */
/* How many pairs (64 bytes each) ahead of its loads a block of rows prefetches each
 * panel: several rows of vdpbf16ps keep the core busy enough that the hardware prefetcher
 * falls behind (SmolLM2's LM head, 8 rows: 5.8 ms without, 4.0 with; 48 was the best of
 * 8 to 128 on AMD Zen 5). */
#define DP_AHEAD 48
#define DP_BLOCK(MB, P)                                                                    \
    static AVX512_BF16_TARGET void dp_##MB##_##P(const uint16_t *x, int Kp, const uint16_t *w, \
                                                 int p0, int N, float *out, int add) {     \
        __m512 acc[MB][P];                                                                 \
        const uint16_t *panel[P];                                                          \
        for (int j = 0; j < P; j++) panel[j] = w + (size_t)(p0 + j) * Kp * 16;             \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = _mm512_setzero_ps();                   \
        for (int i = 0; i < Kp / 2; i++) {                                                 \
            __m512bh wv[P];                                                                \
            for (int j = 0; j < P; j++) {                                                  \
                wv[j] = (__m512bh)_mm512_loadu_si512(panel[j] + (size_t)i * 32);           \
                if (MB > 1) /* one row keeps up with the hardware prefetcher alone */      \
                    _mm_prefetch((const char *)(panel[j] + (size_t)(i + DP_AHEAD) * 32),   \
                                 _MM_HINT_T0);                                             \
            }                                                                              \
            for (int m = 0; m < MB; m++) {                                                 \
                uint32_t pair;                                                             \
                memcpy(&pair, x + (size_t)m * Kp + 2 * i, sizeof pair);                    \
                const __m512bh a = (__m512bh)_mm512_set1_epi32((int)pair);                 \
                for (int j = 0; j < P; j++) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], a, wv[j]); \
            }                                                                              \
        }                                                                                  \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) {                                                  \
                float *o = out + (size_t)m * N + (size_t)(p0 + j) * 16;                    \
                __m512 r = acc[m][j];                                                      \
                if (add) r = _mm512_add_ps(_mm512_loadu_ps(o), r);                         \
                _mm512_storeu_ps(o, r);                                                    \
            }                                                                              \
    }

DP_BLOCK(1, 6)
DP_BLOCK(1, 1)
DP_BLOCK(2, 6)
DP_BLOCK(2, 1)
DP_BLOCK(3, 4)
DP_BLOCK(3, 1)
DP_BLOCK(4, 4)
DP_BLOCK(4, 1)
DP_BLOCK(5, 4)
DP_BLOCK(5, 1)
DP_BLOCK(6, 4)
DP_BLOCK(6, 1)
DP_BLOCK(7, 3)
DP_BLOCK(7, 1)
DP_BLOCK(8, 3)
DP_BLOCK(8, 1)

/* Up to 24 accumulators, 4 weight vectors and a broadcast: 29 of the 32 registers. */
static const struct bf16_blocks dp_blocks = {
    {0, dp_1_6, dp_2_6, dp_3_4, dp_4_4, dp_5_4, dp_6_4, dp_7_3, dp_8_3},
    {0, dp_1_1, dp_2_1, dp_3_1, dp_4_1, dp_5_1, dp_6_1, dp_7_1, dp_8_1},
    {0, 6, 6, 4, 4, 4, 4, 3, 3},
    12,
    8,
};

#if defined(RELAYC_AMX)
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

/* ldtilecfg's 64-byte operand, palette 1. */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* How many B tiles (1 KiB: 16 pairs of a panel) ahead of its loads each panel is
 * prefetched, continuing into the next group of panels at a group's end. A panel is only
 * K / 32 tiles long (18 for SmolLM2's 576), too short a stream for the hardware
 * prefetcher, and tileloadd from memory left AMX 1.7x slower than vdpbf16ps on a
 * one-row decode (Xeon with AMX, SmolLM2 in bfloat16: 47-52 ms against 28-30); with one
 * tile ahead 33-35 ms, and 8-16 rows 1.3x faster (bench/real_model_forward.py; 1 beat
 * 2, 3, 4 and 8). Prefetches only: the same bits. */
#define AMX_AHEAD 1

/* out[M, N] (+)= xb @ w with AMX: tiles 0-3 accumulate 16 rows x 4 panels, tile 4 holds
 * 16 rows x 32 k of xb, tiles 5-7 a panel's 16 pairs x 16 columns (64-byte rows: the
 * panel's layout as is). Below 16 rows the A and C tiles have M rows (amx_tile_rows: a
 * one-row decode 1.1-1.2x faster than with 16, as tdpbf16ps's work is the tile's rows; a
 * row's sums are the same, tested); from 16, every C tile is 16 rows (xb has zero rows up
 * to a multiple of 16) and only the rows below M are written out. Four panels at a time,
 * every tile of rows over them while they sit in L2, so the weight is read from memory
 * once whatever M is. */
static AMX_TARGET void gemm_amx(const uint16_t *xb, int M, int Kp, const uint16_t *w, int N,
                                float *out, int add) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 5 ? amx_tile_rows(M) : 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    /* GCC's tileloadd asm names no memory: keep the stores that rounded xb before it */
    __asm__ volatile("" ::: "memory");
    float tile[4][16][16] __attribute__((aligned(64)));
    const int panels = N / 16, depth = Kp / 32;
    const size_t stride = (size_t)Kp * 16, a_stride = (size_t)Kp * sizeof(uint16_t);
    for (int g = 0; g < panels; g += 4) {
        const int np = panels - g < 4 ? panels - g : 4;
        const uint16_t *b0 = w + (size_t)g * stride;
        for (int m0 = 0; m0 < M; m0 += 16) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int d = 0; d < depth; d++) {
                const uint16_t *b = b0 + (size_t)d * 16 * 32; /* 16 pairs of 32 halves */
                if (m0 == 0) { /* later row tiles find the panels in L2 */
                    int da = d + AMX_AHEAD, ga = g;
                    if (da >= depth) { /* the next group's first tiles */
                        da -= depth;
                        ga += 4;
                    }
                    const int na = panels - ga < 4 ? panels - ga : 4;
                    for (int j = 0; j < na; j++) {
                        const char *ahead =
                            (const char *)(w + (size_t)(ga + j) * stride + (size_t)da * 512);
                        for (int line = 0; line < 1024; line += 64)
                            _mm_prefetch(ahead + line, _MM_HINT_T0);
                    }
                }
                _tile_loadd(4, xb + (size_t)m0 * Kp + (size_t)d * 32, a_stride);
                _tile_loadd(5, b, 64);
                _tile_dpbf16ps(0, 4, 5);
                if (np > 1) {
                    _tile_loadd(6, b + stride, 64);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (np > 2) {
                    _tile_loadd(7, b + 2 * stride, 64);
                    _tile_dpbf16ps(2, 4, 7);
                }
                if (np > 3) {
                    _tile_loadd(5, b + 3 * stride, 64);
                    _tile_dpbf16ps(3, 4, 5);
                }
            }
            _tile_stored(0, tile[0], 64);
            _tile_stored(1, tile[1], 64);
            _tile_stored(2, tile[2], 64);
            _tile_stored(3, tile[3], 64);
            const int rows = M - m0 < 16 ? M - m0 : 16;
            for (int j = 0; j < np; j++)
                for (int r = 0; r < rows; r++) {
                    v16 v;
                    memcpy(&v, tile[j][r], sizeof v);
                    store16(out + (size_t)(m0 + r) * N + (size_t)(g + j) * 16, v, add);
                }
        }
    }
    _tile_release();
}
#endif /* RELAYC_AMX */

/* Which bf16 kernels this CPU and OS run: bit k set for kernel k. Asks once; AMX needs
 * the kernel's permission for the tile data state (Linux arch_prctl, once per process). */
static int bf16_probe(void) {
    int found = 1 << BF16_PORTABLE;
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return found;
    const int avx512f = (b >> 16) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    unsigned a1 = 0, b1, c1, d1;
    __get_cpuid_count(7, 1, &a1, &b1, &c1, &d1);
    /* the OS saves the AVX-512 state: XCR0 bits 1, 2, 5, 6, 7 */
    unsigned lo = 0, hi = 0;
    __get_cpuid(1, &a, &b, &c, &d);
    if ((c >> 27) & 1) __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (avx512f && ((a1 >> 5) & 1) && (lo & 0xe6) == 0xe6) found |= 1 << BF16_AVX512;
#if defined(RELAYC_AMX)
    /* ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18); granted already if oneDNN
       asked first; refused (then AVX512-BF16 runs) where a thread's sigaltstack is too
       small for the larger signal frame. */
    if (amx_tile && amx_bf16 && syscall(SYS_arch_prctl, 0x1023, 18) == 0) found |= 1 << BF16_AMX;
#else
    (void)amx_bf16;
    (void)amx_tile;
#endif
    return found;
}
#else
static int bf16_probe(void) { return 1 << BF16_PORTABLE; }
#endif /* RELAYC_X86_BF16 */

static int bf16_found = -1, bf16_chosen = -1;

/* Bit k set: kernel k runs here. */
int relayc_bf16_kernels(void) {
    int found = __atomic_load_n(&bf16_found, __ATOMIC_ACQUIRE);
    if (found < 0) {
        found = bf16_probe(); /* idempotent: two threads may both ask */
        __atomic_store_n(&bf16_found, found, __ATOMIC_RELEASE);
    }
    return found;
}

/* The kernel every bf16 GEMM of this process uses: want < 0 asks (the best supported,
 * chosen on first use); want >= 0 switches to kernel `want` (tests and benchmarks only:
 * rows computed before and after a switch differ in bits), -1 if it does not run here. */
int relayc_bf16_kernel(int want) {
    const int found = relayc_bf16_kernels();
    if (want >= 0) {
        if (want > BF16_AMX || !((found >> want) & 1)) return -1;
        __atomic_store_n(&bf16_chosen, want, __ATOMIC_RELEASE);
        return want;
    }
    int chosen = __atomic_load_n(&bf16_chosen, __ATOMIC_ACQUIRE);
    if (chosen < 0) {
        chosen = (found >> BF16_AMX) & 1 ? BF16_AMX : (found >> BF16_AVX512) & 1 ? BF16_AVX512
                                                                                  : BF16_PORTABLE;
        int unset = -1;
        if (!__atomic_compare_exchange_n(&bf16_chosen, &unset, chosen, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            chosen = unset;
    }
    return chosen;
}

/* out[M, N] (+)= bf16(x)[M, K] @ w with `kernel`; xb: padded_rows(M) x padded_k(K) halves
 * of scratch. */
static void gemm_bf16(const float *x, int M, int K, const uint16_t *w, int N, float *out,
                      int add, int kernel, uint16_t *xb) {
    const int Kp = padded_k(K);
    round_rows(x, M, K, xb);
#if defined(RELAYC_X86_BF16)
#if defined(RELAYC_AMX)
    if (kernel == BF16_AMX) {
        gemm_amx(xb, M, Kp, w, N, out, add);
        return;
    }
#endif
    if (kernel == BF16_AVX512) {
        walk_bf16(&dp_blocks, xb, M, Kp, w, N, out, add);
        return;
    }
#endif
    (void)kernel;
    walk_bf16(&portable_blocks, xb, M, Kp, w, N, out, add);
}

/* The block-quantized GEMMs: float32 activations, weights as a GGUF file stores them.
 *
 * llama.cpp's Q4_1, Q4_0 and Q8_0 types keep a weight row in blocks of 32 along k (the
 * reduction): Q4_1 a float16 scale d, a float16 offset m and 32 four-bit q, the weight
 * d * q + m; Q4_0 d * (q - 8), kept here as Q4_1 with m = -8d; Q8_0 d * q, q eight-bit
 * signed. Every such weight is a float32 number exactly: d * q is exact (11 + 8 bits), and
 * the one rounding of + m is what the `gguf` package's dequantize does. These kernels
 * rebuild each weight in registers that way and then run gemm's float32 arithmetic -- one
 * accumulator per output, acc = fma(x, w, acc) over k in order (fma8) -- so a forward over
 * the packed blocks gives the same bits as the float32 forward over the dequantized
 * weights, while streaming 0.625 (Q4) or 1.0625 (Q8) bytes a weight instead of four.
 *
 * Panels of 16 output columns, as gemm's, each a run of K / 32 blocks (K a multiple of 32):
 *   BLOCKS_Q4 (320 bytes): d[16], m[16] (float16 bits), then 16 rows of 16 bytes; row r,
 *                          byte c: q[2r] of column c in its low nibble, q[2r + 1] high.
 *   BLOCKS_Q8 (544 bytes): d[16], then 32 rows of 16 signed bytes, q[k] of column c.
 *   BLOCKS_Q4F (384 bytes): BLOCKS_Q4 with float32 d[16] and m[16] -- Q4_K, whose weight
 *                          is (d * sc) * q - dmin * m with 6-bit sc and m per 32 weights:
 *                          both products exact in float32, one rounding, as gguf's.
 *   BLOCKS_I8F (768 bytes): float32 d[16], m[16] for k 0-15, the same for k 16-31, then 32
 *                          rows of 16 signed bytes -- Q6_K (d * sc per 16 weights, m = 0),
 *                          Q5_0, Q5_1, Q5_K, and any stack of matrices in different
 *                          formats (a Q4_K_M file's q/k in Q4_K beside its v in Q6_K).
 *   BLOCKS_BF16, BLOCKS_F16 (1024 bytes): 32 rows of 16 bfloat16 or float16 weights -- a
 *                          float32 weight that is exactly such a number (a bf16 or fp16
 *                          checkpoint loaded as float32, the shipped EAGLE-3 heads),
 *                          widened exactly: half the bytes, the same bits.
 * (relayc.engine.checkpoints.blocks packs them from a GGUF file's tensors.) */
enum { BLOCKS_NONE = 0, BLOCKS_Q4 = 1, BLOCKS_Q8 = 2, BLOCKS_Q4F = 3, BLOCKS_I8F = 4,
       BLOCKS_BF16 = 5, BLOCKS_F16 = 6 };
enum { Q4_BYTES = 320, Q8_BYTES = 544, Q4F_BYTES = 384, I8F_BYTES = 768, WORD_BYTES = 1024 };

static inline int block_format(int format) {
    return format >= BLOCKS_Q4 && format <= BLOCKS_F16;
}

typedef uint8_t u8x16 __attribute__((vector_size(16)));
typedef int8_t i8x16 __attribute__((vector_size(16)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

/* 16 float16 bit patterns -> float32, exactly (zeros, subnormals and normals; the packer
 * refuses infinities and NaNs): the magnitude moved into float32's exponent and mantissa
 * fields reads as 2^-112 of the value, so one exact multiply by 2^112 rebuilds it. */
static inline v16 half16(const uint8_t *p) {
#if defined(__AVX512F__)
    /* vcvtph2ps: the same exact conversion in one instruction */
    return (v16)_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
#else
    u16x16 raw;
    memcpy(&raw, p, sizeof raw);
    const u32x16 h = __builtin_convertvector(raw, u32x16);
    const u32x16 mag = (h & 0x7fffu) << 13, sign = (h & 0x8000u) << 16;
    v16 f;
    memcpy(&f, &mag, sizeof f);
    f = f * splat16(0x1p112f);
    u32x16 bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* 16 signed bytes -> float32; 16 bytes' low and high nibbles -> float32 (one instruction
 * each way with AVX-512: compilers turn the generic conversion into scalar ones). */
static inline v16 signed16(const uint8_t *p) {
#if defined(__AVX512F__)
    return (v16)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)p)));
#else
    i8x16 bytes;
    memcpy(&bytes, p, sizeof bytes);
    return __builtin_convertvector(__builtin_convertvector(bytes, i32x16), v16);
#endif
}

static inline void nibbles16(const uint8_t *p, v16 *lo, v16 *hi) {
#if defined(__AVX512F__)
    /* each nibble picks its float from a table of 0..15 (vpermps reads an index's low four
       bits: no mask for the low nibble, no conversion for either) */
    const __m512 values = _mm512_setr_ps(0.0f, 1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f, 7.0f, 8.0f,
                                         9.0f, 10.0f, 11.0f, 12.0f, 13.0f, 14.0f, 15.0f);
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
    *lo = (v16)_mm512_permutexvar_ps(q, values);
    *hi = (v16)_mm512_permutexvar_ps(_mm512_srli_epi32(q, 4), values);
#else
    u8x16 bytes;
    memcpy(&bytes, p, sizeof bytes);
    const i32x16 q = __builtin_convertvector(bytes, i32x16);
    *lo = __builtin_convertvector(q & 15, v16);
    *hi = __builtin_convertvector(q >> 4, v16);
#endif
}

/* NIBBLE_BLOCK / ROW_BLOCK (NAME_MB_P): out[m, 16*p0 .. 16*(p0 + P)) (+)= x[m, :] @ panels
 * p0 .. p0 + P. A block of 32 k is BYTES long; SCALES(block, half, j) reads the scale d[j]
 * and offset mn[j] of its k 16 * half .. 16 * half + 15. NIBBLE_BLOCK: its q start at byte
 * BODY, 16 rows of 16 nibble pairs (the 4-bit formats); ROW_BLOCK: LOAD(block, k) reads
 * row k's 16 q (signed bytes, or two-byte words). REBUILD(d, q, m) makes each weight,
 * exactly as gguf's dequantize rounds it; the rows accumulate as gemm. */
#define NIBBLE_BLOCK(NAME, BYTES, BODY, SCALES, MB, P)                                     \
    static void NAME##_##MB##_##P(const float *x, int K, const uint8_t *w, int p0, int N,   \
                                  float *out, int add) {                                   \
        const int nb = K / 32;                                                             \
        v16 acc[MB][P];                                                                    \
        const uint8_t *panel[P];                                                           \
        for (int j = 0; j < P; j++) panel[j] = w + (size_t)(p0 + j) * nb * BYTES;          \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = splat16(0.0f);                         \
        for (int b = 0; b < nb; b++) {                                                     \
            v16 d[P], mn[P];                                                               \
            for (int j = 0; j < P; j++) SCALES(panel[j] + (size_t)b * BYTES, 0, j);        \
            for (int r = 0; r < 16 && MB <= 3; r++) /* few rows: weights used as rebuilt */  \
                for (int j = 0; j < P; j++) {                                              \
                    v16 lo, hi;                                                            \
                    nibbles16(panel[j] + (size_t)b * BYTES + BODY + 16 * r, &lo, &hi);     \
                    lo = fma16(mn[j], d[j], lo);                                           \
                    hi = fma16(mn[j], d[j], hi);                                           \
                    for (int m = 0; m < MB; m++) {                                         \
                        const float *xk = x + (size_t)m * K + (size_t)b * 32 + 2 * r;      \
                        acc[m][j] = fma16(acc[m][j], splat16(xk[0]), lo);                  \
                        acc[m][j] = fma16(acc[m][j], splat16(xk[1]), hi);                  \
                    }                                                                      \
                }                                                                          \
            for (int r = 0; r < 16 && MB > 3; r++) {                                       \
                v16 lo[P], hi[P];                                                          \
                for (int j = 0; j < P; j++) {                                              \
                    nibbles16(panel[j] + (size_t)b * BYTES + BODY + 16 * r, &lo[j], &hi[j]);  \
                    lo[j] = fma16(mn[j], d[j], lo[j]); /* d * q exact: one rounding */     \
                    hi[j] = fma16(mn[j], d[j], hi[j]);                                     \
                }                                                                          \
                for (int m = 0; m < MB; m++) {                                             \
                    const float *xk = x + (size_t)m * K + (size_t)b * 32 + 2 * r;          \
                    const v16 s0 = splat16(xk[0]), s1 = splat16(xk[1]);                    \
                    for (int j = 0; j < P; j++) {                                          \
                        acc[m][j] = fma16(acc[m][j], s0, lo[j]);                           \
                        acc[m][j] = fma16(acc[m][j], s1, hi[j]);                           \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
        }                                                                                  \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++)                                                    \
                store16(out + (size_t)m * N + (size_t)(p0 + j) * 16, acc[m][j], add);      \
    }

#define ROW_BLOCK(NAME, BYTES, SCALES, LOAD, REBUILD, MB, P)                              \
    static void NAME##_##MB##_##P(const float *x, int K, const uint8_t *w, int p0, int N,   \
                                  float *out, int add) {                                   \
        const int nb = K / 32;                                                             \
        v16 acc[MB][P];                                                                    \
        const uint8_t *panel[P];                                                           \
        for (int j = 0; j < P; j++) panel[j] = w + (size_t)(p0 + j) * nb * BYTES;          \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = splat16(0.0f);                         \
        for (int b = 0; b < nb; b++)                                                       \
            for (int half = 0; half < 2; half++) {                                         \
                v16 d[P], mn[P];                                                           \
                for (int j = 0; j < P; j++) SCALES(panel[j] + (size_t)b * BYTES, half, j); \
                for (int k = 16 * half; k < 16 * half + 16 && MB <= 3; k++)                \
                    for (int j = 0; j < P; j++) {                                          \
                        const v16 q = LOAD(panel[j] + (size_t)b * BYTES, k);               \
                        const v16 wk = REBUILD(d[j], q, mn[j]);                            \
                        for (int m = 0; m < MB; m++) {                                     \
                            const float xk = x[(size_t)m * K + (size_t)b * 32 + k];        \
                            acc[m][j] = fma16(acc[m][j], splat16(xk), wk);                 \
                        }                                                                  \
                    }                                                                      \
                for (int k = 16 * half; k < 16 * half + 16 && MB > 3; k++) {               \
                    v16 wk[P];                                                             \
                    for (int j = 0; j < P; j++) {                                          \
                        const v16 q = LOAD(panel[j] + (size_t)b * BYTES, k);               \
                        wk[j] = REBUILD(d[j], q, mn[j]);                                   \
                    }                                                                      \
                    for (int m = 0; m < MB; m++) {                                         \
                        const v16 s = splat16(x[(size_t)m * K + (size_t)b * 32 + k]);      \
                        for (int j = 0; j < P; j++) acc[m][j] = fma16(acc[m][j], s, wk[j]); \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++)                                                    \
                store16(out + (size_t)m * N + (size_t)(p0 + j) * 16, acc[m][j], add);      \
    }

/* 16 bfloat16 bit patterns -> float32, exactly (the top half of each float32). */
static inline v16 widen16(const uint8_t *p) {
#if defined(__AVX512F__)
    return (v16)_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)),
                                  16);
#else
    u16x16 raw;
    memcpy(&raw, p, sizeof raw);
    const u32x16 bits = __builtin_convertvector(raw, u32x16) << 16;
    v16 f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

/* Where each format keeps its scales: Q4 float16 d[16], m[16]; Q4F float32 d[16], m[16];
 * Q8 float16 d[16] (no offset); I8F float32 d[16], m[16] per half. */
#define Q4_SCALES(blk, half, j) (d[j] = half16(blk), mn[j] = half16((blk) + 32))
#define Q4F_SCALES(blk, half, j) (memcpy(&d[j], (blk), 64), memcpy(&mn[j], (blk) + 64, 64))
#define Q8_SCALES(blk, half, j) (d[j] = half16(blk), mn[j] = d[j])
#define I8F_SCALES(blk, half, j)                                                           \
    (memcpy(&d[j], (blk) + 128 * (half), 64), memcpy(&mn[j], (blk) + 128 * (half) + 64, 64))
/* Q8_0's weight is d * q, exact: no offset (an fma with m = 0 would turn -0 into +0). */
#define Q8_REBUILD(d, q, m) ((void)(m), (d) * (q))
#define I8F_REBUILD(d, q, m) fma16((m), (d), (q))
/* Row k of a block: 16 signed bytes after the scales (Q8 at byte 32, I8F at 256), or 16
 * two-byte words widened exactly (BF16, F16: no scales; the weight is the word). */
#define Q8_LOAD(blk, k) signed16((blk) + 32 + 16 * (k))
#define I8F_LOAD(blk, k) signed16((blk) + 256 + 16 * (k))
#define BF16_LOAD(blk, k) widen16((blk) + 32 * (k))
#define F16_LOAD(blk, k) half16((blk) + 32 * (k))
#define NO_SCALES(blk, half, j) ((void)(blk), d[j] = mn[j] = splat16(0.0f))
#define WORD_REBUILD(d, q, m) ((void)(d), (void)(m), (q))

#define Q4_BLOCK(MB, P) NIBBLE_BLOCK(q4, Q4_BYTES, 64, Q4_SCALES, MB, P)
#define Q4F_BLOCK(MB, P) NIBBLE_BLOCK(q4f, Q4F_BYTES, 128, Q4F_SCALES, MB, P)
#define Q8_BLOCK(MB, P) ROW_BLOCK(q8, Q8_BYTES, Q8_SCALES, Q8_LOAD, Q8_REBUILD, MB, P)
#define I8F_BLOCK(MB, P) ROW_BLOCK(i8f, I8F_BYTES, I8F_SCALES, I8F_LOAD, I8F_REBUILD, MB, P)
#define BF16_BLOCK(MB, P) ROW_BLOCK(bf16, WORD_BYTES, NO_SCALES, BF16_LOAD, WORD_REBUILD, MB, P)
#define F16_BLOCK(MB, P) ROW_BLOCK(f16, WORD_BYTES, NO_SCALES, F16_LOAD, WORD_REBUILD, MB, P)

typedef void (*quant_block_fn)(const float *, int, const uint8_t *, int, int, float *, int);

struct quant_blocks {
    quant_block_fn wide[9], narrow[9];
    int width[9];
    quant_block_fn few[4]; /* one to three rows alone (a decode, a short verify) */
    int few_width[4];      /* panels at a time of each */
    int bytes;             /* of one block of 32 k of a panel */
};

/* A format's kernels, 1-8 rows, and their table: four panels at a time up to five rows, two
 * past that; one, two or three rows alone (a decode, a short verify) eight, six and five.
 * Every accumulator is a chain of dependent fmas (k in order: the float32 bits), so a
 * kernel with few accumulators waits on the fma latency, not its throughput: two to five
 * rows over two panels (five over one) took 10-45% longer per weight than over four
 * (bench/block_kernels.py, every format; bench/native_ab.py: a SmolLM2 verify of 2-8 rows
 * 8-13% faster); six to eight rows over four were no faster. Up to three rows each panel's
 * weights are used as they are rebuilt, so fewer registers hold weights and more panels
 * fit: a SmolLM2 decode 7-9% faster over eight panels than over four (sixteen: 6% slower),
 * a verify of two rows 6% over six, of three 3% over five (six: 13% slower). */
#define QUANT_KERNELS(NAME, BLOCK, BYTES)                                                  \
    BLOCK(1, 8) BLOCK(1, 4) BLOCK(1, 1) BLOCK(2, 6) BLOCK(2, 4) BLOCK(2, 1) BLOCK(3, 5)     \
    BLOCK(3, 4) BLOCK(3, 1) BLOCK(4, 4) BLOCK(4, 1) BLOCK(5, 4) BLOCK(5, 1) BLOCK(6, 2)     \
    BLOCK(6, 1) BLOCK(7, 2) BLOCK(7, 1) BLOCK(8, 2) BLOCK(8, 1)                             \
    static const struct quant_blocks NAME##_blocks = {                                     \
        {0, NAME##_1_4, NAME##_2_4, NAME##_3_4, NAME##_4_4, NAME##_5_4, NAME##_6_2,         \
         NAME##_7_2, NAME##_8_2},                                                          \
        {0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, 4, 4, 4, 4, 4, 2, 2, 2},                                                       \
        {0, NAME##_1_8, NAME##_2_6, NAME##_3_5},                                           \
        {0, 8, 6, 5},                                                                      \
        BYTES,                                                                             \
    };

QUANT_KERNELS(q4, Q4_BLOCK, Q4_BYTES)
QUANT_KERNELS(q4f, Q4F_BLOCK, Q4F_BYTES)
QUANT_KERNELS(q8, Q8_BLOCK, Q8_BYTES)
QUANT_KERNELS(i8f, I8F_BLOCK, I8F_BYTES)
QUANT_KERNELS(bf16, BF16_BLOCK, WORD_BYTES)
QUANT_KERNELS(f16, F16_BLOCK, WORD_BYTES)

/* A block format's kernels and block size (`format` one of BLOCKS_*). */
static const struct quant_blocks *quant_table(int format) {
    return format == BLOCKS_Q4     ? &q4_blocks
           : format == BLOCKS_Q4F  ? &q4f_blocks
           : format == BLOCKS_I8F  ? &i8f_blocks
           : format == BLOCKS_BF16 ? &bf16_blocks
           : format == BLOCKS_F16  ? &f16_blocks
                                   : &q8_blocks;
}

/* out[M, N] (+)= x[M, K] @ w (block panels of `format`): four panels at a time, every block
 * of up to eight rows over them while they sit in L1/L2, so each block is read from memory
 * and rebuilt once per eight rows; one to three rows in one pass of their widest kernel. */
static void gemm_blocks(const float *x, int M, int K, const uint8_t *w, int N, float *out,
                        int add, int format) {
    const struct quant_blocks *b = quant_table(format);
    const int panels = N / 16;
    if (M >= 1 && M <= 3) { /* one row block: no group to keep in cache, the widest kernel */
        int p = 0;
        for (const int few = b->few_width[M]; p + few <= panels; p += few)
            b->few[M](x, K, w, p, N, out, add);
        for (; p + b->width[M] <= panels; p += b->width[M]) b->wide[M](x, K, w, p, N, out, add);
        for (; p < panels; p++) b->narrow[M](x, K, w, p, N, out, add);
        return;
    }
    for (int g = 0; g < panels; g += 4) {
        const int end = g + 4 < panels ? g + 4 : panels;
        for (int m0 = 0, mb; m0 < M; m0 += mb) {
            mb = M - m0 >= 8 ? 8 : M - m0;
            const float *xr = x + (size_t)m0 * K;
            float *orow = out + (size_t)m0 * N;
            int p = g;
            for (; p + b->width[mb] <= end; p += b->width[mb]) b->wide[mb](xr, K, w, p, N, orow, add);
            for (; p < end; p++) b->narrow[mb](xr, K, w, p, N, orow, add);
        }
    }
}

/* out[M, N] (+)= x @ w, w packed as float32 (kernel -1), bfloat16 panels (kernel >= 0: which
 * bf16 kernel; xb its scratch) or block panels (kernel -1 - format: gemm_blocks). */
static void gemm_any(const float *x, int M, int K, const void *w, int N, float *out, int add,
                     int kernel, uint16_t *xb) {
    if (kernel >= 0)
        gemm_bf16(x, M, K, (const uint16_t *)w, N, out, add, kernel, xb);
    else if (kernel < -1)
        gemm_blocks(x, M, K, (const uint8_t *)w, N, out, add, -1 - kernel);
    else
        gemm(x, M, K, (const float *)w, N, out, add);
}

/* sum_i a[i] * b[i]: eight lanes of partial sums, then the lanes in order. */
static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float sum = 0.0f;
    if (n >= 8) {
        v8 acc = splat(0.0f);
        for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
        for (int j = 0; j < 8; j++) sum += acc[j];
    }
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

static void rms_norm(const float *x, int T, int H, const float *weight, float eps, float *out) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H;
        float *ot = out + (size_t)t * H;
        float r = 1.0f / sqrtf(dot(xt, xt, H) / (float)H + eps);
        for (int i = 0; i < H; i++) ot[i] = weight[i] * (xt[i] * r);
    }
}

/* x[D] <- x * cos + roll(x, D/2) * sin (sin's first half negated: rotate-half). */
static void rotate(float *x, const float *cos_t, const float *sin_t, int D, float *tmp) {
    int half = D / 2;
    memcpy(tmp, x, sizeof(float) * (size_t)D);
    for (int i = 0; i < D; i++) x[i] = tmp[i] * cos_t[i] + tmp[(i + half) % D] * sin_t[i];
}

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

/* e^x, sixteen lanes, within about one ulp (Cody-Waite reduction by ln 2, then Cephes'
 * degree-6 polynomial; the same operations whatever the build, so the same bits):
 * subnormal results included, 0 below -104 (under half the smallest subnormal), +inf above
 * 88.7228317 (the largest float whose e^x is finite), NaN for NaN. */
static inline v16 exp16(v16 x) {
    typedef int32_t i32v __attribute__((vector_size(64)));
    const v16 lo = splat16(-104.0f), hi = splat16(88.72283172607421875f);
    const i32v small = x < lo, big = x > hi, nan = x != x, out = small | big | nan;
    /* the polynomial runs on x clamped into [lo, hi] (NaN on 0); those lanes are set last */
    i32v bits, lo_bits, hi_bits;
    memcpy(&bits, &x, sizeof x);
    memcpy(&lo_bits, &lo, sizeof lo);
    memcpy(&hi_bits, &hi, sizeof hi);
    bits = (bits & ~out) | (lo_bits & small) | (hi_bits & big);
    v16 xc;
    memcpy(&xc, &bits, sizeof xc);
    /* n = round(x / ln 2) (adding 1.5 * 2^23 rounds to nearest), r = x - n ln 2 */
    const v16 shift = splat16(12582912.0f);
    const v16 t = xc * splat16(1.44269504088896341f) + shift;
    const v16 n = t - shift;
    v16 r = xc - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    v16 p = splat16(1.9875691500e-4f);
    p = p * r + splat16(1.3981999507e-3f);
    p = p * r + splat16(8.3334519073e-3f);
    p = p * r + splat16(4.1665795894e-2f);
    p = p * r + splat16(1.6666665459e-1f);
    p = p * r + splat16(5.0000001201e-1f);
    p = p * (r * r) + r + splat16(1.0f);
    /* times 2^n (n in -150..128) as 2^a * 2^b, a = n >> 1: both normal, one rounding */
    i32v ni;
    memcpy(&ni, &t, sizeof t);
    ni -= 0x4B400000;
    const i32v a = ni >> 1, b = ni - a;
    const i32v a_bits = (a + 127) << 23, b_bits = (b + 127) << 23;
    v16 sa, sb;
    memcpy(&sa, &a_bits, sizeof sa);
    memcpy(&sb, &b_bits, sizeof sb);
    v16 y = p * sa * sb;
    i32v yb, inf_bits, x_bits;
    const v16 inf = splat16(INFINITY);
    memcpy(&yb, &y, sizeof y);
    memcpy(&inf_bits, &inf, sizeof inf);
    memcpy(&x_bits, &x, sizeof x);
    yb = (yb & ~out) | (inf_bits & big) | (x_bits & nan);
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* x[i] <- e^x[i], i < n: exp16 on each sixteen, the last few through a padded copy. */
static void exp_rows(float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16 y = exp16(load16(x + i));
        memcpy(x + i, &y, sizeof y);
    }
    if (i < n) {
        float pad[16] = {0};
        memcpy(pad, x + i, sizeof(float) * (size_t)(n - i));
        const v16 y = exp16(load16(pad));
        memcpy(x + i, &y, sizeof(float) * (size_t)(n - i));
    }
}

/* A cached context is far bigger than L2 once a forward's weights have streamed through,
 * and its rows lie wherever the pool put them: each key or value row is asked for this many
 * rows before it is read, so the reads overlap instead of waiting one by one. */
#define ATTEND_AHEAD 12
static inline void prefetch_row(const float *row, int D) {
    for (int i = 0; i < D; i += 16) __builtin_prefetch(row + i);
}

/* At most this many (query row, head) pairs share one pass over the keys and values. */
#define ATTEND_PAIRS 64
/* The widest head attend_values keeps in registers: 128 floats. */
#define ATTEND_MAX_D16 8

/* Four keys' dot products: acc[i] holds key i's sixteen lanes of products; lane i of the
 * result is their sum, in one tree for every key (halves, quarters, then pairs). */
static inline v4f sum16x4(const v16 acc[4]) {
    v4f b[4];
    for (int i = 0; i < 4; i++) {
        v8 h[2];
        memcpy(h, &acc[i], sizeof acc[i]);
        const v8 a = h[0] + h[1];
        v4f q[2];
        memcpy(q, &a, sizeof a);
        b[i] = q[0] + q[1]; /* a[l] + a[l + 4] */
    }
    /* lane i: (b_i[0] + b_i[2]) + (b_i[1] + b_i[3]) */
    const v4f e01 = __builtin_shufflevector(b[0], b[1], 0, 1, 4, 5) +
                    __builtin_shufflevector(b[0], b[1], 2, 3, 6, 7);
    const v4f e23 = __builtin_shufflevector(b[2], b[3], 0, 1, 4, 5) +
                    __builtin_shufflevector(b[2], b[3], 2, 3, 6, 7);
    return __builtin_shufflevector(e01, e23, 0, 2, 4, 6) +
           __builtin_shufflevector(e01, e23, 1, 3, 5, 7);
}

/* The scores of one pass (see attend_group): scores[pr * S + j] = q_pr . keys[j] * scale +
 * mask, -inf where masked, four keys at a time (a masked key among live ones is read and
 * its score dropped: every slot is inside the cache); top[pr] their maximum. D16 > 0:
 * D = 16 * D16, known here, so the products unroll; 0: any D (the products past the last
 * sixteen added after, in order). */
static inline __attribute__((always_inline)) void attend_scores(
    const float *q, size_t q_stride, const float *const *keys, const float *mask, int R, int G,
    int S, int D, const int D16, float scale, float *scores, float *top) {
    const int lanes = D16 ? D16 : D / 16;
    for (int j0 = 0; j0 < S; j0 += 4) {
        const int nk = S - j0 < 4 ? S - j0 : 4;
        const float *k[4];
        for (int i = 0; i < 4; i++) {
            k[i] = keys[j0 + (i < nk ? i : 0)]; /* past S: a copy of the first, discarded */
            if (j0 + i + ATTEND_AHEAD < S) prefetch_row(keys[j0 + i + ATTEND_AHEAD], D);
        }
        for (int r = 0; r < R; r++) {
            const float *m = mask + (size_t)r * S + j0;
            int any = 0;
            i32x4 live = {0, 0, 0, 0};
            v4f mv = {0.0f, 0.0f, 0.0f, 0.0f};
            for (int i = 0; i < nk; i++) {
                live[i] = !(isinf(m[i]) && m[i] < 0) ? -1 : 0;
                mv[i] = m[i];
                any |= live[i];
            }
            for (int g = 0; g < G; g++) {
                const int pr = r * G + g;
                float *out = scores + (size_t)pr * S + j0;
                if (!any) {
                    for (int i = 0; i < nk; i++) out[i] = -INFINITY;
                    continue;
                }
                const float *qp = q + (size_t)r * q_stride + (size_t)g * D;
                v16 acc[4];
                for (int i = 0; i < 4; i++) {
                    acc[i] = splat16(0.0f);
                    for (int c = 0; c < lanes; c++)
                        acc[i] = fma16(acc[i], load16(qp + 16 * c), load16(k[i] + 16 * c));
                }
                v4f sc = sum16x4(acc);
                if (!D16)
                    for (int i = 0; i < 4; i++)
                        for (int d = 16 * lanes; d < D; d++) sc[i] += qp[d] * k[i][d];
                sc = sc * (v4f){scale, scale, scale, scale} + mv;
                for (int i = 0; i < nk; i++) {
                    const float v = live[i] ? sc[i] : -INFINITY;
                    out[i] = v;
                    if (v > top[pr]) top[pr] = v;
                }
            }
        }
    }
}

/* out[g * D ..] (for g < G, at most 4 heads of one row) = sum over the unmasked keys of
 * p[g * S + j] * values[j], each head's sum in key order, kept in registers (D = 16 * D16). */
static inline __attribute__((always_inline)) void attend_values(
    const float *const *values, const float *mrow, int S, int G, const int D16, const float *p,
    float *out) {
    v16 acc[4][ATTEND_MAX_D16];
    for (int g = 0; g < 4; g++)
        for (int c = 0; c < D16; c++) acc[g][c] = splat16(0.0f);
    for (int j = 0; j < S; j++) {
        if (j + ATTEND_AHEAD < S) prefetch_row(values[j + ATTEND_AHEAD], 16 * D16);
        if (isinf(mrow[j]) && mrow[j] < 0) continue;
        const float *vv = values[j];
        for (int g = 0; g < 4; g++) {
            if (g >= G) break;
            const v16 pg = splat16(p[(size_t)g * S + j]);
            for (int c = 0; c < D16; c++) acc[g][c] = fma16(acc[g][c], pg, load16(vv + 16 * c));
        }
    }
    for (int g = 0; g < G; g++) memcpy(out + (size_t)g * 16 * D16, acc[g], sizeof(v16) * D16);
}

/* R query rows of one request, each with the G heads that share a KV head:
 * out_r[g * D ..] = softmax(q_rg . keys * scale + mask_r) @ values over the S keys
 * (keys[j], values[j]: D floats each), q_rg at q + r * q_stride + g * D, out_r at
 * out + r * out_stride, mask_r at mask + r * S. Each key row is read once for all R * G
 * pairs (R * G <= ATTEND_PAIRS) and each value row once per four heads of a row, while
 * it is in L2; a masked key (-inf) is skipped, and a row whose every key is masked gives
 * zeros. scores: R * G * S floats. A pair's arithmetic is the same whatever R, G, B or the
 * other rows, so a row decoded alone and the same row in a verify get the same bits. */
static void attend_group(const float *q, size_t q_stride, const float *const *keys,
                         const float *const *values, const float *mask, int R, int G, int S,
                         int D, float scale, float *scores, float *out, size_t out_stride) {
    const int pairs = R * G;
    float top[ATTEND_PAIRS], inv[ATTEND_PAIRS];
    for (int pr = 0; pr < pairs; pr++) top[pr] = -INFINITY;
    if (D == 64)
        attend_scores(q, q_stride, keys, mask, R, G, S, D, 4, scale, scores, top);
    else if (D == 128)
        attend_scores(q, q_stride, keys, mask, R, G, S, D, 8, scale, scores, top);
    else if (D == 32)
        attend_scores(q, q_stride, keys, mask, R, G, S, D, 2, scale, scores, top);
    else
        attend_scores(q, q_stride, keys, mask, R, G, S, D, 0, scale, scores, top);
    for (int pr = 0; pr < pairs; pr++) {
        float *sp = scores + (size_t)pr * S;
        const float *mr = mask + (size_t)(pr / G) * S;
        /* a row with no key computes e^(-inf - -inf) = NaN on its masked keys, never read */
        for (int j = 0; j < S; j++) sp[j] -= top[pr];
        exp_rows(sp, S);
        float total = 0.0f;
        for (int j = 0; j < S; j++)
            if (!(isinf(mr[j]) && mr[j] < 0)) total += sp[j];
        inv[pr] = total > 0.0f ? 1.0f / total : 0.0f;
    }
    for (int r = 0; r < R; r++) {
        const float *mr = mask + (size_t)r * S;
        float *orow = out + (size_t)r * out_stride;
        for (int g0 = 0; g0 < G; g0 += 4) {
            const int n = G - g0 < 4 ? G - g0 : 4;
            const float *p = scores + (size_t)(r * G + g0) * S;
            float *o = orow + (size_t)g0 * D;
            if (D == 64)
                attend_values(values, mr, S, n, 4, p, o);
            else if (D == 128)
                attend_values(values, mr, S, n, 8, p, o);
            else if (D == 32)
                attend_values(values, mr, S, n, 2, p, o);
            else { /* any D: the same sums, through memory */
                for (int i = 0; i < n * D; i++) o[i] = 0.0f;
                for (int j = 0; j < S; j++) {
                    if (isinf(mr[j]) && mr[j] < 0) continue;
                    const float *vv = values[j];
                    for (int g = 0; g < n; g++) {
                        const float pg = p[(size_t)g * S + j];
                        float *og = o + (size_t)g * D;
                        int i = 0;
                        for (; i + 16 <= D; i += 16) {
                            const v16 a = fma16(load16(og + i), splat16(pg), load16(vv + i));
                            memcpy(og + i, &a, sizeof a);
                        }
                        for (; i < D; i++) og[i] += pg * vv[i];
                    }
                }
            }
        }
        for (int g = 0; g < G; g++)
            for (int i = 0; i < D; i++) orow[(size_t)g * D + i] *= inv[r * G + g];
    }
}

/* The layers, float32 activations in x; weights and caches float32 (bf16 == 0) or
 * bfloat16 (bf16 == 1, the caches' elements uint16_t). */
static int decode_layers(
    int T, int hidden, int heads, int kv_heads, int head_dim, int inter, int layers, float *x,
    const float *cos_table, const float *sin_table, const int64_t *slots, const int64_t *kv_loc,
    const float *mask, int B, int Q, int S, const float *const *ln1, const void *const *w_qkv,
    const void *const *w_o, const float *const *ln2, const void *const *w_gate_up,
    const void *const *w_down, const float *eps1, const float *eps2, void *const *k_cache,
    void *const *v_cache, int64_t cache_rows, int bf16, const int *formats,
    const float *attn_in, int in_width, const int *capture, int n_capture, float *aux
) {
    if (T != B * Q || heads % kv_heads != 0 || hidden % 16 != 0 || inter % 8 != 0 ||
        (heads + 2 * kv_heads) * head_dim % 16 != 0)
        return -2;
    /* formats (NULL: none): each layer's q/k/v, o, gate/up and down weights as float32
       panels (0) or block panels of that format, whose K is then whole blocks of 32 */
    if (formats != NULL) {
        if (bf16) return -2;
        for (int l = 0; l < layers; l++) {
            const int k_of[4] = {l == 0 && attn_in != NULL ? in_width : hidden, heads * head_dim,
                                 hidden, inter};
            for (int i = 0; i < 4; i++) {
                const int f = formats[4 * l + i];
                if (f != BLOCKS_NONE && (!block_format(f) || k_of[i] % 32)) return -2;
            }
        }
    } /* every GEMM's output width a whole number of 16-column panels */
    /* Every slot this call writes or reads lies inside the cache: a bad index is an error
       the caller reports, never a write past the buffer. */
    for (int t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= cache_rows) return -3;
    for (size_t j = 0; j < (size_t)B * S; j++)
        if (kv_loc[j] < 0 || kv_loc[j] >= cache_rows) return -4;
    const int D = head_dim, group = heads / kv_heads;
    const int qkv_width = (heads + 2 * kv_heads) * D, row = kv_heads * D;
    const float scale = 1.0f / sqrtf((float)D);
    /* bf16: one request's keys and values of one KV head, widened from the cache */
    const size_t widened = bf16 ? (size_t)2 * S * D : 0;
    size_t floats = (size_t)T * hidden + (size_t)T * qkv_width + (size_t)T * heads * D +
                    (size_t)T * 2 * inter + (size_t)T * inter + (size_t)S * ATTEND_PAIRS +
                    (size_t)D + widened;
    /* bf16: one kernel for the whole call, and each GEMM's rounded input (the widest K) */
    const int kernel = bf16 ? relayc_bf16_kernel(-1) : -1;
    int widest = hidden > heads * D ? hidden : heads * D;
    widest = widest > inter ? widest : inter;
    if (attn_in != NULL) widest = widest > in_width ? widest : in_width;
    const size_t halves = bf16 ? (size_t)padded_rows(T) * padded_k(widest) : 0;
    float *buffer = (float *)malloc(sizeof(float) * floats);
    uint16_t *xb = (uint16_t *)malloc(sizeof(uint16_t) * (halves + 1));
    const float **rows_kv = (const float **)malloc(sizeof(float *) * (size_t)(2 * S + 1));
    /* Each request's live key columns (those some row of it attends), its mask over them,
     * and how many: the same for every layer. Masked columns add nothing to a row's sums
     * (attend_group skips them; each key's arithmetic is its own), so attending the live
     * ones alone gives the same bits -- and a caller's loose bound (a recorded step's
     * prefix bound is the KV table's width) costs nothing. */
    int64_t *live = (int64_t *)malloc(sizeof(int64_t) * ((size_t)B * S + 1));
    float *live_mask = (float *)malloc(sizeof(float) * ((size_t)B * Q * S + 1));
    int *live_count = (int *)malloc(sizeof(int) * ((size_t)B + 1));
    if (buffer == NULL || xb == NULL || rows_kv == NULL || live == NULL || live_mask == NULL ||
        live_count == NULL) {
        free(buffer);
        free(xb);
        free(rows_kv);
        free(live);
        free(live_mask);
        free(live_count);
        return -1;
    }
    for (int b = 0; b < B; b++) {
        const float *m = mask + (size_t)b * Q * S;
        int n = 0;
        for (int j = 0; j < S; j++) {
            int attended = 0;
            for (int q = 0; q < Q && !attended; q++) {
                const float v = m[(size_t)q * S + j];
                attended = !(isinf(v) && v < 0);
            }
            if (attended) live[(size_t)b * S + n++] = j;
        }
        live_count[b] = n;
        float *lm = live_mask + (size_t)b * Q * S;
        for (int q = 0; q < Q; q++)
            for (int i = 0; i < n; i++)
                lm[(size_t)q * n + i] = m[(size_t)q * S + live[(size_t)b * S + i]];
    }
    float *h = buffer, *qkv = h + (size_t)T * hidden, *attn = qkv + (size_t)T * qkv_width;
    float *gate_up = attn + (size_t)T * heads * D, *act = gate_up + (size_t)T * 2 * inter;
    float *scores = act + (size_t)T * inter, *tmp = scores + (size_t)S * ATTEND_PAIRS;
    float *kv_wide = tmp + D;
    const float **keys = rows_kv, **values = rows_kv + S;

    for (int l = 0; l < layers; l++) {
        /* each weight's kernel: bf16's, float32 panels' (-1) or its blocks' (-1 - format) */
        int kern[4];
        for (int i = 0; i < 4; i++)
            kern[i] = formats != NULL && formats[4 * l + i] ? -1 - formats[4 * l + i] : kernel;
        /* the residual stream entering layer l, for each capture naming it: aux[t] holds
           the captured layers' inputs side by side (EAGLE-3's features) */
        for (int c = 0; c < n_capture; c++)
            if (capture[c] == l)
                for (int t = 0; t < T; t++)
                    memcpy(aux + ((size_t)t * n_capture + c) * hidden, x + (size_t)t * hidden,
                           sizeof(float) * (size_t)hidden);
        if (l == 0 && attn_in != NULL) /* the first layer's attention reads attn_in as is */
            gemm_any(attn_in, T, in_width, w_qkv[0], qkv_width, qkv, 0, kern[0], xb);
        else {
            rms_norm(x, T, hidden, ln1[l], eps1[l], h);
            gemm_any(h, T, hidden, w_qkv[l], qkv_width, qkv, 0, kern[0], xb);
        }
        for (int t = 0; t < T; t++) {
            float *qt = qkv + (size_t)t * qkv_width;
            const float *c = cos_table + (size_t)t * D, *s = sin_table + (size_t)t * D;
            for (int hd = 0; hd < heads + kv_heads; hd++) rotate(qt + (size_t)hd * D, c, s, D, tmp);
            /* the K/V write, before any row reads the new tokens */
            const float *kt = qt + (size_t)heads * D, *vt = qt + (size_t)(heads + kv_heads) * D;
            if (bf16) {
                uint16_t *kc = (uint16_t *)k_cache[l] + (size_t)slots[t] * row;
                uint16_t *vc = (uint16_t *)v_cache[l] + (size_t)slots[t] * row;
                for (int i = 0; i < row; i++) {
                    kc[i] = to_bf16(kt[i]);
                    vc[i] = to_bf16(vt[i]);
                }
            } else {
                memcpy((float *)k_cache[l] + (size_t)slots[t] * row, kt, sizeof(float) * (size_t)row);
                memcpy((float *)v_cache[l] + (size_t)slots[t] * row, vt, sizeof(float) * (size_t)row);
            }
        }
        for (int b = 0; b < B; b++) {
            const int64_t *loc = kv_loc + (size_t)b * S, *cols = live + (size_t)b * S;
            const int n = live_count[b];
            const float *lm = live_mask + (size_t)b * Q * S;
            for (int kvh = 0; kvh < kv_heads; kvh++) {
                if (bf16) {
                    const uint16_t *kc = (const uint16_t *)k_cache[l] + (size_t)kvh * D;
                    const uint16_t *vc = (const uint16_t *)v_cache[l] + (size_t)kvh * D;
                    for (int j = 0; j < n; j++) {
                        float *kw = kv_wide + (size_t)j * D, *vw = kv_wide + (size_t)(S + j) * D;
                        const int64_t at = loc[cols[j]];
                        const uint16_t *ks = kc + (size_t)at * row, *vs = vc + (size_t)at * row;
                        for (int i = 0; i < D; i++) {
                            kw[i] = from_bf16(ks[i]);
                            vw[i] = from_bf16(vs[i]);
                        }
                        keys[j] = kw;
                        values[j] = vw;
                    }
                } else {
                    const float *kc = (const float *)k_cache[l] + (size_t)kvh * D;
                    const float *vc = (const float *)v_cache[l] + (size_t)kvh * D;
                    for (int j = 0; j < n; j++) {
                        keys[j] = kc + (size_t)loc[cols[j]] * row;
                        values[j] = vc + (size_t)loc[cols[j]] * row;
                    }
                }
                /* the group's heads, and as many of the request's rows as fit a pass */
                for (int hd = kvh * group; hd < (kvh + 1) * group; hd += ATTEND_PAIRS) {
                    const int left = (kvh + 1) * group - hd;
                    const int G = left < ATTEND_PAIRS ? left : ATTEND_PAIRS;
                    for (int q = 0, R; q < Q; q += R) {
                        R = Q - q < ATTEND_PAIRS / G ? Q - q : ATTEND_PAIRS / G;
                        const int t = b * Q + q;
                        attend_group(qkv + (size_t)t * qkv_width + (size_t)hd * D,
                                     (size_t)qkv_width, keys, values, lm + (size_t)q * n, R, G,
                                     n, D, scale, scores,
                                     attn + (size_t)t * heads * D + (size_t)hd * D,
                                     (size_t)heads * D);
                    }
                }
            }
        }
        gemm_any(attn, T, heads * D, w_o[l], hidden, x, 1, kern[1], xb);
        rms_norm(x, T, hidden, ln2[l], eps2[l], h);
        gemm_any(h, T, hidden, w_gate_up[l], 2 * inter, gate_up, 0, kern[2], xb);
        for (int t = 0; t < T; t++) {
            const float *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
            float *a = act + (size_t)t * inter;
            /* SiLU(g) * u = g / (1 + e^-g) * u, e^-g sixteen lanes at a time */
            for (int i = 0; i < inter; i++) a[i] = -g[i];
            exp_rows(a, inter);
            for (int i = 0; i < inter; i++) a[i] = g[i] / (1.0f + a[i]) * u[i];
        }
        gemm_any(act, T, inter, w_down[l], hidden, x, 1, kern[3], xb);
        /* bf16: the residual stream leaves every layer rounded to bfloat16, as the eager
         * bfloat16 layers keep it, so running the layers in segments (a forward that
         * captures some layers' inputs, EAGLE-3's) gives the bits of one call. */
        if (bf16)
            round_bf16(x, (size_t)T * hidden);
    }
    free(live_count);
    free(live_mask);
    free(live);
    free(rows_kv);
    free(xb);
    free(buffer);
    return 0;
}

#define DECODER_PARAMS(W, C)                                                                \
    int T, int hidden, int heads, int kv_heads, int head_dim, int inter, int layers,          \
        float *x,               /* [T, hidden] float32, updated in place */                  \
        const float *cos_table, /* [T, head_dim] */                                          \
        const float *sin_table, /* [T, head_dim], first half negated */                      \
        const int64_t *slots,   /* [T] KV slots the new tokens write */                      \
        const int64_t *kv_loc,  /* [B, S] KV slots each request's columns read */            \
        const float *mask,      /* [B, Q, S] additive: 0 or -inf */                          \
        int B, int Q, int S, const float *const *ln1, const W *const *w_qkv,                 \
        const W *const *w_o, const float *const *ln2, const W *const *w_gate_up,             \
        const W *const *w_down, const float *eps1, const float *eps2,                        \
        C *const *k_cache, C *const *v_cache, /* [cache_rows, kv_heads, head_dim] each */    \
        int64_t cache_rows

#define DECODER_ARGS                                                                        \
    T, hidden, heads, kv_heads, head_dim, inter, layers, x, cos_table, sin_table, slots,     \
        kv_loc, mask, B, Q, S, ln1, (const void *const *)w_qkv, (const void *const *)w_o,    \
        ln2, (const void *const *)w_gate_up, (const void *const *)w_down, eps1, eps2,        \
        (void *const *)k_cache, (void *const *)v_cache, cache_rows

/* float32 weights (16-column panels) and K/V cache. */
int relayc_decoder(DECODER_PARAMS(float, float)) {
    return decode_layers(DECODER_ARGS, 0, NULL, NULL, 0, NULL, 0, NULL);
}

/* bfloat16 weights (16-column panels of k pairs, see gemm_bf16) and K/V cache; norm
 * weights, x, the rotary tables and the mask float32. */
int relayc_decoder_bf16(DECODER_PARAMS(uint16_t, uint16_t)) {
    return decode_layers(DECODER_ARGS, 1, NULL, NULL, 0, NULL, 0, NULL);
}

/* The same layers with two options. attn_in [T, in_width] (float32, taken as already
 * normalised; NULL: none): the first layer's attention reads it instead of its input norm
 * of x -- EAGLE-3's draft layer, whose q/k/v read [norm(embed); hidden_norm(hidden)] while x
 * (the hidden input) stays the residual; ln1[0] and eps1[0] are then not read. capture
 * [n_capture] (layer indices; 0: none): the input of each of those layers is copied into
 * aux [T, n_capture * hidden], in capture's order -- EAGLE-3's target features, in the
 * forward's one call. */
int relayc_decoder_ex(DECODER_PARAMS(float, float), const float *attn_in, int in_width,
                      const int *capture, int n_capture, float *aux) {
    return decode_layers(DECODER_ARGS, 0, NULL, attn_in, in_width, capture, n_capture, aux);
}

int relayc_decoder_bf16_ex(DECODER_PARAMS(uint16_t, uint16_t), const float *attn_in,
                           int in_width, const int *capture, int n_capture, float *aux) {
    return decode_layers(DECODER_ARGS, 1, NULL, attn_in, in_width, capture, n_capture, aux);
}

/* The float32 layers (float32 K/V cache) with block-quantized weights: formats[4 * l + i]
 * is layer l's q/k/v (i = 0), o (1), gate/up (2) and down (3) weight's format -- 0 for
 * float32 panels, else BLOCKS_* panels of that format (see gemm_blocks). The
 * same bits as relayc_decoder_ex over the dequantized weights. */
int relayc_decoder_blocks_ex(DECODER_PARAMS(uint8_t, float), const int *formats,
                             const float *attn_in, int in_width, const int *capture,
                             int n_capture, float *aux) {
    if (formats == NULL) return -2;
    return decode_layers(DECODER_ARGS, 0, formats, attn_in, in_width, capture, n_capture, aux);
}

/* A running argmax with torch.argmax's rule -- the first index of the maximum, NaN counting
 * as the maximum (the first NaN) -- folded over a row's columns in order. */
struct running_max {
    float top;
    int64_t at;
    int nan;
};

static inline struct running_max running_max_start(void) {
    struct running_max s = {-INFINITY, 0, 0};
    return s;
}

/* Fold x[0 .. n) (the row's columns c0 .. c0 + n) into s: one pass for the chunk's maximum
 * and any NaN, then one for the first position of a NaN or of a new maximum. Only a
 * strictly greater maximum moves the index, so ties keep the first (-0 and +0 tie). */
static void running_max_fold(struct running_max *s, const float *x, int64_t n, int64_t c0) {
    if (s->nan || n < 1) return;
    float top = x[0];
    int nan = top != top;
    int64_t i = 1;
#if defined(__AVX512F__)
    /* four independent maxima: one would wait on each max's latency */
    __m512 best[4] = {_mm512_set1_ps(top), _mm512_set1_ps(top), _mm512_set1_ps(top),
                      _mm512_set1_ps(top)};
    __mmask16 unordered = 0;
    for (; i + 64 <= n; i += 64)
        for (int u = 0; u < 4; u++) {
            const __m512 v = _mm512_loadu_ps(x + i + 16 * u);
            unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
            best[u] = _mm512_max_ps(best[u], v);
        }
    for (; i + 16 <= n; i += 16) {
        const __m512 v = _mm512_loadu_ps(x + i);
        unordered |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        best[0] = _mm512_max_ps(best[0], v);
    }
    nan |= unordered != 0;
    if (!nan)
        top = _mm512_reduce_max_ps(
            _mm512_max_ps(_mm512_max_ps(best[0], best[1]), _mm512_max_ps(best[2], best[3])));
#endif
    for (; i < n && !nan; i++) {
        if (x[i] != x[i]) nan = 1;
        else if (x[i] > top) top = x[i];
    }
    if (!nan && !(top > s->top)) return; /* nothing here beats the maximum so far */
    int64_t at = 0;
#if defined(__AVX512F__)
    const __m512 want = _mm512_set1_ps(top);
    for (; at + 16 <= n; at += 16) {
        const __m512 v = _mm512_loadu_ps(x + at);
        const __mmask16 hit = nan ? _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)
                                  : _mm512_cmp_ps_mask(v, want, _CMP_EQ_OQ);
        if (hit) {
            at += __builtin_ctz(hit);
            break;
        }
    }
#endif
    if (nan) {
        while (x[at] == x[at]) at++;
    } else {
        while (x[at] != top) at++;
    }
    s->top = top;
    s->at = c0 + at;
    s->nan = nan;
}

/* Columns of logits per chunk when the head also takes the argmax: a chunk's rows (up to
 * eight decode or verify rows, 32 KB) are still in L1 when they are scanned. */
enum { ARGMAX_CHUNK = 1024 };

/* The final RMSNorm and the LM head over T rows: logits [T, vocab_padded] (the packed
 * head's columns past the vocabulary are zero). With `argmax` (else NULL), also each row's
 * argmax over its first `vocab` columns, as relayc_argmax gives it: the logits are made a
 * chunk of columns at a time (each column's sum is the same whatever the chunk) and each
 * chunk is scanned while it is hot, instead of a second pass over the whole rows. */
static int head_any(int T, int hidden, int vocab_padded, int vocab, const float *x,
                    const float *norm_weight, float eps, const void *head, float *logits,
                    int bf16, int blocks, int64_t *argmax) {
    if (vocab_padded % 16 != 0) return -2; /* hidden is the reduction: any size */
    if (blocks && (hidden % 32 || !block_format(blocks))) return -2;
    if (argmax != NULL && (vocab < 1 || vocab > vocab_padded)) return -2;
    const int kernel = bf16 ? relayc_bf16_kernel(-1) : blocks ? -1 - blocks : -1;
    const size_t halves = bf16 ? (size_t)padded_rows(T) * padded_k(hidden) : 0;
    float *h = (float *)malloc(sizeof(float) * (size_t)T * hidden);
    uint16_t *xb = (uint16_t *)malloc(sizeof(uint16_t) * (halves + 1));
    if (h == NULL || xb == NULL) {
        free(h);
        free(xb);
        return -1;
    }
    rms_norm(x, T, hidden, norm_weight, eps, h);
    if (argmax == NULL) {
        gemm_any(h, T, hidden, head, vocab_padded, logits, 0, kernel, xb);
        free(xb);
        free(h);
        return 0;
    }
    /* bytes of one 16-column panel of the packed head, by its layout */
    const size_t panel = bf16     ? (size_t)padded_k(hidden) * 16 * sizeof(uint16_t)
                         : blocks ? (size_t)(hidden / 32) * quant_table(blocks)->bytes
                                  : (size_t)hidden * 16 * sizeof(float);
    float *chunk = (float *)malloc(sizeof(float) * (size_t)T * ARGMAX_CHUNK);
    struct running_max *state = (struct running_max *)malloc(sizeof *state * (size_t)T);
    if (chunk == NULL || state == NULL) {
        free(chunk);
        free(state);
        free(xb);
        free(h);
        return -1;
    }
    for (int r = 0; r < T; r++) state[r] = running_max_start();
    for (int c0 = 0; c0 < vocab_padded; c0 += ARGMAX_CHUNK) {
        const int cols = vocab_padded - c0 < ARGMAX_CHUNK ? vocab_padded - c0 : ARGMAX_CHUNK;
        gemm_any(h, T, hidden, (const uint8_t *)head + (size_t)(c0 / 16) * panel, cols, chunk, 0,
                 kernel, xb);
        const int live = vocab - c0 < cols ? vocab - c0 : cols; /* columns in the vocabulary */
        for (int r = 0; r < T; r++) {
            const float *row = chunk + (size_t)r * cols;
            memcpy(logits + (size_t)r * vocab_padded + c0, row, sizeof(float) * (size_t)cols);
            if (live > 0) running_max_fold(&state[r], row, live, c0);
        }
    }
    for (int r = 0; r < T; r++) argmax[r] = state[r].at;
    free(state);
    free(chunk);
    free(xb);
    free(h);
    return 0;
}

int relayc_head(int T, int hidden, int vocab_padded, const float *x, const float *norm_weight,
                float eps, const float *head, float *logits) {
    return head_any(T, hidden, vocab_padded, vocab_padded, x, norm_weight, eps, head, logits, 0,
                    0, NULL);
}

/* The head as block panels of `format` (any BLOCKS_*); hidden a multiple of 32. */
int relayc_head_blocks(int T, int hidden, int vocab_padded, const float *x,
                       const float *norm_weight, float eps, const uint8_t *head, float *logits,
                       int format) {
    return head_any(T, hidden, vocab_padded, vocab_padded, x, norm_weight, eps, head, logits, 0,
                    format, NULL);
}

/* x, the norm weight and the logits float32; the head bfloat16 panels. */
int relayc_head_bf16(int T, int hidden, int vocab_padded, const float *x,
                     const float *norm_weight, float eps, const uint16_t *head, float *logits) {
    return head_any(T, hidden, vocab_padded, vocab_padded, x, norm_weight, eps, head, logits, 1,
                    0, NULL);
}

/* Any of the three heads (`format`: 0 float32 panels, -1 bfloat16 panels, else BLOCKS_*),
 * and argmax[T] the greedy token of each row over its first `vocab` columns (relayc_argmax's
 * indices of the same logits), found as the logits are made. */
int relayc_head_argmax(int T, int hidden, int vocab_padded, int vocab, const float *x,
                       const float *norm_weight, float eps, const void *head, float *logits,
                       int format, int64_t *argmax) {
    if (argmax == NULL || format < -1) return -2;
    return head_any(T, hidden, vocab_padded, vocab, x, norm_weight, eps, head, logits,
                    format == -1, format > 0 ? format : 0, argmax);
}

/* out[T, N_padded] = x[T, K] times a weight packed as the layers' and the heads' are
 * (`format`: 0 float32 panels, -1 bfloat16 panels, else BLOCKS_*, K a multiple of 32):
 * the same GEMM, each row on its own. An EAGLE-3 head's fc, which otherwise went through
 * the library GEMM at several times the cost for the few rows of a draft extend. */
int relayc_linear(int T, int K, int N_padded, const float *x, const void *w, float *out,
                  int format) {
    if (T < 0 || K < 1 || N_padded % 16 || format < -1) return -2;
    if (format > 0 && (K % 32 || !block_format(format))) return -2;
    const int kernel = format == -1 ? relayc_bf16_kernel(-1) : format > 0 ? -1 - format : -1;
    const size_t halves = format == -1 ? (size_t)padded_rows(T) * padded_k(K) : 0;
    uint16_t *xb = (uint16_t *)malloc(sizeof(uint16_t) * (halves + 1));
    if (xb == NULL) return -1;
    gemm_any(x, T, K, w, N_padded, out, 0, kernel, xb);
    free(xb);
    return 0;
}

/* out[T, Ha + Hb] = [rms_norm(a) ; rms_norm(b)] row by row (a [T, Ha], b [T, Hb], each
 * norm with its weight and eps): an EAGLE-3 draft layer's attention input,
 * [input_layernorm(embed); hidden_norm(hidden)], in one call instead of some fourteen
 * torch ops a draft step. */
int relayc_norm_pair(int T, int Ha, const float *a, const float *wa, float eps_a, int Hb,
                     const float *b, const float *wb, float eps_b, float *out) {
    if (T < 0 || Ha < 1 || Hb < 1) return -2;
    const size_t width = (size_t)Ha + (size_t)Hb;
    for (int t = 0; t < T; t++) {
        rms_norm(a + (size_t)t * Ha, 1, Ha, wa, eps_a, out + t * width);
        rms_norm(b + (size_t)t * Hb, 1, Hb, wb, eps_b, out + t * width + Ha);
    }
    return 0;
}

/* out[i] = e^x[i], i < n, as attention's softmax and SiLU compute it (exp16): for tests. */
int relayc_exp(const float *x, int64_t n, float *out) {
    if (n < 0) return -2;
    for (int64_t i = 0; i < n; i += 1 << 20) {
        const int chunk = n - i < (1 << 20) ? (int)(n - i) : 1 << 20;
        memcpy(out + i, x + i, sizeof(float) * (size_t)chunk);
        exp_rows(out + i, chunk);
    }
    return 0;
}

/* A recorded decode step's small ATen ops as native calls (relayc.engine.tape_ops): right
 * after a forward has streamed the weights, ATen's index_copy_ of one row took 110-150 us
 * (its dispatch and TensorIterator code cold), a call here about 25. Rows are the leading
 * dimension of contiguous tensors, row_bytes bytes each; every index is checked before
 * anything is written (-2: outside 0..rows-1, the error ATen raises). */
int relayc_gather_rows(const uint8_t *src, int64_t rows, int64_t row_bytes,
                       const int64_t *index, int64_t n, int wrap, uint8_t *out) {
    /* wrap: a negative index counts from the end (advanced indexing), else it is refused
     * (index_select) */
    const int64_t low = wrap ? -rows : 0;
    for (int64_t i = 0; i < n; i++)
        if (index[i] < low || index[i] >= rows) return -2;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = index[i] < 0 ? index[i] + rows : index[i];
        memcpy(out + i * row_bytes, src + r * row_bytes, (size_t)row_bytes);
    }
    return 0;
}

/* out = the k inputs side by side along one dimension: for each of `outer` blocks, input
 * i's inner_bytes[i] bytes in turn (torch.cat of contiguous tensors). */
int relayc_cat_bytes(uint8_t *out, int64_t outer, int k, const uint8_t *const *inputs,
                     const int64_t *inner_bytes) {
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < k; i++) {
            memcpy(out, inputs[i] + o * inner_bytes[i], (size_t)inner_bytes[i]);
            out += inner_bytes[i];
        }
    return 0;
}

/* dst[0..n) = the element `pattern` (elem_bytes bytes): torch.full / fill_. */
int relayc_fill_pattern(uint8_t *dst, int64_t n, int64_t elem_bytes, const uint8_t *pattern) {
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * elem_bytes, pattern, (size_t)elem_bytes);
    return 0;
}

/* out = a + sign * b over n int64 elements: a's element i / a_rep (a_rep 1: a has out's shape;
 * a_rep m: a column [..., 1] broadcast along out's last dimension of m), b's element i % b_n
 * (b's row broadcast when b_n divides n; b_n 1: a scalar tensor); wraps as torch's int64
 * arithmetic does. */
int relayc_add_int64(const int64_t *a, const int64_t *b, int64_t n, int64_t a_rep, int64_t b_n,
                     int sign, int64_t *out) {
    if (a_rep < 1 || b_n < 1 || n % b_n || n % a_rep) return -2;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t x = (uint64_t)a[i / a_rep], y = (uint64_t)b[i % b_n];
        out[i] = (int64_t)(sign < 0 ? x - y : x + y);
    }
    return 0;
}

/* Integer casts as torch's: int64 -> int32 keeps the low 32 bits, int32 -> int64 extends the
 * sign. */
int relayc_cast_int(const void *src, int src_bytes, void *dst, int dst_bytes, int64_t n) {
    if (src_bytes == 8 && dst_bytes == 4)
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int32_t)(uint32_t)(uint64_t)((const int64_t *)src)[i];
    else if (src_bytes == 4 && dst_bytes == 8)
        for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
    else
        return -2;
    return 0;
}

/* dst[index[i]] = src[i] for i in order (a repeated index keeps the last row, as the CPU's
 * index_copy_ does). */
int relayc_scatter_rows(uint8_t *dst, int64_t rows, int64_t row_bytes, const int64_t *index,
                        int64_t n, const uint8_t *src) {
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= rows) return -2;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + index[i] * row_bytes, src + i * row_bytes, (size_t)row_bytes);
    return 0;
}

int relayc_copy_bytes(void *dst, const void *src, int64_t bytes) {
    memmove(dst, src, (size_t)bytes);
    return 0;
}

int relayc_zero_bytes(void *dst, int64_t bytes) {
    memset(dst, 0, (size_t)bytes);
    return 0;
}

/* out[r] = the first index of row r's maximum in x[rows, n] (row-major), NaN counting as
 * the maximum (the first NaN): torch.argmax's rule, and its indices. One pass for the
 * maximum (and any NaN), one for its first position; the greedy token of every decode and
 * verify row, where ATen's argmax is a scalar loop. Returns 0, or -2 for n < 1. */
int relayc_argmax(const float *x, int64_t rows, int64_t n, int64_t *out) {
    if (n < 1) return -2;
    for (int64_t r = 0; r < rows; r++) {
        struct running_max s = running_max_start();
        running_max_fold(&s, x + r * n, n, 0);
        out[r] = s.at;
    }
    return 0;
}

/* The attention metadata of a forward where every request has `queries` new tokens (decode,
 * verify): what relayc.engine.attention.PagedAttentionMetadata.build makes with some twenty
 * torch calls, which cost ~20 us each right after a forward has streamed its weights. Per
 * request b, P = p_max key columns of its prefix then its Q = queries new tokens:
 *   kv_loc[b, j] = req_to_token[req_pool_indices[b], j] (j < P), out_cache_loc[b * Q + k]
 *     (j = P + k);
 *   mask[b, q, j] = 0 (attend) or -inf: j < P attends while j < prefix_lens[b]; j = P + k
 *     attends where tree_mask[b, q, k] (bytes, [B, Q, Q]), or k <= q without a tree mask.
 * req_to_token is int32 [rows, width], row-major. Returns 0, or -2 for P > width or a
 * request row outside 0..rows-1 (the caller's torch path raises the error). */
static int paged_meta_check(int batch, int queries, int p_max, int64_t rows, int64_t width,
                            const int64_t *req_pool_indices) {
    if (batch < 0 || queries < 1 || p_max < 0 || p_max > width) return -2;
    for (int b = 0; b < batch; b++)
        if (req_pool_indices[b] < 0 || req_pool_indices[b] >= rows) return -2;
    return 0;
}

static void paged_meta_fill(int batch, int queries, int p_max, const int32_t *req_to_token,
                            int64_t width, const int64_t *req_pool_indices,
                            const int64_t *prefix_lens, const int64_t *out_cache_loc,
                            const uint8_t *tree_mask, int64_t *kv_loc, float *mask) {
    const int64_t keys = (int64_t)p_max + queries;
    for (int b = 0; b < batch; b++) {
        const int32_t *row = req_to_token + req_pool_indices[b] * width;
        int64_t *loc = kv_loc + b * keys;
        for (int j = 0; j < p_max; j++) loc[j] = row[j];
        for (int k = 0; k < queries; k++) loc[p_max + k] = out_cache_loc[(int64_t)b * queries + k];
        const int64_t pre = prefix_lens[b];
        for (int q = 0; q < queries; q++) {
            float *m = mask + ((int64_t)b * queries + q) * keys;
            for (int j = 0; j < p_max; j++) m[j] = j < pre ? 0.0f : -INFINITY;
            for (int k = 0; k < queries; k++) {
                const int see = tree_mask != NULL
                                    ? tree_mask[((int64_t)b * queries + q) * queries + k] != 0
                                    : k <= q;
                m[p_max + k] = see ? 0.0f : -INFINITY;
            }
        }
    }
}

int relayc_paged_meta(int batch, int queries, int p_max, const int32_t *req_to_token,
                      int64_t rows, int64_t width, const int64_t *req_pool_indices,
                      const int64_t *prefix_lens, const int64_t *out_cache_loc,
                      const uint8_t *tree_mask, int64_t *kv_loc, float *mask) {
    const int code = paged_meta_check(batch, queries, p_max, rows, width, req_pool_indices);
    if (code != 0) return code;
    paged_meta_fill(batch, queries, p_max, req_to_token, width, req_pool_indices, prefix_lens,
                    out_cache_loc, tree_mask, kv_loc, mask);
    return 0;
}

/* The prefix columns a batch attends: the longest of its prefixes lens[b], clamped to
 * 0..p_max. A caller's p_max is a bound -- a captured step's (relayc.runtime.tape) is the
 * widest the KV table allows -- and columns past every prefix are masked, so they add only
 * time: the one-call forwards below size their keys by this instead. A row's arithmetic does
 * not depend on the key count (attend_group), so the bits do not change. */
static int live_prefix(int B, int p_max, const int64_t *lens) {
    int64_t most = 0;
    for (int b = 0; b < B; b++)
        if (lens[b] > most) most = lens[b];
    return most < p_max ? (int)most : p_max;
}

/* What relayc_forward reads of one model, filled once per packing of its weights, K/V
 * caches, embedding, rotary tables and LM head (relayc.engine.fused_forward keeps the
 * tensors behind every pointer alive). `kind`: the layers' weights and caches float32 (0),
 * bfloat16 (1), or float32 caches with block-quantized weights (2, `formats` as
 * relayc_decoder_blocks_ex's). The embedding [vocab_rows, hidden] is float32 or, with
 * embed_bf16, bfloat16 words; the rotary tables [max_position, head_dim] float32 (the sine
 * table's first half negated); head_format as relayc_head_argmax's. */
struct relayc_model {
    int hidden, heads, kv_heads, head_dim, inter, layers, kind;
    const int *formats;
    const float *const *ln1;
    const void *const *w_qkv, *const *w_o;
    const float *const *ln2;
    const void *const *w_gate_up, *const *w_down;
    const float *eps1, *eps2;
    void *const *k_cache, *const *v_cache;
    int64_t cache_rows;
    const void *embed;
    int embed_bf16;
    int64_t vocab_rows;
    const float *cos_table, *sin_table;
    int64_t max_position;
    const float *norm_weight;
    float norm_eps;
    const void *head;
    int head_format, vocab, vocab_padded;
};

/* The rotary rows of position `pos` (inside the tables: callers check) into cos_row and
 * sin_row, head_dim floats each. */
static inline void rope_rows(const struct relayc_model *m, int64_t pos, float *cos_row,
                             float *sin_row) {
    const size_t D = (size_t)m->head_dim;
    memcpy(cos_row, m->cos_table + (size_t)pos * D, sizeof(float) * D);
    memcpy(sin_row, m->sin_table + (size_t)pos * D, sizeof(float) * D);
}

/* Row `id` of the embedding as float32: the row itself, or its bfloat16 words widened
 * exactly into `row` (hidden floats). */
static inline const float *embedding_row(const struct relayc_model *m, int64_t id, float *row) {
    const size_t H = (size_t)m->hidden;
    if (!m->embed_bf16) return (const float *)m->embed + (size_t)id * H;
    const uint16_t *e = (const uint16_t *)m->embed + (size_t)id * H;
    for (size_t i = 0; i < H; i++) row[i] = from_bf16(e[i]);
    return row;
}

/* One decode or verify forward of a paged batch in one call: every request has Q new
 * tokens (B * Q = T rows), the attention metadata as relayc_paged_meta makes it, the
 * embedding and rotary rows gathered, the layers (decode_layers, with `capture` as
 * relayc_decoder_ex's), then the final norm and the LM head with each row's argmax
 * (relayc_head_argmax). x [T, hidden] receives the last layer's output, logits
 * [T, vocab_padded] and argmax [T] the head's: the bits of those calls made one by one,
 * without the Python between them, which costs ~20 us a torch call once the weights have
 * streamed through the caches.
 *
 * Every index is checked before anything is written: a token id outside the embedding
 * (-5), a position outside the rotary tables (-6), a request row or prefix width outside
 * req_to_token (-2), a KV slot outside the caches (-3, -4). The caller then takes the
 * general path, which raises the error that names the bad input. */
int relayc_forward(const struct relayc_model *m, int B, int Q, int p_max,
                   const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                   const int64_t *req_pool_indices, const int64_t *prefix_lens,
                   const int64_t *out_cache_loc, const uint8_t *tree_mask,
                   const int64_t *input_ids, const int64_t *positions, const int *capture,
                   int n_capture, float *aux, float *x, float *logits, int64_t *argmax) {
    if (m == NULL || B < 1 || Q < 1 || m->kind < 0 || m->kind > 2 ||
        (m->kind == 2) != (m->formats != NULL))
        return -2;
    int code = paged_meta_check(B, Q, p_max, table_rows, table_width, req_pool_indices);
    if (code != 0) return code;
    p_max = live_prefix(B, p_max, prefix_lens);
    const int T = B * Q, H = m->hidden, D = m->head_dim;
    const int64_t S = (int64_t)p_max + Q;
    for (int t = 0; t < T; t++) {
        if (input_ids[t] < 0 || input_ids[t] >= m->vocab_rows) return -5;
        if (positions[t] < 0 || positions[t] >= m->max_position) return -6;
    }
    float *tables = (float *)malloc(sizeof(float) * ((size_t)2 * T * D + (size_t)B * Q * S));
    int64_t *kv_loc = (int64_t *)malloc(sizeof(int64_t) * (size_t)B * S);
    if (tables == NULL || kv_loc == NULL) {
        free(tables);
        free(kv_loc);
        return -1;
    }
    float *cos_t = tables, *sin_t = tables + (size_t)T * D, *mask = sin_t + (size_t)T * D;
    paged_meta_fill(B, Q, p_max, req_to_token, table_width, req_pool_indices, prefix_lens,
                    out_cache_loc, tree_mask, kv_loc, mask);
    for (int t = 0; t < T; t++) {
        rope_rows(m, positions[t], cos_t + (size_t)t * D, sin_t + (size_t)t * D);
        float *row = x + (size_t)t * H;
        const float *e = embedding_row(m, input_ids[t], row);
        if (e != row) memcpy(row, e, sizeof(float) * (size_t)H);
    }
    code = decode_layers(T, H, m->heads, m->kv_heads, D, m->inter, m->layers, x, cos_t, sin_t,
                         out_cache_loc, kv_loc, mask, B, Q, (int)S, m->ln1, m->w_qkv, m->w_o,
                         m->ln2, m->w_gate_up, m->w_down, m->eps1, m->eps2, m->k_cache,
                         m->v_cache, m->cache_rows, m->kind == 1, m->formats, NULL, 0, capture,
                         n_capture, aux);
    free(kv_loc);
    free(tables);
    if (code != 0) return code;
    return relayc_head_argmax(T, H, m->vocab_padded, m->vocab, x, m->norm_weight, m->norm_eps,
                              m->head, logits, m->head_format, argmax);
}

/* Whether the greedy token of a logits row is the one the top-1 of its softmax picks:
 * torch.softmax(x).topk(1) takes the first index of the largest probability, and two
 * logits a few units in the last place apart can round to equal probabilities (the
 * later, larger logit then loses the tie). A row is clear when every other logit lies
 * below the maximum by 2^-16 of max(1, |max|) -- at least a hundred units in the last
 * place of e^0 = 1 after the exponential, so the probabilities stay apart -- and the
 * maximum is finite. */
static int clear_top(const float *row, int64_t n, int64_t at) {
    const float top = row[at];
    if (!isfinite(top)) return 0;
    const float tol = ldexpf(fabsf(top) > 1.0f ? fabsf(top) : 1.0f, -16);
    for (int64_t j = 0; j < n; j++)
        if (j != at && !(row[j] < top - tol)) return 0; /* a NaN is never clear either */
    return 1;
}

/* An EAGLE-3 head's greedy chain in one call: `steps` draft steps of B requests, each
 * the draft layer over [input_layernorm(embed(i + d2t[i])); hidden_norm(g)] with g the
 * residual (decode_layers with attn_in, one layer: `m`'s layers), then the head's norm
 * and LM head (`m`'s head, `vocab` draft ids) and the row's greedy draft id. Step s of
 * request b sits at position seq_lens[b] + s, writes its K/V to scratch[b, s] and attends
 * the cached prefix (req_to_token's first p_max columns, those below seq_lens[b]) and the
 * scratch slots of steps 0..s -- what EagleHead._chain_tokens runs through ScratchAttention
 * one step at a time, the same functions on the same values. tokens [B, steps + 1]: column
 * 0 holds the first draft ids; columns 1..steps receive the chain. hidden [B, hidden] is
 * the first step's g. Any kind of layers: with bfloat16 ones (m->kind 1) each step's
 * output leaves the layer rounded to bfloat16 (decode_layers), as the step-by-step path's
 * bfloat16 g; an embedding of bfloat16 words is widened exactly before its norm.
 *
 * Returns 0; 1 when a step's greedy token is not clearly the top-1 of its softmax
 * (clear_top; the caller then drafts the chain its own way, which takes that top-1); a
 * negative code for an index out of range (-5 a draft id or its target id, -6 a
 * position, -2 a request row, -3 / -4 a KV slot) or bad arguments (-2). The scratch slots
 * are the only K/V written, and they are scratch: a caller that drafts again after a
 * non-zero return overwrites them. */
int relayc_draft_chain(const struct relayc_model *m, int B, int steps, int p_max,
                       const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                       const int64_t *req_pool_indices, const int64_t *seq_lens,
                       const int64_t *scratch, const int64_t *d2t, const float *in_norm,
                       float in_eps, const float *hidden_norm, float hidden_eps,
                       const float *hidden, int64_t *tokens) {
    if (m == NULL || B < 1 || steps < 1 || m->layers != 1 || m->kind < 0 || m->kind > 2 ||
        (m->kind == 2) != (m->formats != NULL) || m->vocab < 1)
        return -2;
    int code = paged_meta_check(B, 1, p_max, table_rows, table_width, req_pool_indices);
    if (code != 0) return code;
    for (int b = 0; b < B; b++)
        if (seq_lens[b] < 0 || seq_lens[b] + steps > m->max_position) return -6;
    p_max = live_prefix(B, p_max, seq_lens);
    const int H = m->hidden, D = m->head_dim, width = steps + 1;
    const int S = p_max + steps;
    const size_t floats = (size_t)B * H + (size_t)B * 2 * H + (size_t)2 * B * D +
                          (size_t)B * S + (size_t)B * m->vocab_padded + (size_t)H;
    float *buffer = (float *)malloc(sizeof(float) * floats);
    int64_t *ints = (int64_t *)malloc(sizeof(int64_t) * ((size_t)B * S + 2 * (size_t)B));
    if (buffer == NULL || ints == NULL) {
        free(buffer);
        free(ints);
        return -1;
    }
    float *x = buffer, *attn_in = x + (size_t)B * H, *cos_t = attn_in + (size_t)B * 2 * H;
    float *sin_t = cos_t + (size_t)B * D, *mask = sin_t + (size_t)B * D;
    float *logits = mask + (size_t)B * S, *embed_row = logits + (size_t)B * m->vocab_padded;
    int64_t *kv_loc = ints, *slots = kv_loc + (size_t)B * S, *top = slots + B;
    memcpy(x, hidden, sizeof(float) * (size_t)B * H);
    for (int b = 0; b < B; b++) {
        const int32_t *row = req_to_token + req_pool_indices[b] * table_width;
        for (int j = 0; j < p_max; j++) {
            kv_loc[(size_t)b * S + j] = row[j];
            mask[(size_t)b * S + j] = j < seq_lens[b] ? 0.0f : -INFINITY;
        }
        for (int c = 0; c < steps; c++) kv_loc[(size_t)b * S + p_max + c] = scratch[(size_t)b * steps + c];
    }
    for (int s = 0; s < steps && code == 0; s++) {
        for (int b = 0; b < B && code == 0; b++) {
            const int64_t t = tokens[(size_t)b * width + s];
            const int64_t id = t >= 0 && t < m->vocab ? t + d2t[t] : -1;
            if (id < 0 || id >= m->vocab_rows) {
                code = -5;
                break;
            }
            float *in = attn_in + (size_t)b * 2 * H;
            rms_norm(embedding_row(m, id, embed_row), 1, H, in_norm, in_eps, in);
            rms_norm(x + (size_t)b * H, 1, H, hidden_norm, hidden_eps, in + H);
            const int64_t pos = seq_lens[b] + s;
            rope_rows(m, pos, cos_t + (size_t)b * D, sin_t + (size_t)b * D);
            for (int c = 0; c < steps; c++)
                mask[(size_t)b * S + p_max + c] = c <= s ? 0.0f : -INFINITY;
            slots[b] = scratch[(size_t)b * steps + s];
        }
        if (code != 0) break;
        code = decode_layers(B, H, m->heads, m->kv_heads, D, m->inter, 1, x, cos_t, sin_t, slots,
                             kv_loc, mask, B, 1, S, m->ln1, m->w_qkv, m->w_o, m->ln2,
                             m->w_gate_up, m->w_down, m->eps1, m->eps2, m->k_cache, m->v_cache,
                             m->cache_rows, m->kind == 1, m->formats, attn_in, 2 * H, NULL, 0,
                             NULL);
        if (code != 0) break;
        code = relayc_head_argmax(B, H, m->vocab_padded, m->vocab, x, m->norm_weight, m->norm_eps,
                                  m->head, logits, m->head_format, top);
        for (int b = 0; b < B && code == 0; b++) {
            if (!clear_top(logits + (size_t)b * m->vocab_padded, m->vocab, top[b])) code = 1;
            tokens[(size_t)b * width + s + 1] = top[b];
        }
    }
    free(ints);
    free(buffer);
    return code;
}

/* An EAGLE-3 head's draft extend in one call: W tokens per request (the first lens[b]
 * real, the rest padding) at positions prefix_lens[b] + i (clamped to the rotary tables),
 * what Eagle3Head.extend runs step by step: padding rows' ids and features zeroed, the
 * features [B, W, F] projected by fc (relayc_linear's GEMM: `fc` packed as `fc_format`
 * says, F inputs, hidden outputs), the draft layer over [input_layernorm(embed(ids));
 * hidden_norm(fc(features))] with fc(features) the residual, attending the cached prefix
 * (req_to_token's first p_max columns, those below prefix_lens[b]) and the new tokens
 * causally, its K/V written to out_cache_loc [B, W] (NULL: the slots req_to_token holds at
 * those positions, 0 for padding rows), then the head's norm and LM head over each
 * request's last real row. g [B, hidden] receives those rows' outputs, logits
 * [B, vocab_padded] and argmax [B] the head's. feature_rows [B, W] (NULL: row t reads
 * features' row t): the row of features [feature_count, F] each real row reads -- a
 * verify's states where each accepted node's row lies, gathered here instead of copied
 * into a [B, W, F] tensor first. Any kind of layers: with bfloat16 ones (m->kind 1) fc's
 * output is rounded to bfloat16 (the step-by-step path's bfloat16 fc) and the layer's
 * output too (decode_layers); an embedding of bfloat16 words is widened exactly. Returns
 * 0, or a negative code, before anything is written, for an index out of range (-5 a token id, -2 a
 * request row or a feature row, -3 / -4 a KV slot) or bad arguments (-2). */
int relayc_draft_extend(const struct relayc_model *m, int B, int W, int p_max,
                        const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                        const int64_t *req_pool_indices, const int64_t *prefix_lens,
                        const int64_t *lens, const int64_t *out_cache_loc,
                        const int64_t *input_ids, const float *features, int F,
                        const int64_t *feature_rows, int64_t feature_count, const void *fc,
                        int fc_format, const float *in_norm, float in_eps,
                        const float *hidden_norm, float hidden_eps, float *g, float *logits,
                        int64_t *argmax) {
    if (m == NULL || B < 1 || W < 1 || F < 1 || m->layers != 1 || m->kind < 0 || m->kind > 2 ||
        (m->kind == 2) != (m->formats != NULL) || fc_format < -1 || m->hidden % 16 ||
        (fc_format > 0 && (F % 32 || !block_format(fc_format))))
        return -2;
    int code = paged_meta_check(B, W, p_max, table_rows, table_width, req_pool_indices);
    if (code != 0) return code;
    for (int b = 0; b < B; b++) {
        if (prefix_lens[b] < 0) return -2;
        for (int i = 0; i < W && i < lens[b]; i++) {
            const int64_t id = input_ids[(size_t)b * W + i];
            if (id < 0 || id >= m->vocab_rows) return -5;
            if (feature_rows != NULL &&
                (feature_rows[(size_t)b * W + i] < 0 ||
                 feature_rows[(size_t)b * W + i] >= feature_count))
                return -2;
        }
    }
    p_max = live_prefix(B, p_max, prefix_lens);
    const int H = m->hidden, D = m->head_dim, T = B * W;
    const int S = p_max + W;
    const size_t floats = (size_t)T * F + (size_t)T * H * 2 + (size_t)T * 2 * H +
                          (size_t)2 * T * D + (size_t)B * W * S + (size_t)H;
    float *buffer = (float *)malloc(sizeof(float) * floats);
    int64_t *ints = (int64_t *)malloc(sizeof(int64_t) * ((size_t)B * S + (size_t)T));
    if (buffer == NULL || ints == NULL) {
        free(buffer);
        free(ints);
        return -1;
    }
    float *feat = buffer, *x = feat + (size_t)T * F, *h = x + (size_t)T * H;
    float *attn_in = h + (size_t)T * H, *cos_t = attn_in + (size_t)T * 2 * H;
    float *sin_t = cos_t + (size_t)T * D, *mask = sin_t + (size_t)T * D;
    float *embed_row = mask + (size_t)B * W * S;
    int64_t *kv_loc = ints, *slots = kv_loc + (size_t)B * S;
    for (int b = 0; b < B; b++)
        for (int i = 0; i < W; i++) {
            const size_t t = (size_t)b * W + i;
            const int real = i < lens[b];
            const int64_t row = feature_rows != NULL ? feature_rows[t] : (int64_t)t;
            if (real)
                memcpy(feat + t * F, features + (size_t)row * F, sizeof(float) * (size_t)F);
            else
                memset(feat + t * F, 0, sizeof(float) * (size_t)F);
            int64_t col = prefix_lens[b] + i;
            if (col > table_width - 1) col = table_width - 1;
            slots[t] = out_cache_loc != NULL ? out_cache_loc[t]
                       : real                ? req_to_token[req_pool_indices[b] * table_width + col]
                                             : 0;
            int64_t pos = prefix_lens[b] + i;
            if (pos > m->max_position - 1) pos = m->max_position - 1;
            if (pos < 0) pos = 0;
            rope_rows(m, pos, cos_t + t * D, sin_t + t * D);
            const int64_t id = real ? input_ids[t] : 0;
            rms_norm(embedding_row(m, id, embed_row), 1, H, in_norm, in_eps, attn_in + t * 2 * H);
        }
    code = relayc_linear(T, F, H, feat, fc, x, fc_format);
    if (code == 0 && m->kind == 1) /* the bfloat16 fc's output */
        round_bf16(x, (size_t)T * H);
    if (code == 0) {
        for (int t = 0; t < T; t++)
            rms_norm(x + (size_t)t * H, 1, H, hidden_norm, hidden_eps,
                     attn_in + (size_t)t * 2 * H + H);
        paged_meta_fill(B, W, p_max, req_to_token, table_width, req_pool_indices, prefix_lens,
                        slots, NULL, kv_loc, mask);
        code = decode_layers(T, H, m->heads, m->kv_heads, D, m->inter, 1, x, cos_t, sin_t, slots,
                             kv_loc, mask, B, W, S, m->ln1, m->w_qkv, m->w_o, m->ln2,
                             m->w_gate_up, m->w_down, m->eps1, m->eps2, m->k_cache, m->v_cache,
                             m->cache_rows, m->kind == 1, m->formats, attn_in, 2 * H, NULL, 0,
                             NULL);
    }
    if (code == 0) {
        for (int b = 0; b < B; b++) {
            const int64_t last = (int64_t)b * W + (lens[b] - 1 > 0 ? lens[b] - 1 : 0);
            memcpy(g + (size_t)b * H, x + last * H, sizeof(float) * (size_t)H);
        }
        code = relayc_head_argmax(B, H, m->vocab_padded, m->vocab, g, m->norm_weight, m->norm_eps,
                                  m->head, logits, m->head_format, argmax);
    }
    free(ints);
    free(buffer);
    return code;
}

/* Greedy acceptance of B draft trees of N nodes each, laid out as verify_tree_greedy reads
 * them (relayc.kernels.verify_greedy; candidates, retrive_index, retrive_next_token and
 * retrive_next_sibling [B, N] int64, target_predict the target's argmax of every node by
 * its global id [B * N]): from each root, the first child (in sibling order) whose draft
 * equals the argmax of the last accepted node is accepted, up to S of them, each node
 * visited at most once. Writes what relayc.engine.ops.verify's greedy accept returns:
 * accept_index [B, S + 1] (the path's global ids, then -1), accept_lens [B] (accepted + 1),
 * accept_tokens [B, S + 1] (the argmax at each path node, then 0) and bonus [B] (the
 * last path node's argmax) -- the host loop and some fifteen torch calls after a verify
 * forward, in one call. Returns 0, or -2 for an index outside the trees (nothing is
 * written; the caller's torch path then handles the trees). */
int relayc_accept_greedy(int B, int N, int S, const int64_t *candidates,
                         const int64_t *retrive_index, const int64_t *next_token,
                         const int64_t *next_sibling, const int64_t *target_predict,
                         int64_t *accept_index, int32_t *accept_lens, int64_t *accept_tokens,
                         int64_t *bonus) {
    if (B < 0 || N < 1 || S < 0) return -2;
    const int64_t nodes = (int64_t)B * N;
    for (int64_t i = 0; i < nodes; i++)
        if (retrive_index[i] < 0 || retrive_index[i] >= nodes || next_token[i] < -1 ||
            next_token[i] >= N || next_sibling[i] < -1 || next_sibling[i] >= N)
            return -2;
    for (int b = 0; b < B; b++) {
        const int64_t *cand = candidates + (size_t)b * N, *ids = retrive_index + (size_t)b * N;
        const int64_t *first = next_token + (size_t)b * N, *sibling = next_sibling + (size_t)b * N;
        int64_t *path = accept_index + (size_t)b * (S + 1);
        int count = 0;
        path[0] = ids[0];
        int64_t child = S > 0 ? first[0] : -1;
        for (int turn = 0; turn < N - 1 && child != -1; turn++) {
            if (cand[child] == target_predict[path[count]]) {
                path[++count] = ids[child];
                if (count == S) break;
                child = first[child];
            } else
                child = sibling[child];
        }
        int64_t *tokens = accept_tokens + (size_t)b * (S + 1);
        for (int i = 0; i <= S; i++) {
            tokens[i] = i <= count ? target_predict[path[i]] : 0;
            if (i > count) path[i] = -1;
        }
        accept_lens[b] = count + 1;
        bonus[b] = tokens[count];
    }
    return 0;
}

/* The KV compaction after a verify, in one call (relayc.engine.ops.verify's
 * compact_accepted_kv): request b's verify window is window[b, 0..n) (KV slots, rows
 * window_stride apart); its accepted nodes accept_index[b, :] (global ids b * n + j, -1
 * past the path) move, in path order, to the front of the window -- in every plane of
 * `buffer` ([planes, size, row_bytes]: each layer's K then V), every source read before
 * any slot is written, a slot copied onto itself left alone -- and the window is recorded
 * in req_to_token's row req_pool_indices[b] at positions seq_lens[b] .. + n.
 * new_seq_lens[b] = seq_lens[b] + accept_lens[b]. Returns 0, or -2 (nothing written) for
 * an index outside the windows, the buffer or req_to_token: the torch path then raises. */
/* Where window column j of request b takes its K/V from: the window column of the node
 * accepted j-th (accept_index holds flat node ids, -1 past the accepted ones: those stay). */
static inline int64_t compact_source_column(const int64_t *accept_index, int b, int n, int j) {
    const int64_t a = accept_index[(size_t)b * n + j];
    return a >= 0 ? a - (int64_t)b * n : j;
}

int relayc_compact(int B, int n, const int64_t *window, int64_t window_stride,
                   const int64_t *accept_index, uint8_t *buffer, int64_t planes, int64_t size,
                   int64_t row_bytes, int32_t *req_to_token, int64_t rows, int64_t width,
                   const int64_t *req_pool_indices, const int64_t *seq_lens,
                   const int32_t *accept_lens, int64_t *new_seq_lens) {
    if (B < 0 || n < 1 || window_stride < n || planes < 1 || size < 1 || row_bytes < 1)
        return -2;
    int moved = 0;
    for (int b = 0; b < B; b++) {
        if (req_pool_indices[b] < 0 || req_pool_indices[b] >= rows || seq_lens[b] < 0 ||
            seq_lens[b] + n > width)
            return -2;
        for (int j = 0; j < n; j++) {
            const int64_t local = compact_source_column(accept_index, b, n, j);
            const int64_t slot = window[b * window_stride + j];
            if (local < 0 || local >= n || slot < 0 || slot >= size) return -2;
            const int64_t source = window[b * window_stride + local];
            if (source < 0 || source >= size) return -2;
            moved += source != slot;
        }
    }
    if (moved) {
        uint8_t *held = (uint8_t *)malloc((size_t)moved * (size_t)planes * (size_t)row_bytes);
        if (held == NULL) return -1;
        for (int pass = 0; pass < 2; pass++) { /* gather every source, then scatter */
            size_t k = 0;
            for (int b = 0; b < B; b++)
                for (int j = 0; j < n; j++) {
                    const int64_t slot = window[b * window_stride + j];
                    const int64_t source =
                        window[b * window_stride + compact_source_column(accept_index, b, n, j)];
                    if (source == slot) continue;
                    for (int64_t p = 0; p < planes; p++) {
                        uint8_t *row = buffer + ((size_t)p * size + (size_t)(pass ? slot : source)) *
                                                    (size_t)row_bytes;
                        uint8_t *keep = held + ((size_t)k * planes + (size_t)p) * (size_t)row_bytes;
                        if (pass)
                            memcpy(row, keep, (size_t)row_bytes);
                        else
                            memcpy(keep, row, (size_t)row_bytes);
                    }
                    k++;
                }
        }
        free(held);
    }
    for (int b = 0; b < B; b++) {
        int32_t *row = req_to_token + req_pool_indices[b] * width + seq_lens[b];
        for (int j = 0; j < n; j++) row[j] = (int32_t)window[b * window_stride + j];
        new_seq_lens[b] = seq_lens[b] + accept_lens[b];
    }
    return 0;
}

/* GGUF's simplest block types read straight from a file's bytes: the loader's dequantize
 * (the `gguf` package's NumPy loops took most of a model's load) and the packer's check
 * that a parameter still holds its blocks' values. Types (GGUF_*): Q4_0 (18 bytes: float16
 * d, 16 bytes of nibbles; weight d * (q - 8)), Q4_1 (20 bytes: d, m, 16 bytes of nibbles;
 * d * q + m), Q8_0 (34 bytes: d, 32 signed bytes; d * q). Nibbles: byte j holds weight j
 * in its low half and weight j + 16 in its high half. Each weight is computed as the
 * `gguf` package computes it: every product is exact, so the one rounding is its. */
enum { GGUF_Q4_0 = 1, GGUF_Q4_1 = 2, GGUF_Q8_0 = 3 };

/* One float16 bit pattern -> float32, exactly (infinities and NaNs too). */
static inline float half1(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t bits;
    float f;
    if ((h & 0x7c00u) == 0x7c00u) { /* infinity or NaN: keep the payload */
        bits = sign | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f; /* exact: normals and subnormals alike */
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The 32 weights of one block. */
static inline void gguf_block(const uint8_t *blk, int type, float *w) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    const float d = half1(h);
    if (type == GGUF_Q8_0) {
        for (int j = 0; j < 32; j++) w[j] = d * (float)(int8_t)blk[2 + j];
        return;
    }
    if (type == GGUF_Q4_0) {
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((int)(blk[2 + j] & 15) - 8);
            w[j + 16] = d * (float)((int)(blk[2 + j] >> 4) - 8);
        }
        return;
    }
    memcpy(&h, blk + 2, sizeof h);
    const float m = half1(h);
    for (int j = 0; j < 16; j++) {
        w[j] = d * (float)(blk[4 + j] & 15) + m;
        w[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
    }
}

static inline int gguf_block_bytes(int type) {
    return type == GGUF_Q4_0 ? 18 : type == GGUF_Q4_1 ? 20 : type == GGUF_Q8_0 ? 34 : 0;
}

/* out[rows, cols] (row-major float32) = the weights of raw[rows, cols / 32 blocks].
 * Returns 0, or -2 for an unknown type or cols not whole blocks. */
int relayc_gguf_dequantize(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                           float *out) {
    const int bytes = gguf_block_bytes(type);
    if (bytes == 0 || cols % 32 || rows < 0) return -2;
    const int64_t blocks = rows * (cols / 32);
    for (int64_t b = 0; b < blocks; b++) gguf_block(raw + b * bytes, type, out + b * 32);
    return 0;
}

/* raw [rows, cols / 32 blocks] of Q4_1 or Q8_0 laid out as the native GEMMs' panels, into
 * out (zeroed here): the bytes relayc.engine.checkpoints.blocks.BlockWeight.panels makes
 * with torch ops, without its tensors -- panel p, block b: BLOCKS_Q4 (d[16], m[16] as
 * stored, then row r byte c = q[2r] | q[2r + 1] << 4 of column c) or BLOCKS_Q8 (d[16], then
 * row k byte c = q[k] of column c), rows past the last a panel's zero columns. Returns 0,
 * or -2 for another type or a width that is no whole number of blocks. */
int relayc_gguf_panels(const uint8_t *raw, int type, int64_t rows, int64_t cols, uint8_t *out) {
    if ((type != GGUF_Q4_1 && type != GGUF_Q8_0) || cols % 32 || rows < 0) return -2;
    const int64_t nb = cols / 32, panels = (rows + 15) / 16;
    const int bytes = gguf_block_bytes(type), size = type == GGUF_Q4_1 ? Q4_BYTES : Q8_BYTES;
    memset(out, 0, (size_t)(panels * nb * size));
    for (int64_t p = 0; p < panels; p++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (size_t)((p * nb + b) * size);
            for (int c = 0; c < 16 && p * 16 + c < rows; c++) {
                const uint8_t *blk = raw + (size_t)(((p * 16 + c) * nb + b) * bytes);
                memcpy(o + 2 * c, blk, 2); /* d */
                if (type == GGUF_Q8_0) {
                    for (int k = 0; k < 32; k++) o[32 + 16 * k + c] = blk[2 + k];
                    continue;
                }
                memcpy(o + 32 + 2 * c, blk + 2, 2); /* m */
                /* the block's byte j holds q[j] (low nibble) and q[j + 16] (high) */
                const uint8_t *qs = blk + 4;
                for (int r = 0; r < 16; r++) {
                    const int k0 = 2 * r, k1 = 2 * r + 1;
                    const int q0 = k0 < 16 ? qs[k0] & 15 : qs[k0 - 16] >> 4;
                    const int q1 = k1 < 16 ? qs[k1] & 15 : qs[k1 - 16] >> 4;
                    o[64 + 16 * r + c] = (uint8_t)(q0 | q1 << 4);
                }
            }
        }
    return 0;
}

/* 1 when weight[rows, cols] (float32, element (r, c) at weight[r * row_stride + c *
 * col_stride]: row-major, or the column-major layout the CPU GEMMs keep, no copy) equals
 * the weights of raw (value for value, as torch.equal compares) and every one is finite;
 * else 0 (-2 as relayc_gguf_dequantize). A strided weight is walked a column of blocks at
 * a time, so its rows' cache lines are read while they are in L1. */
int relayc_gguf_matches(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                        const float *weight, int64_t row_stride, int64_t col_stride) {
    const int bytes = gguf_block_bytes(type);
    if (bytes == 0 || cols % 32 || rows < 0 || row_stride < 0 || col_stride < 0) return -2;
    const int64_t nb = cols / 32;
    float w[32];
    if (col_stride == 1) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                gguf_block(raw + (r * nb + b) * bytes, type, w);
                const float *have = weight + r * row_stride + b * 32;
                for (int j = 0; j < 32; j++)
                    if (!(w[j] == have[j]) || !isfinite(w[j])) return 0;
            }
        return 1;
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < rows; r++) {
            gguf_block(raw + (r * nb + b) * bytes, type, w);
            const float *have = weight + r * row_stride + b * 32 * col_stride;
            for (int j = 0; j < 32; j++)
                if (!(w[j] == have[j * col_stride]) || !isfinite(w[j])) return 0;
        }
    return 1;
}

/* A recorded step's native calls in one call (relayc.runtime.tape): a replay's calls made
 * one by one from Python pay ctypes' argument conversion, cold after a forward (some ten
 * microseconds a call), where these are a switch and the calls themselves. `records` holds
 * n calls in turn, each [id, argument count, the code it must return (TAPE_ANY: any),
 * the arguments as 64-bit words] -- pointers and integers as they are, a float's bits in
 * the low 32 -- each passed at its parameter's type, so the compiler checks every call
 * against its function. Returns how many calls returned their code; at the first that did
 * not, *code is what it returned (TAPE_ANY for an unknown id or argument count, which the
 * Python side never writes). relayc_tape_name(id) names the functions, NULL past the last. */
#define TAPE_ANY INT64_MIN
static const char *const tape_names[] = {
    "relayc_forward",      "relayc_draft_chain", "relayc_draft_extend", "relayc_accept_greedy",
    "relayc_compact",      "relayc_paged_meta",  "relayc_head_argmax",  "relayc_norm_pair",
    "relayc_linear",       "relayc_argmax",      "relayc_gather_rows",  "relayc_scatter_rows",
    "relayc_cat_bytes",    "relayc_fill_pattern", "relayc_add_int64",   "relayc_cast_int",
    "relayc_copy_bytes",   "relayc_zero_bytes",  "relayc_exp",
};
static const int tape_arity[] = {19, 17, 25, 12, 16, 12, 11, 10, 7, 4, 7, 6, 5, 4, 7, 5, 3, 2, 3};

const char *relayc_tape_name(int id) {
    return id >= 0 && id < (int)(sizeof tape_names / sizeof *tape_names) ? tape_names[id] : NULL;
}

static inline float tape_float(int64_t word) {
    const uint32_t bits = (uint32_t)(uint64_t)word;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int64_t relayc_tape_run(const int64_t *records, int64_t n, int64_t *code) {
#define P(k) ((void *)(intptr_t)a[k])
#define I(k) ((int)a[k])
#define F(k) tape_float(a[k])
    for (int64_t c = 0; c < n; c++) {
        const int64_t id = records[0], count = records[1], want = records[2];
        const int64_t *a = records + 3;
        const int known = id >= 0 && id < (int64_t)(sizeof tape_arity / sizeof *tape_arity);
        if (!known || count != tape_arity[id]) {
            *code = TAPE_ANY;
            return c;
        }
        int rc;
        switch (id) {
        case 0:
            rc = relayc_forward(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9), P(10),
                                P(11), P(12), P(13), I(14), P(15), P(16), P(17), P(18));
            break;
        case 1:
            rc = relayc_draft_chain(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9),
                                    P(10), P(11), F(12), P(13), F(14), P(15), P(16));
            break;
        case 2:
            rc = relayc_draft_extend(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9),
                                     P(10), P(11), P(12), I(13), P(14), a[15], P(16), I(17),
                                     P(18), F(19), P(20), F(21), P(22), P(23), P(24));
            break;
        case 3:
            rc = relayc_accept_greedy(I(0), I(1), I(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9),
                                      P(10), P(11));
            break;
        case 4:
            rc = relayc_compact(I(0), I(1), P(2), a[3], P(4), P(5), a[6], a[7], a[8], P(9), a[10],
                                a[11], P(12), P(13), P(14), P(15));
            break;
        case 5:
            rc = relayc_paged_meta(I(0), I(1), I(2), P(3), a[4], a[5], P(6), P(7), P(8), P(9),
                                   P(10), P(11));
            break;
        case 6:
            rc = relayc_head_argmax(I(0), I(1), I(2), I(3), P(4), P(5), F(6), P(7), P(8), I(9),
                                    P(10));
            break;
        case 7:
            rc = relayc_norm_pair(I(0), I(1), P(2), P(3), F(4), I(5), P(6), P(7), F(8), P(9));
            break;
        case 8: rc = relayc_linear(I(0), I(1), I(2), P(3), P(4), P(5), I(6)); break;
        case 9: rc = relayc_argmax(P(0), a[1], a[2], P(3)); break;
        case 10: rc = relayc_gather_rows(P(0), a[1], a[2], P(3), a[4], I(5), P(6)); break;
        case 11: rc = relayc_scatter_rows(P(0), a[1], a[2], P(3), a[4], P(5)); break;
        case 12: rc = relayc_cat_bytes(P(0), a[1], I(2), P(3), P(4)); break;
        case 13: rc = relayc_fill_pattern(P(0), a[1], a[2], P(3)); break;
        case 14: rc = relayc_add_int64(P(0), P(1), a[2], a[3], a[4], I(5), P(6)); break;
        case 15: rc = relayc_cast_int(P(0), I(1), P(2), I(3), a[4]); break;
        case 16: rc = relayc_copy_bytes(P(0), P(1), a[2]); break;
        case 17: rc = relayc_zero_bytes(P(0), a[1]); break;
        default: rc = relayc_exp(P(0), a[1], P(2)); break;
        }
        if (want != TAPE_ANY && rc != want) {
            *code = rc;
            return c;
        }
        records = a + count;
    }
    return n;
#undef P
#undef I
#undef F
}
