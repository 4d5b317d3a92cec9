/* relayc's native CPU decoder: the layers of one paged Llama forward in one call.
 *
 * Built at run time by relayc/engine/native.py (cc -O3 -march=native, cached) and called
 * through ctypes, which releases the GIL. It runs what LlamaDecoderLayer does for the
 * uniform paged modes (decode, verify, padded extend: every request has Q new tokens):
 * RMSNorm, the fused q/k/v projection, rotary (rotate-half, signed sine table), the K/V
 * write, masked attention over the gathered slots with grouped KV heads, o_proj and the
 * residual, RMSNorm, the fused gate/up projection, SiLU * up, down_proj and the residual.
 *
 * Every output element of every product is one accumulator summed over k = 0..K-1 in
 * order, and every attention row is computed on its own, so a token's result does not
 * depend on how many rows the call has: a one-token decode and a verify row over the
 * same context give the same bits. Weights come packed in 16-column panels (see gemm);
 * the GEMMs stream each weight once for up to six rows at a time (eight with
 * AVX512-BF16, sixteen with AMX), which is what a small-batch forward is bound by.
 *
 * Three weight types, the same layer code:
 *   relayc_decoder       float32 weights and K/V cache.
 *   relayc_decoder_blocks_ex
 *                        a GGUF file's Q4/Q5/Q8 and Q4_K-Q6_K blocks (each weight its
 *                        own format, or float32 panels), rebuilt to float32 in
 *                        registers (see gemm_blocks): the bits of relayc_decoder over the
 *                        dequantized weights, at a sixth (Q4) or a quarter (Q8) of the
 *                        bytes. float32 activations and K/V cache.
 *   relayc_decoder_bf16  bfloat16 weights and K/V cache (half the bytes to stream). Each
 *                        GEMM rounds its input activations to bfloat16 and sums exact
 *                        bfloat16 products in float32 (as torch's bf16 matmul does), with
 *                        AMX tiles, AVX512-BF16 or widened weights: one kernel per process,
 *                        the best the CPU has (see gemm_bf16). The residual stream, norms,
 *                        rotary and attention are float32 throughout the call. The K/V
 *                        cache is bfloat16: new K/V are rounded to nearest-even on the
 *                        write (as torch's .to(bfloat16)), and every row, the new tokens'
 *                        included, reads them back from the cache, so the eager layers and
 *                        this code share one cache and a row never sees unrounded K/V.
 *
 * The library is one shared object built from the units beside this header, one concern
 * each (native.py compiles them all in one compiler call); this header holds what more
 * than one unit needs: the vector types and their inline helpers, the weight formats, the
 * model struct, and every function's prototype.
 *   gemm.c        the float32 GEMM over 16-column panels, gemm_any (every weight
 *                 format's GEMM) and relayc_linear.
 *   gemm_bf16.c   the bfloat16 GEMMs (portable, AVX512-BF16) and the kernel choice.
 *   amx.c         the bfloat16 GEMM on AMX tiles.
 *   quants.c      the block-quantized GEMMs (GGUF blocks rebuilt in registers).
 *   gguf.c        GGUF blocks read from a file's bytes: dequantize, panels, compare.
 *   vec.c         RMSNorm and the exponential shared by attention and SiLU.
 *   attention.c   masked attention of one request's rows over its gathered K/V.
 *   layer.c       the layers (decode_layers) and the relayc_decoder* entry points.
 *   head.c        the final norm, the LM head and the argmax.
 *   paged_meta.c  the attention metadata of a uniform paged batch.
 *   forward.c     one decode or verify forward (relayc_forward).
 *   draft.c       the EAGLE-3 draft chain and draft extend.
 *   verify.c      the greedy accept of a verify and the K/V compaction after it.
 *   tape_ops.c    a recorded step's small ATen ops (gather, scatter, casts, copies).
 *   tape.c        a recorded step's native calls in one call (relayc_tape_run).
 */
#ifndef RELAYC_DECODER_H
#define RELAYC_DECODER_H

