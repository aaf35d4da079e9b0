/** Convolution kernels: Conv2d, DepthwiseConv2d, Conv1d (see tinytrain/ops/conv2d.py,
 * depthwise.py, conv1d.py for the exact arithmetic). Channels-last, one sample.
 *
 * Static configuration (resolved at build time by tinytrain.ops.conv2d.geometry, held in
 * tt_conv_params / tt_conv1d_params): stride, top / left zero padding and the output size,
 * which also fixes the bottom / right padding. Forward and dx accumulate in int64; weight gradients accumulate in
 * int32, which is exact because geometry() only accepts OH*OW <= TT_CONV_GRAD_MAX_POSITIONS. */
#ifndef TT_CONV_H
#define TT_CONV_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** floor((2^31 - 1) / (127 * 127)): most output positions an int32 gradient sum can hold. */
#define TT_CONV_GRAD_MAX_POSITIONS 133144

/** The larger of two sizes, as a constant expression (for static scratch arrays). */
#define TT_CONV_MAX(a, b) ((a) > (b) ? (a) : (b))
/** Scratch bytes for conv2d fwd and bwd: one int64 per output element or per input element. */
#define TT_CONV2D_BUFFER_SIZE(H, W, Cin, OH, OW, Cout) (8 * TT_CONV_MAX((OH) * (OW) * (Cout), (H) * (W) * (Cin)))
/** Scratch bytes for depthwise fwd and bwd. */
#define TT_DEPTHWISE_BUFFER_SIZE(H, W, C, OH, OW) (8 * (C) * TT_CONV_MAX((OH) * (OW), (H) * (W)))
/** Scratch bytes for conv1d fwd and bwd. */
#define TT_CONV1D_BUFFER_SIZE(L, Cin, OL, Cout) (8 * TT_CONV_MAX((OL) * (Cout), (L) * (Cin)))

/** A 2-D convolution x[H][W][Cin] -> y[Ho][Wo][Cout] with kernel w[Cout][kh][kw][Cin] and bias
 *  b[Cout]. Input row of output row o and tap t: o * stride_h - pad_h + t (likewise columns).
 *  DepthwiseConv2d uses the same struct with Cout = Cin = C and w[kh][kw][C]. */
typedef struct tt_conv_params {
    int32_t H, W, Cin, Cout;   /* input height, width, channels; output channels */
    int32_t kh, kw;            /* kernel height, width */
    int32_t stride_h, stride_w;
    int32_t pad_h, pad_w;      /* zero padding on the top, on the left */
    int32_t Ho, Wo;            /* output height, width */
    const int16_t *w;          /* at exponent ew */
    int32_t ew;
    const int32_t *b;          /* at exponent eb */
    int32_t eb;
} tt_conv_params;

/** A 1-D convolution x[L][Cin] -> y[Lo][Cout] with kernel w[Cout][k][Cin] and bias b[Cout]
 *  (Conv2d with H = kh = Ho = 1). */
typedef struct tt_conv1d_params {
    int32_t L, Cin, Cout;      /* input length, channels; output channels */
    int32_t k, stride, pad;    /* kernel length, stride, zero padding on the left */
    int32_t Lo;                /* output length */
    const int16_t *w;          /* at exponent ew */
    int32_t ew;
    const int32_t *b;          /* at exponent eb */
    int32_t eb;
} tt_conv1d_params;

/** y = requant_s8(conv(x, w) + align(b)); returns ey. Scratch: TT_CONV2D_BUFFER_SIZE. */
int32_t tt_conv2d_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x, int32_t ex,
                         int8_t *y);

/** dx[H][W][Cin] = requant_s8(transposed conv of e[Ho][Wo][Cout]) with the pre-update weights;
 *  returns edx. */
int32_t tt_conv2d_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e, int32_t ee,
                         int8_t *dx);

/** gw[Cout][kh][kw][Cin] = sum over positions of e x (at ee + ex), gb[Cout] = sum of e (ee). */
void tt_conv2d_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb);

/** y[Ho][Wo][C] = requant_s8(depthwise conv(x[H][W][C], w[kh][kw][C]) + align(b)); returns ey.
 *  Scratch: TT_DEPTHWISE_BUFFER_SIZE. */
int32_t tt_depthwise_fwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);

/** dx[H][W][C] = requant_s8(transposed depthwise conv of e[Ho][Wo][C]); returns edx. */
int32_t tt_depthwise_bwd_s8(const tt_ctx *ctx, const tt_conv_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx);

/** gw[kh][kw][C] = sum over positions of e x (ee + ex), gb[C] = sum of e (ee). */
void tt_depthwise_grad_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                           int32_t *gb);

/** y[Lo][Cout] = requant_s8(conv(x[L][Cin], w) + align(b)); returns ey.
 *  Scratch: TT_CONV1D_BUFFER_SIZE. */
int32_t tt_conv1d_fwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *x,
                         int32_t ex, int8_t *y);

/** dx[L][Cin] = requant_s8(transposed conv of e[Lo][Cout]); returns edx. */
int32_t tt_conv1d_bwd_s8(const tt_ctx *ctx, const tt_conv1d_params *p, const int8_t *e,
                         int32_t ee, int8_t *dx);

/** gw[Cout][k][Cin] = sum over positions of e x (ee + ex), gb[Cout] = sum of e (ee). */
void tt_conv1d_grad_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                        int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_CONV_H */
