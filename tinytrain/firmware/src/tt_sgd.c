/** Integer SGD update rules: portable scalar path; the fused Dense update also has a Cortex-M DSP
 *  path (TT_HAVE_DSP), same bits. */
#include "tt_sgd.h"
#include "tt_dsp.h"
#include <string.h>

#define TT_LIM62 ((int64_t)1 << 62)

/* sat_s32(a + b) (DSP: QADD). */
#if TT_HAVE_DSP
static inline int32_t tt_qadd(int32_t a, int32_t b) { return __qadd(a, b); }
#else
static inline int32_t tt_qadd(int32_t a, int32_t b) { return tt_sat_s32((int64_t)a + b); }
#endif

/* *r = a - b wrapped to int32; returns 1 when the exact difference overflows int32 (GCC: SUBS
 * and the V flag; otherwise the operands' and the result's signs). */
static inline int tt_sub_overflows(int32_t a, int32_t b, int32_t *r)
{
#if defined(__GNUC__)
    return __builtin_sub_overflow(a, b, r);
#else
    const uint32_t v = (uint32_t)a - (uint32_t)b;
    *r = (int32_t)v;
    return (int)((((uint32_t)a ^ (uint32_t)b) & ((uint32_t)a ^ v)) >> 31);
#endif
}

/* The high word of g * M + R (R added as an unsigned low word): floor((g M + R) / 2^32). */
static inline int32_t tt_mulhi_add(int32_t g, int32_t M, uint32_t R)
{
    return (int32_t)(((int64_t)g * M + (int64_t)R) >> 32);
}

#if !TT_HAVE_DSP
/* (a * b + 2^31) >> 32 of the exact 64-bit product (tt_dsp.h's SMMULR). */
static inline int32_t tt_smmulr(int32_t a, int32_t b)
{
    return (int32_t)(((int64_t)a * b + ((int64_t)1 << 31)) >> 32);
}

/* c + SMMULR(a, b) mod 2^32 (tt_dsp.h's SMMLAR). */
static inline int32_t tt_smmlar(int32_t a, int32_t b, int32_t c)
{
    return (int32_t)((uint32_t)c + (uint32_t)tt_smmulr(a, b));
}
#endif

/* shift(v, s): round (or stochastically round, one PRNG draw) right shift for s > 0,
 * saturating left shift by min(-s, 40) for s < 0. The stochastic shift by s > 31 floors v by
 * 2^(s - 31) first and then rounds the 31 bits the draw covers (graph/optim.py _shift). */
static int64_t tt_sgd_shift(int64_t v, int32_t s, int32_t sr, uint32_t *prng)
{
    if (s <= 0) {
        int32_t t;
        if (s == 0) return v;
        t = -s < 40 ? -s : 40;
        if (v > (TT_LIM62 >> t)) return TT_LIM62;
        if (v < -(TT_LIM62 >> t)) return -TT_LIM62;
        return v * ((int64_t)1 << t);
    }
    if (!sr) return tt_rshift_round_s64(v, s < 62 ? s : 62);
    {
        const uint32_t r = tt_prng_next(prng);
        /* a shift by 64 or more is undefined in C; by 63 it is already v's floor (0 or -1) */
        if (s > 31) v >>= (s - 31 < 63 ? s - 31 : 63);
        return tt_rshift_stoch_s64(v, s < 31 ? s : 31, r);
    }
}

static int64_t tt_clamp64(int64_t v, int64_t lo, int64_t hi)
{
    return v < lo ? lo : v > hi ? hi : v;
}

int32_t tt_sgd_lr_mult(const tt_sgd *o, uint32_t t)
{
    int64_t f;
    if (o->schedule == 0) return o->m;
    if (o->schedule == 1) {
        uint32_t i, n = t / (uint32_t)o->step_size;
        f = 32768;
        for (i = 0; i < n; i++) f = tt_rshift_round_s64(f * o->gamma_q15, 15);
    } else {
        const uint32_t T = o->total_steps > 1 ? (uint32_t)o->total_steps : 1u;
        const uint64_t j = ((uint64_t)64 * t) / T;
        f = o->cosine[j > 64 ? 64 : j];
    }
    return (int32_t)tt_rshift_round_s64((int64_t)o->m * f, 15);
}

static int32_t tt_sgd_plain_s16(int16_t *w, int32_t n, const int32_t *g, int32_t m_t, int32_t s,
                                tt_stats *st);
static int32_t tt_sgd_plain_s32(int32_t *w, int32_t n, const int32_t *g, int32_t m_t, int32_t s,
                                tt_stats *st);

/* The floor shift xs that comes first in a stochastic step by s >= 1 of an int32 p (tt_sgd_shift):
 * s - 31 for s > 31 (capped at 31, where p >> 31 is already p's floor, 0 or -1), else 0; the
 * stochastic shift of p >> xs is then by ss = min(s, 31). (The rounded shift needs no xs: for
 * |p| < 2^29 by ss = 31 it is already 0 = rshift_round(p, s) for every s >= 31.) */
#define TT_SGD_XS(s) ((s) > 31 ? ((s) - 31 < 31 ? (s) - 31 : 31) : 0)

/* Runs BODY(a, b, c) with the three option flags of key = 4a + 2b + c as constants: one call per
 * combination, so that each inlined body is its own loop without the options' branches. */
#define TT_SGD_SPECIALISE3(key, BODY) \
    switch (key) { \
    case 0: BODY(0, 0, 0); break; \
    case 1: BODY(0, 0, 1); break; \
    case 2: BODY(0, 1, 0); break; \
    case 3: BODY(0, 1, 1); break; \
    case 4: BODY(1, 0, 0); break; \
    case 5: BODY(1, 0, 1); break; \
    case 6: BODY(1, 1, 0); break; \
    default: BODY(1, 1, 1); break; \
    }

/* The widened inputs of the DSP Dense paths: X[j] = x[j] 2^c with c = max(0, 23 - s) (|X| <= 2^31
 * for s >= -1); returns sh = 32 - s - c, the shift of the row multiplier tt_sgd_row_mult, so that
 * SMMULR(X, A) = round(m_t e x / 2^s) exactly (X A = m_t e x 2^(32 - s)). */
static inline int32_t tt_sgd_widen_x(const int8_t *x, int32_t len, int32_t s, int32_t *X)
{
    const int32_t c = s < 23 ? 23 - s : 0;
    int32_t j;
    for (j = 0; j < len; j++) X[j] = (int32_t)((uint32_t)(int32_t)x[j] << c);
    return 32 - s - c;
}

/* A row's multiplier m_t e 2^sh (|m_t e| < 2^22, sh <= 9: |A| < 2^31). */
static inline int32_t tt_sgd_row_mult(int32_t m_t, int8_t e, int32_t sh)
{
    return (int32_t)((uint32_t)(m_t * (int32_t)e) << sh);
}


/* The update rules on a tensor that is int16 (w16) or int32 (w32, w16 == NULL): one body for
 * both element types; the public API has one function per type. */
static void sgd_update_direct(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int32_t n,
                              int32_t ew, const int32_t *g, int32_t eg)
{
    const tt_sgd *o = u->cfg;
    const int32_t m_t = u->m_t;
    uint32_t *prng = u->prng;
    tt_stats *st = u->stats;
    const int32_t s = ew + o->k - eg;
    const int64_t lo = w16 ? -TT_S16_MAX : INT32_MIN, hi = w16 ? TT_S16_MAX : INT32_MAX;
    int32_t i;
    if (!o->sr && !o->wd_m && (w16 ? tt_sgd_plain_s16(w16, n, g, m_t, s, st) : tt_sgd_plain_s32(w32, n, g, m_t, s, st)))
        return;
    for (i = 0; i < n; i++) {
        const int64_t wi = w16 ? w16[i] : w32[i];
        int64_t d = tt_sgd_shift((int64_t)m_t * g[i], s, o->sr, prng), v, nv;
        if (o->wd_m) d += tt_rshift_round_s64(wi * o->wd_m, o->wd_k);
        v = wi - d;
        nv = tt_clamp64(v, lo, hi);
        if (nv != v) st->saturated++;
        if (w16) w16[i] = (int16_t)nv; else w32[i] = (int32_t)nv;
    }
}

void tt_sgd_update_direct_s16(const tt_sgd_step *u, int16_t *w, int32_t n, int32_t ew,
                              const int32_t *g, int32_t eg)
{
    sgd_update_direct(u, w, 0, n, ew, g, eg);
}

void tt_sgd_update_direct_s32(const tt_sgd_step *u, int32_t *w, int32_t n, int32_t ew,
                              const int32_t *g, int32_t eg)
{
    sgd_update_direct(u, 0, w, n, ew, g, eg);
}

/* A = QADD(A, floor((g M + (r << sl mod 2^32)) / 2^32)) with one xorshift32 draw r per element
 * from state r0, in order; returns the last state (the stochastic accumulate of
 * tt_sgd_accumulate_fast and tt_sgd_dense_accumulate_s32: sl = 32 - s). */
static inline uint32_t sgd_acc_sr(int32_t *A, int32_t n, const int32_t *g, int32_t M, int32_t sl, uint32_t r)
{
    int32_t i;
    for (i = 0; i < n; i++) {
        r = tt_prng_next(&r);
        A[i] = tt_qadd(A[i], tt_mulhi_add(g[i], M, r << sl));
    }
    return r;
}

/* Accumulate for s in [1, 31] with m_t >= 2^(s-1) (small shifts): when a first pass bounds
 * |g| <= 2^b with m_t 2^b / 2^s < 2^30, every step floor((m_t g + R) / 2^s) (R = 2^(s-1), or
 * r mod 2^s under stochastic rounding) fits int32 and is taken from the words of the 64-bit sum;
 * returns 0 when the bound fails. */
static int32_t tt_sgd_accumulate_small_s(int32_t *A, int32_t n, const int32_t *g, int32_t m_t,
                                         int32_t s, int32_t sr, uint32_t *prng)
{
    const uint32_t mask = ((uint32_t)1 << s) - 1u;
    const int32_t sl = 32 - s;
    uint32_t o = 0, x = *prng;
    int32_t i;
    for (i = 0; i < n; i++) o |= (uint32_t)(g[i] ^ (g[i] >> 31));
    if ((((int64_t)m_t << tt_bitwidth_u64(o)) >> s) >= ((int64_t)1 << 30)) return 0; /* |g| <= 2^b */
    if (sr) {
        for (i = 0; i < n; i++) {
            uint64_t t;
            x = tt_prng_next(&x);
            t = (uint64_t)((int64_t)g[i] * m_t + (int64_t)(x & mask));
            A[i] = tt_qadd(A[i], (int32_t)(((uint32_t)t >> s) | ((uint32_t)(t >> 32) << sl)));
        }
        *prng = x;
    } else {
        const int64_t half = (int64_t)1 << (s - 1);
        for (i = 0; i < n; i++) {
            const uint64_t t = (uint64_t)((int64_t)g[i] * m_t + half);
            A[i] = tt_qadd(A[i], (int32_t)(((uint32_t)t >> s) | ((uint32_t)(t >> 32) << sl)));
        }
    }
    return 1;
}

/* Accumulate for s in [1, 31] and 0 <= m_t < 2^(s-1) (small shifts: the function above; returns 0
 * when neither applies): with M = m_t 2^(32-s)
 * (an int32) the shifted step is floor((g M + R) / 2^32) for R = 2^31 (to nearest, ties up:
 * floor((m_t g + 2^(s-1)) / 2^s)) or, under stochastic rounding, R = r 2^(32-s) mod 2^32 =
 * (r mod 2^s) 2^(32-s) (floor((m_t g + (r mod 2^s)) / 2^s): tt_rshift_stoch_s64), one xorshift32
 * draw per element in element order; exact for every int32 g, |step| <= 2^30. */
static int32_t tt_sgd_accumulate_fast(int32_t *A, int32_t n, const int32_t *g, int32_t m_t,
                                      int32_t s, int32_t sr, uint32_t *prng)
{
    int32_t i, M;
    if (s <= 0 && s >= -31 && m_t >= 0) { /* left shifts, no draw: exact in int64 when |m_t g| 2^-s < 2^62 */
        const int32_t t = -s;
        uint32_t o = 0;
        for (i = 0; i < n; i++) o |= (uint32_t)(g[i] ^ (g[i] >> 31));
        if (tt_bitwidth_u64((uint64_t)m_t) + tt_bitwidth_u64(o) + t >= 62) return 0; /* |g| <= 2^b */
        for (i = 0; i < n; i++) A[i] = tt_sat_s32((int64_t)A[i] + (int64_t)((uint64_t)((int64_t)m_t * g[i]) << t));
        return 1;
    }
    if (s < 1 || s > 31 || m_t < 0) return 0;
    if (((int64_t)m_t << (32 - s)) > INT32_MAX) return tt_sgd_accumulate_small_s(A, n, g, m_t, s, sr, prng);
    M = (int32_t)((int64_t)m_t << (32 - s));
    if (sr) {
        *prng = sgd_acc_sr(A, n, g, M, 32 - s, *prng);
    } else {
        for (i = 0; i < n; i++) A[i] = tt_qadd(A[i], tt_mulhi_add(g[i], M, 0x80000000u));
    }
    return 1;
}

void tt_sgd_accumulate_s32(const tt_sgd_step *u, int32_t *A, int32_t n, int32_t ew,
                           const int32_t *g, int32_t eg)
{
    const tt_sgd *o = u->cfg;
    const int32_t m_t = u->m_t;
    uint32_t *prng = u->prng;
    const int32_t s = ew + o->k - eg - TT_SGD_GUARD_BITS;
    int32_t i;
    if (tt_sgd_accumulate_fast(A, n, g, m_t, s, o->sr, prng)) return;
    for (i = 0; i < n; i++) {
        const int64_t d = tt_sgd_shift((int64_t)m_t * g[i], s, o->sr, prng);
        A[i] = tt_sat_s32((int64_t)A[i] + d);
    }
}

/* round(v * 2^-k) of a 64-bit v whose result fits int32, k in [1, 31]: the words of v + 2^(k-1). */
static inline int32_t tt_shr_round32(int64_t v, int32_t k)
{
    const uint64_t t = (uint64_t)(v + (int64_t)((uint32_t)1 << (k - 1)));
    return (int32_t)(((uint32_t)t >> k) | ((uint32_t)(t >> 32) << (32 - k)));
}

/* round(master / 2^16) saturated to [-32767, 32767]: tt_sgd_refresh_copy's element rule. */
static inline int16_t tt_narrow_s16(int32_t m)
{
    const int32_t r = ((m >> 15) + 1) >> 1;
    return (int16_t)(r > TT_S16_MAX ? TT_S16_MAX : r < -TT_S16_MAX ? -TT_S16_MAX : r);
}

/* What sgd_apply_body reads besides the tensors: the averaging 1/batch = ib_m 2^-ib_k (ib_k 0:
 * batch 1), and for the fused per-sample step (ACC) the gradient g with m_t and the accumulate
 * shift s, and the int16 copy of int32 weights (or NULL). */
typedef struct sgd_fuse {
    int32_t ib_m, ib_k;
    const int32_t *g;
    int32_t m_t, s;
    int16_t *copy;
} sgd_fuse;

/* One specialisation of sgd_apply_fast: W16, MU, WD, SR, ACC are constants after inlining. ACC:
 * the sample's accumulate step comes first, in the same pass (batch size 1, no draws):
 * A = sat32(A + floor((m_t g + 2^(s-1)) / 2^s)), s in [1, 31], in 32 bits (its caller has bounded
 * |g| m_t + 2^(s-1) below 2^31). */
static inline uint32_t sgd_apply_body(int16_t *w16, int32_t *w32, int32_t *A, int32_t *V, int32_t n,
                                      int32_t mu, int32_t mk, int32_t wm, int32_t ws, uint32_t *px,
                                      const sgd_fuse *f, int32_t W16, int32_t MU, int32_t WD, int32_t SR,
                                      int32_t ACC)
{
    const int32_t lo = W16 ? -TT_S16_MAX : INT32_MIN, hi = W16 ? TT_S16_MAX : INT32_MAX;
    const int32_t whh = WD && ws >= 33 ? (int32_t)1 << (ws - 33) : 0, wsh = ws >= 33 ? ws - 32 : ws;
    const int32_t ibm = f->ib_m, ibk = f->ib_k, mt = f->m_t, as = ACC ? f->s : 1, half = (int32_t)1 << (as - 1);
    /* round(V mu / 2^mk) = floor((V M + 2^31) / 2^32) (+ V when M = mu 2^(32-mk) >= 2^31, taken
     * mod 2^32: the two terms have opposite signs, no overflow), as tt_sgd_accumulate_apply's
     * step; mu < 2^mk */
    const uint32_t Mu = MU ? (uint32_t)mu << (32 - mk) : 0;
    const int32_t Ms = Mu >> 31 ? (int32_t)(Mu & 0x7fffffffu) + INT32_MIN : (int32_t)Mu, vm = -(int32_t)(Mu >> 31);
    const int32_t *g = f->g;
    int16_t *copy = f->copy;
    uint32_t x = *px, nsat = 0;
    int32_t i;
    for (i = 0; i < n; i++) {
        const int32_t wi = W16 ? w16[i] : w32[i];
        int64_t uu = A[i], d, v;
        if (ACC) uu = tt_qadd((int32_t)uu, (g[i] * mt + half) >> as); /* |g| m_t + half < 2^31 */
        A[i] = 0;
        if (!ACC && ibk) uu = tt_shr_round32(uu * ibm, ibk);
        if (MU) {
            const int32_t vi = V[i], vv = tt_qadd(tt_smmulr(vi, Ms) + (vi & vm), (int32_t)uu);
            V[i] = vv;
            uu = vv;
        }
        if (WD) {
            const int64_t p = (int64_t)wi * wm;
            uu += ws >= 33 ? (int64_t)(((int32_t)((uint64_t)p >> 32) + whh) >> wsh) : tt_shr_round32(p, wsh);
        }
        if (!WD) { /* uu is an int32 (A, or V): the (stochastically) rounded shift in 32 bits */
            const int32_t u32 = (int32_t)uu;
            int32_t d32;
            if (SR) {
                x = tt_prng_next(&x);
                d32 = (u32 >> TT_SGD_GUARD_BITS) + (int32_t)((((uint32_t)u32 & 255u) + (x & 255u)) >> TT_SGD_GUARD_BITS);
            } else {
                d32 = (u32 >> TT_SGD_GUARD_BITS) + ((u32 >> (TT_SGD_GUARD_BITS - 1)) & 1);
            }
            if (W16) { /* |d32| <= 2^23: w - d fits int32 */
                int32_t v32 = wi - d32;
                if ((uint32_t)(v32 + TT_S16_MAX) > 2u * TT_S16_MAX) { nsat++; v32 = v32 > 0 ? TT_S16_MAX : -TT_S16_MAX; }
                w16[i] = (int16_t)v32;
                continue;
            }
            d = d32;
        } else if (SR) {
            x = tt_prng_next(&x);
            d = (uu + (int64_t)(x & 255u)) >> TT_SGD_GUARD_BITS;
        } else {
            d = (uu + (1 << (TT_SGD_GUARD_BITS - 1))) >> TT_SGD_GUARD_BITS;
        }
        v = (int64_t)wi - d;
        if (v < lo || v > hi) {
            nsat++;
            v = v < lo ? lo : hi;
        }
        if (W16) w16[i] = (int16_t)v; else w32[i] = (int32_t)v;
        if (!W16 && copy) copy[i] = tt_narrow_s16((int32_t)v);
    }
    *px = x;
    return nsat;
}

/* sgd_apply_accumulated for batch size 1 with the momentum shift mu_k in [1, 31] and 0 <= mu_m <
 * 2^mu_k (|round(V mu_m / 2^mu_k)| < 2^31: its words) and the decay multiplier wd_m < 2^15 with
 * the shift s = wd_k - G in [16, 62] but 32 (in [1, 62] for int16 weights), so that round(w wd_m /
 * 2^s) fits int32 and comes from the words of the product (the high word alone for s >= 33); returns
 * 0 for any other configuration. Same steps, same order, one draw per element; one loop per
 * combination of the options. */
static int32_t sgd_apply_fast(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int32_t *A,
                              int32_t *V, int32_t n, sgd_fuse *f)
{
    const tt_sgd *o = u->cfg;
    const int32_t mu = o->mu_m, mk = o->mu_k, wm = o->wd_m, ws = o->wd_k - TT_SGD_GUARD_BITS;
    uint32_t x = *u->prng, nsat = 0;
    if ((o->batch_size > 1 && (o->ib_k < 1 || o->ib_k > 31 || o->ib_m < 0 || (int64_t)o->ib_m >= ((int64_t)1 << o->ib_k))) ||
        (mu && (mu < 0 || mk < 1 || mk > 31 || (int64_t)mu >= ((int64_t)1 << mk))) ||
        (wm && (wm < 0 || wm >= 32768 || ws > 62 || ws == 32 || ws < (w16 ? 1 : 16))))
        return 0;
    f->ib_m = o->batch_size > 1 ? o->ib_m : 1;
    f->ib_k = o->batch_size > 1 ? o->ib_k : 0;
    if (f->g) { /* the fused per-sample step: batch size 1, no draws */
#define TT_FUSED(W, M, D) nsat = sgd_apply_body(w16, w32, A, V, n, mu, mk, wm, ws, &x, f, W, M, D, 0, 1)
        if (o->sr || o->batch_size != 1) return 0;
        TT_SGD_SPECIALISE3((w16 ? 4 : 0) | (mu ? 2 : 0) | (wm ? 1 : 0), TT_FUSED)
#undef TT_FUSED
        u->stats->saturated += nsat;
        return 1;
    }
#define TT_APPLY16(M, D, S) nsat = sgd_apply_body(w16, w32, A, V, n, mu, mk, wm, ws, &x, f, 1, M, D, S, 0)
#define TT_APPLY32(M, D, S) nsat = sgd_apply_body(w16, w32, A, V, n, mu, mk, wm, ws, &x, f, 0, M, D, S, 0)
    if (w16) {
        TT_SGD_SPECIALISE3((mu ? 4 : 0) | (wm ? 2 : 0) | (o->sr ? 1 : 0), TT_APPLY16)
    } else {
        TT_SGD_SPECIALISE3((mu ? 4 : 0) | (wm ? 2 : 0) | (o->sr ? 1 : 0), TT_APPLY32)
    }
#undef TT_APPLY16
#undef TT_APPLY32
    if (o->sr) *u->prng = x;
    u->stats->saturated += nsat;
    return 1;
}

/* One specialisation of sgd_apply_s32_wd (MU, SR constants after inlining). The decay term
 * round(w wd_m / 2^s) is SMMULR(w, Wd), Wd = wd_m 2^(32 - s) (exact: the same floor of
 * w wd_m 2^(32 - s) + 2^31); the step of uu = vv + decay (an int64 in the reference:
 * |decay| < 2^31) is floor((uu + R) / 2^8) with R = 2^7, or r mod 2^8 under stochastic rounding,
 * taken as (vv >> 8) + (decay >> 8) + ((vv mod 2^8 + decay mod 2^8 + R) >> 8) in 32 bits
 * (|d| < 2^24); w - d saturates to int32 (the wrapped difference's sign, as sgd_mom_s32), and the
 * copy (or NULL) is refreshed as tt_sgd_refresh_copy. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_apply_s32_wd_body(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n, int32_t Ms,
                                             int32_t vm, int32_t Wd, uint32_t *px, int32_t MU, int32_t SR, int32_t COPY)
{
    uint32_t x = *px, nsat = 0;
    int32_t i;
    for (i = 0; i < n; i++) {
        const int32_t wi = w[i], dec = tt_smmulr(wi, Wd);
        int32_t uu = A[i], d, v;
        uint32_t R = 1u << (TT_SGD_GUARD_BITS - 1), r;
        A[i] = 0;
        if (MU) {
            const int32_t vi = V[i];
            uu = tt_qadd(tt_smmulr(vi, Ms) + (vi & vm), uu);
            V[i] = uu;
        }
        if (SR) {
            x = tt_prng_next(&x);
            R = x & 255u;
        }
        d = (uu >> TT_SGD_GUARD_BITS) + (dec >> TT_SGD_GUARD_BITS) +
            (int32_t)((((uint32_t)uu & 255u) + ((uint32_t)dec & 255u) + R) >> TT_SGD_GUARD_BITS);
        r = (uint32_t)wi - (uint32_t)d;
        v = (int32_t)r;
        if ((((uint32_t)wi ^ (uint32_t)d) & ((uint32_t)wi ^ r)) >> 31) {
            nsat++;
            v = d > 0 ? INT32_MIN : INT32_MAX;
        }
        w[i] = v;
        if (COPY) {
#if TT_HAVE_DSP /* round(v / 2^16) = QADD(v, 2^15) >> 16 (the saturation is the clamp at 32767) */
            const int32_t c = tt_qadd(v, 1 << 15) >> 16;
            copy[i] = (int16_t)(c < -TT_S16_MAX ? -TT_S16_MAX : c);
