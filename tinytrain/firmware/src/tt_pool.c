/** Pooling kernels: portable scalar path (2x2 max pooling of stride 2 said apart), and a
 * Cortex-M DSP path (TT_HAVE_DSP) for that 2x2 pooling, four channels per word, same bits. */
#include <string.h>
#include "tt_pool.h"
#include "tt_dsp.h"

static int8_t round_s8(int64_t acc, int32_t s, tt_stats *st)
{
    int64_t r = tt_rshift_round_s64(acc, s);
    if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
    return tt_sat_s8(r);
}

/* Flat index h*W + w of the first maximum (strict > row-major scan) of channel c of the
 * window whose top-left corner is (h0, w0). */
static int32_t argmax(const int8_t *x, int32_t W, int32_t C, int32_t h0, int32_t w0,
                      int32_t c, int32_t kh, int32_t kw)
{
    int32_t i, j, best_pos = h0 * W + w0;
    int8_t best = x[best_pos * C + c];
    for (i = 0; i < kh; i++) {
        for (j = 0; j < kw; j++) {
            const int32_t pos = (h0 + i) * W + w0 + j;
            if (x[pos * C + c] > best) {
                best = x[pos * C + c];
                best_pos = pos;
            }
        }
    }
    return best_pos;
}

/* The window of p as locals, and the output size. */
#define TT_POOL_DIMS(p)                                                                      \
    const int32_t H = (p)->H, W = (p)->W, C = (p)->C, kh = (p)->kh, kw = (p)->kw;            \
    const int32_t sh = (p)->stride_h, sw = (p)->stride_w;                                    \
    const int32_t OH = TT_POOL_OUT(H, kh, sh), OW = TT_POOL_OUT(W, kw, sw)

/* A 1-D window (or the global one: one window of all P positions) as a 2-D one with H = 1. */
static tt_pool_params tt_pool_as_2d(int32_t L, int32_t C, int32_t k, int32_t s, int32_t mult,
                                    int32_t shift)
{
    tt_pool_params q;
    q.H = 1; q.W = L; q.C = C; q.kh = 1; q.kw = k; q.stride_h = 1; q.stride_w = s;
    q.mult = mult; q.shift = shift;
    return q;
}

/* 2x2 windows of stride 2 (the common pooling), one output row of all channels at a time: the
 * four inputs of channel c are r0[c], r0[C + c], r1[c], r1[C + c] in row-major window order.
 * Backward writes e to the first maximum of that order (strict >), as argmax; the other three
 * inputs get 0 (every input lies in at most one window). */
static void maxpool_2x2_fwd(const int8_t *x, int32_t W, int32_t C, int32_t OH, int32_t OW, int8_t *y)
{
    int32_t oh, ow, c;
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
            const int8_t *r0 = x + ((2 * oh) * W + 2 * ow) * C, *r1 = r0 + W * C;
            c = 0;
#if TT_HAVE_DSP
            /* SSUB8(v, t) sets GE where v >= t, SEL keeps v there and takes t elsewhere */
            for (; c + 4 <= C; c += 4, y += 4) {
                uint32_t v = tt_ld_s8x4(r0 + c), t = tt_ld_s8x4(r0 + C + c);
                (void)__ssub8((int32_t)v, (int32_t)t);
                v = __sel(v, t);
                t = tt_ld_s8x4(r1 + c);
                (void)__ssub8((int32_t)v, (int32_t)t);
                v = __sel(v, t);
                t = tt_ld_s8x4(r1 + C + c);
                (void)__ssub8((int32_t)v, (int32_t)t);
                tt_st_s8x4(y, __sel(v, t));
            }
#endif
            for (; c < C; c++) {
                int32_t v = r0[c], t = r0[C + c];
                if (t > v) v = t;
                t = r1[c];
                if (t > v) v = t;
                t = r1[C + c];
                if (t > v) v = t;
                *y++ = (int8_t)v;
            }
        }
}

