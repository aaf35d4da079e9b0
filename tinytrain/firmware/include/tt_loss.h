/** Loss heads: integer softmax cross-entropy and MSE (see tinytrain/ops/softmax_ce.py, mse.py). */
#ifndef TT_LOSS_H
#define TT_LOSS_H

#include <stdint.h>
#include <string.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** What a loss head writes: the int8 error e[N] (the caller's buffer) and its exponent ee,
 *  and the loss. */
typedef struct tt_loss_out {
    int8_t *e;
    int32_t ee;
    int32_t loss_q16;      /* softmax CE: -log2(p_label) in Q16 */
} tt_loss_out;

/** Softmax CE on int8 logits z[N] (exponent ez) for label: fills out (e, ee, loss_q16);
 *  returns argmax(z). Scratch: N int64; on return ctx->scratch[0..N) holds the error g before
 *  requantization (Q15, exponent -15), which tt_loss_scale_s8 reads under a global loss scale. */
int32_t tt_softmax_ce_s8(const tt_ctx *ctx, const int8_t *z, int32_t ez, int32_t label,
                         int32_t N, tt_loss_out *out);

/** MSE on int8 y[N] (ey) against int8 t[N] (et); writes error e[N], *ee, the sum of squares
 *  *loss (exponent 2*min(ey, et)). g: N int64 scratch. */
void tt_mse_s8(const int8_t *y, int32_t ey, const int8_t *t, int32_t et, int32_t N, int64_t *g,
               int8_t *e, int32_t *ee, int64_t *loss, tt_stats *st);

/** A global or static loss scale (tinytrain/graph/loss_scale.py): GradScaler's keys as
 *  exponents of two. The state is int32 [E, clean steps in a row, overflow steps]. */
typedef struct tt_loss_scaler {
    int32_t mode;              /* 1 global (skip on overflow, grow, back off), 2 static */
    int32_t growth_factor, backoff_factor, growth_interval, min_scale, max_scale;
} tt_loss_scaler;

/** The head error g[N] (int64, exponent eg) into e[N] at the fixed exponent -state[0]
 *  (round-to-nearest, ties toward +inf; saturating to +-127, counted in st); *ee = -state[0];
 *  then the state advances. Returns 1 when the step is to be skipped (global mode, some
 *  element saturated), else 0. */
int32_t tt_loss_scale_s8(const tt_loss_scaler *cfg, int32_t *state, const int64_t *g, int32_t eg,
                         int32_t N, int8_t *e, int32_t *ee, tt_stats *st);

/** 1 if every e[i] (i < n) is 0, else 0: a loss error all 0 leaves a plain SGD step's
 *  backward nothing to change (the generated step then skips it). A word at a time (any
 *  alignment: memcpy), inline: n is a constant there. */
static inline int32_t tt_all_zero_s8(const int8_t *e, int32_t n)
{
    uint32_t o = 0, v;
    int32_t i = 0;
    for (; i + 4 <= n; i += 4) {
        memcpy(&v, e + i, 4);
        o |= v;
    }
    for (; i < n; i++) o |= (uint8_t)e[i];
    return o == 0;
}

/** argmax with the first index on ties. */
int32_t tt_argmax_s8(const int8_t *z, int32_t N);

#ifdef __cplusplus
}
#endif

#endif /* TT_LOSS_H */
