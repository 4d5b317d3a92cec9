/* The block-quantized GEMMs (GGUF blocks rebuilt in registers). One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

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
 * (relayc.engine.native.blocks packs them from a GGUF file's tensors.) */

#if !defined(__AVX512F__) && defined(__AVX2__)
/* AVX2 (no AVX-512): a v16 from two 8-float halves. The generic conversions below compile
 * to scalar code there (about a tenth of AVX-512's speed on SmolLM2's Q4_1 blocks); these
 * are the same exact conversions, eight lanes an instruction. */
static inline v16 join8(__m256 lo, __m256 hi) {
    v16 f;
    memcpy(&f, &lo, sizeof lo);
    memcpy((char *)&f + sizeof lo, &hi, sizeof hi);
    return f;
}
#endif

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
#elif defined(__AVX2__) && defined(__F16C__)
    return join8(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)),
                 _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(p + 16))));
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
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    return join8(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)),
                 _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, 8))));
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
#elif defined(__AVX2__)
    const __m128i b = _mm_loadu_si128((const __m128i *)p);
    const __m256i q0 = _mm256_cvtepu8_epi32(b), q1 = _mm256_cvtepu8_epi32(_mm_srli_si128(b, 8));
    const __m256i low4 = _mm256_set1_epi32(15);
    *lo = join8(_mm256_cvtepi32_ps(_mm256_and_si256(q0, low4)),
                _mm256_cvtepi32_ps(_mm256_and_si256(q1, low4)));
    *hi = join8(_mm256_cvtepi32_ps(_mm256_srli_epi32(q0, 4)),
                _mm256_cvtepi32_ps(_mm256_srli_epi32(q1, 4)));
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
#elif defined(__AVX2__)
    const __m256i lo = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    const __m256i hi = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 16)));
    return join8(_mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)),
                 _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
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
#if defined(__AVX512F__)
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
#else
/* Without AVX-512 a v16 is two of AVX2's sixteen 256-bit registers, so AVX-512's tables
 * (eight panels' accumulators, scales and offsets for one row) spill: two panels for one
 * or two rows, one past that. The same sums in the same order: the same bits. */
#define QUANT_KERNELS(NAME, BLOCK, BYTES)                                                  \
    BLOCK(1, 2) BLOCK(1, 1) BLOCK(2, 2) BLOCK(2, 1) BLOCK(3, 1) BLOCK(4, 1) BLOCK(5, 1)     \
    BLOCK(6, 1) BLOCK(7, 1) BLOCK(8, 1)                                                     \
    static const struct quant_blocks NAME##_blocks = {                                     \
        {0, NAME##_1_2, NAME##_2_2, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, NAME##_1_1, NAME##_2_1, NAME##_3_1, NAME##_4_1, NAME##_5_1, NAME##_6_1,         \
         NAME##_7_1, NAME##_8_1},                                                          \
        {0, 2, 2, 1, 1, 1, 1, 1, 1},                                                       \
        {0, NAME##_1_2, NAME##_2_2, NAME##_3_1},                                           \
        {0, 2, 2, 1},                                                                      \
        BYTES,                                                                             \
    };
#endif

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
void gemm_blocks(const float *x, int M, int K, const uint8_t *w, int N, float *out,
                        int add, int format) {
    if (format == BLOCKS_I8Q4 || format == BLOCKS_I8Q8) {
        gemm_int8(x, M, K, w, N, out, add, format);
        return;
    }
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

int block_bytes(int format) {
    return format == BLOCKS_I8Q4 ? I8Q4_BYTES
           : format == BLOCKS_I8Q8 ? I8Q8_BYTES
                                   : quant_table(format)->bytes;
}

/* What the block kernels above were compiled for (-march=native: this CPU's features):
 * bit 0 AVX-512F, bit 1 AVX2, bit 2 FMA, bit 3 F16C. Their speed against float32 panels
 * hangs on it (blocks.py's FLOAT32_PATHS: the engine's float32 path per CPU). */
int relayc_block_isa(void) {
    int isa = 0;
#if defined(__AVX512F__)
    isa |= 1;
#endif
#if defined(__AVX2__)
    isa |= 2;
#endif
#if defined(__FMA__)
    isa |= 4;
#endif
#if defined(__F16C__)
    isa |= 8;
#endif
    return isa;
}
