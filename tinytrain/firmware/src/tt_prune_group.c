/** Structured pruning: units ranked by L1 norm (tt_prune_group.h; reference graph/prune_groups.py). */
#include "tt_prune_group.h"

/* The elements [*a, *b) of unit u. */
static void tt_prune_group_range(const tt_prune_group *g, uint32_t u, uint32_t *a, uint32_t *b)
{
    const uint32_t bpr = (g->row + g->inner - 1u) / g->inner, r = u / bpr, j = u % bpr;
    const uint32_t end = (j + 1u) * g->inner;
    *a = r * g->row + j * g->inner;
    *b = r * g->row + (end < g->row ? end : g->row);
}

/* ((sum of |v| over unit u) * mult) << shift, summed as mult * sum(|v| << shift): the same
 * integer, below 2^63 (checked at build time). */
static uint64_t tt_prune_group_norm(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t u)
{
    uint64_t s = 0;
    uint32_t i, a, b;
    tt_prune_group_range(g, u, &a, &b);
    for (i = a; i < b; i++) s += tt_prune_mag(t, i);
    return s * g->mult;
}

/* Units of the ranked tensors with norm <= m. */
static uint32_t tt_prune_group_count_le(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t count,
                                        uint64_t m)
{
    uint32_t j, u, c = 0;
    for (j = 0; j < count; j++)
        if (g[j].lead == j)
            for (u = 0; u < g[j].units; u++) c += tt_prune_group_norm(&t[j], &g[j], u) <= m;
    return c;
}

/* Whether unit u of a ranked tensor is pruned: the bit of its first element. */
static uint32_t tt_prune_group_is_pruned(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t u)
{
    uint32_t i, b;
    tt_prune_group_range(g, u, &i, &b);
    return (t->mask[i / 32u] >> (i % 32u)) & 1u;
}

static void tt_prune_group_mark(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t u)
{
    uint32_t i, a, b;
    tt_prune_group_range(g, u, &a, &b);
    for (i = a; i < b; i++) t->mask[i / 32u] |= 1u << (i % 32u);
}

void tt_prune_group_select(const tt_prune_tensor *t, const tt_prune_group *g, uint32_t count, uint32_t k)
{
    uint32_t j, u, i, n = 0, need;
    uint64_t lo = 0, hi = 0;
    for (j = 0; j < count; j++) {
        for (i = 0; i < (t[j].n + 31u) / 32u; i++) t[j].mask[i] = 0;
        if (g[j].lead != j) continue;
        for (u = 0; u < g[j].units; u++) {
            const uint64_t m = tt_prune_group_norm(&t[j], &g[j], u);
            if (m > hi) hi = m;
        }
        n += g[j].units;
    }
    if (k > 0) {
        if (k < n) {
            /* the smallest T with count(norm <= T) >= k; count(norm <= max) = n >= k */
            while (lo < hi) {
                const uint64_t mid = lo + (hi - lo) / 2u;
                if (tt_prune_group_count_le(t, g, count, mid) >= k) hi = mid;
                else lo = mid + 1u;
            }
        } else {
            lo = hi;
        }
        /* below T: all pruned; equal to T: the first k - count(norm < T) in (tensor, unit) order */
        need = k - (lo > 0 ? tt_prune_group_count_le(t, g, count, lo - 1u) : 0u);
        for (j = 0; j < count; j++) {
            if (g[j].lead != j) continue;
            for (u = 0; u < g[j].units; u++) {
                const uint64_t m = tt_prune_group_norm(&t[j], &g[j], u);
                if (m < lo || (m == lo && need > 0)) {
                    if (m == lo) need--;
                    tt_prune_group_mark(&t[j], &g[j], u);
                }
            }
        }
        for (j = 0; j < count; j++) {  /* the followers: from their lead's (already final) mask */
            if (g[j].lead == j) continue;
            for (u = 0; u < g[j].units; u++)
                if (tt_prune_group_is_pruned(&t[g[j].lead], &g[g[j].lead], u)) tt_prune_group_mark(&t[j], &g[j], u);
        }
    }
    for (j = 0; j < count; j++) tt_prune_apply(&t[j]);
}

void tt_prune_group_step(const tt_prune_schedule *s, const tt_prune_tensor *t, const tt_prune_group *g,
                         uint32_t step)
{
    const int32_t r = tt_prune_row(s, step);
    uint32_t u;
    if (r < 0) return;
    for (u = 0; u < s->units; u++) {
        const int32_t k = s->zeros[(uint32_t)r * s->units + u];
        const uint32_t a = s->unit_start[u];
        if (k >= 0) tt_prune_group_select(&t[a], &g[a], s->unit_start[u + 1] - a, (uint32_t)k);
    }
}
