/** int16 activations and errors (precision "activations": "int16", "errors": "int16"): the
 *  kernels of the layers that take them (see tinytrain/graph/act16.py and, for the arithmetic,
 *  tinytrain/ops/: the int8 rules at 16 bits, values in the symmetric range +-32767). */
#ifndef TT_ACT16_H
#define TT_ACT16_H

#include <stdint.h>
#include "tt_fixedpoint.h"
#include "tt_dense.h"
#include "tt_sgd.h"

#ifdef __cplusplus
extern "C" {
#endif

/** out[n] = v[n]: the int8 input at its exponent, exactly. */
void tt_widen_s8_s16(const int8_t *v, int32_t n, int16_t *out);

/** y = sat_s16(rshift_round(acc, s)) with s = requant_shift(max |acc|, 16); returns s. */
int32_t tt_requant_s16_from_s64(const int64_t *acc, int32_t n, int16_t *y, tt_stats *st);

/** Dense forward on int16 x[K]: y[N] = requant_s16(w x + align(b)), int64 sums
 *  (|x w| < 2^30); returns the output exponent. Scratch: N int64. */
int32_t tt_dense_fwd_s16(const tt_ctx *ctx, const tt_dense_params *p, const int16_t *x,
                         int32_t ex, int16_t *y);

/** dx[K] = requant_s16(w^T e) with the pre-update weights, int64 sums; returns its exponent.
 *  Scratch: K int64. */
int32_t tt_dense_bwd_s16(const tt_ctx *ctx, const tt_dense_params *p, const int16_t *e,
                         int32_t ee, int16_t *dx);

/** gw[N][K] = e[n] x[k] (|gw| <= 32767^2 < 2^30), gb[N] = e[n]. */
void tt_dense_grad_s32_s16(const tt_dense_params *p, const int16_t *e, const int16_t *x,
                           int32_t *gw, int32_t *gb);

/** One row of the weight gradient: g[k] = en x[k]. The generated step forms a row, then
 *  updates (or accumulates) that row of the weights with the SGD kernels (tt_sgd.h): the same
 *  elements in the same order as the whole tensor, with K int32 of scratch instead of N K. */
void tt_dense_grad_row_s32_s16(const int16_t *x, int32_t K, int32_t en, int32_t *g);

/** Direct-mode update of int16 weights p->w[N][K] (exponent p->ew) from int16 e[N] (ee) and
 *  x[K] (ex): w[n][k] = sat(w - rshift_round(m_t e[n] x[k], s)), s = ew + k - ee - ex, without
 *  a gradient buffer, the same bits as each row's gradient (tt_dense_grad_row_s32_s16) through
 *  tt_sgd_update_direct_s16. For round to nearest without weight decay and s in [17, 62]:
 *  m_t e x (|.| < 2^45) in two int32 products (no 64-bit multiply, also on Cortex-M0), a shift
 *  and the rounding bit per weight; rows with e[n] == 0 and inputs x[k] == 0 are skipped. Returns 0 (nothing
 *  written) for any other configuration: the caller then takes the row-by-row path. p->b is
 *  not read (the bias is the caller's). */
int32_t tt_dense_update_direct_s16_a16(const tt_sgd_step *u, const tt_sgd_dense_s16_params *p,
                                       const int16_t *e, int32_t ee, const int16_t *x, int32_t ex);

/** ReLU on int16: y = max(x, 0); dx = y > 0 ? e : 0. y may alias x, dx may alias e. */
int32_t tt_relu_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int16_t *y, tt_stats *st);
int32_t tt_relu_bwd_s16(const int16_t *e, int32_t ee, const int16_t *y, int32_t n, int16_t *dx,
                        tt_stats *st);

/** Leaky ReLU on int16 (slope in Q8, the product rounded ties toward +inf; |v s| < 2^23). */
int32_t tt_leaky_relu_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int32_t slope_q8,
                              int16_t *y, tt_stats *st);
int32_t tt_leaky_relu_bwd_s16(const int16_t *e, int32_t ee, const int16_t *y, int32_t n,
                              int32_t slope_q8, int16_t *dx, tt_stats *st);

/** Flatten on int16: a copy (nothing when the buffers alias). */
int32_t tt_flatten_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int16_t *y, tt_stats *st);
int32_t tt_flatten_bwd_s16(const int16_t *e, int32_t ee, int32_t n, int16_t *dx, tt_stats *st);

/** What the int16 loss head writes: e[N] (the caller's buffer), its exponent, the loss. */
typedef struct tt_loss_s16_out {
    int16_t *e;
    int32_t ee;
    int32_t loss_q16;      /* -log2(p_label) in Q16 */
} tt_loss_s16_out;

/** argmax with the first index on ties. */
int32_t tt_argmax_s16(const int16_t *z, int32_t N);

/** Softmax CE on int16 logits z[N] (exponent ez): tinytrain/ops/softmax_ce.py with
 *  (z_i - max z) LOG2E_Q15 in int64 (|.| < 2^32), the error requantized to int16.
 *  Returns argmax(z). Scratch: N int64. */
int32_t tt_softmax_ce_s16(const tt_ctx *ctx, const int16_t *z, int32_t ez, int32_t label,
                          int32_t N, tt_loss_s16_out *out);

#ifdef __cplusplus
}
#endif

#endif /* TT_ACT16_H */
