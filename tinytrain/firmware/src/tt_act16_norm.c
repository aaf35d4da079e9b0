/** int16 activations and errors: batch normalization (tt_act16_norm.h), portable C. Every
 *  helper mirrors one function of tinytrain/ops/batchnorm.py in its general int64 form (the
 *  int8 kernels' 32-bit shortcuts assume |x| <= 127); the bounds are that file's int16 ones. */
#include "tt_act16_norm.h"
#include "tt_act16.h"

#define BN16_F TT_BN_XHAT_FRAC
#define BN16_J_SHIFT (TT_BN_XHAT_FRAC + 8) /* ops/batchnorm.py A16_J_SHIFT */

/* n 2^t for n >= 0: a rounded right shift (t < 0) or a left shift capped at 2^61 (scale_cap) */
static int64_t bn16_scale_cap(int64_t n, int32_t t)
{
    if (t < 0) return tt_rshift_round_s64(n, -t < 62 ? -t : 62);
    if (n == 0) return 0;
    return tt_bitwidth_u64((uint64_t)n) + t > 61 ? (int64_t)1 << 61 : n * ((int64_t)1 << t);
}

/* sat_s32(round(n 2^a / d)), ties toward +inf (rdiv): |n| < 2^55, 1 <= d < 2^25, so n 2^a < 2^57
 * where it is formed */
static int32_t bn16_rdiv(int64_t n, int32_t a, int64_t d)
{
    if (a < 0) return tt_sat_s32(tt_rshift_round_s64(tt_div_floor_s64(n, d), -a < 62 ? -a : 62));
    if (n == 0) return 0;
    if (tt_bitwidth_u64(tt_abs_u64(n)) + a > tt_bitwidth_u64((uint64_t)d) + 32)
        return n > 0 ? INT32_MAX : INT32_MIN;
    return tt_sat_s32(tt_div_floor_s64(2 * (n * ((int64_t)1 << a)) + d, 2 * d));
}

/* r + rshift_round(b - r, k): between r and b (ema) */
static int32_t bn16_ema(int32_t r, int32_t b, int32_t k)
{
    return (int32_t)(r + tt_rshift_round_s64((int64_t)b - r, k));
}

/* (inv, n) of inv_sqrt: 1/sqrt(v) ~ inv 2^(n/2 - 45), n = e_v (mod 2), v >= 1 (v < 2^62) */
static int32_t bn16_inv_sqrt(int64_t v, int32_t e_v, int32_t *n_out)
{
    int32_t n = 32 - tt_bitwidth_u64((uint64_t)v);
    uint32_t s;
    if ((n - e_v) % 2 != 0) n -= 1;
    s = tt_isqrt_u32((uint32_t)(n >= 0 ? (uint64_t)v << n : (uint64_t)v >> -n));
    *n_out = n;
    return (int32_t)((((int64_t)1 << TT_BN_INV_BITS) + (s >> 1)) / s);
}

/* x_hat_q of one value of channel c (xhat / shift_sat32), counted in *nsat when it saturates.
 * A x - B fits int32 (|A x| < 2^27 and |B| < 2^27 in train; |A x| < 2^23 and |B| <= 2^30 in eval),
 * so v is one 32x32->64 product; for 1 <= sh <= 62 the rounded shift is (v + 2^(sh-1)) >> sh
 * (|v| < 2^61: no overflow). */
static inline int32_t bn16_xhat(int32_t xv, int32_t A, const int32_t *saved, int32_t C, int32_t c, uint32_t *nsat)
{
    const int64_t v = (int64_t)(A * xv - saved[c]) * saved[C + c];
    const int32_t sh = saved[2 * C + c];
    int64_t r;
    if (sh >= 1 && sh <= 62) r = (v + ((int64_t)1 << (sh - 1))) >> sh;
    else if (sh >= 0) r = tt_rshift_round_s64(v, sh < 62 ? sh : 62);
    else if (v != 0 && tt_bitwidth_u64(tt_abs_u64(v)) > 32 + sh) r = v > 0 ? (int64_t)1 << 32 : -((int64_t)1 << 32);
    else r = v * ((int64_t)1 << -sh);
    if (nsat && r != tt_sat_s32(r)) (*nsat)++;
    return tt_sat_s32(r);
}

