/** Sparse Dense layers (tt_sparse.h), column by column: the kept weights of input k are found from
 *  the column's mask bits a word at a time -- each kept bit by a count-trailing-zeros (RBIT + CLZ on
 *  Cortex-M3 and up, a de Bruijn multiply on the Cortex-M0) -- and a
 *  column whose input is 0 is passed over (its weights only counted) where that changes nothing. */
#include "tt_sparse.h"
#include "tt_dense.h"
#include "tt_dsp.h"

/* The index of the lowest set bit of a nonzero word: RBIT + CLZ where the core has CLZ, else a
 * multiply by a de Bruijn sequence and a 32-entry table (Cortex-M0: MULS is one cycle). */
#if defined(__GNUC__) && (defined(__ARM_FEATURE_CLZ) || !defined(__arm__))
#define tt_sparse_ctz(v) ((uint32_t)__builtin_ctz(v))
#else
static const uint8_t tt_sparse_debruijn[32] = {0, 1, 28, 2, 29, 14, 24, 3, 30, 22, 20, 15, 25, 17, 4, 8,
                                               31, 27, 13, 23, 21, 19, 16, 7, 26, 12, 18, 6, 11, 5, 10, 9};
static inline uint32_t tt_sparse_ctz(uint32_t v)
{
    return tt_sparse_debruijn[((v & (0u - v)) * 0x077CB531u) >> 27];
}
#endif

/* b = each set bit of word, lowest first (word is consumed) */
#define TT_SPARSE_EACH(word, b) for (; (word) && (((b) = tt_sparse_ctz(word)), 1); (word) &= (word) - 1u)


/* Set bits of a word (SWAR: no popcount instruction before Armv8.1-M). */
static inline uint32_t tt_sparse_popcount(uint32_t v)
{
    v = v - ((v >> 1) & 0x55555555u);
    v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);
    return (((v + (v >> 4)) & 0x0F0F0F0Fu) * 0x01010101u) >> 24;
}

/* A column walk: the S = ceil(N / 32) mask words of the next input (col advances past them),
 * each word's kept bits in word and the first output it covers in c. */
#define TT_SPARSE_COLUMN(S, col, c, word) \
    for ((c) = 0; (c) < 32u * (S); (c) += 32u) \
        if (((word) = ~*(col)++), 1)

#define TT_SPARSE_STRIDE(N) (((uint32_t)(N) + 31u) / 32u)

/* A column walk inlined where it is called, so a call with a constant S (1: N <= 32) folds the
 * word loop away. */
#if defined(__GNUC__)
#define TT_SPARSE_INLINE static inline __attribute__((always_inline))
#else
#define TT_SPARSE_INLINE static inline
#endif

int32_t tt_sparse_count(const uint32_t *mask, int32_t K, int32_t N)
{
    const uint32_t words = (uint32_t)K * TT_SPARSE_STRIDE(N);
    uint32_t i, c = 0;
    for (i = 0; i < words; i++) c += tt_sparse_popcount(~mask[i]);
    return (int32_t)c;
}

/* acc[n] += sum over the kept w[n][k] of x[k] w (int32: the bound of tt_dense.h), column by column. */
TT_SPARSE_INLINE void tt_sparse_fwd_cols_s32(int32_t *acc, const uint32_t *col, const int16_t *w, const int8_t *x,
                                             int32_t K, const uint32_t S)
{
    uint32_t c, b, word;
    int32_t k;
    for (k = 0; k < K; k++) {
        const int32_t xk = x[k];
        if (xk == 0) { /* adds nothing: pass its weights */
            for (c = 0; c < S; c++) w += tt_sparse_popcount(~*col++);
            continue;
        }
        TT_SPARSE_COLUMN(S, col, c, word) {
            int32_t *a = acc + c;
            TT_SPARSE_EACH(word, b) a[b] += xk * (int32_t)*w++;
        }
    }
}

