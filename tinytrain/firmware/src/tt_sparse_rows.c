/** Pruned Dense layers stored by rows (tt_sparse_rows.h): each row's kept weights found from its
 *  code bytes, a pair of columns per byte; rows whose error is 0 are passed over in the input
 *  error and the update where that changes nothing. */
#include "tt_sparse_rows.h"
#include "tt_sparse_blocks.h"
#include "tt_dense.h"
#include "tt_dsp.h"

/* The code stream of a row: c steps through the kept columns of the bytes [s, end); for each
 * kept weight, W(c) runs with c its column (the pairs: one W per weight, the low nibble first). */
#define TT_ROWS_EACH(s, end, c, W)                      \
    while ((s) < (end)) {                               \
        const uint32_t b_ = *(s)++, hi_ = b_ >> 4;      \
        if (!b_) {                                      \
            (c) += 15;                                  \
            continue;                                   \
        }                                               \
        (c) += (int32_t)(b_ & 15u);                     \
        W;                                              \
        if (hi_) {                                      \
            (c) += (int32_t)hi_;                        \
            W;                                          \
        }                                               \
    }

int32_t tt_sparse_rows_count(const uint8_t *code, int32_t N)
{
    int32_t n, c = 0;
    for (n = 0; n < N; n++) c += code[2 * n + 1];
    return c;
}

int32_t tt_sparse_rows_columns(const uint8_t *code, int32_t N, int32_t n, int32_t *cols)
{
    const uint8_t *s = code + 2 * N, *end;
    int32_t i, c = -1, m = 0;
    for (i = 0; i < n; i++) s += code[2 * i];
    end = s + code[2 * n];
    TT_ROWS_EACH(s, end, c, cols[m++] = c)
    return m;
}

#if defined(__GNUC__)
#define TT_ROWS_INLINE static inline __attribute__((always_inline))
#else
#define TT_ROWS_INLINE static inline
#endif

/* The forward's sums acc[n] = b[n] aligned + the row's kept products; plain: the bias shift d is
 * in [1, 31] (a plain rounding shift, as tt_dense.c), a constant in each (inlined) call so that
 * the row loop has no test of it. */
TT_ROWS_INLINE void tt_rows_fwd_sums(const tt_sparse_rows_params *p, const int8_t *x, int32_t ea, int32_t plain,
                                     int32_t *acc)
{
    const int32_t N = p->N, eb = p->eb, d = ea - eb;
    const uint8_t *rows = p->code, *s = p->code + 2 * N;
    const int16_t *w = p->w;
    const int32_t *bias = p->b;
    int32_t n;
    for (n = 0; n < N; n++, rows += 2) { /* the bias in the sum's register, then the row's code */
        const uint8_t *end = s + rows[0];
        int32_t c = -1;
        int32_t a = plain ? tt_rshift_round_s32(bias[n], d) : tt_align_s32(bias[n], eb, ea);
        while (s < end) {
            const uint32_t b = *s++;
            c += (int32_t)(b & 15u);
            if (b >= 16u) { /* two kept weights: one SMLAD */
                const int32_t x0 = x[c];
                c += (int32_t)(b >> 4);
#if TT_HAVE_DSP
                a = __smlad((int32_t)tt_pack_lo((uint32_t)x0, (uint32_t)(int32_t)x[c]), (int32_t)tt_ld_s16x2(w), a);
#else
                a += x0 * (int32_t)w[0] + (int32_t)x[c] * (int32_t)w[1];
#endif
                w += 2;
            } else if (b) {
                a += (int32_t)x[c] * (int32_t)*w++;
            } else {
                c += 15;
            }
        }
        acc[n] = a;
    }
}

int32_t tt_sparse_rows_fwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                              int32_t ex, int8_t *y)
{
    const int32_t ea = ex + p->ew, d = ea - p->eb;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* K <= TT_DENSE_S32_MAX_K: every sum fits int32 */
    if (d >= 1 && d <= 31) tt_rows_fwd_sums(p, x, ea, 1, acc);
    else tt_rows_fwd_sums(p, x, ea, 0, acc);
    return ea + tt_requant_s8_from_s32(acc, p->N, y, ctx->stats);
}