#else
            copy[i] = tt_narrow_s16(v);
#endif
        }
    }
    *px = x;
    return nsat;
}

#if TT_HAVE_DSP
static uint32_t sgd_apply_s32_wd_dsp(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n, int32_t Ms,
                                     int32_t vm, int32_t Wd, uint32_t *px, int32_t mu, int32_t sr);
#endif

/* sgd_apply_accumulated (+ the copy's refresh) of an int32 tensor at batch size 1 with weight
 * decay whose shift s = wd_k - G is in [1, 32] and wd_m 2^(32 - s) < 2^31, and momentum off or
 * with 0 < mu_m < 2^mu_k, mu_k in [1, 31] (its multiplier as sgd_apply_body's); returns 0 for any
 * other configuration. Same steps, one draw per element under stochastic rounding. */
static int32_t sgd_apply_s32_wd(const tt_sgd_step *u, int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n)
{
    const tt_sgd *o = u->cfg;
    const int32_t mu = o->mu_m, mk = o->mu_k, wm = o->wd_m, ws = o->wd_k - TT_SGD_GUARD_BITS;
    uint32_t Mu, x = *u->prng, nsat;
    int32_t Ms, vm, Wd;
    if (o->batch_size != 1 || wm <= 0 || ws < 1 || ws > 32 || ((int64_t)wm << (32 - ws)) > INT32_MAX ||
        (mu && (mu < 0 || mk < 1 || mk > 31 || (int64_t)mu >= ((int64_t)1 << mk))))
        return 0;
    Wd = (int32_t)((int64_t)wm << (32 - ws));
    Mu = mu ? (uint32_t)mu << (32 - mk) : 0;
    Ms = Mu >> 31 ? (int32_t)(Mu & 0x7fffffffu) + INT32_MIN : (int32_t)Mu;
    vm = -(int32_t)(Mu >> 31);
#if TT_HAVE_DSP
    nsat = sgd_apply_s32_wd_dsp(w, copy, A, V, n, Ms, vm, Wd, &x, mu, o->sr);
#else
#define TT_WD(M, S, C) nsat = sgd_apply_s32_wd_body(w, copy, A, V, n, Ms, vm, Wd, &x, M, S, C)
    TT_SGD_SPECIALISE3((mu ? 4 : 0) | (o->sr ? 2 : 0) | (copy ? 1 : 0), TT_WD)
#undef TT_WD
#endif
    if (o->sr) *u->prng = x;
    u->stats->saturated += nsat;
    return 1;
}

static void sgd_apply_accumulated(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int16_t *copy, int32_t *A,
                                  int32_t *V, int32_t n)
{
    const tt_sgd *o = u->cfg;
    uint32_t *prng = u->prng;
    tt_stats *st = u->stats;
    const int64_t lo = w16 ? -TT_S16_MAX : INT32_MIN, hi = w16 ? TT_S16_MAX : INT32_MAX;
    sgd_fuse f = {0, 0, 0, 0, 0, 0};
    int32_t i;
    if (w32 && sgd_apply_s32_wd(u, w32, copy, A, V, n)) return;
    if (sgd_apply_fast(u, w16, w32, A, V, n, &f)) {
        if (copy) tt_sgd_refresh_copy(w32, copy, n);
        return;
    }
    for (i = 0; i < n; i++) {
        int64_t u = A[i], wi, v, nv;
        if (o->batch_size > 1) u = tt_rshift_round_s64(u * o->ib_m, o->ib_k);
        A[i] = 0;
        if (o->mu_m) {
            const int32_t vv = tt_sat_s32(tt_rshift_round_s64((int64_t)V[i] * o->mu_m, o->mu_k) + u);
            V[i] = vv;
            u = vv;
        }
        wi = w16 ? w16[i] : w32[i];
        if (o->wd_m) {
            const int32_t s = o->wd_k - TT_SGD_GUARD_BITS;
            const int64_t wd = wi * o->wd_m;
            u += s >= 0 ? tt_rshift_round_s64(wd, s) : wd * ((int64_t)1 << -s);
        }
        v = wi - tt_sgd_shift(u, TT_SGD_GUARD_BITS, o->sr, prng);
        nv = tt_clamp64(v, lo, hi);
        if (nv != v) st->saturated++;
        if (w16) w16[i] = (int16_t)nv; else w32[i] = (int32_t)nv;
    }
    if (copy) tt_sgd_refresh_copy(w32, copy, n);
}

void tt_sgd_apply_accumulated_s16(const tt_sgd_step *u, int16_t *w, int32_t *A, int32_t *V,
                                  int32_t n)
{
    sgd_apply_accumulated(u, w, 0, 0, A, V, n);
}

void tt_sgd_apply_accumulated_s32(const tt_sgd_step *u, int32_t *w, int32_t *A, int32_t *V,
                                  int32_t n)
{
    sgd_apply_accumulated(u, 0, w, 0, A, V, n);
}

void tt_sgd_apply_accumulated_s32_copy(const tt_sgd_step *u, int32_t *w, int16_t *copy, int32_t *A, int32_t *V,
                                       int32_t n)
{
    sgd_apply_accumulated(u, 0, w, copy, A, V, n);
}

/* vv = sat32(round(V mu / 2^mk) + sat32(A + round(m_t g / 2^s))) of one element: the step is
 * SMMULR(g 2^c1, M) with M = m_t 2^(32 - s - c1) (exact when g 2^c1 fits int32: for every g when
 * c1 = 0, else its caller has bounded |g|), round(V mu / 2^mk) is SMMULR(V, Ms)
 * (+ V when VM: Ms = mu 2^(32 - mk) - 2^32, by SMMLAR), as in sgd_apply_body. */
static inline int32_t sgd_mom_vv(int32_t g, int32_t a, int32_t v, int32_t M, int32_t c1, int32_t Ms, int32_t VM)
{
    return tt_qadd(VM ? tt_smmlar(v, Ms, v) : tt_smmulr(v, Ms), tt_qadd(a, tt_smmulr(c1 ? (int32_t)((uint32_t)g << c1) : g, M)));
}

/* Whether the momentum loops apply to this step's configuration (batch 1, 0 < mu_m < 2^mu_k
 * with mu_k in [1, 31], no decay, no stochastic rounding, 0 <= m_t < 2^15), and their velocity
 * multiplier: Ms = mu 2^(32 - mu_k) (- 2^32 when VM, i.e. when that is >= 2^31). */
static int32_t sgd_mom_ok(const tt_sgd_step *u, int32_t *Ms, int32_t *VM)
{
    const tt_sgd *o = u->cfg;
    uint32_t Mu;
    if (o->wd_m || o->sr || o->batch_size != 1 || o->mu_m <= 0 || o->mu_k < 1 || o->mu_k > 31 ||
        (int64_t)o->mu_m >= ((int64_t)1 << o->mu_k) || u->m_t < 0 || u->m_t >= 32768)
        return 0;
    Mu = (uint32_t)o->mu_m << (32 - o->mu_k);
    *VM = (int32_t)(Mu >> 31);
    *Ms = *VM ? (int32_t)(Mu & 0x7fffffffu) + INT32_MIN : (int32_t)Mu;
    return 1;
}

/* sgd_mom_s16_body's rule on an int32 tensor (a bias, or an int32 master with its int16 copy when
 * copy != NULL), one element at a time: w = sat32(w - round(vv / 2^8)) (round: (vv >> 8) + bit 7,
 * no overflow), the saturation seen from the wrapped difference's sign (as tt_sgd_dense_bias). */
static uint32_t sgd_mom_s32(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n,
                            const int32_t *g, int32_t M, int32_t c1, int32_t Ms, int32_t VM)
{
    uint32_t nsat = 0;
    int32_t i;
    for (i = 0; i < n; i++) {
        const int32_t vv = sgd_mom_vv(g[i], A[i], V[i], M, c1, Ms, VM);
        const int32_t d = (vv >> TT_SGD_GUARD_BITS) + ((vv >> (TT_SGD_GUARD_BITS - 1)) & 1);
        const uint32_t wi = (uint32_t)w[i], r = wi - (uint32_t)d;
        int32_t v = (int32_t)r;
        A[i] = 0;
        V[i] = vv;
        if (((wi ^ (uint32_t)d) & (wi ^ r)) >> 31) {
            nsat++;
            v = d > 0 ? INT32_MIN : INT32_MAX;
        }
        w[i] = v;
        if (copy) copy[i] = tt_narrow_s16(v);
    }
    return nsat;
}

#if !TT_HAVE_DSP
/* sgd_mom_s16_body's rule, one element at a time (the portable build's Dense momentum rows):
 * w = w - round(vv / 2^8) ((vv >> 8) + bit 7: no overflow, |d| <= 2^23) saturating to
 * [-32767, 32767]. */
static inline uint32_t sgd_mom_s16(int16_t *w, int32_t *A, int32_t *V, int32_t n, const int32_t *g, int32_t M,
                                   int32_t Ms, int32_t VM)
{
    uint32_t nsat = 0;
    int32_t i;
    for (i = 0; i < n; i++) {
        const int32_t vv = sgd_mom_vv(g[i], A[i], V[i], M, 0, Ms, VM);
        int32_t v = w[i] - ((vv >> TT_SGD_GUARD_BITS) + ((vv >> (TT_SGD_GUARD_BITS - 1)) & 1));
        A[i] = 0;
        V[i] = vv;
        if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) { nsat++; v = v > 0 ? TT_S16_MAX : -TT_S16_MAX; }
        w[i] = (int16_t)v;
    }
    return nsat;
}
#endif

#if TT_HAVE_DSP
/* One element of sgd_mom_s16_dsp, scalar: w - round(vv / 2^8) from t = sat32(vv + 2^7) (the
 * saturation changes t >> 8 only for vv > 2^31 - 129, where w - d saturates either way),
 * saturating to [-32767, 32767]; returns 1 on a saturation. */
static inline uint32_t sgd_mom_w1(int16_t *w, int32_t wi, int32_t t)
{
    int32_t v = wi - (t >> TT_SGD_GUARD_BITS);
    const uint32_t hit = (uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX;
    if (hit) v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
    *w = (int16_t)v;
    return hit;
}

/* Four weights of sgd_mom_s16_body that hit its guard, by the scalar rule from their old values
 * and the velocities vv[-4..-1] just stored (out of line: the loop keeps no register for it). */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static uint32_t sgd_mom_redo4(int16_t *w, const int32_t *vv)
{
    uint32_t nsat = 0;
    int32_t j;
    for (j = 0; j < 4; j++) nsat += sgd_mom_w1(w + j, w[j], tt_qadd(vv[j - 4], 1 << (TT_SGD_GUARD_BITS - 1)));
    return nsat;
}

/* Two elements of sgd_mom_s16_body: g by LDRD (*gp advanced), A read and cleared by LDRD/STRD,
 * V by LDRD, V = vv by STRD (*A, *V advanced); returns the pair's steps SSAT #15 of
 * sat32(vv + 2^7) >> 8, packed (the Q flag set when one is outside [-16384, 16383]). Z (a
 * constant): the row's multiplier M is 0 (its error is 0), so the step SMMULR(g, 0) is 0 and
 * vv = sat32(round(V mu / 2^mk) + A), the same bits without reading g. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_mom_pair(const int32_t **gp, int32_t **A, int32_t **V, int32_t M, int32_t c1, int32_t Ms,
                                    int32_t VM, int32_t Z)
{
    int32_t g0 = 0, g1 = 0, a0, a1, v0, v1;
    if (!Z) tt_ld_s32x2_next(gp, &g0, &g1);
    tt_ld_clear_s32x2_next(A, &a0, &a1, 0);
    tt_ld_s32x2_next((const int32_t **)V, &v0, &v1);
    if (Z) {
        v0 = tt_qadd(VM ? tt_smmlar(v0, Ms, v0) : tt_smmulr(v0, Ms), a0);
        v1 = tt_qadd(VM ? tt_smmlar(v1, Ms, v1) : tt_smmulr(v1, Ms), a1);
    } else {
        v0 = sgd_mom_vv(g0, a0, v0, M, c1, Ms, VM);
        v1 = sgd_mom_vv(g1, a1, v1, M, c1, Ms, VM);
    }
    tt_st_s32x2_prev(*V, v0, v1);
    return tt_pack_lo((uint32_t)tt_ssat15_asr8(tt_qadd(v0, 1 << (TT_SGD_GUARD_BITS - 1))),
                      (uint32_t)tt_ssat15_asr8(tt_qadd(v1, 1 << (TT_SGD_GUARD_BITS - 1))));
}

/* The fused per-sample step of momentum SGD on int16 weights (batch 1, no decay, no stochastic
 * rounding; sgd_apply_body's W16 MU ACC case, same bits) four elements per turn from *w to end:
 * g, A and V by LDRD/STRD, the weight pair updated by SSUB16 under the Q-flag guard of
 * tt_sgd_row_fast_s16 (old lanes in [-16384, 16383] by SSAT16, steps in [-16384, 16383] by SSAT
 * #15 of t >> 8: then w - d is in [-32767, 32767], no saturation, no -32768); four that hit the
 * guard are redone by the scalar rule from their old weights and the velocities just stored
 * (t = sat32(vv + 2^7), read back: nothing of the four stays live across the guard). A stale Q
 * flag only sends four to that exact redo. The pointers are advanced; A, V, g 4-byte aligned, w
 * any 2-byte alignment. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_mom_quads(int16_t **pw, int16_t *end, const int32_t **gp, int32_t **A, int32_t **V,
                                     int32_t M, int32_t c1, int32_t Ms, int32_t VM, int32_t Z)
{
    int16_t *w = *pw;
    uint32_t nsat = 0;
    while (w != end) {
        const uint32_t D0 = sgd_mom_pair(gp, A, V, M, c1, Ms, VM, Z);
        const uint32_t D1 = sgd_mom_pair(gp, A, V, M, c1, Ms, VM, Z);
        const uint32_t W0 = tt_ld_s16x2(w), W1 = tt_ld_s16x2(w + 2); /* any 2-byte alignment */
        tt_guard_s16x2_15(W0);
        tt_guard_s16x2_15(W1);
        if (tt_guard_hit()) {
            nsat += sgd_mom_redo4(w, *V);
            tt_guard_clear();
        } else {
            tt_st_s16x2(w, (uint32_t)__ssub16((int32_t)W0, (int32_t)D0));
            tt_st_s16x2(w + 2, (uint32_t)__ssub16((int32_t)W1, (int32_t)D1));
        }
        w += 4;
    }
    *pw = w;
    return nsat;
}

/* Element j of a momentum row by the scalar rule of sgd_mom_quads. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_mom_one(int16_t *w, int32_t *A, int32_t *V, int32_t j, const int32_t *g, int32_t M,
                                   int32_t c1, int32_t Ms, int32_t VM)
{
    const int32_t v0 = sgd_mom_vv(g[j], A[j], V[j], M, c1, Ms, VM);
    A[j] = 0;
    V[j] = v0;
    return sgd_mom_w1(w + j, w[j], tt_qadd(v0, 1 << (TT_SGD_GUARD_BITS - 1)));
}

/* The last n elements (n < 4) of a momentum row by the scalar rule of sgd_mom_quads (straight
 * line: no loop to set up for the one or two a row of odd length leaves). */
static inline uint32_t sgd_mom_tail(int16_t *w, int32_t *A, int32_t *V, int32_t n, const int32_t *g, int32_t M,
                                    int32_t c1, int32_t Ms, int32_t VM)
{
    uint32_t nsat = 0;
    if (n > 0) nsat += sgd_mom_one(w, A, V, 0, g, M, c1, Ms, VM);
    if (n > 1) nsat += sgd_mom_one(w, A, V, 1, g, M, c1, Ms, VM);
    if (n > 2) nsat += sgd_mom_one(w, A, V, 2, g, M, c1, Ms, VM);
    return nsat;
}

/* sgd_mom_quads then sgd_mom_tail on n elements. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_mom_s16_body(int16_t *w, int32_t *A, int32_t *V, int32_t n, const int32_t *g, int32_t M,
                                        int32_t c1, int32_t Ms, int32_t VM)
{
    uint32_t nsat;
    tt_guard_clear();
    nsat = sgd_mom_quads(&w, w + (n & ~3), &g, &A, &V, M, c1, Ms, VM, 0);
    return nsat + sgd_mom_tail(w, A, V, n & 3, g, M, c1, Ms, VM);
}

/* sgd_mom_s16_body with VM (mu 2^(32 - mk) >= 2^31) and c1 > 0 constants. */
static uint32_t sgd_mom_s16_dsp(int16_t *w, int32_t *A, int32_t *V, int32_t n, const int32_t *g, int32_t M,
                                int32_t c1, int32_t Ms, int32_t VM)
{
    if (c1) return VM ? sgd_mom_s16_body(w, A, V, n, g, M, c1, Ms, 1) : sgd_mom_s16_body(w, A, V, n, g, M, c1, Ms, 0);
    return VM ? sgd_mom_s16_body(w, A, V, n, g, M, 0, Ms, 1) : sgd_mom_s16_body(w, A, V, n, g, M, 0, Ms, 0);
}


/* The rows of one input chunk of sgd_dense_acc (int16 weights, momentum, DSP): row n's len
 * weights at w + n K (A, V alike) by sgd_mom_quads and sgd_mom_tail with its multiplier
 * An = m_t e[n] 2^sh (tt_sgd_row_mult) on the widened inputs X; one call for all N rows, the
 * pointers carried from row to row (VM a constant); a row whose An is 0 (ReLU's zeroed errors)
 * takes the quads that read no input. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_mom_rows_body(int16_t *w, int32_t *A, int32_t *V, int32_t K, int32_t N, int32_t len,
                                         const int32_t *X, const int8_t *e, int32_t m_t, int32_t sh, int32_t Ms,
                                         int32_t VM)
{
    const int8_t *const eend = e + N;
    const int32_t t = len & 3, skip = K - len + t; /* from a row's last quad to the next row */
    uint32_t nsat = 0;
    tt_guard_clear();
    for (; e != eend; e++) {
        const int32_t M = tt_sgd_row_mult(m_t, *e, sh);
        const int32_t *gp = X;
        if (M) nsat += sgd_mom_quads(&w, w + (len & ~3), &gp, &A, &V, M, 0, Ms, VM, 0);
        else nsat += sgd_mom_quads(&w, w + (len & ~3), &gp, &A, &V, 0, 0, Ms, VM, 1); /* no input read */
        gp = X + (len & ~3);
        if (t) nsat += sgd_mom_tail(w, A, V, t, gp, M, 0, Ms, VM);
        w += skip;
        A += skip;
        V += skip;
    }
    return nsat;
}

#if defined(__GNUC__)
__attribute__((noinline))
#endif
static uint32_t sgd_mom_rows_s16_dsp(int16_t *w, int32_t *A, int32_t *V, int32_t K, int32_t N, int32_t len,
                                     const int32_t *X, const int8_t *e, int32_t m_t, int32_t sh, int32_t Ms, int32_t VM)
{
    return VM ? sgd_mom_rows_body(w, A, V, K, N, len, X, e, m_t, sh, Ms, 1)
              : sgd_mom_rows_body(w, A, V, K, N, len, X, e, m_t, sh, Ms, 0);
}

#endif

/* accumulate + apply (+ refresh) of one tensor in one pass when the accumulate is
 * tt_sgd_accumulate_fast's rounded-multiply case and the apply is sgd_apply_fast's; otherwise the
 * three calls in turn (equal: batch size 1 and no draws). */
static void sgd_accumulate_apply(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int16_t *copy, int32_t *A,
                                 int32_t *V, int32_t n, int32_t ew, const int32_t *g, int32_t eg)
{
    const tt_sgd *o = u->cfg;
    const int32_t s = ew + o->k - eg - TT_SGD_GUARD_BITS, m_t = u->m_t;
#if TT_HAVE_DSP
    int32_t Ms, VM;
    if (V && s >= -14 && s <= 31 && sgd_mom_ok(u, &Ms, &VM)) {
        /* M = m_t 2^c2 < 2^31 and c1 = 32 - s - c2 in [0, 30]; for c1 > 0, |g| < 2^(31 - c1) (a first
         * pass). For s <= 0 the product g m_t 2^(32 - s) is a multiple of 2^32: SMMULR gives the
         * left shift m_t g 2^-s exactly (|.| < 2^30: no saturation in shift) */
        const int32_t c2 = 32 - s < 16 ? 32 - s : 16, c1 = 32 - s - c2, M = m_t << c2;
        uint32_t b = 0;
        int32_t i;
        if (c1) for (i = 0; i < n; i++) b |= (uint32_t)(g[i] ^ (g[i] >> 31));
        if (tt_bitwidth_u64(b) + c1 <= 31) {
            if (w16) u->stats->saturated += sgd_mom_s16_dsp(w16, A, V, n, g, M, c1, Ms, VM);
            else if (VM) u->stats->saturated += sgd_mom_s32(w32, copy, A, V, n, g, M, c1, Ms, 1);
            else u->stats->saturated += sgd_mom_s32(w32, copy, A, V, n, g, M, c1, Ms, 0);
            return;
        }
    }
#endif
    if (s >= 1 && s <= 31 && m_t >= 0) {
        uint32_t b = 0;
        int32_t i;
        for (i = 0; i < n; i++) b |= (uint32_t)(g[i] ^ (g[i] >> 31));
        if (((int64_t)m_t << tt_bitwidth_u64(b)) + ((int64_t)1 << (s - 1)) < ((int64_t)1 << 31)) { /* |g| <= 2^bitwidth */
            sgd_fuse f; /* ib_m, ib_k: set by sgd_apply_fast (a {0, 0} initialiser here is one
                         * 64-bit constant GCC may store with VFP registers in hard-float builds) */
            f.g = g;
            f.m_t = m_t;
            f.s = s;
            f.copy = copy;
            if (sgd_apply_fast(u, w16, w32, A, V, n, &f)) return;
        }
    }
    tt_sgd_accumulate_s32(u, A, n, ew, g, eg);
    sgd_apply_accumulated(u, w16, w32, copy, A, V, n);
}

void tt_sgd_accumulate_apply_s16(const tt_sgd_step *u, int16_t *w, int32_t *A, int32_t *V, int32_t n,
                                 int32_t ew, const int32_t *g, int32_t eg)
{
    sgd_accumulate_apply(u, w, 0, 0, A, V, n, ew, g, eg);
}

void tt_sgd_accumulate_apply_s32(const tt_sgd_step *u, int32_t *w, int16_t *copy, int32_t *A, int32_t *V,
                                 int32_t n, int32_t ew, const int32_t *g, int32_t eg)
{
    sgd_accumulate_apply(u, 0, w, copy, A, V, n, ew, g, eg);
}

/* Gradients formed this many at a time by the Dense accumulate-apply (stack: 4 bytes each). */
#define TT_SGD_ACC_CHUNK 64

