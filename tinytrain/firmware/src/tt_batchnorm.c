/** Integer batch normalization: portable scalar path. Every helper mirrors one function of
 * tinytrain/ops/batchnorm.py; int64 everywhere a value can pass 2^31 (bounds in that file). */
#include "tt_batchnorm.h"

#define BN_F TT_BN_XHAT_FRAC

/** n * 2^t for n >= 0: rounded right shift (t < 0) or left shift capped at 2^61. */
static int64_t bn_scale_cap(int64_t n, int32_t t)
{
    if (t < 0) return tt_rshift_round_s64(n, -t < 62 ? -t : 62);
    if (n == 0) return 0;
    if (tt_bitwidth_u64((uint64_t)n) + t > 61) return (int64_t)1 << 61;
    return n << t;
}

/** sat_s32(round(n * 2^a / d)), ties toward +inf, exact; |n| < 2^40, 1 <= d < 2^25. */
static int32_t bn_rdiv(int64_t n, int32_t a, int64_t d)
{
    if (a < 0) return tt_sat_s32(tt_rshift_round_s64(tt_div_floor_s64(n, d), -a < 62 ? -a : 62));
    if (n == 0) return 0;
    if (tt_bitwidth_u64(tt_abs_u64(n)) + a > tt_bitwidth_u64((uint64_t)d) + 32)
        return n > 0 ? INT32_MAX : INT32_MIN;
    return tt_sat_s32(tt_div_floor_s64(2 * (n * ((int64_t)1 << a)) + d, 2 * d));
}

/** Shift-EMA r + round((b - r) / 2^k); the result lies between r and b. */
static int32_t bn_ema(int32_t r, int32_t b, int32_t k)
{
    return (int32_t)(r + tt_rshift_round_s64((int64_t)b - r, k));
}

/** 1/sqrt(v) ~ inv * 2^(n/2 - TT_BN_INV_BITS), n = e_v (mod 2), bitwidth(v 2^n) in {31, 32}. */
static int32_t bn_inv_sqrt(int64_t v, int32_t e_v, int32_t *n_out)
{
    int32_t n = 32 - tt_bitwidth_u64((uint64_t)v);
    uint32_t s;
    if ((n - e_v) % 2 != 0) n -= 1;
    s = tt_isqrt_u32((uint32_t)(n >= 0 ? (uint64_t)v << n : (uint64_t)v >> -n));
    *n_out = n;
    return (int32_t)((((uint64_t)1 << TT_BN_INV_BITS) + (s >> 1)) / s);
}

/** round(v * 2^-sh) before int32 saturation; +-2^32 stands for a too large left shift. */
static int64_t bn_shift_unsat(int64_t v, int32_t sh)
{
    if (sh >= 0) return tt_rshift_round_s64(v, sh < 62 ? sh : 62);
    if (v == 0) return 0;
    if (tt_bitwidth_u64(tt_abs_u64(v)) > 32 + sh)
        return v > 0 ? (int64_t)1 << 32 : -((int64_t)1 << 32);
    return v * ((int64_t)1 << -sh);
}

/** x_hat_q of one value of channel c, saturated to int32; counts saturations if nsat. */
static int32_t bn_xhat(int32_t xv, int64_t A, const int32_t *saved, int32_t C, int32_t c,
                       uint32_t *nsat)
{
    int64_t r = bn_shift_unsat((A * xv - saved[c]) * saved[C + c], saved[2 * C + c]);
    int32_t xh = tt_sat_s32(r);
    if (nsat && xh != r) (*nsat)++;
    return xh;
}

/** Channel c's x_hat constants, hoisted out of the loops over positions. fast: 1 <= sh <= 62
 * (always in train, where 18 <= sh <= 48), so bn_xhat's rounded shift is (v + half) >> sh: the
 * same floor(v / 2^sh + 1/2), and no overflow as |v| < 2^61. A*x - B fits int32 (|A*x - B| <
 * 2^20 in train, < 2^31 in eval: bounds in ops/batchnorm.py), so v is one 32x32->64 multiply. */
typedef struct {
    int32_t A, B, inv, sh, fast;
    int64_t half;
} bn_chan;

static bn_chan bn_channel(int64_t A, const int32_t *saved, int32_t C, int32_t c)
{
    bn_chan k;
    k.A = (int32_t)A;
    k.B = saved[c];
    k.inv = saved[C + c];
    k.sh = saved[2 * C + c];
    k.fast = k.sh >= 1 && k.sh <= 62;
    k.half = k.fast ? (int64_t)1 << (k.sh - 1) : 0;
    return k;
}

