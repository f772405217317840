/* Bilinear affine warping with zero padding: the CPU kernel behind `warp_affine`.
 *
 * Compiled on first use by visionblocks/ops/_warp_native.py and called through ctypes.
 * out[n, c, y, x] samples img[n, c] at (sx, sy) = (m0 x + m1 y + m2, m3 x + m4 y + m5) (the
 * inverse matrix; pixel centres on integers), with the formula of
 * grid_sample(align_corners=False, padding_mode="zeros"): with (ix, iy) = floor(sx, sy) and
 * (wx, wy) the fractions, the four neighbours weigh (1-wx)(1-wy), wx(1-wy), (1-wx)wy and
 * wx wy, and a neighbour outside the image contributes nothing. Coordinates are in double.
 *
 * Work goes by blocks of output rows. A plan per row (the columns that can be nonzero, the run
 * of "interior" columns whose four neighbours are all inside, and for those the offset of the
 * top-left neighbour and the fractions wx, wy) is built once and reused for every channel, and
 * for every image when the matrix is shared.
 *
 * Memory safety: the fast loop reads only interior columns, classified by comparing the double
 * coordinates (0 <= sx < W - 1 and 0 <= sy < H - 1), so floor() gives a top-left neighbour with
 * all four neighbours inside; the run is verified column by column and dropped if any column
 * fails. Every other column goes through edge(), which checks each neighbour. Columns left and
 * right of the planned range are written as 0; that range is widened by two columns, so
 * rounding never drops a nonzero pixel. The caller passes contiguous tensors, finite matrices,
 * H * W + W + 1 < 2^31, Wo < 2^31 and scratch of the sizes given at vb_warp_zeros below.
 *
 * The file includes itself once per dtype: VB_T is the element type, VB(name) the suffixed
 * function name.
 */
#ifndef VB_T
#include <math.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    int64_t xa, xb;   /* columns [xa, xb) may be nonzero */
    int64_t xi0, xi1; /* columns [xi0, xi1) are interior, with a plan */
} vb_span;

/* Narrow [*x0, *x1) to the columns where lo < a x + b < hi may hold, widened by two; the
 * result stays inside the given range (and is empty, x0 == x1, when nothing is left). */
static void vb_interval(double a, double b, double lo, double hi, double *x0, double *x1) {
    double t0 = *x0, t1 = *x1;
    if (a != 0.0) {
        t0 = (lo - b) / a;
        t1 = (hi - b) / a;
        if (t0 > t1) {
            const double t = t0;
            t0 = t1;
            t1 = t;
        }
        t0 = floor(t0) - 2.0;
        t1 = ceil(t1) + 3.0;
    } else if (!(b > lo && b < hi)) {
        t1 = *x0; /* the row misses the image */
    }
    /* clamp into [*x0, *x1]; comparisons written so that NaN leaves the range unchanged */
    const double n0 = t0 > *x0 ? (t0 < *x1 ? t0 : *x1) : *x0;
    const double n1 = t1 < *x1 ? (t1 > n0 ? t1 : n0) : *x1;
    *x0 = n0;
    *x1 = n1;
}

static int vb_inner(double sx, double sy, double wi, double hi) {
    return sx >= 0.0 && sx < wi && sy >= 0.0 && sy < hi;
}

#define VB_T float
#define VB(name) name##_f32
#include __FILE__
#undef VB_T
#undef VB
#define VB_T double
#define VB(name) name##_f64
#include __FILE__

#else /* the per-dtype part */

/* Columns [x0, x1) of row y of one channel, each neighbour checked. */
static void VB(edge)(const VB_T *q, VB_T *o, const double *m, int64_t y, int64_t x0, int64_t x1,
                     int64_t H, int64_t W) {
    const double bx = m[1] * (double)y + m[2], by = m[4] * (double)y + m[5];
    for (int64_t x = x0; x < x1; ++x) {
        const double sx = m[0] * (double)x + bx, sy = m[3] * (double)x + by;
        VB_T v = 0;
        if (sx >= -1.0 && sx < (double)W && sy >= -1.0 && sy < (double)H) {
            const double fx = floor(sx), fy = floor(sy);
            const int64_t ix = (int64_t)fx, iy = (int64_t)fy;
            const VB_T wx = (VB_T)(sx - fx), wy = (VB_T)(sy - fy);
            const int l = ix >= 0, r = ix + 1 < W, t = iy >= 0, b = iy + 1 < H;
            if (t && l) v += q[iy * W + ix] * ((1 - wx) * (1 - wy));
            if (t && r) v += q[iy * W + ix + 1] * (wx * (1 - wy));
            if (b && l) v += q[(iy + 1) * W + ix] * ((1 - wx) * wy);
            if (b && r) v += q[(iy + 1) * W + ix + 1] * (wx * wy);
        }
        o[x] = v;
    }
}