/* The Dense layer's sgd_accumulate_apply without a gradient buffer: weights w16 (or w32 with its
 * copy) row by row in chunks of the gradient g[n][k] = e[n] x[k], then the biases from e: the same
 * element rule on every element, so the same bits as the whole-tensor calls (no draws: batch 1, no
 * stochastic rounding). Momentum (sgd_mom_ok), on every target: per chunk of inputs X = x 2^c and
 * per row An = m_t e[n] 2^(32 - s - c) (c = max(0, 23 - s): |An| < 2^31, |X| <= 2^31), the step
 * SMMULR(X, An) = round(m_t e x / 2^s) exactly (a left shift for s <= 0), in sgd_mom_s16_body
 * (DSP, int16), sgd_mom_s16 (portable, int16) or sgd_mom_s32 (int32 master and its copy). */
static void sgd_dense_acc(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int16_t *copy, int32_t *A, int32_t *V,
                          int32_t ew, const int8_t *e, int32_t ee, const int8_t *x, int32_t ex, int32_t K, int32_t N)
{
    int32_t g[TT_SGD_ACC_CHUNK], k0, n, j;
    const int32_t s = ew + u->cfg->k - (ee + ex) - TT_SGD_GUARD_BITS;
    int32_t Ms, VM;
    if (V && s >= -1 && s <= 31 && sgd_mom_ok(u, &Ms, &VM)) {
        uint32_t nsat = 0;
        int32_t sh;
        for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) {
            const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK;
            sh = tt_sgd_widen_x(x + k0, len, s, g);
#if TT_HAVE_DSP
            if (w16) {
                nsat += sgd_mom_rows_s16_dsp(w16 + k0, A + k0, V + k0, K, N, len, g, e, u->m_t, sh, Ms, VM);
                continue;
            }
#endif
            for (n = 0; n < N; n++) {
                const int32_t o = n * K + k0, An = tt_sgd_row_mult(u->m_t, e[n], sh);
                if (w16) {
#if !TT_HAVE_DSP
                    nsat += VM ? sgd_mom_s16(w16 + o, A + o, V + o, len, g, An, Ms, 1)
                               : sgd_mom_s16(w16 + o, A + o, V + o, len, g, An, Ms, 0);
#endif
                } else {
                    nsat += VM ? sgd_mom_s32(w32 + o, copy ? copy + o : 0, A + o, V + o, len, g, An, 0, Ms, 1)
                               : sgd_mom_s32(w32 + o, copy ? copy + o : 0, A + o, V + o, len, g, An, 0, Ms, 0);
                }
            }
        }
        u->stats->saturated += nsat;
        return;
    }
    for (n = 0; n < N; n++) {
        for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) {
            const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK, o = n * K + k0;
            for (j = 0; j < len; j++) g[j] = (int32_t)e[n] * (int32_t)x[k0 + j];
            sgd_accumulate_apply(u, w16 ? w16 + o : 0, w32 ? w32 + o : 0, copy ? copy + o : 0, A + o, V ? V + o : 0,
                                 len, ew, g, ee + ex);
        }
    }
}

/* The biases of a Dense accumulate-apply: gradient e[n] at ee, in chunks. Momentum (sgd_mom_ok,
 * s in [-8, 31]): sgd_dense_acc's momentum rule with the biases as one row whose inputs are e,
 * widened to E = e 2^c with c = min(24, max(0, 23 - s)) (|E| <= 2^31), and whose multiplier is
 * m_t 2^(32 - s - c) (< 2^31: 32 - s - c <= 16 and m_t < 2^15), so SMMULR(E, m_t 2^(32 - s - c))
 * = round(m_t e / 2^s) exactly (a left shift for s <= 0); no per-chunk bound pass. */
static void sgd_dense_acc_bias(const tt_sgd_step *u, int32_t *b, int32_t *A, int32_t *V, int32_t eb,
                               const int8_t *e, int32_t ee, int32_t N)
{
    int32_t g[TT_SGD_ACC_CHUNK], n0, j, Ms, VM;
    const int32_t s = eb + u->cfg->k - ee - TT_SGD_GUARD_BITS;
    if (V && s >= -8 && s <= 31 && sgd_mom_ok(u, &Ms, &VM)) {
        const int32_t c = s >= 23 ? 0 : s >= -1 ? 23 - s : 24, An = (int32_t)((uint32_t)u->m_t << (32 - s - c));
        uint32_t nsat = 0;
        for (n0 = 0; n0 < N; n0 += TT_SGD_ACC_CHUNK) {
            const int32_t len = N - n0 < TT_SGD_ACC_CHUNK ? N - n0 : TT_SGD_ACC_CHUNK;
            for (j = 0; j < len; j++) g[j] = (int32_t)((uint32_t)(int32_t)e[n0 + j] << c);
            nsat += VM ? sgd_mom_s32(b + n0, 0, A + n0, V + n0, len, g, An, 0, Ms, 1)
                       : sgd_mom_s32(b + n0, 0, A + n0, V + n0, len, g, An, 0, Ms, 0);
        }
        u->stats->saturated += nsat;
        return;
    }
    for (n0 = 0; n0 < N; n0 += TT_SGD_ACC_CHUNK) {
        const int32_t len = N - n0 < TT_SGD_ACC_CHUNK ? N - n0 : TT_SGD_ACC_CHUNK;
        for (j = 0; j < len; j++) g[j] = e[n0 + j];
        sgd_accumulate_apply(u, 0, b + n0, 0, A + n0, V ? V + n0 : 0, len, eb, g, ee);
    }
}

#if TT_HAVE_DSP
/* A[j] = sat32(A[j] + 2^J p X[j]) for j < len as 2^J QADDs of p X[j] (|p X| < 2^31: the caller's
 * bound; the terms share one sign, so a sum that saturates stays at that rail, where the exact
 * sum is too), two per turn by LDRD/STRD (A, X 4-byte aligned int32 arrays); J in [0, 2], a
 * constant after inlining. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline void sgd_acc_qadd_row_j(int32_t *A, const int32_t *X, int32_t len, int32_t p, int32_t J)
{
    int32_t *const end = A + (len & ~1);
    int32_t r;
    while (A != end) {
        int32_t a0, a1, x0, x1, t0, t1;
        tt_ld_s32x2_next(&X, &x0, &x1);
        tt_ld_s32x2_next((const int32_t **)&A, &a0, &a1);
        t0 = p * x0;
        t1 = p * x1;
        for (r = 0; r < (1 << J); r++) {
            a0 = tt_qadd(a0, t0);
            a1 = tt_qadd(a1, t1);
        }
        tt_st_s32x2_prev(A, a0, a1);
    }
    if (len & 1) {
        const int32_t t0 = p * *X;
        int32_t a0 = *A;
        for (r = 0; r < (1 << J); r++) a0 = tt_qadd(a0, t0);
        *A = a0;
    }
}

/* sgd_acc_qadd_row_j for J = j. */
static void sgd_acc_qadd_row(int32_t *A, const int32_t *X, int32_t len, int32_t p, int32_t j)
{
    if (j == 0) sgd_acc_qadd_row_j(A, X, len, p, 0);
    else if (j == 1) sgd_acc_qadd_row_j(A, X, len, p, 1);
    else sgd_acc_qadd_row_j(A, X, len, p, 2);
}
#endif

/* The per-sample accumulate of a Dense layer without a gradient buffer: tt_sgd_accumulate_s32 of
 * the weights' gradient e[n] x[k] (row-major, rows in chunks: the same draws in the same order)
 * then of the biases' e[n]. For 0 <= m_t < 2^15, on every target: s in [-32, 0] (no draws), the
 * exact left shift row by row; s in [1, 31], A = QADD(A, SMMULR(X, A_n)) with the widened inputs
 * and row multipliers of sgd_dense_acc (X A_n = m_t e x 2^(32 - s); SMMULR is one SMULL and a
 * carry on Cortex-M3), and under stochastic rounding (one draw per weight) the high word of
 * X A_n + (r << (32 - s)), as tt_sgd_accumulate_fast's (floor((m_t g + (r mod 2^s)) / 2^s),
 * tt_rshift_stoch_s64). */
static void sgd_dense_acc_w(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int32_t ex)
{
    const int32_t K = p->K, N = p->N;
    int32_t g[TT_SGD_ACC_CHUNK], k0, n, j;
    {
        const int32_t s = p->ew + u->cfg->k - (ee + ex) - TT_SGD_GUARD_BITS;
        if (u->m_t >= 0 && u->m_t < 32768 && s <= 0 && s >= -32) {
            /* left shifts (an int32 master's accumulators; no draws): A = sat32(A + p x 2^t), t = -s,
             * p = m_t e[n] (|p x| < 2^29: exact in int64, no saturation in shift); in 32 bits by QADD
             * when the row's |p| 2^(7 + t) < 2^31 (DSP: by 2^J QADDs of p x 2^(t - J) when that
             * takes J <= 2, the case of an int32 master's large steps) */
            const int32_t t = -s;
            for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) { /* no draws: any order */
                const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK;
                const int8_t *xk = x + k0;
#if TT_HAVE_DSP
                for (j = 0; j < len; j++) g[j] = xk[j];
#endif
                for (n = 0; n < N; n++) {
                    const int32_t pn = u->m_t * (int32_t)e[n];
                    const uint32_t up = (uint32_t)(pn < 0 ? -pn : pn);
                    int32_t *A = p->wa + n * K + k0;
                    if (pn == 0) continue;
#if TT_HAVE_DSP
                    {   /* |p x| 2^(t - J) < 2^31, 2^J QADDs of it */
                        const int32_t J = tt_bitwidth_u64(up) + 7 + t - 30;
                        if (J <= 2) {
                            sgd_acc_qadd_row(A, g, len, pn * ((int32_t)1 << (J > 0 ? t - J : t)), J > 0 ? J : 0);
                            continue;
                        }
                    }
#endif
                    if (tt_bitwidth_u64(up) + 7 + t <= 30) {
                        const int32_t pt = pn * ((int32_t)1 << t);
                        for (j = 0; j < len; j++) A[j] = tt_qadd(A[j], pt * (int32_t)xk[j]);
                    } else if (t <= 30) { /* A + (p x) T by one SMLAL, T = 2^t an int32 */
                        const int32_t T = (int32_t)1 << t;
                        j = 0;
#if TT_HAVE_DSP
                        {   /* two a turn: A and the widened inputs by LDRD/STRD */
                            int32_t *Aj = A;
                            const int32_t *gj = g, *const gend = g + (len & ~1);
                            while (gj != gend) {
                                int32_t a0, a1, x0, x1;
                                int64_t r0, r1;
                                tt_ld_s32x2_next(&gj, &x0, &x1);
                                tt_ld_s32x2(Aj, &a0, &a1);
                                r0 = (int64_t)a0 + (int64_t)(pn * x0) * T;
                                r1 = (int64_t)a1 + (int64_t)(pn * x1) * T;
                                a0 = (int32_t)r0 == r0 ? (int32_t)r0 : r0 < 0 ? INT32_MIN : INT32_MAX;
                                a1 = (int32_t)r1 == r1 ? (int32_t)r1 : r1 < 0 ? INT32_MIN : INT32_MAX;
                                tt_st_s32x2_next(&Aj, a0, a1);
                            }
                            j = len & ~1;
                        }
#endif
                        for (; j < len; j++) {
                            const int64_t r = (int64_t)A[j] + (int64_t)(pn * (int32_t)xk[j]) * T;
                            A[j] = (int32_t)r == r ? (int32_t)r : r < 0 ? INT32_MIN : INT32_MAX;
                        }
                    } else {
                        for (j = 0; j < len; j++) A[j] = tt_sat_s32((int64_t)A[j] + (int64_t)(pn * (int32_t)xk[j]) * ((int64_t)1 << t));
                    }
                }
            }
        } else if (u->m_t >= 0 && u->m_t < 32768 && s >= 1 && s <= 31) {
            const int32_t sr = u->cfg->sr, sl = 32 - s;
            uint32_t r = *u->prng;
            int32_t sh;
            if (!sr) {
                for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) {
                    const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK;
                    sh = tt_sgd_widen_x(x + k0, len, s, g);
                    for (n = 0; n < N; n++) {
                        const int32_t An = tt_sgd_row_mult(u->m_t, e[n], sh);
                        int32_t *A = p->wa + n * K + k0;
                        for (j = 0; j < len; j++) A[j] = tt_qadd(A[j], tt_smmulr(g[j], An));
                    }
                }
            } else {
                /* rows outer (the draws are row-major): a row of more than one chunk widens
                 * its chunks again */
                sh = tt_sgd_widen_x(x, K < TT_SGD_ACC_CHUNK ? K : TT_SGD_ACC_CHUNK, s, g);
                for (n = 0; n < N; n++) {
                    for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) {
                        const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK;
                        const int32_t An = tt_sgd_row_mult(u->m_t, e[n], sh);
                        int32_t *A = p->wa + n * K + k0;
                        if (K > TT_SGD_ACC_CHUNK) tt_sgd_widen_x(x + k0, len, s, g);
                        r = sgd_acc_sr(A, len, g, An, sl, r);
                    }
                }
                *u->prng = r;
            }
        } else {
            for (n = 0; n < N; n++) {
                for (k0 = 0; k0 < K; k0 += TT_SGD_ACC_CHUNK) {
                    const int32_t len = K - k0 < TT_SGD_ACC_CHUNK ? K - k0 : TT_SGD_ACC_CHUNK;
                    for (j = 0; j < len; j++) g[j] = (int32_t)e[n] * (int32_t)x[k0 + j];
                    tt_sgd_accumulate_s32(u, p->wa + n * K + k0, len, p->ew, g, ee + ex);
                }
            }
        }
    }
}

/* The weight accumulate may wait for tt_sgd_dense_apply_kept_s32: batch size 1, accumulators 0,
 * no draws (a left shift by t = -s in [0, 32] of m_t e x, 0 <= m_t < 2^15). */
static int32_t sgd_dense_keeps(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, int32_t ee, int32_t ex)
{
    const int32_t s = p->ew + u->cfg->k - (ee + ex) - TT_SGD_GUARD_BITS;
    return p->keep && p->keep->state == 1 && u->cfg->batch_size == 1 && u->m_t >= 0 && u->m_t < 32768 &&
           s <= 0 && s >= -32;
}

void tt_sgd_dense_accumulate_s32(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, const int8_t *e,
                                 int32_t ee, const int8_t *x, int32_t ex)
{
    const int32_t N = p->N;
    int32_t g[TT_SGD_ACC_CHUNK], k0, j;
    if (p->wa) {
        if (sgd_dense_keeps(u, p, ee, ex)) {
            tt_sgd_dense_keep *k = p->keep;
            memcpy(k->e, e, (size_t)N);
            k->x = x;
            k->ee = ee;
            k->ex = ex;
            k->state = 2;
        } else {
            sgd_dense_acc_w(u, p, e, ee, x, ex);
        }
    }
    if (p->ba) {
        for (k0 = 0; k0 < N; k0 += TT_SGD_ACC_CHUNK) {
            const int32_t len = N - k0 < TT_SGD_ACC_CHUNK ? N - k0 : TT_SGD_ACC_CHUNK;
            for (j = 0; j < len; j++) g[j] = e[k0 + j];
            tt_sgd_accumulate_s32(u, p->ba + k0, len, p->eb, g, ee);
        }
    }
}

void tt_sgd_dense_accumulate_apply_s16(const tt_sgd_step *u, const tt_sgd_dense_acc_s16_params *p,
                                       const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) sgd_dense_acc(u, p->w, 0, 0, p->wa, p->wv, p->ew, e, ee, x, ex, p->K, p->N);
    if (p->b) sgd_dense_acc_bias(u, p->b, p->ba, p->bv, p->eb, e, ee, p->N);
}

void tt_sgd_dense_accumulate_apply_s32(const tt_sgd_step *u, const tt_sgd_dense_acc_s32_params *p,
                                       const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) sgd_dense_acc(u, 0, p->w, p->copy, p->wa, p->wv, p->ew, e, ee, x, ex, p->K, p->N);
    if (p->b) sgd_dense_acc_bias(u, p->b, p->ba, p->bv, p->eb, e, ee, p->N);
}

#if TT_HAVE_DSP
/* Two copy lanes of int32 masters m0, m1: round(m / 2^16) = QADD(m, 2^15) >> 16 (the saturation
 * is the clamp at 32767) as the high halves (PKHTB), then a lane of -32768 to -32767 by QSUB16 and
 * QADD16 of 1 (every other lane unchanged). QADD may set the Q flag: the callers read no guard. */
static inline uint32_t tt_narrow_s16x2(int32_t m0, int32_t m1)
{
    const uint32_t c = tt_pack_hi((uint32_t)tt_qadd(m0, 1 << 15), (uint32_t)tt_qadd(m1, 1 << 15));
    return (uint32_t)__qadd16(__qsub16((int32_t)c, 0x00010001), 0x00010001);
}
#endif

void tt_sgd_refresh_copy(const int32_t *master, int16_t *w16, int32_t n)
{
    int32_t i;
#if TT_HAVE_DSP /* two per turn; master 4-byte aligned (int32), w16 any 2-byte alignment */
    const int32_t *const end = master + (n & ~1);
    while (master != end) {
        int32_t m0, m1;
        tt_ld_s32x2_next(&master, &m0, &m1);
        tt_st_s16x2(w16, tt_narrow_s16x2(m0, m1));
        w16 += 2;
    }
    n &= 1;
#endif
    for (i = 0; i < n; i++) {
        /* round(m / 2^16) as ((m >> 15) + 1) >> 1 in int32, in [-32768, 32768] */
        const int32_t r = ((master[i] >> 15) + 1) >> 1;
        w16[i] = (int16_t)(r > TT_S16_MAX ? TT_S16_MAX : r < -TT_S16_MAX ? -TT_S16_MAX : r);
    }
}

static void tt_sgd_apply1(int16_t *w16, int32_t *w32, int32_t i, int64_t g, int32_t s,
                          const tt_sgd *o, int32_t m_t, uint32_t *prng, tt_stats *st)
{
    const int64_t lo = w16 ? -TT_S16_MAX : INT32_MIN, hi = w16 ? TT_S16_MAX : INT32_MAX;
    const int64_t wi = w16 ? w16[i] : w32[i];
    int64_t d = tt_sgd_shift((int64_t)m_t * g, s, o->sr, prng), v, nv;
    if (o->wd_m) d += tt_rshift_round_s64(wi * o->wd_m, o->wd_k);
    v = wi - d;
    nv = tt_clamp64(v, lo, hi);
    if (nv != v) st->saturated++;
    if (w16) w16[i] = (int16_t)nv; else w32[i] = (int32_t)nv;
}

/* w -= round(p / 2^s) (ties toward +inf), saturating to [-32767, 32767]; s in [1, 31] and
 * |p| < 2^30, so the int32 rounding shift equals tt_rshift_round_s64 on it and w - d cannot
 * overflow. A weight whose product p is 0 (its input or its row's error is 0) keeps its value,
 * as a row of zero error does: the fused Dense update skips zero inputs (the reference would only
 * differ on an old -32768, which no update stores, see IntSGD). */
static inline void tt_sgd_s16_one(int16_t *w, int32_t p, int32_t s, tt_stats *st)
{
    int32_t v;
    if (p == 0) return;
    v = (int32_t)*w - ((p >> s) + ((p >> (s - 1)) & 1));
    if (v > TT_S16_MAX) { v = TT_S16_MAX; st->saturated++; }
    else if (v < -TT_S16_MAX) { v = -TT_S16_MAX; st->saturated++; }
    *w = (int16_t)v;
}

/* The bias of a row of the fused Dense update, p = m_t e[n] != 0 (|p| < 2^22), sb in [1, 31]:
 * b -= (p + 2^(sb - 1)) >> sb, saturating toward d's opposite sign when b - d overflows int32
 * (tt_sgd_dense_bias's fast rule, done in the weights' row loop: one pass over e). */
static inline void tt_sgd_bias_one(int32_t *b, int32_t p, int32_t sb, tt_stats *st)
{
    const int32_t d = (p + ((int32_t)1 << (sb - 1))) >> sb;
    int32_t r;
    if (tt_sub_overflows(*b, d, &r)) {
        st->saturated++;
        r = d > 0 ? INT32_MIN : INT32_MAX;
    }
    *b = r;
}

/* The row bound of tt_sgd_row_rounds_to_0 for the shift s in [1, 31]: 2^(s - 8), 0 for s < 8. */
static inline int32_t tt_sgd_zero_row_lim(int32_t s)
{
    return s >= 8 ? (int32_t)1 << (s - 8) : 0;
}

/* Whether every step round(a x / 2^s) of a row (a = m_t e[n] != 0, any int8 input x) is 0, so
 * that the row keeps its weights (tt_sgd_s16_one's rule for a zero step; the reference differs
 * only on an old -32768, which no update stores, see IntSGD), lim = tt_sgd_zero_row_lim(s):
 * d = floor((a x + 2^(s-1)) / 2^s) is 0 iff -2^(s-1) <= a x < 2^(s-1). For x in [-128, 127]
 * that holds for every x iff -128 a >= -2^(s-1) and 127 a < 2^(s-1) when a > 0, i.e. a <= lim,
 * and iff 128 |a| < 2^(s-1) when a < 0, i.e. a > -lim: one unsigned compare of a + lim - 1
 * against 2 lim (|a| < 2^22, lim <= 2^23: no overflow; lim = 0 never holds). Late in training,
 * when the errors' exponent makes every step of a small error round to 0, this skips most of
 * the update. */
static inline int tt_sgd_row_rounds_to_0(int32_t a, int32_t lim)
{
    return (uint32_t)(a + lim - 1) < 2u * (uint32_t)lim;
}

#if TT_HAVE_DSP
/* A row body specialised by a constant argument (aligned loads): always inlined under GCC. */
#if defined(__GNUC__)
#define TT_SGD_INLINE static inline __attribute__((always_inline))
#else
#define TT_SGD_INLINE static inline
#endif
#if defined(__GNUC__)
#define TT_SGD_NOINLINE __attribute__((noinline))
#else
#define TT_SGD_NOINLINE
#endif
#define TT_SGD_CHUNK 64 /* x widened to int16 pairs this many at a time (stack: 2 bytes each) */

/* For S = W - D lane-wise (wrapping): raises the guard (Q flag) iff a lane's exact v = w - d is
 * outside [-32767, 32767], i.e. iff the scalar rule would saturate there: SSAT16 #15 on
 * SHSUB16(W, D) = floor(v / 2) flags exactly v outside [-32768, 32767]; for the other lanes
 * S = v, and SSAT16 #15 on SHSUB16(S, 1) = floor((v - 1) / 2) flags exactly v = -32768. */
static inline void tt_sgd_guard_s16x2(uint32_t W, uint32_t D, uint32_t S)
{
    tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W, (int32_t)D));
    tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S, 0x00010001));
}

/* w[0..1] = W - D lane-wise, wrapping, under tt_sgd_guard_s16x2. */
static inline void tt_sgd_s16x2(int16_t *w, uint32_t W, uint32_t D)
{
    const uint32_t S = (uint32_t)__ssub16((int32_t)W, (int32_t)D);
    tt_sgd_guard_s16x2(W, D, S);
    tt_st_s16x2(w, S);
}

/* Undo w[2j..2j+1] -= D_j (j < np) exactly: SADD16 of the stored w - d (mod 2^16) and d. */
static void tt_sgd_row_undo_s16(int16_t *row, const uint32_t *xx, int32_t np, int32_t A)
{
    int32_t j;
    for (j = 0; j < np; j++)
        tt_st_s16x2(row + 2 * j, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(row + 2 * j), (int32_t)tt_step_s16x2(A, xx[j])));
}

/* np pairs at row (inputs x, widened xx) whose fast pass hit its guard: they hold S = w - d (mod
 * 2^16), which is what tt_sgd_s16x2 stores, so only its exact saturation guard is run, on the old
 * w = S + d (SADD16, exact) and S (no undo, no second store); on a hit there (some w - d outside
 * [-32767, 32767], i.e. a saturation, or an old -32768) the pairs are undone and take the scalar
 * rule. Leaves the Q flag clear. */
