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
 *  has no such slot. The criterion reads the master where there is one, else w, and ranks
 *  |v| << shift (0 alone; in a unit ranked together, the shift onto the smallest exponent). */
typedef struct tt_prune_tensor {
    uint32_t *mask;
    uint32_t n;
    void *w;
    uint32_t w_bytes;
    void *master;           /* the master copy (NULL: none), master_bytes per element */
    uint32_t master_bytes;
    int32_t *acc;
    void *vel;              /* momentum (NULL: none), vel_bytes per element */
    uint32_t vel_bytes;
    uint32_t shift;
} tt_prune_tensor;

/** The schedule: rows optimizer steps (strictly increasing) and, per row, the number of zeros
 *  of each of the units (rows x units, row-major; -1: no event for that unit). Unit u is the
 *  tensors [unit_start[u], unit_start[u + 1]) of the tensor table (one tensor in scope "layer",
 *  several ranked together in scope "global"). */
typedef struct tt_prune_schedule {
    const uint32_t *steps;
    const int32_t *zeros;
    const uint32_t *unit_start;
    uint32_t rows;
    uint32_t units;
} tt_prune_schedule;

/** |v| << shift of element i of the store the criterion reads (the master where there is one;
 *  also tt_prune_group.c's). */
uint64_t tt_prune_mag(const tt_prune_tensor *t, uint32_t i);

/** Set every pruned element of w and of each present slot to zero. */
void tt_prune_apply(const tt_prune_tensor *t);

/** Recompute the masks of the count tensors t[0..count): prune the k elements with the
 *  smallest (|v| << shift, tensor, index) (k >= their size: all), then tt_prune_apply each.
 *  No buffer: a binary search over magnitudes (at most 64 counting passes; 32 in scope
 *  "layer"). */
void tt_prune_select(const tt_prune_tensor *t, uint32_t count, uint32_t k);

/** The row of step t in the schedule, -1 when t has no event (binary search). */
int32_t tt_prune_row(const tt_prune_schedule *s, uint32_t t);

/** The pruning event of optimizer step t, if any: tt_prune_select on each unit with a zeros
 *  count >= 0 in t's row. */
void tt_prune_step(const tt_prune_schedule *s, const tt_prune_tensor *tensor, uint32_t t);

#ifdef __cplusplus
}
#endif

#endif /* TT_PRUNE_H */
