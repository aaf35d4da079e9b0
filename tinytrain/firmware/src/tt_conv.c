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

/* Conv2d on positional dims (tt_conv_params' fields in order: stride sh, sw; top / left padding
 * pt, pl), shared by the 2-D and the 1-D entry points at the end of this file. */
static int32_t conv2d_fwd(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
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
    return ea + tt_requant_s8_from_s64(scratch, OH * OW * Cout, y, st);
}

static int32_t conv2d_bwd(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                          int32_t H, int32_t W, int32_t Cin, int32_t Cout, int32_t KH, int32_t KW,
                          int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                          int64_t *scratch, int8_t *dx, tt_stats *st)
{
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
    return ee + ew + tt_requant_s8_from_s64(scratch, H * W * Cin, dx, st);
}

static void conv2d_grad(const int8_t *e, const int8_t *x, int32_t H, int32_t W, int32_t Cin,
                        int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                        int32_t pt, int32_t pl, int32_t OH, int32_t OW, int32_t *gw, int32_t *gb)
{
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

/* The dims of p as locals for the depthwise kernels, named as in the loops (kh, kw there are
 * tap indices). */
#define TT_CONV_DIMS(p)                                                                     \
    const int32_t H = (p)->H, W = (p)->W, Cin = (p)->Cin, Cout = (p)->Cout, KH = (p)->kh;   \
    const int32_t KW = (p)->kw, sh = (p)->stride_h, sw = (p)->stride_w, pt = (p)->pad_h;    \
    const int32_t pl = (p)->pad_w, OH = (p)->Ho, OW = (p)->Wo

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

/* The public entry points unpack their params into the positional bodies above, which Conv1d
 * shares (H = kh = Ho = 1). With two callers GCC keeps each body out of line with its dims in
 * argument registers and stack slots; unpacking the struct inside the loops cost W3's conv
 * forward 0.5 % more instructions on Cortex-M4 (bench/dev/profile_device.py). */
#define TT_CONV2D_ARGS(p) (p)->H, (p)->W, (p)->Cin, (p)->Cout, (p)->kh, (p)->kw, (p)->stride_h, \
    (p)->stride_w, (p)->pad_h, (p)->pad_w, (p)->Ho, (p)->Wo
#define TT_CONV1D_ARGS(p) 1, (p)->L, (p)->Cin, (p)->Cout, 1, (p)->k, 1, (p)->stride, 0, (p)->pad, 1, \
    (p)->Lo

int32_t tt_conv2d_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x, int32_t ex,
                         int8_t *y)
{
    return conv2d_fwd(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV2D_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv2d_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e, int32_t ee,
                         int8_t *dx)
{
    return conv2d_bwd(e, ee, p->w, p->ew, TT_CONV2D_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv2d_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    conv2d_grad(e, x, TT_CONV2D_ARGS(p), gw, gb);
}

int32_t tt_conv1d_fwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *x,
                         int32_t ex, int8_t *y)
{
    return conv2d_fwd(x, ex, p->w, p->ew, p->b, p->eb, TT_CONV1D_ARGS(p), ctx->scratch, y, ctx->stats);
}

int32_t tt_conv1d_bwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *e,
                         int32_t ee, int8_t *dx)
{
    return conv2d_bwd(e, ee, p->w, p->ew, TT_CONV1D_ARGS(p), ctx->scratch, dx, ctx->stats);
}

void tt_conv1d_grad_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb)
{
    conv2d_grad(e, x, TT_CONV1D_ARGS(p), gw, gb);
}