static void tt_sgd_pairs_redo_s16(int16_t *row, const uint32_t *xx, int32_t np, int32_t A, int32_t a,
                                  const int8_t *x, int32_t s, tt_stats *st)
{
    int32_t j;
    tt_guard_clear();
    for (j = 0; j < np; j++) {
        const uint32_t S = tt_ld_s16x2(row + 2 * j), D = tt_step_s16x2(A, xx[j]);
        tt_sgd_guard_s16x2((uint32_t)__sadd16((int32_t)S, (int32_t)D), D, S);
    }
    if (tt_guard_hit()) {
        tt_sgd_row_undo_s16(row, xx, np, A);
        for (j = 0; j < 2 * np; j++) tt_sgd_s16_one(row + j, a * (int32_t)x[j], s, st);
        tt_guard_clear();
    }
}

/* Four weights of an aligned row at *row, inputs xx[0..1] at *xx: w -= D lane-wise (wrapping)
 * with the guard raised on the old pairs, then *row += 4, *xx += 2 (LDRD, STRD with writeback). */
TT_SGD_INLINE void tt_sgd_quad_s16(int16_t **row, const uint32_t **xx, int32_t A)
{
    uint32_t W0, W1, X0, X1;
    tt_ld_s16x4(*row, &W0, &W1);
    tt_ld_u32x2_next(xx, &X0, &X1);
    X0 = tt_step_s16x2(A, X0);
    X1 = tt_step_s16x2(A, X1);
    tt_guard_s16x2_15(W0);
    tt_guard_s16x2_15(W1);
    tt_st_s16x4_next(row, (uint32_t)__ssub16((int32_t)W0, (int32_t)X0), (uint32_t)__ssub16((int32_t)W1, (int32_t)X1));
}

/* w[2j..2j+1] -= D_j for j < np (lane-wise, wrapping) of a 4-byte aligned row, eight weights per
 * loop turn by LDRD/STRD, guarded by SSAT16 #15 on the old pairs: with |d| <= 16383 an old lane in
 * [-16384, 16383] gives w - d in [-32767, 32766], no saturation and no -32768, so the wrapping
 * SSUB16 is the exact rule (one SSAT16 per pair instead of tt_sgd_s16x2's three guard steps). The
 * Q flag, clear on entry, is read after every sixteen weights (then a block of eight, and after the
 * last pairs): a hit sends just those pairs to tt_sgd_pairs_redo_s16, so a trained row with a few
 * large weights pays for their blocks only. */
TT_SGD_INLINE void tt_sgd_row_fast_s16(int16_t *row, const uint32_t *xx, int32_t np, int32_t A,
                                       int32_t a, const int8_t *x, int32_t s, tt_stats *st)
{
    const uint32_t *xx0 = xx, *end = xx + (np & ~3), *end16 = xx + (np & ~7);
    /* the weights and the widened inputs by LDRD and the weights back by STRD, all with writeback
     * or an immediate offset, so a turn has no pointer arithmetic; the inputs of a block are found
     * from its place (x + 2 (xx - xx0)) only when it is redone */
    while (xx != end16) {
        tt_sgd_quad_s16(&row, &xx, A);
        tt_sgd_quad_s16(&row, &xx, A);
        tt_sgd_quad_s16(&row, &xx, A);
        tt_sgd_quad_s16(&row, &xx, A);
        if (tt_guard_hit()) tt_sgd_pairs_redo_s16(row - 16, xx - 8, 8, A, a, x + 2 * (xx - 8 - xx0), s, st);
    }
    if (xx != end) {
        tt_sgd_quad_s16(&row, &xx, A);
        tt_sgd_quad_s16(&row, &xx, A);
        if (tt_guard_hit()) tt_sgd_pairs_redo_s16(row - 8, xx - 4, 4, A, a, x + 2 * (xx - 4 - xx0), s, st);
    }
    if (np & 3) {
        const int32_t t = np & 3;
        int32_t j;
        for (j = 0; j < t; j++) {
            const uint32_t W0 = tt_ld_s16x2(row + 2 * j);
            tt_guard_s16x2_15(W0);
            tt_st_s16x2(row + 2 * j, (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_step_s16x2(A, xx[j])));
        }
        if (tt_guard_hit()) tt_sgd_pairs_redo_s16(row, xx, t, A, a, x + 2 * (xx - xx0), s, st);
    }
}

/* The pairs j < np of x whose inputs are not both 0, as the words (X, 2 j) in L (room for 2 np
 * words), X the pair widened as tt_widen_s8 does (x 2^c in int16 lanes); returns their count. A
 * pair of zero inputs has zero steps: its weights keep their values (tt_sgd_s16_one's rule), so
 * the list paths below skip it. One halfword load per pair, a zero pair skipped at once; a pair
 * h = x0 | x1 << 8 is widened by SXTB16 of h | h << 8 (bytes 0 and 2 are x0 and x1). */
static int32_t tt_sgd_list_s16(const int8_t *x, int32_t np, int32_t c, uint32_t *L)
{
    const uint32_t keep = ~((((uint32_t)1 << c) - 1u) << 16);
    const int8_t *p = x, *const end = x + 2 * np;
    uint32_t *q = L;
    for (; p != end; p += 2) {
        uint16_t h;
        memcpy(&h, p, 2);
        if (h == 0) continue;
        q[0] = ((uint32_t)__sxtb16((int32_t)(h | (uint32_t)h << 8)) << c) & keep;
        q[1] = (uint32_t)(p - x);
        q += 2;
    }
    return (int32_t)(q - L) >> 1;
}

/* cnt listed pairs (X, j) of L in a row whose fast step hit its guard: the exact check and redo of
 * tt_sgd_pairs_redo_s16 on the pairs at row + j. Leaves the Q flag clear. */
static void tt_sgd_list_redo_s16(int16_t *row, const uint32_t *L, int32_t cnt, int32_t A, int32_t a,
                                 const int8_t *x, int32_t s, tt_stats *st)
{
    int32_t i;
    tt_guard_clear();
    for (i = 0; i < cnt; i++) {
        const uint32_t S = tt_ld_s16x2(row + L[2 * i + 1]), D = tt_step_s16x2(A, L[2 * i]);
        tt_sgd_guard_s16x2((uint32_t)__sadd16((int32_t)S, (int32_t)D), D, S);
    }
    if (tt_guard_hit()) {
        for (i = 0; i < cnt; i++) {
            int16_t *w = row + L[2 * i + 1];
            const int8_t *xj = x + L[2 * i + 1];
            tt_st_s16x2(w, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(w), (int32_t)tt_step_s16x2(A, L[2 * i])));
            tt_sgd_s16_one(w, a * (int32_t)xj[0], s, st);
            tt_sgd_s16_one(w + 1, a * (int32_t)xj[1], s, st);
        }
        tt_guard_clear();
    }
}

/* One listed pair (*L: X, j; then *L += 2) of rows r0 and, when R = 2, r1: w[j..j+1] -= D lane-wise
 * (wrapping) with the guard raised on the old pair, as tt_sgd_quad_s16 (word loads and stores at
 * any 2-byte alignment). */
TT_SGD_INLINE void tt_sgd_list_one_s16(int16_t *r0, int16_t *r1, const uint32_t **L, int32_t A0, int32_t A1,
                                       int32_t R)
{
    uint32_t X, j, W0, W1;
    tt_ld_u32x2_next(L, &X, &j);
    W0 = tt_ld_s16x2(r0 + j);
    tt_guard_s16x2_15(W0);
    tt_st_s16x2(r0 + j, (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_step_s16x2(A0, X)));
    if (R > 1) {
        W1 = tt_ld_s16x2(r1 + j);
        tt_guard_s16x2_15(W1);
        tt_st_s16x2(r1 + j, (uint32_t)__ssub16((int32_t)W1, (int32_t)tt_step_s16x2(A1, X)));
    }
}

/* The cnt listed pairs of L in R rows (1 or 2, a constant after inlining: two rows share each
 * entry's load), steps A0 = a0 2^sh and A1 = a1 2^sh; the Q flag, clear on entry, read after
 * every four entries and after the last: a hit sends those entries of each row to
 * tt_sgd_list_redo_s16. */
TT_SGD_INLINE void tt_sgd_list_rows_s16(int16_t *r0, int16_t *r1, int32_t a0, int32_t a1, int32_t sh,
                                        const uint32_t *L, int32_t cnt, int32_t R, const int8_t *x,
                                        int32_t s, tt_stats *st)
{
    const int32_t A0 = a0 * ((int32_t)1 << sh), A1 = a1 * ((int32_t)1 << sh);
    const uint32_t *end4 = L + 2 * (cnt & ~3), *end = L + 2 * cnt;
    tt_guard_clear();
    while (L != end4) {
        tt_sgd_list_one_s16(r0, r1, &L, A0, A1, R);
        tt_sgd_list_one_s16(r0, r1, &L, A0, A1, R);
        tt_sgd_list_one_s16(r0, r1, &L, A0, A1, R);
        tt_sgd_list_one_s16(r0, r1, &L, A0, A1, R);
        if (tt_guard_hit()) {
            tt_sgd_list_redo_s16(r0, L - 8, 4, A0, a0, x, s, st);
            if (R > 1) tt_sgd_list_redo_s16(r1, L - 8, 4, A1, a1, x, s, st);
        }
    }
    if (L != end) {
        const uint32_t *const b = L;
        do tt_sgd_list_one_s16(r0, r1, &L, A0, A1, R);
        while (L != end);
        if (tt_guard_hit()) {
            tt_sgd_list_redo_s16(r0, b, (int32_t)(end - b) >> 1, A0, a0, x, s, st);
            if (R > 1) tt_sgd_list_redo_s16(r1, b, (int32_t)(end - b) >> 1, A1, a1, x, s, st);
        }
    }
}

static TT_SGD_NOINLINE void tt_sgd_list_rows2_s16(int16_t *r0, int16_t *r1, int32_t a0, int32_t a1, int32_t sh,
                                                  const uint32_t *L, int32_t cnt, const int8_t *x, int32_t s,
                                                  tt_stats *st)
{
    tt_sgd_list_rows_s16(r0, r1, a0, a1, sh, L, cnt, 2, x, s, st);
}

static TT_SGD_NOINLINE void tt_sgd_list_rows1_s16(int16_t *r0, int32_t a0, int32_t sh, const uint32_t *L,
                                                  int32_t cnt, const int8_t *x, int32_t s, tt_stats *st)
{
    tt_sgd_list_rows_s16(r0, r0, a0, 0, sh, L, cnt, 1, x, s, st);
}

/* The N rows of one chunk of tt_sgd_dense_rows_s16 (len inputs x, widened to xx, listed in L when
 * LIST: cnt nonzero pairs; row: the chunk's first weight in row 0, rows K apart). LIST, a constant
 * after inlining: the active rows two at a time over the list (the odd last one alone); else each
 * row over all pairs by tt_sgd_row_fast_s16 (4-byte aligned rows). The odd last input and the rows
 * past amax by the scalar rule. SKIP (a constant too): rows whose steps all round to 0
 * (tt_sgd_row_rounds_to_0 with lim) are passed over after their bias. */
TT_SGD_INLINE void tt_sgd_chunk_s16(const int8_t *e, const int8_t *x, const uint32_t *xx, const uint32_t *L,
                                    int32_t cnt, int32_t len, int32_t K, int32_t N, int16_t *row, int32_t m_t,
                                    int32_t s, int32_t sh, int32_t amax, int32_t lim, int32_t LIST, int32_t SKIP,
                                    int32_t *b, int32_t sb, tt_stats *st)
{
    const int8_t *const e0 = e, *end = e + N;
    int16_t *pr = 0;
    int32_t pa = 0, j;
    for (; e != end; e++, row += K) {
        const int32_t a = m_t * (int32_t)*e, ua = a < 0 ? -a : a;
        if (a == 0) continue;
        if (b) tt_sgd_bias_one(b + (e - e0), a, sb, st);
        if (SKIP && tt_sgd_row_rounds_to_0(a, lim)) continue;
        if (ua > amax) {
            for (j = 0; j < len; j++) tt_sgd_s16_one(row + j, a * (int32_t)x[j], s, st);
            continue;
        }
        if (len & 1) tt_sgd_s16_one(row + len - 1, a * (int32_t)x[len - 1], s, st);
        if (!LIST) {
            tt_guard_clear();
            /* A = a 2^sh: |A| <= INT32_MAX by amax */
            tt_sgd_row_fast_s16(row, xx, len / 2, a * ((int32_t)1 << sh), a, x, s, st);
        } else if (!pr) {
            pr = row;
            pa = a;
        } else {
            tt_sgd_list_rows2_s16(pr, row, pa, a, sh, L, cnt, x, s, st);
            pr = 0;
        }
    }
    if (pr) tt_sgd_list_rows1_s16(pr, pa, sh, L, cnt, x, s, st);
}

/* Rows n of w16[N][K] with a_n = m_t * e[n] != 0: w -= round(a_n x[k] / 2^s), two weights per
 * step. With c = min(8, 32 - s), xx = x 2^c (int16 lanes) and A = a 2^(32 - s - c):
 *   SMLAWB(A, xx, 2^15) = floor(a x 2^(16 - s)) + 2^15, whose high half is
 *   floor((a x 2^(16 - s) + 2^15) / 2^16) = floor((a x + 2^(s - 1)) / 2^s) = d exactly.
 * A row goes this way only if |A| < 2^31 and (|a| * 128) >> s <= 16382 (|a| <= amax), so
 * |d| <= floor((|a| * 128 + 2^(s-1)) / 2^s) <= ((|a| * 128) >> s) + 1 <= 16383 fits a lane.
 * Pairs of zero inputs keep their weights (tt_sgd_s16_one's rule): when a chunk has enough of them
 * (more than one pair in sixteen), or its rows are not 4-byte aligned, the rows go over the list of
 * the other pairs (tt_sgd_list_rows_s16), else over all pairs (tt_sgd_row_fast_s16); both are exact
 * where the old weights are in [-16384, 16383] (their guard), their blocks that hit the guard are
 * checked again exactly and redone by the scalar rule on a real saturation; rows failing the bound
 * take the scalar path. Rows whose every step rounds to 0 (tt_sgd_row_rounds_to_0) keep their
 * weights. The biases b (when not NULL, shift sb in [1, 31]) in the same row loop. */
TT_SGD_INLINE void tt_sgd_dense_rows_body_s16(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                                              int16_t *w16, int32_t m_t, int32_t s, int32_t *b, int32_t sb,
                                              tt_stats *st, int32_t SKIP)
{
    const int32_t c = 32 - s < 8 ? 32 - s : 8, sh = 32 - s - c;
    /* largest |a| with |a| 2^sh <= INT32_MAX and (|a| * 128) >> s <= 16382 */
    const int64_t lim1 = (int64_t)INT32_MAX >> sh, lim2 = (((int64_t)16383 << s) - 1) / 128;
    const int32_t amax = (int32_t)(lim1 < lim2 ? lim1 : lim2);
    const int32_t aligned = ((uintptr_t)w16 & 3u) == 0 && (K & 1) == 0; /* every row, every chunk */
    const int32_t lim = SKIP ? tt_sgd_zero_row_lim(s) : 0;
    uint32_t xx[TT_SGD_CHUNK / 2], L[TT_SGD_CHUNK];
    int32_t k0;
    for (k0 = 0; k0 < K; k0 += TT_SGD_CHUNK) {
        const int32_t len = K - k0 < TT_SGD_CHUNK ? K - k0 : TT_SGD_CHUNK, np = len / 2;
        int32_t cnt;
        cnt = tt_sgd_list_s16(x + k0, np, c, L);
        if (aligned && 16 * cnt > 15 * np) {
            tt_widen_s8(x + k0, len & ~1, c, xx);
            tt_sgd_chunk_s16(e, x + k0, xx, L, cnt, len, K, N, w16 + k0, m_t, s, sh, amax, lim, 0, SKIP, k0 ? 0 : b,
                             sb, st);
        } else {
            tt_sgd_chunk_s16(e, x + k0, xx, L, cnt, len, K, N, w16 + k0, m_t, s, sh, amax, lim, 1, SKIP, k0 ? 0 : b,
                             sb, st);
        }
    }
}

static TT_SGD_NOINLINE void tt_sgd_dense_rows_all_s16(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                                                      int16_t *w16, int32_t m_t, int32_t s, int32_t *b, int32_t sb,
                                                      tt_stats *st)
{
    tt_sgd_dense_rows_body_s16(e, x, K, N, w16, m_t, s, b, sb, st, 0);
}

static TT_SGD_NOINLINE void tt_sgd_dense_rows_skip_s16(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                                                       int16_t *w16, int32_t m_t, int32_t s, int32_t *b, int32_t sb,
                                                       tt_stats *st)
{
    tt_sgd_dense_rows_body_s16(e, x, K, N, w16, m_t, s, b, sb, st, 1);
}

/* A row can round to 0 only if |a| <= lim, so not at all while m_t > lim (early in training,
 * when the errors' exponent is small): then the rows go by the body without the test, a function
 * of its own (in one body with the test's variant, GCC spilled the row loop's registers). */
static inline void tt_sgd_dense_rows_s16(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                                         int16_t *w16, int32_t m_t, int32_t s, int32_t *b, int32_t sb, tt_stats *st)
{
    if (m_t <= tt_sgd_zero_row_lim(s)) tt_sgd_dense_rows_skip_s16(e, x, K, N, w16, m_t, s, b, sb, st);
    else tt_sgd_dense_rows_all_s16(e, x, K, N, w16, m_t, s, b, sb, st);
}
#else
/* Rows n of w16[N][K] with a_n = m_t * e[n] != 0: w -= round(a_n x[k] / 2^s), one at a time,
 * but for rows whose every step rounds to 0 (tt_sgd_row_rounds_to_0); the biases b (when not
 * NULL, shift sb in [1, 31]) in the same row loop. */
static void tt_sgd_dense_rows_s16(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                                  int16_t *w16, int32_t m_t, int32_t s, int32_t *b, int32_t sb, tt_stats *st)
{
    const int32_t lim = tt_sgd_zero_row_lim(s);
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int32_t a = m_t * (int32_t)e[n];
        int16_t *row = w16 + n * K;
        if (a == 0) continue;
        if (b) tt_sgd_bias_one(b + n, a, sb, st);
        if (tt_sgd_row_rounds_to_0(a, lim)) continue;
        for (k = 0; k < K; k++) tt_sgd_s16_one(row + k, a * (int32_t)x[k], s, st);
    }
}
#endif

/* Plain SGD (no stochastic rounding, no decay) on an int16 tensor, s = ew + k - eg in [1, 31] and
 * 0 <= m_t < 2^(s-1): w[i] -= round(m_t g[i] / 2^s), saturating to [-32767, 32767] and counted,
 * as sgd_update_direct does (returns 1; 0 leaves the update to the generic path). With
 * M = m_t 2^(32 - s) (an int32 by the bound on m_t), d = (g M + 2^31) >> 32 (SMMULR) is
 * floor((g m_t + 2^(s-1)) / 2^s), the rounded shift, exactly for every int32 g, and |d| <= 2^30. */
static inline void tt_sgd_plain_one(int16_t *w, int32_t g, int32_t M, tt_stats *st)
{
    int32_t v = (int32_t)*w - tt_smmulr(g, M);
    if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) {
        st->saturated++;
        v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
    }
    *w = (int16_t)v;
}

#if TT_HAVE_DSP
/* The Q-flag guard of four int16 steps d0..d3 (SSAT #15: each in [-16384, 16383]) and of the two
 * old weight pairs W0, W1 they are taken from (SSAT16 #15): no hit makes every w - d exact in
 * [-32767, 32767], so the wrapping SSUB16 is the rule. */
TT_SGD_INLINE void tt_sgd_guard4_steps(int32_t d0, int32_t d1, int32_t d2, int32_t d3)
{
    tt_guard_s32_15(d0);
    tt_guard_s32_15(d1);
    tt_guard_s32_15(d2);
    tt_guard_s32_15(d3);
}

TT_SGD_INLINE void tt_sgd_guard4_s16(int32_t d0, int32_t d1, int32_t d2, int32_t d3, uint32_t W0, uint32_t W1)
{
    tt_sgd_guard4_steps(d0, d1, d2, d3);
    tt_guard_s16x2_15(W0);
    tt_guard_s16x2_15(W1);
}

/* Two weight pairs W0, W1 and their four gradients at *gp (LDRD with writeback): the step pairs
 * D = (d, d') packed by PKHBT, with the guard raised when a d is outside [-16384, 16383] (SSAT #15)
 * or an old lane outside [-16384, 16383] (SSAT16 #15 on W); returns W - D lane-wise (wrapping) in
 * *R0, *R1. Without a guard hit every w - d is in [-32767, 32767]: no saturation, no -32768, so
 * the wrapping SSUB16 is the exact rule. */
TT_SGD_INLINE void tt_sgd_plain_quad(const int32_t **gp, int32_t M, uint32_t W0, uint32_t W1, uint32_t *R0,
                                     uint32_t *R1)
{
    int32_t g0, g1, g2, g3, d0, d1, d2, d3;
    tt_ld_s32x2_next(gp, &g0, &g1);
    tt_ld_s32x2_next(gp, &g2, &g3);
    d0 = tt_smmulr(g0, M);
    d1 = tt_smmulr(g1, M);
    d2 = tt_smmulr(g2, M);
    d3 = tt_smmulr(g3, M);
    tt_sgd_guard4_s16(d0, d1, d2, d3, W0, W1);
    *R0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_pack_lo((uint32_t)d0, (uint32_t)d1));
    *R1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)tt_pack_lo((uint32_t)d2, (uint32_t)d3));
}

/* Eight weights a turn (tt_sgd_plain_quad twice; the weights by LDRD/STRD when w is 4-byte
 * aligned: AL, a constant after inlining, else by word loads), the Q flag read once per turn
 * before anything is stored: a hit (a saturation possible, an old weight outside [-16384, 16383]
 * as trained ones may be, or a large step) sends just those eight to the exact scalar rule.
 * Returns the number of weights done (a multiple of 8); the caller does the rest. */
TT_SGD_INLINE int32_t tt_sgd_plain_s16_dsp(int16_t *w, int32_t n, const int32_t *g, int32_t M, int32_t AL,
                                           tt_stats *st)
{
    int16_t *wp = w, *const end = w + (n & ~7);
    const int32_t *gp = g;
    tt_guard_clear(); /* and again after a hit only: a turn without one leaves the flag clear */
    while (wp != end) {
        uint32_t W0, W1, W2, W3, R0, R1, R2, R3;
        if (AL) {
            tt_ld_s16x4(wp, &W0, &W1);
            tt_ld_s16x4(wp + 4, &W2, &W3);
        } else {
            W0 = tt_ld_s16x2(wp); W1 = tt_ld_s16x2(wp + 2);
            W2 = tt_ld_s16x2(wp + 4); W3 = tt_ld_s16x2(wp + 6);
        }
        tt_sgd_plain_quad(&gp, M, W0, W1, &R0, &R1);
        tt_sgd_plain_quad(&gp, M, W2, W3, &R2, &R3);
        if (tt_guard_hit_after((int32_t)R0, (int32_t)R1, (int32_t)R2, (int32_t)R3)) {
            int32_t j;
            for (j = 0; j < 8; j++) tt_sgd_plain_one(wp + j, gp[j - 8], M, st);
            wp += 8;
            tt_guard_clear();
        } else if (AL) {
            tt_st_s16x4_next(&wp, R0, R1);
            tt_st_s16x4_next(&wp, R2, R3);
        } else {
            tt_st_s16x2(wp, R0); tt_st_s16x2(wp + 2, R1);
            tt_st_s16x2(wp + 4, R2); tt_st_s16x2(wp + 6, R3);
            wp += 8;
        }
    }
    return n & ~7;
}
#endif

/* DSP: eight weights per turn by tt_sgd_plain_s16_dsp (about five instructions a weight), the
 * tail and any guarded block of eight by the scalar rule. */
static int32_t tt_sgd_plain_s16(int16_t *w, int32_t n, const int32_t *g, int32_t m_t, int32_t s,
                                tt_stats *st)
{
    int32_t i = 0, M;
    if (s < 1 || s > 31 || m_t < 0 || ((int64_t)m_t << (32 - s)) > INT32_MAX) return 0;
    M = (int32_t)((int64_t)m_t << (32 - s));
#if TT_HAVE_DSP
    if (((uintptr_t)w & 3u) == 0) i = tt_sgd_plain_s16_dsp(w, n, g, M, 1, st);
    else i = tt_sgd_plain_s16_dsp(w, n, g, M, 0, st);
#endif
    for (; i < n; i++) tt_sgd_plain_one(w + i, g[i], M, st);
    return 1;
}

