/* Sigmoid focal loss and its gradient in one pass, float32 (visionblocks.losses._focal_native).
 *
 * Per element, with u = exp(-|x|), p = sigmoid(x), q = sigmoid(-x) (both formed directly
 * from u, never as 1 - the other), l = log1p(u), a target t in [0, 1] and
 * a_t = alpha t + (1 - alpha)(1 - t) (1 without alpha, 0 where ignored):
 *
 *     ce       = lerp(max(x, 0), max(-x, 0), t) + l
 *     m        = lerp(p, q, t)                       (= 1 - p_t, no cancellation)
 *     loss     = a_t ce m^g
 *     dloss/dx = a_t [lerp(p, -q, t) m^g + g (1 - 2t) ce p q m^(g-1)]
 *
 * lerp is torch's: a + t (b - a) for t < 1/2, else b - (b - a)(1 - t).
 * exp and log1p are evaluated by the branch-free polynomials below (a few float32 ulp, checked
 * against float64 in the tests), so the compiler can vectorise the loop; gamma is 2g/2 with an
 * integer 2g in [0, 15] (m^g = products of m, m^2, m^4 and a square root).
 *
 * Plain C99: no intrinsics, no fast-math.
 */
#include <math.h>
#include <stdint.h>
#include <string.h>

#define BLOCK 512

