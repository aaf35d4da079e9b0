/** Integer SGD update rules (see tinytrain/optim.py; numba twin tinytrain/kernels/optim.py). */
#ifndef TT_SGD_H
#define TT_SGD_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_SGD_GUARD_BITS 8
/** Bits an int8 velocity slot sits above the int32 velocity's units (one unit: a store step). */
#define TT_SGD_V8_SHIFT 8

/** Integer constants of one SGD configuration (built by tinytrain.optim.SGD.compile). */
typedef struct tt_sgd {
    int32_t m, k;            /* lr = m * 2^-k */
    int32_t mu_m, mu_k;      /* momentum */
    int32_t wd_m, wd_k;      /* lr * weight decay */
    int32_t ib_m, ib_k;      /* 1 / batch size */
    int32_t batch_size;
    int32_t schedule;        /* 0 constant, 1 step, 2 cosine */
    int32_t gamma_q15, step_size, total_steps;
    int32_t sr;              /* stochastic rounding on/off */
    const int32_t *cosine;   /* 65 Q15 entries */
} tt_sgd;

/** Learning-rate multiplier m_t at optimizer step t. */
int32_t tt_sgd_lr_mult(const tt_sgd *o, uint32_t t);

/** What every update of one training step shares: the configuration, the step's learning-rate
 *  multiplier m_t = tt_sgd_lr_mult(cfg, step), the PRNG state stochastic rounding draws from
 *  (one draw per rounded element, in element order) and the saturation counters. */
typedef struct tt_sgd_step {
    const tt_sgd *cfg;
    int32_t m_t;
    uint32_t *prng;
    tt_stats *stats;
} tt_sgd_step;

/** Direct mode: w[n] -= shift(m_t * g, ew + k - eg) (+ decay), saturating to [-32767, 32767]. */
void tt_sgd_update_direct_s16(const tt_sgd_step *u, int16_t *w, int32_t n, int32_t ew,
                              const int32_t *g, int32_t eg);

/** The same for an int32 tensor (a bias, or an int32 master copy), saturating to int32. */
void tt_sgd_update_direct_s32(const tt_sgd_step *u, int32_t *w, int32_t n, int32_t ew,
                              const int32_t *g, int32_t eg);

/** Accumulate mode, per sample: A = sat32(A + shift(m_t * g, ew + k - eg - G)). */
void tt_sgd_accumulate_s32(const tt_sgd_step *u, int32_t *A, int32_t n, int32_t ew,
                           const int32_t *g, int32_t eg);

/** Accumulate mode, end of batch: averaging, momentum V[n] (NULL when momentum is off), decay,
 *  update of w[n] saturating to [-32767, 32767], A = 0. m_t is not used. */
void tt_sgd_apply_accumulated_s16(const tt_sgd_step *u, int16_t *w, int32_t *A, int32_t *V,
                                  int32_t n);

/** The same for an int32 tensor, saturating to int32. */
void tt_sgd_apply_accumulated_s32(const tt_sgd_step *u, int32_t *w, int32_t *A, int32_t *V,
                                  int32_t n);

/** tt_sgd_apply_accumulated_s32 then tt_sgd_refresh_copy(w, copy, n), same bits, in one pass where
 *  a fast path applies (an int32 master and its int16 compute copy). */
void tt_sgd_apply_accumulated_s32_copy(const tt_sgd_step *u, int32_t *w, int16_t *copy, int32_t *A, int32_t *V,
                                       int32_t n);

/** Accumulate mode with batch size 1 and no stochastic rounding: tt_sgd_accumulate_s32 and
 *  tt_sgd_apply_accumulated_s16 of one tensor in one pass, same bits (the generated step calls it
 *  at the tensor's backward: no draw or later read depends on when the update happens). */
void tt_sgd_accumulate_apply_s16(const tt_sgd_step *u, int16_t *w, int32_t *A, int32_t *V, int32_t n,
                                 int32_t ew, const int32_t *g, int32_t eg);

/** The same for an int32 tensor, and copy (or NULL) refreshed as tt_sgd_refresh_copy. */
void tt_sgd_accumulate_apply_s32(const tt_sgd_step *u, int32_t *w, int16_t *copy, int32_t *A, int32_t *V,
                                 int32_t n, int32_t ew, const int32_t *g, int32_t eg);

/** Where the accumulate-apply of a Dense layer writes: weights w[N][K] (int16) at exponent ew with
 *  their accumulator wa and velocity wv (NULL: momentum off), biases b[N] at eb with ba, bv. A
 *  NULL tensor is frozen: it is neither read nor written. */
typedef struct tt_sgd_dense_acc_s16_params {
    int32_t K, N;
    int16_t *w;
    int32_t ew;
    int32_t *wa, *wv;
    int32_t *b;
    int32_t eb;
    int32_t *ba, *bv;
} tt_sgd_dense_acc_s16_params;

/** The same with int32 weights (an int32 master) and their int16 copy (or NULL), refreshed as
 *  tt_sgd_refresh_copy. */