int32_t tt_sparse_rows_bwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    const uint8_t *s = p->code + 2 * N;
    const int16_t *w = p->w;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* N <= TT_DENSE_S32_MAX_N: every sum fits int32 */
    int32_t n, k;
    for (k = 0; k < K; k++) acc[k] = 0;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[2 * n];
        const int32_t en = e[n];
        int32_t c = -1;
        if (en == 0) { /* adds nothing: pass the row */
            s = end;
            w += p->code[2 * n + 1];
            continue;
        }
        TT_ROWS_EACH(s, end, c, acc[c] += en * (int32_t)*w++)
    }
    return ee + p->ew + tt_requant_s8_from_s32(acc, K, dx, ctx->stats);
}

void tt_sparse_rows_grad_s32(const tt_sparse_rows_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb)
{
    const int32_t N = p->N;
    const uint8_t *s = p->code + 2 * N;
    int32_t n;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[2 * n];
        const int32_t en = e[n];
        int32_t c = -1;
        TT_ROWS_EACH(s, end, c, *gw++ = en * (int32_t)x[c])
    }
    for (n = 0; n < N; n++) gb[n] = e[n];
}

/* ---- element by element, in element order (stochastic rounding, decay, masters): each kept
 * weight by the element rule, each pruned one drawing what its rule would ---- */

/* Kind of store: 0 int16 direct, 1 int32 direct, 2 accumulate, 3 apply int16, 4 apply int32,
 * 5 apply int16 with int16 momentum. blocks: code is tt_sparse_blocks.h's block code (these
 * walks serve both formats: the packed order is element order in both). */
typedef struct tt_rows_walk {
    const tt_sgd_step *u;
    const uint8_t *code;
    int32_t K, N, kind, ew, draws;
    void *w;
    int32_t *A;
    void *V;
    int32_t *cols;
    int32_t blocks;
} tt_rows_walk;

static int32_t tt_rows_walk_columns(const tt_rows_walk *t, int32_t n)
{
    return t->blocks ? tt_sparse_blocks_columns(t->code, t->K, t->N, n, t->cols)
                     : tt_sparse_rows_columns(t->code, t->N, n, t->cols);
}

static int32_t tt_rows_walk_count(const uint8_t *code, int32_t K, int32_t N, int32_t blocks)
{
    return blocks ? tt_sparse_blocks_count(code, K, N) : tt_sparse_rows_count(code, N);
}

static void tt_rows_one(const tt_rows_walk *t, int32_t j, int32_t g, int32_t eg)
{
    const tt_sgd_step *u = t->u;
    switch (t->kind) {
    case 0: tt_sgd_update_direct_s16(u, (int16_t *)t->w + j, 1, t->ew, &g, eg); break;
    case 1: tt_sgd_update_direct_s32(u, (int32_t *)t->w + j, 1, t->ew, &g, eg); break;
    case 2: tt_sgd_accumulate_s32(u, t->A + j, 1, t->ew, &g, eg); break;
    case 3: tt_sgd_apply_accumulated_s16(u, (int16_t *)t->w + j, t->A + j, t->V ? (int32_t *)t->V + j : 0, 1); break;
    case 4: tt_sgd_apply_accumulated_s32(u, (int32_t *)t->w + j, t->A + j, t->V ? (int32_t *)t->V + j : 0, 1); break;
    default: tt_sgd_apply_accumulated_s16_v16(u, (int16_t *)t->w + j, t->A + j, t->V ? (int16_t *)t->V + j : 0, 1);
    }
}

/* Every element in element order: the kept ones by the rule with g = e[n] x[k] (direct) or g[j]
 * (accumulate, g packed) or none (apply); rows with e[n] == 0 skipped in direct mode when skip. */
static void tt_rows_walk_all(const tt_rows_walk *t, const int8_t *e, const int8_t *x, const int32_t *g,
                             int32_t eg, int32_t skip)
{
    int32_t n, k, j = 0;
    for (n = 0; n < t->N; n++) {
        const int32_t m = tt_rows_walk_columns(t, n), en = e ? e[n] : 0;
        int32_t i = 0;
        if (e && en == 0 && skip) {
            j += m;
            continue;
        }
        for (k = 0; k < t->K; k++) {
            if (i < m && t->cols[i] == k) {
                tt_rows_one(t, j, e ? en * (int32_t)x[k] : g ? g[j] : 0, eg);
                i++;
                j++;
            } else if (t->draws) {
                (void)tt_prng_next(t->u->prng);
            }
        }
    }
}