static void maxpool_2x2_bwd(const int8_t *e, const int8_t *x, int32_t W, int32_t C, int32_t OH,
                            int32_t OW, int8_t *dx)
{
    int32_t oh, ow, c;
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++) {
            const int32_t o = ((2 * oh) * W + 2 * ow) * C;
            const int8_t *r0 = x + o, *r1 = r0 + W * C;
            int8_t *d0 = dx + o, *d1 = d0 + W * C;
            c = 0;
#if TT_HAVE_DSP
            /* m = the lanes' maximum (SSUB8 + SEL as in the forward). The first input equal to m
             * in window order is the first maximum: SSUB8(a, m) sets GE exactly where a == m,
             * SEL gives e there and 0 elsewhere, and r (the e not yet placed) keeps the others */
            for (; c + 4 <= C; c += 4, e += 4) {
                const uint32_t a = tt_ld_s8x4(r0 + c), b = tt_ld_s8x4(r0 + C + c);
                const uint32_t u = tt_ld_s8x4(r1 + c), v = tt_ld_s8x4(r1 + C + c);
                uint32_t m, r = tt_ld_s8x4(e);
                (void)__ssub8((int32_t)a, (int32_t)b);
                m = __sel(a, b);
                (void)__ssub8((int32_t)m, (int32_t)u);
                m = __sel(m, u);
                (void)__ssub8((int32_t)m, (int32_t)v);
                m = __sel(m, v);
                (void)__ssub8((int32_t)a, (int32_t)m);
                tt_st_s8x4(d0 + c, __sel(r, 0));
                r = __sel(0, r);
                (void)__ssub8((int32_t)b, (int32_t)m);
                tt_st_s8x4(d0 + C + c, __sel(r, 0));
                r = __sel(0, r);
                (void)__ssub8((int32_t)u, (int32_t)m);
                tt_st_s8x4(d1 + c, __sel(r, 0));
                tt_st_s8x4(d1 + C + c, __sel(0, r));
            }
#endif
            for (; c < C; c++) {
                const int32_t a = r0[c], b = r0[C + c], u = r1[c], v = r1[C + c];
                int32_t best = a, k = 0;
                if (b > best) { best = b; k = 1; }
                if (u > best) { best = u; k = 2; }
                if (v > best) k = 3;
                d0[c] = k == 0 ? *e : 0;
                d0[C + c] = k == 1 ? *e : 0;
                d1[c] = k == 2 ? *e : 0;
                d1[C + c] = k == 3 ? *e : 0;
                e++;
            }
        }
}

int32_t tt_maxpool2d_fwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    TT_POOL_DIMS(p);
    int32_t oh, ow, c;
    (void)ctx; (void)H;
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2) {
        maxpool_2x2_fwd(x, W, C, OH, OW, y);
        return ex;
    }
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++)
            for (c = 0; c < C; c++)
                *y++ = x[argmax(x, W, C, oh * sh, ow * sw, c, kh, kw) * C + c];
    return ex;
}

int32_t tt_maxpool2d_bwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx)
{
    TT_POOL_DIMS(p);
    const int32_t n = H * W * C;
    int64_t *scratch;
    int32_t oh, ow, c, i;
    if (kh == 2 && kw == 2 && sh == 2 && sw == 2) {
        if (2 * OH < H || 2 * OW < W) memset(dx, 0, (size_t)n); /* rows / columns no window reads */
        maxpool_2x2_bwd(e, x, W, C, OH, OW, dx);
        return ee;
    }
    if (sh >= kh && sw >= kw) {
        /* each input in at most one window: |dx_acc| <= 127, requant shift 0 */
        memset(dx, 0, (size_t)n);
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++)
                for (c = 0; c < C; c++)
                    dx[argmax(x, W, C, oh * sh, ow * sw, c, kh, kw) * C + c] = *e++;
        return ee;
    }
    scratch = ctx->scratch;
    for (i = 0; i < n; i++) scratch[i] = 0;
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++)
            for (c = 0; c < C; c++)
                scratch[argmax(x, W, C, oh * sh, ow * sw, c, kh, kw) * C + c] += *e++;
    return ee + tt_requant_s8_from_s64(scratch, n, dx, ctx->stats);
}

int32_t tt_maxpool1d_fwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    const tt_pool_params q = tt_pool_as_2d(p->L, p->C, p->k, p->stride, 0, 0);
    return tt_maxpool2d_fwd_s8(ctx, &q, x, ex, y);
}

int32_t tt_maxpool1d_bwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx)
{
    const tt_pool_params q = tt_pool_as_2d(p->L, p->C, p->k, p->stride, 0, 0);
    return tt_maxpool2d_bwd_s8(ctx, &q, e, ee, x, dx);
}