int32_t tt_sparse_dense_fwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *x,
                               int32_t ex, int8_t *y)
{
    const int32_t K = p->K, N = p->N, eb = p->eb, ea = ex + p->ew;
    const uint32_t S = TT_SPARSE_STRIDE(N);
    const uint32_t *col = p->mask;
    const int16_t *w = p->w;
    uint32_t c, b, word;
    int32_t n, k;
    if (K <= TT_DENSE_S32_MAX_K) { /* the bound of tt_dense.h: every partial sum fits int32 */
        int32_t *acc = (int32_t *)(void *)ctx->scratch;
        const int32_t d = ea - eb;
        if (d >= 1 && d <= 31) /* the common case, a plain rounding shift, said apart (as tt_dense.c) */
            for (n = 0; n < N; n++) acc[n] = tt_rshift_round_s32(p->b[n], d);
        else
            for (n = 0; n < N; n++) acc[n] = tt_align_s32(p->b[n], eb, ea);
        if (S == 1u) tt_sparse_fwd_cols_s32(acc, p->mask, p->w, x, K, 1u); /* N <= 32: one word a column */
        else tt_sparse_fwd_cols_s32(acc, p->mask, p->w, x, K, S);
        return ea + tt_requant_s8_from_s32(acc, N, y, ctx->stats);
    }
    for (n = 0; n < N; n++) ctx->scratch[n] = tt_align(p->b[n], eb, ea);
    for (k = 0; k < K; k++) {
        const int32_t xk = x[k];
        TT_SPARSE_COLUMN(S, col, c, word) {
            int64_t *a = ctx->scratch + c;
            TT_SPARSE_EACH(word, b) a[b] += xk * (int32_t)*w++;
        }
    }
    return ea + tt_requant_s8_from_s64(ctx->scratch, N, y, ctx->stats);
}

/* acc[k] = sum over the kept w[n][k] of e[n] w (int32), column by column. */
TT_SPARSE_INLINE void tt_sparse_bwd_cols_s32(int32_t *acc, const uint32_t *col, const int16_t *w, const int8_t *e,
                                             int32_t K, const uint32_t S)
{
    uint32_t c, b, word;
    int32_t k;
    for (k = 0; k < K; k++) {
        int32_t s = 0;
        TT_SPARSE_COLUMN(S, col, c, word) {
            const int8_t *ec = e + c;
            TT_SPARSE_EACH(word, b) s += (int32_t)ec[b] * (int32_t)*w++;
        }
        acc[k] = s;
    }
}

int32_t tt_sparse_dense_bwd_s8(const tt_ctx *ctx, const tt_sparse_dense_params *p, const int8_t *e,
                               int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    const uint32_t S = TT_SPARSE_STRIDE(N);
    const uint32_t *col = p->mask;
    const int16_t *w = p->w;
    uint32_t c, b, word;
    int32_t k;
    if (N <= TT_DENSE_S32_MAX_N) {
        int32_t *acc = (int32_t *)(void *)ctx->scratch;
        if (S == 1u) tt_sparse_bwd_cols_s32(acc, p->mask, p->w, e, K, 1u);
        else tt_sparse_bwd_cols_s32(acc, p->mask, p->w, e, K, S);
        return ee + p->ew + tt_requant_s8_from_s32(acc, K, dx, ctx->stats);
    }
    for (k = 0; k < K; k++) {
        int64_t s = (int32_t)e[0] - (int32_t)e[0]; /* 0 from an int32 (see tt_dense.c: no VFP zero) */
        TT_SPARSE_COLUMN(S, col, c, word) {
            const int8_t *ec = e + c;
            TT_SPARSE_EACH(word, b) s += (int32_t)ec[b] * (int32_t)*w++;
        }
        ctx->scratch[k] = s;
    }
    return ee + p->ew + tt_requant_s8_from_s64(ctx->scratch, K, dx, ctx->stats);
}

