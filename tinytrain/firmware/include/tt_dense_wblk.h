/** Dense kernels for block-exponent weights (precision "exponent": "row" | "block32"; see
 *  tinytrain/ops/wblock.py for the format and the narrowing rule, tinytrain/ops/dense.py for
 *  the arithmetic on the decoded weights q << s). */
#ifndef TT_DENSE_WBLK_H
#define TT_DENSE_WBLK_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A Dense layer whose weights w[N][K] are q[n][k] << ws[n][k / L] at exponent ew: blocks of L
 *  weights along each row, nb = ceil(K / L) shifts per row. int4: q packed two per byte,
 *  element i = n * K + k in byte i / 2, low nibble first (two's complement nibbles, [-7, 7]). */
typedef struct tt_dense_w4blk_params {
    int32_t K;
    int32_t N;
    int32_t L;             /* weights per block, 1 <= L <= K */
    const uint8_t *w;      /* packed q, ceil(N * K / 2) bytes */
    const uint8_t *ws;     /* ws[N][nb] shifts in [0, 12] */
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_dense_w4blk_params;

/** tt_dense_w4blk_params with int8 q in [-127, 127] and shifts in [0, 8]. */
typedef struct tt_dense_w8blk_params {
    int32_t K;
    int32_t N;
    int32_t L;
    const int8_t *w;
    const uint8_t *ws;
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_dense_w8blk_params;

/** The forward of tt_dense_fwd_s8 on the decoded weights. Scratch: N int64. */
int32_t tt_dense_fwd_s8_w4blk(const tt_ctx *ctx, const tt_dense_w4blk_params *p, const int8_t *x,
                              int32_t ex, int8_t *y);
int32_t tt_dense_fwd_s8_w8blk(const tt_ctx *ctx, const tt_dense_w8blk_params *p, const int8_t *x,
                              int32_t ex, int8_t *y);

/** The input error of tt_dense_bwd_s8 on the decoded weights. Scratch: K int64. */
int32_t tt_dense_bwd_s8_w4blk(const tt_ctx *ctx, const tt_dense_w4blk_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx);
int32_t tt_dense_bwd_s8_w8blk(const tt_ctx *ctx, const tt_dense_w8blk_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx);

/** tt_dense_grad_s32 for these layers (the gradients do not read the weights). */
void tt_dense_grad_s32_w4blk(const tt_dense_w4blk_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb);
void tt_dense_grad_s32_w8blk(const tt_dense_w8blk_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb);

/** Narrow an int16 master m[N][K] into q and the shifts ws[N][nb] (ops/wblock.narrow): per block
 *  s = the smallest s in [0, smax] with rshift_round(max |m|, s) <= qmax, q = clamp(rshift_round(m, s)). */
void tt_wblock_refresh_s16_w4(const int16_t *m, uint8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L);
void tt_wblock_refresh_s16_w8(const int16_t *m, int8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L);

/** The same for the rows n with e[n] != 0 only: after a direct (batch 1) update without weight
 *  decay, whose rows with a zero output error leave their master rows, so their blocks, as they were. */
void tt_wblock_refresh_rows_s16_w4(const int16_t *m, uint8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L,
                                   const int8_t *e);
void tt_wblock_refresh_rows_s16_w8(const int16_t *m, int8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L,
                                   const int8_t *e);

#ifdef __cplusplus
}
#endif

#endif /* TT_DENSE_WBLK_H */
