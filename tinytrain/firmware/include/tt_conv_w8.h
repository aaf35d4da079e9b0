/** Convolution kernels with int8 weights (precision policy "weights": "int8"): the arithmetic of
 * tt_conv.h with w in [-127, 127]; the weight gradients do not read w and are tt_conv.h's. */
#ifndef TT_CONV_W8_H
#define TT_CONV_W8_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** tt_conv_params with int8 weights (Conv2d; DepthwiseConv2d with Cout = Cin). */
typedef struct tt_conv_w8_params {
    int32_t H, W, Cin, Cout;
    int32_t kh, kw;
    int32_t stride_h, stride_w;
    int32_t pad_h, pad_w;
    int32_t Ho, Wo;
    const int8_t *w;
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_conv_w8_params;

/** tt_conv1d_params with int8 weights. */
typedef struct tt_conv1d_w8_params {
    int32_t L, Cin, Cout;
    int32_t k, stride, pad;
    int32_t Lo;
    const int8_t *w;
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_conv1d_w8_params;

int32_t tt_conv2d_fwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);
int32_t tt_conv2d_bwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx);
void tt_conv2d_grad_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                           int32_t *gw, int32_t *gb);
int32_t tt_depthwise_fwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *x,
                               int32_t ex, int8_t *y);
int32_t tt_depthwise_bwd_s8_w8(const tt_ctx *ctx, const tt_conv_w8_params *p, const int8_t *e,
                               int32_t ee, int8_t *dx);
void tt_depthwise_grad_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                              int32_t *gw, int32_t *gb);
int32_t tt_conv1d_fwd_s8_w8(const tt_ctx *ctx, const tt_conv1d_w8_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);
int32_t tt_conv1d_bwd_s8_w8(const tt_ctx *ctx, const tt_conv1d_w8_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx);
void tt_conv1d_grad_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, const int8_t *x,
                           int32_t *gw, int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_CONV_W8_H */