static inline float from_bits(uint32_t b) {
    float f;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* exp(-a) for a in [0, 104] (a NaN gives NaN). Cody-Waite reduction a = k ln2 - r,
 * |r| <= ln2 / 2, degree-7 Taylor polynomial (truncation 6e-9), and 2^-k applied as
 * 2^(64 - k) * 2^-64 so results in the subnormal range round once. */
static inline float exp_neg(float a) {
    const float log2e = 1.44269504088896341f;
    const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
    /* k = round(a log2 e) by the 1.5 * 2^23 trick (no float-to-int conversion, which the
     * vectoriser refuses); k is also in the low bits of the sum. A NaN gives a NaN r. */
    const float magic = 12582912.0f;
    float km = a * log2e + magic;
    float kf = km - magic;
    uint32_t kb;
    memcpy(&kb, &km, sizeof kb);
    int32_t k = (int32_t)(kb - 0x4B400000u);
    float r = (kf * ln2_hi - a) + kf * ln2_lo;
    float y = 1.0f / 5040.0f;
    y = y * r + 1.0f / 720.0f;
    y = y * r + 1.0f / 120.0f;
    y = y * r + 1.0f / 24.0f;
    y = y * r + 1.0f / 6.0f;
    y = y * r + 0.5f;
    y = y * r + 1.0f;
    y = y * r + 1.0f;
    float scale = from_bits((uint32_t)(127 + 64 - k) << 23);
    return y * scale * 5.42101086e-20f; /* 2^-64 */
}

/* log1p(u) for u in [0, 1]: 2 atanh(s) with s = u / (2 + u) in [0, 1/3] (no cancellation),
 * series to s^15 (truncation below 2e-9 relative). */
static inline float log1p01(float u) {
    float s = u / (2.0f + u);
    float z = s * s;
    float y = 1.0f / 15.0f;
    y = y * z + 1.0f / 13.0f;
    y = y * z + 1.0f / 11.0f;
    y = y * z + 1.0f / 9.0f;
    y = y * z + 1.0f / 7.0f;
    y = y * z + 1.0f / 5.0f;
    y = y * z + 1.0f / 3.0f;
    y = y * z + 1.0f;
    return 2.0f * s * y;
}

static inline float lerp(float a, float b, float t) {
    float lo = a + t * (b - a), hi = b - (b - a) * (1.0f - t);
    return t < 0.5f ? lo : hi;
}

/* v = m^(n2 / 2) for an integer n2 in [0, 15], element-wise over n values (one simple loop
 * per factor, so each vectorises). */
static void power(const float *m, float *v, int64_t n, int64_t n2) {
    int64_t k = n2 >> 1;
    for (int64_t i = 0; i < n; i++) v[i] = (n2 & 1) ? sqrtf(m[i]) : 1.0f;
    for (int64_t j = 0; j < k; j++)
        for (int64_t i = 0; i < n; i++) v[i] *= m[i];
}

typedef struct {
    float p[BLOCK], q[BLOCK], ce[BLOCK], m[BLOCK], t[BLOCK], at[BLOCK], mg[BLOCK], mg1[BLOCK];
} Scratch;

/* Pass 1 over a block of n elements: p, q, ce, m, t, a_t. index and use_ignore are constants
 * at every call (see `dispatch`), so the loop has no control flow and vectorises. */
static inline __attribute__((always_inline)) void terms(
    const float *x, const float *tv, int64_t n, int64_t label, int64_t col0, const int index,
    float a0, float a1, const int use_ignore, float ignore_f, float row_keep, Scratch *w) {
    for (int64_t i = 0; i < n; i++) {
        float xi = x[i];
        float t = index ? ((col0 + i == label) ? 1.0f : 0.0f) : tv[i];
        float keep = 1.0f;
        if (use_ignore) {
            keep = index ? row_keep : (t != ignore_f ? 1.0f : 0.0f);
            t *= keep;
        }
        float a = fabsf(xi);
        a = a > 104.0f ? 104.0f : a;
        float u = exp_neg(a);
        float l = log1p01(u);
        float r = 1.0f / (1.0f + u);
        float ur = u * r;
        int pos = xi >= 0.0f;
        float p = pos ? r : ur, q = pos ? ur : r;
        float rx = xi > 0.0f ? xi : 0.0f, rnx = xi < 0.0f ? -xi : 0.0f;
        w->p[i] = p;
        w->q[i] = q;
        w->ce[i] = lerp(rx, rnx, t) + l;
        w->m[i] = lerp(p, q, t);
        w->t[i] = t;
        w->at[i] = keep * (a0 + t * a1);
    }
}

/* Pass 3: loss into lo and, when want_grad, the gradient into go. */
static inline __attribute__((always_inline)) void combine(
    const Scratch *w, int64_t n, float g, float *lo, float *go, const int want_grad) {
    for (int64_t i = 0; i < n; i++) {
        float um = w->at[i] * w->mg[i];
        lo[i] = w->ce[i] * um;
        if (want_grad) {
            float t = w->t[i], p = w->p[i], q = w->q[i];
            float d = lerp(p, -q, t);
            float e = p * q * w->ce[i] * (g - 2.0f * g * t) * (w->at[i] * w->mg1[i]);
            go[i] = e + d * um;
        }
    }
}

#define TERMS(IDX, IGN) terms(x, tv, n, label, col0, IDX, a0, a1, IGN, ignore_f, row_keep, w)
static void block(const float *x, const float *tv, int64_t n, int64_t label, int64_t col0,
                  int index, float a0, float a1, int64_t g2, int use_ignore, float ignore_f,
                  float row_keep, float *lo, float *go, Scratch *w) {
    if (index) {
        if (use_ignore) TERMS(1, 1); else TERMS(1, 0);
    } else {
        if (use_ignore) TERMS(0, 1); else TERMS(0, 0);
    }
    power(w->m, w->mg, n, g2);
    if (go) {
        if (g2 >= 2) {
            power(w->m, w->mg1, n, g2 - 2);
        } else { /* m^(g - 1) = m^g / m, bounded (p q = 0 where m = 0) */
            const float tiny = 1.17549435e-38f;
            for (int64_t i = 0; i < n; i++)
                w->mg1[i] = w->mg[i] / (w->m[i] > tiny ? w->m[i] : tiny);
        }
        combine(w, n, 0.5f * (float)g2, lo, go, 1);
    } else {
        combine(w, n, 0.5f * (float)g2, lo, go, 0);
    }
}

static inline double block_sum(const float *v, int64_t n) {
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) lane[j] += v[i + j];
    double s = 0.0;
    for (; i < n; i++) s += v[i];
    for (int j = 0; j < 8; j++) s += lane[j];
    return s;
}