static int32_t bn16_fwd(const tt_ctx *ctx, const tt_batchnorm_params *bp, const int16_t *x, int32_t ex,
                        int32_t train, int16_t *y)
{
    const int32_t P = bp->P, C = bp->C, ea = bp->e_g - BN16_F;
    const int32_t A = train ? P : 1 << TT_BN_EVAL_FRAC;
    int32_t *saved = bp->saved;
    int64_t *acc = ctx->scratch;
    const int64_t eps = train ? bn16_scale_cap((int64_t)bp->eps_m * P * P, -bp->eps_k - 2 * ex)
                              : bn16_scale_cap(bp->eps_m, -bp->eps_k - bp->e_rv);
    int32_t p, c, n;
    for (c = 0; c < C; c++) {
        int64_t b;
        if (train) {
            int64_t S = 0, Q = 0, m2, v;
            for (p = 0; p < P; p++) {
                const int32_t xv = x[(int64_t)p * C + c];
                S += xv;
                Q += xv * xv; /* < 2^30 */
            }
            m2 = P * Q - S * S; /* < 2^54 */
            v = m2 + eps;
            saved[c] = (int32_t)S;
            saved[C + c] = bn16_inv_sqrt(v > 1 ? v : 1, 0, &n);
            saved[2 * C + c] = TT_BN_INV_BITS - BN16_F - n / 2; /* n even */
            bp->rmean[c] = bn16_ema(bp->rmean[c], bn16_rdiv(S, ex - bp->e_rm, P), bp->mom_k);
            bp->rvar[c] = bn16_ema(bp->rvar[c], bn16_rdiv(m2, 2 * ex - bp->e_rv, (int64_t)P * (P - 1)), bp->mom_k);
        } else {
            const int64_t v = (bp->rvar[c] > 0 ? bp->rvar[c] : 0) + eps;
            saved[c] = (int32_t)tt_align(bp->rmean[c], bp->e_rm, ex - TT_BN_EVAL_FRAC);
            saved[C + c] = bn16_inv_sqrt(v > 1 ? v : 1, bp->e_rv, &n);
            saved[2 * C + c] = TT_BN_INV_BITS - BN16_F + (bp->e_rv - n) / 2 + TT_BN_EVAL_FRAC - ex; /* n = e_rv mod 2 */
        }
        b = tt_align(bp->beta[c], bp->e_b, ea);
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            acc[i] = (int64_t)bp->gamma[c] * bn16_xhat(x[i], A, saved, C, c, &ctx->stats->saturated) + b;
        }
    }
    saved[3 * C] = ex;
    return ea + tt_requant_s16_from_s64(acc, P * C, y, ctx->stats);
}

int32_t tt_batchnorm_fwd_s16(const tt_ctx *ctx, const tt_batchnorm_params *p, const int16_t *x,
                             int32_t ex, int16_t *y)
{
    return bn16_fwd(ctx, p, x, ex, 1, y);
}

int32_t tt_batchnorm_fwd_eval_s16(const tt_ctx *ctx, const tt_batchnorm_params *p,
                                  const int16_t *x, int32_t ex, int16_t *y)
{
    return bn16_fwd(ctx, p, x, ex, 0, y);
}

/* channel c's sums: *se = sum e (|.| < 2^27), returns G = sum e x_hat (|.| < 2^39 in train) */
static int64_t bn16_sums(const tt_batchnorm_params *bp, const int16_t *e, const int16_t *x, int32_t c, int32_t *se)
{
    const int32_t P = bp->P, C = bp->C;
    int64_t G = 0;
    int32_t s = 0, p;
    for (p = 0; p < P; p++) {
        const int64_t i = (int64_t)p * C + c;
        s += e[i];
        G += (int64_t)e[i] * bn16_xhat(x[i], P, bp->saved, C, c, 0);
    }
    *se = s;
    return G;
}

int32_t tt_batchnorm_bwd_s16(const tt_ctx *ctx, const tt_batchnorm_params *bp, const int16_t *e,
                             int32_t ee, const int16_t *x, int16_t *dx)
{
    const int32_t P = bp->P, C = bp->C, ex = bp->saved[3 * C], g = tt_bitwidth_u64((uint64_t)(P - 1));
    int32_t *saved = bp->saved, *gbeta = saved + 3 * C + 1, *ggamma = gbeta + C;
    int64_t *acc = ctx->scratch;
    int32_t p, c, top = 0, have = 0, e_k;
    for (c = 0; c < C; c++) { /* E_k: the largest bitwidth(gamma inv) - sh, minus KM_BITS */
        const int64_t k = (int64_t)bp->gamma[c] * saved[C + c];
        if (k != 0) {
            const int32_t t = tt_bitwidth_u64(tt_abs_u64(k)) - saved[2 * C + c];
            if (!have || t > top) top = t;
            have = 1;
        }
    }
    e_k = have ? top - TT_BN_KM_BITS : 0;
    for (c = 0; c < C; c++) {
        const int64_t k = (int64_t)bp->gamma[c] * saved[C + c];
        const int32_t sk = saved[2 * C + c] + e_k;
        const int64_t km = sk >= 0 ? tt_rshift_round_s64(k, sk < 62 ? sk : 62) : k * ((int64_t)1 << -sk);
        int32_t se;
        const int64_t G = bn16_sums(bp, e, x, c, &se);
        gbeta[c] = se;
        ggamma[c] = tt_sat_s32(tt_rshift_round_s64(G, g));
        for (p = 0; p < P; p++) {
            const int64_t i = (int64_t)p * C + c;
            const int64_t xh = bn16_xhat(x[i], P, saved, C, c, 0);
            /* |I| < 2^57 + 2^52, |J| <= 2^38, |km J| <= 2^62 */
            const int64_t I = ((int64_t)P * e[i] - se) * ((int64_t)1 << (2 * BN16_F)) - xh * G;
            acc[i] = km * tt_rshift_round_s64(I, BN16_J_SHIFT);
        }
    }
    return e_k + bp->e_g + ee - ex - 3 * BN16_F + BN16_J_SHIFT + tt_requant_s16_from_s64(acc, P * C, dx, ctx->stats);
}

void tt_batchnorm_grad_s32_s16(const tt_batchnorm_params *bp, const int16_t *e, const int16_t *x,
                               int32_t *ggamma, int32_t *gbeta)
{
    const int32_t g = tt_bitwidth_u64((uint64_t)(bp->P - 1));
    int32_t c;
    for (c = 0; c < bp->C; c++) ggamma[c] = tt_sat_s32(tt_rshift_round_s64(bn16_sums(bp, e, x, c, &gbeta[c]), g));
}
