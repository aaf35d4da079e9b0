/** Sparse storage of a pruned Dense layer whose mask is final, and kernels that skip the pruned
 * weights (the masked dense layer of tinytrain/ops/dense.py + graph/prune.py is the
 * specification; every kernel here equals it bit for bit).
 *
 * Storage, column by column (the input k of w[N][K] outer, the output n inner, so that a column
 * whose input is 0 is passed over whole): the mask transposed, each column in whole words --
 * S = ceil(N / 32) words per input k, bit n % 32 of word k * S + n / 32 set when w[n][k] is
 * pruned, the padding bits set too -- (the state blob keeps tt_prune.h's row-major mask: the
 * state span shows it in that order, tt_state.h), and the kept weights packed in the same
 * order (nnz of them). Every optimizer slot of the weights (int32 master, accumulator, momentum)
 * is packed the same way: the pruned slots do not exist. The mask is constant (in flash): the
 * layer has no pruning event left.
 *
 * Sums are exact (int32 below the bounds of tt_dense.h, int64 above), so skipping the products
 * with a pruned (zero) weight changes nothing. The updates apply the element rules of tt_sgd.h
 * to the kept elements in element order; a pruned element's update would be discarded, but under
 * stochastic rounding it still draws its PRNG number when the rule draws one (update and
 * accumulate: shift s > 0; end of batch: always), so the order of draws is that of the dense
 * tensor. Saturations of pruned elements are not counted (they would be undone). */
#ifndef TT_SPARSE_H
#define TT_SPARSE_H

#include <stdint.h>
#include "tt_fixedpoint.h"
#include "tt_sgd.h"

#ifdef __cplusplus
extern "C" {
#endif

/** Scratch (bytes) the sparse Dense kernels need: one int64 per output / input, as Dense. */
#define TT_SPARSE_BUFFER_SIZE(K, N) (8 * ((K) > (N) ? (K) : (N)))

/** A Dense layer y[N] = w[N][K] x[K] + b[N] with w stored sparse: the column-major mask (K * S
 *  words) and the kept weights w[nnz] in that order at exponent ew; b[N] at eb. */
typedef struct tt_sparse_dense_params {
    int32_t K;
    int32_t N;
    const uint32_t *mask;
    const int16_t *w;
    int32_t ew;
    const int32_t *b;
    int32_t eb;
} tt_sparse_dense_params;

/** tt_dense_fwd_s8 over the kept weights. Scratch: N int64. */
int32_t tt_sparse_dense_fwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *x,
                               int32_t ex, int8_t *y);

/** tt_dense_bwd_s8 (dx = requant(w^T e), pre-update weights) over the kept weights. Scratch: K int64. */
int32_t tt_sparse_dense_bwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *e,
                               int32_t ee, int8_t *dx);

/** The packed weight gradient gw[nnz] = e[n] x[k] of the kept (n, k), packed order (exponent ee + ex)
 *  and gb[N] = e[n] (exponent ee). */
void tt_sparse_dense_grad_s32(const tt_sparse_dense_params *p, const int8_t *e, const int8_t *x,
                              int32_t *gw, int32_t *gb);

/** Where a direct-mode update of a sparse Dense layer writes: the packed weights (w, int16, or
 *  its int32 master) at exponent ew, biases b[N] at eb; a NULL tensor is frozen. work: int32
 *  scratch of at least max(K, N) words. */
typedef struct tt_sparse_sgd_dense_s16_params {
    int32_t K, N;
    const uint32_t *mask;
    int16_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    int32_t *work;
} tt_sparse_sgd_dense_s16_params;

/** The same with an int32 master as the packed store. */
typedef struct tt_sparse_sgd_dense_s32_params {
    int32_t K, N;
    const uint32_t *mask;
    int32_t *w;
    int32_t ew;
    int32_t *b;
    int32_t eb;
    int32_t *work;
} tt_sparse_sgd_dense_s32_params;

/** tt_sgd_dense_direct_s16 on the kept weights (weights row-major, then biases, same PRNG order). */
void tt_sparse_sgd_dense_direct_s16(const tt_sgd_step *u, const tt_sparse_sgd_dense_s16_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** The same on an int32 master. */
void tt_sparse_sgd_dense_direct_s32(const tt_sgd_step *u, const tt_sparse_sgd_dense_s32_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex);

/** One packed weight tensor: its column-major mask, its dims and K words of int32 work. */
typedef struct tt_sparse_layout {
    const uint32_t *mask;
    int32_t K, N;
    int32_t *work;
} tt_sparse_layout;

/** tt_sgd_accumulate_s32 on the packed accumulator A[nnz] with the packed gradient g[nnz]. */
void tt_sparse_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *A,
                                  int32_t ew, const int32_t *g, int32_t eg);

/** tt_sgd_apply_accumulated_s16 / _s32 / _s16_v16 on packed w, A, V (V NULL: no momentum). */
void tt_sparse_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                         int32_t *A, int32_t *V);
void tt_sparse_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *w,
                                         int32_t *A, int32_t *V);
void tt_sparse_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                             int32_t *A, int16_t *V);

/** Kept weights of a column-major mask of w[N][K]: its clear bits (the padding bits are set). */
int32_t tt_sparse_count(const uint32_t *mask, int32_t K, int32_t N);

#ifdef __cplusplus
}
#endif

#endif /* TT_SPARSE_H */
