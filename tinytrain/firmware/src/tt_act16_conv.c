/** int16 activations and errors: convolution and max pooling (tt_act16_conv.h), portable C. */
#include "tt_act16_conv.h"
#include "tt_act16.h"

/* the Conv2d view of a Conv1d: H = kh = Ho = 1 */
static tt_conv_params tt_conv1d_as_2d(const tt_conv1d_params *p)
{
    tt_conv_params q;
    q.H = 1; q.W = p->L; q.Cin = p->Cin; q.Cout = p->Cout;
    q.kh = 1; q.kw = p->k; q.stride_h = 1; q.stride_w = p->stride;
    q.pad_h = 0; q.pad_w = p->pad; q.Ho = 1; q.Wo = p->Lo;
    q.w = p->w; q.ew = p->ew; q.b = p->b; q.eb = p->eb;
    return q;
}

/* the taps of output index o along one axis that fall inside [0, n): t in [*t0, *t1) */
static inline void tt_taps(int32_t o, int32_t stride, int32_t pad, int32_t k, int32_t n, int32_t *t0,
                           int32_t *t1)
{
    const int32_t i0 = o * stride - pad;
    *t0 = i0 < 0 ? -i0 : 0;
    *t1 = n - i0 < k ? n - i0 : k;
}

/* depthwise: one filter per channel (w[kh][kw][C]); conv2d: all input channels (w[Cout][kh][kw][Cin]) */
static int32_t conv_fwd(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *x, int32_t ex,
                        int16_t *y, int depthwise)
{
    int64_t *acc = ctx->scratch;
    const int32_t Cin = p->Cin, Cout = p->Cout, ea = ex + p->ew;
    int32_t oh, ow, co, i = 0;
    for (oh = 0; oh < p->Ho; oh++) {
        int32_t h0, h1;
        tt_taps(oh, p->stride_h, p->pad_h, p->kh, p->H, &h0, &h1);
        for (ow = 0; ow < p->Wo; ow++) {
            int32_t w0, w1;
            tt_taps(ow, p->stride_w, p->pad_w, p->kw, p->W, &w0, &w1);
            for (co = 0; co < Cout; co++) {
                int64_t a = tt_align(p->b[co], p->eb, ea);
                for (int32_t kh = h0; kh < h1; kh++) {
                    const int32_t ih = oh * p->stride_h - p->pad_h + kh;
                    for (int32_t kw = w0; kw < w1; kw++) {
                        const int16_t *xv = x + (ih * p->W + ow * p->stride_w - p->pad_w + kw) * Cin;
                        if (depthwise) {
                            a += (int32_t)xv[co] * p->w[(kh * p->kw + kw) * Cin + co];
                        } else {
                            const int16_t *wv = p->w + ((co * p->kh + kh) * p->kw + kw) * Cin;
                            for (int32_t ci = 0; ci < Cin; ci++) a += (int32_t)xv[ci] * wv[ci];
                        }
                    }
                }
                acc[i++] = a;
            }
        }
    }
    return ea + tt_requant_s16_from_s64(acc, i, y, ctx->stats);
}

static int32_t conv_bwd(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *e, int32_t ee,
                        int16_t *dx, int depthwise)
{
    int64_t *acc = ctx->scratch;
    const int32_t Cin = p->Cin, Cout = p->Cout, n = p->H * p->W * Cin;
    int32_t oh, ow, co, i;
    for (i = 0; i < n; i++) acc[i] = 0;
    for (oh = 0; oh < p->Ho; oh++) {
        int32_t h0, h1;
        tt_taps(oh, p->stride_h, p->pad_h, p->kh, p->H, &h0, &h1);
        for (ow = 0; ow < p->Wo; ow++) {
            int32_t w0, w1;
            tt_taps(ow, p->stride_w, p->pad_w, p->kw, p->W, &w0, &w1);
            for (co = 0; co < Cout; co++) {
                const int32_t ev = *e++;
                if (ev == 0) continue;
                for (int32_t kh = h0; kh < h1; kh++) {
                    const int32_t ih = oh * p->stride_h - p->pad_h + kh;
                    for (int32_t kw = w0; kw < w1; kw++) {
                        int64_t *av = acc + (ih * p->W + ow * p->stride_w - p->pad_w + kw) * Cin;
                        if (depthwise) {
                            av[co] += ev * p->w[(kh * p->kw + kw) * Cin + co];
                        } else {
                            const int16_t *wv = p->w + ((co * p->kh + kh) * p->kw + kw) * Cin;
                            for (int32_t ci = 0; ci < Cin; ci++) av[ci] += ev * wv[ci];
                        }
                    }
                }
            }
        }
    }
    return ee + p->ew + tt_requant_s16_from_s64(acc, n, dx, ctx->stats);
}

