/** int16 activations and errors (precision "activations": "int16", "errors": "int16"): the
 *  convolution and pooling kernels (see tinytrain/graph/act16.py; the arithmetic is
 *  tinytrain/ops/conv2d.py, depthwise.py, conv1d.py and maxpool.py at 16 bits). Portable scalar
 *  C; the params structs are those of tt_conv.h and tt_pool.h.
 *
 *  Bounds: a product |x w| or |e w| <= 32767^2 < 2^30 is formed in int32 and summed in int64
 *  (fan-in * 2^30 + 2^30). A weight gradient sums npos = Ho*Wo (Lo) terms |e x| < 2^30 in int64
 *  and is rounded by the static shift g = bitwidth(npos - 1) (tinytrain.ops.conv2d.grad_shift):
 *  |gw| <= 2^30, exponent ee + ex + g. The bias gradient sum e, |gb| <= 32767 npos, is int32
 *  for npos <= 65538 (the layer is refused beyond). */
#ifndef TT_ACT16_CONV_H
#define TT_ACT16_CONV_H

#include <stdint.h>
#include "tt_fixedpoint.h"
#include "tt_conv.h"
#include "tt_pool.h"

#ifdef __cplusplus
extern "C" {
#endif

/** y[Ho][Wo][Cout] = requant_s16(conv(x, w) + align(b)); returns ey. Scratch: Ho Wo Cout int64. */
int32_t tt_conv2d_fwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *x,
                          int32_t ex, int16_t *y);
/** dx[H][W][Cin] = requant_s16(transposed conv of e) with the pre-update weights; returns edx.
 *  Scratch: H W Cin int64. */
int32_t tt_conv2d_bwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *e,
                          int32_t ee, int16_t *dx);
/** gw[nco][kh][kw][Cin] = rshift_round(sum over positions of e x, g) for the output channels
 *  co .. co + nco - 1 (exponent ee + ex + g). Does not read w. */
void tt_conv2d_grad_w_chan_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x,
                                   int32_t g, int32_t co, int32_t nco, int32_t *gw);
/** gb[Cout] = sum of e over the output positions (exponent ee). */
void tt_conv2d_grad_b_s32_s16(const tt_conv_params *p, const int16_t *e, int32_t *gb);
/** Both gradients, the whole tensors. */
void tt_conv2d_grad_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x, int32_t g,
                            int32_t *gw, int32_t *gb);

/** Depthwise (w[kh][kw][C], Cout = Cin = C): the same three with one channel per filter. */
int32_t tt_depthwise_fwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *x,
                             int32_t ex, int16_t *y);
int32_t tt_depthwise_bwd_s16(const tt_ctx *ctx, const tt_conv_params *p, const int16_t *e,
                             int32_t ee, int16_t *dx);
void tt_depthwise_grad_s32_s16(const tt_conv_params *p, const int16_t *e, const int16_t *x,
                               int32_t g, int32_t *gw, int32_t *gb);

/** Conv1d: Conv2d with H = kh = Ho = 1. */
int32_t tt_conv1d_fwd_s16(const tt_ctx *ctx, const tt_conv1d_params *p, const int16_t *x,
                          int32_t ex, int16_t *y);
int32_t tt_conv1d_bwd_s16(const tt_ctx *ctx, const tt_conv1d_params *p, const int16_t *e,
                          int32_t ee, int16_t *dx);
void tt_conv1d_grad_w_chan_s32_s16(const tt_conv1d_params *p, const int16_t *e, const int16_t *x,
                                   int32_t g, int32_t co, int32_t nco, int32_t *gw);
void tt_conv1d_grad_b_s32_s16(const tt_conv1d_params *p, const int16_t *e, int32_t *gb);
void tt_conv1d_grad_s32_s16(const tt_conv1d_params *p, const int16_t *e, const int16_t *x, int32_t g,
                            int32_t *gw, int32_t *gb);

/** MaxPool on int16: window maxima (first maximum on ties); returns ex. */
int32_t tt_maxpool2d_fwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *x,
                             int32_t ex, int16_t *y);
/** dx[H][W][C] = requant_s16(e routed to each window's argmax, recomputed from the saved input
 *  x); returns edx. Without overlap (stride >= kernel) e is written where it goes (shift 0, no
 *  scratch); with overlap the sums go through H W C int64 of scratch. dx must not alias x. */
int32_t tt_maxpool2d_bwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx);
int32_t tt_maxpool1d_fwd_s16(const tt_ctx *ctx, const tt_pool1d_params *p, const int16_t *x,
                             int32_t ex, int16_t *y);
int32_t tt_maxpool1d_bwd_s16(const tt_ctx *ctx, const tt_pool1d_params *p, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx);

/** AvgPool on int16 (tinytrain/ops/avgpool.py at 16 bits): y = requant_s16(mult * window sums)
 *  at ex - shift; the sums in int64 (|sum| <= 32767 P < 2^39, |mult sum| < 2^54). Two passes,
 *  no scratch. */
int32_t tt_avgpool2d_fwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *x,
                             int32_t ex, int16_t *y);
/** dx = requant_s16(mult * the errors of the windows covering each input) at ee - shift. */
int32_t tt_avgpool2d_bwd_s16(const tt_ctx *ctx, const tt_pool_params *p, const int16_t *e,
                             int32_t ee, int16_t *dx);
/** GlobalAvgPool on int16: AvgPool of one window of all P positions. */
int32_t tt_global_avgpool_fwd_s16(const tt_ctx *ctx, const tt_global_pool_params *p,
                                  const int16_t *x, int32_t ex, int16_t *y);
int32_t tt_global_avgpool_bwd_s16(const tt_ctx *ctx, const tt_global_pool_params *p,
                                  const int16_t *e, int32_t ee, int16_t *dx);

#ifdef __cplusplus
}
#endif

#endif /* TT_ACT16_CONV_H */
