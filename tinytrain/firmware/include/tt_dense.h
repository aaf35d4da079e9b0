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

/** A Dense layer y[N] = w[N][K] x[K] + b[N]: its dims and its parameters with their
 *  (build-time, fixed) exponents. w is row-major (one row of K weights per output). */
typedef struct tt_dense_params {
    int32_t K;             /* inputs (fan-in), >= 1 */
    int32_t N;             /* outputs (fan-out), >= 1 */
    const int16_t *w;      /* w[N][K] at exponent ew */
    int32_t ew;
    const int32_t *b;      /* b[N] at exponent eb */
    int32_t eb;
} tt_dense_params;

/** y[N] = requant_s8(w x + align(b)); returns the output exponent. Scratch: N int64. */
int32_t tt_dense_fwd_s8(const tt_ctx *ctx, const tt_dense_params *p, const int8_t *x,
                        int32_t ex, int8_t *y);

/** dx[K] = requant_s8(w^T e) with the current (pre-update) weights; returns its exponent.
 *  Scratch: K int64. */
int32_t tt_dense_bwd_s8(const tt_ctx *ctx, const tt_dense_params *p, const int8_t *e,
                        int32_t ee, int8_t *dx);

/** gw[N][K] = e[n] x[k] (exponent ee + ex), gb[N] = e[n] (exponent ee); w and b are not read. */
void tt_dense_grad_s32(const tt_dense_params *p, const int8_t *e, const int8_t *x, int32_t *gw,
                       int32_t *gb);

/* ---- int8 weights (precision policy "weights": "int8"): the same arithmetic, w int8 ---- */

/** Largest fan-in for which the int8-weight forward sum provably fits int32
 *  (K * 127 * 127 + 2^30 < 2^31). */
#define TT_DENSE_W8_S32_MAX_K 66572
/** Largest fan-out for which the int8-weight dx column sum provably fits int32. */
#define TT_DENSE_W8_S32_MAX_N 133144

/** tt_dense_params with int8 weights. */
typedef struct tt_dense_w8_params {
    int32_t K;
    int32_t N;
    const int8_t *w;       /* w[N][K] at exponent ew, in [-127, 127] */
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_dense_w8_params;

/** tt_dense_fwd_s8 with int8 weights. Scratch: N int64. */
int32_t tt_dense_fwd_s8_w8(const tt_ctx *ctx, const tt_dense_w8_params *p, const int8_t *x,
                           int32_t ex, int8_t *y);

/** tt_dense_bwd_s8 with int8 weights. Scratch: K int64. */
int32_t tt_dense_bwd_s8_w8(const tt_ctx *ctx, const tt_dense_w8_params *p, const int8_t *e,
                           int32_t ee, int8_t *dx);

/** tt_dense_grad_s32 for a layer with int8 weights (the gradients do not read them). */
void tt_dense_grad_s32_w8(const tt_dense_w8_params *p, const int8_t *e, const int8_t *x,
                          int32_t *gw, int32_t *gb);

#ifdef __cplusplus
}
#endif

#endif /* TT_DENSE_H */
