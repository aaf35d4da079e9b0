/** Magnitude pruning: masks, criterion, schedule (tt_prune.h; reference graph/prune.py). */
#include "tt_prune.h"

/* |v| of element i of the tensor the criterion reads, as uint32 (|INT32_MIN| = 2^31 fits). */
static uint32_t tt_prune_mag(const tt_prune_tensor *t, uint32_t i)
{
    int32_t v;
    if (t->master) v = t->master[i];
    else if (t->w_bytes == 1) v = ((const int8_t *)t->w)[i];
    else if (t->w_bytes == 2) v = ((const int16_t *)t->w)[i];
    else v = ((const int32_t *)t->w)[i];
    return v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
}

static void tt_prune_zero_at(const tt_prune_tensor *t, uint32_t i)
{
    if (t->w_bytes == 1) ((int8_t *)t->w)[i] = 0;
    else if (t->w_bytes == 2) ((int16_t *)t->w)[i] = 0;
    else ((int32_t *)t->w)[i] = 0;
    if (t->master) t->master[i] = 0;
    if (t->acc) t->acc[i] = 0;
    if (t->vel) t->vel[i] = 0;
}

void tt_prune_apply(const tt_prune_tensor *t)
{
    const uint32_t words = (t->n + 31u) / 32u;
    uint32_t wi, b;
    for (wi = 0; wi < words; wi++) {
        const uint32_t word = t->mask[wi];
        if (word == 0) continue;
        for (b = 0; b < 32u; b++)
            if ((word >> b) & 1u) tt_prune_zero_at(t, wi * 32u + b);  /* padding bits are 0 */
    }
}

/* Elements with |v| <= m. */
static uint32_t tt_prune_count_le(const tt_prune_tensor *t, uint32_t m)
{
    uint32_t i, c = 0;
    for (i = 0; i < t->n; i++) c += tt_prune_mag(t, i) <= m;
    return c;
}

void tt_prune_select(const tt_prune_tensor *t, uint32_t k)
{
    const uint32_t words = (t->n + 31u) / 32u;
    uint32_t i, lo = 0, hi = 0, need;
    for (i = 0; i < words; i++) t->mask[i] = 0;
    if (k == 0) return;
    for (i = 0; i < t->n; i++) {
        const uint32_t m = tt_prune_mag(t, i);
        if (m > hi) hi = m;
    }
    if (k < t->n) {
        /* the smallest T with count(|v| <= T) >= k; count(|v| <= max) = n >= k */
        while (lo < hi) {
            const uint32_t mid = lo + (hi - lo) / 2u;
            if (tt_prune_count_le(t, mid) >= k) hi = mid;
            else lo = mid + 1u;
        }
    } else {
        lo = hi;
    }
    /* below T: all pruned; equal to T: the first k - count(|v| < T) by index */
    need = k - (lo > 0 ? tt_prune_count_le(t, lo - 1u) : 0u);
    for (i = 0; i < t->n; i++) {
        const uint32_t m = tt_prune_mag(t, i);
        if (m < lo || (m == lo && need > 0)) {
            if (m == lo) need--;
            t->mask[i / 32u] |= 1u << (i % 32u);
        }
    }
    tt_prune_apply(t);
}

int32_t tt_prune_row(const tt_prune_schedule *s, uint32_t t)
{
    uint32_t lo = 0, hi = s->rows;
    while (lo < hi) {
        const uint32_t mid = lo + (hi - lo) / 2u;
        if (s->steps[mid] < t) lo = mid + 1u;
        else hi = mid;
    }
    return lo < s->rows && s->steps[lo] == t ? (int32_t)lo : -1;
}

void tt_prune_step(const tt_prune_schedule *s, const tt_prune_tensor *tensor, uint32_t t)
{
    const int32_t r = tt_prune_row(s, t);
    uint32_t j;
    if (r < 0) return;
    for (j = 0; j < s->tensors; j++) {
        const int32_t k = s->zeros[(uint32_t)r * s->tensors + j];
        if (k >= 0) tt_prune_select(&tensor[j], (uint32_t)k);
    }
}
