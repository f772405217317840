/* Aligned IoU / GIoU / DIoU / CIoU of float32 XYXY box pairs: values and analytic gradients
 * in one pass (the CPU fast path of visionblocks.ops._iou_loss_torch, loaded by
 * visionblocks.ops._iou_loss_native).
 *
 * Formulas, eps rule and gradient layout: visionblocks/ops/_iou_core.py. This file computes
 * the same quantities per pair, in the same order of operations as the torch path's column
 * ops, so it agrees with the torch path up to float32 rounding (its own atan, and the order of
 * the sums). The exactness the losses promise (identical boxes: measure 1, loss 0, at any
 * scale) needs every product rounded on its own: contraction into FMA is switched off below.
 *
 * Plain C99 for the auto-vectoriser: no branches in the pair loop (selects only), no libm call
 * (atan is a branch-free polynomial). IEEE +, -, *, / and compares give the same bits in
 * vector and scalar code, so a pair's results do not depend on where it lies in a block.
 */
#include <stdint.h>

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define VB_BLOCK 64 /* pairs per block (planar copies in L1; 64 measured best, 256 +25%) */

enum { VB_IOU = 0, VB_GIOU = 1, VB_DIOU = 2, VB_CIOU = 3 };

static const float VB_K = 0.405284734569351086f; /* 4 / pi^2 */
static const float VB_TINY = 1.17549435e-38f;     /* FLT_MIN: alpha's denominator floor */

static inline float vb_max(float a, float b) { return a > b ? a : b; }
static inline float vb_min(float a, float b) { return a < b ? a : b; }
static inline float vb_nonzero(float x, float eps) { return x == 0.0f ? eps : x; }
static inline float vb_sign(float x) { return (float)(x > 0.0f) - (float)(x < 0.0f); }

/* atan(w / h), its limit +-pi/2 for h = 0 and 0 for a point box (w = h = 0), branch-free.
 * One division, which cannot overflow: x = min / max of |w| and |h| in [0, 1], atan(x) by an
 * odd polynomial (SLEEF's atanf coefficients, 3.5 ulp), and pi / 2 - atan(x) where |w| > |h|.
 * Within a few ulp of float64 atan(w / h), and exactly odd in w and in h. */
static inline float vb_angle(float w, float h) {
    const float a = w < 0.0f ? -w : w, b = h < 0.0f ? -h : h;
    const int swap = a > b; /* |w / h| > 1, h = 0 or w = inf included */
    const float lo = swap ? b : a, hi = swap ? a : b;
    /* hi + 1 only for a point box: 0 / 1. (A select on the quotient would stop GCC 12's
     * if-conversion, and with it the vectoriser.) */
    const float x = lo / (hi + (float)(hi == 0.0f)), t = x * x;
    float u = 0.00282363896258175373f;
    u = u * t - 0.0159569028764963150f;
    u = u * t + 0.0425049886107444763f;
    u = u * t - 0.0748900920152664184f;
    u = u * t + 0.106347933411598206f;
    u = u * t - 0.142027363181114197f;
    u = u * t + 0.199926957488059998f;
    u = u * t - 0.333331018686294556f;
    const float y0 = x + x * (t * u);
    const float y = swap ? 1.57079632679489662f - y0 : y0;
    const float yw = w < 0.0f ? -y : y;
    return h < 0.0f ? -yw : yw;
}

/* One block of m <= VB_BLOCK pairs. kind, want_p, want_t are constants at every call site,
 * so each combination compiles to its own branch-free loop. The coordinates are first copied
 * to planar rows (and the results back): the pair loop then runs a fixed VB_BLOCK times on
 * contiguous rows, which GCC 12 vectorises far better than interleaved boxes (up to 2x). */