/* tt_sgd_plain_s16's rule on an int32 tensor (a bias, a batch-norm beta): w[i] = sat_s32(w[i] -
 * d), saturations counted, d = rshift_round(m_t g[i], s) for 0 <= m_t < 2^31: SMMULR(g[i], M) for
 * s <= 31 (same bounds as tt_sgd_plain_s16; s = 32: M = m_t), in int64 when M would not fit
 * int32 (a bias's step at a small shift); for s in [33, 62], with v = m_t g =
 * hi 2^32 + lo (|hi| < 2^30), v + 2^(s-1) = (hi + 2^(s-33)) 2^32 + lo and lo < 2^32 cannot carry
 * into floor(. / 2^s), so d = (hi + 2^(s-33)) >> (s - 32) (no int32 overflow: 2^30 + 2^29).
 * Returns 0 outside that range of s and m_t (the generic path then). */
static int32_t tt_sgd_plain_s32(int32_t *w, int32_t n, const int32_t *g, int32_t m_t, int32_t s,
                                tt_stats *st)
{
    int32_t i;
    uint32_t cnt = 0;
    if (s < 1 || s > 62 || m_t < 0) return 0;
    if (s < 32 && ((int64_t)m_t << (32 - s)) > INT32_MAX) {
        /* a large m_t for this shift: the rounded step in int64, (v + 2^(s-1)) >> s (|v| < 2^62) */
        const int64_t half = (int64_t)1 << (s - 1);
        for (i = 0; i < n; i++) {
            const int64_t v = (int64_t)w[i] - (((int64_t)g[i] * m_t + half) >> s);
            const int32_t r = tt_sat_s32(v);
            cnt += r != v;
            w[i] = r;
        }
    } else if (s <= 32) {
        const int32_t M = s == 32 ? m_t : (int32_t)((int64_t)m_t << (32 - s));
        for (i = 0; i < n; i++) {
            const int64_t v = (int64_t)w[i] - tt_smmulr(g[i], M);
            const int32_t r = tt_sat_s32(v);
            cnt += r != v;
            w[i] = r;
        }
    } else {
        const int32_t h = (int32_t)1 << (s - 33), sr = s - 32;
        for (i = 0; i < n; i++) {
            const int32_t hi = (int32_t)(((int64_t)g[i] * m_t) >> 32);
            const int64_t v = (int64_t)w[i] - ((hi + h) >> sr);
            const int32_t r = tt_sat_s32(v);
            cnt += r != v;
            w[i] = r;
        }
    }
    st->saturated += cnt;
    return 1;
}

/* Rows n of w16[N][K] with e[n] != 0 when every step rounds to 0 (s >= 32: |m_t e x| < 2^29 <
 * 2^(s - 1)): w - 0 changes only an old -32768, clamped to -32767 and counted, as the generic path
 * does. Rows are scanned a word at a time: ((v ^ 0x80008000) - 0x00010001) & ~(v ^ 0x80008000)
 * has a lane's top bit set iff that lane is -32768 (a borrow from a -32768 low lane can only add a
 * false top bit to the high lane, when the word holds one anyway). */
static void tt_sgd_dense_rows_zero_s16(const int8_t *e, int32_t K, int32_t N, int16_t *w16,
                                       tt_stats *st)
{
    int32_t n, k;
    for (n = 0; n < N; n++) {
        int16_t *row = w16 + n * K;
        uint32_t acc = 0;
        if (e[n] == 0) continue;
        for (k = 0; k + 2 <= K; k += 2) {
            uint32_t v;
            memcpy(&v, row + k, 4);
            v ^= 0x80008000u;
            acc |= (v - 0x00010001u) & ~v;
        }
        if (k < K && row[k] == -32768) acc = 0x8000u;
        if (acc & 0x80008000u)
            for (k = 0; k < K; k++)
                if (row[k] == -32768) { row[k] = -TT_S16_MAX; st->saturated++; }
    }
}

#if TT_HAVE_DSP
/* An int32 weight pair w0, w1 of tt_sgd_dense_rows_s32_dsp by the scalar rule from the old weights
 * and the steps d0, d1: w - d saturating to int32 (counted), and the int16 copy (when COPY). */
static uint32_t tt_sgd_s32_redo(int32_t *w, int16_t *copy, const int32_t *old, const int32_t *d, int32_t m)
{
    uint32_t sat = 0;
    int32_t j;
    for (j = 0; j < m; j++) {
        int64_t v = (int64_t)old[j] - d[j];
        if (v > INT32_MAX || v < INT32_MIN) { v = v > 0 ? INT32_MAX : INT32_MIN; sat++; }
        w[j] = (int32_t)v;
        if (copy) copy[j] = tt_narrow_s16((int32_t)v);
    }
    return sat;
}

/* The int32 pair w0, w1 at *pw less the steps d0, d1: QSUB (the int32 clamp), the copy's two
 * lanes QADD(v, 2^15) >> 16 (PKHTB) at cp when COPY, under the Q flag (clear on entry; set by a
 * saturating QSUB or QADD, by an earlier saturating instruction of the caller's turn, and by
 * SSAT16 #15 of SHSUB16(copy, 1) when a copy lane is -32768): a hit redoes the pair by
 * tt_sgd_s32_redo from its old values and clears the flag. *pw += 2; returns the saturations. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t tt_sgd_s32_pair_store(int32_t **pw, int16_t *cp, int32_t w0, int32_t w1, int32_t d0, int32_t d1,
                                             int32_t COPY)
{
    const int32_t v0 = __qsub(w0, d0), v1 = __qsub(w1, d1);
    uint32_t c = 0, sat = 0;
    if (COPY) {
        c = tt_pack_hi((uint32_t)tt_qadd(v0, 1 << 15), (uint32_t)tt_qadd(v1, 1 << 15));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)c, 0x00010001));
    }
    if (tt_guard_hit_after(v0, v1, (int32_t)c, (int32_t)c)) {
        const int32_t old[2] = {w0, w1}, d[2] = {d0, d1};
        sat = tt_sgd_s32_redo(*pw, COPY ? cp : 0, old, d, 2);
        tt_guard_clear();
        *pw += 2;
    } else {
        tt_st_s32x2_next(pw, v0, v1);
        if (COPY) tt_st_s16x2(cp, c);
    }
    return sat;
}

/* Two elements of sgd_apply_s32_wd_body per turn (DSP): w, A, V by LDRD/STRD; the step
 * floor((uu + dec + R) / 2^8) as (uu >> 8) + (((uu mod 2^8) + dec + R) >> 8) (|dec| < 2^30: the
 * inner sum fits int32; uu = 2^8 (uu >> 8) + uu mod 2^8), w = QSUB(w, d) (|d| < 2^24: the int32
 * clamp of the wrapped rule), the copy's round(w / 2^16) = QADD(w, 2^15) >> 16 two at a time
 * (PKHTB). The Q flag, clear on entry and cleared again after the velocity's QADDs (a saturated
 * velocity is the rule, nothing to redo; the int32 masters of a fast-moving model hit it often),
 * is set by QSUB and the copy's QADD when they saturate, and by SSAT16 #15 of
 * SHSUB16(copy, 1) when a copy lane is -32768; a hit redoes the pair by tt_sgd_s32_redo from its
 * old weights and steps (the count is of weight saturations only). MU, VM (SMMLAR: mu 2^(32 - mk)
 * >= 2^31), SR, COPY: constants after inlining; an odd last element by sgd_apply_s32_wd_body. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_apply_s32_wd_pairs(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n, int32_t Ms,
                                              int32_t Wd, uint32_t *px, int32_t MU, int32_t VM, int32_t SR, int32_t COPY)
{
    int32_t *const end = w + (n & ~1);
    uint32_t x = *px, nsat = 0;
    tt_guard_clear();
    while (w != end) {
        int32_t w0, w1, a0, a1, d0, d1;
        uint32_t r0 = 1u << (TT_SGD_GUARD_BITS - 1), r1 = r0;
        tt_ld_s32x2(w, &w0, &w1);
        tt_ld_s32x2(A, &a0, &a1);
        tt_st_s32x2_next(&A, 0, 0);
        if (MU) {
            int32_t u0, u1;
            tt_ld_s32x2(V, &u0, &u1);
            a0 = tt_qadd(VM ? tt_smmlar(u0, Ms, u0) : tt_smmulr(u0, Ms), a0);
            a1 = tt_qadd(VM ? tt_smmlar(u1, Ms, u1) : tt_smmulr(u1, Ms), a1);
            tt_st_s32x2_next(&V, a0, a1);
            tt_guard_clear_after2(&a0, &a1); /* a saturated velocity is the rule: nothing to redo */
        }
        if (SR) {
            x = tt_prng_next(&x);
            r0 = x & 255u;
            x = tt_prng_next(&x);
            r1 = x & 255u;
        }
        d0 = (a0 >> TT_SGD_GUARD_BITS) + ((tt_smmulr(w0, Wd) + (int32_t)((uint32_t)a0 & 255u) + (int32_t)r0) >> TT_SGD_GUARD_BITS);
        d1 = (a1 >> TT_SGD_GUARD_BITS) + ((tt_smmulr(w1, Wd) + (int32_t)((uint32_t)a1 & 255u) + (int32_t)r1) >> TT_SGD_GUARD_BITS);
        nsat += tt_sgd_s32_pair_store(&w, copy, w0, w1, d0, d1, COPY);
        if (COPY) copy += 2;
    }
    if (n & 1) {
        const int32_t vm = VM ? -1 : 0;
        nsat += sgd_apply_s32_wd_body(w, copy, A, V, 1, Ms, vm, Wd, &x, MU, SR, COPY);
    }
    *px = x;
    return nsat;
}

#if TT_HAVE_DSP && defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__) && defined(__OPTIMIZE__)
/* sgd_apply_s32_wd_pairs with momentum (MU), with or without the int16 copy (copy NULL), in asm: GCC's allocation of
 * the C loop spilled the PRNG state, the velocity multiplier and the step (55 instructions a pair);
 * here 40 (with the copy). Per pair: w, A, V by LDRD; A = 0; vv = QADD(V + SMMULR(V, Ms) (SMMLAR: VM) or
 * SMMULR(V, Ms), A) (a saturated velocity is the rule); per element one xorshift32 draw (SR; else
 * R = 2^7), d = (vv >> 8) + ((SMMULR(w, Wd) + (vv mod 2^8) + R) >> 8) (|d| < 2^24), w' = w - d by
 * SUBS, whose V flag (the int32 overflow) branches out to the rail of w's sign and counts it; then
 * STRD w', and (copy) the copy: round(w' / 2^16) clamped to +-32767 as the two lanes hi + b of hi = w' >> 16
 * (PKHTB) and b = bit 15 of w' (PKHBT, BIC of 0x10001: 1 - b): QSUB16 of 1 - b (floor -32768), QADD16 of 1
 * (ceiling 32767), one STR (any 2-byte alignment). w, A, V 4-byte aligned; runs (wend - w) / 2 pairs;
 * returns the saturations; *px: the PRNG state (SR). The Q flag is left clear. Only in optimized
 * builds (at -O0 the frame pointer takes a register and the asm's fourteen operands do not fit):
 * sgd_apply_s32_wd_pairs's C otherwise, and on the host (tests/test_sgd_apply_qemu.py runs this one
 * under QEMU against the reference). */
#define TT_SGD_WD_ASM(VEL0, VEL1, R0, R1, COPY) \
    __asm__ volatile( \
        "1:\n\t" \
        "ldrd %[a0], %[a1], [%[pA]]\n\t" \
        "ldrd %[t0], %[t1], [%[pV]]\n\t" \
        VEL0 "\n\t" \
        VEL1 "\n\t" \
        "qadd %[a0], %[t0], %[a0]\n\t" \
        "qadd %[a1], %[t1], %[a1]\n\t" \
        "movs %[t0], #0\n\t" \
        "strd %[t0], %[t0], [%[pA]], #8\n\t" \
        "strd %[a0], %[a1], [%[pV]], #8\n\t" \
        "ldrd %[w0], %[w1], [%[pw]]\n\t" \
        R0 \
        "smmulr %[t0], %[w0], %[Wd]\n\t" \
        "uxtab %[t0], %[t0], %[a0]\n\t" \
        "uxtab %[t0], %[t0], %[x]\n\t" \
        "asrs %[t0], %[t0], #8\n\t" \
        "add %[t0], %[t0], %[a0], asr #8\n\t" \
        "subs %[a0], %[w0], %[t0]\n\t" \
        "bvs 5f\n" \
        "6:\n\t" \
        R1 \
        "smmulr %[t1], %[w1], %[Wd]\n\t" \
        "uxtab %[t1], %[t1], %[a1]\n\t" \
        "uxtab %[t1], %[t1], %[x]\n\t" \
        "asrs %[t1], %[t1], #8\n\t" \
        "add %[t1], %[t1], %[a1], asr #8\n\t" \
        "subs %[a1], %[w1], %[t1]\n\t" \
        "bvs 7f\n" \
        "8:\n\t" \
        "strd %[a0], %[a1], [%[pw]], #8\n\t" \
        COPY \
        "cmp %[pw], %[end]\n\t" \
        "bne 1b\n\t" \
        "b 4f\n" \
        "5:\n\t" \
        "mvn %[a0], #0x80000000\n\t" \
        "sub %[a0], %[a0], %[w0], asr #31\n\t" \
        "ldr %[t0], %[nsatm]\n\t" \
        "adds %[t0], %[t0], #1\n\t" \
        "str %[t0], %[nsatm]\n\t" \
        "b 6b\n" \
        "7:\n\t" \
        "mvn %[a1], #0x80000000\n\t" \
        "sub %[a1], %[a1], %[w1], asr #31\n\t" \
        "ldr %[t1], %[nsatm]\n\t" \
        "adds %[t1], %[t1], #1\n\t" \
        "str %[t1], %[nsatm]\n\t" \
        "b 8b\n" \
        "4:\n\t" \
        "movs %[t0], #0\n\t" \
        "msr APSR_nzcvq, %[t0]" \
        : [w0] "=&r"(w0), [w1] "=&r"(w1), [a0] "=&r"(a0), [a1] "=&r"(a1), [t0] "=&r"(t0), [t1] "=&r"(t1), \
          [pw] "+r"(pw), [pA] "+r"(pA), [pV] "+r"(pV), [pc] "+r"(pc), [x] "+r"(x), [nsatm] "+m"(nsat) \
        : [Ms] "r"(Ms), [Wd] "r"(Wd), [end] "r"(wend) \
        : "cc", "memory")

#define TT_SGD_ASM_COPY "mov %[w0], #0x10001\n\tpkhtb %[t0], %[a1], %[a0], asr #16\n\t" \
    "pkhbt %[t1], %[a0], %[a1], lsl #16\n\tbic %[t1], %[w0], %[t1], lsr #15\n\t" \
    "qsub16 %[t0], %[t0], %[t1]\n\tqadd16 %[t0], %[t0], %[w0]\n\tstr %[t0], [%[pc]], #4\n\t"
#define TT_SGD_ASM_VM0 "smmlar %[t0], %[t0], %[Ms], %[t0]"
#define TT_SGD_ASM_VM1 "smmlar %[t1], %[t1], %[Ms], %[t1]"
#define TT_SGD_ASM_V0 "smmulr %[t0], %[t0], %[Ms]"
#define TT_SGD_ASM_V1 "smmulr %[t1], %[t1], %[Ms]"
#define TT_SGD_ASM_DRAW "eor %[x], %[x], %[x], lsl #13\n\teor %[x], %[x], %[x], lsr #17\n\teor %[x], %[x], %[x], lsl #5\n\t"
#define TT_SGD_ASM_HALF "movs %[x], #128\n\t"

static uint32_t sgd_apply_s32_wd_asm(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t npairs, int32_t Ms,
                                     int32_t Wd, uint32_t *px, int32_t VM, int32_t SR)
{
    int32_t *pw = w, *pA = A, *pV = V, *const wend = w + 2 * npairs;
    int16_t *pc = copy;
    uint32_t x = *px, nsat = 0;
    int32_t w0, w1, a0, a1, t0, t1;
    if (npairs <= 0) return 0;
#define TT_SGD_WD_ASM_COPY(C) \
    if (SR) { \
        if (VM) TT_SGD_WD_ASM(TT_SGD_ASM_VM0, TT_SGD_ASM_VM1, TT_SGD_ASM_DRAW, TT_SGD_ASM_DRAW, C); \
        else TT_SGD_WD_ASM(TT_SGD_ASM_V0, TT_SGD_ASM_V1, TT_SGD_ASM_DRAW, TT_SGD_ASM_DRAW, C); \
        *px = x; \
    } else { \
        if (VM) TT_SGD_WD_ASM(TT_SGD_ASM_VM0, TT_SGD_ASM_VM1, TT_SGD_ASM_HALF, "", C); \
        else TT_SGD_WD_ASM(TT_SGD_ASM_V0, TT_SGD_ASM_V1, TT_SGD_ASM_HALF, "", C); \
    }
    if (copy) {
        TT_SGD_WD_ASM_COPY(TT_SGD_ASM_COPY)
    } else {
        TT_SGD_WD_ASM_COPY("")
    }
#undef TT_SGD_WD_ASM_COPY
    (void)w0; (void)w1; (void)a0; (void)a1; (void)t0; (void)t1;
    return nsat;
}
#define TT_SGD_HAVE_WD_ASM 1

/* The sentinel after the widened inputs of sgd_kept_rows_asm (an int8 input is never 256). */
#define TT_SGD_KEPT_END 256

/* sgd_apply_s32_wd_asm (SR, copy) of one weight row of tt_sgd_dense_apply_kept_s32 whose
 * accumulators are 0 and whose waiting accumulate is A = sat32(p x 2^t): the pair loop reads the
 * inputs X (int32, x as is, then TT_SGD_KEPT_END at the row's last even index) instead of A and
 * leaves A alone (0 before and after). Per pair: y = X P with P = p 2^(t - D) (|y| < 2^31: the
 * caller's D), D = 2: y = QADD(y, y), D = 3: twice; vv = QDADD(V's momentum term, y) = sat32(term + sat32(2^D
 * P X)) = the apply's QADD(term, A); the rest as sgd_apply_s32_wd_asm, the copy as its two
 * lanes clamp(hi + b, -32767, 32767) of hi = w >> 16 and the rounding bit b = bit 15 of w
 * (PKHTB, PKHBT, BIC of 0x10001, QSUB16 of 1 - b, QADD16 of 1). 40 instructions a pair (D = 1). */
#define TT_SGD_KEPT_ASM(VEL0, VEL1, DBL) \
    __asm__ volatile( \
        "ldrd %[X0], %[X1], [%[pX]], #8\n" \
        "1:\n\t" \
        "mul %[X0], %[X0], %[P]\n\t" \
        "mul %[X1], %[X1], %[P]\n\t" \
        DBL \
        "ldrd %[v0], %[v1], [%[pV]]\n\t" \
        VEL0 "\n\t" \
        VEL1 "\n\t" \
        "qdadd %[v0], %[v0], %[X0]\n\t" \
        "qdadd %[v1], %[v1], %[X1]\n\t" \
        "strd %[v0], %[v1], [%[pV]], #8\n\t" \
        "ldrd %[w0], %[w1], [%[pw]]\n\t" \
        TT_SGD_ASM_DRAW \
        "smmulr %[X0], %[w0], %[Wd]\n\t" \
        "uxtab %[X0], %[X0], %[v0]\n\t" \
        "uxtab %[X0], %[X0], %[x]\n\t" \
        "asrs %[X0], %[X0], #8\n\t" \
        "add %[X0], %[X0], %[v0], asr #8\n\t" \
        "subs %[v0], %[w0], %[X0]\n\t" \
        "bvs 5f\n" \
        "6:\n\t" \
        TT_SGD_ASM_DRAW \
        "smmulr %[X1], %[w1], %[Wd]\n\t" \
        "uxtab %[X1], %[X1], %[v1]\n\t" \
        "uxtab %[X1], %[X1], %[x]\n\t" \
        "asrs %[X1], %[X1], #8\n\t" \
        "add %[X1], %[X1], %[v1], asr #8\n\t" \
        "subs %[v1], %[w1], %[X1]\n\t" \
        "bvs 7f\n" \
        "8:\n\t" \
        "strd %[v0], %[v1], [%[pw]], #8\n\t" \
        "mov %[w0], #0x10001\n\t" \
        "pkhtb %[X0], %[v1], %[v0], asr #16\n\t" \
        "pkhbt %[X1], %[v0], %[v1], lsl #16\n\t" \
        "bic %[X1], %[w0], %[X1], lsr #15\n\t" \
        "qsub16 %[X0], %[X0], %[X1]\n\t" \
        "qadd16 %[X0], %[X0], %[w0]\n\t" \
        "str %[X0], [%[pc]], #4\n\t" \
        "ldrd %[X0], %[X1], [%[pX]], #8\n\t" \
        "cmp %[X0], #256\n\t" \
        "bne 1b\n\t" \
        "b 4f\n" \
        "5:\n\t" \
        "mvn %[v0], #0x80000000\n\t" \
        "sub %[v0], %[v0], %[w0], asr #31\n\t" \
        "ldr %[X0], %[nsatm]\n\t" \
        "adds %[X0], %[X0], #1\n\t" \
        "str %[X0], %[nsatm]\n\t" \
        "b 6b\n" \
        "7:\n\t" \
        "mvn %[v1], #0x80000000\n\t" \
        "sub %[v1], %[v1], %[w1], asr #31\n\t" \
        "ldr %[X1], %[nsatm]\n\t" \
        "adds %[X1], %[X1], #1\n\t" \
        "str %[X1], %[nsatm]\n\t" \
        "b 8b\n" \
        "4:\n\t" \
        "movs %[X0], #0\n\t" \
        "msr APSR_nzcvq, %[X0]" \
        : [w0] "=&r"(w0), [w1] "=&r"(w1), [X0] "=&r"(X0), [X1] "=&r"(X1), [v0] "=&r"(v0), [v1] "=&r"(v1), \
          [pw] "+r"(pw), [pV] "+r"(pV), [pX] "+r"(pX), [pc] "+r"(pc), [x] "+r"(x), [nsatm] "+m"(nsat) \
        : [Ms] "r"(Ms), [Wd] "r"(Wd), [P] "r"(P) \
        : "cc", "memory")

#define TT_SGD_KEPT_VM0 "smmlar %[v0], %[v0], %[Ms], %[v0]"
#define TT_SGD_KEPT_VM1 "smmlar %[v1], %[v1], %[Ms], %[v1]"
#define TT_SGD_KEPT_V0 "smmulr %[v0], %[v0], %[Ms]"
#define TT_SGD_KEPT_V1 "smmulr %[v1], %[v1], %[Ms]"
#define TT_SGD_KEPT_DBL "qadd %[X0], %[X0], %[X0]\n\tqadd %[X1], %[X1], %[X1]\n\t"

/* One row's pairs (X holds at least one pair before its TT_SGD_KEPT_END); returns the saturations. */
static uint32_t sgd_kept_row_asm(int32_t *w, int16_t *copy, int32_t *V, const int32_t *X, int32_t P, int32_t Ms,
                                 int32_t Wd, uint32_t *px, int32_t VM, int32_t D)
{
    int32_t *pw = w, *pV = V;
    const int32_t *pX = X;
    int16_t *pc = copy;
    uint32_t x = *px, nsat = 0;
    int32_t w0, w1, X0, X1, v0, v1;
#define TT_SGD_KEPT_D(V0, V1) \
    switch (D) { \
    case 1: TT_SGD_KEPT_ASM(V0, V1, ""); break; \
    case 2: TT_SGD_KEPT_ASM(V0, V1, TT_SGD_KEPT_DBL); break; \
    default: TT_SGD_KEPT_ASM(V0, V1, TT_SGD_KEPT_DBL TT_SGD_KEPT_DBL); break; \
    }
    if (VM) TT_SGD_KEPT_D(TT_SGD_KEPT_VM0, TT_SGD_KEPT_VM1)
    else TT_SGD_KEPT_D(TT_SGD_KEPT_V0, TT_SGD_KEPT_V1)
#undef TT_SGD_KEPT_D
    (void)w0; (void)w1; (void)X0; (void)X1; (void)v0; (void)v1;
    *px = x;
    return nsat;
}