typedef struct tt_sgd_dense_acc_s32_params {
    int32_t K, N;
    int32_t *w;
    int32_t ew;
    int32_t *wa, *wv;
    int32_t *b;
    int32_t eb;
    int32_t *ba, *bv;
    int16_t *copy;
} tt_sgd_dense_acc_s32_params;

/** tt_sgd_accumulate_apply_s16 / _s32 of a Dense layer's weights (gradient e[n] * x[k] at ee + ex,
 *  row-major) then biases (e[n] at ee) without a gradient buffer: the gradient is formed as it is
 *  applied, same bits (batch size 1, no stochastic rounding: the cases the generated step fuses). */
void tt_sgd_dense_accumulate_apply_s16(const tt_sgd_step *u, const tt_sgd_dense_acc_s16_params *p,
                                       const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);
void tt_sgd_dense_accumulate_apply_s32(const tt_sgd_step *u, const tt_sgd_dense_acc_s32_params *p,
                                       const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** What a Dense layer's weight accumulate leaves for the end-of-step apply when it waits
 *  (tt_sgd_dense_accumulate_s32 with keep, tt_sgd_dense_apply_kept_s32): a copy of the error e[N]
 *  and its exponent, the input x (the caller keeps it alive until the apply) and its exponent.
 *  state 0: the weights' accumulators may hold a sum (boot, a state write), 1: they are all 0,
 *  2: the weights' accumulate of this step waits here (their accumulators are still 0). */
typedef struct tt_sgd_dense_keep {
    int8_t *e;
    const int8_t *x;
    int32_t ee, ex, state;
} tt_sgd_dense_keep;

/** The accumulators of a Dense layer's per-sample accumulate: wa[N][K] for the weights (stored at
 *  exponent ew), ba[N] for the biases (at eb); NULL: frozen. keep (or NULL): where the weights'
 *  accumulate may wait for the end-of-step apply. */
typedef struct tt_sgd_dense_accum_params {
    int32_t K, N;
    int32_t *wa;
    int32_t ew;
    int32_t *ba;
    int32_t eb;
    tt_sgd_dense_keep *keep;
} tt_sgd_dense_accum_params;

/** tt_sgd_accumulate_s32 of a Dense layer's weight gradient e[n] * x[k] (at ee + ex, row-major)
 *  then bias gradient e[n] (at ee) without a gradient buffer: same bits, same draws in the same
 *  order. */
void tt_sgd_dense_accumulate_s32(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, const int8_t *e,
                                 int32_t ee, const int8_t *x, int32_t ex);

/** With p->keep in state 1 at batch size 1 and a weight accumulate that draws nothing (a left
 *  shift: ew + k - (ee + ex) - G in [-32, 0], 0 <= m_t < 2^15), tt_sgd_dense_accumulate_s32 only
 *  keeps e, ee, x, ex (state 2) and accumulates the biases; this end-of-batch apply of the weights
 *  (tt_sgd_apply_accumulated_s32_copy of w, copy, wa, V) then forms that accumulate first, in the
 *  same pass on Cortex-M4 (DSP), same bits and draws as the two calls; state 1 after. */
void tt_sgd_dense_apply_kept_s32(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, int32_t *w,
                                 int16_t *copy, int32_t *V);

/** Where a direct-mode Dense update writes: weights w[N][K] (int16) at exponent ew, biases
 *  b[N] at eb. A NULL tensor is frozen: it is neither read nor written. */
typedef struct tt_sgd_dense_s16_params {
    int32_t K, N;
    int16_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
} tt_sgd_dense_s16_params;

/** The same with int32 weights (the int32 master copy of master-weight training); copy: the
 *  int16 compute copy the update also refreshes (tt_sgd_refresh_copy of every weight), or NULL. */
typedef struct tt_sgd_dense_s32_params {
    int32_t K, N;
    int32_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    int16_t *copy;
} tt_sgd_dense_s32_params;

/** Direct-mode update of a Dense layer without a gradient buffer: the gradient
 *  g[n][k] = e[n] * x[k] (exponent ee + ex) and gb[n] = e[n] (exponent ee) is formed element by
 *  element and applied exactly as tt_sgd_update_direct_s16 / _s32 would (weights row-major,
 *  then biases, same PRNG order). Rows with e[n] == 0 are skipped when that cannot change the
 *  result (no stochastic rounding, no weight decay). */
void tt_sgd_dense_direct_s16(const tt_sgd_step *u, const tt_sgd_dense_s16_params *p,
                             const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** The same with int32 weights. */
void tt_sgd_dense_direct_s32(const tt_sgd_step *u, const tt_sgd_dense_s32_params *p,
                             const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** int16 compute copy of an int32 master: sat_s16(rshift_round(master, 16)). */
void tt_sgd_refresh_copy(const int32_t *master, int16_t *w16, int32_t n);

/* ---- int8 storage (precision policy "weights": "int8"): the same rules, saturating to
 * [-127, 127]; and the narrowing of a master copy into an int8 compute copy ---- */

/** tt_sgd_update_direct_s16 on an int8 tensor. */
void tt_sgd_update_direct_s8(const tt_sgd_step *u, int8_t *w, int32_t n, int32_t ew,
                             const int32_t *g, int32_t eg);

/** tt_sgd_apply_accumulated_s16 on an int8 tensor. */
void tt_sgd_apply_accumulated_s8(const tt_sgd_step *u, int8_t *w, int32_t *A, int32_t *V,
                                 int32_t n);

/** tt_sgd_apply_accumulated_s16 / _s8 with an int16 velocity (policy "momentum": "int16"):
 *  V = sat16(rshift_round(V * mu_m, mu_k) + u), in the units of the int32 velocity. */
void tt_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, int16_t *w, int32_t *A, int16_t *V,
                                      int32_t n);
void tt_sgd_apply_accumulated_s8_v16(const tt_sgd_step *u, int8_t *w, int32_t *A, int16_t *V,
                                     int32_t n);

/** tt_sgd_apply_accumulated_s16 / _s8 with an int8 velocity slot (policy "momentum": "int8"):
 *  vv = sat32(rshift_round((V << TT_SGD_V8_SHIFT) * mu_m, mu_k) + u);
 *  V = clamp(rshift_stoch(vv, TT_SGD_V8_SHIFT, r), -127, 127) with one PRNG draw r per element
 *  (before the update's own draw); the update then uses vv. */
void tt_sgd_apply_accumulated_s16_v8(const tt_sgd_step *u, int16_t *w, int32_t *A, int8_t *V,
                                     int32_t n);
void tt_sgd_apply_accumulated_s8_v8(const tt_sgd_step *u, int8_t *w, int32_t *A, int8_t *V,
                                    int32_t n);

/** Where a direct-mode Dense update with int8 weights writes (NULL: frozen). jump: the table of
 *  K PRNG steps (tt_prng_jump) with which a stochastic-rounding row of zero steps makes its K
 *  draws at once, or NULL (one tt_prng_next per weight; the same state either way). */
typedef struct tt_sgd_dense_s8_params {
    int32_t K, N;
    int8_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    const uint32_t (*jump)[16];
} tt_sgd_dense_s8_params;

/** tt_sgd_dense_direct_s16 with int8 weights. */
void tt_sgd_dense_direct_s8(const tt_sgd_step *u, const tt_sgd_dense_s8_params *p,
                            const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** int8 compute copy of an int32 master: sat_s8(rshift_round(master, 24)). */
void tt_sgd_refresh_copy_s32_s8(const int32_t *master, int8_t *w8, int32_t n);

/** int8 compute copy of an int16 master: sat_s8(rshift_round(master, 8)). */
void tt_sgd_refresh_copy_s16_s8(const int16_t *master, int8_t *w8, int32_t n);

/** The bias part of tt_sgd_dense_direct_s16 / _s32: b[N] at eb, gradient e[n] at exponent ee
 *  (for kernels forming the weight part themselves: tt_sparse.h). */
void tt_sgd_dense_bias_s32(const tt_sgd_step *u, int32_t *b, int32_t eb, const int8_t *e, int32_t ee, int32_t N);
/** The direct-mode update of an int16 bias b[N] at eb (policy "bias": "int16") from its gradient
 *  e[n] at ee: the int16 weight update of a Dense layer with one input x = 1 at exponent 0 (the
 *  gradient e[n] * 1 at ee), so the same element rule, fast paths and PRNG order. */
void tt_sgd_dense_bias_s16(const tt_sgd_step *u, int16_t *b, int32_t eb, const int8_t *e, int32_t ee, int32_t N);

/** Momentum slots at batch size 1 without the weights' accumulators (4 bytes per weight less RAM):
 *  a Dense layer's weights w[N][K] (int16 w16 or int8 w8, the other NULL) at exponent ew with an
 *  int16 (v16) or int8 (v8) velocity slot. At the backward, tt_sgd_dense_rows_keep copies the
 *  error e[N] into p->e and keeps x (alive until the apply), ee and ex; at the end of the step,
 *  tt_sgd_dense_rows_apply forms each row's accumulate (tt_sgd_dense_accumulate_s32 of e[n] x[k]
 *  into zeroed accumulators) in buf and applies it (tt_sgd_apply_accumulated_<w><v>) row by
 *  row: the same bits, counts and draws as the two whole-tensor calls when the accumulate draws
 *  nothing (no stochastic rounding) and the apply's draws run in element order (they do). buf:
 *  2 K int32, 8-byte aligned; K a multiple of 4 (every row as aligned as the tensor). */
typedef struct tt_sgd_dense_rows {
    int32_t K, N, ew;
    int16_t *w16;
    int8_t *w8;
    int16_t *v16;
    int8_t *v8;
    int8_t *e;
    const int8_t *x;
    int32_t ee, ex;
} tt_sgd_dense_rows;

void tt_sgd_dense_rows_keep(tt_sgd_dense_rows *p, const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);
void tt_sgd_dense_rows_apply(const tt_sgd_step *u, const tt_sgd_dense_rows *p, int32_t *buf);

#ifdef __cplusplus
}
#endif

#endif /* TT_SGD_H */