/* mult * (sum of channel c over the window at (h0, w0)); |sum| <= 127 P < 2^31. */
static int64_t window_acc(const int8_t *x, int32_t W, int32_t C, int32_t h0, int32_t w0,
                          int32_t c, int32_t kh, int32_t kw, int32_t mult)
{
    int32_t i, j, t = 0;
    for (i = 0; i < kh; i++)
        for (j = 0; j < kw; j++) t += x[((h0 + i) * W + w0 + j) * C + c];
    return (int64_t)t * mult;
}

int32_t tt_avgpool2d_fwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    TT_POOL_DIMS(p);
    const int32_t mult = p->mult;
    tt_stats *st = ctx->stats;
    int32_t oh, ow, c, s;
    (void)H;
    uint64_t m = 0;
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++)
            for (c = 0; c < C; c++) {
                uint64_t a = tt_abs_u64(window_acc(x, W, C, oh * sh, ow * sw, c, kh, kw, mult));
                if (a > m) m = a;
            }
    s = tt_requant_shift(m, 8);
    for (oh = 0; oh < OH; oh++)
        for (ow = 0; ow < OW; ow++)
            for (c = 0; c < C; c++)
                *y++ = round_s8(window_acc(x, W, C, oh * sh, ow * sw, c, kh, kw, mult), s, st);
    return ex - p->shift + s;
}

/* [*lo, *hi): the windows (size k, stride s, n_out of them) that contain index h. */
static void cover(int32_t h, int32_t k, int32_t s, int32_t n_out, int32_t *lo, int32_t *hi)
{
    *lo = h < k ? 0 : (h - k + s) / s;
    *hi = h / s + 1 < n_out ? h / s + 1 : n_out;
}

/* mult * (sum of e[oh][ow][c] over the windows covering input (h, w)). */
static int64_t spread_acc(const int8_t *e, int32_t OH, int32_t OW, int32_t C, int32_t h,
                          int32_t w, int32_t c, int32_t kh, int32_t kw, int32_t sh,
                          int32_t sw, int32_t mult)
{
    int32_t oh, ow, lo_h, hi_h, lo_w, hi_w, t = 0;
    cover(h, kh, sh, OH, &lo_h, &hi_h);
    cover(w, kw, sw, OW, &lo_w, &hi_w);
    for (oh = lo_h; oh < hi_h; oh++)
        for (ow = lo_w; ow < hi_w; ow++) t += e[(oh * OW + ow) * C + c];
    return (int64_t)t * mult;
}

int32_t tt_avgpool2d_bwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    TT_POOL_DIMS(p);
    const int32_t mult = p->mult;
    tt_stats *st = ctx->stats;
    int32_t h, w, c, s;
    uint64_t m = 0;
    for (h = 0; h < H; h++)
        for (w = 0; w < W; w++)
            for (c = 0; c < C; c++) {
                uint64_t a = tt_abs_u64(spread_acc(e, OH, OW, C, h, w, c, kh, kw, sh, sw, mult));
                if (a > m) m = a;
            }
    s = tt_requant_shift(m, 8);
    for (h = 0; h < H; h++)
        for (w = 0; w < W; w++)
            for (c = 0; c < C; c++)
                *dx++ = round_s8(spread_acc(e, OH, OW, C, h, w, c, kh, kw, sh, sw, mult), s, st);
    return ee - p->shift + s;
}

int32_t tt_avgpool1d_fwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    const tt_pool_params q = tt_pool_as_2d(p->L, p->C, p->k, p->stride, p->mult, p->shift);
    return tt_avgpool2d_fwd_s8(ctx, &q, x, ex, y);
}

int32_t tt_avgpool1d_bwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    const tt_pool_params q = tt_pool_as_2d(p->L, p->C, p->k, p->stride, p->mult, p->shift);
    return tt_avgpool2d_bwd_s8(ctx, &q, e, ee, dx);
}

int32_t tt_global_avgpool_fwd_s8(const tt_ctx *ctx, const tt_global_pool_params *p,
                                 const int8_t *x, int32_t ex, int8_t *y)
{
    const tt_pool_params q = tt_pool_as_2d(p->P, p->C, p->P, 1, p->mult, p->shift);
    return tt_avgpool2d_fwd_s8(ctx, &q, x, ex, y);
}

int32_t tt_global_avgpool_bwd_s8(const tt_ctx *ctx, const tt_global_pool_params *p,
                                 const int8_t *e, int32_t ee, int8_t *dx)
{
    const tt_pool_params q = tt_pool_as_2d(p->P, p->C, p->P, 1, p->mult, p->shift);
    return tt_avgpool2d_bwd_s8(ctx, &q, e, ee, dx);
}