/* the output indices o in [*o0, *o1) (of n_out) whose input index o stride - pad + t is in [0, n) */
static inline void tt_outs(int32_t t, int32_t stride, int32_t pad, int32_t n, int32_t n_out, int32_t *o0,
                           int32_t *o1)
{
    const int32_t lo = pad - t, hi = n + pad - t; /* o stride in [lo, hi) */
    *o0 = lo <= 0 ? 0 : (lo + stride - 1) / stride;
    *o1 = hi <= 0 ? 0 : (hi + stride - 1) / stride;
    if (*o1 > n_out) *o1 = n_out;
}

/* sum over the output positions of e[., ., c] x[tap (kh, kw), ci]: |.| <= Ho Wo 2^30, int64.
 * Indices in int32: every tensor holds fewer than 2^31 values. */
static int64_t conv_wsum(const tt_conv_params *p, const int16_t *e, int32_t Ce, int32_t c,
                         const int16_t *x, int32_t ci, int32_t kh, int32_t kw)
{
    const int32_t Cin = p->Cin, xstep = p->stride_w * Cin;
    int32_t oh0, oh1, ow0, ow1;
    int64_t a = 0;
    tt_outs(kh, p->stride_h, p->pad_h, p->H, p->Ho, &oh0, &oh1);
    tt_outs(kw, p->stride_w, p->pad_w, p->W, p->Wo, &ow0, &ow1);
    if (ow0 >= ow1) return 0; /* no output column reads this tap (the pointers below stay in range) */
    for (int32_t oh = oh0; oh < oh1; oh++) {
        const int32_t ih = oh * p->stride_h - p->pad_h + kh;
        const int16_t *ev = e + (oh * p->Wo + ow0) * Ce + c;
        const int16_t *xv = x + (ih * p->W + ow0 * p->stride_w - p->pad_w + kw) * Cin + ci;
        for (int32_t ow = ow0; ow < ow1; ow++, ev += Ce, xv += xstep) a += (int32_t)*ev * *xv;
    }
    return a;
}

static void conv_grad_b(const tt_conv_params *p, const int16_t *e, int32_t *gb)
{
    const int32_t C = p->Cout, n = p->Ho * p->Wo;
    for (int32_t c = 0; c < C; c++) gb[c] = 0;
    for (int32_t i = 0; i < n; i++)
        for (int32_t c = 0; c < C; c++) gb[c] += *e++; /* |sum| <= 32767 * 65538 < 2^31 */
}

int32_t tt_conv2d_fwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *x,
                          int32_t ex, int16_t *y)
{
    return conv_fwd(ctx, p, x, ex, y, 0);
}

int32_t tt_conv2d_bwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *e,
                          int32_t ee, int16_t *dx)
{
    return conv_bwd(ctx, p, e, ee, dx, 0);
}

void tt_conv2d_grad_w_chan_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x,
                                   int32_t g, int32_t co, int32_t nco, int32_t *gw)
{
    for (int32_t c = co; c < co + nco; c++)
        for (int32_t kh = 0; kh < p->kh; kh++)
            for (int32_t kw = 0; kw < p->kw; kw++)
                for (int32_t ci = 0; ci < p->Cin; ci++)
                    *gw++ = (int32_t)tt_rshift_round_s64(conv_wsum(p, e, p->Cout, c, x, ci, kh, kw), g);
}

void tt_conv2d_grad_b_s32_s16(const tt_conv_params *p, const int16_t *e, int32_t *gb)
{
    conv_grad_b(p, e, gb);
}

void tt_conv2d_grad_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x, int32_t g,
                            int32_t *gw, int32_t *gb)
{
    tt_conv2d_grad_w_chan_s32_s16(p, e, x, g, 0, p->Cout, gw);
    conv_grad_b(p, e, gb);
}

int32_t tt_depthwise_fwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *x,
                             int32_t ex, int16_t *y)
{
    return conv_fwd(ctx, p, x, ex, y, 1);
}