/* tt_sgd_dense_apply_kept_s32 in one pass on DSP cores: stochastic rounding, momentum and decay in
 * sgd_apply_s32_wd's bounds, the copy, K <= TT_SGD_ACC_CHUNK; returns 0 for any other
 * configuration. Row n's accumulate is A = sat32(p x 2^t), p = m_t e[n] (|p x| < 2^29, t in
 * [0, 32]); with |x| < 2^bx over the row and J = bitwidth(|p|) + bx + t - 31 (|p x 2^t| < 2^(31 +
 * J)), a row with p = 0, or t >= 1 and J <= 1, takes sgd_kept_row_asm with D = 1, J = 2 with D = 2
 * (t >= 3: bitwidth(|p|) <= 22, bx <= 8), J = 3 with D = 3; any other row
 * writes its A (the left shift, saturated) and takes sgd_apply_s32_wd_asm. An odd row's last
 * element: sgd_apply_s32_wd_body from its A value. Draws row-major, one per weight. */
static int32_t sgd_apply_kept_fast(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, int32_t *w,
                                   int16_t *copy, int32_t *V)
{
    const tt_sgd *o = u->cfg;
    const tt_sgd_dense_keep *k = p->keep;
    const int32_t K = p->K, N = p->N, np = K / 2, t = -(p->ew + o->k - (k->ee + k->ex) - TT_SGD_GUARD_BITS);
    const int32_t mu = o->mu_m, mk = o->mu_k, wm = o->wd_m, ws = o->wd_k - TT_SGD_GUARD_BITS;
    int32_t X[TT_SGD_ACC_CHUNK + 2], Ms, Wd, VM, n, j, bx;
    uint32_t Mu, x = *u->prng, nsat = 0, mx = 0;
    if (!o->sr || !copy || !V || K < 2 || K > TT_SGD_ACC_CHUNK || o->batch_size != 1 || wm <= 0 || ws < 1 ||
        ws > 32 || ((int64_t)wm << (32 - ws)) > INT32_MAX || mu <= 0 || mk < 1 || mk > 31 ||
        (int64_t)mu >= ((int64_t)1 << mk))
        return 0;
    Wd = (int32_t)((int64_t)wm << (32 - ws));
    Mu = (uint32_t)mu << (32 - mk);
    Ms = Mu >> 31 ? (int32_t)(Mu & 0x7fffffffu) + INT32_MIN : (int32_t)Mu;
    VM = (int32_t)(Mu >> 31);
    for (j = 0; j < K; j++) {
        X[j] = k->x[j];
        mx |= (uint32_t)(X[j] < 0 ? -X[j] : X[j]);
    }
    bx = tt_bitwidth_u64(mx); /* |x| < 2^bx */
    X[2 * np] = TT_SGD_KEPT_END;
    X[2 * np + 1] = 0;
    for (n = 0; n < N; n++) {
        const int32_t pn = u->m_t * (int32_t)k->e[n], off = n * K;
        const int32_t J = pn ? tt_bitwidth_u64((uint64_t)(pn < 0 ? -pn : pn)) + bx + t - 31 : 0;
        int32_t *wr = w + off, *Ar = p->wa + off, *Vr = V + off;
        int16_t *cr = copy + off;
        if (pn == 0 || (t >= 1 && J <= 1)) {
            nsat += sgd_kept_row_asm(wr, cr, Vr, X, pn * ((int32_t)1 << (pn ? t - 1 : 0)), Ms, Wd, &x, VM, 1);
        } else if (J >= 2 && J <= 3) {
            nsat += sgd_kept_row_asm(wr, cr, Vr, X, pn * ((int32_t)1 << (t - J)), Ms, Wd, &x, VM, J);
        } else {
            for (j = 0; j < 2 * np; j++) Ar[j] = tt_sat_s32((int64_t)(pn * (int32_t)k->x[j]) * ((int64_t)1 << t));
            nsat += sgd_apply_s32_wd_asm(wr, cr, Ar, Vr, np, Ms, Wd, &x, VM, 1);
        }
        if (K & 1) {
            int32_t a = tt_sat_s32((int64_t)(pn * (int32_t)k->x[K - 1]) * ((int64_t)1 << t));
            nsat += sgd_apply_s32_wd_body(wr + K - 1, cr + K - 1, &a, Vr + K - 1, 1, Ms, -VM, Wd, &x, 1, 1, 1);
        }
    }
    *u->prng = x;
    u->stats->saturated += nsat;
    return 1;
}
#define TT_SGD_HAVE_KEPT_ASM 1
#endif


/* sgd_apply_s32_wd's loops on DSP cores: one sgd_apply_s32_wd_pairs per combination. */
#if defined(__GNUC__)
__attribute__((noinline))
#endif
static uint32_t sgd_apply_s32_wd_dsp(int32_t *w, int16_t *copy, int32_t *A, int32_t *V, int32_t n, int32_t Ms,
                                     int32_t vm, int32_t Wd, uint32_t *px, int32_t mu, int32_t sr)
{
    uint32_t nsat;
#if TT_SGD_HAVE_WD_ASM
    if (mu) {
        const int32_t np = n / 2;
        nsat = sgd_apply_s32_wd_asm(w, copy, A, V, np, Ms, Wd, px, vm != 0, sr);
        if (n & 1)
            nsat += sgd_apply_s32_wd_body(w + 2 * np, copy ? copy + 2 * np : 0, A + 2 * np, V + 2 * np, 1, Ms, vm, Wd, px,
                                          1, sr, copy != 0);
        return nsat;
    }
#endif
#define TT_WD2(M, S, C) nsat = sgd_apply_s32_wd_pairs(w, copy, A, V, n, Ms, Wd, px, M, M, S, C)
#define TT_WD2N(S, C) nsat = sgd_apply_s32_wd_pairs(w, copy, A, V, n, Ms, Wd, px, 1, 0, S, C)
    if (mu && !vm) {
        switch ((sr ? 2 : 0) | (copy ? 1 : 0)) {
        case 0: TT_WD2N(0, 0); break;
        case 1: TT_WD2N(0, 1); break;
        case 2: TT_WD2N(1, 0); break;
        default: TT_WD2N(1, 1); break;
        }
        return nsat;
    }
    TT_SGD_SPECIALISE3((mu ? 4 : 0) | (sr ? 2 : 0) | (copy ? 1 : 0), TT_WD2)
#undef TT_WD2
#undef TT_WD2N
    return nsat;
}

/* One row of tt_sgd_rows_s32_body: w = QSUB(w, SMMULR(X, A)) and the copy two per turn (LDRD,
 * STRD with writeback) under the Q flag, a hit redone by tt_sgd_s32_redo; an odd last element by
 * the scalar rule. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t tt_sgd_row_s32_pairs(int32_t *w, int16_t *cp, const int32_t *X, int32_t len, int32_t A,
                                            int32_t COPY)
{
    int32_t *const end = w + (len & ~1);
    uint32_t sat = 0;
    tt_guard_clear();
    while (w != end) {
        int32_t w0, w1, x0, x1, d0, d1;
        tt_ld_s32x2(w, &w0, &w1);
        tt_ld_s32x2_next(&X, &x0, &x1);
        d0 = tt_smmulr(x0, A);
        d1 = tt_smmulr(x1, A);
        sat += tt_sgd_s32_pair_store(&w, cp, w0, w1, d0, d1, COPY);
        if (COPY) cp += 2;
    }
    if (len & 1) {
        const int32_t old1 = *w, d1 = tt_smmulr(*X, A);
        sat += tt_sgd_s32_redo(w, COPY ? cp : 0, &old1, &d1, 1);
    }
    return sat;
}

/* Rows n of int32 weights w[N][K] with e[n] != 0 (plain SGD, 0 <= m_t < 2^15, s in [1, 31]): with
 * X = x 2^c (c = max(0, 23 - s)) and A = m_t e[n] 2^(32 - s - c) (|A| < 2^31), d = SMMULR(X, A) =
 * round(m_t e x / 2^s) exactly; w = QSUB(w, d) and the copy's round(w / 2^16) = QADD(w, 2^15) >> 16
 * two at a time (PKHTB), two weights per turn under the Q flag (tt_sgd_row_s32_pairs): QSUB and
 * QADD set it when they saturate, and SSAT16 #15 of SHSUB16(copy, 1) when a copy lane is -32768
 * (the symmetric clamp's case); a hit redoes the pair by the scalar rule from its old values. Rows
 * with e[n] = 0 keep their weights and refresh their copy. COPY: a constant after inlining. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t tt_sgd_rows_s32_body(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int32_t *w32,
                                            int16_t *copy, int32_t m_t, int32_t s, int32_t COPY)
{
    int32_t X[TT_SGD_CHUNK], k0, n, sh;
    uint32_t sat = 0;
    for (k0 = 0; k0 < K; k0 += TT_SGD_CHUNK) {
        const int32_t len = K - k0 < TT_SGD_CHUNK ? K - k0 : TT_SGD_CHUNK;
        sh = tt_sgd_widen_x(x + k0, len, s, X);
        for (n = 0; n < N; n++) {
            const int32_t A = tt_sgd_row_mult(m_t, e[n], sh);
            int32_t *w = w32 + n * K + k0;
            int16_t *cp = COPY ? copy + n * K + k0 : 0;
            if (A == 0) {
                if (COPY) tt_sgd_refresh_copy(w, cp, len);
                continue;
            }
            sat += tt_sgd_row_s32_pairs(w, cp, X, len, A, COPY);
        }
    }
    return sat;
}

/* w = w - d saturating to [-32767, 32767] (|d| < 2^30); returns 1 on a saturation. */
static inline uint32_t tt_sgd_sub1_s16(int16_t *w, int32_t d)
{
    int32_t v = *w - d;
    const uint32_t hit = (uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX;
    if (hit) v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
    *w = (int16_t)v;
    return hit;
}

/* Plain SGD with weight decay on int16 weights w[N][K] (0 <= m_t < 2^15, s in [1, 31], 0 <= wd_m
 * < 2^15, wd_k >= 16), every row: w - round(m_t e x / 2^s) - round(w wd_m / 2^wd_k), saturating to
 * [-32767, 32767] (counted). The step is SMMULR(X, A) as in tt_sgd_rows_s32_body; the decay is
 * SMMULR(w, Wd) with Wd = wd_m 2^(32 - wd_k) < 2^31 for wd_k <= 30, exactly the rounded shift, and
 * 0 for wd_k >= 31 (|w wd_m| < 2^30). Four weights per turn, d = step + decay, under the Q-flag
 * guard of tt_sgd_dense_rows_sr4_s16_dsp (d and the old weights in [-16384, 16383]: w - d by
 * SSUB16, exact), four that hit it by the scalar rule; no draws. */
static uint32_t tt_sgd_dense_rows_wd_s16_dsp(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int16_t *w16,
                                             int32_t m_t, int32_t s, int32_t wm, int32_t wk)
{
    const int32_t Wd = wk <= 30 ? wm << (32 - wk) : 0;
    int32_t X[TT_SGD_CHUNK], k0, n, j, sh;
    uint32_t sat = 0;
    for (k0 = 0; k0 < K; k0 += TT_SGD_CHUNK) {
        const int32_t len = K - k0 < TT_SGD_CHUNK ? K - k0 : TT_SGD_CHUNK;
        sh = tt_sgd_widen_x(x + k0, len, s, X);
        for (n = 0; n < N; n++) {
            const int32_t A = tt_sgd_row_mult(m_t, e[n], sh);
            int16_t *w = w16 + n * K + k0;
            tt_guard_clear();
            for (j = 0; j + 4 <= len; j += 4) { /* four per turn: d = step + decay, w - d by SSUB16 */
                const uint32_t W0 = tt_ld_s16x2(w + j), W1 = tt_ld_s16x2(w + j + 2);
                const int32_t w0 = (int16_t)(W0 & 0xFFFFu), w1 = (int32_t)W0 >> 16;
                const int32_t w2 = (int16_t)(W1 & 0xFFFFu), w3 = (int32_t)W1 >> 16;
                const int32_t d0 = tt_smmulr(X[j], A) + tt_smmulr(w0, Wd), d1 = tt_smmulr(X[j + 1], A) + tt_smmulr(w1, Wd);
                const int32_t d2 = tt_smmulr(X[j + 2], A) + tt_smmulr(w2, Wd), d3 = tt_smmulr(X[j + 3], A) + tt_smmulr(w3, Wd);
                tt_sgd_guard4_s16(d0, d1, d2, d3, W0, W1);
                if (tt_guard_hit()) { /* the scalar rule from the exact d and old weights */
                    sat += tt_sgd_sub1_s16(w + j, d0) + tt_sgd_sub1_s16(w + j + 1, d1) +
                           tt_sgd_sub1_s16(w + j + 2, d2) + tt_sgd_sub1_s16(w + j + 3, d3);
                    tt_guard_clear();
                } else {
                    tt_st_s16x2(w + j, (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_pack_lo((uint32_t)d0, (uint32_t)d1)));
                    tt_st_s16x2(w + j + 2, (uint32_t)__ssub16((int32_t)W1, (int32_t)tt_pack_lo((uint32_t)d2, (uint32_t)d3)));
                }
            }
            for (; j < len; j++) sat += tt_sgd_sub1_s16(w + j, tt_smmulr(X[j], A) + tt_smmulr(w[j], Wd));
        }
    }
    return sat;
}

/* Stochastic rounding without decay on int16 weights w[N][K] (0 <= m_t < 2^15, 1 <= s <= 31; a
 * larger s floors p first, TT_SGD_XS, which the product below cannot: sgd_rows_body takes it), every
 * row, one draw per weight in row-major order: w - floor((m_t e x + (r mod 2^s)) / 2^s), saturating
 * to [-32767, 32767] (counted). With X and A as in tt_sgd_rows_s32_body (X A = m_t e x 2^(32 - s))
 * the step is the high word of X A + (r mod 2^s) 2^(32 - s) = X A + (r << (32 - s) mod 2^32), one
 * SMLAL (tt_mulhi_add), exactly tt_rshift_stoch_s64 (for s = ss). */
static uint32_t tt_sgd_dense_rows_sr_s16_dsp(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int16_t *w16,
                                             int32_t m_t, int32_t s, uint32_t *prng)
{
    const int32_t sl = 32 - s;
    int32_t X[TT_SGD_CHUNK], k0, n, j, sh;
    uint32_t sat = 0, r = *prng;
    for (k0 = 0; k0 < K; k0 += TT_SGD_CHUNK) {
        const int32_t len = K - k0 < TT_SGD_CHUNK ? K - k0 : TT_SGD_CHUNK;
        sh = tt_sgd_widen_x(x + k0, len, s, X);
        for (n = 0; n < N; n++) {
            const int32_t A = tt_sgd_row_mult(m_t, e[n], sh);
            int16_t *w = w16 + n * K + k0;
            for (j = 0; j < len; j++) {
                int32_t v;
                r = tt_prng_next(&r);
                v = w[j] - tt_mulhi_add(X[j], A, r << sl);
                if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) { sat++; v = v > 0 ? TT_S16_MAX : -TT_S16_MAX; }
                w[j] = (int16_t)v;
            }
        }
    }
    *prng = r;
    return sat;
}

/* One row of tt_sgd_dense_rows_sr4_s16_dsp (GS: guard the steps too, a constant after inlining);
 * returns the saturations, *pr the PRNG state after the row's draws. */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_sr4_row(int16_t *w, const int8_t *xp, int32_t K, int32_t a, uint32_t M, int32_t s,
                                   uint32_t *pr, int32_t GS)
{
    int16_t *const end4 = w + (K & ~3), *const end = w + K;
    uint32_t r = *pr, sat = 0;
    tt_guard_clear();
    for (; w != end4; w += 4, xp += 4) {
        int32_t d0, d1, d2, d3;
        uint32_t W0, W1;
        r = tt_prng_next(&r);
        d0 = (a * xp[0] + (int32_t)(r & M)) >> s;
        r = tt_prng_next(&r);
        d1 = (a * xp[1] + (int32_t)(r & M)) >> s;
        r = tt_prng_next(&r);
        d2 = (a * xp[2] + (int32_t)(r & M)) >> s;
        r = tt_prng_next(&r);
        d3 = (a * xp[3] + (int32_t)(r & M)) >> s;
        W0 = tt_ld_s16x2(w);
        W1 = tt_ld_s16x2(w + 2);
        if (GS) tt_sgd_guard4_steps(d0, d1, d2, d3);
        tt_guard_s16x2_15(W0);
        tt_guard_s16x2_15(W1);
        if (tt_guard_hit()) {
            sat += tt_sgd_sub1_s16(w, d0) + tt_sgd_sub1_s16(w + 1, d1) + tt_sgd_sub1_s16(w + 2, d2) +
                   tt_sgd_sub1_s16(w + 3, d3);
            tt_guard_clear();
        } else {
            tt_st_s16x2(w, (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_pack_lo((uint32_t)d0, (uint32_t)d1)));
            tt_st_s16x2(w + 2, (uint32_t)__ssub16((int32_t)W1, (int32_t)tt_pack_lo((uint32_t)d2, (uint32_t)d3)));
        }
    }
    for (; w != end; w++, xp++) {
        r = tt_prng_next(&r);
        sat += tt_sgd_sub1_s16(w, (a * *xp + (int32_t)(r & M)) >> s);
    }
    *pr = r;
    return sat;
}

/* tt_sgd_dense_rows_sr_s16_dsp for s <= 30, any K: the step (m_t e x + (r & M)) >> s of
 * tt_sgd_stoch29's class 0 by one AND and one MLA, four weights per turn under the Q-flag guard
 * (old weights by SSAT16 #15 in [-16384, 16383] and the steps too: then w - d by SSUB16 is in
 * [-32767, 32767], exact and unsaturated); four that hit it are redone by the scalar rule from
 * their exact steps and old weights. A row whose steps are bounded by (|a| 128 + M) >> s <= 16383
 * (a = m_t e[n], |x| <= 128) skips the steps' guard. Same draws, same order. */
static uint32_t tt_sgd_dense_rows_sr4_s16_dsp(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int16_t *w16,
                                              int32_t m_t, int32_t s, uint32_t *prng)
{
    const uint32_t M = ((uint32_t)1 << s) - 1u;
    uint32_t r = *prng, sat = 0;
    int32_t n;
    for (n = 0; n < N; n++) {
        const int32_t a = m_t * (int32_t)e[n], ua = a < 0 ? -a : a;
        if ((int32_t)(((uint32_t)ua * 128u + M) >> s) <= 16383) /* |ua 128| < 2^29, M < 2^30 */
            sat += sgd_sr4_row(w16 + n * K, x, K, a, M, s, &r, 0);
        else
            sat += sgd_sr4_row(w16 + n * K, x, K, a, M, s, &r, 1);
    }
    *prng = r;
    return sat;
}

static uint32_t tt_sgd_dense_rows_s32_dsp(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int32_t *w32,
                                          int16_t *copy, int32_t m_t, int32_t s)
{
    return copy ? tt_sgd_rows_s32_body(e, x, K, N, w32, copy, m_t, s, 1)
                : tt_sgd_rows_s32_body(e, x, K, N, w32, 0, m_t, s, 0);
}
#endif

/* 32-bit paths of the Dense update, same bits, when it draws no PRNG number and has no decay
 * term (can_skip: an element with g = 0 keeps its value, so rows with e[n] == 0 are skipped)
 * and |m_t * e * x| < 2^15 * 128 * 128 = 2^29 (fast). */
#define TT_SGD_CAN_SKIP(o) (!(o)->sr && !(o)->wd_m)
#define TT_SGD_FAST(o, m_t) (TT_SGD_CAN_SKIP(o) && (m_t) >= 0 && (m_t) < 32768)

/* Weights w16 or w32 (the other NULL) of a Dense update by the element rule, s = ew + k - eg. */
static void tt_sgd_dense_weights(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int32_t s,
                                 const int8_t *e, const int8_t *x, int32_t K, int32_t N)
{
    const int32_t can_skip = TT_SGD_CAN_SKIP(u->cfg);
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int32_t en = e[n];
        if (en == 0 && can_skip) continue;
        for (k = 0; k < K; k++)
            tt_sgd_apply1(w16, w32, n * K + k, (int64_t)(en * (int32_t)x[k]), s, u->cfg, u->m_t,
                          u->prng, u->stats);
    }
}

/* One specialisation of tt_sgd_dense_rows_opt (W32, SR, WD constants after inlining): rows n of
 * w[N][K] (w16, or w32 with its int16 copy when copy != NULL), every row, element rule of
 * tt_sgd_apply1 with p = m_t e[n] x[k], |p| < 2^29 and s >= 1, ss = min(s, 31): the rounded shift
 * (p >> ss) + bit ss-1, or the stochastic one (q >> ss) + (((q & M) + (r & M)) >> ss) of q = p >> xs,
 * M = 2^ss - 1 (each masked term < 2^31, the sum < 2^32; xs: TT_SGD_XS), is exact in 32 bits; the decay term
 * rshift_round(w wd_m, wd_k) is 32-bit for int16 w (|w wd_m| <= 2^30, so 0 for wd_k >= 31) and
 * 64-bit for int32 w. One draw per weight, row-major. */
static inline uint32_t sgd_rows_body(const int8_t *e, const int8_t *x, int32_t K, int32_t N, int16_t *w16,
                                     int32_t *w32, int16_t *copy, int32_t m_t, int32_t s, int32_t wm,
                                     int32_t wk, uint32_t *px, int32_t W32, int32_t SR, int32_t WD)
{
    const int32_t xs = TT_SGD_XS(s), ss = s < 31 ? s : 31;
    const uint32_t M = ((uint32_t)1 << ss) - 1u;
    uint32_t r = *px, sat = 0;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int32_t a = m_t * (int32_t)e[n], o = n * K;
        for (k = 0; k < K; k++) {
            const int32_t p = a * (int32_t)x[k];
            int32_t d;
            if (SR) {
                const int32_t q = p >> xs;
                r = tt_prng_next(&r);
                d = (q >> ss) + (int32_t)((((uint32_t)q & M) + (r & M)) >> ss);
            } else {
                d = (p >> ss) + ((p >> (ss - 1)) & 1);
            }
            if (W32) {
                const int32_t wi = w32[o + k];
                int64_t v = (int64_t)wi - d;
                if (WD) v -= tt_rshift_round_s64((int64_t)wi * wm, wk);
                if (v > INT32_MAX) { v = INT32_MAX; sat++; }
                else if (v < INT32_MIN) { v = INT32_MIN; sat++; }
                w32[o + k] = (int32_t)v;
                if (copy) copy[o + k] = tt_narrow_s16((int32_t)v);
            } else {
                const int32_t wi = w16[o + k];
                int32_t v;
                if (WD && wk < 31) {
                    const int32_t q = wi * wm;
                    v = wi - d - (wk == 0 ? q : (q >> wk) + ((q >> (wk - 1)) & 1));
                } else {
                    v = wi - d;
                }
                if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) { v = v > 0 ? TT_S16_MAX : -TT_S16_MAX; sat++; }
                w16[o + k] = (int16_t)v;
            }
        }
    }
    *px = r;
    return sat;
}

/* The Dense update (weights w16, or int32 w32 with an optional int16 copy, or biases as w32 with
 * K = 1 and x = {1}) in one pass, same bits as tt_sgd_dense_weights (+ tt_sgd_refresh_copy) for
 * 0 <= m_t < 32768 and s in [1, 31]; returns 0 (nothing done) otherwise. Rows with e[n] = 0 are
 * skipped only when no draw or decay can change them (and int32 rows then keep their copy up to
 * date). */
