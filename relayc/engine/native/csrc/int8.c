/* The integer-dot GEMMs (dtype "int8"): activations quantised to 8 bits in blocks of 32,
 * multiplied with a GGUF file's own 4- and 8-bit q in int32. One unit of the native CPU
 * decoder (decoder.h).
 *
 * llama.cpp's CPU speed comes from never widening its weights to float: each row of x is
 * quantised per block of 32 k to int8 with one float32 scale (its Q8_1), and a block's dot
 * product with a weight block is an exact int32 sum of q_x * q_w. What follows fixes every
 * float operation so the bits are the same on every instruction set and for every batch:
 *
 *   activations (quantize_rows, one scalar function for every kernel; per row, per block):
 *     amax = max |x_k|, d_x = amax / 127, q_k = round-half-even(x_k * (1 / d_x)) (0 where
 *     d_x is 0), clamped to [-127, 127]; s_x = d_x * sum_k q_k. A non-finite amax makes
 *     d_x that value and q = 0, so the row's outputs are NaN, as the float32 path's are.
 *   per output column, blocks b = 0, 1, ... in k order, acc starting at +0:
 *     isum = sum_k q_w[k] * q_x[k]              int32, exact on every ISA
 *     acc = acc + (d_w * d_x) * (float)isum     three roundings: *, *, +
 *     acc = acc + m_w * s_x                     Q4 panels only (Q4_1's offset; Q4_0's -8d)
 *   then out = acc (or out + acc).
 * No fused multiply-adds (the library builds with -ffp-contract=off), so plain float32
 * arithmetic in NumPy reproduces every bit (tests/engine/test_native_int8.py's naive
 * reference). Each ISA only changes how isum is found: the scalar reference loops;
 * AVX2 multiplies unsigned by signed bytes into int16 pairs (maddubs: no overflow, see
 * below) and sums them into int32; AVX-512 VNNI's vpdpbusd sums four byte products into
 * each int32 lane.
 *
 * Panels of 16 output columns, each a run of K / 32 blocks, laid out so one 64-byte load
 * holds four consecutive k of each of the 16 columns -- what vpdpbusd multiplies per lane:
 *   BLOCKS_I8Q4 (320 bytes): d[16], m[16] (float16), then four chunks h of 64 bytes; byte
 *     4c + j of chunk h: column c's q[8h + j] in its low nibble, q[8h + 4 + j] high (q
 *     0..15: Q4_1's, or Q4_0's with m = -8d).
 *   BLOCKS_I8Q8 (544 bytes): d[16] (float16), then eight chunks g of 64 bytes; byte 4c + j
 *     of chunk g: column c's q[4g + j] (signed, Q8_0's).
 * (relayc.engine.native.blocks lays them out from a GGUF file's Q4_0, Q4_1 and Q8_0.) */
#include "decoder.h"

#if defined(RELAYC_X86_BF16)
#include <cpuid.h>
#define INT8_X86 1
#define VNNI_TARGET __attribute__((target("avx512f,avx512bw,avx512vnni,f16c")))
#define AVX2_TARGET __attribute__((target("avx2,f16c")))
#endif

/* One GEMM's quantised activations: row m's block b at q + m * K + 32 b, its scale
 * d[m * nb + b], s_x at s[...] and sum of q at sum[...]. */
struct xquant {
    const int8_t *q;
    const float *d, *s;
    const int32_t *sum;
    int K, nb;
};

