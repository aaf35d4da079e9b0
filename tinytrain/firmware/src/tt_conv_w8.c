/** Convolution kernels with int8 weights: portable scalar path, the loops of tt_conv.c with
 * int8 weights (same taps, same exact int64 sums, same requantization). */
#include "tt_conv_w8.h"
#include "tt_conv.h"

#include <string.h>

/* the kernel taps [k0, k1) of [0, K) whose input index i0 + k lies in [0, n) (as tt_conv.c) */
static void tt_conv_w8_taps(int32_t i0, int32_t K, int32_t n, int32_t *k0, int32_t *k1)
{
    *k0 = i0 < 0 ? -i0 : 0;
    *k1 = n - i0 < K ? n - i0 : K;
    if (*k1 < *k0) *k1 = *k0;
}

static int32_t conv2d_fwd_w8(const int8_t *x, int32_t ex, const int8_t *w, int32_t ew,
                             const int32_t *b, int32_t eb, int32_t H, int32_t W, int32_t Cin,
                             int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                             int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                             int64_t *scratch, int8_t *y, tt_stats *st)
{
    const int32_t ea = ex + ew;
    int64_t *acc = scratch;
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_w8_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int32_t n;
            tt_conv_w8_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0;
            for (co = 0; co < Cout; co++) {
                int64_t a = tt_align(b[co], eb, ea);
                for (kh = kh0; kh < kh_end; kh++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int8_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) a += (int32_t)xp[j] * (int32_t)wp[j];
                }
                *acc++ = a;
            }
        }
    }
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * Cout, y, st);
}

static int32_t conv2d_bwd_w8(const int8_t *e, int32_t ee, const int8_t *w, int32_t ew,
                             int32_t H, int32_t W, int32_t Cin, int32_t Cout, int32_t KH,
                             int32_t KW, int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                             int32_t OH, int32_t OW, int64_t *scratch, int8_t *dx, tt_stats *st)
{
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * Cin));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_w8_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * Cout;
            int32_t n;
            tt_conv_w8_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0;
            for (co = 0; co < Cout; co++) {
                const int32_t ev = ep[co];
                if (ev == 0) continue;
                for (kh = kh0; kh < kh_end; kh++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int8_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) dp[j] += ev * (int32_t)wp[j];
                }
            }
        }
    }
    return ee + ew + tt_requant_s8_from_s64(scratch, H * W * Cin, dx, st);
}

#define TT_CONV2D_W8_ARGS(p) (p)->H, (p)->W, (p)->Cin, (p)->Cout, (p)->kh, (p)->kw, (p)->stride_h, \
    (p)->stride_w, (p)->pad_h, (p)->pad_w, (p)->Ho, (p)->Wo
#define TT_CONV1D_W8_ARGS(p) 1, (p)->L, (p)->Cin, (p)->Cout, 1, (p)->k, 1, (p)->stride, 0, (p)->pad, 1, \
    (p)->Lo

/* tt_conv.h's params of the same layer without weights (its gradient kernels do not read them) */
static tt_conv_params tt_conv_w8_dims(const tt_conv_w8_params *p)
{
    tt_conv_params q;
    q.H = p->H; q.W = p->W; q.Cin = p->Cin; q.Cout = p->Cout; q.kh = p->kh; q.kw = p->kw;
    q.stride_h = p->stride_h; q.stride_w = p->stride_w; q.pad_h = p->pad_h; q.pad_w = p->pad_w;
    q.Ho = p->Ho; q.Wo = p->Wo; q.w = 0; q.ew = p->ew; q.b = p->b; q.eb = p->eb;
    return q;
}

int32_t tt_conv2d_fwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    return conv2d_fwd_w8(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV2D_W8_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv2d_bwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    return conv2d_bwd_w8(e, ee, p->w, p->ew, TT_CONV2D_W8_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv2d_grad_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                           int32_t *gw, int32_t *gb)
{
    const tt_conv_params q = tt_conv_w8_dims(p);
    tt_conv2d_grad_s32(&q, e, x, gw, gb);
}

int32_t tt_conv1d_fwd_s8_w8(const tt_ctx *ctx, const tt_conv1d_w8_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    return conv2d_fwd_w8(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV1D_W8_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv1d_bwd_s8_w8(const tt_ctx *ctx, const tt_conv1d_w8_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    return conv2d_bwd_w8(e, ee, p->w, p->ew, TT_CONV1D_W8_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv1d_grad_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, const int8_t *x,
                           int32_t *gw, int32_t *gb)
{
    const tt_conv1d_params q = {p->L, p->Cin, p->Cout, p->k, p->stride, p->pad, p->Lo, 0, p->ew, p->b, p->eb};
    tt_conv1d_grad_s32(&q, e, x, gw, gb);
}

int32_t tt_depthwise_fwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *x,
                               int32_t ex, int8_t *y)
{
    const int32_t H = p->H, W = p->W, C = p->Cin, KH = p->kh, KW = p->kw, sh = p->stride_h;
    const int32_t sw = p->stride_w, pt = p->pad_h, pl = p->pad_w, OH = p->Ho, OW = p->Wo;
    const int32_t eb = p->eb, ea = ex + p->ew;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_w8_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int64_t *acc = scratch + (oh * OW + ow) * C;
            tt_conv_w8_taps(iw0, KW, W, &kw0, &kw1);
            for (c = 0; c < C; c++) acc[c] = tt_align(p->b[c], eb, ea);
            for (kh = kh0; kh < kh1; kh++)
                for (kw = kw0; kw < kw1; kw++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int8_t *wp = p->w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) acc[c] += (int32_t)xp[c] * (int32_t)wp[c];
                }
        }
    }
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * C, y, ctx->stats);
}

int32_t tt_depthwise_bwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *e,
                               int32_t ee, int8_t *dx)
{
    const int32_t H = p->H, W = p->W, C = p->Cin, KH = p->kh, KW = p->kw, sh = p->stride_h;
    const int32_t sw = p->stride_w, pt = p->pad_h, pl = p->pad_w, OH = p->Ho, OW = p->Wo;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * C));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_w8_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * C;
            tt_conv_w8_taps(iw0, KW, W, &kw0, &kw1);
            for (kh = kh0; kh < kh1; kh++)
                for (kw = kw0; kw < kw1; kw++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int8_t *wp = p->w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) dp[c] += (int32_t)ep[c] * (int32_t)wp[c];
                }
        }
    }
    return ee + p->ew + tt_requant_s8_from_s64(scratch, H * W * C, dx, ctx->stats);
}

void tt_depthwise_grad_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                              int32_t *gw, int32_t *gb)
{
    const tt_conv_params q = tt_conv_w8_dims(p);
    tt_depthwise_grad_s32(&q, e, x, gw, gb);
}