/* Plan of row y: its span, and for its interior run the offsets and fractions wx, wy. */
static void VB(plan)(const double *m, int64_t y, int64_t H, int64_t W, int64_t Wo, int32_t *off,
                     VB_T *w, vb_span *sp) {
    const double a = m[0], d = m[3], bx = m[1] * (double)y + m[2], by = m[4] * (double)y + m[5];
    const double wi = (double)(W - 1), hi = (double)(H - 1);
    double x0 = 0.0, x1 = (double)Wo;
    vb_interval(a, bx, -1.0, (double)W, &x0, &x1);
    vb_interval(d, by, -1.0, (double)H, &x0, &x1);
    sp->xa = (int64_t)x0;
    sp->xb = (int64_t)x1;
    /* the interior run: an analytic guess, its ends then fixed column by column */
    vb_interval(a, bx, 0.0, wi, &x0, &x1);
    vb_interval(d, by, 0.0, hi, &x0, &x1);
    int64_t i0 = (int64_t)x0, i1 = (int64_t)x1;
    while (i0 < i1 && !vb_inner(a * (double)i0 + bx, d * (double)i0 + by, wi, hi)) ++i0;
    while (i1 > i0 && !vb_inner(a * (double)(i1 - 1) + bx, d * (double)(i1 - 1) + by, wi, hi)) --i1;
    /* Written for the auto-vectoriser (an int32 column converts to double in AVX2, branch-free
     * test): the same values as vb_inner and the formulas of edge(). Wo < 2^31 (the caller). */
    int bad = 0;
    VB_T *wys = w + Wo;
    for (int32_t x = (int32_t)i0; x < (int32_t)i1; ++x) {
        const double sx = a * (double)x + bx, sy = d * (double)x + by;
        bad |= !(sx >= 0.0) | !(sx < wi) | !(sy >= 0.0) | !(sy < hi);
        const double fx = floor(sx), fy = floor(sy);
        off[x] = (int32_t)fy * (int32_t)W + (int32_t)fx;
        w[x] = (VB_T)(sx - fx);
        wys[x] = (VB_T)(sy - fy);
    }
    if (bad) i1 = i0; /* not one run (never seen): every column checks its neighbours */
    sp->xi0 = i0;
    sp->xi1 = i1;
}

/* The interior run [x0, x1) of one output row of an RGB image: the loop below for C = 3,
 * with every plane's base in a register (no inner channel loop: fewer instructions a pixel). */
static void VB(rgb)(const VB_T *q, VB_T *o, const int32_t *of, const VB_T *wxs, const VB_T *wys,
                    int64_t x0, int64_t x1, int64_t W, int64_t plane, int64_t oplane) {
    const VB_T *q1 = q + plane, *q2 = q1 + plane;
    const VB_T *qw = q + W, *q1w = q1 + W, *q2w = q2 + W;
    VB_T *o1 = o + oplane, *o2 = o1 + oplane;
    for (int64_t x = x0; x < x1; ++x) {
        const int64_t k = of[x];
        const VB_T wx = wxs[x], wy = wys[x];
        const VB_T a0 = (1 - wx) * (1 - wy), a1 = wx * (1 - wy);
        const VB_T a2 = (1 - wx) * wy, a3 = wx * wy;
        o[x] = q[k] * a0 + q[k + 1] * a1 + qw[k] * a2 + qw[k + 1] * a3;
        o1[x] = q1[k] * a0 + q1[k + 1] * a1 + q1w[k] * a2 + q1w[k + 1] * a3;
        o2[x] = q2[k] * a0 + q2[k + 1] * a1 + q2w[k] * a2 + q2w[k + 1] * a3;
    }
}

/* Rows [y0, y1) of images [n0, n1) of img (N, C, H, W) into out (N, C, Ho, Wo). m holds one
 * inverse matrix (nm = 1: shared) or one per image. Scratch for rows = y1 - y0: off (rows * Wo),
 * w (2 * rows * Wo), spans (rows). */
