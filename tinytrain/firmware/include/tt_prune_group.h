/** Structured pruning: whole units (dense neurons, convolution channels) chosen by the L1 norm
 * of their weight rows (tinytrain/graph/prune_groups.py is the specification; numba twins in
 * tinytrain/kernels/prune.py). The masks, tensors and apply are tt_prune.h's. */
#ifndef TT_PRUNE_GROUP_H
#define TT_PRUNE_GROUP_H

#include <stdint.h>

#include "tt_prune.h"

#ifdef __cplusplus
extern "C" {
#endif

/** The units of one pruned tensor: its rows of `row` elements each cut into units of `inner`
 *  (the last of a row shorter when inner does not divide row): element i belongs to unit
 *  (i / row) * ceil(row / inner) + (i % row) / inner. Neurons and channels: row = inner (unit
 *  i / inner, units * inner = n); 1 x 4 blocks of a Dense w[N][K]: inner 4, row K.
 *  lead: the index, within its unit of the schedule, of the ranked tensor (a layer's weights)
 *  whose units this one follows: itself for a ranked tensor; a bias or batch-norm gamma/beta
 *  (inner 1) follows its layer's weights. */
typedef struct tt_prune_group {
    uint32_t units;
    uint32_t inner;
    uint32_t lead;
    uint32_t mult;  /* the norms are (L1 * mult) << shift: mult = lcm(inner) / inner ranked together, else 1 */
    uint32_t row;
} tt_prune_group;

/** Recompute the masks of tensors t[0..count) (described by g[0..count)): prune the k units of
 *  the ranked tensors with the smallest ((L1 * mult) << shift, tensor, unit), L1 = sum of |v| over the
 *  unit's elements of the store (master where there is one; below 2^63, checked at build time);
 *  every tensor's mask follows its lead's units; then tt_prune_apply each. No buffer: a binary
 *  search over norms (at most 64 counting passes). */
void tt_prune_group_select(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t count, uint32_t k);

/** The structured pruning event of optimizer step step, if any: tt_prune_group_select on each
 *  unit with a zeros count (units to prune) >= 0 in its row (unit_start indexes t and g). */
void tt_prune_group_step(const tt_prune_schedule *s, const tt_prune_tensor *t, const tt_prune_group *g,
                         uint32_t step);

#ifdef __cplusplus
}
#endif

#endif /* TT_PRUNE_GROUP_H */
