/* The EAGLE-3 draft chain and draft extend. One unit of the native CPU decoder (decoder.h). */
#include "decoder.h"

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
