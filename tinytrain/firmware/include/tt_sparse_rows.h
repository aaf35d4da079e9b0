/** Row storage of a pruned Dense layer whose mask is final ("rows" in tinytrain/codegen/sparse.py),
 * and kernels that skip the pruned weights. The masked dense layer of tinytrain/ops/dense.py +
 * graph/prune.py is the specification; every kernel here equals it bit for bit.
 *
 * The kept weights of w[N][K] are packed row by row (element order), and so are their int32
 * master, accumulator and momentum. Their columns are a code stream, one byte per step, each
 * row's bytes on their own and its column c starting at -1:
 *   b >= 0x10: two kept weights, at c += b & 15, then c += b >> 4 (both gaps in 1..15);
 *   b in 1..15: one kept weight, at c += b;
 *   b == 0: no weight, c += 15 (a gap over 15 is 0x00 bytes, then the rest).
 * code[2 n] is the number of bytes of row n, code[2 n + 1] its kept weights; the rows' bytes
 * follow, from code + 2 N. Every count is below K + 1, so K <= 255 (and N <= TT_DENSE_S32_MAX_N,
 * K <= TT_DENSE_S32_MAX_K: every sum is an exact int32). At 80 % (W1: 474 kept of 2,368) that
 * is 2.5 bytes per kept weight and 2 per row: 26.9 % of the dense int16 bytes.
 *
 * Why rows: the forward keeps its accumulator in a register and reads x by the decoded column
 * (a pair of weights per byte: one SMLAD on the Cortex-M4); the input error and the update pass
 * a row whose error is 0 in two additions (most are, once the model is trained), where a
 * column walk must look at every kept weight. A column whose input is 0 is not passed over.
 *
 * The updates apply the element rules of tt_sgd.h to the kept elements in element order; a
 * pruned element's update would be discarded, but under stochastic rounding it still draws its
 * PRNG number when the rule draws one, so the order of draws is that of the dense tensor.
 * Saturations of pruned elements are not counted (they would be undone). */
#ifndef TT_SPARSE_ROWS_H
#define TT_SPARSE_ROWS_H

#include <stdint.h>
#include "tt_fixedpoint.h"
#include "tt_sgd.h"

#ifdef __cplusplus
extern "C" {
#endif

/** A Dense layer y[N] = w[N][K] x[K] + b[N] with w stored by rows: code (above) and the kept
 *  weights w[nnz] at exponent ew; b[N] at eb. */
typedef struct tt_sparse_rows_params {
    int32_t K;
    int32_t N;
    const uint8_t *code;
    const int16_t *w;
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_sparse_rows_params;

/** tt_dense_fwd_s8 over the kept weights. Scratch: N int32. */
int32_t tt_sparse_rows_fwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                              int32_t ex, int8_t *y);

/** tt_dense_bwd_s8 (dx = requant(w^T e), pre-update weights) over the kept weights. Scratch: K int32. */
int32_t tt_sparse_rows_bwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx);

/** The packed weight gradient gw[nnz] = e[n] x[k] of the kept (n, k), element order (exponent
 *  ee + ex), and gb[N] = e[n] (exponent ee). */
void tt_sparse_rows_grad_s32(const tt_sparse_rows_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb);

/** Where a direct-mode update writes: the packed weights (int16, or their int32 master) at
 *  exponent ew, biases b[N] at eb; a NULL tensor is frozen. work: int32 scratch of K words. */
typedef struct tt_sparse_rows_sgd_s16_params {
    int32_t K, N;
    const uint8_t *code;
    int16_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    int32_t *work;
} tt_sparse_rows_sgd_s16_params;

/** The same with an int32 master as the packed store. */
typedef struct tt_sparse_rows_sgd_s32_params {
    int32_t K, N;
    const uint8_t *code;
    int32_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    int32_t *work;
} tt_sparse_rows_sgd_s32_params;

/** tt_sgd_dense_direct_s16 on the kept weights (weights in element order, then biases, same PRNG order). */
void tt_sparse_rows_sgd_direct_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                   const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** The same on an int32 master. */
void tt_sparse_rows_sgd_direct_s32(const tt_sgd_step *u, const tt_sparse_rows_sgd_s32_params *p,
                                   const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** One packed weight tensor: its code, its dims and K words of int32 work. */
typedef struct tt_sparse_rows_layout {
    const uint8_t *code;
    int32_t K, N;
    int32_t *work;
} tt_sparse_rows_layout;

/** tt_sgd_accumulate_s32 on the packed accumulator A[nnz] with the packed gradient g[nnz]. */
void tt_sparse_rows_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t *A,
                                       int32_t ew, const int32_t *g, int32_t eg);

/** tt_sgd_apply_accumulated_s16 / _s32 / _s16_v16 on packed w, A, V (V NULL: no momentum). */
void tt_sparse_rows_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                              int16_t *w, int32_t *A, int32_t *V);
void tt_sparse_rows_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                              int32_t *w, int32_t *A, int32_t *V);
void tt_sparse_rows_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                  int16_t *w, int32_t *A, int16_t *V);

/** The kept weights of a code (the sum of its rows' counts). */
int32_t tt_sparse_rows_count(const uint8_t *code, int32_t N);

/** The columns of the kept weights of row n into cols (at most K); returns how many. */
int32_t tt_sparse_rows_columns(const uint8_t *code, int32_t N, int32_t n, int32_t *cols);

#ifdef __cplusplus
}
#endif

#endif /* TT_SPARSE_ROWS_H */