static float half_to_float(uint16_t h) {
    /* exact: the magnitude moved into float32's fields reads as 2^-112 of the value */
    const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13, sign = (uint32_t)(h & 0x8000u) << 16;
    float f;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* x[M, K] -> xq (see the header comment); K a multiple of 32. */
static void quantize_rows(const float *x, int M, int K, int8_t *q, float *d, float *s,
                          int32_t *sum) {
    const int nb = K / 32;
    for (int m = 0; m < M; m++)
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)m * K + (size_t)b * 32;
            int8_t *qb = q + (size_t)m * K + (size_t)b * 32;
            float amax = 0.0f;
            int nan = 0;
            for (int k = 0; k < 32; k++) { /* branch-free: the compiler vectorises it */
                const float a = fabsf(xb[k]);
                nan |= a != a;
                amax = a > amax ? a : amax;
            }
            /* NaN or infinity: d_x carries it and every q is 0, so the row's sums are NaN */
            const int finite = !nan && amax <= 0x1.fffffep127f;
            const float dx = nan ? NAN : finite ? amax / 127.0f : INFINITY;
            const float inv = finite && dx != 0.0f ? 1.0f / dx : 0.0f;
            int32_t total = 0;
            if (!finite) memset(qb, 0, 32);
            for (int k = 0; finite && k < 32; k++) {
                /* round half to even: adding and taking away 1.5 * 2^23 leaves the nearest
                   integer for |v| < 2^22 (nearbyintf's result, vectorised); anything larger,
                   an infinity included, is clamped to +-127 either way */
                const float v = xb[k] * inv;
                float r = (v + 0x1.8p23f) - 0x1.8p23f;
                r = r != r ? 0.0f : r; /* 0 * inf, where d_x is subnormal: an exact 0 */
                r = r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r;
                qb[k] = (int8_t)r;
                total += qb[k];
            }
            d[(size_t)m * nb + b] = dx;
            sum[(size_t)m * nb + b] = total;
            s[(size_t)m * nb + b] = dx * (float)total;
        }
}

/* ---- the scalar reference (every CPU; the tests' yardstick for the others) ---- */

static void scalar_gemm(const struct xquant *xa, int M, const uint8_t *w, int N, float *out,
                        int add, int q4) {
    const int nb = xa->nb, bytes = q4 ? I8Q4_BYTES : I8Q8_BYTES;
    for (int m = 0; m < M; m++)
        for (int p = 0; p < N / 16; p++)
            for (int c = 0; c < 16; c++) {
                float acc = 0.0f;
                for (int b = 0; b < nb; b++) {
                    const uint8_t *blk = w + ((size_t)p * nb + b) * bytes;
                    const int8_t *xq = xa->q + (size_t)m * xa->K + (size_t)b * 32;
                    uint16_t h;
                    memcpy(&h, blk + 2 * c, 2);
                    const float dw = half_to_float(h);
                    int32_t isum = 0;
                    for (int k = 0; k < 32; k++) {
                        int qw;
                        if (q4) {
                            const uint8_t byte = blk[64 + 64 * (k / 8) + 4 * c + (k % 4)];
                            qw = (k % 8) < 4 ? byte & 15 : byte >> 4;
                        } else {
                            qw = (int8_t)blk[32 + 64 * (k / 4) + 4 * c + (k % 4)];
                        }
                        isum += qw * xq[k];
                    }
                    const float dx = xa->d[(size_t)m * nb + b];
                    acc = acc + (dw * dx) * (float)isum;
                    if (q4) {
                        memcpy(&h, blk + 32 + 2 * c, 2);
                        acc = acc + half_to_float(h) * xa->s[(size_t)m * nb + b];
                    }
                }
                float *o = out + (size_t)m * N + (size_t)p * 16 + c;
                *o = add ? *o + acc : acc;
            }
}

#if defined(INT8_X86)
/* ---- AVX-512 VNNI: 16 columns a register, vpdpbusd (u8 x s8, four products a lane) ----
 * vq4/vq8_MB_P: out[m, 16 p0 .. 16 (p0 + P)) (+)= row m's products with panels p0 ..
 * p0 + P, m < MB; each block's weights are unpacked once for all MB rows. Q8's signed q
 * go in as q + 128 (unsigned) and 128 * sum(q_x) comes off: the same exact isum. */
