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

/* w -= round(a x[k] / 2^s), a = m_t e[n], on the blocks [st, end) of a row (s in [1, 31],
 * |a x| < 2^29: the rounding shift of an int32), saturating to [-32767, 32767] and counted; a
 * weight whose input is 0 keeps its value (as tt_sparse_rows.c). Returns the saturations. */
static uint32_t tt_blocks_row_s16(int16_t *w, const uint8_t *st, const uint8_t *end, int32_t K, const int8_t *x,
                                  int32_t a, int32_t s)
{
    uint32_t nsat = 0;
    int32_t k;
    for (; st < end; st++) {
        const int32_t c = 4 * *st, m = tt_blocks_size(K, *st);
        for (k = 0; k < m; k++) {
            const int32_t q = a * (int32_t)x[c + k];
            if (q != 0) { /* a != 0 here: q == 0 is an input 0, and the weight keeps its value */
                int32_t v = (int32_t)w[k] - ((q >> s) + ((q >> (s - 1)) & 1));
                if (v > TT_S16_MAX || v < -TT_S16_MAX) {
                    nsat++;
                    v = v > 0 ? TT_S16_MAX : -TT_S16_MAX;
                }
                w[k] = (int16_t)v;
            }
        }
        w += m;
    }
    return nsat;
}

#if TT_HAVE_DSP
/* The full blocks [st, end) of a row by pairs (the fused Dense update's step, tt_sgd.c): S = W - D
 * lane-wise with SSUB16 (|d| <= 16383), the Q flag raised exactly when a lane's v = w - d is
 * outside [-32767, 32767] (a saturation, or an old -32768: tt_sgd.c's tt_sgd_s16x2 guard, SSAT16
 * #15 on SHSUB16(W, D) and on SHSUB16(S, 1)); a lane whose input is 0 steps by 0, as the rule.
 * Returns 1 when the guard was hit: then the pairs are restored (SADD16 of the same steps) and
 * the caller takes the exact rule. */
static int32_t tt_blocks_row_fast_s16(int16_t *w, const uint8_t *st, const uint8_t *end, const uint32_t *xx,
                                      int32_t A)
{
    const uint8_t *s0 = st;
    int16_t *w0 = w;
    tt_guard_clear();
    for (; st < end; st++, w += 4) {
        const uint32_t *q = xx + 2u * *st, W0 = tt_ld_s16x2(w), W1 = tt_ld_s16x2(w + 2);
        const uint32_t D0 = tt_step_s16x2(A, q[0]), D1 = tt_step_s16x2(A, q[1]);
        const uint32_t S0 = (uint32_t)__ssub16((int32_t)W0, (int32_t)D0), S1 = (uint32_t)__ssub16((int32_t)W1, (int32_t)D1);
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W0, (int32_t)D0));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)W1, (int32_t)D1));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S0, 0x00010001));
        tt_guard_s16x2_15((uint32_t)__shsub16((int32_t)S1, 0x00010001));
        tt_st_s16x2(w, S0);
        tt_st_s16x2(w + 2, S1);
    }
    if (!tt_guard_hit()) return 0;
    for (st = s0, w = w0; st < end; st++, w += 4) {
        const uint32_t *q = xx + 2u * *st;
        tt_st_s16x2(w, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(w), (int32_t)tt_step_s16x2(A, q[0])));
        tt_st_s16x2(w + 2, (uint32_t)__sadd16((int32_t)tt_ld_s16x2(w + 2), (int32_t)tt_step_s16x2(A, q[1])));
    }
    tt_guard_clear();
    return 1;
}
#endif

/* w -= round(m_t e[n] x[k] / 2^s) on the kept weights, row by row: rows whose error is 0 passed
 * whole; DSP: a row's full blocks two pairs each (tt_blocks_row_fast_s16; with c = min(8, 32 - s),
 * x widened to x 2^c once, A = a 2^(32 - s - c), when |A| < 2^31 and |d| <= 16383 as in
 * tt_sgd_dense_rows_s16), the rest by the exact rule (tt_blocks_row_s16). */
int32_t tt_sparse_blocks_fast_s16(const tt_sgd_step *u, const tt_sparse_rows_sgd_s16_params *p, int32_t s,
                                  const int8_t *e, const int8_t *x)
{
    const int32_t N = p->N, K = p->K;
    const uint8_t *st = p->code + N;
    int16_t *w = p->w;
    uint32_t nsat = 0;
    int32_t n;
#if TT_HAVE_DSP
    const int32_t c = 32 - s < 8 ? 32 - s : 8, sh = 32 - s - c;
    const int64_t lim1 = (int64_t)INT32_MAX >> sh, lim2 = (((int64_t)16383 << s) - 1) / 128;
    const int32_t amax = (int32_t)(lim1 < lim2 ? lim1 : lim2);
    uint32_t *xx = (uint32_t *)(void *)p->work; /* K / 2 words */
    tt_widen_s8(x, K & ~3, c, xx);
#endif
    for (n = 0; n < N; n++) {
        const uint8_t *end = st + p->code[n];
        const int32_t a = u->m_t * (int32_t)e[n], m = tt_blocks_weights(st, end, K);
        if (a != 0) {
#if TT_HAVE_DSP
            int32_t tail;
            const uint8_t *full = tt_blocks_full_end(st, end, K, &tail);
            if ((a < 0 ? -a : a) <= amax && !tt_blocks_row_fast_s16(w, st, full, xx, a * ((int32_t)1 << sh)))
                nsat += tt_blocks_row_s16(w + (m - tail), full, end, K, x, a, s);
            else
                nsat += tt_blocks_row_s16(w, st, end, K, x, a, s);
#else
            nsat += tt_blocks_row_s16(w, st, end, K, x, a, s);
#endif
        }
        w += m;
        st = end;
    }
    u->stats->saturated += nsat;
    return 1;
}