/* The input at the decoded column: on the Cortex-M4 a pointer one past it (LDRSB with an
 * immediate offset), on the Cortex-M0 (register offsets only) the column as an index. */
#if TT_HAVE_DSP
#define TT_ROWS_AT_START const int8_t *xc_ = x
#define TT_ROWS_AT_STEP(g) (xc_ += (g))
#define TT_ROWS_AT ((int32_t)xc_[-1])
#else
#define TT_ROWS_AT_START int32_t c_ = -1
#define TT_ROWS_AT_STEP(g) (c_ += (int32_t)(g))
#define TT_ROWS_AT ((int32_t)x[c_])
#endif

/* w -= round(m_t e[n] x[k] / 2^s) on the kept weights, s in [1, 31], 0 <= m_t < 2^15 (no
 * stochastic rounding, no decay), saturating to [-32767, 32767] and counted: the step of
 * tt_sparse.c's tt_sparse_cols_fast_s16 (portable: (q >> s) + ((q >> (s - 1)) & 1) of q = A_n x;
 * DSP: SMMULR(A_n, x 2^c), A_n = m_t e[n] 2^(32 - s - c), c = min(24, 32 - s)). A row whose
 * error is 0 and a weight whose input is 0 keep their values (their steps are 0), as in
 * tt_sgd_dense_direct_s16. Returns 0 (nothing written) when an A_n does not fit an int32. */
static int32_t tt_rows_fast_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                const int8_t *e, const int8_t *x, int32_t ee)
{
#if TT_HAVE_DSP
    const int32_t cs = 32 - s < 24 ? 32 - s : 24, sh = 32 - s - cs;
#else
    const int32_t cs = 0, sh = 0;
#endif
    const int32_t N = p->N;
    const uint8_t *code = p->code, *st = code + 2 * N;
    int16_t *w = p->w;
    uint32_t nsat = 0, lim = 2u * TT_S16_MAX;
    int32_t n, M = TT_S16_MAX;
    (void)s;
    (void)cs;
    (void)ee;
#if defined(__GNUC__)
    __asm__("" : "+r"(M), "+r"(lim)); /* kept in registers: the clamp test is one add and one compare */
#endif
    if (sh > 0)
        for (n = 0; n < N; n++) { /* |m_t e[n]| < 2^22 */
            const int32_t a = u->m_t * (int32_t)e[n];
            if (a > (INT32_MAX >> sh) || a < -(INT32_MAX >> sh)) return 0;
        }
    for (n = 0; n < N; n++, code += 2) {
        const uint8_t *end = st + code[0];
        const int32_t an = u->m_t * (int32_t)e[n] * (1 << sh);
        TT_ROWS_AT_START;
        if (an == 0) { /* every step is 0: pass the row */
            st = end;
            w += code[1];
            continue;
        }
#if TT_HAVE_DSP
#define TT_ROWS_STEP(X) (tt_smmulr(an, (X) * (1 << cs)))
#else
#define TT_ROWS_STEP(X) ((an * (X) >> s) + ((an * (X) >> (s - 1)) & 1))
#endif
#define TT_ROWS_FAST(X)                                                  \
    do {                                                                 \
        const int32_t X_ = (X);                                          \
        if (X_ != 0) { /* stored, then clamped if it left the range */  \
            const int32_t v_ = (int32_t)*w - TT_ROWS_STEP(X_);           \
            *w = (int16_t)v_;                                            \
            if ((uint32_t)(v_ + M) > lim) {                              \
                nsat++;                                                  \
                *w = v_ > 0 ? TT_S16_MAX : -TT_S16_MAX;                  \
            }                                                            \
        }                                                                \
        w++;                                                             \
    } while (0)
        while (st < end) {
            const uint32_t b = *st++;
            TT_ROWS_AT_STEP(b & 15u);
            if (b >= 16u) {
                TT_ROWS_FAST(TT_ROWS_AT);
                TT_ROWS_AT_STEP(b >> 4);
                TT_ROWS_FAST(TT_ROWS_AT);
            } else if (b) {
                TT_ROWS_FAST(TT_ROWS_AT);
            } else {
                TT_ROWS_AT_STEP(15);
            }
        }
#undef TT_ROWS_FAST
#undef TT_ROWS_STEP
    }
    u->stats->saturated += nsat;
    return 1;
}

