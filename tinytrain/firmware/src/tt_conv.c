/** Convolution kernels: portable scalar path.
 *
 * For an output row oh the input rows are ih = oh*sh - pt + kh; only kh in [kh0, kh1) hit
 * the input (the rest read zero padding and contribute nothing), likewise kw in [kw0, kw1).
 * In channels-last layout the valid (kw, ci) run of one kernel row is contiguous in both x
 * and w, so every inner loop is a plain dot product or axpy over (kw1 - kw0) * Cin values. */
#include "tt_conv.h"

#include <string.h>

/* Clip the kernel taps [0, K) to those whose input index i0 + k lies in [0, n); the range
 * is empty (k1 == k0) when the whole window lies in the padding. */
static void tt_conv_taps(int32_t i0, int32_t K, int32_t n, int32_t *k0, int32_t *k1)
{
    *k0 = i0 < 0 ? -i0 : 0;
    *k1 = n - i0 < K ? n - i0 : K;
    if (*k1 < *k0) *k1 = *k0;
}

/* The dims of p as locals, named as in the loops below (kh, kw there are tap indices). */
#define TT_CONV_DIMS(p)                                                                     \
    const int32_t H = (p)->H, W = (p)->W, Cin = (p)->Cin, Cout = (p)->Cout, KH = (p)->kh;   \
    const int32_t KW = (p)->kw, sh = (p)->stride_h, sw = (p)->stride_w, pt = (p)->pad_h;    \
    const int32_t pl = (p)->pad_w, OH = (p)->Ho, OW = (p)->Wo

int32_t tt_conv2d_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x, int32_t ex,
                         int8_t *y)
{
    TT_CONV_DIMS(p);
    const int16_t *w = p->w;
    const int32_t *b = p->b;
    const int32_t eb = p->eb, ea = ex + p->ew;
    int64_t *scratch = ctx->scratch, *acc = scratch;
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                int64_t a = tt_align(b[co], eb, ea);
                for (kh = kh0; kh < kh_end; kh++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int16_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) a += (int32_t)xp[j] * (int32_t)wp[j];
                }
                *acc++ = a;
            }
        }
    }
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * Cout, y, ctx->stats);
}

int32_t tt_conv2d_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e, int32_t ee,
                         int8_t *dx)
{
    TT_CONV_DIMS(p);
    const int16_t *w = p->w;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * Cin));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * Cout;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                const int32_t ev = ep[co];
                if (ev == 0) continue;
                for (kh = kh0; kh < kh_end; kh++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    const int16_t *wp = w + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) dp[j] += ev * (int32_t)wp[j];
                }
            }
        }
    }
    return ee + p->ew + tt_requant_s8_from_s64(scratch, H * W * Cin, dx, ctx->stats);
}

void tt_conv2d_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    TT_CONV_DIMS(p);
    /* int32 sums: OH*OW <= TT_CONV_GRAD_MAX_POSITIONS terms of |e*x| <= 127*127 each. */
    int32_t oh, ow, co, kh, j, kh0, kh1, kw0, kw1, kh_end;
    memset(gw, 0, sizeof(int32_t) * (size_t)(Cout * KH * KW * Cin));
    memset(gb, 0, sizeof(int32_t) * (size_t)Cout);
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * Cout;
            int32_t n;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            n = (kw1 - kw0) * Cin;
            kh_end = n > 0 ? kh1 : kh0; /* no pointer into the padding when n == 0 */
            for (co = 0; co < Cout; co++) {
                const int32_t ev = ep[co];
                gb[co] += ev;
                if (ev == 0) continue;
                for (kh = kh0; kh < kh_end; kh++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw0) * Cin;
                    int32_t *gp = gw + ((co * KH + kh) * KW + kw0) * Cin;
                    for (j = 0; j < n; j++) gp[j] += ev * (int32_t)xp[j];
                }
            }
        }
    }
}

int32_t tt_depthwise_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin, eb = p->eb, ea = ex + p->ew;
    const int16_t *w = p->w;
    const int32_t *b = p->b;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            int64_t *acc = scratch + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (c = 0; c < C; c++) acc[c] = tt_align(b[c], eb, ea);
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int16_t *wp = w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) acc[c] += (int32_t)xp[c] * (int32_t)wp[c];
                }
            }
        }
    }
    (void)Cout;
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * C, y, ctx->stats);
}

int32_t tt_depthwise_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin;
    const int16_t *w = p->w;
    int64_t *scratch = ctx->scratch;
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    memset(scratch, 0, sizeof(int64_t) * (size_t)(H * W * C));
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    int64_t *dp = scratch + ((ih0 + kh) * W + iw0 + kw) * C;
                    const int16_t *wp = w + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) dp[c] += (int32_t)ep[c] * (int32_t)wp[c];
                }
            }
        }
    }
    (void)Cout;
    return ee + p->ew + tt_requant_s8_from_s64(scratch, H * W * C, dx, ctx->stats);
}

void tt_depthwise_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                           int32_t *gb)
{
    TT_CONV_DIMS(p);
    const int32_t C = Cin;
    /* int32 sums: OH*OW <= TT_CONV_GRAD_MAX_POSITIONS terms of |e*x| <= 127*127 each. */
    int32_t oh, ow, kh, kw, c, kh0, kh1, kw0, kw1;
    (void)Cout;
    memset(gw, 0, sizeof(int32_t) * (size_t)(KH * KW * C));
    memset(gb, 0, sizeof(int32_t) * (size_t)C);
    for (oh = 0; oh < OH; oh++) {
        const int32_t ih0 = oh * sh - pt;
        tt_conv_taps(ih0, KH, H, &kh0, &kh1);
        for (ow = 0; ow < OW; ow++) {
            const int32_t iw0 = ow * sw - pl;
            const int8_t *ep = e + (oh * OW + ow) * C;
            tt_conv_taps(iw0, KW, W, &kw0, &kw1);
            for (c = 0; c < C; c++) gb[c] += ep[c];
            for (kh = kh0; kh < kh1; kh++) {
                for (kw = kw0; kw < kw1; kw++) {
                    const int8_t *xp = x + ((ih0 + kh) * W + iw0 + kw) * C;
                    int32_t *gp = gw + (kh * KW + kw) * C;
                    for (c = 0; c < C; c++) gp[c] += (int32_t)ep[c] * (int32_t)xp[c];
                }
            }
        }
    }
}

/* Conv1d is Conv2d with H = kh = Ho = 1: same memory layout, no vertical stride or padding. */
static tt_conv_params tt_conv1d_as_2d(const tt_conv1d_params *p)
{
    tt_conv_params q;
    q.H = 1; q.W = p->L; q.Cin = p->Cin; q.Cout = p->Cout;
    q.kh = 1; q.kw = p->k; q.stride_h = 1; q.stride_w = p->stride; q.pad_h = 0; q.pad_w = p->pad;
    q.Ho = 1; q.Wo = p->Lo;
    q.w = p->w; q.ew = p->ew; q.b = p->b; q.eb = p->eb;
    return q;
}

int32_t tt_conv1d_fwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *x,
                         int32_t ex, int8_t *y)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    return tt_conv2d_fwd_s8(ctx, &q, x, ex, y);
}

int32_t tt_conv1d_bwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *e,
                         int32_t ee, int8_t *dx)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    return tt_conv2d_bwd_s8(ctx, &q, e, ee, dx);
}

void tt_conv1d_grad_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    const tt_conv_params q = tt_conv1d_as_2d(p);
    tt_conv2d_grad_s32(&q, e, x, gw, gb);
}
