/** Flatten kernels (see tinytrain/ops/flatten.py): (H, W, C) channels-last is already the
 * flat C order, so both directions are a copy (nothing at all when the buffers alias). */
#ifndef TT_FLATTEN_H
#define TT_FLATTEN_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** No scratch. */
#define TT_FLATTEN_BUFFER_SIZE(n) 0

/** y[n] = x[n]; returns ex. y may alias x. */
int32_t tt_flatten_fwd_s8(const int8_t *x, int32_t ex, int32_t n, int8_t *y, tt_stats *st);

/** dx[n] = e[n]; returns ee. dx may alias e. */
int32_t tt_flatten_bwd_s8(const int8_t *e, int32_t ee, int32_t n, int8_t *dx, tt_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* TT_FLATTEN_H */