int32_t tt_depthwise_bwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *e,
                             int32_t ee, int16_t *dx)
{
    return conv_bwd(ctx, p, e, ee, dx, 1);
}

void tt_depthwise_grad_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x,
                               int32_t g, int32_t *gw, int32_t *gb)
{
    for (int32_t kh = 0; kh < p->kh; kh++)
        for (int32_t kw = 0; kw < p->kw; kw++)
            for (int32_t c = 0; c < p->Cin; c++)
                *gw++ = (int32_t)tt_rshift_round_s64(conv_wsum(p, e, p->Cin, c, x, c, kh, kw), g);
    conv_grad_b(p, e, gb);
}

int32_t tt_conv1d_fwd_s16(const tt_ctx *ctx, const tt_conv1d_params *p, const int16_t *x,
                          int32_t ex, int16_t *y)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    return conv_fwd(ctx, &q, x, ex, y, 0);
}

int32_t tt_conv1d_bwd_s16(const tt_ctx *ctx, const tt_conv1d_params *p, const int16_t *e,
                          int32_t ee, int16_t *dx)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    return conv_bwd(ctx, &q, e, ee, dx, 0);
}

void tt_conv1d_grad_w_chan_s32_s16(const tt_conv1d_params *p, const int16_t *e, const int16_t *x,
                                   int32_t g, int32_t co, int32_t nco, int32_t *gw)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    tt_conv2d_grad_w_chan_s32_s16(&q, e, x, g, co, nco, gw);
}

void tt_conv1d_grad_b_s32_s16(const tt_conv1d_params *p, const int16_t *e, int32_t *gb)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    conv_grad_b(&q, e, gb);
}

void tt_conv1d_grad_s32_s16(const tt_conv1d_params *p, const int16_t *e, const int16_t *x, int32_t g,
                            int32_t *gw, int32_t *gb)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    tt_conv2d_grad_s32_s16(&q, e, x, g, gw, gb);
}

/* flat index h W + w of the first maximum (strict > scan, row-major) of the window at (h0, w0) */
static int32_t argmax_s16(const int16_t *x, int32_t W, int32_t C, int32_t h0, int32_t w0, int32_t c,
                          int32_t kh, int32_t kw)
{
    int32_t best = h0 * W + w0;
    int16_t v = x[best * C + c];
    for (int32_t i = 0; i < kh; i++)
        for (int32_t j = 0; j < kw; j++) {
            const int32_t k = (h0 + i) * W + w0 + j;
            if (x[k * C + c] > v) {
                v = x[k * C + c];
                best = k;
            }
        }
    return best;
}

#define TT_POOL_OUT_HW(p) \
    const int32_t OH = TT_POOL_OUT((p)->H, (p)->kh, (p)->stride_h), OW = TT_POOL_OUT((p)->W, (p)->kw, (p)->stride_w)

int32_t tt_maxpool2d_fwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *x,
                             int32_t ex, int16_t *y)
{
    TT_POOL_OUT_HW(p);
    (void)ctx;
    for (int32_t oh = 0; oh < OH; oh++)
        for (int32_t ow = 0; ow < OW; ow++)
            for (int32_t c = 0; c < p->C; c++)
                *y++ = x[argmax_s16(x, p->W, p->C, oh * p->stride_h, ow * p->stride_w, c, p->kh, p->kw) * p->C + c];
    return ex;
}

int32_t tt_maxpool2d_bwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx)
{
    TT_POOL_OUT_HW(p);
    const int32_t n = p->H * p->W * p->C;
    int32_t oh, ow, c, i;
    if (p->stride_h >= p->kh && p->stride_w >= p->kw) {
        /* each input in at most one window: |dx_acc| <= 32767, requant shift 0 */
        for (i = 0; i < n; i++) dx[i] = 0;
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++)
                for (c = 0; c < p->C; c++)
                    dx[argmax_s16(x, p->W, p->C, oh * p->stride_h, ow * p->stride_w, c, p->kh, p->kw) * p->C + c] = *e++;
        return ee;
    }
    {
        int64_t *acc = ctx->scratch;
        for (i = 0; i < n; i++) acc[i] = 0;
        for (oh = 0; oh < OH; oh++)
            for (ow = 0; ow < OW; ow++)
                for (c = 0; c < p->C; c++)
                    acc[argmax_s16(x, p->W, p->C, oh * p->stride_h, ow * p->stride_w, c, p->kh, p->kw) * p->C + c] += *e++;
        return ee + tt_requant_s16_from_s64(acc, n, dx, ctx->stats);
    }
}

