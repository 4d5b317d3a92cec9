/* The attention metadata of a uniform paged batch. One unit of the native CPU decoder
 * (decoder.h). */
#include "decoder.h"

/* The attention metadata of a forward where every request has `queries` new tokens (decode,
 * verify): what relayc.engine.attention.PagedAttentionMetadata.build makes with some twenty
 * torch calls, which cost ~20 us each right after a forward has streamed its weights. Per
 * request b, P = p_max key columns of its prefix then its Q = queries new tokens:
 *   kv_loc[b, j] = req_to_token[req_pool_indices[b], j] (j < P), out_cache_loc[b * Q + k]
 *     (j = P + k);
 *   mask[b, q, j] = 0 (attend) or -inf: j < P attends while j < prefix_lens[b]; j = P + k
 *     attends where tree_mask[b, q, k] (bytes, [B, Q, Q]), or k <= q without a tree mask.
 * req_to_token is int32 [rows, width], row-major. Returns 0, or -2 for P > width or a
 * request row outside 0..rows-1 (the caller's torch path raises the error). */
int paged_meta_check(int batch, int queries, int p_max, int64_t rows, int64_t width,
                            const int64_t *req_pool_indices) {
    if (batch < 0 || queries < 1 || p_max < 0 || p_max > width) return -2;
    for (int b = 0; b < batch; b++)
        if (req_pool_indices[b] < 0 || req_pool_indices[b] >= rows) return -2;
    return 0;
}

void paged_meta_fill(int batch, int queries, int p_max, const int32_t *req_to_token,
                            int64_t width, const int64_t *req_pool_indices,
                            const int64_t *prefix_lens, const int64_t *out_cache_loc,
                            const uint8_t *tree_mask, int64_t *kv_loc, float *mask) {
    const int64_t keys = (int64_t)p_max + queries;
    for (int b = 0; b < batch; b++) {
        const int32_t *row = req_to_token + req_pool_indices[b] * width;
        int64_t *loc = kv_loc + b * keys;
        for (int j = 0; j < p_max; j++) loc[j] = row[j];
        for (int k = 0; k < queries; k++) loc[p_max + k] = out_cache_loc[(int64_t)b * queries + k];
        const int64_t pre = prefix_lens[b];
        for (int q = 0; q < queries; q++) {
            float *m = mask + ((int64_t)b * queries + q) * keys;
            for (int j = 0; j < p_max; j++) m[j] = j < pre ? 0.0f : -INFINITY;
            for (int k = 0; k < queries; k++) {
                const int see = tree_mask != NULL
                                    ? tree_mask[((int64_t)b * queries + q) * queries + k] != 0
                                    : k <= q;
                m[p_max + k] = see ? 0.0f : -INFINITY;
            }
        }
    }
}

int relayc_paged_meta(int batch, int queries, int p_max, const int32_t *req_to_token,
                      int64_t rows, int64_t width, const int64_t *req_pool_indices,
                      const int64_t *prefix_lens, const int64_t *out_cache_loc,
                      const uint8_t *tree_mask, int64_t *kv_loc, float *mask) {
    const int code = paged_meta_check(batch, queries, p_max, rows, width, req_pool_indices);
    if (code != 0) return code;
    paged_meta_fill(batch, queries, p_max, req_to_token, width, req_pool_indices, prefix_lens,
                    out_cache_loc, tree_mask, kv_loc, mask);
    return 0;
}

/* The prefix columns a batch attends: the longest of its prefixes lens[b], clamped to
 * 0..p_max. A caller's p_max is a bound -- a captured step's (relayc.runtime.tape) is the
 * widest the KV table allows -- and columns past every prefix are masked, so they add only
 * time: the one-call forwards below size their keys by this instead. A row's arithmetic does
 * not depend on the key count (attend_group), so the bits do not change. */
int live_prefix(int B, int p_max, const int64_t *lens) {
    int64_t most = 0;
    for (int b = 0; b < B; b++)
        if (lens[b] > most) most = lens[b];
    return most < p_max ? (int)most : p_max;
}
