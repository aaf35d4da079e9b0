/** Integer batch normalization, train and eval (see tinytrain/ops/batchnorm.py for the exact
 * arithmetic). Tensors are (P, C) channels-last: P = H*W (or L) positions of ONE sample.
 * saved: int32[3][C] rows {B, inv, sh} written by the forward, read by backward and grad.
 * Preconditions: 1 <= P <= TT_BN_MAX_P, and P >= 2 when train (the caller checks). */
#ifndef TT_BATCHNORM_H
#define TT_BATCHNORM_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_BN_XHAT_FRAC 12
#define TT_BN_INV_BITS 45
#define TT_BN_EVAL_FRAC 8
#define TT_BN_KM_BITS 24
#define TT_BN_MAX_P 4096

/** Scratch (bytes) of the forward and backward kernels: three int64 per channel. */
#define TT_BATCHNORM_BUFFER_SIZE(C) (24 * (C))
/** Size (bytes) of the saved per-channel state passed from forward to backward. */
#define TT_BATCHNORM_SAVED_SIZE(C) (12 * (C))

/** y = requant_s8(gamma * x_hat + align(beta)); in train mode (train != 0) the statistics are
 * the sample's and rmean / rvar are updated by shift-EMA (momentum 2^-mom_k); in eval mode the
 * running statistics are used and left unchanged. Returns the output exponent. */
int32_t tt_batchnorm_fwd_s8(const int8_t *x, int32_t ex, int32_t P, int32_t C,
                            const int16_t *gamma, int32_t e_g, const int32_t *beta, int32_t e_b,
                            int32_t *rmean, int32_t e_rm, int32_t *rvar, int32_t e_rv,
                            int32_t eps_m, int32_t eps_k, int32_t mom_k, int32_t train,
                            int32_t *saved, int64_t *scratch, int8_t *y, tt_stats *st);

/** dx = requant_s8 of the full batch-norm gradient (train) or of gamma/sigma * e (eval), with
 * the pre-update gamma. Returns its exponent. */
int32_t tt_batchnorm_bwd_s8(const int8_t *e, int32_t ee, const int8_t *x, int32_t ex,
                            int32_t P, int32_t C, const int32_t *saved, const int16_t *gamma,
                            int32_t e_g, int32_t train, int64_t *scratch, int8_t *dx,
                            tt_stats *st);

/** ggamma[c] = sat_s32(sum e * x_hat) (exponent ee - TT_BN_XHAT_FRAC), gbeta[c] = sum e (ee). */
void tt_batchnorm_grad_s32(const int8_t *e, const int8_t *x, int32_t P, int32_t C,
                           const int32_t *saved, int32_t train, int32_t *ggamma, int32_t *gbeta);

#ifdef __cplusplus
}
#endif

#endif /* TT_BATCHNORM_H */
