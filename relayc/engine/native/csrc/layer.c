/* The layers (decode_layers) and the relayc_decoder* entry points. One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

/* x[D] <- x * cos + roll(x, D/2) * sin (sin's first half negated: rotate-half). */
static void rotate(float *x, const float *cos_t, const float *sin_t, int D, float *tmp) {
    int half = D / 2;
    memcpy(tmp, x, sizeof(float) * (size_t)D);
    for (int i = 0; i < D; i++) x[i] = tmp[i] * cos_t[i] + tmp[(i + half) % D] * sin_t[i];
}

/* The layers, float32 activations in x; weights and caches float32 (bf16 == 0) or
 * bfloat16 (bf16 == 1, the caches' elements uint16_t). */
int decode_layers(
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