void tt_sparse_dense_grad_s32(const tt_sparse_dense_params *p, const int8_t *e, const int8_t *x,
                              int32_t *gw, int32_t *gb)
{
    const int32_t K = p->K, N = p->N;
    const uint32_t S = TT_SPARSE_STRIDE(N);
    const uint32_t *col = p->mask;
    uint32_t c, b, word;
    int32_t n, k;
    for (k = 0; k < K; k++) {
        const int32_t xk = x[k];
        TT_SPARSE_COLUMN(S, col, c, word) {
            const int8_t *ec = e + c;
            TT_SPARSE_EACH(word, b) *gw++ = (int32_t)ec[b] * xk;
        }
    }
    for (n = 0; n < N; n++) gb[n] = e[n];
}

/* ---- updates in element (row-major) order: the packed index of element (n, k) is col[k]++, col[k]
 * starting at the packed start of column k (col: K words of work) ---- */

/* col[k] = the packed index of the first kept weight of column k. */
static void tt_sparse_starts(const uint32_t *mask, int32_t K, int32_t N, int32_t *col)
{
    const uint32_t S = TT_SPARSE_STRIDE(N);
    uint32_t c, word;
    int32_t k, j = 0;
    for (k = 0; k < K; k++) {
        col[k] = j;
        TT_SPARSE_COLUMN(S, mask, c, word) j += (int32_t)tt_sparse_popcount(word);
    }
}

static inline int32_t tt_sparse_pruned(const uint32_t *mask, int32_t N, int32_t n, int32_t k)
{
    return (int32_t)((mask[(uint32_t)k * TT_SPARSE_STRIDE(N) + (uint32_t)n / 32u] >> ((uint32_t)n % 32u)) & 1u);
}

/* The element rule of tt_sgd_update_direct_* on each kept weight in element order, one call per
 * element; a pruned one only draws what its update would. Rows with e[n] == 0 are skipped when
 * that cannot change anything (no stochastic rounding, no decay), as tt_sgd_dense_direct_* does. */
static void tt_sparse_rows(const tt_sgd_step *u, const uint32_t *mask, int32_t K, int32_t N, int16_t *w16,
                           int32_t *w32, int32_t ew, int32_t *col, const int8_t *e, int32_t ee,
                           const int8_t *x, int32_t ex)
{
    const tt_sgd *o = u->cfg;
    const int32_t draws = o->sr && ew + o->k - (ee + ex) > 0, skip = !o->sr && !o->wd_m;
    int32_t n, k;
    tt_sparse_starts(mask, K, N, col);
    for (n = 0; n < N; n++) {
        const int32_t en = e[n];
        for (k = 0; k < K; k++) {
            int32_t g;
            if (tt_sparse_pruned(mask, N, n, k)) {
                if (draws) (void)tt_prng_next(u->prng);
                continue;
            }
            g = en * (int32_t)x[k];
            if (en == 0 && skip) col[k]++;
            else if (w16) tt_sgd_update_direct_s16(u, w16 + col[k]++, 1, ew, &g, ee + ex);
            else tt_sgd_update_direct_s32(u, w32 + col[k]++, 1, ew, &g, ee + ex);
        }
    }
}

/* The column walk of tt_sparse_cols_fast_s16 (below): w -= step(A[n], x[k] 2^cs) on the kept weights;
 * returns the saturations. */
TT_SPARSE_INLINE uint32_t tt_sparse_fast_cols_s16(int16_t *w, const uint32_t *col, const int32_t *A, const int8_t *x,
                                                  int32_t K, int32_t s, int32_t cs, const uint32_t S)
{
    uint32_t c, b, word, nsat = 0;
    int32_t k;
    (void)s; /* the DSP path's shift is in cs */
    for (k = 0; k < K; k++) {
        const int32_t X = (int32_t)x[k] * (1 << cs);
        if (X == 0) { /* every step is 0: pass the column's weights */
            for (c = 0; c < S; c++) w += tt_sparse_popcount(~*col++);
            continue;
        }
        TT_SPARSE_COLUMN(S, col, c, word) {
            const int32_t *Ac = A + c;
            TT_SPARSE_EACH(word, b) {
                const int32_t an = Ac[b];
                if (an != 0) {
#if TT_HAVE_DSP
                    int32_t v = (int32_t)*w - tt_smmulr(an, X);
#else
                    const int32_t q = an * X;
                    int32_t v = (int32_t)*w - ((q >> s) + ((q >> (s - 1)) & 1));
#endif
                    if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) {
                        nsat++;
                        v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
                    }
                    *w = (int16_t)v;
                }
                w++;
            }
        }
    }
    return nsat;
}