static int32_t tt_sgd_dense_rows_opt(const tt_sgd_step *u, int16_t *w16, int32_t *w32, int16_t *copy,
                                     int32_t s, const int8_t *e, const int8_t *x, int32_t K, int32_t N)
{
    const tt_sgd *o = u->cfg;
    const int32_t m_t = u->m_t, wm = o->wd_m, wk = o->wd_k;
    uint32_t r = *u->prng, sat = 0;
    const int32_t ss = s < 31 ? s : 31; /* the rounded shifts by s >= 31 are 0, as by 31 */
    if (m_t < 0 || m_t >= 32768 || s < 1 || wm < 0 || wm >= 32768 || wk < 0 || wk > 62) return 0;
    if (!o->sr && !wm) {
        int32_t n, k;
        if (w16) return 0; /* tt_sgd_dense_rows_s16 */
#if TT_HAVE_DSP
        u->stats->saturated += tt_sgd_dense_rows_s32_dsp(e, x, K, N, w32, copy, m_t, ss);
        return 1;
#endif
        for (n = 0; n < N; n++) {
            if (e[n] == 0) {
                if (copy) for (k = 0; k < K; k++) copy[n * K + k] = tt_narrow_s16(w32[n * K + k]);
                continue;
            }
            sat += sgd_rows_body(e + n, x, K, 1, 0, w32 + n * K, copy ? copy + n * K : 0, m_t, ss, 0, 0, &r, 1, 0, 0);
        }
        u->stats->saturated += sat;
        return 1;
    }
#if TT_HAVE_DSP
    if (w16 && o->sr && !wm && s <= 30) {
        u->stats->saturated += tt_sgd_dense_rows_sr4_s16_dsp(e, x, K, N, w16, m_t, s, u->prng);
        return 1;
    }
    if (w16 && o->sr && !wm && K <= TT_SGD_CHUNK && s <= 31) {
        u->stats->saturated += tt_sgd_dense_rows_sr_s16_dsp(e, x, K, N, w16, m_t, s, u->prng);
        return 1;
    }
    if (w16 && !o->sr && wk >= 16) {
        u->stats->saturated += tt_sgd_dense_rows_wd_s16_dsp(e, x, K, N, w16, m_t, ss, wm, wk);
        return 1;
    }
#endif
#define TT_ROWS(W, S, D) sat = sgd_rows_body(e, x, K, N, w16, w32, copy, m_t, s, wm, wk, &r, W, S, D)
    TT_SGD_SPECIALISE3((w32 ? 4 : 0) | (o->sr ? 2 : 0) | (wm ? 1 : 0), TT_ROWS) /* 0, 4: returned above */
#undef TT_ROWS
    *u->prng = r;
    u->stats->saturated += sat;
    return 1;
}

/* Biases b[N] at eb of a Dense update, gradient e[n] at ee. */
static inline void tt_sgd_dense_bias(const tt_sgd_step *u, int32_t *b, int32_t eb,
                                     const int8_t *e, int32_t ee, int32_t N)
{
    const tt_sgd *o = u->cfg;
    const int32_t m_t = u->m_t, s = eb + o->k - ee;
    int32_t n;
    if (TT_SGD_FAST(o, m_t) && s >= 1 && s <= 31) {
        /* |m_t * e| < 2^22: the rounded shift is (p + 2^(s-1)) >> s without overflow; when b - d
         * overflows int32 it saturates toward d's opposite sign (the int64 difference's clamp) */
        const int32_t half = (int32_t)1 << (s - 1);
        for (n = 0; n < N; n++) {
            const int32_t p = m_t * (int32_t)e[n];
            int32_t d, r;
            if (p == 0) continue;
            d = (p + half) >> s;
            if (tt_sub_overflows(b[n], d, &r)) {
                u->stats->saturated++;
                r = d > 0 ? INT32_MIN : INT32_MAX;
            }
            b[n] = r;
        }
        return;
    }
    if (o->sr && !o->wd_m && m_t >= 0 && m_t < 32768 && s >= 1 && s <= 30) {
        /* stochastic rounding, one draw per bias (e[n] = 0 too): floor((p + (r mod 2^s)) / 2^s) of
         * p = m_t e (|p| < 2^22: the sum fits int32), b - d saturating as above */
        const uint32_t M = ((uint32_t)1 << s) - 1u;
        uint32_t r = *u->prng, nsat = 0;
        for (n = 0; n < N; n++) {
            int32_t d, v;
            r = tt_prng_next(&r);
            d = (m_t * (int32_t)e[n] + (int32_t)(r & M)) >> s;
            if (tt_sub_overflows(b[n], d, &v)) {
                nsat++;
                v = d > 0 ? INT32_MIN : INT32_MAX;
            }
            b[n] = v;
        }
        *u->prng = r;
        u->stats->saturated += nsat;
        return;
    }
    {
        static const int8_t one = 1;
        if (tt_sgd_dense_rows_opt(u, 0, b, 0, s, e, &one, 1, N)) return;
    }
    for (n = 0; n < N; n++) {
        if (e[n] == 0 && TT_SGD_CAN_SKIP(o)) continue;
        tt_sgd_apply1(0, b, n, e[n], s, o, m_t, u->prng, u->stats);
    }
}

void tt_sgd_dense_direct_s16(const tt_sgd_step *u, const tt_sgd_dense_s16_params *p,
                             const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) {
        const int32_t s = p->ew + u->cfg->k - (ee + ex), sb = p->eb + u->cfg->k - ee;
        if (TT_SGD_FAST(u->cfg, u->m_t) && s >= 1 && s <= 31) {
            /* the biases in the weights' row loop when their shift takes the same fast rule */
            int32_t *const b = p->b && sb >= 1 && sb <= 31 ? p->b : 0;
            tt_sgd_dense_rows_s16(e, x, p->K, p->N, p->w, u->m_t, s, b, sb, u->stats);
            if (b) return;
        } else if (TT_SGD_FAST(u->cfg, u->m_t) && s >= 32)
            tt_sgd_dense_rows_zero_s16(e, p->K, p->N, p->w, u->stats);
        else if (!tt_sgd_dense_rows_opt(u, p->w, 0, 0, s, e, x, p->K, p->N))
            tt_sgd_dense_weights(u, p->w, 0, s, e, x, p->K, p->N);
    }
    if (p->b) tt_sgd_dense_bias(u, p->b, p->eb, e, ee, p->N);
}

void tt_sgd_dense_direct_s32(const tt_sgd_step *u, const tt_sgd_dense_s32_params *p,
                             const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    if (p->w) {
        const int32_t s = p->ew + u->cfg->k - (ee + ex);
        if (!tt_sgd_dense_rows_opt(u, 0, p->w, p->copy, s, e, x, p->K, p->N)) {
            tt_sgd_dense_weights(u, 0, p->w, s, e, x, p->K, p->N);
            if (p->copy) tt_sgd_refresh_copy(p->w, p->copy, p->K * p->N);
        }
    }
    if (p->b) tt_sgd_dense_bias(u, p->b, p->eb, e, ee, p->N);
}

/* ---- int8 storage: the element rules of sgd_update_direct / sgd_apply_accumulated with the
 * range [-127, 127] (kept apart from the int16/int32 bodies and their fast paths). */
static void tt_sgd_apply1_s8(int8_t *w, int64_t g, int32_t s, const tt_sgd_step *u)
{
    const tt_sgd *o = u->cfg;
    const int64_t wi = *w;
    int64_t d = tt_sgd_shift((int64_t)u->m_t * g, s, o->sr, u->prng), v, nv;
    if (o->wd_m) d += tt_rshift_round_s64(wi * o->wd_m, o->wd_k);
    v = wi - d;
    nv = tt_clamp64(v, -TT_S8_MAX, TT_S8_MAX);
    if (nv != v) u->stats->saturated++;
    *w = (int8_t)nv;
}

void tt_sgd_update_direct_s8(const tt_sgd_step *u, int8_t *w, int32_t n, int32_t ew,
                             const int32_t *g, int32_t eg)
{
    const int32_t s = ew + u->cfg->k - eg;
    int32_t i;
    for (i = 0; i < n; i++) tt_sgd_apply1_s8(w + i, g[i], s, u);
}

/* rshift_stoch(v, 8, r) with the next PRNG draw r (xorshift32 on *x), in 32 bits. */
static inline int32_t sgd_stoch8(int32_t v, uint32_t *x)
{
    uint32_t r = *x;
    r = tt_prng_next(&r);
    *x = r;
    return (v >> 8) + (int32_t)((((uint32_t)v & 255u) + (r & 255u)) >> 8);
}

#if TT_HAVE_DSP
/* SSAT #8 of t >> 8 (arithmetic): t >> 8 clamped to [-128, 127] (one instruction on the board). */
static inline int32_t sgd_ssat8_asr8(int32_t t)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    int32_t r;
    __asm__("ssat %0, #8, %1, asr #8" : "=r"(r) : "r"(t));
    return r;
#else
    t >>= 8;
    return t > 127 ? 127 : t < -128 ? -128 : t;
#endif
}

/* The lanes (t0 >> 8, t1 >> 8) of one word, each taken modulo 2^16 (ASR, PKHBT with LSL #8). */
static inline uint32_t sgd_pack_asr8(int32_t t0, int32_t t1)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    uint32_t r;
    __asm__("asr %0, %1, #8\n\tpkhbt %0, %0, %2, lsl #8" : "=&r"(r) : "r"(t0), "r"(t1));
    return r;
#else
    return ((uint32_t)(t0 >> 8) & 0xFFFFu) | (((uint32_t)t1 << 8) & 0xFFFF0000u);
#endif
}

/* The low bytes of q0..q3 as one word, q0 in the low byte (BFI). */
static inline uint32_t sgd_pack_s8x4(uint32_t q0, uint32_t q1, uint32_t q2, uint32_t q3)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    __asm__("bfi %0, %1, #8, #8\n\tbfi %0, %2, #16, #8\n\tbfi %0, %3, #24, #8" : "+r"(q0) : "r"(q1), "r"(q2), "r"(q3));
    return q0;
#else
    return (q0 & 0xFFu) | ((q1 & 0xFFu) << 8) | ((q2 & 0xFFu) << 16) | (q3 << 24);
#endif
}

/* Four int8 lanes with -128 made -127 (QSUB8 then QADD8 of 1 in each lane; the others unchanged). */
static inline uint32_t sgd_floor127_x4(uint32_t q)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    uint32_t r;
    __asm__("qsub8 %0, %1, %2\n\tqadd8 %0, %0, %2" : "=&r"(r) : "r"(q), "r"(0x01010101u));
    return r;
#else
    uint32_t i;
    for (i = 0; i < 32; i += 8)
        if (((q >> i) & 0xFFu) == 0x80u) q += (uint32_t)1 << i;
    return q;
#endif
}

/* SSAT #16 of t: t clamped to [-32768, 32767]. */
static inline int32_t sgd_ssat16(int32_t t)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    int32_t r;
    __asm__("ssat %0, #16, %1" : "=r"(r) : "r"(t));
    return r;
#else
    return t > 32767 ? 32767 : t < -32768 ? -32768 : t;
#endif
}
#endif

/* The slot paths' bodies, specialised by constant arguments: always inlined under GCC. */
#if defined(__GNUC__)
#define TT_SGD_SLOT_INLINE static inline __attribute__((always_inline))
#else
#define TT_SGD_SLOT_INLINE static inline
#endif

/* The shifts of a slot's rounded product rshift_round(V 2^e mu_m, mu_k) as one SMMULR (DSP):
 * (V 2^xs) (mu_m 2^ys) with xs + ys = 32 + e - mu_k, ys = min(16, 32 + e - mu_k) (mu_m 2^ys < 2^31
 * for mu_m < 2^15) and xs = the rest, <= 16 + e - 1 (|V 2^xs| <= 2^31 for |V| <= 2^(15 - e)): then
 * SMMULR = floor((V 2^e mu_m 2^(32 - mu_k) + 2^31) / 2^32) = rshift_round(V 2^e mu_m, mu_k). */
static inline void sgd_slot_mul(int32_t e, int32_t mk, int32_t mu_m, int32_t *xs, int32_t *M)
{
    const int32_t t = 32 + e - mk, ys = t < 16 ? t : 16;
    *xs = t - ys;
    *M = mu_m * (1 << ys);
}

/* The weight step w - d of an int8 (W8) or int16 store, saturating to +-lim and counted in *nsat. */
static inline int32_t sgd_slot_store(int32_t w, int32_t d, int32_t lim, uint32_t *nsat)
{
    int32_t v = w - d; /* |d| <= 2^23 */
    if ((uint32_t)(v + lim) > 2u * (uint32_t)lim) {
        (*nsat)++;
        v = v > 0 ? lim : -lim;
    }
    return v;
}

/* The int8-slot rule on elements [i, n) (W8: int8 store, else int16; SR: stochastic update).
 * DSP: the slot's product by SMMULR (sgd_slot_mul, e = 8: xs, M); the slot's draw floor((vv + (r
 * mod 2^8)) / 2^8) as QADD then SSAT #8 of >> 8 and the floor -127 (QADD saturates only at vv >
 * 2^31 - 2^8, where the slot clamps to 127 either way); the update's step round(vv / 2^8) as
 * QADD(vv, 2^7) >> 8 (or QADD of the draw under SR): it differs from the exact step only for
 * vv > 2^31 - 2^8, where both saturate the weight (|d| >= 2^23 - 1 > 2 lim) and count it. */
TT_SGD_SLOT_INLINE uint32_t sgd_v8_scalar(int8_t *w8, int16_t *w16, int32_t *A, int8_t *V, int32_t i, int32_t n,
                                     int32_t mu_m, int32_t mk, int32_t xs, int32_t M, uint32_t *px, int32_t W8,
                                     int32_t SR)
{
    const int32_t lim = W8 ? TT_S8_MAX : TT_S16_MAX;
    uint32_t x = *px, nsat = 0;
#if TT_HAVE_DSP
    (void)mu_m;
    (void)mk;
    for (; i < n; i++) {
        const int32_t vv = tt_qadd(tt_smmulr(V[i] * (1 << xs), M), A[i]);
        int32_t q, d;
        A[i] = 0;
        x = tt_prng_next(&x);
        q = sgd_ssat8_asr8(tt_qadd(vv, (int32_t)(x & 255u)));
        V[i] = (int8_t)(q < -TT_S8_MAX ? -TT_S8_MAX : q);
        if (SR) x = tt_prng_next(&x);
        d = tt_qadd(vv, SR ? (int32_t)(x & 255u) : 128) >> 8;
        if (W8) w8[i] = (int8_t)sgd_slot_store(w8[i], d, lim, &nsat);
        else w16[i] = (int16_t)sgd_slot_store(w16[i], d, lim, &nsat);
    }
#else
    const int32_t mu8 = mu_m * (1 << TT_SGD_V8_SHIFT);
    (void)xs;
    (void)M;
    for (; i < n; i++) {
        const int32_t p = V[i] * mu8; /* |V| <= 128, mu8 = mu_m 2^8 < 2^23: |p| <= 2^30 */
        const int32_t vv = tt_qadd((p >> mk) + ((p >> (mk - 1)) & 1), A[i]);
        int32_t q, d;
        A[i] = 0;
        q = sgd_stoch8(vv, &x);
        V[i] = (int8_t)(q > TT_S8_MAX ? TT_S8_MAX : q < -TT_S8_MAX ? -TT_S8_MAX : q);
        d = SR ? sgd_stoch8(vv, &x) : (vv >> TT_SGD_GUARD_BITS) + ((vv >> (TT_SGD_GUARD_BITS - 1)) & 1);
        if (W8) w8[i] = (int8_t)sgd_slot_store(w8[i], d, lim, &nsat);
        else w16[i] = (int16_t)sgd_slot_store(w16[i], d, lim, &nsat);
    }
#endif
    *px = x;
    return nsat;
}

#if TT_HAVE_DSP
/* SSAT #8 of t >> 8 kept in order after the guard's read (volatile): it may set the Q flag. */
static inline int32_t sgd_ssat8_asr8_v(int32_t t)
{
#if defined(__ARM_FEATURE_DSP) && __ARM_FEATURE_DSP && defined(__GNUC__)
    int32_t r;
    __asm__ volatile("ssat %0, #8, %1, asr #8" : "=r"(r) : "r"(t));
    return r;
#else
    return sgd_ssat8_asr8(t);
#endif
}

/* The int8 slot on int16 weights four at a time: vv by SMMULR and QADD, the draws in the rule's
 * order (each element's slot draw, then its update's under SR), the steps d = SSAT #15 of (vv + R)
 * >> 8 (R = 2^7 or the update's draw mod 2^8, in wrapping 32 bits) and the Q-flag guard, raised by
 * a d or an old weight lane outside [-16384, 16383] (SSAT #15, SSAT16 #15; a vv near the int32 limits
 * and a wrapped vv + R both give such a d). Without a hit |vv| < 2^22, so every sum here is exact,
 * and every w - d lies in [-32767, 32767]: the wrapping SSUB16 of the packed steps is the rule. Then
 * (the guard read) the slots: SSAT #8 of (vv + (r mod 2^8)) >> 8, packed, the floor -127 by QSUB8/QADD8,
 * and the Q flag cleared. A hit sends the four to sgd_v8_scalar from the PRNG state before them. Returns the number
 * of elements done (a multiple of 4). */
TT_SGD_SLOT_INLINE int32_t sgd_v8_quads(int16_t *w, int32_t *A, int8_t *V, int32_t n, int32_t xs, int32_t M,
                                        uint32_t *px, uint32_t *nsat, int32_t SR)
{
    uint32_t x = *px;
    int16_t *wp = w;
    int8_t *vp = V, *const vend = V + (n & ~3);
    int32_t *ap = A;
    tt_guard_clear();
    while (vp != vend) {
        const uint32_t W0 = tt_ld_s16x2(wp), W1 = tt_ld_s16x2(wp + 2);
        int32_t a0, a1, a2, a3, v0, v1, v2, v3, d0, d1, d2, d3;
        uint32_t y = x, r0, r1, r2, r3, R0, R1;
        tt_ld_s32x2_next((const int32_t **)&ap, &a0, &a1);
        tt_ld_s32x2_next((const int32_t **)&ap, &a2, &a3);
        v0 = tt_qadd(tt_smmulr(vp[0] * (1 << xs), M), a0);
        v1 = tt_qadd(tt_smmulr(vp[1] * (1 << xs), M), a1);
        v2 = tt_qadd(tt_smmulr(vp[2] * (1 << xs), M), a2);
        v3 = tt_qadd(tt_smmulr(vp[3] * (1 << xs), M), a3);
        y = tt_prng_next(&y); r0 = y;
        if (SR) y = tt_prng_next(&y);
        d0 = tt_ssat15_asr8((int32_t)((uint32_t)v0 + (SR ? (y & 255u) : 128u)));
        y = tt_prng_next(&y); r1 = y;
        if (SR) y = tt_prng_next(&y);
        d1 = tt_ssat15_asr8((int32_t)((uint32_t)v1 + (SR ? (y & 255u) : 128u)));
        y = tt_prng_next(&y); r2 = y;
        if (SR) y = tt_prng_next(&y);
        d2 = tt_ssat15_asr8((int32_t)((uint32_t)v2 + (SR ? (y & 255u) : 128u)));
        y = tt_prng_next(&y); r3 = y;
        if (SR) y = tt_prng_next(&y);
        d3 = tt_ssat15_asr8((int32_t)((uint32_t)v3 + (SR ? (y & 255u) : 128u)));
        tt_guard_s16x2_15(W0);
        tt_guard_s16x2_15(W1);
        R0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)tt_pack_lo((uint32_t)d0, (uint32_t)d1));
        R1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)tt_pack_lo((uint32_t)d2, (uint32_t)d3));
        if (tt_guard_hit_after((int32_t)R0, (int32_t)R1, v0, v2)) {
            const int32_t i = (int32_t)(vp - V);
            *nsat += sgd_v8_scalar(0, w, A, V, i, i + 4, 0, 0, xs, M, &x, 0, SR);
        } else {
            const uint32_t q0 = (uint32_t)sgd_ssat8_asr8_v((int32_t)((uint32_t)v0 + (r0 & 255u)));
            const uint32_t q1 = (uint32_t)sgd_ssat8_asr8_v((int32_t)((uint32_t)v1 + (r1 & 255u)));
            const uint32_t q2 = (uint32_t)sgd_ssat8_asr8_v((int32_t)((uint32_t)v2 + (r2 & 255u)));
            const uint32_t q3 = (uint32_t)sgd_ssat8_asr8_v((int32_t)((uint32_t)v3 + (r3 & 255u)));
            tt_st_s8x4(vp, sgd_floor127_x4(sgd_pack_s8x4(q0, q1, q2, q3)));
            tt_st_s32x2_prev(ap - 2, 0, 0);
            tt_st_s32x2_prev(ap, 0, 0);
            tt_st_s16x2(wp, R0);
            tt_st_s16x2(wp + 2, R1);
            x = y;
        }
        tt_guard_clear();
        vp += 4; wp += 4;
    }
    *px = x;
    return n & ~3;
}
#endif

/* One specialisation of sgd_apply_v8_fast: sgd_v8_quads where it applies (DSP, int16 weights),
 * sgd_v8_scalar for the rest. */
TT_SGD_SLOT_INLINE uint32_t sgd_apply_v8_body(int8_t *w8, int16_t *w16, int32_t *A, int8_t *V, int32_t n,
                                         int32_t mu_m, int32_t mk, uint32_t *px, int32_t W8, int32_t SR)
{
    uint32_t nsat = 0;
    int32_t xs, M, i = 0;
    sgd_slot_mul(TT_SGD_V8_SHIFT, mk, mu_m, &xs, &M);
#if TT_HAVE_DSP
    if (!W8) i = sgd_v8_quads(w16, A, V, n, xs, M, px, &nsat, SR);
#endif
    return nsat + sgd_v8_scalar(w8, w16, A, V, i, n, mu_m, mk, xs, M, px, W8, SR);
}

/* The configurations of the 32-bit slot paths: batch size 1, no weight decay, 0 <= mu_m < 2^15
 * and mu_k in [1, 31]. */
static inline int32_t sgd_slot_fast_ok(const tt_sgd *o)
{
    return o->batch_size == 1 && !o->wd_m && o->mu_m >= 0 && o->mu_m < 32768 && o->mu_k >= 1 && o->mu_k <= 31;
}

/* The int8-slot rule of sgd_apply_accumulated_narrow in 32 bits (sgd_slot_fast_ok): the same
 * steps and draws (the slot's, then the update's). Returns 0 for any other configuration. */
static int32_t sgd_apply_v8_fast(const tt_sgd_step *u, int8_t *w8, int16_t *w16, int32_t *A, int8_t *V,
                                 int32_t n)
{
    const tt_sgd *o = u->cfg;
    const int32_t mu = o->mu_m, mk = o->mu_k;
    uint32_t nsat;
    if (!sgd_slot_fast_ok(o)) return 0;
    if (w8) nsat = o->sr ? sgd_apply_v8_body(w8, 0, A, V, n, mu, mk, u->prng, 1, 1)
                         : sgd_apply_v8_body(w8, 0, A, V, n, mu, mk, u->prng, 1, 0);
    else nsat = o->sr ? sgd_apply_v8_body(0, w16, A, V, n, mu, mk, u->prng, 0, 1)
                      : sgd_apply_v8_body(0, w16, A, V, n, mu, mk, u->prng, 0, 0);
    u->stats->saturated += nsat;
    return 1;
}

/* The int16-slot rule on elements [i, n) (W8: int8 store, else int16; SR: stochastic update):
 * vv = rshift_round(V mu_m, mu_k) + a (|V mu_m| <= 2^30, so the rounded product r has |r| <=
 * 2^29), V = vv clamped to +-32767, d = shift(V, 8) (|d| <= 128). vv's int32 saturation (QADD;
 * portable: a clamped to [-2^30, 2^30 - 1] first, so that r + a fits) leaves V's clamp unchanged:
 * it acts only where |a| >= 2^30 > |r| + 32767. DSP: r by SMMULR (sgd_slot_mul, e = 0: xs, M) and
 * the clamp by SSAT #16 and the floor -32767. */
