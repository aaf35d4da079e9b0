/** int16 activations and errors: portable scalar kernels (tt_act16.h). */
#include "tt_act16.h"

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
        for (int32_t k = 0; k < K; k++) a += (int32_t)x[k] * w[k];
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
    for (i = 0; i < N; i++) g[i] = (g[i] << 15) / S; /* operands >= 0: truncation == floor */
    pc = g[label];
    g[label] -= 32768;
    out->ee = -15 + tt_requant_s16_from_s64(g, N, out->e, ctx->stats);
    out->loss_q16 = (15 << 16) - tt_log2_q16((uint32_t)(pc > 1 ? pc : 1));
    return pred;
}