/* Rows [0, rows) of x (rows x cols, contiguous). Targets: float (rows x cols) when
 * t_kind == 0, int64 class indices (rows) when t_kind == 1. alpha < 0 means no alpha.
 * loss_out NULL: returns the sum; else writes the element-wise loss and returns 0.
 * grad_out may be NULL. *count_out gets the number of non-ignored elements. */
double vb_focal_f32(const float *x, const void *targets, int64_t t_kind, int64_t rows,
                    int64_t cols, float alpha, int64_t g2, int64_t use_ignore, double ignore,
                    float *loss_out, float *grad_out, int64_t *count_out) {
    float buf[BLOCK];
    Scratch w;
    const float a0 = alpha < 0.0f ? 1.0f : 1.0f - alpha, a1 = alpha < 0.0f ? 0.0f : 2.0f * alpha - 1.0f;
    double total = 0.0;
    int64_t count = 0;
    const int index = t_kind == 1;
    const float *tf = (const float *)targets;
    const int64_t *labels = (const int64_t *)targets;
    const float ignore_f = (float)ignore;
    /* Float targets: one flat run of rows * cols; class indices: row by row. */
    int64_t runs = index ? rows : 1, len = index ? cols : rows * cols;
    for (int64_t r = 0; r < runs; r++) {
        int64_t base = r * len;
        int64_t label = index ? labels[r] : -1;
        int row_kept = !(use_ignore && index && (double)label == ignore);
        float row_keep = row_kept ? 1.0f : 0.0f;
        for (int64_t s = 0; s < len; s += BLOCK) {
            int64_t n = len - s < BLOCK ? len - s : BLOCK;
            const float *tv = index ? 0 : tf + base + s;
            float *lo = loss_out ? loss_out + base + s : buf;
            float *go = grad_out ? grad_out + base + s : 0;
            block(x + base + s, tv, n, label, s, index, a0, a1, g2, (int)use_ignore, ignore_f,
                  row_keep, lo, go, &w);
            if (!loss_out) total += block_sum(lo, n);
            if (use_ignore && !index)
                for (int64_t i = 0; i < n; i++) count += tv[i] != ignore_f;
        }
        if (use_ignore && index) count += row_kept ? cols : 0;
    }
    *count_out = use_ignore ? count : rows * cols;
    return total;
}

/* vb_focal_f32 over row parts of `grain` rows: parts [start, stop) on up to `threads` threads
 * of the team (_native_team.h); part i writes its sum to sums[i] and its count to counts[i].
 * Returns the number of failed parts (always 0: no scratch). */
typedef struct {
    const float *x;
    const char *targets;
    int64_t t_kind, rows, cols, g2, use_ignore, grain;
    float alpha;
    double ignore;
    float *loss_out, *grad_out;
    double *sums;
    int64_t *counts;
} vb_focal_job;

static int vb_focal_part(void *ctx, int64_t i) {
    const vb_focal_job *j = (const vb_focal_job *)ctx;
    const int64_t r0 = i * j->grain, r1 = r0 + j->grain < j->rows ? r0 + j->grain : j->rows;
    const int64_t off = r0 * j->cols, toff = j->t_kind == 1 ? r0 * 8 : off * 4;
    j->sums[i] = vb_focal_f32(j->x + off, j->targets + toff, j->t_kind, r1 - r0, j->cols, j->alpha,
                              j->g2, j->use_ignore, j->ignore,
                              j->loss_out ? j->loss_out + off : 0,
                              j->grad_out ? j->grad_out + off : 0, j->counts + i);
    return 0;
}

int64_t vb_focal_f32_parts(const float *x, const void *targets, int64_t t_kind, int64_t rows,
                           int64_t cols, float alpha, int64_t g2, int64_t use_ignore,
                           double ignore, float *loss_out, float *grad_out, int64_t grain,
                           double *sums, int64_t *counts, int64_t start, int64_t stop,
                           int64_t threads) {
    vb_focal_job job = {x, (const char *)targets, t_kind, rows, cols, g2, use_ignore, grain,
                        alpha, ignore, loss_out, grad_out, sums, counts};
    return vb_run_parts(vb_focal_part, &job, start, stop, threads);
}
