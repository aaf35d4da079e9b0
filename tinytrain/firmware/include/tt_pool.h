/** Pooling kernels: MaxPool, AvgPool and GlobalAvgPool, 2-D (H, W, C) and 1-D (L, C) as
 * H = 1, valid padding (see tinytrain/ops/maxpool.py and ops/avgpool.py for the exact
 * arithmetic). (mult, shift) is the build-time reciprocal of the window size P from
 * tinytrain.ops.avgpool.reciprocal(P). Tensors hold fewer than 2^31 values, P < 2^24. */
#ifndef TT_POOL_H
#define TT_POOL_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Output length of a valid-padding window: (n - k) / s + 1 for n >= k. */
#define TT_POOL_OUT(n, k, s) (((n) - (k)) / (s) + 1)

/** MaxPool backward scratch (bytes, int32 per input value), only when windows overlap. */
#define TT_MAXPOOL2D_BUFFER_SIZE(H, W, C, kh, kw, sh, sw) ((sh) >= (kh) && (sw) >= (kw) ? 0 : 4 * (H) * (W) * (C))
#define TT_MAXPOOL1D_BUFFER_SIZE(L, C, k, s) ((s) >= (k) ? 0 : 4 * (L) * (C))
/** AvgPool needs no scratch: two passes (max |acc|, then round) recompute the sums. */
#define TT_AVGPOOL2D_BUFFER_SIZE(H, W, C, kh, kw, sh, sw) 0
#define TT_AVGPOOL1D_BUFFER_SIZE(L, C, k, s) 0
#define TT_GLOBAL_AVGPOOL_BUFFER_SIZE(P, C) 0

/** y[OH][OW][C] = window maxima (first maximum on ties); returns ex. */
int32_t tt_maxpool2d_fwd_s8(const int8_t *x, int32_t ex, int32_t H, int32_t W, int32_t C,
                            int32_t kh, int32_t kw, int32_t sh, int32_t sw, int8_t *y,
                            tt_stats *st);

/** dx[H][W][C] = requant_s8(e routed to each window's argmax, recomputed from the saved
 * input x); returns edx. scratch: TT_MAXPOOL2D_BUFFER_SIZE bytes (NULL if 0). dx must not
 * alias x. */
int32_t tt_maxpool2d_bwd_s8(const int8_t *e, int32_t ee, const int8_t *x, int32_t H,
                            int32_t W, int32_t C, int32_t kh, int32_t kw, int32_t sh,
                            int32_t sw, int32_t *scratch, int8_t *dx, tt_stats *st);

/** 1-D forms: x (L, C), kernel k, stride s. */
int32_t tt_maxpool1d_fwd_s8(const int8_t *x, int32_t ex, int32_t L, int32_t C, int32_t k,
                            int32_t s, int8_t *y, tt_stats *st);
int32_t tt_maxpool1d_bwd_s8(const int8_t *e, int32_t ee, const int8_t *x, int32_t L,
                            int32_t C, int32_t k, int32_t s, int32_t *scratch, int8_t *dx,
                            tt_stats *st);

/** y[OH][OW][C] = requant_s8(mult * window sum, ex - shift); returns ey. */
int32_t tt_avgpool2d_fwd_s8(const int8_t *x, int32_t ex, int32_t H, int32_t W, int32_t C,
                            int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t mult,
                            int32_t shift, int8_t *y, tt_stats *st);

/** dx[H][W][C] = requant_s8(mult * sum of the errors of the covering windows, ee - shift);
 * returns edx. */
int32_t tt_avgpool2d_bwd_s8(const int8_t *e, int32_t ee, int32_t H, int32_t W, int32_t C,
                            int32_t kh, int32_t kw, int32_t sh, int32_t sw, int32_t mult,
                            int32_t shift, int8_t *dx, tt_stats *st);

int32_t tt_avgpool1d_fwd_s8(const int8_t *x, int32_t ex, int32_t L, int32_t C, int32_t k,
                            int32_t s, int32_t mult, int32_t shift, int8_t *y, tt_stats *st);
int32_t tt_avgpool1d_bwd_s8(const int8_t *e, int32_t ee, int32_t L, int32_t C, int32_t k,
                            int32_t s, int32_t mult, int32_t shift, int8_t *dx, tt_stats *st);

/** y[C] = mean over the P = H*W (or L) positions of x[P][C]; returns ey. */
int32_t tt_global_avgpool_fwd_s8(const int8_t *x, int32_t ex, int32_t P, int32_t C,
                                 int32_t mult, int32_t shift, int8_t *y, tt_stats *st);
/** dx[P][C] = requant_s8(mult * e[c], ee - shift); returns edx. */
int32_t tt_global_avgpool_bwd_s8(const int8_t *e, int32_t ee, int32_t P, int32_t C,
                                 int32_t mult, int32_t shift, int8_t *dx, tt_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* TT_POOL_H */
