/** Dense layer kernels (see tinytrain/ops/dense.py for the exact arithmetic). */
#ifndef TT_DENSE_H
#define TT_DENSE_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Largest fan-in (K) for which the forward accumulator provably fits int32 (with the bias
 *  aligned and clamped to 2^30: K * 127 * 32767 <= 2^30). Larger layers use int64. */
#define TT_DENSE_S32_MAX_K 258
/** Largest fan-out (N) for which the dx column sum provably fits int32. */
#define TT_DENSE_S32_MAX_N 516

/** Scratch (bytes) the forward and backward kernels need: one int64 per output / input. */
#define TT_DENSE_BUFFER_SIZE(K, N) (8 * ((K) > (N) ? (K) : (N)))

/** y[N] = requant_s8(w[N][K] x[K] + align(b)); returns the output exponent. */
int32_t tt_dense_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                        const int32_t *b, int32_t eb, int32_t K, int32_t N,
                        int64_t *scratch, int8_t *y, tt_stats *st);

/** dx[K] = requant_s8(w^T e) with the current (pre-update) weights; returns its exponent. */
int32_t tt_dense_bwd_s8(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                        int32_t K, int32_t N, int64_t *scratch, int8_t *dx, tt_stats *st);

/** gw[N][K] = e[n] x[k] (exponent ee + ex), gb[N] = e[n] (exponent ee). */
void tt_dense_grad_s32(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                       int32_t *gw, int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_DENSE_H */
