/* Masked attention of one request's rows over its gathered K/V. One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

typedef float v4f __attribute__((vector_size(16)));
typedef int32_t i32x4 __attribute__((vector_size(16)));

/* A cached context is far bigger than L2 once a forward's weights have streamed through,
 * and its rows lie wherever the pool put them: each key or value row is asked for this many
 * rows before it is read, so the reads overlap instead of waiting one by one. */
#define ATTEND_AHEAD 12
static inline void prefetch_row(const float *row, int D) {
    for (int i = 0; i < D; i += 16) __builtin_prefetch(row + i);
}

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
void attend_group(const float *q, size_t q_stride, const float *const *keys,
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
