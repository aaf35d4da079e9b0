/** Integer SGD update rules: portable scalar path. */
#include "tt_sgd.h"

#define TT_LIM62 ((int64_t)1 << 62)

/* shift(v, s): round (or stochastically round, one PRNG draw) right shift for s > 0,
 * saturating left shift by min(-s, 40) for s < 0. */
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
        const int32_t ss = s < 31 ? s : 31;
        int64_t out = tt_rshift_stoch_s64(v, ss, r);
        if (s > 31) out >>= (s - ss);
        return out;
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

void tt_sgd_update_direct(int16_t *w16, int32_t *w32, int32_t n, int32_t ew, const int32_t *g,
                          int32_t eg, const tt_sgd *o, int32_t m_t, uint32_t *prng, tt_stats *st)
{
    const int32_t s = ew + o->k - eg;
    const int64_t lo = w16 ? -TT_S16_MAX : INT32_MIN, hi = w16 ? TT_S16_MAX : INT32_MAX;
    int32_t i;
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

void tt_sgd_accumulate(int32_t *A, int32_t n, int32_t ew, const int32_t *g, int32_t eg,
                       const tt_sgd *o, int32_t m_t, uint32_t *prng)
{
    const int32_t s = ew + o->k - eg - TT_SGD_GUARD_BITS;
    int32_t i;
    for (i = 0; i < n; i++) {
        const int64_t d = tt_sgd_shift((int64_t)m_t * g[i], s, o->sr, prng);
        A[i] = tt_sat_s32((int64_t)A[i] + d);
    }
}

void tt_sgd_apply_accumulated(int16_t *w16, int32_t *w32, int32_t *A, int32_t *V, int32_t n,
                              const tt_sgd *o, uint32_t *prng, tt_stats *st)
{
    const int64_t lo = w16 ? -TT_S16_MAX : INT32_MIN, hi = w16 ? TT_S16_MAX : INT32_MAX;
    int32_t i;
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
}

void tt_sgd_refresh_copy(const int32_t *master, int16_t *w16, int32_t n)
{
    int32_t i;
    for (i = 0; i < n; i++) w16[i] = tt_sat_s16(tt_rshift_round_s64(master[i], 16));
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

void tt_sgd_dense_direct(const int8_t *e, int32_t ee, const int8_t *x, int32_t ex, int32_t K,
                         int32_t N, int16_t *w16, int32_t *w32, int32_t ew, int32_t *b,
                         int32_t eb, int32_t upd_w, int32_t upd_b, const tt_sgd *o, int32_t m_t,
                         uint32_t *prng, tt_stats *st)
{
    const int32_t can_skip = !o->sr && !o->wd_m;
    int32_t n, k;
    if (upd_w && w16 && can_skip && m_t >= 0 && m_t < 32768) {
        const int32_t s = ew + o->k - (ee + ex);
        if (s >= 1 && s <= 31) {
            /* 32-bit fast path, same bits: |m_t * e * x| < 2^15 * 127 * 127 < 2^29, and the
             * round-to-nearest shift of an int32 equals tt_rshift_round_s64 on it. */
            for (n = 0; n < N; n++) {
                const int32_t a = m_t * (int32_t)e[n];
                int16_t *row = w16 + n * K;
                if (a == 0) continue;
                for (k = 0; k < K; k++) {
                    const int32_t p = a * (int32_t)x[k];
                    int32_t v = (int32_t)row[k] - ((p >> s) + ((p >> (s - 1)) & 1));
                    if (v > TT_S16_MAX) { v = TT_S16_MAX; st->saturated++; }
                    else if (v < -TT_S16_MAX) { v = -TT_S16_MAX; st->saturated++; }
                    row[k] = (int16_t)v;
                }
            }
            upd_w = 0;
        }
    }
    if (upd_w) {
        const int32_t s = ew + o->k - (ee + ex);
        for (n = 0; n < N; n++) {
            const int32_t en = e[n];
            if (en == 0 && can_skip) continue;
            for (k = 0; k < K; k++)
                tt_sgd_apply1(w16, w32, n * K + k, (int64_t)(en * (int32_t)x[k]), s, o, m_t, prng, st);
        }
    }
    if (upd_b) {
        const int32_t s = eb + o->k - ee;
        for (n = 0; n < N; n++) {
            if (e[n] == 0 && can_skip) continue;
            tt_sgd_apply1(0, b, n, e[n], s, o, m_t, prng, st);
        }
    }
}
