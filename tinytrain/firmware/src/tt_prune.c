/** Magnitude pruning: masks, criterion, schedule (tt_prune.h; reference graph/prune.py). */
#include "tt_prune.h"
#include "tt_fixedpoint.h"

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

/* Index of the lowest set bit of a nonzero word: CLZ of the reversed word where the core has
 * them (one instruction or two), else de Bruijn's multiply and a 32-entry table (the Cortex-M0:
 * ~6 instructions; the shift loop it replaces took ~3 per bit below; -DTT_PRUNE_SOFT_CTZ forces
 * it for the host tests). */
static uint32_t tt_prune_ctz(uint32_t w)
{
#if !defined(TT_PRUNE_SOFT_CTZ) && defined(__GNUC__) && (defined(__ARM_FEATURE_CLZ) || !defined(__arm__))
    return (uint32_t)__builtin_ctz(w);
#else
    static const uint8_t pos[32] = {0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8,
                                    31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9};
    return pos[((w & (0u - w)) * 0x077CB531u) >> 27];
#endif
}

/* Word-at-a-time masking: at any alignment where word access is cheap (memcpy: one LDR/STR),
 * else (GCC, e.g. the Cortex-M0) on arrays that start on a word (a may_alias word: the arrays
 * are int8/int16). TT_PRUNE_WORDS(a): whether array a takes it. */
#if TT_WORD_ACCESS
#include <string.h>
#define TT_PRUNE_HAS_WORDS 1
#define TT_PRUNE_WORDS(a) 1
#elif defined(__GNUC__)
#define TT_PRUNE_HAS_WORDS 1
#define TT_PRUNE_WORDS(a) ((((uintptr_t)(a)) & 3u) == 0u)
typedef uint32_t tt_prune_u32 __attribute__((may_alias));
#else
#define TT_PRUNE_HAS_WORDS 0
#define TT_PRUNE_WORDS(a) 0
#endif

#if TT_PRUNE_HAS_WORDS
/* Four mask bits -> the AND masks of four elements: int8 (byte i kept, 0xff, where bit i is
 * clear) and int16 (two words: elements 0-1, 2-3). */
static const uint32_t tt_prune_keep8[16] = {
    0xffffffffu, 0xffffff00u, 0xffff00ffu, 0xffff0000u, 0xff00ffffu, 0xff00ff00u, 0xff0000ffu, 0xff000000u,
    0x00ffffffu, 0x00ffff00u, 0x00ff00ffu, 0x00ff0000u, 0x0000ffffu, 0x0000ff00u, 0x000000ffu, 0x00000000u};
static const uint32_t tt_prune_keep16[16][2] = {
    {0xffffffffu, 0xffffffffu}, {0xffff0000u, 0xffffffffu}, {0x0000ffffu, 0xffffffffu}, {0u, 0xffffffffu},
    {0xffffffffu, 0xffff0000u}, {0xffff0000u, 0xffff0000u}, {0x0000ffffu, 0xffff0000u}, {0u, 0xffff0000u},
    {0xffffffffu, 0x0000ffffu}, {0xffff0000u, 0x0000ffffu}, {0x0000ffffu, 0x0000ffffu}, {0u, 0x0000ffffu},
    {0xffffffffu, 0u}, {0xffff0000u, 0u}, {0x0000ffffu, 0u}, {0u, 0u}};

/* *p &= keep for the word at p (one LDR and one STR). The empty asm keeps GCC
 * from hoisting the loads of an unrolled run above its stores (it did, and spilled them to the
 * stack: 9 instructions a word instead of 5). */
static inline void tt_prune_and_word(void *p, uint32_t keep)
{
#if TT_WORD_ACCESS
    uint32_t v;
    memcpy(&v, p, 4);
    v &= keep;
    memcpy(p, &v, 4);
#else
    *(tt_prune_u32 *)p &= keep;
#endif
#if defined(__GNUC__)
    __asm__ volatile("" ::: "memory");
#endif
}

/* The 32 int8 of one mask word, four at a time, unrolled (as a loop GCC -O2 spends 9
 * instructions a four instead of 5). */
#define TT_PRUNE_S8(k) tt_prune_and_word(p + (k), tt_prune_keep8[(word >> (k)) & 15u])
static inline void tt_prune_word_s8(int8_t *p, uint32_t word)
{
    TT_PRUNE_S8(0); TT_PRUNE_S8(4); TT_PRUNE_S8(8); TT_PRUNE_S8(12);
    TT_PRUNE_S8(16); TT_PRUNE_S8(20); TT_PRUNE_S8(24); TT_PRUNE_S8(28);
}
#undef TT_PRUNE_S8

/* The 32 int16 of one mask word, four at a time, unrolled. */
#define TT_PRUNE_S16(k) do { \
        const uint32_t *keep = tt_prune_keep16[(word >> (k)) & 15u]; \
        tt_prune_and_word(p + (k), keep[0]); \
        tt_prune_and_word(p + (k) + 2, keep[1]); \
    } while (0)
static inline void tt_prune_word_s16(int16_t *p, uint32_t word)
{
    TT_PRUNE_S16(0); TT_PRUNE_S16(4); TT_PRUNE_S16(8); TT_PRUNE_S16(12);
    TT_PRUNE_S16(16); TT_PRUNE_S16(20); TT_PRUNE_S16(24); TT_PRUNE_S16(28);
}
#undef TT_PRUNE_S16

/* Set bits of a word (SWAR: no POPCNT on Cortex-M). */
static inline uint32_t tt_prune_popcount(uint32_t w)
{
    w -= (w >> 1) & 0x55555555u;
    w = (w & 0x33333333u) + ((w >> 2) & 0x33333333u);
    w = (w + (w >> 4)) & 0x0f0f0f0fu;
    return (w * 0x01010101u) >> 24;
}
#endif

/* Zero the pruned elements of one array of element size bytes (the padding bits are 0). The
 * portable rule visits only the set bits (~6 instructions each on the M4); where the array takes
 * words (TT_PRUNE_WORDS), a mask word over 32 int8 elements below n is applied four elements a
 * word by a table of AND masks (~1.8 instructions per element on the M4, whatever the bits), and
 * one over int16 elements so when it has 12 or more set bits (~2 per element). The same zeros
 * either way. */
static void tt_prune_zero(const uint32_t *mask, uint32_t n, void *a, uint32_t bytes)
{
    const uint32_t words = (n + 31u) / 32u;
    uint32_t wi;
    for (wi = 0; wi < words; wi++) {
        uint32_t word = mask[wi];
        const uint32_t base = wi * 32u;
        if (!word) continue;
        if (bytes == 1) {
            int8_t *p = (int8_t *)a + base;
#if TT_PRUNE_HAS_WORDS
            if (base + 32u <= n && TT_PRUNE_WORDS(a)) {
                tt_prune_word_s8(p, word);
                continue;
            }
#endif
            for (; word; word &= word - 1u) p[tt_prune_ctz(word)] = 0;
        } else if (bytes == 2) {
            int16_t *p = (int16_t *)a + base;
#if TT_PRUNE_HAS_WORDS
            if (base + 32u <= n && TT_PRUNE_WORDS(a) && tt_prune_popcount(word) >= 12u) {
                tt_prune_word_s16(p, word);
                continue;
            }
#endif
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
