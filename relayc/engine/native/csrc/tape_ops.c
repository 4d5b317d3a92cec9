/* A recorded step's small ATen ops (gather, scatter, casts, copies). One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

/* A recorded decode step's small ATen ops as native calls (relayc.engine.tape_ops): right
 * after a forward has streamed the weights, ATen's index_copy_ of one row took 110-150 us
 * (its dispatch and TensorIterator code cold), a call here about 25. Rows are the leading
 * dimension of contiguous tensors, row_bytes bytes each; every index is checked before
 * anything is written (-2: outside 0..rows-1, the error ATen raises). */
int relayc_gather_rows(const uint8_t *src, int64_t rows, int64_t row_bytes,
                       const int64_t *index, int64_t n, int wrap, uint8_t *out) {
    /* wrap: a negative index counts from the end (advanced indexing), else it is refused
     * (index_select) */
    const int64_t low = wrap ? -rows : 0;
    for (int64_t i = 0; i < n; i++)
        if (index[i] < low || index[i] >= rows) return -2;
    for (int64_t i = 0; i < n; i++) {
        const int64_t r = index[i] < 0 ? index[i] + rows : index[i];
        memcpy(out + i * row_bytes, src + r * row_bytes, (size_t)row_bytes);
    }
    return 0;
}

/* out = the k inputs side by side along one dimension: for each of `outer` blocks, input
 * i's inner_bytes[i] bytes in turn (torch.cat of contiguous tensors). */
int relayc_cat_bytes(uint8_t *out, int64_t outer, int k, const uint8_t *const *inputs,
                     const int64_t *inner_bytes) {
    for (int64_t o = 0; o < outer; o++)
        for (int i = 0; i < k; i++) {
            memcpy(out, inputs[i] + o * inner_bytes[i], (size_t)inner_bytes[i]);
            out += inner_bytes[i];
        }
    return 0;
}

/* dst[0..n) = the element `pattern` (elem_bytes bytes): torch.full / fill_. */
int relayc_fill_pattern(uint8_t *dst, int64_t n, int64_t elem_bytes, const uint8_t *pattern) {
    for (int64_t i = 0; i < n; i++) memcpy(dst + i * elem_bytes, pattern, (size_t)elem_bytes);
    return 0;
}

/* out = a + sign * b over n int64 elements: a's element i / a_rep (a_rep 1: a has out's shape;
 * a_rep m: a column [..., 1] broadcast along out's last dimension of m), b's element i % b_n
 * (b's row broadcast when b_n divides n; b_n 1: a scalar tensor); wraps as torch's int64
 * arithmetic does. */
int relayc_add_int64(const int64_t *a, const int64_t *b, int64_t n, int64_t a_rep, int64_t b_n,
                     int sign, int64_t *out) {
    if (a_rep < 1 || b_n < 1 || n % b_n || n % a_rep) return -2;
    for (int64_t i = 0; i < n; i++) {
        const uint64_t x = (uint64_t)a[i / a_rep], y = (uint64_t)b[i % b_n];
        out[i] = (int64_t)(sign < 0 ? x - y : x + y);
    }
    return 0;
}

/* Integer casts as torch's: int64 -> int32 keeps the low 32 bits, int32 -> int64 extends the
 * sign. */
int relayc_cast_int(const void *src, int src_bytes, void *dst, int dst_bytes, int64_t n) {
    if (src_bytes == 8 && dst_bytes == 4)
        for (int64_t i = 0; i < n; i++)
            ((int32_t *)dst)[i] = (int32_t)(uint32_t)(uint64_t)((const int64_t *)src)[i];
    else if (src_bytes == 4 && dst_bytes == 8)
        for (int64_t i = 0; i < n; i++) ((int64_t *)dst)[i] = ((const int32_t *)src)[i];
    else
        return -2;
    return 0;
}

/* dst[index[i]] = src[i] for i in order (a repeated index keeps the last row, as the CPU's
 * index_copy_ does). */
int relayc_scatter_rows(uint8_t *dst, int64_t rows, int64_t row_bytes, const int64_t *index,
                        int64_t n, const uint8_t *src) {
    for (int64_t i = 0; i < n; i++)
        if (index[i] < 0 || index[i] >= rows) return -2;
    for (int64_t i = 0; i < n; i++)
        memcpy(dst + index[i] * row_bytes, src + i * row_bytes, (size_t)row_bytes);
    return 0;
}

int relayc_copy_bytes(void *dst, const void *src, int64_t bytes) {
    memmove(dst, src, (size_t)bytes);
    return 0;
}

int relayc_zero_bytes(void *dst, int64_t bytes) {
    memset(dst, 0, (size_t)bytes);
    return 0;
}
