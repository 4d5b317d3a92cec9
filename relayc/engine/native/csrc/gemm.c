/* The float32 GEMM over 16-column panels, gemm_any (every weight format's GEMM) and
 * relayc_linear. One unit of the native CPU decoder (decoder.h). */
#include "decoder.h"

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

/* out[M, N] (+)= x @ w, w packed as float32 (kernel -1), bfloat16 panels (kernel >= 0: which
 * bf16 kernel; xb its scratch) or block panels (kernel -1 - format: gemm_blocks). */
void gemm_any(const float *x, int M, int K, const void *w, int N, float *out, int add,
                     int kernel, uint16_t *xb) {
    if (kernel >= 0)
        gemm_bf16(x, M, K, (const uint16_t *)w, N, out, add, kernel, xb);
    else if (kernel < -1)
        gemm_blocks(x, M, K, (const uint8_t *)w, N, out, add, -1 - kernel);
    else
        gemm(x, M, K, (const float *)w, N, out, add);
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
