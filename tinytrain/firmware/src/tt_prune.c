/** Magnitude pruning: masks, criterion, schedule (tt_prune.h; reference graph/prune.py). */
#include "tt_prune.h"

/* |v| << shift of element i of the tensor the criterion reads (|v| <= 2^31, shift <= 31). */
uint64_t tt_prune_mag(const tt_prune_tensor *t, uint32_t i)
{
    int32_t v;
    if (t->master) v = t->master_bytes == 2 ? ((const int16_t *)t->master)[i] : ((const int32_t *)t->master)[i];
    else if (t->w_bytes == 1) v = ((const int8_t *)t->w)[i];
    else if (t->w_bytes == 2) v = ((const int16_t *)t->w)[i];
    else v = ((const int32_t *)t->w)[i];
    return (uint64_t)(v < 0 ? 0u - (uint32_t)v : (uint32_t)v) << t->shift;
}

/* Index of the lowest set bit of a nonzero word. */
static uint32_t tt_prune_ctz(uint32_t w)
{
#if defined(__GNUC__) && (defined(__ARM_FEATURE_CLZ) || !defined(__arm__))  /* one instruction or two */
    return (uint32_t)__builtin_ctz(w);
#else
    uint32_t b = 0;
    while (!(w & 1u)) { w >>= 1; b++; }
    return b;
#endif
}

/* Zero the pruned elements of one array of element size bytes: only the set bits are visited
 * (the padding bits are 0), the dtype chosen once. */
static void tt_prune_zero(const uint32_t *mask, uint32_t n, void *a, uint32_t bytes)
{
    const uint32_t words = (n + 31u) / 32u;
    uint32_t wi;
    for (wi = 0; wi < words; wi++) {
        uint32_t word = mask[wi];
        const uint32_t base = wi * 32u;
        if (bytes == 1) {
            int8_t *p = (int8_t *)a + base;
            for (; word; word &= word - 1u) p[tt_prune_ctz(word)] = 0;
        } else if (bytes == 2) {
            int16_t *p = (int16_t *)a + base;
            for (; word; word &= word - 1u) p[tt_prune_ctz(word)] = 0;
        } else {
            int32_t *p = (int32_t *)a + base;
            for (; word; word &= word - 1u) p[tt_prune_ctz(word)] = 0;
        }
    }
}

void tt_prune_apply(const tt_prune_tensor *t)
{
    tt_prune_zero(t->mask, t->n, t->w, t->w_bytes);
    if (t->master) tt_prune_zero(t->mask, t->n, t->master, t->master_bytes);
    if (t->acc) tt_prune_zero(t->mask, t->n, t->acc, 4u);
    if (t->vel) tt_prune_zero(t->mask, t->n, t->vel, t->vel_bytes);
}

/* Elements of the unit with magnitude <= m. */
static uint32_t tt_prune_count_le(const tt_prune_tensor *t, uint32_t count, uint64_t m)
{
    uint32_t j, i, c = 0;
    for (j = 0; j < count; j++)
        for (i = 0; i < t[j].n; i++) c += tt_prune_mag(&t[j], i) <= m;
    return c;
}

void tt_prune_select(const tt_prune_tensor *t, uint32_t count, uint32_t k)
{
    uint32_t j, i, n = 0, need;
    uint64_t lo = 0, hi = 0;
    for (j = 0; j < count; j++) {
        for (i = 0; i < (t[j].n + 31u) / 32u; i++) t[j].mask[i] = 0;
        for (i = 0; i < t[j].n; i++) {
            const uint64_t m = tt_prune_mag(&t[j], i);
            if (m > hi) hi = m;
        }
        n += t[j].n;
    }
    if (k == 0) return;
    if (k < n) {
        /* the smallest T with count(m <= T) >= k; count(m <= max) = n >= k */
        while (lo < hi) {
            const uint64_t mid = lo + (hi - lo) / 2u;
            if (tt_prune_count_le(t, count, mid) >= k) hi = mid;
            else lo = mid + 1u;
        }
    } else {
        lo = hi;
    }
    /* below T: all pruned; equal to T: the first k - count(m < T) in (tensor, index) order */
    need = k - (lo > 0 ? tt_prune_count_le(t, count, lo - 1u) : 0u);
    for (j = 0; j < count; j++) {
        for (i = 0; i < t[j].n; i++) {
            const uint64_t m = tt_prune_mag(&t[j], i);
            if (m < lo || (m == lo && need > 0)) {
                if (m == lo) need--;
                t[j].mask[i / 32u] |= 1u << (i % 32u);
            }
        }
        tt_prune_apply(&t[j]);
    }
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
    uint32_t u;
    if (r < 0) return;
    for (u = 0; u < s->units; u++) {
        const int32_t k = s->zeros[(uint32_t)r * s->units + u];
        if (k >= 0) tt_prune_select(&tensor[s->unit_start[u]], s->unit_start[u + 1] - s->unit_start[u], (uint32_t)k);
    }
}