/* The same when every step rounds to 0 (s >= 32): w - 0 changes only an old -32768 in a row with
 * e[n] != 0, clamped to -32767 and counted (tt_sgd_dense_rows_zero_s16); m(n): the row's kept
 * weights in the format. */
#define TT_ROWS_ZERO_S16(u, p, e, m)                                    \
    do {                                                                \
        int16_t *w_ = (p)->w;                                           \
        int32_t n_, i_;                                                 \
        for (n_ = 0; n_ < (p)->N; n_++) {                               \
            const int32_t m_ = m(n_);                                   \
            if ((e)[n_] != 0)                                           \
                for (i_ = 0; i_ < m_; i_++)                             \
                    if (w_[i_] == -32768) {                             \
                        w_[i_] = -TT_S16_MAX;                           \
                        (u)->stats->saturated++;                        \
                    }                                                   \
            w_ += m_;                                                   \
        }                                                               \
    } while (0)

#define TT_ROWS_COUNT(n) (p->code[2 * (n) + 1])
#define TT_BLOCKS_COUNT(n) (tt_sparse_blocks_row_count(p->code, p->K, p->N, (n)))

/* The direct update of int16 weights: the fast path where it applies exactly, else the element
 * walk; then the biases, unless the fast path did them (it returned 2). One body per format,
 * written once (the rows entry compiles as it did before blocks shared it: its fast loop's
 * registers are tight, and a format test there costs ~1 %). */
#define TT_ROWS_DIRECT_S16(FAST, COUNT, BLOCKS)                                                      \
    do {                                                                                            \
        int32_t done_ = 0;                                                                          \
        if (p->w) {                                                                                 \
            const tt_sgd *o = u->cfg;                                                               \
            const int32_t s = p->ew + o->k - (ee + ex);                                             \
            const int32_t fast = !o->sr && !o->wd_m && u->m_t >= 0 && u->m_t < 32768;               \
            if (fast && s >= 32) {                                                                  \
                TT_ROWS_ZERO_S16(u, p, e, COUNT);                                                   \
            } else if (!(fast && s >= 1 && s <= 31 && (done_ = FAST(u, p, s, e, x, ee)) != 0)) {    \
                const tt_rows_walk t = {u, p->code, p->K, p->N, 0, p->ew, o->sr && s > 0, p->w, 0, 0, p->work, \
                                        BLOCKS};                                                    \
                tt_rows_walk_all(&t, e, x, 0, ee + ex, !o->sr && !o->wd_m);                         \
            }                                                                                       \
        }                                                                                           \
        if (p->b && done_ < 2) tt_sgd_dense_bias_s32(u, p->b, p->eb, e, ee, p->N);                  \
    } while (0)

void tt_sparse_rows_sgd_direct_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                   const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    TT_ROWS_DIRECT_S16(tt_rows_fast_s16, TT_ROWS_COUNT, 0);
}

void tt_sparse_blocks_sgd_direct_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
#if TT_HAVE_DSP
    if (tt_sparse_blocks_direct_full(u, p, e, ee, x, ex)) return; /* the common case, its tests first */
#endif
    TT_ROWS_DIRECT_S16(tt_sparse_blocks_fast_s16, TT_BLOCKS_COUNT, 1);
}

