/** Sparse Dense layers (tt_sparse.h): the kept weights are found from the mask a word at a time;
 *  on cores with CLZ (Cortex-M3 and up, hosts) each kept bit with one count-trailing-zeros, on
 *  the others (Cortex-M0) by shifting the word out one bit at a time. */
#include "tt_sparse.h"
#include "tt_dense.h"

#if defined(__GNUC__) && (defined(__ARM_FEATURE_CLZ) || !defined(__arm__))
/* b = each set bit of word, lowest first (word is consumed) */
#define TT_SPARSE_EACH(word, b) for (; (word) && (((b) = (uint32_t)__builtin_ctz(word)), 1); (word) &= (word) - 1u)
#else
#define TT_SPARSE_EACH(word, b) for ((b) = 0; (word); (word) >>= 1, (b)++) if ((word) & 1u)
#endif

/* The kept bits of mask word wi among the dense elements [lo, hi) (hi > lo). */
static inline uint32_t tt_sparse_kept(const uint32_t *mask, uint32_t wi, uint32_t lo, uint32_t hi)
{
    const uint32_t base = wi * 32u;
    uint32_t w = ~mask[wi];
    if (lo > base) w &= ~0u << (lo - base);
    if (hi < base + 32u) w &= (1u << (hi - base)) - 1u;
    return w;
}

/* Kept elements among [lo, hi) (hi > lo). */
static int32_t tt_sparse_kept_in(const uint32_t *mask, uint32_t lo, uint32_t hi)
{
    uint32_t wi, word;
    int32_t c = 0;
    for (wi = lo >> 5; wi <= (hi - 1u) >> 5; wi++)
        for (word = tt_sparse_kept(mask, wi, lo, hi); word; word &= word - 1u) c++;
    return c;
}

/* Length of the run of elements [i, end) with the same mask bit as element i; *pruned: that bit. */
static int32_t tt_sparse_run(const uint32_t *mask, int32_t i, int32_t end, int32_t *pruned)
{
    const uint32_t bit = (mask[(uint32_t)i >> 5] >> ((uint32_t)i & 31u)) & 1u;
    int32_t j = i + 1;
    while (j < end && ((mask[(uint32_t)j >> 5] >> ((uint32_t)j & 31u)) & 1u) == bit) j++;
    *pruned = (int32_t)bit;
    return j - i;
}

/* The PRNG numbers n discarded element updates would draw. */
static void tt_sparse_draws(uint32_t *prng, int32_t n)
{
    while (n-- > 0) (void)tt_prng_next(prng);
}

int32_t tt_sparse_count(const uint32_t *mask, int32_t n)
{
    int32_t i, c = n;
    for (i = 0; i < (n + 31) / 32; i++) {
        uint32_t w = mask[i];
        for (; w; w &= w - 1u) c--;
    }
    return c;
}

int32_t tt_sparse_dense_fwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *x,
                               int32_t ex, int8_t *y)
{
    const int32_t K = p->K, N = p->N, eb = p->eb, ea = ex + p->ew;
    const int16_t *w = p->w;
    uint32_t r = 0, wi, b, word;
    int32_t n;
    if (K <= TT_DENSE_S32_MAX_K) { /* the bound of tt_dense.h: every partial sum fits int32 */
        int32_t *acc = (int32_t *)(void *)ctx->scratch;
        for (n = 0; n < N; n++, r += (uint32_t)K) {
            int32_t s = tt_align_s32(p->b[n], eb, ea);
            for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
                const int8_t *xb = x + ((int32_t)(wi * 32u) - (int32_t)r);
                word = tt_sparse_kept(p->mask, wi, r, r + (uint32_t)K);
                TT_SPARSE_EACH(word, b) s += (int32_t)xb[b] * (int32_t)*w++;
            }
            acc[n] = s;
        }
        return ea + tt_requant_s8_from_s32(acc, N, y, ctx->stats);
    }
    for (n = 0; n < N; n++, r += (uint32_t)K) {
        int64_t s = tt_align(p->b[n], eb, ea);
        for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
            const int8_t *xb = x + ((int32_t)(wi * 32u) - (int32_t)r);
            word = tt_sparse_kept(p->mask, wi, r, r + (uint32_t)K);
            TT_SPARSE_EACH(word, b) s += (int32_t)xb[b] * (int32_t)*w++;
        }
        ctx->scratch[n] = s;
    }
    return ea + tt_requant_s8_from_s64(ctx->scratch, N, y, ctx->stats);
}

