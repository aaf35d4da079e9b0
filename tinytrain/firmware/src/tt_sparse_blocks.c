/** Dense layers pruned by 1 x 4 blocks, stored by blocks (tt_sparse_blocks.h): the block code's
 *  helpers and the kernels that use the blocks (forward, input error, gradient, the fused
 *  update); the element walks are tt_sparse_rows.c's. */
#include "tt_sparse_blocks.h"
#include "tt_dense.h"
#include "tt_dsp.h"

/* Weights of block j of a row of K: 4, the last K % 4 when 4 does not divide K. */
static int32_t tt_blocks_size(int32_t K, int32_t j)
{
    const int32_t r = K - 4 * j;
    return r < 4 ? r : 4;
}

/* The kept weights of the blocks [s, end) of a row (the short block, if there, last). */
static int32_t tt_blocks_weights(const uint8_t *s, const uint8_t *end, int32_t K)
{
    const int32_t m = 4 * (int32_t)(end - s);
    return (K & 3) && end > s && end[-1] == (uint32_t)K / 4u ? m - 4 + (K & 3) : m;
}

int32_t tt_sparse_blocks_row_count(const uint8_t *code, int32_t K, int32_t N, int32_t n)
{
    const uint8_t *s = code + N;
    int32_t i;
    for (i = 0; i < n; i++) s += code[i];
    return tt_blocks_weights(s, s + code[n], K);
}

int32_t tt_sparse_blocks_count(const uint8_t *code, int32_t K, int32_t N)
{
    const uint8_t *s = code + N;
    int32_t n, c = 0;
    for (n = 0; n < N; n++) {
        c += tt_blocks_weights(s, s + code[n], K);
        s += code[n];
    }
    return c;
}

int32_t tt_sparse_blocks_columns(const uint8_t *code, int32_t K, int32_t N, int32_t n, int32_t *cols)
{
    const uint8_t *s = code + N;
    int32_t i, c, m = 0;
    for (i = 0; i < n; i++) s += code[i];
    for (i = 0; i < code[n]; i++) {
        const int32_t a = 4 * s[i], b = a + tt_blocks_size(K, s[i]);
        for (c = a; c < b; c++) cols[m++] = c;
    }
    return m;
}

/* The kept blocks of a row [s, end) split: the full ones first, *tail the weights of the last one
 * when it is the short block of a K that 4 does not divide (0 else). */
static const uint8_t *tt_blocks_full_end(const uint8_t *s, const uint8_t *end, int32_t K, int32_t *tail)
{
    *tail = (K & 3) && end > s && end[-1] == (uint32_t)K / 4u ? K & 3 : 0;
    return *tail ? end - 1 : end;
}

int32_t tt_sparse_blocks_fwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *x,
                                int32_t ex, int8_t *y)
{
    const int32_t N = p->N, K = p->K, eb = p->eb, ea = ex + p->ew, d = ea - eb;
    const uint8_t *s = p->code + N;
    const int16_t *w = p->w;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* K <= TT_DENSE_S32_MAX_K: every sum fits int32 */
    int32_t n;
#if TT_HAVE_DSP
    uint32_t *xx = (uint32_t *)(void *)(acc + N); /* x[4j .. 4j + 3] as int16 pairs xx[2j], xx[2j + 1] */
    tt_widen_s8(x, K & ~3, 0, xx);
#endif
    if (d >= 1 && d <= 31) /* the common case, a plain rounding shift, said apart (as tt_dense.c) */
        for (n = 0; n < N; n++) acc[n] = tt_rshift_round_s32(p->b[n], d);
    else
        for (n = 0; n < N; n++) acc[n] = tt_align_s32(p->b[n], eb, ea);
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        int32_t a = acc[n], tail, i;
        const uint8_t *full = tt_blocks_full_end(s, end, K, &tail);
        for (; s < full; s++) {
#if TT_HAVE_DSP
            const uint32_t *q = xx + 2u * *s;
            a = __smlad((int32_t)q[0], (int32_t)tt_ld_s16x2(w), a);
            a = __smlad((int32_t)q[1], (int32_t)tt_ld_s16x2(w + 2), a);
#else
            const int8_t *q = x + 4u * *s;
            a += (int32_t)q[0] * w[0] + (int32_t)q[1] * w[1] + (int32_t)q[2] * w[2] + (int32_t)q[3] * w[3];
#endif
            w += 4;
        }
        for (i = 0; i < tail; i++) a += (int32_t)x[(K & ~3) + i] * (int32_t)*w++;
        s = end;
        acc[n] = a;
    }
    return ea + tt_requant_s8_from_s32(acc, N, y, ctx->stats);
}