/* w -= round(m_t e[n] x[k] / 2^s) on the kept weights, s in [1, 31], 0 <= m_t < 2^15 (no stochastic
 * rounding, no decay), saturating to [-32767, 32767] and counted. The step d = floor((q + 2^(s - 1))
 * / 2^s) of q = m_t e[n] x[k] (|q| < 2^29): portable, (q >> s) + ((q >> (s - 1)) & 1) in int32
 * (tt_sgd.c's tt_sgd_s16_one; A_n = m_t e[n], X = x); DSP, one SMMULR(A_n, X) with c = min(24, 32 - s)
 * (|X| < 2^31), A_n = m_t e[n] 2^(32 - s - c) (an int32 when it fits, checked first) and
 * X = x 2^c: (A_n X + 2^31) >> 32 is the same d exactly. A weight whose
 * row error or column input is 0 keeps its value (its step is 0), as in tt_sgd_dense_direct_s16.
 * Returns 0 (nothing written) when an A_n does not fit. */
static int32_t tt_sparse_cols_fast_s16(const tt_sgd_step *u, const tt_sparse_sgd_dense_s16_params *p,
                                       int32_t s, const int8_t *e, const int8_t *x)
{
#if TT_HAVE_DSP
    const int32_t cs = 32 - s < 24 ? 32 - s : 24, sh = 32 - s - cs;
#else
    const int32_t cs = 0, sh = 0;
#endif
    const int32_t K = p->K, N = p->N;
    int32_t *A = p->work;
    const uint32_t S = TT_SPARSE_STRIDE(N);
    uint32_t nsat;
    int32_t n;
    for (n = 0; n < N; n++) { /* |m_t e[n]| < 2^22 */
        const int32_t a = u->m_t * (int32_t)e[n];
        if (sh > 0 && (a > (INT32_MAX >> sh) || a < -(INT32_MAX >> sh))) return 0;
        A[n] = a * (1 << sh);
    }
    nsat = S == 1u ? tt_sparse_fast_cols_s16(p->w, p->mask, A, x, K, s, cs, 1u)
                   : tt_sparse_fast_cols_s16(p->w, p->mask, A, x, K, s, cs, S);
    u->stats->saturated += nsat;
    return 1;
}

/* The same when every step rounds to 0 (s >= 32: |m_t e x| < 2^29 < 2^(s - 1)): w - 0 changes only
 * an old -32768 in a row with e[n] != 0, clamped to -32767 and counted (tt_sgd_dense_rows_zero_s16). */
static void tt_sparse_cols_zero_s16(const tt_sgd_step *u, const tt_sparse_sgd_dense_s16_params *p,
                                    const int8_t *e)
{
    const uint32_t S = TT_SPARSE_STRIDE(p->N);
    const uint32_t *col = p->mask;
    int16_t *w = p->w;
    uint32_t c, b, word;
    int32_t k;
    for (k = 0; k < p->K; k++)
        TT_SPARSE_COLUMN(S, col, c, word) {
            const int8_t *ec = e + c;
            TT_SPARSE_EACH(word, b) {
                if (*w == -32768 && ec[b] != 0) {
                    *w = -TT_S16_MAX;
                    u->stats->saturated++;
                }
                w++;
            }
        }
}

