/* The bfloat16 GEMM on AMX tiles. One unit of the native CPU decoder (decoder.h). */
#include "decoder.h"

#if defined(RELAYC_AMX)
#define AMX_TARGET __attribute__((target("amx-tile,amx-bf16")))

/* ldtilecfg's 64-byte operand, palette 1. */
struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* How many B tiles (1 KiB: 16 pairs of a panel) ahead of its loads each panel is
 * prefetched, continuing into the next group of panels at a group's end. A panel is only
 * K / 32 tiles long (18 for SmolLM2's 576), too short a stream for the hardware
 * prefetcher, and tileloadd from memory left AMX 1.7x slower than vdpbf16ps on a
 * one-row decode (Xeon with AMX, SmolLM2 in bfloat16: 47-52 ms against 28-30); with one
 * tile ahead 33-35 ms, and 8-16 rows 1.3x faster (bench/real_model_forward.py; 1 beat
 * 2, 3, 4 and 8). Prefetches only: the same bits. */
#define AMX_AHEAD 1

/* out[M, N] (+)= xb @ w with AMX: tiles 0-3 accumulate 16 rows x 4 panels, tile 4 holds
 * 16 rows x 32 k of xb, tiles 5-7 a panel's 16 pairs x 16 columns (64-byte rows: the
 * panel's layout as is). Below 16 rows the A and C tiles have M rows (amx_tile_rows: a
 * one-row decode 1.1-1.2x faster than with 16, as tdpbf16ps's work is the tile's rows; a
 * row's sums are the same, tested); from 16, every C tile is 16 rows (xb has zero rows up
 * to a multiple of 16) and only the rows below M are written out. Four panels at a time,
 * every tile of rows over them while they sit in L2, so the weight is read from memory
 * once whatever M is. */
AMX_TARGET void gemm_amx(const uint16_t *xb, int M, int Kp, const uint16_t *w, int N,
                                float *out, int add) {
    struct tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t < 5 ? amx_tile_rows(M) : 16;
        cfg.colsb[t] = 64;
    }
    _tile_loadconfig(&cfg);
    /* GCC's tileloadd asm names no memory: keep the stores that rounded xb before it */
    __asm__ volatile("" ::: "memory");
    float tile[4][16][16] __attribute__((aligned(64)));
    const int panels = N / 16, depth = Kp / 32;
    const size_t stride = (size_t)Kp * 16, a_stride = (size_t)Kp * sizeof(uint16_t);
    for (int g = 0; g < panels; g += 4) {
        const int np = panels - g < 4 ? panels - g : 4;
        const uint16_t *b0 = w + (size_t)g * stride;
        for (int m0 = 0; m0 < M; m0 += 16) {
            _tile_zero(0);
            _tile_zero(1);
            _tile_zero(2);
            _tile_zero(3);
            for (int d = 0; d < depth; d++) {
                const uint16_t *b = b0 + (size_t)d * 16 * 32; /* 16 pairs of 32 halves */
                if (m0 == 0) { /* later row tiles find the panels in L2 */
                    int da = d + AMX_AHEAD, ga = g;
                    if (da >= depth) { /* the next group's first tiles */
                        da -= depth;
                        ga += 4;
                    }
                    const int na = panels - ga < 4 ? panels - ga : 4;
                    for (int j = 0; j < na; j++) {
                        const char *ahead =
                            (const char *)(w + (size_t)(ga + j) * stride + (size_t)da * 512);
                        for (int line = 0; line < 1024; line += 64)
                            _mm_prefetch(ahead + line, _MM_HINT_T0);
                    }
                }
                _tile_loadd(4, xb + (size_t)m0 * Kp + (size_t)d * 32, a_stride);
                _tile_loadd(5, b, 64);
                _tile_dpbf16ps(0, 4, 5);
                if (np > 1) {
                    _tile_loadd(6, b + stride, 64);
                    _tile_dpbf16ps(1, 4, 6);
                }
                if (np > 2) {
                    _tile_loadd(7, b + 2 * stride, 64);
                    _tile_dpbf16ps(2, 4, 7);
                }
                if (np > 3) {
                    _tile_loadd(5, b + 3 * stride, 64);
                    _tile_dpbf16ps(3, 4, 5);
                }
            }
            _tile_stored(0, tile[0], 64);
            _tile_stored(1, tile[1], 64);
            _tile_stored(2, tile[2], 64);
            _tile_stored(3, tile[3], 64);
            const int rows = M - m0 < 16 ? M - m0 : 16;
            for (int j = 0; j < np; j++)
                for (int r = 0; r < rows; r++) {
                    v16 v;
                    memcpy(&v, tile[j][r], sizeof v);
                    store16(out + (size_t)(m0 + r) * N + (size_t)(g + j) * 16, v, add);
                }
        }
    }
    _tile_release();
}
#endif /* RELAYC_AMX */