#define VNNI_COMBINE(MB, P, Q4)                                                            \
    for (int m = 0; m < MB; m++) {                                                         \
        const __m512 dx = _mm512_set1_ps(xa->d[(size_t)m * nb + b]);                       \
        const __m512 sx = _mm512_set1_ps(xa->s[(size_t)m * nb + b]);                       \
        for (int j = 0; j < P; j++) {                                                      \
            const __m512 t = _mm512_mul_ps(_mm512_mul_ps(dw[j], dx),                       \
                                           _mm512_cvtepi32_ps(isum[m][j]));                \
            acc[m][j] = _mm512_add_ps(acc[m][j], t);                                       \
            if (Q4) acc[m][j] = _mm512_add_ps(acc[m][j], _mm512_mul_ps(mw[j], sx));        \
        }                                                                                  \
    }

#define VNNI_STORE(MB, P)                                                                  \
    for (int m = 0; m < MB; m++)                                                           \
        for (int j = 0; j < P; j++) {                                                      \
            float *o = out + (size_t)m * N + (size_t)(p0 + j) * 16;                        \
            __m512 r = acc[m][j];                                                          \
            if (add) r = _mm512_add_ps(_mm512_loadu_ps(o), r);                             \
            _mm512_storeu_ps(o, r);                                                        \
        }

#define VNNI_Q4(MB, P)                                                                     \
    static VNNI_TARGET void vq4_##MB##_##P(const struct xquant *xa, const uint8_t *w, int p0, \
                                           int N, float *out, int add) {                   \
        const int nb = xa->nb, K = xa->K;                                                  \
        const __m512i low4 = _mm512_set1_epi8(15);                                         \
        __m512 acc[MB][P];                                                                 \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = _mm512_setzero_ps();                   \
        for (int b = 0; b < nb; b++) {                                                     \
            __m512 dw[P], mw[P];                                                           \
            __m512i isum[MB][P];                                                           \
            const uint8_t *blk[P];                                                         \
            for (int j = 0; j < P; j++) {                                                  \
                blk[j] = w + ((size_t)(p0 + j) * nb + b) * I8Q4_BYTES;                      \
                dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[j]));      \
                mw[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(blk[j] + 32))); \
                for (int m = 0; m < MB; m++) isum[m][j] = _mm512_setzero_si512();          \
            }                                                                              \
            for (int h = 0; h < 4; h++) {                                                  \
                __m512i lo[P], hi[P];                                                      \
                for (int j = 0; j < P; j++) {                                              \
                    const __m512i raw = _mm512_loadu_si512(blk[j] + 64 + 64 * h);          \
                    lo[j] = _mm512_and_si512(raw, low4);                                   \
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);             \
                }                                                                          \
                for (int m = 0; m < MB; m++) {                                             \
                    const int8_t *xq = xa->q + (size_t)m * K + (size_t)b * 32 + 8 * h;     \
                    int32_t a0, a1;                                                        \
                    memcpy(&a0, xq, 4);                                                    \
                    memcpy(&a1, xq + 4, 4);                                                \
                    const __m512i x0 = _mm512_set1_epi32(a0), x1 = _mm512_set1_epi32(a1);  \
                    for (int j = 0; j < P; j++) {                                          \
                        isum[m][j] = _mm512_dpbusd_epi32(isum[m][j], lo[j], x0);           \
                        isum[m][j] = _mm512_dpbusd_epi32(isum[m][j], hi[j], x1);           \
                    }                                                                      \
                }                                                                          \
            }                                                                              \
            VNNI_COMBINE(MB, P, 1)                                                         \
        }                                                                                  \
        VNNI_STORE(MB, P)                                                                  \
    }