void tt_sparse_sgd_dense_direct_s16(const tt_sgd_step *u, const tt_sparse_sgd_dense_s16_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) {
        const tt_sgd *o = u->cfg;
        const int32_t s = p->ew + o->k - (ee + ex);
        const int32_t fast = !o->sr && !o->wd_m && u->m_t >= 0 && u->m_t < 32768;
        if (fast && s >= 32)
            tt_sparse_cols_zero_s16(u, p, e);
        else if (!(fast && s >= 1 && s <= 31 && tt_sparse_cols_fast_s16(u, p, s, e, x)))
            tt_sparse_rows(u, p->mask, p->K, p->N, p->w, 0, p->ew, p->work, e, ee, x, ex);
    }
    if (p->b) tt_sgd_dense_bias_s32(u, p->b, p->eb, e, ee, p->N);
}

void tt_sparse_sgd_dense_direct_s32(const tt_sgd_step *u, const tt_sparse_sgd_dense_s32_params *p,
                                    const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) tt_sparse_rows(u, p->mask, p->K, p->N, 0, p->w, p->ew, p->work, e, ee, x, ex);
    if (p->b) tt_sgd_dense_bias_s32(u, p->b, p->eb, e, ee, p->N);
}

/* ---- accumulate mode: without stochastic rounding one call on the packed arrays (the rules are
 * element-wise, so their order does not matter); with it, one call per kept element in element
 * order, the pruned ones drawing theirs ---- */

void tt_sparse_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *A,
                                  int32_t ew, const int32_t *g, int32_t eg)
{
    const int32_t draws = ew + u->cfg->k - eg - TT_SGD_GUARD_BITS > 0;
    int32_t n, k, j;
    if (!u->cfg->sr) {
        tt_sgd_accumulate_s32(u, A, tt_sparse_count(l->mask, l->K, l->N), ew, g, eg);
        return;
    }
    tt_sparse_starts(l->mask, l->K, l->N, l->work);
    for (n = 0; n < l->N; n++)
        for (k = 0; k < l->K; k++) {
            if (tt_sparse_pruned(l->mask, l->N, n, k)) {
                if (draws) (void)tt_prng_next(u->prng);
                continue;
            }
            j = l->work[k]++;
            tt_sgd_accumulate_s32(u, A + j, 1, ew, g + j, eg);
        }
}

/* One end-of-batch kernel on n packed elements from j (t: 0 int16 w, 1 int32 w, 2 int16 w and V). */
static void tt_sparse_apply(const tt_sgd_step *u, int32_t t, void *w, int32_t *A, void *V, int32_t j, int32_t n)
{
    if (t == 0) tt_sgd_apply_accumulated_s16(u, (int16_t *)w + j, A + j, V ? (int32_t *)V + j : 0, n);
    else if (t == 1) tt_sgd_apply_accumulated_s32(u, (int32_t *)w + j, A + j, V ? (int32_t *)V + j : 0, n);
    else tt_sgd_apply_accumulated_s16_v16(u, (int16_t *)w + j, A + j, V ? (int16_t *)V + j : 0, n);
}

static void tt_sparse_apply_all(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t t, void *w,
                                int32_t *A, void *V)
{
    int32_t n, k;
    if (!u->cfg->sr) {
        tt_sparse_apply(u, t, w, A, V, 0, tt_sparse_count(l->mask, l->K, l->N));
        return;
    }
    tt_sparse_starts(l->mask, l->K, l->N, l->work);
    for (n = 0; n < l->N; n++)
        for (k = 0; k < l->K; k++) {
            if (tt_sparse_pruned(l->mask, l->N, n, k)) /* the end-of-batch rule always draws */
                (void)tt_prng_next(u->prng);
            else
                tt_sparse_apply(u, t, w, A, V, l->work[k]++, 1);
        }
}

void tt_sparse_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                         int32_t *A, int32_t *V)
{
    tt_sparse_apply_all(u, l, 0, w, A, V);
}

void tt_sparse_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_layout *l, int32_t *w,
                                         int32_t *A, int32_t *V)
{
    tt_sparse_apply_all(u, l, 1, w, A, V);
}

void tt_sparse_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_layout *l, int16_t *w,
                                             int32_t *A, int16_t *V)
{
    tt_sparse_apply_all(u, l, 2, w, A, V);
}
