/** Loss heads: integer softmax cross-entropy and MSE. */
#include "tt_loss.h"

#define TT_LOG2E_Q15 47274
#define TT_T_MIN (-16 * 256 - 1)

int32_t tt_argmax_s8(const int8_t *z, int32_t N)
{
    int32_t i, best = 0;
    for (i = 1; i < N; i++)
        if (z[i] > z[best]) best = i;
    return best;
}

int32_t tt_softmax_ce_s8(const tt_ctx *ctx, const int8_t *z, int32_t ez, int32_t label,
                         int32_t N, tt_loss_out *out)
{
    int64_t *g = ctx->scratch;
    const int32_t pred = tt_argmax_s8(z, N);
    const int32_t zmax = z[pred];
    int32_t i, sh = 7 - ez;
    int64_t S = 0, pc;
    if (sh < -24) sh = -24;
    if (sh >= 1 && sh <= 31 && N <= 65536 && label >= 0 && label < N) {
        /* the usual case in 32 bits, same bits as below: the int32 rounding shift is exact
         * (|v| < 2^24); t >= T_MIN is no test here: u = -t, n = u >> 8 and any t <= T_MIN has
         * n >= 16, where exp2 is 0; below that the table entry T <= 2^15 rounded right by n is
         * ((2 T >> n) + 1) >> 1. Each g[i] <= 2^15, so S <= N 2^15 < 2^32 and the quotients
         * (int32 sums in the scratch) fit int32; the label's is taken apart so that the maximum
         * for the requantization is taken while dividing without a test of i */
        int32_t *g32 = (int32_t *)(void *)g;
        const uint16_t *T = tt_exp2_neg_q15_table;
        uint32_t S32 = 0, m = 0, vl;
#if defined(__ARM_ARCH_6M__)
        /* Armv6-M (Cortex-M0/M0+: eight low registers, no MLA): the indexed loop, which keeps
         * its values in registers there */
        for (i = 0; i < N; i++) {
            const int32_t v = (z[i] - zmax) * TT_LOG2E_Q15;
            const uint32_t u = (uint32_t)-(((v >> (sh - 1)) + 1) >> 1), n = u >> 8;
            const uint32_t q = n > 15 ? 0u : ((((uint32_t)T[u & 0xFFu] << 1) >> n) + 1u) >> 1;
            g32[i] = (int32_t)q;
            S32 += q;
        }
#else
        {
            /* the same values: v = (z - zmax) LOG2E by one MLA, and u = -(((v >> s1) + 1) >> 1)
             * = (-(v >> s1)) >> 1 (for a = v >> s1 <= 0: -floor((a + 1) / 2) = floor(-a / 2));
             * pointer steps, no index arithmetic per turn */
            const int8_t *zp = z;
            const int32_t s1 = sh - 1, c = -zmax * TT_LOG2E_Q15;
            int32_t *gp = g32, *const gend = g32 + N;
            for (; gp != gend; gp++) {
                const int32_t v = *zp++ * TT_LOG2E_Q15 + c;
                const uint32_t u = (uint32_t)-(v >> s1) >> 1, n = u >> 8;
                const uint32_t q = n > 15 ? 0u : ((((uint32_t)T[u & 0xFFu] << 1) >> n) + 1u) >> 1;
                *gp = (int32_t)q;
                S32 += q;
            }
        }
#endif
        vl = (uint32_t)g32[label];
        g32[label] = 0;
        /* the quotients straight into the int64 error g (what the global loss scale quantizes
         * next, tt_loss_scale_s8), in place from the top: g[i] covers g32[2i], g32[2i + 1],
         * already read (indices >= i) */
        for (i = N - 1; i >= 0; i--) {
            const uint32_t q = ((uint32_t)g32[i] << 15) / S32;
            g[i] = (int64_t)q;
            if (q > m) m = q;
        }
        pc = (vl << 15) / S32;
        g[label] = pc - 32768;
        if ((uint32_t)(32768 - pc) > m) m = (uint32_t)(32768 - pc);
        out->ee = -15 + tt_requant_s8_from_s64_max(g, N, m, out->e, ctx->stats);
        out->loss_q16 = (15 << 16) - tt_log2_q16((uint32_t)(pc > 1 ? pc : 1));
        return pred;
    }
    for (i = 0; i < N; i++) {
        /* |v| <= 255 * 47274 < 2^24: for sh in [0, 31] the int32 rounding shift is exact */
        const int32_t v = (z[i] - zmax) * TT_LOG2E_Q15; /* <= 0 */
        int64_t t = sh < 0 ? (int64_t)v * ((int64_t)1 << -sh)
                  : sh <= 31 ? tt_rshift_round_s32(v, sh) : 0; /* |v| < 2^24: any shift >= 25 rounds to 0 (and C's >> of 64 or more is undefined) */
        if (t < TT_T_MIN) t = TT_T_MIN;
        g[i] = tt_exp2_neg_q15((int32_t)t);
        S += g[i];
    }
    if (S < ((int64_t)1 << 32)) {
        /* g[i] <= 2^15, so g[i] << 15 <= 2^30 and S < 2^32: the same quotient in uint32 */
        for (i = 0; i < N; i++) g[i] = (uint32_t)(g[i] << 15) / (uint32_t)S;
    } else {
        for (i = 0; i < N; i++) g[i] = (g[i] << 15) / S; /* operands >= 0: truncation == floor */
    }
    pc = g[label];
    g[label] -= 32768;
    out->ee = -15 + tt_requant_s8_from_s64(g, N, out->e, ctx->stats);
    out->loss_q16 = (15 << 16) - tt_log2_q16((uint32_t)(pc > 1 ? pc : 1));
    return pred;
}

