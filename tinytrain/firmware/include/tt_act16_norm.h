/** int16 activations and errors (precision "activations": "int16", "errors": "int16"): batch
 *  normalization (see tinytrain/graph/act16.py; the arithmetic and its int16 bounds are
 *  tinytrain/ops/batchnorm.py). Portable int64 C beside the int8 kernels of tt_batchnorm.c
 *  (which keep their fast paths); the params struct and the saved buffer are tt_batchnorm.h's.
 *
 *  The weight (gamma) gradient sum e x_hat (|.| < P 2^27 in train) is rounded by the static
 *  shift g = bitwidth(P - 1) (tinytrain.ops.conv2d.grad_shift): exponent ee - 12 + g. */
#ifndef TT_ACT16_NORM_H
#define TT_ACT16_NORM_H

#include <stdint.h>
#include "tt_fixedpoint.h"
#include "tt_batchnorm.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Train mode: y = requant_s16(gamma x_hat + align(beta)) with the sample's statistics; rmean
 *  and rvar updated by shift-EMA. Returns ey. Scratch: P C int64. */
int32_t tt_batchnorm_fwd_s16(const tt_ctx *ctx, const tt_batchnorm_params *p, const int16_t *x,
                             int32_t ex, int16_t *y);
/** Eval mode: the same with the running statistics, left unchanged. */
int32_t tt_batchnorm_fwd_eval_s16(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                  const int16_t *x, int32_t ex, int16_t *y);
/** dx = requant_s16 of the full batch-norm gradient (J rounded by 20 bits) with the pre-update
 *  gamma, after a train forward of the same x; returns edx. Leaves sum e and the rounded
 *  gamma gradient in saved's last rows for tt_batchnorm_grad_saved_s32. Scratch: P C int64. */
int32_t tt_batchnorm_bwd_s16(const tt_ctx *ctx, const tt_batchnorm_params *p, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx);
/** ggamma[c] = sat_s32(rshift_round(sum e x_hat, g)) (exponent ee - 12 + g), gbeta[c] = sum e
 *  (ee), after a train forward of the same x. */
void tt_batchnorm_grad_s32_s16(const tt_batchnorm_params *p, const int16_t *e, const int16_t *x,
                               int32_t *ggamma, int32_t *gbeta);

#ifdef __cplusplus
}
#endif

#endif /* TT_ACT16_NORM_H */