TT_SGD_SLOT_INLINE uint32_t sgd_v16_scalar(int8_t *w8, int16_t *w16, int32_t *A, int16_t *V, int32_t i, int32_t n,
                                      int32_t mu_m, int32_t mk, int32_t xs, int32_t M, uint32_t *px, int32_t W8,
                                      int32_t SR)
{
    const int32_t lim = W8 ? TT_S8_MAX : TT_S16_MAX;
    uint32_t x = *px, nsat = 0;
    for (; i < n; i++) {
#if TT_HAVE_DSP
        int32_t v = sgd_ssat16(tt_qadd(tt_smmulr(V[i] * (1 << xs), M), A[i])), d;
        if (v < -TT_S16_MAX) v = -TT_S16_MAX;
        (void)mu_m;
        (void)mk;
#else
        const int32_t p = V[i] * mu_m, a = A[i];
        int32_t v = (p >> mk) + ((p >> (mk - 1)) & 1) + (a < -(1 << 30) ? -(1 << 30) : a > (1 << 30) - 1 ? (1 << 30) - 1 : a), d;
        v = v > TT_S16_MAX ? TT_S16_MAX : v < -TT_S16_MAX ? -TT_S16_MAX : v;
        (void)xs;
        (void)M;
#endif
        A[i] = 0;
        V[i] = (int16_t)v;
        if (SR) x = tt_prng_next(&x);
        d = (v + (SR ? (int32_t)(x & 255u) : 128)) >> 8;
        if (W8) w8[i] = (int8_t)sgd_slot_store(w8[i], d, lim, &nsat);
        else w16[i] = (int16_t)sgd_slot_store(w16[i], d, lim, &nsat);
    }
    *px = x;
    return nsat;
}

#if TT_HAVE_DSP
/* The int16 slot on int16 weights four at a time, for mu_k <= 16 (M = mu_m 2^(16 - mu_k), xs = 16:
 * V 2^16 is a pair's high lane with the low one cleared (PKHTB of 0), or the low one shifted): vv by SMMULR and QADD; the Q-flag
 * guard raised by a QADD saturation, a vv outside [-16384, 16383] (SSAT #15) or an old weight lane
 * outside [-16384, 16383] (SSAT16 #15). Without a hit no velocity needs the clamp (no -32768
 * either), |d| <= 64 and every w - d lies in [-16448, 16447]: PKHBT of the vv and the wrapping
 * SSUB16 of the steps are the rule. A hit sends the four to sgd_v16_scalar from the PRNG state
 * before them (the same draws). Returns the number of elements done (a multiple of 4). */
TT_SGD_SLOT_INLINE int32_t sgd_v16_quads(int16_t *w, int32_t *A, int16_t *V, int32_t n, int32_t M, uint32_t *px,
                                         uint32_t *nsat, int32_t SR)
{
    uint32_t x = *px;
    int16_t *wp = w, *vp = V, *const vend = V + (n & ~3);
    int32_t *ap = A;
    tt_guard_clear();
    while (vp != vend) {
        const uint32_t P0 = tt_ld_s16x2(vp), P1 = tt_ld_s16x2(vp + 2);
        const uint32_t W0 = tt_ld_s16x2(wp), W1 = tt_ld_s16x2(wp + 2);
        int32_t a0, a1, a2, a3, v0, v1, v2, v3;
        uint32_t y = x, t0, t1, t2, t3, R0, R1;
        tt_ld_s32x2_next((const int32_t **)&ap, &a0, &a1);
        tt_ld_s32x2_next((const int32_t **)&ap, &a2, &a3);
        v0 = tt_qadd(tt_smmulr((int32_t)(P0 << 16), M), a0);
        v1 = tt_qadd(tt_smmulr((int32_t)tt_pack_hi(0, P0), M), a1);
        v2 = tt_qadd(tt_smmulr((int32_t)(P1 << 16), M), a2);
        v3 = tt_qadd(tt_smmulr((int32_t)tt_pack_hi(0, P1), M), a3);
        tt_guard_s32_15(v0);
        tt_guard_s32_15(v1);
        tt_guard_s32_15(v2);
        tt_guard_s32_15(v3);
        tt_guard_s16x2_15(W0);
        tt_guard_s16x2_15(W1);
        if (SR) {
            y = tt_prng_next(&y); t0 = (uint32_t)v0 + (y & 255u);
            y = tt_prng_next(&y); t1 = (uint32_t)v1 + (y & 255u);
            y = tt_prng_next(&y); t2 = (uint32_t)v2 + (y & 255u);
            y = tt_prng_next(&y); t3 = (uint32_t)v3 + (y & 255u);
        } else {
            t0 = (uint32_t)v0 + 128u; t1 = (uint32_t)v1 + 128u;
            t2 = (uint32_t)v2 + 128u; t3 = (uint32_t)v3 + 128u;
        }
        R0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)sgd_pack_asr8((int32_t)t0, (int32_t)t1));
        R1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)sgd_pack_asr8((int32_t)t2, (int32_t)t3));
        if (tt_guard_hit_after((int32_t)R0, (int32_t)R1, v0, v2)) {
            const int32_t i = (int32_t)(vp - V);
            *nsat += sgd_v16_scalar(0, w, A, V, i, i + 4, 0, 0, 16, M, &x, 0, SR);
            tt_guard_clear();
        } else {
            tt_st_s16x2(vp, tt_pack_lo((uint32_t)v0, (uint32_t)v1));
            tt_st_s16x2(vp + 2, tt_pack_lo((uint32_t)v2, (uint32_t)v3));
            tt_st_s32x2_prev(ap - 2, 0, 0);
            tt_st_s32x2_prev(ap, 0, 0);
            tt_st_s16x2(wp, R0);
            tt_st_s16x2(wp + 2, R1);
            x = y;
        }
        vp += 4; wp += 4;
    }
    *px = x;
    return n & ~3;
}
#endif

/* One specialisation of sgd_apply_v16_fast: sgd_v16_quads where it applies (DSP, int16 weights,
 * mu_k <= 16), sgd_v16_scalar for the rest. */
TT_SGD_SLOT_INLINE uint32_t sgd_apply_v16_body(int8_t *w8, int16_t *w16, int32_t *A, int16_t *V, int32_t n,
                                          int32_t mu_m, int32_t mk, uint32_t *px, int32_t W8, int32_t SR)
{
    uint32_t nsat = 0;
    int32_t xs, M, i = 0;
    sgd_slot_mul(0, mk, mu_m, &xs, &M);
#if TT_HAVE_DSP
    if (!W8 && mk <= 16) i = sgd_v16_quads(w16, A, V, n, mu_m * (1 << (16 - mk)), px, &nsat, SR);
#endif
    return nsat + sgd_v16_scalar(w8, w16, A, V, i, n, mu_m, mk, xs, M, px, W8, SR);
}

/* The int16-slot rule of sgd_apply_accumulated_narrow in 32 bits (sgd_slot_fast_ok): the same
 * steps and the update's draws. Returns 0 for any other configuration. */
static int32_t sgd_apply_v16_fast(const tt_sgd_step *u, int8_t *w8, int16_t *w16, int32_t *A, int16_t *V,
                                  int32_t n)
{
    const tt_sgd *o = u->cfg;
    const int32_t mu = o->mu_m, mk = o->mu_k;
    uint32_t nsat;
    if (!sgd_slot_fast_ok(o)) return 0;
    if (w8) nsat = o->sr ? sgd_apply_v16_body(w8, 0, A, V, n, mu, mk, u->prng, 1, 1)
                         : sgd_apply_v16_body(w8, 0, A, V, n, mu, mk, u->prng, 1, 0);
    else nsat = o->sr ? sgd_apply_v16_body(0, w16, A, V, n, mu, mk, u->prng, 0, 1)
                      : sgd_apply_v16_body(0, w16, A, V, n, mu, mk, u->prng, 0, 0);
    u->stats->saturated += nsat;
    return 1;
}

/* The end-of-batch rule on an int8 (w8) or int16 (w16) tensor with an int32 (V32), int16 (V16)
 * or int8 (V8) velocity, the others NULL: the element rule of sgd_apply_accumulated, each store
 * saturating to its own width (int8 +-127, int16 +-32767). An int8 slot sits TT_SGD_V8_SHIFT
 * bits above the others' units and is stored with one PRNG draw (before the update's); the
 * update uses the wide velocity vv (graph/optim.py _apply_v8_ref). */
static void sgd_apply_accumulated_narrow(const tt_sgd_step *u, int8_t *w8, int16_t *w16, int32_t *A,
                                         int32_t *V32, int16_t *V16, int8_t *V8, int32_t n)
{
    const tt_sgd *o = u->cfg;
    const int64_t lim = w8 ? TT_S8_MAX : TT_S16_MAX;
    int32_t i;
    if (V8 && o->mu_m && sgd_apply_v8_fast(u, w8, w16, A, V8, n)) return;
    if (V16 && o->mu_m && sgd_apply_v16_fast(u, w8, w16, A, V16, n)) return;
    for (i = 0; i < n; i++) {
        int64_t a = A[i], wi, v, nv;
        if (o->batch_size > 1) a = tt_rshift_round_s64(a * o->ib_m, o->ib_k);
        A[i] = 0;
        if (o->mu_m && V8) {
            const int64_t vv = tt_sat_s32(tt_rshift_round_s64((int64_t)V8[i] * ((int64_t)1 << TT_SGD_V8_SHIFT) * o->mu_m, o->mu_k) + a);
            const uint32_t r = tt_prng_next(u->prng);
            V8[i] = (int8_t)tt_clamp64(tt_rshift_stoch_s64(vv, TT_SGD_V8_SHIFT, r), -TT_S8_MAX, TT_S8_MAX);
            a = vv;
        } else if (o->mu_m) {
            const int64_t vv = tt_rshift_round_s64((int64_t)(V16 ? V16[i] : V32[i]) * o->mu_m, o->mu_k) + a;
            if (V16) a = V16[i] = tt_sat_s16(vv);  /* symmetric, as sat_range(int16) */
            else a = V32[i] = tt_sat_s32(vv);
        }
        wi = w8 ? w8[i] : w16[i];
        if (o->wd_m) {
            const int32_t s = o->wd_k - TT_SGD_GUARD_BITS;
            const int64_t wd = wi * o->wd_m;
            a += s >= 0 ? tt_rshift_round_s64(wd, s) : wd * ((int64_t)1 << -s);
        }
        v = wi - tt_sgd_shift(a, TT_SGD_GUARD_BITS, o->sr, u->prng);
        nv = tt_clamp64(v, -lim, lim);
        if (nv != v) u->stats->saturated++;
        if (w8) w8[i] = (int8_t)nv; else w16[i] = (int16_t)nv;
    }
}

void tt_sgd_apply_accumulated_s8(const tt_sgd_step *u, int8_t *w, int32_t *A, int32_t *V,
                                 int32_t n)
{
    sgd_apply_accumulated_narrow(u, w, 0, A, V, 0, 0, n);
}

void tt_sgd_apply_accumulated_s8_v16(const tt_sgd_step *u, int8_t *w, int32_t *A, int16_t *V,
                                     int32_t n)
{
    sgd_apply_accumulated_narrow(u, w, 0, A, 0, V, 0, n);
}

void tt_sgd_apply_accumulated_s16_v16(const tt_sgd_step *u, int16_t *w, int32_t *A, int16_t *V,
                                      int32_t n)
{
    sgd_apply_accumulated_narrow(u, 0, w, A, 0, V, 0, n);
}

void tt_sgd_apply_accumulated_s8_v8(const tt_sgd_step *u, int8_t *w, int32_t *A, int8_t *V,
                                    int32_t n)
{
    sgd_apply_accumulated_narrow(u, w, 0, A, 0, 0, V, n);
}

void tt_sgd_apply_accumulated_s16_v8(const tt_sgd_step *u, int16_t *w, int32_t *A, int8_t *V,
                                     int32_t n)
{
    sgd_apply_accumulated_narrow(u, 0, w, A, 0, 0, V, n);
}

/* The stochastic step tt_sgd_shift(p, s) = floor((q + (r mod 2^ss)) / 2^ss), q = p >> xs
 * (xs = TT_SGD_XS(s), 0 for s <= 31), ss = min(s, 31), of |p| < 2^29 in 32 bits, by the class c
 * of s (a constant after inlining):
 * c = 0 (1 <= s <= 30): p + (r mod 2^s) fits int32 (|p| < 2^29, r mod 2^s < 2^30);
 * c = 1 (s = 31): t = p + (r mod 2^31) lies in (-2^29, 2^31 + 2^29), so its floor by 2^31 is bit 31
 * of t mod 2^32 with p's sign (1 for p >= 0, -1 for p < 0, else 0);
 * c = 2 (s >= 32): class 1 of q (|q| <= |p|). */
#define TT_SGD_SCLASS(s) ((s) <= 30 ? 0 : (s) == 31 ? 1 : 2)
static inline int32_t tt_sgd_stoch29(int32_t p, uint32_t r, int32_t s, uint32_t M, int32_t c)
{
    uint32_t t;
    int32_t sg;
    if (c == 0) return (p + (int32_t)(r & M)) >> s;
    if (c == 2) p >>= TT_SGD_XS(s);
    t = (uint32_t)p + (r & 0x7fffffffu);
    sg = p >> 31;
    return (int32_t)((t >> 31) ^ (uint32_t)sg) - sg;
}

/* An old -128 of w[0..n) to -127, counted (the zero step's only change; the state's doors refuse
 * -128, so this finds none in practice): where word access is cheap, the row is first scanned
 * eight bytes a turn for a -128 (a byte of v ^ 0x80808080 is zero exactly where v holds -128;
 * the flags ORed, ~6 instructions a word) and only a row with one goes byte by byte. */
static uint32_t tt_sgd_clamp_min_s8(int8_t *w, int32_t n)
{
    uint32_t sat = 0;
    int32_t i;
#if TT_WORD_ACCESS
    uint32_t any = 0;
    for (i = 0; i + 8 <= n; i += 8) {
        uint32_t v0, v1;
        memcpy(&v0, w + i, 4);
        memcpy(&v1, w + i + 4, 4);
        v0 ^= 0x80808080u;
        v1 ^= 0x80808080u;
        any |= ((v0 - 0x01010101u) & ~v0) | ((v1 - 0x01010101u) & ~v1);
    }
    any &= 0x80808080u;
    for (; i < n; i++) any |= w[i] == -128;
    if (!any) return 0;
#endif
    for (i = 0; i < n; i++)
        if (w[i] == -128) { w[i] = -TT_S8_MAX; sat++; }
    return sat;
}

/* One class C (TT_SGD_SCLASS) of tt_sgd_dense_rows_s8_sr (inlined three times: C a constant). */
#if defined(__GNUC__)
__attribute__((always_inline))
#endif
static inline uint32_t sgd_rows_s8_sr_body(int32_t m_t, const int8_t *e, const int8_t *x, int32_t K,
                                           int32_t N, int8_t *w, int32_t s, uint32_t *px, int32_t C,
                                           const uint32_t (*jump)[16])
{
    const uint32_t M = C == 0 ? ((uint32_t)1 << s) - 1u : 0;
    uint32_t r = *px, sat = 0;
    int32_t n;
    for (n = 0; n < N; n++) {
        const int32_t a = m_t * (int32_t)e[n];
        int8_t *wp = w + n * K, *const end = wp + K;
        const int8_t *xp = x;
        if (a == 0 && jump) { /* the row's K draws at once (tt_prng_jump), then the old -128s */
            r = tt_prng_jump(jump, r);
            sat += tt_sgd_clamp_min_s8(wp, K);
            continue;
        }
        if (a == 0) { /* every step is floor((0 + (r & M)) / 2^s) = 0: only the draws, and an old -128 */
            for (; wp != end; wp++) {
                r = tt_prng_next(&r);
                if (*wp == -128) { *wp = -TT_S8_MAX; sat++; }
            }
            continue;
        }
        for (; wp != end; wp++, xp++) { /* pointers, not indices: M0 keeps them in its 8 low registers */
            int32_t v;
            r = tt_prng_next(&r);
            v = (int32_t)*wp - tt_sgd_stoch29(a * (int32_t)*xp, r, s, M, C);
            if ((uint32_t)(v + TT_S8_MAX) > 2u * TT_S8_MAX) { v = v > 0 ? TT_S8_MAX : -TT_S8_MAX; sat++; }
            *wp = (int8_t)v;
        }
    }
    *px = r;
    return sat;
}

/* Stochastic rounding without decay, 0 <= m_t < 32768 and s >= 1 (the int8-weight case the
 * policy makes the default; a trained model's small errors give s > 31): p = m_t e x has
 * |p| < 2^15 * 127 * 127 < 2^29, so the step is tt_sgd_stoch29's, exact in 32 bits; one draw per
 * weight in row-major order, rows with e[n] = 0 included (their steps are 0, but the draws are
 * made). */
static void tt_sgd_dense_rows_s8_sr(const tt_sgd_step *u, const int8_t *e, const int8_t *x,
                                    int32_t K, int32_t N, int8_t *w, int32_t s, const uint32_t (*jump)[16])
{
    const int32_t c = TT_SGD_SCLASS(s);
    u->stats->saturated += c == 0 ? sgd_rows_s8_sr_body(u->m_t, e, x, K, N, w, s, u->prng, 0, jump)
                         : c == 1 ? sgd_rows_s8_sr_body(u->m_t, e, x, K, N, w, s, u->prng, 1, jump)
                                  : sgd_rows_s8_sr_body(u->m_t, e, x, K, N, w, s, u->prng, 2, jump);
}

void tt_sgd_dense_direct_s8(const tt_sgd_step *u, const tt_sgd_dense_s8_params *p,
                            const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    const tt_sgd *o = u->cfg;
    const int32_t s = p->ew + o->k - (ee + ex);
    if (p->w && o->sr && !o->wd_m && u->m_t >= 0 && u->m_t < 32768 && s >= 1) {
        tt_sgd_dense_rows_s8_sr(u, e, x, p->K, p->N, p->w, s, p->jump);
    } else if (p->w) {
        const int32_t K = p->K, can_skip = TT_SGD_CAN_SKIP(o);
        int32_t n, k;
        for (n = 0; n < p->N; n++) {
            const int32_t en = e[n];
            int8_t *row = p->w + n * K;
            if (en == 0 && can_skip) { /* w - 0: only an old -128 changes (clamped, counted) */
                for (k = 0; k < K; k++)
                    if (row[k] == -128) { row[k] = -TT_S8_MAX; u->stats->saturated++; }
                continue;
            }
            for (k = 0; k < K; k++) tt_sgd_apply1_s8(row + k, (int64_t)(en * (int32_t)x[k]), s, u);
        }
    }
    if (p->b) tt_sgd_dense_bias(u, p->b, p->eb, e, ee, p->N);
}

/* rshift_round(m, s) = (m >> s) + bit s-1 of m, in 32 bits (no carry can overflow: the sum is
 * at most 2^(31-s)), then the symmetric int8 clamp. */
static inline int8_t tt_narrow_s8(int32_t m, int32_t s)
{
    const int32_t v = (m >> s) + ((m >> (s - 1)) & 1);
    return (int8_t)(v > TT_S8_MAX ? TT_S8_MAX : v < -TT_S8_MAX ? -TT_S8_MAX : v);
}

void tt_sgd_refresh_copy_s32_s8(const int32_t *master, int8_t *w8, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; i++) w8[i] = tt_narrow_s8(master[i], 24);
}

void tt_sgd_refresh_copy_s16_s8(const int16_t *master, int8_t *w8, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; i++) w8[i] = tt_narrow_s8(master[i], 8);
}

void tt_sgd_dense_bias_s32(const tt_sgd_step *u, int32_t *b, int32_t eb, const int8_t *e, int32_t ee, int32_t N)
{
    tt_sgd_dense_bias(u, b, eb, e, ee, N);
}

void tt_sgd_dense_bias_s16(const tt_sgd_step *u, int16_t *b, int32_t eb, const int8_t *e, int32_t ee, int32_t N)
{
    static const int8_t one = 1;
    const tt_sgd_dense_s16_params q = {.K = 1, .N = N, .w = b, .ew = eb, .b = 0, .eb = 0};
    const int32_t m_t = u->m_t, s = eb + u->cfg->k - ee;
    if (TT_SGD_FAST(u->cfg, m_t) && s >= 1 && s <= 31) {
        /* |m_t * e| < 2^22: the rounded shift is (p + 2^(s-1)) >> s, and b - d fits int32 */
        const int32_t half = (int32_t)1 << (s - 1);
        int32_t n;
        for (n = 0; n < N; n++) {
            const int32_t p = m_t * (int32_t)e[n];
            int32_t v;
            if (p == 0) continue;
            v = (int32_t)b[n] - ((p + half) >> s);
            if (v > TT_S16_MAX || v < -TT_S16_MAX) {
                u->stats->saturated++;
                v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
            }
            b[n] = (int16_t)v;
        }
        return;
    }
    tt_sgd_dense_direct_s16(u, &q, e, ee, &one, 0);
}

void tt_sgd_dense_apply_kept_s32(const tt_sgd_step *u, const tt_sgd_dense_accum_params *p, int32_t *w,
                                 int16_t *copy, int32_t *V)
{
    tt_sgd_dense_keep *k = p->keep;
    int32_t done = 0;
    if (k && k->state == 2) {
#if TT_SGD_HAVE_KEPT_ASM
        done = sgd_apply_kept_fast(u, p, w, copy, V);
#endif
        if (!done) sgd_dense_acc_w(u, p, k->e, k->ee, k->x, k->ex); /* no draws: the same bits now */
    }
    if (!done) sgd_apply_accumulated(u, 0, w, copy, p->wa, V, p->K * p->N);
    if (k) k->state = 1;
}

void tt_sgd_dense_rows_keep(tt_sgd_dense_rows *p, const int8_t *e, int32_t ee, const int8_t *x, int32_t ex)
{
    memcpy(p->e, e, (size_t)p->N);
    p->x = x;
    p->ee = ee;
    p->ex = ex;
}

/* Row n's accumulate from zero is row[k] = sat32(shift(m_t e[n] x[k], s)), s = ew + k - (ee + ex) - G
 * (no draws): for 0 <= m_t < 2^15 and s in [1, 31] SMMULR(X[k], An) with the inputs widened once
 * (X, tt_sgd_widen_x) and An = tt_sgd_row_mult, exactly as sgd_dense_acc_w's rows (QADD of 0 and
 * a value is the value); any other s by sgd_dense_acc_w on the one row. */
void tt_sgd_dense_rows_apply(const tt_sgd_step *u, const tt_sgd_dense_rows *p, int32_t *buf)
{
    const int32_t K = p->K, N = p->N, s = p->ew + u->cfg->k - (p->ee + p->ex) - TT_SGD_GUARD_BITS;
    const int32_t fast = u->m_t >= 0 && u->m_t < 32768 && s >= 1 && s <= 31;
    int32_t *row = buf, *X = buf + K, n, j, sh = 0;
    tt_sgd_dense_accum_params one;
    one.K = K;
    one.N = 1;
    one.wa = row;
    one.ew = p->ew;
    one.ba = 0;
    one.eb = 0;
    one.keep = 0;
    memset(row, 0, (size_t)K * sizeof(int32_t));
    if (fast) sh = tt_sgd_widen_x(p->x, K, s, X);
    for (n = 0; n < N; n++) {
        const int32_t o = n * K;
        if (fast) {
            const int32_t An = tt_sgd_row_mult(u->m_t, p->e[n], sh);
            if (An) for (j = 0; j < K; j++) row[j] = tt_smmulr(X[j], An);
        } else {
            sgd_dense_acc_w(u, &one, p->e + n, p->ee, p->x, p->ex);
        }
        /* the apply zeroes row again */
        if (p->v8) sgd_apply_accumulated_narrow(u, p->w8 ? p->w8 + o : 0, p->w16 ? p->w16 + o : 0, row, 0, 0, p->v8 + o, K);
        else sgd_apply_accumulated_narrow(u, p->w8 ? p->w8 + o : 0, p->w16 ? p->w16 + o : 0, row, 0, p->v16 + o, 0, K);
    }
}