#define VNNI_Q8(MB, P)                                                                     \
    static VNNI_TARGET void vq8_##MB##_##P(const struct xquant *xa, const uint8_t *w, int p0, \
                                           int N, float *out, int add) {                   \
        const int nb = xa->nb, K = xa->K;                                                  \
        const __m512i flip = _mm512_set1_epi8((char)0x80);                                 \
        __m512 acc[MB][P];                                                                 \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < P; j++) acc[m][j] = _mm512_setzero_ps();                   \
        for (int b = 0; b < nb; b++) {                                                     \
            __m512 dw[P], mw[P];                                                           \
            __m512i isum[MB][P];                                                           \
            const uint8_t *blk[P];                                                         \
            for (int m = 0; m < MB; m++) {                                                 \
                const __m512i off = _mm512_set1_epi32(-128 * xa->sum[(size_t)m * nb + b]); \
                for (int j = 0; j < P; j++) isum[m][j] = off;                              \
            }                                                                              \
            for (int j = 0; j < P; j++) {                                                  \
                blk[j] = w + ((size_t)(p0 + j) * nb + b) * I8Q8_BYTES;                      \
                dw[j] = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)blk[j]));      \
                mw[j] = dw[j];                                                             \
            }                                                                              \
            for (int g = 0; g < 8; g++) {                                                  \
                __m512i wq[P];                                                             \
                for (int j = 0; j < P; j++)                                                \
                    wq[j] = _mm512_xor_si512(_mm512_loadu_si512(blk[j] + 32 + 64 * g), flip); \
                for (int m = 0; m < MB; m++) {                                             \
                    int32_t a;                                                             \
                    memcpy(&a, xa->q + (size_t)m * K + (size_t)b * 32 + 4 * g, 4);         \
                    const __m512i xv = _mm512_set1_epi32(a);                               \
                    for (int j = 0; j < P; j++)                                            \
                        isum[m][j] = _mm512_dpbusd_epi32(isum[m][j], wq[j], xv);           \
                }                                                                          \
            }                                                                              \
            (void)mw;                                                                      \
            VNNI_COMBINE(MB, P, 0)                                                         \
        }                                                                                  \
        VNNI_STORE(MB, P)                                                                  \
    }

/* ---- AVX2: 8 columns a register, each panel two halves; maddubs (u8 x s8 -> int16 pairs)
 * then madd with ones into int32. Q4: |q_w * q_x| <= 15 * 127, so eight maddubs (two
 * products each) sum in int16 without overflow (8 * 3810 < 32768). Q8: q_w's magnitude
 * (u8, <= 128) times q_x with q_w's sign (s8, |.| <= 127): one maddubs <= 32512, widened
 * to int32 at once. ---- */
#define AVX2_COMBINE(MB, P, Q4)                                                            \
    for (int m = 0; m < MB; m++) {                                                         \
        const __m256 dx = _mm256_set1_ps(xa->d[(size_t)m * nb + b]);                       \
        const __m256 sx = _mm256_set1_ps(xa->s[(size_t)m * nb + b]);                       \
        for (int j = 0; j < 2 * P; j++) {                                                  \
            const __m256 t = _mm256_mul_ps(_mm256_mul_ps(dw[j], dx),                       \
                                           _mm256_cvtepi32_ps(isum[m][j]));                \
            acc[m][j] = _mm256_add_ps(acc[m][j], t);                                       \
            if (Q4) acc[m][j] = _mm256_add_ps(acc[m][j], _mm256_mul_ps(mw[j], sx));        \
        }                                                                                  \
    }

#define AVX2_STORE(MB, P)                                                                  \
    for (int m = 0; m < MB; m++)                                                           \
        for (int j = 0; j < 2 * P; j++) {                                                  \
            float *o = out + (size_t)m * N + (size_t)p0 * 16 + 8 * j;                      \
            __m256 r = acc[m][j];                                                          \
            if (add) r = _mm256_add_ps(_mm256_loadu_ps(o), r);                             \
            _mm256_storeu_ps(o, r);                                                        \
        }

/* the scales of panel j / 2's half j % 2 (8 float16 at byte `at` of its block) */
#define AVX2_HALF_SCALE(blk, j, at)                                                        \
    _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((blk)[(j) / 2] + (at) + 16 * ((j) % 2))))