static void tt_rows_direct_s32(const tt_sgd_step *u, const tt_sparse_rows_sgd_s32_params *p, const int8_t *e,
                               int32_t ee, const int8_t *x, int32_t ex, int32_t blocks)
{
    if (p->w) {
        const tt_sgd *o = u->cfg;
        const tt_rows_walk t = {u, p->code, p->K, p->N, 1, p->ew, o->sr && p->ew + o->k - (ee + ex) > 0,
                                p->w, 0, 0, p->work, blocks};
        tt_rows_walk_all(&t, e, x, 0, ee + ex, !o->sr && !o->wd_m);
    }
    if (p->b) tt_sgd_dense_bias_s32(u, p->b, p->eb, e, ee, p->N);
}

void tt_sparse_rows_sgd_direct_s32(const tt_sgd_step *u, const tt_sparse_rows_sgd_s32_params *p,
                                   const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    tt_rows_direct_s32(u, p, e, ee, x, ex, 0);
}

void tt_sparse_blocks_sgd_direct_s32(const tt_sgd_step *u, const tt_sparse_rows_sgd_s32_params *p,
                                     const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    tt_rows_direct_s32(u, p, e, ee, x, ex, 1);
}

/* ---- accumulate mode: without stochastic rounding one call on the packed arrays (the rules are
 * element-wise, so their order does not matter); with it, element by element ---- */

static void tt_rows_accumulate(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t *A, int32_t ew,
                               const int32_t *g, int32_t eg, int32_t blocks)
{
    if (!u->cfg->sr) {
        tt_sgd_accumulate_s32(u, A, tt_rows_walk_count(l->code, l->K, l->N, blocks), ew, g, eg);
    } else {
        const tt_rows_walk t = {u, l->code, l->K, l->N, 2, ew, ew + u->cfg->k - eg - TT_SGD_GUARD_BITS > 0,
                                0, A, 0, l->work, blocks};
        tt_rows_walk_all(&t, 0, 0, g, eg, 0);
    }
}

void tt_sparse_rows_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t *A,
                                       int32_t ew, const int32_t *g, int32_t eg)
{
    tt_rows_accumulate(u, l, A, ew, g, eg, 0);
}

void tt_sparse_blocks_sgd_accumulate_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t *A,
                                         int32_t ew, const int32_t *g, int32_t eg)
{
    tt_rows_accumulate(u, l, A, ew, g, eg, 1);
}

static void tt_rows_apply(const tt_sgd_step *u, const tt_sparse_rows_layout *l, int32_t kind, void *w,
                          int32_t *A, void *V, int32_t blocks)
{
    const int32_t n = tt_rows_walk_count(l->code, l->K, l->N, blocks);
    if (!u->cfg->sr) {
        if (kind == 3) tt_sgd_apply_accumulated_s16(u, (int16_t *)w, A, (int32_t *)V, n);
        else if (kind == 4) tt_sgd_apply_accumulated_s32(u, (int32_t *)w, A, (int32_t *)V, n);
        else tt_sgd_apply_accumulated_s16_v16(u, (int16_t *)w, A, (int16_t *)V, n);
    } else { /* the end-of-batch rule always draws */
        const tt_rows_walk t = {u, l->code, l->K, l->N, kind, 0, 1, w, A, V, l->work, blocks};
        tt_rows_walk_all(&t, 0, 0, 0, 0, 0);
    }
}

void tt_sparse_rows_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                              int16_t *w, int32_t *A, int32_t *V)
{
    tt_rows_apply(u, l, 3, w, A, V, 0);
}

void tt_sparse_rows_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                              int32_t *w, int32_t *A, int32_t *V)
{
    tt_rows_apply(u, l, 4, w, A, V, 0);
}

void tt_sparse_rows_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                  int16_t *w, int32_t *A, int16_t *V)
{
    tt_rows_apply(u, l, 5, w, A, V, 0);
}

void tt_sparse_blocks_sgd_apply_accumulated_s16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                int16_t *w, int32_t *A, int32_t *V)
{
    tt_rows_apply(u, l, 3, w, A, V, 1);
}

void tt_sparse_blocks_sgd_apply_accumulated_s32(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                int32_t *w, int32_t *A, int32_t *V)
{
    tt_rows_apply(u, l, 4, w, A, V, 1);
}

void tt_sparse_blocks_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, const tt_sparse_rows_layout *l,
                                                    int16_t *w, int32_t *A, int16_t *V)
{
    tt_rows_apply(u, l, 5, w, A, V, 1);
}