int32_t tt_sparse_dense_bwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *e,
                               int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    const int16_t *w = p->w;
    uint32_t r = 0, wi, b, word;
    int32_t n, k;
    if (N <= TT_DENSE_S32_MAX_N) {
        int32_t *acc = (int32_t *)(void *)ctx->scratch;
        for (k = 0; k < K; k++) acc[k] = 0;
        for (n = 0; n < N; n++, r += (uint32_t)K) {
            const int32_t en = e[n];
            for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
                const int32_t off = (int32_t)(wi * 32u) - (int32_t)r;
                word = tt_sparse_kept(p->mask, wi, r, r + (uint32_t)K);
                if (en == 0) { /* a row of zeros adds nothing: only its weights are passed */
                    for (; word; word &= word - 1u) w++;
                    continue;
                }
                TT_SPARSE_EACH(word, b) acc[off + (int32_t)b] += en * (int32_t)*w++;
            }
        }
        return ee + p->ew + tt_requant_s8_from_s32(acc, K, dx, ctx->stats);
    }
    /* int64 zeros from an int32 0 (a 64-bit constant 0 is one GCC may store with VFP registers in
     * hard-float builds, which must stay VFP-free: see tt_dense.c) */
    for (k = 0; k < K; k++) ctx->scratch[k] = (int32_t)e[0] - (int32_t)e[0];
    for (n = 0; n < N; n++, r += (uint32_t)K) {
        const int32_t en = e[n];
        for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
            const int32_t off = (int32_t)(wi * 32u) - (int32_t)r;
            word = tt_sparse_kept(p->mask, wi, r, r + (uint32_t)K);
            TT_SPARSE_EACH(word, b) ctx->scratch[off + (int32_t)b] += en * (int32_t)*w++;
        }
    }
    return ee + p->ew + tt_requant_s8_from_s64(ctx->scratch, K, dx, ctx->stats);
}

void tt_sparse_dense_grad_s32(const tt_sparse_dense_params *p, const int8_t *e, const int8_t *x,
                              int32_t *gw, int32_t *gb)
{
    const int32_t K = p->K, N = p->N;
    uint32_t r = 0, wi, b, word;
    int32_t n;
    for (n = 0; n < N; n++, r += (uint32_t)K) {
        const int32_t en = e[n];
        for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
            const int8_t *xb = x + ((int32_t)(wi * 32u) - (int32_t)r);
            word = tt_sparse_kept(p->mask, wi, r, r + (uint32_t)K);
            TT_SPARSE_EACH(word, b) *gw++ = en * (int32_t)xb[b];
        }
        gb[n] = en;
    }
}

/* ---- direct-mode update ---- */

/* The rows of a packed w16 or w32 (the other NULL) by the element rule of tt_sgd_update_direct_*:
 * each run of kept weights of a row gets its gradient e[n] x[k] in work and one call; a run of
 * pruned weights only draws what its updates would. Rows with e[n] == 0 are skipped when that
 * cannot change anything (no stochastic rounding, no decay), as tt_sgd_dense_direct_* does. */
static void tt_sparse_rows(const tt_sgd_step *u, const uint32_t *mask, int32_t K, int32_t N, int16_t *w16,
                           int32_t *w32, int32_t ew, int32_t *work, const int8_t *e, int32_t ee,
                           const int8_t *x, int32_t ex)
{
    const tt_sgd *o = u->cfg;
    const int32_t draws = o->sr && ew + o->k - (ee + ex) > 0, skip = !o->sr && !o->wd_m;
    int32_t n, k, i, j = 0, len, pruned;
    for (n = 0; n < N; n++) {
        const int32_t r = n * K, en = e[n];
        if (en == 0 && skip) {
            j += tt_sparse_kept_in(mask, (uint32_t)r, (uint32_t)(r + K));
            continue;
        }
        for (k = 0; k < K; k += len) {
            len = tt_sparse_run(mask, r + k, r + K, &pruned);
            if (pruned) {
                if (draws) tt_sparse_draws(u->prng, len);
                continue;
            }
            for (i = 0; i < len; i++) work[i] = en * (int32_t)x[k + i];
            if (w16) tt_sgd_update_direct_s16(u, w16 + j, len, ew, work, ee + ex);
            else tt_sgd_update_direct_s32(u, w32 + j, len, ew, work, ee + ex);
            j += len;
        }
    }
}

/* w -= round(a x[k] / 2^s) on the kept weights of the rows with a = m_t e[n] != 0, s in [1, 31],
 * 0 <= m_t < 2^15: |a x| < 2^29, so the int32 rounding shift is exact (tt_sgd.c's
 * tt_sgd_s16_one), saturating to [-32767, 32767] and counted. */
static void tt_sparse_rows_fast_s16(const tt_sgd_step *u, const uint32_t *mask, int32_t K, int32_t N,
                                    int16_t *w, int32_t s, const int8_t *e, const int8_t *x)
{
    uint32_t r = 0, wi, b, word, nsat = 0;
    int32_t n;
    for (n = 0; n < N; n++, r += (uint32_t)K) {
        const int32_t a = u->m_t * (int32_t)e[n];
        for (wi = r >> 5; wi <= (r + (uint32_t)K - 1u) >> 5; wi++) {
            const int8_t *xb = x + ((int32_t)(wi * 32u) - (int32_t)r);
            word = tt_sparse_kept(mask, wi, r, r + (uint32_t)K);
            if (a == 0) {
                for (; word; word &= word - 1u) w++;
                continue;
            }
            TT_SPARSE_EACH(word, b) {
                const int32_t q = a * (int32_t)xb[b];
                int32_t v = (int32_t)*w - ((q >> s) + ((q >> (s - 1)) & 1));
                if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) {
                    nsat++;
                    v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
                }
                *w++ = (int16_t)v;
            }
        }
    }
    u->stats->saturated += nsat;
}