#define AVX2_Q4(MB, P)                                                                     \
    static AVX2_TARGET void aq4_##MB##_##P(const struct xquant *xa, const uint8_t *w, int p0, \
                                           int N, float *out, int add) {                   \
        const int nb = xa->nb, K = xa->K;                                                  \
        const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);            \
        __m256 acc[MB][2 * P];                                                             \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < 2 * P; j++) acc[m][j] = _mm256_setzero_ps();               \
        for (int b = 0; b < nb; b++) {                                                     \
            __m256 dw[2 * P], mw[2 * P];                                                   \
            __m256i pairs[MB][2 * P], isum[MB][2 * P];                                     \
            const uint8_t *blk[P];                                                         \
            for (int j = 0; j < P; j++) blk[j] = w + ((size_t)(p0 + j) * nb + b) * I8Q4_BYTES; \
            for (int j = 0; j < 2 * P; j++) {                                              \
                dw[j] = AVX2_HALF_SCALE(blk, j, 0);                                        \
                mw[j] = AVX2_HALF_SCALE(blk, j, 32);                                       \
                for (int m = 0; m < MB; m++) pairs[m][j] = _mm256_setzero_si256();         \
            }                                                                              \
            for (int h = 0; h < 4; h++)                                                    \
                for (int j = 0; j < 2 * P; j++) {                                          \
                    const __m256i raw = _mm256_loadu_si256(                                \
                        (const __m256i *)(blk[j / 2] + 64 + 64 * h + 32 * (j % 2)));       \
                    const __m256i lo = _mm256_and_si256(raw, low4);                        \
                    const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);  \
                    for (int m = 0; m < MB; m++) {                                         \
                        const int8_t *xq = xa->q + (size_t)m * K + (size_t)b * 32 + 8 * h; \
                        int32_t a0, a1;                                                    \
                        memcpy(&a0, xq, 4);                                                \
                        memcpy(&a1, xq + 4, 4);                                            \
                        pairs[m][j] = _mm256_add_epi16(                                    \
                            pairs[m][j], _mm256_maddubs_epi16(lo, _mm256_set1_epi32(a0))); \
                        pairs[m][j] = _mm256_add_epi16(                                    \
                            pairs[m][j], _mm256_maddubs_epi16(hi, _mm256_set1_epi32(a1))); \
                    }                                                                      \
                }                                                                          \
            for (int m = 0; m < MB; m++)                                                   \
                for (int j = 0; j < 2 * P; j++) isum[m][j] = _mm256_madd_epi16(pairs[m][j], ones); \
            AVX2_COMBINE(MB, P, 1)                                                         \
        }                                                                                  \
        AVX2_STORE(MB, P)                                                                  \
    }

#define AVX2_Q8(MB, P)                                                                     \
    static AVX2_TARGET void aq8_##MB##_##P(const struct xquant *xa, const uint8_t *w, int p0, \
                                           int N, float *out, int add) {                   \
        const int nb = xa->nb, K = xa->K;                                                  \
        const __m256i ones = _mm256_set1_epi16(1);                                         \
        __m256 acc[MB][2 * P];                                                             \
        for (int m = 0; m < MB; m++)                                                       \
            for (int j = 0; j < 2 * P; j++) acc[m][j] = _mm256_setzero_ps();               \
        for (int b = 0; b < nb; b++) {                                                     \
            __m256 dw[2 * P], mw[2 * P];                                                   \
            __m256i isum[MB][2 * P];                                                       \
            const uint8_t *blk[P];                                                         \
            for (int j = 0; j < P; j++) blk[j] = w + ((size_t)(p0 + j) * nb + b) * I8Q8_BYTES; \
            for (int j = 0; j < 2 * P; j++) {                                              \
                dw[j] = AVX2_HALF_SCALE(blk, j, 0);                                        \
                mw[j] = dw[j];                                                             \
                for (int m = 0; m < MB; m++) isum[m][j] = _mm256_setzero_si256();          \
            }                                                                              \
            for (int g = 0; g < 8; g++)                                                    \
                for (int j = 0; j < 2 * P; j++) {                                          \
                    const __m256i wq = _mm256_loadu_si256(                                 \
                        (const __m256i *)(blk[j / 2] + 32 + 64 * g + 32 * (j % 2)));       \
                    const __m256i mag = _mm256_abs_epi8(wq);                               \
                    for (int m = 0; m < MB; m++) {                                         \
                        int32_t a;                                                         \
                        memcpy(&a, xa->q + (size_t)m * K + (size_t)b * 32 + 4 * g, 4);     \
                        const __m256i xs = _mm256_sign_epi8(_mm256_set1_epi32(a), wq);     \
                        isum[m][j] = _mm256_add_epi32(                                     \
                            isum[m][j], _mm256_madd_epi16(_mm256_maddubs_epi16(mag, xs), ones)); \
                    }                                                                      \
                }                                                                          \
            (void)mw;                                                                      \
            AVX2_COMBINE(MB, P, 0)                                                         \
        }                                                                                  \
        AVX2_STORE(MB, P)                                                                  \
    }

