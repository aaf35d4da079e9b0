/** Convolution kernels: Conv2d, DepthwiseConv2d, Conv1d (see tinytrain/ops/conv2d.py,
 * depthwise.py, conv1d.py for the exact arithmetic). Channels-last, one sample.
 *
 * Static configuration (resolved at build time by tinytrain.ops.conv2d.geometry): stride
 * (sh, sw), top / left zero padding (pt, pl) and the output size (OH, OW), which also fixes the
 * bottom / right padding. Forward and dx accumulate in int64; weight gradients accumulate in
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

/** y[OH][OW][Cout] = requant_s8(conv(x[H][W][Cin], w[Cout][KH][KW][Cin]) + align(b)); -> ey. */
int32_t tt_conv2d_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                         const int32_t *b, int32_t eb, int32_t H, int32_t W, int32_t Cin,
                         int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                         int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                         int64_t *scratch, int8_t *y, tt_stats *st);

/** dx[H][W][Cin] = requant_s8(transposed conv of e[OH][OW][Cout]) with the pre-update weights. */
int32_t tt_conv2d_bwd_s8(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                         int32_t H, int32_t W, int32_t Cin, int32_t Cout, int32_t KH, int32_t KW,
                         int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                         int64_t *scratch, int8_t *dx, tt_stats *st);

/** gw[Cout][KH][KW][Cin] = sum over positions of e x (at ee + ex), gb[Cout] = sum of e (ee). */
void tt_conv2d_grad_s32(const int8_t *e, const int8_t *x, int32_t H, int32_t W, int32_t Cin,
                        int32_t Cout, int32_t KH, int32_t KW, int32_t sh, int32_t sw,
                        int32_t pt, int32_t pl, int32_t OH, int32_t OW, int32_t *gw, int32_t *gb);

/** y[OH][OW][C] = requant_s8(depthwise conv(x[H][W][C], w[KH][KW][C]) + align(b)); returns ey. */
int32_t tt_depthwise_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                            const int32_t *b, int32_t eb, int32_t H, int32_t W, int32_t C,
                            int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                            int32_t OH, int32_t OW, int64_t *scratch, int8_t *y, tt_stats *st);

/** dx[H][W][C] = requant_s8(transposed depthwise conv of e[OH][OW][C]); returns edx. */
int32_t tt_depthwise_bwd_s8(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                            int32_t H, int32_t W, int32_t C, int32_t KH, int32_t KW,
                            int32_t sh, int32_t sw, int32_t pt, int32_t pl, int32_t OH, int32_t OW,
                            int64_t *scratch, int8_t *dx, tt_stats *st);

/** gw[KH][KW][C] = sum over positions of e x (ee + ex), gb[C] = sum of e (ee). */
void tt_depthwise_grad_s32(const int8_t *e, const int8_t *x, int32_t H, int32_t W, int32_t C,
                           int32_t KH, int32_t KW, int32_t sh, int32_t sw, int32_t pt, int32_t pl,
                           int32_t OH, int32_t OW, int32_t *gw, int32_t *gb);

/** y[OL][Cout] = requant_s8(conv(x[L][Cin], w[Cout][K][Cin]) + align(b)); returns ey. */
int32_t tt_conv1d_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                         const int32_t *b, int32_t eb, int32_t L, int32_t Cin, int32_t Cout,
                         int32_t K, int32_t s, int32_t pl, int32_t OL,
                         int64_t *scratch, int8_t *y, tt_stats *st);

/** dx[L][Cin] = requant_s8(transposed conv of e[OL][Cout]); returns edx. */
int32_t tt_conv1d_bwd_s8(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                         int32_t L, int32_t Cin, int32_t Cout, int32_t K, int32_t s, int32_t pl,
                         int32_t OL, int64_t *scratch, int8_t *dx, tt_stats *st);

/** gw[Cout][K][Cin] = sum over positions of e x (ee + ex), gb[Cout] = sum of e (ee). */
void tt_conv1d_grad_s32(const int8_t *e, const int8_t *x, int32_t L, int32_t Cin, int32_t Cout,
                        int32_t K, int32_t s, int32_t pl, int32_t OL, int32_t *gw, int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_CONV_H */