static inline __attribute__((always_inline)) void vb_block(
    const int kind, const int want_p, const int want_t, int64_t m, const float *restrict pb,
    const float *restrict tb, float eps, float off, float sgn, float *restrict val,
    float *restrict gp, float *restrict gt) {
    const float half = -0.5f * sgn; /* d/dx1 factor; d/dx2 gets -half (see combine) */
    float in[8][VB_BLOCK], out[9][VB_BLOCK]; /* out: value, then grad_p or grad_t rows */
    float(*const op)[VB_BLOCK] = out + 1, (*const ot)[VB_BLOCK] = out + (want_p ? 5 : 1);
    for (int64_t i = 0; i < m; i++)
        for (int k = 0; k < 4; k++) {
            in[k][i] = pb[4 * i + k];
            in[4 + k][i] = tb[4 * i + k];
        }
    for (int64_t i = m; i < VB_BLOCK; i++)
        for (int k = 0; k < 8; k++) in[k][i] = 0.0f;
    for (int i = 0; i < VB_BLOCK; i++) {
        const float ax1 = in[0][i], ay1 = in[1][i], ax2 = in[2][i], ay2 = in[3][i];
        const float bx1 = in[4][i], by1 = in[5][i], bx2 = in[6][i], by2 = in[7][i];
        const float wa = ax2 - ax1, ha = ay2 - ay1, wb = bx2 - bx1, hb = by2 - by1;
        const float dx = vb_min(ax2, bx2) - vb_max(ax1, bx1);
        const float dy = vb_min(ay2, by2) - vb_max(ay1, by1);
        const float cx = (wa + wb) - dx, cy = (ha + hb) - dy; /* enclosing sides */
        const float ix = dx < 0.0f ? 0.0f : dx, iy = dy < 0.0f ? 0.0f : dy;
        const float inter = ix * iy;
        const float uni = (wa * ha + wb * hb) - inter;
        const float u = vb_nonzero(uni, eps);
        const float iou = inter / u;
        float meas = iou, cnz = 1.0f, pen = 0.0f, dnz = 1.0f, delx = 0.0f, dely = 0.0f;
        float dt = 0.0f, alpha = 0.0f;
        if (kind == VB_GIOU) {
            const float area_c = cx * cy;
            cnz = vb_nonzero(area_c, eps);
            pen = (area_c - uni) / cnz;
            meas = iou - pen;
        } else if (kind == VB_DIOU || kind == VB_CIOU) {
            dnz = vb_nonzero(cx * cx + cy * cy, eps);
            delx = (ax1 - bx1) + (ax2 - bx2);
            dely = (ay1 - by1) + (ay2 - by2);
            pen = (delx * delx + dely * dely) / dnz; /* 4 rho^2 / Q */
            meas = iou - 0.25f * pen;
            if (kind == VB_CIOU) {
                dt = vb_angle(wb, hb) - vb_angle(wa, ha);
                const float v = dt * dt * VB_K;
                float den = (v - iou) + 1.0f;
                den = den < VB_TINY ? VB_TINY : den;
                alpha = v / den;
                meas = meas - alpha * v;
            }
        }
        out[0][i] = off + sgn * meas;
        if (!want_p && !want_t) continue;
        /* Coefficients of _iou_core.terms (no incoming gradient). */
        const float ru = 1.0f / u;
        float gu = iou * ru;
        float kcx = 0.0f, kcy = 0.0f, ac = 1.0f, ddx = 0.0f, ddy = 0.0f, za = 0.0f;
        if (kind == VB_GIOU) {
            const float rc = 1.0f / cnz;
            gu = rc - gu;
            const float gc = (pen - 1.0f) * rc;
            kcx = cy * gc;
            kcy = cx * gc;
        } else {
            gu = -gu;
        }
        if (kind == VB_DIOU || kind == VB_CIOU) {
            const float rq = 1.0f / dnz;
            ddx = delx * rq;
            ddy = dely * rq;
            const float pr = pen * rq;
            kcx = cx * pr;
            kcy = cy * pr;
            ac = 0.5f;
            if (kind == VB_CIOU) za = alpha * dt;
        }
        const float gi = ru - gu;
        const float kix = iy * gi * (float)(ix > 0.0f), kiy = ix * gi * (float)(iy > 0.0f);
        float mx = kix, my = kiy, jx = kix, jy = kiy;
        if (kind != VB_IOU) {
            mx = kix + ac * kcx;
            my = kiy + ac * kcy;
            jx = kix - ac * kcx;
            jy = kiy - ac * kcy;
        }
        float jlx = vb_sign(ax1 - bx1) * jx, jly = vb_sign(ay1 - by1) * jy;
        float jhx = vb_sign(ax2 - bx2) * jx, jhy = vb_sign(ay2 - by2) * jy;
        if (kind == VB_DIOU || kind == VB_CIOU) { /* fold_centre */
            jlx = jlx + ddx;
            jly = jly + ddy;
            jhx = jhx + ddx;
            jhy = jhy + ddy;
        }
        /* combine, sigma = 1 (pred) and -1 (target). */
        if (want_p) {
            float gx = gu, gy = gu;
            if (kind == VB_CIOU) {
                float nrm = wa * wa + ha * ha;
                nrm = nrm == 0.0f ? 1.0f : nrm;
                const float cn = za / nrm;
                gx = gu + (2.0f * VB_K) * cn;
                gy = gu + (-2.0f * VB_K) * cn;
            }
            const float yx = mx + 2.0f * ha * gx, yy = my + 2.0f * wa * gy;
            op[0][i] = half * (yx + jlx);
            op[1][i] = half * (yy + jly);
            op[2][i] = -half * (yx - jhx);
            op[3][i] = -half * (yy - jhy);
        }
        if (want_t) {
            float gx = gu, gy = gu;
            if (kind == VB_CIOU) {
                float nrm = wb * wb + hb * hb;
                nrm = nrm == 0.0f ? 1.0f : nrm;
                const float cn = za / nrm;
                gx = gu + (-2.0f * VB_K) * cn;
                gy = gu + (2.0f * VB_K) * cn;
            }
            const float yx = mx + 2.0f * hb * gx, yy = my + 2.0f * wb * gy;
            ot[0][i] = half * (yx - jlx);
            ot[1][i] = half * (yy - jly);
            ot[2][i] = -half * (yx + jhx);
            ot[3][i] = -half * (yy + jhy);
        }
    }
    for (int64_t i = 0; i < m; i++) val[i] = out[0][i];
    if (want_p)
        for (int64_t i = 0; i < m; i++)
            for (int k = 0; k < 4; k++) gp[4 * i + k] = op[k][i];
    if (want_t)
        for (int64_t i = 0; i < m; i++)
            for (int k = 0; k < 4; k++) gt[4 * i + k] = ot[k][i];
}