/** bn_xhat(xv, A, saved, C, c, nsat) for the channel k describes, bit for bit. */
static inline int32_t bn_xhat_k(const bn_chan *k, int32_t xv, const int32_t *saved, int32_t C,
                                int32_t c, uint32_t *nsat)
{
    if (k->fast) {
        const int64_t r = ((int64_t)(k->A * xv - k->B) * k->inv + k->half) >> k->sh;
        const int32_t xh = tt_sat_s32(r);
        if (nsat && xh != r) (*nsat)++;
        return xh;
    }
    return bn_xhat(xv, k->A, saved, C, c, nsat);
}

/* The forward on positional arguments (tt_batchnorm_params' fields in order), out of line with
 * them in argument registers and stack slots: unpacking the struct inside the loops cost W3's
 * batch norm forward 0.4 % more instructions on Cortex-M4 (bench/dev/profile_device.py). */
static int32_t bn_fwd(const int8_t *x, int32_t ex, int32_t P, int32_t C, const int16_t *gamma,
                      int32_t e_g, const int32_t *beta, int32_t e_b, int32_t *rmean, int32_t e_rm,
                      int32_t *rvar, int32_t e_rv, int32_t eps_m, int32_t eps_k, int32_t mom_k,
                      int32_t train, int32_t *saved, int64_t *scratch, int8_t *y, tt_stats *st)
{
    const int32_t ea = e_g - BN_F;
    int64_t A;
    uint64_t m = 0;
    int32_t p, c, s, n;
    if (train) {
        int64_t eps_v;
        A = P;
        for (c = 0; c < 2 * C; c++) scratch[c] = 0;
        for (p = 0; p < P; p++) {
            const int8_t *row = x + (int64_t)p * C;
            for (c = 0; c < C; c++) {
                scratch[c] += row[c];
                scratch[C + c] += (int32_t)row[c] * row[c];
            }
        }
        eps_v = bn_scale_cap((int64_t)eps_m * P * P, -eps_k - 2 * ex);
        for (c = 0; c < C; c++) {
            const int64_t S = scratch[c], m2 = P * scratch[C + c] - S * S, v = m2 + eps_v;
            saved[c] = (int32_t)S;
            saved[C + c] = bn_inv_sqrt(v > 1 ? v : 1, 0, &n);
            saved[2 * C + c] = TT_BN_INV_BITS - BN_F - n / 2;
            rmean[c] = bn_ema(rmean[c], bn_rdiv(S, ex - e_rm, P), mom_k);
            rvar[c] = bn_ema(rvar[c], bn_rdiv(m2, 2 * ex - e_rv, (int64_t)P * (P - 1)), mom_k);
        }
    } else {
        const int64_t eps_r = bn_scale_cap(eps_m, -eps_k - e_rv);
        A = 1 << TT_BN_EVAL_FRAC;
        for (c = 0; c < C; c++) {
            const int64_t v = (rvar[c] > 0 ? rvar[c] : 0) + eps_r;
            saved[c] = (int32_t)tt_align(rmean[c], e_rm, ex - TT_BN_EVAL_FRAC);
            saved[C + c] = bn_inv_sqrt(v > 1 ? v : 1, e_rv, &n);
            saved[2 * C + c] = TT_BN_INV_BITS - BN_F + (e_rv - n) / 2 + TT_BN_EVAL_FRAC - ex;
        }
    }
    /* Channel by channel (the max and the saturation count do not depend on the order). */
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t b = scratch[c] = tt_align(beta[c], e_b, ea);
        const int32_t g = gamma[c];
        for (p = 0; p < P; p++) {
            const int32_t xh = bn_xhat_k(&k, x[(int64_t)p * C + c], saved, C, c, &st->saturated);
            const uint64_t a = tt_abs_u64((int64_t)g * xh + b);
            if (a > m) m = a;
        }
    }
    saved[3 * C] = ex;
    s = tt_requant_shift(m, 8);
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t b = scratch[c];
        const int32_t g = gamma[c];
        for (p = 0; p < P; p++) {
            const int32_t xh = bn_xhat_k(&k, x[(int64_t)p * C + c], saved, C, c, 0);
            const int64_t r = tt_rshift_round_s64((int64_t)g * xh + b, s);
            if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
            y[(int64_t)p * C + c] = tt_sat_s8(r);
        }
    }
    return ea + s;
}

#define TT_BN_FWD_ARGS(p) (p)->P, (p)->C, (p)->gamma, (p)->e_g, (p)->beta, (p)->e_b, (p)->rmean, \
    (p)->e_rm, (p)->rvar, (p)->e_rv, (p)->eps_m, (p)->eps_k, (p)->mom_k

int32_t tt_batchnorm_fwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *x,
                            int32_t ex, int8_t *y)
{
    return bn_fwd(x, ex, TT_BN_FWD_ARGS(p), 1, p->saved, ctx->scratch, y, ctx->stats);
}

int32_t tt_batchnorm_fwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *x, int32_t ex, int8_t *y)
{
    return bn_fwd(x, ex, TT_BN_FWD_ARGS(p), 0, p->saved, ctx->scratch, y, ctx->stats);
}

