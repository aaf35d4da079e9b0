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

/** MaxPool backward scratch (bytes, int64 per input value), only when windows overlap. */
#define TT_MAXPOOL2D_BUFFER_SIZE(H, W, C, kh, kw, sh, sw) ((sh) >= (kh) && (sw) >= (kw) ? 0 : 8 * (H) * (W) * (C))
#define TT_MAXPOOL1D_BUFFER_SIZE(L, C, k, s) ((s) >= (k) ? 0 : 8 * (L) * (C))
/** AvgPool needs no scratch: two passes (max |acc|, then round) recompute the sums. */
#define TT_AVGPOOL2D_BUFFER_SIZE(H, W, C, kh, kw, sh, sw) 0
#define TT_AVGPOOL1D_BUFFER_SIZE(L, C, k, s) 0
#define TT_GLOBAL_AVGPOOL_BUFFER_SIZE(P, C) 0

/** A 2-D pooling window over x[H][W][C] (output TT_POOL_OUT(H, kh, stride_h) rows, likewise
 *  columns). mult, shift: the reciprocal of kh * kw for AvgPool (unused by MaxPool). */
typedef struct tt_pool_params {
    int32_t H, W, C;
    int32_t kh, kw;
    int32_t stride_h, stride_w;
    int32_t mult, shift;
} tt_pool_params;

/** A 1-D pooling window over x[L][C]. */
typedef struct tt_pool1d_params {
    int32_t L, C;
    int32_t k, stride;
    int32_t mult, shift;
} tt_pool1d_params;

/** Global average pooling of x[P][C] over its P = H*W (or L) positions; mult, shift: the
 *  reciprocal of P. */
typedef struct tt_global_pool_params {
    int32_t P, C;
    int32_t mult, shift;
} tt_global_pool_params;

/** y[OH][OW][C] = window maxima (first maximum on ties); returns ex. No scratch, no saturation. */
int32_t tt_maxpool2d_fwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);

/** dx[H][W][C] = requant_s8(e routed to each window's argmax, recomputed from the saved
 * input x); returns edx. Scratch: TT_MAXPOOL2D_BUFFER_SIZE (none without overlap). dx must
 * not alias x. */
int32_t tt_maxpool2d_bwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx);

/** 1-D forms: x[L][C], kernel k, stride s. */
int32_t tt_maxpool1d_fwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);
int32_t tt_maxpool1d_bwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx);

/** y[OH][OW][C] = requant_s8(mult * window sum, ex - shift); returns ey. No scratch. */
int32_t tt_avgpool2d_fwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);

/** dx[H][W][C] = requant_s8(mult * sum of the errors of the covering windows, ee - shift);
 * returns edx. No scratch. */
int32_t tt_avgpool2d_bwd_s8(const tt_ctx *ctx, const tt_pool_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx);

int32_t tt_avgpool1d_fwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);
int32_t tt_avgpool1d_bwd_s8(const tt_ctx *ctx, const tt_pool1d_params *p, const int8_t *e,
                            int32_t ee, int8_t *dx);

/** y[C] = mean over the P positions of x[P][C]; returns ey. No scratch. */
int32_t tt_global_avgpool_fwd_s8(const tt_ctx *ctx, const tt_global_pool_params *p,
                                 const int8_t *x, int32_t ex, int8_t *y);
/** dx[P][C] = requant_s8(mult * e[c], ee - shift); returns edx. No scratch. */
int32_t tt_global_avgpool_bwd_s8(const tt_ctx *ctx, const tt_global_pool_params *p,
                                 const int8_t *e, int32_t ee, int8_t *dx);

#ifdef __cplusplus
}
#endif

#endif /* TT_POOL_H */
