/* The bfloat16 GEMMs (portable, AVX512-BF16) and the kernel choice. One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

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
 * (relayc.engine.decoder.packing._pack): K is padded with zeros to Kp, a multiple of 32 (one
 * AMX tile's depth), and panel p is Kp / 2 pairs of 64 bytes; pair i holds 16 words,
 * column c's = w[2i, 16p + c] | w[2i + 1, 16p + c] << 16. The activations are rounded into
 * xb[rows, Kp] (zero past K, and past M up to a whole tile of rows), so the padding adds
 * 0 * 0 to every sum, for every kernel and row count alike. */

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

/* One pair of a panel widened: shifting each word left by 16 gives w[2i] as a float32,
 * masking its low half gives w[2i + 1]. */
static inline void widen_pair(const uint16_t *p, v16 *even, v16 *odd) {
    u32x16 w;
    memcpy(&w, p, sizeof w);
    const u32x16 lo = w << 16, hi = w & 0xffff0000u;
    memcpy(even, &lo, sizeof lo);
    memcpy(odd, &hi, sizeof hi);
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

/* RELAYC_X86_BF16, RELAYC_AMX: decoder.h, where the compiler has the x86 kernels' targets. */
#if defined(RELAYC_X86_BF16)
#include <cpuid.h>
#if defined(RELAYC_AMX)
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

static kernel_choice bf16_choice = {-1, -1, bf16_probe, BF16_AMX};

/* Bit k set: kernel k runs here. */
int relayc_bf16_kernels(void) { return kernel_found(&bf16_choice); }

/* The kernel every bf16 GEMM of this process uses: want < 0 asks (the best supported,
 * chosen on first use); want >= 0 switches to kernel `want` (tests and benchmarks only:
 * rows computed before and after a switch differ in bits), -1 if it does not run here. */
int relayc_bf16_kernel(int want) { return kernel_choose(&bf16_choice, want); }

/* out[M, N] (+)= bf16(x)[M, K] @ w with `kernel`; xb: padded_rows(M) x padded_k(K) halves
 * of scratch. */
void gemm_bf16(const float *x, int M, int K, const uint16_t *w, int N, float *out,
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
