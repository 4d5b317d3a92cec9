/* GGUF blocks read from a file's bytes: dequantize, panels, compare. One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

/* GGUF's simplest block types read straight from a file's bytes: the loader's dequantize
 * (the `gguf` package's NumPy loops took most of a model's load) and the packer's check
 * that a parameter still holds its blocks' values. Types (GGUF_*): Q4_0 (18 bytes: float16
 * d, 16 bytes of nibbles; weight d * (q - 8)), Q4_1 (20 bytes: d, m, 16 bytes of nibbles;
 * d * q + m), Q8_0 (34 bytes: d, 32 signed bytes; d * q). Nibbles: byte j holds weight j
 * in its low half and weight j + 16 in its high half. Each weight is computed as the
 * `gguf` package computes it: every product is exact, so the one rounding is its. */
enum { GGUF_Q4_0 = 1, GGUF_Q4_1 = 2, GGUF_Q8_0 = 3 };

/* One float16 bit pattern -> float32, exactly (infinities and NaNs too). */
static inline float half1(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t bits;
    float f;
    if ((h & 0x7c00u) == 0x7c00u) { /* infinity or NaN: keep the payload */
        bits = sign | 0x7f800000u | ((uint32_t)(h & 0x3ffu) << 13);
        memcpy(&f, &bits, sizeof f);
        return f;
    }
    const uint32_t mag = (uint32_t)(h & 0x7fffu) << 13;
    memcpy(&f, &mag, sizeof f);
    f *= 0x1p112f; /* exact: normals and subnormals alike */
    memcpy(&bits, &f, sizeof bits);
    bits |= sign;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* The 32 weights of one block. */
static inline void gguf_block(const uint8_t *blk, int type, float *w) {
    uint16_t h;
    memcpy(&h, blk, sizeof h);
    const float d = half1(h);
    if (type == GGUF_Q8_0) {
        for (int j = 0; j < 32; j++) w[j] = d * (float)(int8_t)blk[2 + j];
        return;
    }
    if (type == GGUF_Q4_0) {
        for (int j = 0; j < 16; j++) {
            w[j] = d * (float)((int)(blk[2 + j] & 15) - 8);
            w[j + 16] = d * (float)((int)(blk[2 + j] >> 4) - 8);
        }
        return;
    }
    memcpy(&h, blk + 2, sizeof h);
    const float m = half1(h);
    for (int j = 0; j < 16; j++) {
        w[j] = d * (float)(blk[4 + j] & 15) + m;
        w[j + 16] = d * (float)(blk[4 + j] >> 4) + m;
    }
}

static inline int gguf_block_bytes(int type) {
    return type == GGUF_Q4_0 ? 18 : type == GGUF_Q4_1 ? 20 : type == GGUF_Q8_0 ? 34 : 0;
}

/* out[rows, cols] (row-major float32) = the weights of raw[rows, cols / 32 blocks].
 * Returns 0, or -2 for an unknown type or cols not whole blocks. */
int relayc_gguf_dequantize(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                           float *out) {
    const int bytes = gguf_block_bytes(type);
    if (bytes == 0 || cols % 32 || rows < 0) return -2;
    const int64_t blocks = rows * (cols / 32);
    for (int64_t b = 0; b < blocks; b++) gguf_block(raw + b * bytes, type, out + b * 32);
    return 0;
}

/* raw [rows, cols / 32 blocks] of Q4_1 or Q8_0 laid out as the native GEMMs' panels, into
 * out (zeroed here): the bytes relayc.engine.native.blocks.BlockWeight.panels makes
 * with torch ops, without its tensors -- panel p, block b: BLOCKS_Q4 (d[16], m[16] as
 * stored, then row r byte c = q[2r] | q[2r + 1] << 4 of column c) or BLOCKS_Q8 (d[16], then
 * row k byte c = q[k] of column c), rows past the last a panel's zero columns. Returns 0,
 * or -2 for another type or a width that is no whole number of blocks. */
int relayc_gguf_panels(const uint8_t *raw, int type, int64_t rows, int64_t cols, uint8_t *out) {
    if ((type != GGUF_Q4_1 && type != GGUF_Q8_0) || cols % 32 || rows < 0) return -2;
    const int64_t nb = cols / 32, panels = (rows + 15) / 16;
    const int bytes = gguf_block_bytes(type), size = type == GGUF_Q4_1 ? Q4_BYTES : Q8_BYTES;
    memset(out, 0, (size_t)(panels * nb * size));
    for (int64_t p = 0; p < panels; p++)
        for (int64_t b = 0; b < nb; b++) {
            uint8_t *o = out + (size_t)((p * nb + b) * size);
            for (int c = 0; c < 16 && p * 16 + c < rows; c++) {
                const uint8_t *blk = raw + (size_t)(((p * 16 + c) * nb + b) * bytes);
                memcpy(o + 2 * c, blk, 2); /* d */
                if (type == GGUF_Q8_0) {
                    for (int k = 0; k < 32; k++) o[32 + 16 * k + c] = blk[2 + k];
                    continue;
                }
                memcpy(o + 32 + 2 * c, blk + 2, 2); /* m */
                /* the block's byte j holds q[j] (low nibble) and q[j + 16] (high) */
                const uint8_t *qs = blk + 4;
                for (int r = 0; r < 16; r++) {
                    const int k0 = 2 * r, k1 = 2 * r + 1;
                    const int q0 = k0 < 16 ? qs[k0] & 15 : qs[k0 - 16] >> 4;
                    const int q1 = k1 < 16 ? qs[k1] & 15 : qs[k1 - 16] >> 4;
                    o[64 + 16 * r + c] = (uint8_t)(q0 | q1 << 4);
                }
            }
        }
    return 0;
}

/* 1 when weight[rows, cols] (float32, element (r, c) at weight[r * row_stride + c *
 * col_stride]: row-major, or the column-major layout the CPU GEMMs keep, no copy) equals
 * the weights of raw (value for value, as torch.equal compares) and every one is finite;
 * else 0 (-2 as relayc_gguf_dequantize). A strided weight is walked a column of blocks at
 * a time, so its rows' cache lines are read while they are in L1. */
int relayc_gguf_matches(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                        const float *weight, int64_t row_stride, int64_t col_stride) {
    const int bytes = gguf_block_bytes(type);
    if (bytes == 0 || cols % 32 || rows < 0 || row_stride < 0 || col_stride < 0) return -2;
    const int64_t nb = cols / 32;
    float w[32];
    if (col_stride == 1) {
        for (int64_t r = 0; r < rows; r++)
            for (int64_t b = 0; b < nb; b++) {
                gguf_block(raw + (r * nb + b) * bytes, type, w);
                const float *have = weight + r * row_stride + b * 32;
                for (int j = 0; j < 32; j++)
                    if (!(w[j] == have[j]) || !isfinite(w[j])) return 0;
            }
        return 1;
    }
    for (int64_t b = 0; b < nb; b++)
        for (int64_t r = 0; r < rows; r++) {
            gguf_block(raw + (r * nb + b) * bytes, type, w);
            const float *have = weight + r * row_stride + b * 32 * col_stride;
            for (int j = 0; j < 32; j++)
                if (!(w[j] == have[j * col_stride]) || !isfinite(w[j])) return 0;
        }
    return 1;
}