void VB(vb_warp_zeros)(const VB_T *img, VB_T *out, int64_t C, int64_t H, int64_t W, int64_t Ho,
                       int64_t Wo, const double *m, int64_t nm, int64_t n0, int64_t n1,
                       int64_t y0, int64_t y1, int32_t *off, VB_T *w, vb_span *spans) {
    const int64_t plane = H * W, oplane = Ho * Wo, rows = y1 - y0;
    for (int64_t n = n0; n < n1; ++n) {
        const double *mn = m + 6 * (nm > 1 ? n : 0);
        if (n == n0 || nm > 1)
            for (int64_t r = 0; r < rows; ++r)
                VB(plan)(mn, y0 + r, H, W, Wo, off + r * Wo, w + 2 * r * Wo, spans + r);
        const VB_T *q = img + n * C * plane;
        for (int64_t r = 0; r < rows; ++r) {
            const int32_t *of = off + r * Wo;
            const VB_T *wxs = w + 2 * r * Wo, *wys = wxs + Wo;
            const vb_span s = spans[r];
            VB_T *o = out + n * C * oplane + (y0 + r) * Wo;
            for (int64_t c = 0; c < C; ++c) {
                memset(o + c * oplane, 0, (size_t)s.xa * sizeof(VB_T));
                memset(o + c * oplane + s.xb, 0, (size_t)(Wo - s.xb) * sizeof(VB_T));
                VB(edge)(q + c * plane, o + c * oplane, mn, y0 + r, s.xa, s.xi0, H, W);
                VB(edge)(q + c * plane, o + c * oplane, mn, y0 + r, s.xi1, s.xb, H, W);
            }
            /* the interior run, all channels of a column together */
            if (C == 3) {
                VB(rgb)(q, o, of, wxs, wys, s.xi0, s.xi1, W, plane, oplane);
                continue;
            }
            for (int64_t x = s.xi0; x < s.xi1; ++x) {
                const VB_T *p = q + of[x];
                const VB_T wx = wxs[x], wy = wys[x];
                const VB_T a0 = (1 - wx) * (1 - wy), a1 = wx * (1 - wy);
                const VB_T a2 = (1 - wx) * wy, a3 = wx * wy;
                int64_t c = 0;
                for (; c + 3 <= C; c += 3, p += 3 * plane) {
                    const VB_T *p1 = p + plane, *p2 = p1 + plane;
                    o[c * oplane + x] = p[0] * a0 + p[1] * a1 + p[W] * a2 + p[W + 1] * a3;
                    o[(c + 1) * oplane + x] = p1[0] * a0 + p1[1] * a1 + p1[W] * a2 + p1[W + 1] * a3;
                    o[(c + 2) * oplane + x] = p2[0] * a0 + p2[1] * a1 + p2[W] * a2 + p2[W + 1] * a3;
                }
                for (; c < C; ++c, p += plane)
                    o[c * oplane + x] = p[0] * a0 + p[1] * a1 + p[W] * a2 + p[W + 1] * a3;
            }
        }
    }
}

/* vb_warp_zeros over parts [start, stop) on up to `threads` threads of the team
 * (_native_team.h). A part is a block of `block_rows` output rows of every image (nm = 1) or
 * of one image (part = image * blocks + block), with its scratch from vb_scratch. Returns the
 * number of parts that found no memory for their scratch. */
typedef struct {
    const VB_T *img;
    VB_T *out;
    int64_t C, H, W, Ho, Wo, nm, N, block_rows, blocks;
    const double *m;
} VB(vb_warp_job);

static int VB(vb_warp_part)(void *ctx, int64_t part) {
    const VB(vb_warp_job) *j = (const VB(vb_warp_job) *)ctx;
    const int64_t n0 = j->nm > 1 ? part / j->blocks : 0, n1 = j->nm > 1 ? n0 + 1 : j->N;
    const int64_t y0 = (part % j->blocks) * j->block_rows;
    const int64_t y1 = y0 + j->block_rows < j->Ho ? y0 + j->block_rows : j->Ho;
    const size_t rows = (size_t)(y1 - y0), align = 64;
    const size_t off_bytes = (rows * (size_t)j->Wo * sizeof(int32_t) + align - 1) / align * align;
    const size_t w_bytes = (2 * rows * (size_t)j->Wo * sizeof(VB_T) + align - 1) / align * align;
    char *scratch = (char *)vb_scratch(off_bytes + w_bytes + rows * sizeof(vb_span));
    if (!scratch) return 1;
    VB(vb_warp_zeros)(j->img, j->out, j->C, j->H, j->W, j->Ho, j->Wo, j->m, j->nm, n0, n1, y0, y1,
                      (int32_t *)scratch, (VB_T *)(scratch + off_bytes),
                      (vb_span *)(scratch + off_bytes + w_bytes));
    vb_scratch_done();
    return 0;
}

int64_t VB(vb_warp_zeros_parts)(const VB_T *img, VB_T *out, int64_t C, int64_t H, int64_t W,
                                int64_t Ho, int64_t Wo, const double *m, int64_t nm, int64_t N,
                                int64_t block_rows, int64_t start, int64_t stop,
                                int64_t threads) {
    const int64_t blocks = (Ho + block_rows - 1) / block_rows;
    VB(vb_warp_job) job = {img, out, C, H, W, Ho, Wo, nm, N, block_rows, blocks, m};
    return vb_run_parts(VB(vb_warp_part), &job, start, stop, threads);
}

#endif