/* The biases: the rule of tt_sgd_update_direct_s32 with the gradient e[n] (exponent ee). */
static void tt_sparse_bias(const tt_sgd_step *u, int32_t *b, int32_t eb, const int8_t *e, int32_t ee,
                           int32_t N, int32_t *work)
{
    int32_t n;
    for (n = 0; n < N; n++) work[n] = e[n];
    tt_sgd_update_direct_s32(u, b, N, eb, work, ee);
}

void tt_sparse_sgd_dense_direct_s16(const tt_sgd_step *u, const tt_sparse_sgd_dense_s16_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) {
        const tt_sgd *o = u->cfg;
        const int32_t s = p->ew + o->k - (ee + ex);
        if (!o->sr && !o->wd_m && u->m_t >= 0 && u->m_t < 32768 && s >= 1 && s <= 31)
            tt_sparse_rows_fast_s16(u, p->mask, p->K, p->N, p->w, s, e, x);
        else
            tt_sparse_rows(u, p->mask, p->K, p->N, p->w, 0, p->ew, p->work, e, ee, x, ex);
    }
    if (p->b) tt_sparse_bias(u, p->b, p->eb, e, ee, p->N, p->work);
}

void tt_sparse_sgd_dense_direct_s32(const tt_sgd_step *u, const tt_sparse_sgd_dense_s32_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) tt_sparse_rows(u, p->mask, p->K, p->N, 0, p->w, p->ew, p->work, e, ee, x, ex);
    if (p->b) tt_sparse_bias(u, p->b, p->eb, e, ee, p->N, p->work);
}

/* ---- accumulate mode: without stochastic rounding one call on the packed arrays (the rules are
 * element-wise); with it, one call per run of kept elements, the pruned runs drawing theirs ---- */

void tt_sparse_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *A,
                                  int32_t ew, const int32_t *g, int32_t eg)
{
    const int32_t draws = ew + u->cfg->k - eg - TT_SGD_GUARD_BITS > 0;
    int32_t i, j = 0, len, pruned;
    if (!u->cfg->sr) {
        tt_sgd_accumulate_s32(u, A, tt_sparse_count(l->mask, l->n), ew, g, eg);
        return;
    }
    for (i = 0; i < l->n; i += len) {
        len = tt_sparse_run(l->mask, i, l->n, &pruned);
        if (pruned) {
            if (draws) tt_sparse_draws(u->prng, len);
            continue;
        }
        tt_sgd_accumulate_s32(u, A + j, len, ew, g + j, eg);
        j += len;
    }
}

/* One end-of-batch kernel on packed arrays (t: 0 int16 w, 1 int32 w, 2 int16 w with int16 V). */
static void tt_sparse_apply(const tt_sgd_step *u, int32_t t, void *w, int32_t *A, void *V, int32_t j, int32_t n)
{
    if (t == 0) tt_sgd_apply_accumulated_s16(u, (int16_t *)w + j, A + j, V ? (int32_t *)V + j : 0, n);
    else if (t == 1) tt_sgd_apply_accumulated_s32(u, (int32_t *)w + j, A + j, V ? (int32_t *)V + j : 0, n);
    else tt_sgd_apply_accumulated_s16_v16(u, (int16_t *)w + j, A + j, V ? (int16_t *)V + j : 0, n);
}

static void tt_sparse_apply_runs(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t t, void *w,
                                 int32_t *A, void *V)
{
    int32_t i, j = 0, len, pruned;
    if (!u->cfg->sr) {
        tt_sparse_apply(u, t, w, A, V, 0, tt_sparse_count(l->mask, l->n));
        return;
    }
    for (i = 0; i < l->n; i += len) {
        len = tt_sparse_run(l->mask, i, l->n, &pruned);
        if (pruned) { /* the end-of-batch rule always draws (its shift is TT_SGD_GUARD_BITS) */
            tt_sparse_draws(u->prng, len);
            continue;
        }
        tt_sparse_apply(u, t, w, A, V, j, len);
        j += len;
    }
}

void tt_sparse_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                         int32_t *A, int32_t *V)
{
    tt_sparse_apply_runs(u, l, 0, w, A, V);
}

void tt_sparse_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *w,
                                         int32_t *A, int32_t *V)
{
    tt_sparse_apply_runs(u, l, 1, w, A, V);
}

void tt_sparse_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                             int32_t *A, int16_t *V)
{
    tt_sparse_apply_runs(u, l, 2, w, A, V);
}
