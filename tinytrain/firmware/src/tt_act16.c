/** int16 activations and errors (tt_act16.h): portable scalar kernels; the dense forward has a
 *  Cortex-M DSP path (SMLALD, TT_HAVE_DSP) with the same bits. */
#include "tt_act16.h"
#include "tt_dsp.h"

#define TT_LOG2E_Q15 47274
#define TT_T_MIN (-16 * 256 - 1)

void tt_widen_s8_s16(const int8_t *v, int32_t n, int16_t *out)
{
    for (int32_t i = 0; i < n; i++) out[i] = v[i];
}

int32_t tt_requant_s16_from_s64(const int64_t *acc, int32_t n, int16_t *y, tt_stats *st)
{
    uint64_t m = 0;
    int32_t i, s;
    for (i = 0; i < n; i++) {
        const uint64_t a = tt_abs_u64(acc[i]);
        if (a > m) m = a;
    }
    s = tt_requant_shift(m, 16);
    for (i = 0; i < n; i++) {
        const int64_t r = tt_rshift_round_s64(acc[i], s);
        y[i] = tt_sat_s16(r);
        st->saturated += y[i] != r;
    }
    return s;
}

int32_t tt_dense_fwd_s16(const tt_ctx *ctx, const tt_dense_params *p, const int16_t *x,
                         int32_t ex, int16_t *y)
{
    int64_t *acc = ctx->scratch;
    const int32_t K = p->K, ea = ex + p->ew;
    for (int32_t n = 0; n < p->N; n++) {
        const int16_t *w = p->w + (int64_t)n * K;
        int64_t a = tt_align(p->b[n], p->eb, ea);
        int32_t k = 0;
#if TT_HAVE_DSP
        /* SMLALD: two int16 products into the 64-bit sum per instruction, the same sum */
        for (; k + 4 <= K; k += 4) {
            a = __smlald((int32_t)tt_ld_s16x2(x + k), (int32_t)tt_ld_s16x2(w + k), a);
            a = __smlald((int32_t)tt_ld_s16x2(x + k + 2), (int32_t)tt_ld_s16x2(w + k + 2), a);
        }
        for (; k + 2 <= K; k += 2) a = __smlald((int32_t)tt_ld_s16x2(x + k), (int32_t)tt_ld_s16x2(w + k), a);
#endif
        for (; k < K; k++) a += (int32_t)x[k] * w[k];
        acc[n] = a;
    }
    return ea + tt_requant_s16_from_s64(acc, p->N, y, ctx->stats);
}

int32_t tt_dense_bwd_s16(const tt_ctx *ctx, const tt_dense_params *p, const int16_t *e,
                         int32_t ee, int16_t *dx)
{
    int64_t *acc = ctx->scratch;
    const int32_t K = p->K;
    int32_t k;
    for (k = 0; k < K; k++) acc[k] = 0;
    for (int32_t n = 0; n < p->N; n++) {
        const int32_t en = e[n];
        const int16_t *w = p->w + (int64_t)n * K;
        if (en == 0) continue;
        for (k = 0; k < K; k++) acc[k] += en * w[k];
    }
    return ee + p->ew + tt_requant_s16_from_s64(acc, K, dx, ctx->stats);
}

void tt_dense_grad_row_s32_s16(const int16_t *x, int32_t K, int32_t en, int32_t *g)
{
    for (int32_t k = 0; k < K; k++) g[k] = en * x[k];
}

void tt_dense_grad_s32_s16(const tt_dense_params *p, const int16_t *e, const int16_t *x,
                           int32_t *gw, int32_t *gb)
{
    for (int32_t n = 0; n < p->N; n++) {
        tt_dense_grad_row_s32_s16(x, p->K, e[n], gw + (int64_t)n * p->K);
        gb[n] = e[n];
    }
}

/* Cores without a 32 x 32 -> 64 multiply (ARMv6-M: Cortex-M0/M0+) form m_t e x from two int32
 * products; the others from one SMULL. The same bits. */
#ifndef TT_A16_SPLIT_MUL
#if defined(__ARM_ARCH_6M__)
#define TT_A16_SPLIT_MUL 1
#else
#define TT_A16_SPLIT_MUL 0
#endif
#endif

/* One row: w[k] = sat(w[k] - rshift_round(A x[k], t + 1)), rshift_round(v, s) = ((v >> (s - 1))
 * + 1) >> 1 with floor shifts, h = v >> t in int32 (|v| < 2^45, t >= 14). mode 0: A = Ah 2^16 + Al
 * (Al in [0, 2^16)), |Ah x| < 2^29, |Al x| < 2^31 and, for t >= 16, v >> t = (Ah x + ((Al x) >> 16))
 * >> (t - 16), where |.| < 2^30 makes a shift of 31 give what any larger one does; mode 1 (t >= 32):
 * the high word of the product; mode 2 (t in [14, 31]): its two words. x[k] == 0 leaves w[k] as it
 * is (ReLU outputs and the digits' background: about half). */
