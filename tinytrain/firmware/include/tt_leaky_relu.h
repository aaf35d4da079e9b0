/** Leaky ReLU kernels (see tinytrain/ops/leaky_relu.py for the exact arithmetic). Small enough
 *  to live in the header: the calls inline into the generated training step. */
#ifndef TT_LEAKY_RELU_H
#define TT_LEAKY_RELU_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** No scratch. */
#define TT_LEAKY_RELU_BUFFER_SIZE(n) 0

/** v * slope_q8 / 256 rounded to nearest, ties toward +inf (arithmetic shift); |result| <= |v|. */
static inline int8_t tt_leaky_relu_scale(int32_t v, int32_t slope_q8)
{
    return (int8_t)((v * slope_q8 + 128) >> 8);
}

/** y[n] = x > 0 ? x : x * slope_q8 / 256 (slope_q8 in 1..255); returns ex (never saturates).
 *  y may alias x. */
static inline int32_t tt_leaky_relu_fwd_s8(const int8_t *x, int32_t ex, int32_t n, int32_t slope_q8,
                                           int8_t *y, tt_stats *st)
{
    int32_t i;
    (void)st;
    for (i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : tt_leaky_relu_scale(x[i], slope_q8);
    return ex;
}

/** dx[n] = y > 0 ? e : e * slope_q8 / 256 with y the saved forward output; returns ee.
 *  dx may alias e. */
static inline int32_t tt_leaky_relu_bwd_s8(const int8_t *e, int32_t ee, const int8_t *y, int32_t n,
                                           int32_t slope_q8, int8_t *dx, tt_stats *st)
{
    int32_t i;
    (void)st;
    for (i = 0; i < n; i++) dx[i] = y[i] > 0 ? e[i] : tt_leaky_relu_scale(e[i], slope_q8);
    return ee;
}

#ifdef __cplusplus
}
#endif

#endif /* TT_LEAKY_RELU_H */
