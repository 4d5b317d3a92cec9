/* RMSNorm and the exponential shared by attention and SiLU. One unit of the native CPU decoder
 * (decoder.h). */
#include "decoder.h"

/* sum_i a[i] * b[i]: eight lanes of partial sums, then the lanes in order. */
static inline float dot(const float *a, const float *b, int n) {
    int i = 0;
    float sum = 0.0f;
    if (n >= 8) {
        v8 acc = splat(0.0f);
        for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
        for (int j = 0; j < 8; j++) sum += acc[j];
    }
    for (; i < n; i++) sum += a[i] * b[i];
    return sum;
}

void rms_norm(const float *x, int T, int H, const float *weight, float eps, float *out) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H;
        float *ot = out + (size_t)t * H;
        float r = 1.0f / sqrtf(dot(xt, xt, H) / (float)H + eps);
        for (int i = 0; i < H; i++) ot[i] = weight[i] * (xt[i] * r);
    }
}

/* e^x, sixteen lanes, within about one ulp (Cody-Waite reduction by ln 2, then Cephes'
 * degree-6 polynomial; the same operations whatever the build, so the same bits):
 * subnormal results included, 0 below -104 (under half the smallest subnormal), +inf above
 * 88.7228317 (the largest float whose e^x is finite), NaN for NaN. */
static inline v16 exp16(v16 x) {
    typedef int32_t i32v __attribute__((vector_size(64)));
    const v16 lo = splat16(-104.0f), hi = splat16(88.72283172607421875f);
    const i32v small = x < lo, big = x > hi, nan = x != x, out = small | big | nan;
    /* the polynomial runs on x clamped into [lo, hi] (NaN on 0); those lanes are set last */
    i32v bits, lo_bits, hi_bits;
    memcpy(&bits, &x, sizeof x);
    memcpy(&lo_bits, &lo, sizeof lo);
    memcpy(&hi_bits, &hi, sizeof hi);
    bits = (bits & ~out) | (lo_bits & small) | (hi_bits & big);
    v16 xc;
    memcpy(&xc, &bits, sizeof xc);
    /* n = round(x / ln 2) (adding 1.5 * 2^23 rounds to nearest), r = x - n ln 2 */
    const v16 shift = splat16(12582912.0f);
    const v16 t = xc * splat16(1.44269504088896341f) + shift;
    const v16 n = t - shift;
    v16 r = xc - n * splat16(0.693359375f);
    r = r - n * splat16(-2.12194440e-4f);
    v16 p = splat16(1.9875691500e-4f);
    p = p * r + splat16(1.3981999507e-3f);
    p = p * r + splat16(8.3334519073e-3f);
    p = p * r + splat16(4.1665795894e-2f);
    p = p * r + splat16(1.6666665459e-1f);
    p = p * r + splat16(5.0000001201e-1f);
    p = p * (r * r) + r + splat16(1.0f);
    /* times 2^n (n in -150..128) as 2^a * 2^b, a = n >> 1: both normal, one rounding */
    i32v ni;
    memcpy(&ni, &t, sizeof t);
    ni -= 0x4B400000;
    const i32v a = ni >> 1, b = ni - a;
    const i32v a_bits = (a + 127) << 23, b_bits = (b + 127) << 23;
    v16 sa, sb;
    memcpy(&sa, &a_bits, sizeof sa);
    memcpy(&sb, &b_bits, sizeof sb);
    v16 y = p * sa * sb;
    i32v yb, inf_bits, x_bits;
    const v16 inf = splat16(INFINITY);
    memcpy(&yb, &y, sizeof y);
    memcpy(&inf_bits, &inf, sizeof inf);
    memcpy(&x_bits, &x, sizeof x);
    yb = (yb & ~out) | (inf_bits & big) | (x_bits & nan);
    memcpy(&y, &yb, sizeof y);
    return y;
}

/* x[i] <- e^x[i], i < n: exp16 on each sixteen, the last few through a padded copy. */
void exp_rows(float *x, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) {
        const v16 y = exp16(load16(x + i));
        memcpy(x + i, &y, sizeof y);
    }
    if (i < n) {
        float pad[16] = {0};
        memcpy(pad, x + i, sizeof(float) * (size_t)(n - i));
        const v16 y = exp16(load16(pad));
        memcpy(x + i, &y, sizeof(float) * (size_t)(n - i));
    }
}

/* out[i] = e^x[i], i < n, as attention's softmax and SiLU compute it (exp16): for tests. */
int relayc_exp(const float *x, int64_t n, float *out) {
    if (n < 0) return -2;
    for (int64_t i = 0; i < n; i += 1 << 20) {
        const int chunk = n - i < (1 << 20) ? (int)(n - i) : 1 << 20;
        memcpy(out + i, x + i, sizeof(float) * (size_t)chunk);
        exp_rows(out + i, chunk);
    }
    return 0;
}
