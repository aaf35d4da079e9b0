/** Magnitude pruning inside the training step (tinytrain/graph/prune.py is the specification;
 * numba twin tinytrain/kernels/prune.py).
 *
 * A mask is a bitmap of (n + 31) / 32 words: bit i % 32 of word i / 32 set when element i
 * (row-major) is pruned; the padding bits are 0. The mask is training state (hashed). */
#ifndef TT_PRUNE_H
#define TT_PRUNE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/** One pruned parameter tensor and its optimizer slots. w holds n elements of w_bytes bytes
 *  each (1: int8, 2: int16, 4: int32); master, acc, vel are int32[n] or NULL when the model
 *  has no such slot. The criterion reads the master where there is one, else w. */
typedef struct tt_prune_tensor {
    uint32_t *mask;
    uint32_t n;
    void *w;
    uint32_t w_bytes;
    int32_t *master;
    int32_t *acc;
    int32_t *vel;
} tt_prune_tensor;

/** The schedule: rows optimizer steps (strictly increasing) and, per row, the number of
 *  zeros of each of the tensors (rows x tensors, row-major), -1: no event for that tensor. */
typedef struct tt_prune_schedule {
    const uint32_t *steps;
    const int32_t *zeros;
    uint32_t rows;
    uint32_t tensors;
} tt_prune_schedule;

/** Set every pruned element of w and of each present slot to zero. */
void tt_prune_apply(const tt_prune_tensor *t);

/** Recompute the mask: prune the k elements with the smallest (|v|, index) (k >= n: all), then
 *  tt_prune_apply. No buffer: a binary search over magnitudes (at most 32 counting passes). */
void tt_prune_select(const tt_prune_tensor *t, uint32_t k);

/** The row of step t in the schedule, -1 when t has no event (binary search). */
int32_t tt_prune_row(const tt_prune_schedule *s, uint32_t t);

/** The pruning event of optimizer step t, if any: tt_prune_select on each tensor[j] with a
 *  zeros count >= 0 in t's row. */
void tt_prune_step(const tt_prune_schedule *s, const tt_prune_tensor *tensor, uint32_t t);

#ifdef __cplusplus
}
#endif

#endif /* TT_PRUNE_H */