void tt_mse_s8(const int8_t *y, int32_t ey, const int8_t *t, int32_t et, int32_t N, int64_t *g,
               int8_t *e, int32_t *ee, int64_t *loss, tt_stats *st)
{
    const int32_t emin = ey < et ? ey : et;
    int64_t L = 0;
    int32_t i;
    for (i = 0; i < N; i++) {
        const int64_t d = (int64_t)y[i] * ((int64_t)1 << (ey - emin))
                        - (int64_t)t[i] * ((int64_t)1 << (et - emin));
        g[i] = d;
        L += d * d;
    }
    *ee = emin + tt_requant_s8_from_s64(g, N, e, st);
    *loss = L;
}

int32_t tt_loss_scale_s8(const tt_loss_scaler *cfg, int32_t *state, const int64_t *g, int32_t eg,
                         int32_t N, int8_t *e, int32_t *ee, tt_stats *st)
{
    const int32_t E = state[0];
    int32_t s = -E - eg, i, nsat = 0;
    if (s > 62) s = 62;
    for (i = 0; i < N; i++) {
        const int64_t v = g[i];
        /* a left shift only of |v| <= 127 (anything larger saturates): -s <= 48 stays in int64 */
        const int64_t r = s >= 0 ? tt_rshift_round_s64(v, s)
                        : v > 127 ? 128 : v < -127 ? -128 : (int64_t)((uint64_t)v << -s);
        e[i] = tt_sat_s8(r);
        nsat += e[i] != r;
    }
    st->saturated += (uint32_t)nsat;
    *ee = -E;
    if (cfg->mode == 2) {
        state[2] += nsat != 0;
        return 0;
    }
    if (nsat) {
        state[0] = E - cfg->backoff_factor > cfg->min_scale ? E - cfg->backoff_factor : cfg->min_scale;
        state[1] = 0;
        state[2] += 1;
        return 1;
    }
    if (++state[1] >= cfg->growth_interval) {
        state[0] = E + cfg->growth_factor < cfg->max_scale ? E + cfg->growth_factor : cfg->max_scale;
        state[1] = 0;
    }
    return 0;
}
