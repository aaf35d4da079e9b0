/** Convolution weight gradients one output channel at a time (conv2d, conv1d; int16 and int8
 * weights): the sums of tt_conv2d_grad_s32 / tt_conv1d_grad_s32 for the weights of a few output
 * channels only, so that a training step applies their update before it forms the next ones and
 * its gradient buffer holds nco * kh * kw * Cin values instead of the whole tensor. The gradients
 * do not read w. */
#ifndef TT_CONV_WGRAD_H
#define TT_CONV_WGRAD_H

#include <stdint.h>
#include "tt_conv.h"
#include "tt_conv_w8.h"

#ifdef __cplusplus
extern "C" {
#endif

/** gw[nco][kh][kw][Cin] = the weight gradients of output channels co .. co + nco - 1 (exponent
 *  ee + ex). */
void tt_conv2d_grad_w_chan_s32(const tt_conv_params *p, const int8_t *e, const int8_t *x,
                               int32_t co, int32_t nco, int32_t *gw);
/** gb[Cout] = the bias gradient (sum of e over the output positions, exponent ee). */
void tt_conv2d_grad_b_s32(const tt_conv_params *p, const int8_t *e, int32_t *gb);
void tt_conv1d_grad_w_chan_s32(const tt_conv1d_params *p, const int8_t *e, const int8_t *x,
                               int32_t co, int32_t nco, int32_t *gw);
void tt_conv1d_grad_b_s32(const tt_conv1d_params *p, const int8_t *e, int32_t *gb);
/* the same for layers with int8 weights (their params structs) */
void tt_conv2d_grad_w_chan_s32_w8(const tt_conv_w8_params *p, const int8_t *e, const int8_t *x,
                                  int32_t co, int32_t nco, int32_t *gw);
void tt_conv2d_grad_b_s32_w8(const tt_conv_w8_params *p, const int8_t *e, int32_t *gb);
void tt_conv1d_grad_w_chan_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, const int8_t *x,
                                  int32_t co, int32_t nco, int32_t *gw);
void tt_conv1d_grad_b_s32_w8(const tt_conv1d_w8_params *p, const int8_t *e, int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_CONV_WGRAD_H */