typedef void (*int8_block_fn)(const struct xquant *, const uint8_t *, int, int, float *, int);

/* A kernel set: for 1-8 rows the widest kernel (width[mb] panels) and a one-panel one. */
struct int8_blocks {
    int8_block_fn wide[9], narrow[9];
    int width[9];
};

/* VNNI: up to 16 int32 sums and 16 float accumulators of 32 registers; two rows and
 * fewer over four panels, three and four over two, more over one. */
#define VNNI_KERNELS(NAME, BLOCK)                                                          \
    BLOCK(1, 8) BLOCK(1, 1) BLOCK(2, 4) BLOCK(2, 1) BLOCK(3, 2) BLOCK(3, 1) BLOCK(4, 2)     \
    BLOCK(4, 1) BLOCK(5, 1) BLOCK(6, 1) BLOCK(7, 1) BLOCK(8, 1)                             \
    static const struct int8_blocks NAME##_blocks = {                                      \
        {0, NAME##_1_8, NAME##_2_4, NAME##_3_2, NAME##_4_2, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, 8, 4, 2, 2, 1, 1, 1, 1},                                                       \
    };
/* AVX2: sixteen registers; a panel is two of them. */
#define AVX2_KERNELS(NAME, BLOCK)                                                          \
    BLOCK(1, 2) BLOCK(1, 1) BLOCK(2, 1) BLOCK(3, 1) BLOCK(4, 1) BLOCK(5, 1) BLOCK(6, 1)     \
    BLOCK(7, 1) BLOCK(8, 1)                                                                 \
    static const struct int8_blocks NAME##_blocks = {                                      \
        {0, NAME##_1_2, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, 2, 1, 1, 1, 1, 1, 1, 1},                                                       \
    };

VNNI_KERNELS(vq4, VNNI_Q4)
VNNI_KERNELS(vq8, VNNI_Q8)
AVX2_KERNELS(aq4, AVX2_Q4)
AVX2_KERNELS(aq8, AVX2_Q8)

/* Which int8 kernels this CPU and OS run: bit k set for kernel k (INT8_*). */
static int int8_probe(void) {
    int found = 1 << INT8_SCALAR;
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return found;
    const int f16c = (c >> 29) & 1, osxsave = (c >> 27) & 1;
    unsigned lo = 0, hi = 0;
    if (osxsave) __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return found;
    const int avx2 = (b >> 5) & 1, avx512f = (b >> 16) & 1, avx512bw = (b >> 30) & 1;
    const int vnni = (c >> 11) & 1;
    if (avx2 && f16c && (lo & 0x6) == 0x6) found |= 1 << INT8_AVX2;
    if (avx512f && avx512bw && vnni && f16c && (lo & 0xe6) == 0xe6) found |= 1 << INT8_VNNI;
    return found;
}
#else
static int int8_probe(void) { return 1 << INT8_SCALAR; }
#endif /* INT8_X86 */

static kernel_choice int8_choice = {-1, -1, int8_probe, INT8_VNNI};

/* Bit k set: int8 kernel k runs here. */
int relayc_int8_kernels(void) { return kernel_found(&int8_choice); }

/* The kernel every int8 GEMM of this process uses: want < 0 asks (the best supported,
 * chosen on first use); want >= 0 switches (tests, benchmarks: every kernel gives the same
 * bits, so a switch changes only the speed); -1 where it does not run here. */
int relayc_int8_kernel(int want) { return kernel_choose(&int8_choice, want); }

