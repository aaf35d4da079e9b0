/** ReLU kernels (see tinytrain/ops/relu.py for the exact arithmetic). */
#ifndef TT_RELU_H
#define TT_RELU_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** No scratch. */
#define TT_RELU_BUFFER_SIZE(n) 0

/** y[n] = max(x, 0); returns ex (exact, no saturation). y may alias x. */
int32_t tt_relu_fwd_s8(const int8_t *x, int32_t ex, int32_t n, int8_t *y, tt_stats *st);

/** dx[n] = y > 0 ? e : 0 with y the saved forward output; returns ee. dx may alias e. */
int32_t tt_relu_bwd_s8(const int8_t *e, int32_t ee, const int8_t *y, int32_t n, int8_t *dx,
                       tt_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* TT_RELU_H */