#define VB_CASE(K, P, T) vb_block(K, P, T, m, pb, tb, eps, off, sgn, val, gp, gt)
#define VB_KINDS(P, T)                                                                        \
    switch (kind) {                                                                           \
    case VB_IOU: VB_CASE(VB_IOU, P, T); break;                                                \
    case VB_GIOU: VB_CASE(VB_GIOU, P, T); break;                                              \
    case VB_DIOU: VB_CASE(VB_DIOU, P, T); break;                                              \
    default: VB_CASE(VB_CIOU, P, T); break;                                                   \
    }

/* n pairs of (n, 4) float32 boxes pred and target (contiguous). Writes the value of every
 * pair (loss: 1 - measure) to values, or, with values NULL, their sum to *sum (lanes of
 * doubles added in a fixed order: the sum depends only on n); the gradient of each pair's
 * value with respect to pred (target) to grad_p (grad_t) unless NULL. */
void vb_iou_aligned_f32(int64_t n, const float *pred, const float *target, int64_t kind,
                        float eps, int64_t loss, float *values, float *grad_p, float *grad_t,
                        double *sum) {
    float buf[VB_BLOCK];
    double acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float off = loss ? 1.0f : 0.0f, sgn = loss ? -1.0f : 1.0f;
    for (int64_t start = 0; start < n; start += VB_BLOCK) {
        const int64_t m = n - start < VB_BLOCK ? n - start : VB_BLOCK;
        const float *pb = pred + 4 * start, *tb = target + 4 * start;
        float *val = values ? values + start : buf;
        float *gp = grad_p ? grad_p + 4 * start : 0, *gt = grad_t ? grad_t + 4 * start : 0;
        if (gp && gt) {
            VB_KINDS(1, 1)
        } else if (gp) {
            VB_KINDS(1, 0)
        } else if (gt) {
            VB_KINDS(0, 1)
        } else {
            VB_KINDS(0, 0)
        }
        if (values) continue;
        for (int64_t i = m; i < VB_BLOCK; i++) buf[i] = 0.0f;
        for (int i = 0; i < VB_BLOCK; i += 8)
            for (int j = 0; j < 8; j++) acc[j] += (double)buf[i + j];
    }
    if (sum)
        *sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

/* vb_iou_aligned_f32 over parts of `grain` pairs: parts [start, stop) on up to `threads`
 * threads of the team (_native_team.h); without values, part i writes its sum to sums[i].
 * Returns the number of failed parts (always 0: no scratch). */
typedef struct {
    int64_t n;
    const float *pred, *target;
    int64_t kind, loss, grain;
    float eps;
    float *values, *grad_p, *grad_t;
    double *sums;
} vb_iou_job;

static int vb_iou_part(void *ctx, int64_t i) {
    const vb_iou_job *j = (const vb_iou_job *)ctx;
    const int64_t lo = i * j->grain, hi = lo + j->grain < j->n ? lo + j->grain : j->n;
    vb_iou_aligned_f32(hi - lo, j->pred + 4 * lo, j->target + 4 * lo, j->kind, j->eps, j->loss,
                       j->values ? j->values + lo : 0, j->grad_p ? j->grad_p + 4 * lo : 0,
                       j->grad_t ? j->grad_t + 4 * lo : 0, j->values ? 0 : j->sums + i);
    return 0;
}

int64_t vb_iou_aligned_f32_parts(int64_t n, const float *pred, const float *target, int64_t kind,
                                 float eps, int64_t loss, float *values, float *grad_p,
                                 float *grad_t, int64_t grain, double *sums, int64_t start,
                                 int64_t stop, int64_t threads) {
    vb_iou_job job = {n, pred, target, kind, loss, grain, eps, values, grad_p, grad_t, sums};
    return vb_run_parts(vb_iou_part, &job, start, stop, threads);
}