int32_t tt_sparse_blocks_bwd_s8(const tt_ctx *ctx, const tt_sparse_rows_params *p, const int8_t *e,
                                int32_t ee, int8_t *dx)
{
    const int32_t K = p->K, N = p->N;
    const uint8_t *s = p->code + N;
    const int16_t *w = p->w;
    int32_t *acc = (int32_t *)(void *)ctx->scratch; /* N <= TT_DENSE_S32_MAX_N: every sum fits int32 */
    int32_t n, k;
    for (k = 0; k < K; k++) acc[k] = 0;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        const int32_t en = e[n];
        if (en == 0) { /* adds nothing: pass the row */
            w += tt_blocks_weights(s, end, K);
            s = end;
            continue;
        }
        for (; s < end; s++) {
            const int32_t c = 4 * *s, m = tt_blocks_size(K, *s);
            int32_t *a = acc + c;
            if (m == 4) {
                a[0] += en * w[0];
                a[1] += en * w[1];
                a[2] += en * w[2];
                a[3] += en * w[3];
            } else {
                for (k = 0; k < m; k++) a[k] += en * w[k];
            }
            w += m;
        }
    }
    return ee + p->ew + tt_requant_s8_from_s32(acc, K, dx, ctx->stats);
}

void tt_sparse_blocks_grad_s32(const tt_sparse_rows_params *p, const int8_t *e, const int8_t *x,
                               int32_t *gw, int32_t *gb)
{
    const int32_t K = p->K, N = p->N;
    const uint8_t *s = p->code + N;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const uint8_t *end = s + p->code[n];
        const int32_t en = e[n];
        for (; s < end; s++) {
            const int32_t c = 4 * *s, m = tt_blocks_size(K, *s);
            for (k = 0; k < m; k++) *gw++ = en * (int32_t)x[c + k];
        }
    }
    for (n = 0; n < N; n++) gb[n] = e[n];
}

/* w -= round(m_t e[n] x[k] / 2^s) on the kept weights: the step of tt_sparse_rows.c's
 * tt_rows_fast_s16 (portable: (q >> s) + ((q >> (s - 1)) & 1) of q = A_n x; DSP: SMMULR(A_n,
 * x 2^c), A_n = m_t e[n] 2^(32 - s - c), c = min(24, 32 - s)), saturating to [-32767, 32767] and
 * counted; a row whose error is 0 and a weight whose input is 0 keep their values. */
int32_t tt_sparse_blocks_fast_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                  const int8_t *e, const int8_t *x)
{
#if TT_HAVE_DSP
    const int32_t cs = 32 - s < 24 ? 32 - s : 24, sh = 32 - s - cs;
#else
    const int32_t cs = 0, sh = 0;
#endif
    const int32_t N = p->N, K = p->K;
    const uint8_t *code = p->code, *st = code + N;
    int16_t *w = p->w;
    uint32_t nsat = 0;
    int32_t n, k;
    (void)cs;
    if (sh > 0)
        for (n = 0; n < N; n++) { /* |m_t e[n]| < 2^22 */
            const int32_t a = u->m_t * (int32_t)e[n];
            if (a > (INT32_MAX >> sh) || a < -(INT32_MAX >> sh)) return 0;
        }
    for (n = 0; n < N; n++) {
        const uint8_t *end = st + code[n];
        const int32_t an = u->m_t * (int32_t)e[n] * (1 << sh);
        if (an == 0) { /* every step is 0: pass the row */
            w += tt_blocks_weights(st, end, K);
            st = end;
            continue;
        }
        for (; st < end; st++) {
            const int32_t c = 4 * *st, m = tt_blocks_size(K, *st);
            for (k = 0; k < m; k++) {
                const int32_t X = x[c + k];
                if (X != 0) {
#if TT_HAVE_DSP
                    int32_t v = (int32_t)w[k] - tt_smmulr(an, X * (1 << cs));
#else
                    int32_t v = (int32_t)w[k] - ((an * X >> s) + ((an * X >> (s - 1)) & 1));
#endif
                    if (v > TT_S16_MAX || v < -TT_S16_MAX) {
                        nsat++;
                        v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
                    }
                    w[k] = (int16_t)v;
                }
            }
            w += m;
        }
    }
    u->stats->saturated += nsat;
    return 1;
}
