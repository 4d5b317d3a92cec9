/* One decode or verify forward (relayc_forward). One unit of the native CPU decoder
 * (decoder.h). */
#include "decoder.h"

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
