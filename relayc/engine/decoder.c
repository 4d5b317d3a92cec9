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
 * the GEMMs stream each weight once for up to six rows at a time, which is what a
 * small-batch forward is bound by.
 */
#include <math.h>
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
                    acc[m][j][0] += s * w0[j];                                             \
                    acc[m][j][1] += s * w1[j];                                             \
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

int relayc_decoder(
    int T, int hidden, int heads, int kv_heads, int head_dim, int inter, int layers,
    float *x,                 /* [T, hidden], updated in place */
    const float *cos_table,   /* [T, head_dim] */
    const float *sin_table,   /* [T, head_dim], first half negated */
    const int64_t *slots,     /* [T] KV slots the new tokens write */
    const int64_t *kv_loc,    /* [B, S] KV slots each request's columns read */
    const float *mask,        /* [B, Q, S] additive: 0 or -inf */
    int B, int Q, int S,
    const float *const *ln1, const float *const *w_qkv, const float *const *w_o,
    const float *const *ln2, const float *const *w_gate_up, const float *const *w_down,
    const float *eps1, const float *eps2,
    float *const *k_cache, float *const *v_cache, /* [cache_rows, kv_heads, head_dim] each */
    int64_t cache_rows
) {
    if (T != B * Q || heads % kv_heads != 0 || hidden % 16 != 0 || inter % 8 != 0 ||
        (heads + 2 * kv_heads) * head_dim % 16 != 0)
        return -2; /* every GEMM's output width a whole number of 16-column panels */
    /* Every slot this call writes or reads lies inside the cache: a bad index is an error
       the caller reports, never a write past the buffer. */
    for (int t = 0; t < T; t++)
        if (slots[t] < 0 || slots[t] >= cache_rows) return -3;
    for (size_t j = 0; j < (size_t)B * S; j++)
        if (kv_loc[j] < 0 || kv_loc[j] >= cache_rows) return -4;
    const int D = head_dim, group = heads / kv_heads;
    const int qkv_width = (heads + 2 * kv_heads) * D, row = kv_heads * D;
    const float scale = 1.0f / sqrtf((float)D);
    size_t floats = (size_t)T * hidden + (size_t)T * qkv_width + (size_t)T * heads * D +
                    (size_t)T * 2 * inter + (size_t)T * inter + (size_t)S + (size_t)D;
    float *buffer = (float *)malloc(sizeof(float) * floats);
    if (buffer == NULL) return -1;
    float *h = buffer, *qkv = h + (size_t)T * hidden, *attn = qkv + (size_t)T * qkv_width;
    float *gate_up = attn + (size_t)T * heads * D, *act = gate_up + (size_t)T * 2 * inter;
    float *scores = act + (size_t)T * inter, *tmp = scores + S;

    for (int l = 0; l < layers; l++) {
        rms_norm(x, T, hidden, ln1[l], eps1[l], h);
        gemm(h, T, hidden, w_qkv[l], qkv_width, qkv, 0);
        for (int t = 0; t < T; t++) {
            float *qt = qkv + (size_t)t * qkv_width;
            const float *c = cos_table + (size_t)t * D, *s = sin_table + (size_t)t * D;
            for (int hd = 0; hd < heads + kv_heads; hd++) rotate(qt + (size_t)hd * D, c, s, D, tmp);
            /* the K/V write, before any row reads the new tokens */
            memcpy(k_cache[l] + (size_t)slots[t] * row, qt + (size_t)heads * D,
                   sizeof(float) * (size_t)row);
            memcpy(v_cache[l] + (size_t)slots[t] * row, qt + (size_t)(heads + kv_heads) * D,
                   sizeof(float) * (size_t)row);
        }
        for (int b = 0; b < B; b++) {
            const int64_t *loc = kv_loc + (size_t)b * S;
            for (int q = 0; q < Q; q++) {
                const int t = b * Q + q;
                const float *mrow = mask + ((size_t)b * Q + q) * S;
                for (int hd = 0; hd < heads; hd++) {
                    const float *qv = qkv + (size_t)t * qkv_width + (size_t)hd * D;
                    const int kvh = hd / group;
                    const float *kbase = k_cache[l] + (size_t)kvh * D;
                    int j = 0;
                    if (D % 8 == 0) {
                        /* four keys at a time: four independent chains, each summed in
                           the same order as dot() */
                        for (; j + 4 <= S; j += 4) {
                            const float *k0 = kbase + (size_t)loc[j] * row;
                            const float *k1 = kbase + (size_t)loc[j + 1] * row;
                            const float *k2 = kbase + (size_t)loc[j + 2] * row;
                            const float *k3 = kbase + (size_t)loc[j + 3] * row;
                            v8 a0 = splat(0.0f), a1 = a0, a2 = a0, a3 = a0;
                            for (int i = 0; i < D; i += 8) {
                                const v8 qi = load8(qv + i);
                                a0 += qi * load8(k0 + i);
                                a1 += qi * load8(k1 + i);
                                a2 += qi * load8(k2 + i);
                                a3 += qi * load8(k3 + i);
                            }
                            float d0 = 0.0f, d1 = 0.0f, d2 = 0.0f, d3 = 0.0f;
                            for (int e = 0; e < 8; e++) {
                                d0 += a0[e];
                                d1 += a1[e];
                                d2 += a2[e];
                                d3 += a3[e];
                            }
                            scores[j] = d0;
                            scores[j + 1] = d1;
                            scores[j + 2] = d2;
                            scores[j + 3] = d3;
                        }
                    }
                    for (; j < S; j++) scores[j] = dot(qv, kbase + (size_t)loc[j] * row, D);
                    float top = -INFINITY;
                    for (j = 0; j < S; j++) {
                        if (isinf(mrow[j]) && mrow[j] < 0) {
                            scores[j] = -INFINITY;
                            continue;
                        }
                        scores[j] = scores[j] * scale + mrow[j];
                        if (scores[j] > top) top = scores[j];
                    }
                    float *out = attn + (size_t)t * heads * D + (size_t)hd * D;
                    for (int i = 0; i < D; i++) out[i] = 0.0f;
                    float total = 0.0f;
                    for (j = 0; j < S; j++) {
                        if (scores[j] == -INFINITY) continue;
                        const float p = expf(scores[j] - top);
                        total += p;
                        const float *vv = v_cache[l] + (size_t)loc[j] * row + (size_t)kvh * D;
                        for (int i = 0; i < D; i++) out[i] += p * vv[i];
                    }
                    const float inv = total > 0.0f ? 1.0f / total : 0.0f;
                    for (int i = 0; i < D; i++) out[i] *= inv;
                }
            }
        }
        gemm(attn, T, heads * D, w_o[l], hidden, x, 1);
        rms_norm(x, T, hidden, ln2[l], eps2[l], h);
        gemm(h, T, hidden, w_gate_up[l], 2 * inter, gate_up, 0);
        for (int t = 0; t < T; t++) {
            const float *g = gate_up + (size_t)t * 2 * inter, *u = g + inter;
            float *a = act + (size_t)t * inter;
            for (int i = 0; i < inter; i++) a[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
        }
        gemm(act, T, inter, w_down[l], hidden, x, 1);
    }
    free(buffer);
    return 0;
}

/* The final RMSNorm and the LM head over T rows: logits [T, vocab_padded] (the packed
 * head's columns past the vocabulary are zero). */
int relayc_head(int T, int hidden, int vocab_padded, const float *x, const float *norm_weight,
                float eps, const float *head, float *logits) {
    if (vocab_padded % 16 != 0) return -2; /* hidden is the reduction: any size */
    float *h = (float *)malloc(sizeof(float) * (size_t)T * hidden);
    if (h == NULL) return -1;
    rms_norm(x, T, hidden, norm_weight, eps, h);
    gemm(h, T, hidden, head, vocab_padded, logits, 0);
    free(h);
    return 0;
}