#if defined(__linux__)
#define _GNU_SOURCE /* syscall(), for AMX's arch_prctl: -std=c11 hides it */
#endif
#include <math.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Functions one unit defines for others: kept out of the library's exported symbols, which
 * are the relayc_* entry points alone (what Python loads through ctypes). */
#define RELAYC_HIDDEN __attribute__((visibility("hidden")))

typedef float v8 __attribute__((vector_size(32)));

static inline v8 load8(const float *p) {
    v8 v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void store8(float *p, v8 v) { memcpy(p, &v, sizeof v); }

static inline v8 splat(float s) { return (v8){s, s, s, s, s, s, s, s}; }

/* acc + a * b rounded once (a fused multiply-add) wherever the CPU has one, else rounded
 * twice: every float32 GEMM of one build sums the same way, so its rows agree bit for bit
 * across row counts and weight formats (float32 panels or GGUF blocks). */
static inline v8 fma8(v8 acc, v8 a, v8 b) {
#if defined(__FMA__)
    return (v8)_mm256_fmadd_ps((__m256)a, (__m256)b, (__m256)acc);
#else
    return acc + a * b;
#endif
}

typedef float v16 __attribute__((vector_size(64)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

static inline v16 splat16(float s) { return (v16){s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

/* acc + a * b as gemm's fma8 computes it (one rounding wherever the CPU fuses), sixteen
 * lanes at a time. The bf16 kernels' products are exact (bfloat16 times bfloat16), so for
 * them a fused and an unfused multiply-add give the same bits anyway. */
static inline v16 fma16(v16 acc, v16 a, v16 b) {
#if defined(__AVX512F__)
    return (v16)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)acc);
#else
    v8 halves[3][2];
    memcpy(halves[0], &acc, sizeof acc);
    memcpy(halves[1], &a, sizeof a);
    memcpy(halves[2], &b, sizeof b);
    for (int h = 0; h < 2; h++) halves[0][h] = fma8(halves[0][h], halves[1][h], halves[2][h]);
    memcpy(&acc, halves[0], sizeof acc);
    return acc;
#endif
}

/* out[m, 16p .. 16p + 16) = r, or += r where add. */
static inline void store16(float *o, v16 r, int add) {
    if (add) {
        v16 prev;
        memcpy(&prev, o, sizeof prev);
        r = prev + r;
    }
    memcpy(o, &r, sizeof r);
}

static inline v16 load16(const float *p) {
    v16 v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* float32 -> bfloat16, round to nearest even (torch's rounding; NaN stays a quiet NaN). */
static inline uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The bfloat16 GEMM kernels, by number (gemm_bf16.c). */
enum { BF16_PORTABLE = 0, BF16_AVX512 = 1, BF16_AMX = 2 };

static inline int padded_k(int K) { return (K + 31) / 32 * 32; }

/* Rows of xb a GEMM over M rows needs: from 16 rows AMX reads whole tiles of 16, below
 * it tiles of M rows (gemm_amx). */
static inline int padded_rows(int M) { return M < 16 ? M : (M + 15) / 16 * 16; }
/* The rows of gemm_amx's A and C tiles. */
static inline int amx_tile_rows(int M) { return M < 16 ? M : 16; }

/* x[n] <- x rounded to bfloat16 (to_bf16) and widened back: what a bfloat16 tensor holds. */
static inline void round_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = from_bf16(to_bf16(x[i]));
}

/* The x86 kernels are compiled for their own instruction sets (per-function target
 * attributes), so the library builds with any -march and calls them only where CPUID and
 * the OS say they run (relayc_bf16_kernels). */
#if defined(__x86_64__) && ((defined(__clang__) && __clang_major__ >= 12) || \
                            (!defined(__clang__) && defined(__GNUC__) && __GNUC__ >= 11))
#define RELAYC_X86_BF16 1
#if defined(__linux__)
#define RELAYC_AMX 1
#endif
#endif

/* The block formats of a GGUF file's weights, laid out as panels (quants.c). */
/* BLOCKS_I8Q4, BLOCKS_I8Q8: the same GGUF blocks for the integer-dot GEMMs (int8.c, dtype
 * "int8"), which quantise the activations instead of rebuilding the weights. */
enum { BLOCKS_NONE = 0, BLOCKS_Q4 = 1, BLOCKS_Q8 = 2, BLOCKS_Q4F = 3, BLOCKS_I8F = 4,
       BLOCKS_BF16 = 5, BLOCKS_F16 = 6, BLOCKS_I8Q4 = 7, BLOCKS_I8Q8 = 8 };
enum { Q4_BYTES = 320, Q8_BYTES = 544, Q4F_BYTES = 384, I8F_BYTES = 768, WORD_BYTES = 1024,
       I8Q4_BYTES = 320, I8Q8_BYTES = 544 };

static inline int block_format(int format) {
    return format >= BLOCKS_Q4 && format <= BLOCKS_I8Q8;
}

/* The int8 GEMM kernels, by number (int8.c): every one gives the same bits. */
enum { INT8_SCALAR = 0, INT8_AVX2 = 1, INT8_VNNI = 2 };

/* A family of GEMM kernels numbered by preference (bfloat16's, int8's): which run here
 * (bit k: kernel k, from `probe`, asked once) and the one every GEMM of the process uses. */
typedef struct {
    int found, chosen; /* -1 until known */
    int (*probe)(void);
    int last; /* the highest kernel number */
} kernel_choice;

/* Bit k set: kernel k runs here. */
static inline int kernel_found(kernel_choice *k) {
    int found = __atomic_load_n(&k->found, __ATOMIC_ACQUIRE);
    if (found < 0) {
        found = k->probe(); /* idempotent: two threads may both ask */
        __atomic_store_n(&k->found, found, __ATOMIC_RELEASE);
    }
    return found;
}

/* want < 0 asks: the highest-numbered kernel that runs here, chosen on first use; want >= 0
 * switches to kernel `want` (tests and benchmarks), -1 where it does not run here. */
static inline int kernel_choose(kernel_choice *k, int want) {
    const int found = kernel_found(k);
    if (want >= 0) {
        if (want > k->last || !((found >> want) & 1)) return -1;
        __atomic_store_n(&k->chosen, want, __ATOMIC_RELEASE);
        return want;
    }
    int chosen = __atomic_load_n(&k->chosen, __ATOMIC_ACQUIRE);
    if (chosen < 0) {
        chosen = 0;
        for (int i = k->last; i > 0; i--)
            if ((found >> i) & 1) {
                chosen = i;
                break;
            }
        int unset = -1;
        if (!__atomic_compare_exchange_n(&k->chosen, &unset, chosen, 0, __ATOMIC_ACQ_REL,
                                         __ATOMIC_ACQUIRE))
            chosen = unset;
    }
    return chosen;
}

/* What relayc_forward reads of one model, filled once per packing of its weights, K/V
 * caches, embedding, rotary tables and LM head (relayc.engine.fused_forward keeps the
 * tensors behind every pointer alive). `kind`: the layers' weights and caches float32 (0),
 * bfloat16 (1), or float32 caches with block-quantized weights (2, `formats` as
 * relayc_decoder_blocks_ex's). The embedding [vocab_rows, hidden] is float32 or, with
 * embed_bf16, bfloat16 words; the rotary tables [max_position, head_dim] float32 (the sine
 * table's first half negated); head_format as relayc_head_argmax's. */
struct relayc_model {
    int hidden, heads, kv_heads, head_dim, inter, layers, kind;
    const int *formats;
    const float *const *ln1;
    const void *const *w_qkv, *const *w_o;
    const float *const *ln2;
    const void *const *w_gate_up, *const *w_down;
    const float *eps1, *eps2;
    void *const *k_cache, *const *v_cache;
    int64_t cache_rows;
    const void *embed;
    int embed_bf16;
    int64_t vocab_rows;
    const float *cos_table, *sin_table;
    int64_t max_position;
    const float *norm_weight;
    float norm_eps;
    const void *head;
    int head_format, vocab, vocab_padded;
};

/* The rotary rows of position `pos` (inside the tables: callers check) into cos_row and
 * sin_row, head_dim floats each. */
static inline void rope_rows(const struct relayc_model *m, int64_t pos, float *cos_row,
                             float *sin_row) {
    const size_t D = (size_t)m->head_dim;
    memcpy(cos_row, m->cos_table + (size_t)pos * D, sizeof(float) * D);
    memcpy(sin_row, m->sin_table + (size_t)pos * D, sizeof(float) * D);
}

/* Row `id` of the embedding as float32: the row itself, or its bfloat16 words widened
 * exactly into `row` (hidden floats). */
static inline const float *embedding_row(const struct relayc_model *m, int64_t id, float *row) {
    const size_t H = (size_t)m->hidden;
    if (!m->embed_bf16) return (const float *)m->embed + (size_t)id * H;
    const uint16_t *e = (const uint16_t *)m->embed + (size_t)id * H;
    for (size_t i = 0; i < H; i++) row[i] = from_bf16(e[i]);
    return row;
}

/* gemm.c: out[M, N] (+)= x @ w, w packed as float32 (kernel -1), bfloat16 panels (kernel >= 0:
 * which bf16 kernel; xb its scratch) or block panels (kernel -1 - format: gemm_blocks). */
RELAYC_HIDDEN void gemm_any(const float *x, int M, int K, const void *w, int N, float *out,
                            int add, int kernel, uint16_t *xb);
/* gemm_bf16.c: out[M, N] (+)= bf16(x)[M, K] @ w with `kernel`; xb: padded_rows(M) x
 * padded_k(K) halves of scratch. */
RELAYC_HIDDEN void gemm_bf16(const float *x, int M, int K, const uint16_t *w, int N, float *out,
                             int add, int kernel, uint16_t *xb);
#if defined(RELAYC_AMX)
/* amx.c: out[M, N] (+)= xb @ w on AMX tiles (xb rounded by gemm_bf16). */
RELAYC_HIDDEN void gemm_amx(const uint16_t *xb, int M, int Kp, const uint16_t *w, int N,
                            float *out, int add);
#endif
/* quants.c: out[M, N] (+)= x[M, K] @ w, block panels of `format` (BLOCKS_*); and the bytes
 * of one block of 32 k of one such panel. */
RELAYC_HIDDEN void gemm_blocks(const float *x, int M, int K, const uint8_t *w, int N,
                               float *out, int add, int format);
RELAYC_HIDDEN int block_bytes(int format);
/* int8.c: out[M, N] (+)= x[M, K] @ w over BLOCKS_I8Q4 / BLOCKS_I8Q8 panels, x quantised to
 * int8 per block of 32 (gemm_blocks calls it for those formats). */
RELAYC_HIDDEN void gemm_int8(const float *x, int M, int K, const uint8_t *w, int N, float *out,
                             int add, int format);
/* vec.c: RMSNorm of T rows of H; x[i] <- e^x[i] for i < n (exp16, the same bits everywhere). */
RELAYC_HIDDEN void rms_norm(const float *x, int T, int H, const float *weight, float eps,
                            float *out);
RELAYC_HIDDEN void exp_rows(float *x, int n);
/* attention.c: R query rows of one request with the G heads sharing a KV head, together
 * at most ATTEND_PAIRS (row, head) pairs: they share one pass over the keys and values. */
#define ATTEND_PAIRS 64
RELAYC_HIDDEN void attend_group(const float *q, size_t q_stride, const float *const *keys,
                                const float *const *values, const float *mask, int R, int G,
                                int S, int D, float scale, float *scores, float *out,
                                size_t out_stride);
/* layer.c: the layers (relayc_decoder*'s parameters, the weights and caches untyped). */
RELAYC_HIDDEN int decode_layers(
    int T, int hidden, int heads, int kv_heads, int head_dim, int inter, int layers, float *x,
    const float *cos_table, const float *sin_table, const int64_t *slots, const int64_t *kv_loc,
    const float *mask, int B, int Q, int S, const float *const *ln1, const void *const *w_qkv,
    const void *const *w_o, const float *const *ln2, const void *const *w_gate_up,
    const void *const *w_down, const float *eps1, const float *eps2, void *const *k_cache,
    void *const *v_cache, int64_t cache_rows, int bf16, const int *formats,
    const float *attn_in, int in_width, const int *capture, int n_capture, float *aux);
/* paged_meta.c: relayc_paged_meta's checks and its writes, apart; the prefix columns a batch
 * attends. */
RELAYC_HIDDEN int paged_meta_check(int batch, int queries, int p_max, int64_t rows,
                                   int64_t width, const int64_t *req_pool_indices);
RELAYC_HIDDEN void paged_meta_fill(int batch, int queries, int p_max,
                                   const int32_t *req_to_token, int64_t width,
                                   const int64_t *req_pool_indices, const int64_t *prefix_lens,
                                   const int64_t *out_cache_loc, const uint8_t *tree_mask,
                                   int64_t *kv_loc, float *mask);
RELAYC_HIDDEN int live_prefix(int B, int p_max, const int64_t *lens);

/* The library's entry points (relayc/engine/native.py gives each its ctypes types). */
#define DECODER_PARAMS(W, C)                                                                \
    int T, int hidden, int heads, int kv_heads, int head_dim, int inter, int layers,          \
        float *x,               /* [T, hidden] float32, updated in place */                  \
        const float *cos_table, /* [T, head_dim] */                                          \
        const float *sin_table, /* [T, head_dim], first half negated */                      \
        const int64_t *slots,   /* [T] KV slots the new tokens write */                      \
        const int64_t *kv_loc,  /* [B, S] KV slots each request's columns read */            \
        const float *mask,      /* [B, Q, S] additive: 0 or -inf */                          \
        int B, int Q, int S, const float *const *ln1, const W *const *w_qkv,                 \
        const W *const *w_o, const float *const *ln2, const W *const *w_gate_up,             \
        const W *const *w_down, const float *eps1, const float *eps2,                        \
        C *const *k_cache, C *const *v_cache, /* [cache_rows, kv_heads, head_dim] each */    \
        int64_t cache_rows

int relayc_bf16_kernels(void);
int relayc_bf16_kernel(int want);
int relayc_block_isa(void);
int relayc_int8_kernels(void);
int relayc_int8_kernel(int want);
int relayc_int8_gemm(int M, int K, int N, const float *x, const uint8_t *w, int format,
                     int kernel, float *out);
int relayc_int8_quantize(int M, int K, const float *x, int8_t *q, float *d, float *s,
                         int32_t *sum);
int relayc_decoder(DECODER_PARAMS(float, float));
int relayc_decoder_bf16(DECODER_PARAMS(uint16_t, uint16_t));
int relayc_decoder_ex(DECODER_PARAMS(float, float), const float *attn_in, int in_width,
                      const int *capture, int n_capture, float *aux);
int relayc_decoder_bf16_ex(DECODER_PARAMS(uint16_t, uint16_t), const float *attn_in,
                           int in_width, const int *capture, int n_capture, float *aux);
int relayc_decoder_blocks_ex(DECODER_PARAMS(uint8_t, float), const int *formats,
                             const float *attn_in, int in_width, const int *capture,
                             int n_capture, float *aux);
int relayc_head(int T, int hidden, int vocab_padded, const float *x, const float *norm_weight,
                float eps, const float *head, float *logits);
int relayc_head_blocks(int T, int hidden, int vocab_padded, const float *x,
                       const float *norm_weight, float eps, const uint8_t *head, float *logits,
                       int format);
int relayc_head_bf16(int T, int hidden, int vocab_padded, const float *x,
                     const float *norm_weight, float eps, const uint16_t *head, float *logits);
int relayc_head_argmax(int T, int hidden, int vocab_padded, int vocab, const float *x,
                       const float *norm_weight, float eps, const void *head, float *logits,
                       int format, int64_t *argmax);
int relayc_linear(int T, int K, int N_padded, const float *x, const void *w, float *out,
                  int format);
int relayc_norm_pair(int T, int Ha, const float *a, const float *wa, float eps_a, int Hb,
                     const float *b, const float *wb, float eps_b, float *out);
int relayc_exp(const float *x, int64_t n, float *out);
int relayc_gather_rows(const uint8_t *src, int64_t rows, int64_t row_bytes,
                       const int64_t *index, int64_t n, int wrap, uint8_t *out);
int relayc_cat_bytes(uint8_t *out, int64_t outer, int k, const uint8_t *const *inputs,
                     const int64_t *inner_bytes);
int relayc_fill_pattern(uint8_t *dst, int64_t n, int64_t elem_bytes, const uint8_t *pattern);
int relayc_add_int64(const int64_t *a, const int64_t *b, int64_t n, int64_t a_rep, int64_t b_n,
                     int sign, int64_t *out);
int relayc_cast_int(const void *src, int src_bytes, void *dst, int dst_bytes, int64_t n);
int relayc_scatter_rows(uint8_t *dst, int64_t rows, int64_t row_bytes, const int64_t *index,
                        int64_t n, const uint8_t *src);
int relayc_copy_bytes(void *dst, const void *src, int64_t bytes);
int relayc_zero_bytes(void *dst, int64_t bytes);
int relayc_argmax(const float *x, int64_t rows, int64_t n, int64_t *out);
int relayc_paged_meta(int batch, int queries, int p_max, const int32_t *req_to_token,
                      int64_t rows, int64_t width, const int64_t *req_pool_indices,
                      const int64_t *prefix_lens, const int64_t *out_cache_loc,
                      const uint8_t *tree_mask, int64_t *kv_loc, float *mask);
int relayc_forward(const struct relayc_model *m, int B, int Q, int p_max,
                   const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                   const int64_t *req_pool_indices, const int64_t *prefix_lens,
                   const int64_t *out_cache_loc, const uint8_t *tree_mask,
                   const int64_t *input_ids, const int64_t *positions, const int *capture,
                   int n_capture, float *aux, float *x, float *logits, int64_t *argmax);
int relayc_draft_chain(const struct relayc_model *m, int B, int steps, int p_max,
                       const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                       const int64_t *req_pool_indices, const int64_t *seq_lens,
                       const int64_t *scratch, const int64_t *d2t, const float *in_norm,
                       float in_eps, const float *hidden_norm, float hidden_eps,
                       const float *hidden, int64_t *tokens);
int relayc_draft_extend(const struct relayc_model *m, int B, int W, int p_max,
                        const int32_t *req_to_token, int64_t table_rows, int64_t table_width,
                        const int64_t *req_pool_indices, const int64_t *prefix_lens,
                        const int64_t *lens, const int64_t *out_cache_loc,
                        const int64_t *input_ids, const float *features, int F,
                        const int64_t *feature_rows, int64_t feature_count, const void *fc,
                        int fc_format, const float *in_norm, float in_eps,
                        const float *hidden_norm, float hidden_eps, float *g, float *logits,
                        int64_t *argmax);
int relayc_accept_greedy(int B, int N, int S, const int64_t *candidates,
                         const int64_t *retrive_index, const int64_t *next_token,
                         const int64_t *next_sibling, const int64_t *target_predict,
                         int64_t *accept_index, int32_t *accept_lens, int64_t *accept_tokens,
                         int64_t *bonus);
int relayc_compact(int B, int n, const int64_t *window, int64_t window_stride,
                   const int64_t *accept_index, uint8_t *buffer, int64_t planes, int64_t size,
                   int64_t row_bytes, int32_t *req_to_token, int64_t rows, int64_t width,
                   const int64_t *req_pool_indices, const int64_t *seq_lens,
                   const int32_t *accept_lens, int64_t *new_seq_lens);
int relayc_gguf_dequantize(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                           float *out);
int relayc_gguf_panels(const uint8_t *raw, int type, int64_t rows, int64_t cols, uint8_t *out);
int relayc_gguf_matches(const uint8_t *raw, int type, int64_t rows, int64_t cols,
                        const float *weight, int64_t row_stride, int64_t col_stride);
const char *relayc_tape_name(int id);
int64_t relayc_tape_run(const int64_t *records, int64_t n, int64_t *code);

#endif /* RELAYC_DECODER_H */
