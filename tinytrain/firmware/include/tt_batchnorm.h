/** Integer batch normalization, train and eval (see tinytrain/ops/batchnorm.py for the exact
 * arithmetic). Tensors are (P, C) channels-last: P = H*W (or L) positions of ONE sample.
 * saved: int32[5 * C + 1], rows {B, inv, sh} of C values and the input exponent ex, written
 * by the forward, read by backward and grad; then rows {sum e, sat_s32(sum e * x_hat)} of C
 * values, written by the train backward (its first pass forms them) for
 * tt_batchnorm_grad_saved_s32.
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

/** Scratch (bytes) of the forward and backward kernels over x[P][C]: three int64 per channel
 *  (forward, eval backward) or one int64 slot per element (train backward: x_hat, then its J;
 *  an int32 in the slot's first word where they fit int32). */
#define TT_BATCHNORM_BUFFER_SIZE(P, C) (8 * ((P) * (C) > 3 * (C) ? (P) * (C) : 3 * (C)))
/** Size (bytes) of the saved per-channel state passed from forward to backward. */
#define TT_BATCHNORM_SAVED_SIZE(C) (20 * (C) + 4)

/** One batch-norm layer over x[P][C]: dims, parameters (gamma, beta: learnt; running mean
 *  and variance: state the train forward updates), build-time constants and the saved buffer
 *  forward fills for backward. Exponents are fixed at build time. */
typedef struct tt_batchnorm_params {
    int32_t P, C;              /* positions per channel, channels */
    const int16_t *gamma;      /* gamma[C] at e_g */
    int32_t e_g;
    const int32_t *beta;       /* beta[C] at e_b */
    int32_t e_b;
    int32_t *rmean;            /* running mean[C] at e_rm */
    int32_t e_rm;
    int32_t *rvar;             /* running variance[C] at e_rv */
    int32_t e_rv;
    int32_t eps_m, eps_k;      /* eps = eps_m * 2^-eps_k */
    int32_t mom_k;             /* running statistics momentum 2^-mom_k */
    int32_t *saved;            /* TT_BATCHNORM_SAVED_SIZE(C) bytes */
} tt_batchnorm_params;

/** Train mode: y = requant_s8(gamma * x_hat + align(beta)) with the sample's statistics;
 * rmean / rvar updated by shift-EMA. Returns the output exponent. Scratch:
 * TT_BATCHNORM_BUFFER_SIZE. */
int32_t tt_batchnorm_fwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *x,
                            int32_t ex, int8_t *y);

/** Eval mode: the same with the running statistics, which are left unchanged. */
int32_t tt_batchnorm_fwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *x, int32_t ex, int8_t *y);

/** dx = requant_s8 of the full batch-norm gradient, with the pre-update gamma, after a train
 * forward of the same x. Returns its exponent. Scratch: TT_BATCHNORM_BUFFER_SIZE. */
int32_t tt_batchnorm_bwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx);

/** dx = requant_s8(gamma / sigma * e) after an eval forward (x is not read). */
int32_t tt_batchnorm_bwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *e, int32_t ee, const int8_t *x, int8_t *dx);

/** ggamma[c] = sat_s32(sum e * x_hat) (exponent ee - TT_BN_XHAT_FRAC), gbeta[c] = sum e (ee),
 *  after a train forward of the same x. */
void tt_batchnorm_grad_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                           int32_t *ggamma, int32_t *gbeta);

/** tt_batchnorm_grad_s32's results without a pass over the tensor: the sums the last
 *  tt_batchnorm_bwd_s8 formed (call it right after that backward, of the same e and x). */
void tt_batchnorm_grad_saved_s32(const tt_batchnorm_params *p, int32_t *ggamma, int32_t *gbeta);

/** The same after an eval forward. */
void tt_batchnorm_grad_eval_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                                int32_t *ggamma, int32_t *gbeta);

#ifdef __cplusplus
}
#endif

#endif /* TT_BATCHNORM_H */