static tt_pool_params tt_pool1d_as_2d_s16(const tt_pool1d_params *p)
{
    tt_pool_params q;
    q.H = 1; q.W = p->L; q.C = p->C; q.kh = 1; q.kw = p->k; q.stride_h = 1; q.stride_w = p->stride;
    q.mult = p->mult; q.shift = p->shift;
    return q;
}

int32_t tt_maxpool1d_fwd_s16(const tt_ctx *ctx, const tt_pool1d_params *p, const int16_t *x,
                             int32_t ex, int16_t *y)
{
    const tt_pool_params q = tt_pool1d_as_2d_s16(p);
    return tt_maxpool2d_fwd_s16(ctx, &q, x, ex, y);
}

int32_t tt_maxpool1d_bwd_s16(const tt_ctx *ctx, const tt_pool1d_params *p, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx)
{
    const tt_pool_params q = tt_pool1d_as_2d_s16(p);
    return tt_maxpool2d_bwd_s16(ctx, &q, e, ee, x, dx);
}

/* AvgPool: the window sums (or the spread errors) in int64 in the scratch, times mult, then one
 * requantization (the reference's order: the sums are exact, so scatter and gather agree). */
int32_t tt_avgpool2d_fwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *x,
                             int32_t ex, int16_t *y)
{
    TT_POOL_OUT_HW(p);
    int64_t *acc = ctx->scratch;
    int32_t i = 0;
    for (int32_t oh = 0; oh < OH; oh++)
        for (int32_t ow = 0; ow < OW; ow++)
            for (int32_t c = 0; c < p->C; c++) {
                int64_t t = 0;
                for (int32_t kh = 0; kh < p->kh; kh++)
                    for (int32_t kw = 0; kw < p->kw; kw++)
                        t += x[((oh * p->stride_h + kh) * p->W + ow * p->stride_w + kw) * p->C + c];
                acc[i++] = t * p->mult;
            }
    return ex - p->shift + tt_requant_s16_from_s64(acc, i, y, ctx->stats);
}

int32_t tt_avgpool2d_bwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *e,
                             int32_t ee, int16_t *dx)
{
    TT_POOL_OUT_HW(p);
    const int32_t n = p->H * p->W * p->C;
    int64_t *acc = ctx->scratch;
    int32_t i;
    for (i = 0; i < n; i++) acc[i] = 0;
    for (int32_t oh = 0; oh < OH; oh++)
        for (int32_t ow = 0; ow < OW; ow++)
            for (int32_t c = 0; c < p->C; c++, e++)
                for (int32_t kh = 0; kh < p->kh; kh++)
                    for (int32_t kw = 0; kw < p->kw; kw++)
                        acc[((oh * p->stride_h + kh) * p->W + ow * p->stride_w + kw) * p->C + c] += *e;
    for (i = 0; i < n; i++) acc[i] *= p->mult;
    return ee - p->shift + tt_requant_s16_from_s64(acc, n, dx, ctx->stats);
}

int32_t tt_global_avgpool_fwd_s16(const tt_ctx *ctx, const tt_global_pool_params *p,
                                  const int16_t *x, int32_t ex, int16_t *y)
{
    tt_pool_params q;
    q.H = 1; q.W = p->P; q.C = p->C; q.kh = 1; q.kw = p->P; q.stride_h = 1; q.stride_w = 1;
    q.mult = p->mult; q.shift = p->shift;
    return tt_avgpool2d_fwd_s16(ctx, &q, x, ex, y);
}

int32_t tt_global_avgpool_bwd_s16(const tt_ctx *ctx, const tt_global_pool_params *p,
                                  const int16_t *e, int32_t ee, int16_t *dx)
{
    tt_pool_params q;
    q.H = 1; q.W = p->P; q.C = p->C; q.kh = 1; q.kw = p->P; q.stride_h = 1; q.stride_w = 1;
    q.mult = p->mult; q.shift = p->shift;
    return tt_avgpool2d_bwd_s16(ctx, &q, e, ee, dx);
}
