/* The final norm, the LM head and the argmax. One unit of the native CPU decoder (decoder.h). */
#include "decoder.h"

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
                         : blocks ? (size_t)(hidden / 32) * block_bytes(blocks)
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
