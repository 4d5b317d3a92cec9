/* The greedy accept of a verify and the K/V compaction after it. One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

/* Greedy acceptance of B draft trees of N nodes each, laid out as verify_tree_greedy reads
 * them (relayc.kernels.verify_greedy; candidates, retrive_index, retrive_next_token and
 * retrive_next_sibling [B, N] int64, target_predict the target's argmax of every node by
 * its global id [B * N]): from each root, the first child (in sibling order) whose draft
 * equals the argmax of the last accepted node is accepted, up to S of them, each node
 * visited at most once. Writes what relayc.engine.ops.verify's greedy accept returns:
 * accept_index [B, S + 1] (the path's global ids, then -1), accept_lens [B] (accepted + 1),
 * accept_tokens [B, S + 1] (the argmax at each path node, then 0) and bonus [B] (the
 * last path node's argmax) -- the host loop and some fifteen torch calls after a verify
 * forward, in one call. Returns 0, or -2 for an index outside the trees (nothing is
 * written; the caller's torch path then handles the trees). */
int relayc_accept_greedy(int B, int N, int S, const int64_t *candidates,
                         const int64_t *retrive_index, const int64_t *next_token,
                         const int64_t *next_sibling, const int64_t *target_predict,
                         int64_t *accept_index, int32_t *accept_lens, int64_t *accept_tokens,
                         int64_t *bonus) {
    if (B < 0 || N < 1 || S < 0) return -2;
    const int64_t nodes = (int64_t)B * N;
    for (int64_t i = 0; i < nodes; i++)
        if (retrive_index[i] < 0 || retrive_index[i] >= nodes || next_token[i] < -1 ||
            next_token[i] >= N || next_sibling[i] < -1 || next_sibling[i] >= N)
            return -2;
    for (int b = 0; b < B; b++) {
        const int64_t *cand = candidates + (size_t)b * N, *ids = retrive_index + (size_t)b * N;
        const int64_t *first = next_token + (size_t)b * N, *sibling = next_sibling + (size_t)b * N;
        int64_t *path = accept_index + (size_t)b * (S + 1);
        int count = 0;
        path[0] = ids[0];
        int64_t child = S > 0 ? first[0] : -1;
        for (int turn = 0; turn < N - 1 && child != -1; turn++) {
            if (cand[child] == target_predict[path[count]]) {
                path[++count] = ids[child];
                if (count == S) break;
                child = first[child];
            } else
                child = sibling[child];
        }
        int64_t *tokens = accept_tokens + (size_t)b * (S + 1);
        for (int i = 0; i <= S; i++) {
            tokens[i] = i <= count ? target_predict[path[i]] : 0;
            if (i > count) path[i] = -1;
        }
        accept_lens[b] = count + 1;
        bonus[b] = tokens[count];
    }
    return 0;
}

/* The KV compaction after a verify, in one call (relayc.engine.ops.verify's
 * compact_accepted_kv): request b's verify window is window[b, 0..n) (KV slots, rows
 * window_stride apart); its accepted nodes accept_index[b, :] (global ids b * n + j, -1
 * past the path) move, in path order, to the front of the window -- in every plane of
 * `buffer` ([planes, size, row_bytes]: each layer's K then V), every source read before
 * any slot is written, a slot copied onto itself left alone -- and the window is recorded
 * in req_to_token's row req_pool_indices[b] at positions seq_lens[b] .. + n.
 * new_seq_lens[b] = seq_lens[b] + accept_lens[b]. Returns 0, or -2 (nothing written) for
 * an index outside the windows, the buffer or req_to_token: the torch path then raises. */
/* Where window column j of request b takes its K/V from: the window column of the node
 * accepted j-th (accept_index holds flat node ids, -1 past the accepted ones: those stay). */
static inline int64_t compact_source_column(const int64_t *accept_index, int b, int n, int j) {
    const int64_t a = accept_index[(size_t)b * n + j];
    return a >= 0 ? a - (int64_t)b * n : j;
}

int relayc_compact(int B, int n, const int64_t *window, int64_t window_stride,
                   const int64_t *accept_index, uint8_t *buffer, int64_t planes, int64_t size,
                   int64_t row_bytes, int32_t *req_to_token, int64_t rows, int64_t width,
                   const int64_t *req_pool_indices, const int64_t *seq_lens,
                   const int32_t *accept_lens, int64_t *new_seq_lens) {
    if (B < 0 || n < 1 || window_stride < n || planes < 1 || size < 1 || row_bytes < 1)
        return -2;
    int moved = 0;
    for (int b = 0; b < B; b++) {
        if (req_pool_indices[b] < 0 || req_pool_indices[b] >= rows || seq_lens[b] < 0 ||
            seq_lens[b] + n > width)
            return -2;
        for (int j = 0; j < n; j++) {
            const int64_t local = compact_source_column(accept_index, b, n, j);
            const int64_t slot = window[b * window_stride + j];
            if (local < 0 || local >= n || slot < 0 || slot >= size) return -2;
            const int64_t source = window[b * window_stride + local];
            if (source < 0 || source >= size) return -2;
            moved += source != slot;
        }
    }
    if (moved) {
        uint8_t *held = (uint8_t *)malloc((size_t)moved * (size_t)planes * (size_t)row_bytes);
        if (held == NULL) return -1;
        for (int pass = 0; pass < 2; pass++) { /* gather every source, then scatter */
            size_t k = 0;
            for (int b = 0; b < B; b++)
                for (int j = 0; j < n; j++) {
                    const int64_t slot = window[b * window_stride + j];
                    const int64_t source =
                        window[b * window_stride + compact_source_column(accept_index, b, n, j)];
                    if (source == slot) continue;
                    for (int64_t p = 0; p < planes; p++) {
                        uint8_t *row = buffer + ((size_t)p * size + (size_t)(pass ? slot : source)) *
                                                    (size_t)row_bytes;
                        uint8_t *keep = held + ((size_t)k * planes + (size_t)p) * (size_t)row_bytes;
                        if (pass)
                            memcpy(row, keep, (size_t)row_bytes);
                        else
                            memcpy(keep, row, (size_t)row_bytes);
                    }
                    k++;
                }
        }
        free(held);
    }
    for (int b = 0; b < B; b++) {
        int32_t *row = req_to_token + req_pool_indices[b] * width + seq_lens[b];
        for (int j = 0; j < n; j++) row[j] = (int32_t)window[b * window_stride + j];
        new_seq_lens[b] = seq_lens[b] + accept_lens[b];
    }
    return 0;
}