static inline void tt_a16_row(int16_t *w, const int16_t *x, int32_t K, int32_t A, int32_t t, int mode,
                              uint32_t *nsat)
{
    const int32_t Ah = A >> 16, Al = A & 0xFFFF, r = t - 16 < 31 ? t - 16 : 31;
    for (int32_t k = 0; k < K; k++) {
        const int32_t xk = x[k];
        int32_t h, v;
        if (!xk) continue;
        if (mode == 0) {
            h = (Ah * xk + ((Al * xk) >> 16)) >> r;
        } else {
            const int64_t p = (int64_t)A * xk;
            h = mode == 1 ? (int32_t)(p >> 32) >> (t - 32) : (int32_t)(((uint32_t)p >> t) | ((uint32_t)(p >> 32) << (32 - t)));
        }
        v = w[k] - ((h + 1) >> 1);
        if ((uint32_t)(v + TT_S16_MAX) > 2u * TT_S16_MAX) { /* beyond +-32767: rare */
            v = v < 0 ? -TT_S16_MAX : TT_S16_MAX;
            (*nsat)++;
        }
        w[k] = (int16_t)v;
    }
}

int32_t tt_dense_update_direct_s16_a16(const tt_sgd_step *u, const tt_sgd_dense_s16_params *p,
                                       const int16_t *e, int32_t ee, const int16_t *x, int32_t ex)
{
    const tt_sgd *o = u->cfg;
    const int32_t K = p->K, s = p->ew + o->k - ee - ex, t = s - 1;
    uint32_t nsat = 0;
    if (o->sr || o->wd_m || s < 17 || s > 62) return 0;
    for (int32_t n = 0; n < p->N; n++) {
        const int32_t A = u->m_t * e[n]; /* |A| < 2^15 * 2^15 */
        int16_t *w = p->w + (int64_t)n * K;
        if (A == 0) continue;
#if TT_A16_SPLIT_MUL
        tt_a16_row(w, x, K, A, t, 0, &nsat);
#else
        if (t >= 32) tt_a16_row(w, x, K, A, t, 1, &nsat);
        else tt_a16_row(w, x, K, A, t, 2, &nsat);
#endif
    }
    u->stats->saturated += nsat;
    return 1;
}

int32_t tt_relu_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int16_t *y, tt_stats *st)
{
    (void)st;
    for (int32_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
    return ex;
}

int32_t tt_relu_bwd_s16(const int16_t *e, int32_t ee, const int16_t *y, int32_t n, int16_t *dx,
                        tt_stats *st)
{
    (void)st;
    for (int32_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? e[i] : 0;
    return ee;
}

/* (v s + 128) >> 8 on an int32 (|v s| < 2^23), as an arithmetic shift: floor division by 256 */
static inline int16_t tt_leaky_scale_s16(int32_t v, int32_t s)
{
    const int32_t t = v * s + 128;
    return (int16_t)(t >= 0 ? t / 256 : -((-t + 255) / 256));
}

int32_t tt_leaky_relu_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int32_t slope_q8,
                              int16_t *y, tt_stats *st)
{
    (void)st;
    for (int32_t i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : tt_leaky_scale_s16(x[i], slope_q8);
    return ex;
}

int32_t tt_leaky_relu_bwd_s16(const int16_t *e, int32_t ee, const int16_t *y, int32_t n,
                              int32_t slope_q8, int16_t *dx, tt_stats *st)
{
    (void)st;
    for (int32_t i = 0; i < n; i++) dx[i] = y[i] > 0 ? e[i] : tt_leaky_scale_s16(e[i], slope_q8);
    return ee;
}

int32_t tt_flatten_fwd_s16(const int16_t *x, int32_t ex, int32_t n, int16_t *y, tt_stats *st)
{
    (void)st;
    if (y != x)
        for (int32_t i = 0; i < n; i++) y[i] = x[i];
    return ex;
}

int32_t tt_flatten_bwd_s16(const int16_t *e, int32_t ee, int32_t n, int16_t *dx, tt_stats *st)
{
    (void)st;
    if (dx != e)
        for (int32_t i = 0; i < n; i++) dx[i] = e[i];
    return ee;
}

int32_t tt_argmax_s16(const int16_t *z, int32_t N)
{
    int32_t i, best = 0;
    for (i = 1; i < N; i++)
        if (z[i] > z[best]) best = i;
    return best;
}

int32_t tt_softmax_ce_s16(const tt_ctx *ctx, const int16_t *z, int32_t ez, int32_t label,
                          int32_t N, tt_loss_s16_out *out)
{
    int64_t *g = ctx->scratch;
    const int32_t pred = tt_argmax_s16(z, N);
    const int32_t zmax = z[pred];
    int32_t i, sh = 7 - ez;
    int64_t S = 0, pc;
    if (sh < -24) sh = -24;
    for (i = 0; i < N; i++) {
        /* |v| <= 65534 * 47274 < 2^32; a left shift of at most 24 stays below 2^56; a right
         * shift of 62 or more rounds every such v to 0, as 62 does */
        const int64_t v = (int64_t)(z[i] - zmax) * TT_LOG2E_Q15; /* <= 0 */
        int64_t t = sh < 0 ? v * ((int64_t)1 << -sh) : tt_rshift_round_s64(v, sh < 62 ? sh : 62);
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
    out->ee = -15 + tt_requant_s16_from_s64(g, N, out->e, ctx->stats);
    out->loss_q16 = (15 << 16) - tt_log2_q16((uint32_t)(pc > 1 ? pc : 1));
    return pred;
}