/* out[M, N] (+)= x[M, K] @ w (int8 panels of `format`) with `kernel`; -1 where the
 * scratch cannot be had. Four panels at a time, every block of up to eight rows over them
 * while they sit in L1/L2, so each block is read and unpacked once per eight rows. */
static int gemm_int8_with(const float *x, int M, int K, const uint8_t *w, int N, float *out,
                          int add, int format, int kernel) {
    const int nb = K / 32, q4 = format == BLOCKS_I8Q4;
    const size_t scales = (size_t)M * nb;
    void *scratch = malloc((size_t)M * K + scales * (2 * sizeof(float) + sizeof(int32_t)) + 1);
    if (scratch == NULL) return -1;
    float *d = (float *)scratch, *s = d + scales;
    int32_t *sum = (int32_t *)(s + scales);
    int8_t *q = (int8_t *)(sum + scales);
    quantize_rows(x, M, K, q, d, s, sum);
    if (kernel == INT8_SCALAR) {
        const struct xquant xa = {q, d, s, sum, K, nb};
        scalar_gemm(&xa, M, w, N, out, add, q4);
        free(scratch);
        return 0;
    }
#if defined(INT8_X86)
    const struct int8_blocks *kb = kernel == INT8_VNNI ? (q4 ? &vq4_blocks : &vq8_blocks)
                                                       : (q4 ? &aq4_blocks : &aq8_blocks);
    const int panels = N / 16;
    /* up to eight rows are one row block: one pass over every panel with the widest
       kernel; more rows go four panels at a time, every row block over them in cache */
    const int group = M <= 8 ? panels : 4;
    for (int g = 0; g < panels; g += group) {
        const int end = g + group < panels ? g + group : panels;
        for (int m0 = 0, mb; m0 < M; m0 += mb) {
            mb = M - m0 >= 8 ? 8 : M - m0;
            const struct xquant xa = {q + (size_t)m0 * K, d + (size_t)m0 * nb,
                                      s + (size_t)m0 * nb, sum + (size_t)m0 * nb, K, nb};
            float *orow = out + (size_t)m0 * N;
            int p = g;
            for (; p + kb->width[mb] <= end; p += kb->width[mb])
                kb->wide[mb](&xa, w, p, N, orow, add);
            for (; p < end; p++) kb->narrow[mb](&xa, w, p, N, orow, add);
        }
    }
#endif
    free(scratch);
    return 0;
}

void gemm_int8(const float *x, int M, int K, const uint8_t *w, int N, float *out, int add,
               int format) {
    if (gemm_int8_with(x, M, K, w, N, out, add, format, relayc_int8_kernel(-1)) != 0)
        /* no scratch: NaN rows rather than stale ones (the caller sees them in logits) */
        for (size_t i = 0; i < (size_t)M * N; i++) out[i] = NAN;
}

/* out[M, N] = x[M, K] @ w (BLOCKS_I8Q4 / BLOCKS_I8Q8 panels; K a multiple of 32, N of 16)
 * with int8 kernel `kernel` (INT8_*; -1: the process's): the tests compare the kernels.
 * -2: bad sizes or format; -3: the kernel does not run here; -1: no memory. */
int relayc_int8_gemm(int M, int K, int N, const float *x, const uint8_t *w, int format,
                     int kernel, float *out) {
    if (M < 0 || K < 32 || K % 32 || N < 16 || N % 16) return -2;
    if (format != BLOCKS_I8Q4 && format != BLOCKS_I8Q8) return -2;
    if (kernel < 0) kernel = relayc_int8_kernel(-1);
    if (kernel > INT8_VNNI || !((relayc_int8_kernels() >> kernel) & 1)) return -3;
    return gemm_int8_with(x, M, K, w, N, out, 0, format, kernel);
}

/* The activations' quantisation (quantize_rows) on its own: q [M, K], d, s, sum [M, K/32]. */
int relayc_int8_quantize(int M, int K, const float *x, int8_t *q, float *d, float *s,
                         int32_t *sum) {
    if (M < 0 || K < 32 || K % 32) return -2;
    quantize_rows(x, M, K, q, d, s, sum);
    return 0;
}
