/** Integer SGD update rules (see tinytrain/optim.py; numba twin tinytrain/kernels/optim.py). */
#ifndef TT_SGD_H
#define TT_SGD_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

#define TT_SGD_GUARD_BITS 8

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

/** Direct mode: w -= shift(m_t * g, ew + k - eg) (+ decay), saturating to [lo, hi].
 *  w is int16 (w16 != NULL) or int32 (w32 != NULL). prng: state for stochastic rounding. */
void tt_sgd_update_direct(int16_t *w16, int32_t *w32, int32_t n, int32_t ew, const int32_t *g,
                          int32_t eg, const tt_sgd *o, int32_t m_t, uint32_t *prng, tt_stats *st);

/** Accumulate mode, per sample: A = sat32(A + shift(m_t * g, ew + k - eg - G)). */
void tt_sgd_accumulate(int32_t *A, int32_t n, int32_t ew, const int32_t *g, int32_t eg,
                       const tt_sgd *o, int32_t m_t, uint32_t *prng);

/** Accumulate mode, end of batch: averaging, momentum V (may be NULL), decay, update, A = 0. */
void tt_sgd_apply_accumulated(int16_t *w16, int32_t *w32, int32_t *A, int32_t *V, int32_t n,
                              const tt_sgd *o, uint32_t *prng, tt_stats *st);

/** Direct-mode update of a Dense layer without a gradient buffer: the gradient
 *  g[n][k] = e[n] * x[k] (exponent ee + ex) and gb[n] = e[n] (exponent ee) is formed element by
 *  element and applied exactly as tt_sgd_update_direct would (weights row-major, then biases,
 *  same PRNG order). Rows with e[n] == 0 are skipped when that cannot change the result
 *  (no stochastic rounding, no weight decay). w16 or w32 (master) receives the weight update;
 *  upd_w / upd_b select which tensors learn. */
void tt_sgd_dense_direct(const int8_t *e, int32_t ee, const int8_t *x, int32_t ex, int32_t K,
                         int32_t N, int16_t *w16, int32_t *w32, int32_t ew, int32_t *b,
                         int32_t eb, int32_t upd_w, int32_t upd_b, const tt_sgd *o, int32_t m_t,
                         uint32_t *prng, tt_stats *st);

/** int16 compute copy of an int32 master: sat_s16(rshift_round(master, 16)). */
void tt_sgd_refresh_copy(const int32_t *master, int16_t *w16, int32_t n);

#ifdef __cplusplus
}
#endif

#endif /* TT_SGD_H */