/** J = rshift_round(I, BN_F) of one position (see ops/batchnorm.py, Backward). */
static int64_t bn_j(int32_t ev, int64_t xh, int64_t A, int64_t se, int64_t g, int32_t train)
{
    const int64_t i = train ? (A * ev - se) * ((int64_t)1 << (2 * BN_F)) - xh * g
                            : A * ev * ((int64_t)1 << (2 * BN_F));
    return tt_rshift_round_s64(i, BN_F);
}

static int32_t bn_bwd(const tt_ctx *ctx, const tt_batchnorm_params *bp, const int8_t *e,
                      int32_t ee, const int8_t *x, int32_t train, int8_t *dx)
{
    const int32_t P = bp->P, C = bp->C, e_g = bp->e_g, ex = bp->saved[3 * bp->C];
    const int32_t *saved = bp->saved;
    const int16_t *gamma = bp->gamma;
    int64_t *scratch = ctx->scratch;
    tt_stats *st = ctx->stats;
    int64_t *se = scratch, *g = scratch + C, *km = scratch + 2 * C;
    const int64_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    uint64_t m = 0;
    int32_t p, c, s, top = 0, have = 0, e_k;
    for (c = 0; c < C; c++) se[c] = g[c] = 0;
    if (train) {
        for (c = 0; c < C; c++) {
            const bn_chan k = bn_channel(A, saved, C, c);
            int64_t gs = 0;
            int32_t ss = 0; /* |sum e| <= 127 * P < 2^20 */
            for (p = 0; p < P; p++) {
                const int32_t ev = e[(int64_t)p * C + c];
                ss += ev;
                gs += (int64_t)ev * bn_xhat_k(&k, x[(int64_t)p * C + c], saved, C, c, 0);
            }
            se[c] = ss;
            g[c] = gs;
        }
    }
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)gamma[c] * saved[C + c];
        if (k != 0) {
            const int32_t t = tt_bitwidth_u64(tt_abs_u64(k)) - saved[2 * C + c];
            if (!have || t > top) top = t;
            have = 1;
        }
    }
    e_k = have ? top - TT_BN_KM_BITS : 0;
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)gamma[c] * saved[C + c];
        const int32_t sk = saved[2 * C + c] + e_k;
        km[c] = sk >= 0 ? tt_rshift_round_s64(k, sk < 62 ? sk : 62) : k * ((int64_t)1 << -sk);
    }
    /* Channel by channel, as the forward pass. */
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t kmc = km[c], sec = se[c], gc = g[c];
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            const int64_t xh = train ? bn_xhat_k(&k, x[i], saved, C, c, 0) : 0;
            const uint64_t a = tt_abs_u64(kmc * bn_j(e[i], xh, A, sec, gc, train));
            if (a > m) m = a;
        }
    }
    s = tt_requant_shift(m, 8);
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        const int64_t kmc = km[c], sec = se[c], gc = g[c];
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            const int64_t xh = train ? bn_xhat_k(&k, x[i], saved, C, c, 0) : 0;
            const int64_t r = tt_rshift_round_s64(kmc * bn_j(e[i], xh, A, sec, gc, train), s);
            if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
            dx[i] = tt_sat_s8(r);
        }
    }
    return e_k + e_g + ee - ex - 2 * BN_F + s;
}

int32_t tt_batchnorm_bwd_s8(const tt_ctx *ctx, const tt_batchnorm_params *p, const int8_t *e,
                            int32_t ee, const int8_t *x, int8_t *dx)
{
    return bn_bwd(ctx, p, e, ee, x, 1, dx);
}

int32_t tt_batchnorm_bwd_eval_s8(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                 const int8_t *e, int32_t ee, const int8_t *x, int8_t *dx)
{
    return bn_bwd(ctx, p, e, ee, x, 0, dx);
}

static void bn_grad(const tt_batchnorm_params *bp, const int8_t *e, const int8_t *x,
                    int32_t train, int32_t *ggamma, int32_t *gbeta)
{
    const int32_t P = bp->P, C = bp->C;
    const int32_t *saved = bp->saved;
    const int64_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    int32_t p, c;
    for (c = 0; c < C; c++) {
        const bn_chan k = bn_channel(A, saved, C, c);
        int64_t se = 0, g = 0;
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            se += e[i];
            g += (int64_t)e[i] * bn_xhat_k(&k, x[i], saved, C, c, 0);
        }
        ggamma[c] = tt_sat_s32(g);
        gbeta[c] = (int32_t)se;
    }
}

void tt_batchnorm_grad_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                           int32_t *ggamma, int32_t *gbeta)
{
    bn_grad(p, e, x, 1, ggamma, gbeta);
}

void tt_batchnorm_grad_eval_s32(const tt_batchnorm_params *p, const int8_t *e, const int8_t *x,
                                int32_t *ggamma, int32_t *gbeta)
{
    bn_grad(p, e, x, 0, ggamma, gbeta);
}
