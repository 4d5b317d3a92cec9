/* A recorded step's native calls in one call (relayc_tape_run). One unit of the native CPU
 * decoder (decoder.h). */
#include "decoder.h"

/* A recorded step's native calls in one call (relayc.runtime.tape): a replay's calls made
 * one by one from Python pay ctypes' argument conversion, cold after a forward (some ten
 * microseconds a call), where these are a switch and the calls themselves. `records` holds
 * n calls in turn, each [id, argument count, the code it must return (TAPE_ANY: any),
 * the arguments as 64-bit words] -- pointers and integers as they are, a float's bits in
 * the low 32 -- each passed at its parameter's type, so the compiler checks every call
 * against its function. Returns how many calls returned their code; at the first that did
 * not, *code is what it returned (TAPE_ANY for an unknown id or argument count, which the
 * Python side never writes). relayc_tape_name(id) names the functions, NULL past the last. */
#define TAPE_ANY INT64_MIN
static const char *const tape_names[] = {
    "relayc_forward",      "relayc_draft_chain", "relayc_draft_extend", "relayc_accept_greedy",
    "relayc_compact",      "relayc_paged_meta",  "relayc_head_argmax",  "relayc_norm_pair",
    "relayc_linear",       "relayc_argmax",      "relayc_gather_rows",  "relayc_scatter_rows",
    "relayc_cat_bytes",    "relayc_fill_pattern", "relayc_add_int64",   "relayc_cast_int",
    "relayc_copy_bytes",   "relayc_zero_bytes",  "relayc_exp",
};
static const int tape_arity[] = {19, 17, 25, 12, 16, 12, 11, 10, 7, 4, 7, 6, 5, 4, 7, 5, 3, 2, 3};

const char *relayc_tape_name(int id) {
    return id >= 0 && id < (int)(sizeof tape_names / sizeof *tape_names) ? tape_names[id] : NULL;
}

static inline float tape_float(int64_t word) {
    const uint32_t bits = (uint32_t)(uint64_t)word;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

int64_t relayc_tape_run(const int64_t *records, int64_t n, int64_t *code) {
#define P(k) ((void *)(intptr_t)a[k])
#define I(k) ((int)a[k])
#define F(k) tape_float(a[k])
    for (int64_t c = 0; c < n; c++) {
        const int64_t id = records[0], count = records[1], want = records[2];
        const int64_t *a = records + 3;
        const int known = id >= 0 && id < (int64_t)(sizeof tape_arity / sizeof *tape_arity);
        if (!known || count != tape_arity[id]) {
            *code = TAPE_ANY;
            return c;
        }
        int rc;
        switch (id) {
        case 0:
            rc = relayc_forward(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9), P(10),
                                P(11), P(12), P(13), I(14), P(15), P(16), P(17), P(18));
            break;
        case 1:
            rc = relayc_draft_chain(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9),
                                    P(10), P(11), F(12), P(13), F(14), P(15), P(16));
            break;
        case 2:
            rc = relayc_draft_extend(P(0), I(1), I(2), I(3), P(4), a[5], a[6], P(7), P(8), P(9),
                                     P(10), P(11), P(12), I(13), P(14), a[15], P(16), I(17),
                                     P(18), F(19), P(20), F(21), P(22), P(23), P(24));
            break;
        case 3:
            rc = relayc_accept_greedy(I(0), I(1), I(2), P(3), P(4), P(5), P(6), P(7), P(8), P(9),
                                      P(10), P(11));
            break;
        case 4:
            rc = relayc_compact(I(0), I(1), P(2), a[3], P(4), P(5), a[6], a[7], a[8], P(9), a[10],
                                a[11], P(12), P(13), P(14), P(15));
            break;
        case 5:
            rc = relayc_paged_meta(I(0), I(1), I(2), P(3), a[4], a[5], P(6), P(7), P(8), P(9),
                                   P(10), P(11));
            break;
        case 6:
            rc = relayc_head_argmax(I(0), I(1), I(2), I(3), P(4), P(5), F(6), P(7), P(8), I(9),
                                    P(10));
            break;
        case 7:
            rc = relayc_norm_pair(I(0), I(1), P(2), P(3), F(4), I(5), P(6), P(7), F(8), P(9));
            break;
        case 8: rc = relayc_linear(I(0), I(1), I(2), P(3), P(4), P(5), I(6)); break;
        case 9: rc = relayc_argmax(P(0), a[1], a[2], P(3)); break;
        case 10: rc = relayc_gather_rows(P(0), a[1], a[2], P(3), a[4], I(5), P(6)); break;
        case 11: rc = relayc_scatter_rows(P(0), a[1], a[2], P(3), a[4], P(5)); break;
        case 12: rc = relayc_cat_bytes(P(0), a[1], I(2), P(3), P(4)); break;
        case 13: rc = relayc_fill_pattern(P(0), a[1], a[2], P(3)); break;
        case 14: rc = relayc_add_int64(P(0), P(1), a[2], a[3], a[4], I(5), P(6)); break;
        case 15: rc = relayc_cast_int(P(0), I(1), P(2), I(3), a[4]); break;
        case 16: rc = relayc_copy_bytes(P(0), P(1), a[2]); break;
        case 17: rc = relayc_zero_bytes(P(0), a[1]); break;
        default: rc = relayc_exp(P(0), a[1], P(2)); break;
        }
        if (want != TAPE_ANY && rc != want) {
            *code = rc;
            return c;
        }
        records = a + count;
    }
    return n;
#undef P
#undef I
#undef F
}
