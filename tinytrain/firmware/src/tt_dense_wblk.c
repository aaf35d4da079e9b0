/* Dense kernels for block-exponent weights (tt_dense_wblk.h). The decoded weights q << s are
 * within +-32767, so the int16 kernels' width rule applies: int32 sums up to TT_DENSE_S32_MAX_K
 * / _MAX_N (tt_dense.h), int64 beyond. A block's products are summed first, then scaled by
 * 2^s (exact: a product of integers); every partial sum is bounded by the sum of |products|. */
#include <string.h>

#include "tt_dense.h"
#include "tt_dense_wblk.h"

/* q of element i: packed nibble (w4) or int8. Inlined with a constant w4, one loop per format. */
static inline int32_t tt_wblk_q(const void *w, int32_t i, int w4)
{
    if (w4) {
        const uint32_t b = ((const uint8_t *)w)[i >> 1];
        const uint32_t v = (i & 1) ? b >> 4 : b & 15u;
        return (int32_t)(v ^ 8u) - 8;
    }
    return ((const int8_t *)w)[i];
}

/* The two nibbles of a byte as int4 values (two's complement, without shifting a negative). */
static inline int32_t tt_w4_lo(uint32_t b) { return (int32_t)((b & 15u) ^ 8u) - 8; }
static inline int32_t tt_w4_hi(uint32_t b) { return (int32_t)((b >> 4) ^ 8u) - 8; }

/* sum of x[k] * q[i + k], k < n, q packed: a byte (two weights) per turn. |sum| <= n * 127 * 7:
 * int32 for the blocks of the int32 path (n <= K <= TT_DENSE_S32_MAX_K). */
static inline int32_t tt_w4_dot(const uint8_t *w, int32_t i, int32_t n, const int8_t *x)
{
    const uint8_t *p = w + (i >> 1);
    int32_t t = 0, k = 0;
    if ((i & 1) && n > 0) {
        t = (int32_t)x[0] * tt_w4_hi(*p++);
        k = 1;
    }
    for (; k + 2 <= n; k += 2) {
        const uint32_t b = *p++;
        t += (int32_t)x[k] * tt_w4_lo(b) + (int32_t)x[k + 1] * tt_w4_hi(b);
    }
    if (k < n) t += (int32_t)x[k] * tt_w4_lo(*p);
    return t;
}

static inline int32_t tt_wblk_fwd(const tt_ctx *ctx, int32_t K, int32_t N, int32_t L, const void *w,
                                  const uint8_t *ws, int32_t ew, const int32_t *b, int32_t eb,
                                  const int8_t *x, int32_t ex, int8_t *y, int w4)
{
    const int32_t ea = ex + ew, nb = (K + L - 1) / L;
    int64_t *scratch = ctx->scratch;
    uint32_t m = 0;
    int32_t n, j, k;
    for (n = 0; n < N; n++) {
        const uint8_t *sr = ws + n * nb;
        const int32_t base = n * K;
        if (K > TT_DENSE_S32_MAX_K) {
            int64_t acc = tt_align(b[n], eb, ea);
            for (j = 0; j < nb; j++) {
                const int32_t hi = (j + 1) * L < K ? (j + 1) * L : K;
                int64_t t = 0;
                for (k = j * L; k < hi; k++) t += (int32_t)x[k] * tt_wblk_q(w, base + k, w4);
                acc += t * ((int64_t)1 << sr[j]);
            }
            scratch[n] = acc;
        } else {
            int32_t s = tt_align_s32(b[n], eb, ea);
            uint32_t a;
            for (j = 0; j < nb; j++) {
                const int32_t lo = j * L, hi = (j + 1) * L < K ? (j + 1) * L : K;
                int32_t t = 0;
                if (w4) {
                    t = tt_w4_dot((const uint8_t *)w, base + lo, hi - lo, x + lo);
                } else {
                    const int8_t *row = (const int8_t *)w + base;
                    for (k = lo; k < hi; k++) t += (int32_t)x[k] * (int32_t)row[k];
                }
                s += t * ((int32_t)1 << sr[j]);
            }
            scratch[n] = s;
            a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
            if (a > m) m = a;
        }
    }
    if (K > TT_DENSE_S32_MAX_K) return ea + tt_requant_s8_from_s64(scratch, N, y, ctx->stats);
    return ea + tt_requant_s8_from_s64_max(scratch, N, m, y, ctx->stats);
}

static inline int32_t tt_wblk_bwd(const tt_ctx *ctx, int32_t K, int32_t N, int32_t L, const void *w,
                                  const uint8_t *ws, int32_t ew, const int8_t *e, int32_t ee,
                                  int8_t *dx, int w4)
{
    const int32_t nb = (K + L - 1) / L;
    int64_t *scratch = ctx->scratch;
    uint32_t m = 0;
    int32_t n, j, k;
    if (N <= 0) /* no rows: all sums 0, said apart (as in tt_dense.c: no VFP zero stores) */
        memset(scratch, 0, (size_t)K * sizeof *scratch);
    else for (j = 0; j < nb; j++) {
        const int32_t hi = (j + 1) * L < K ? (j + 1) * L : K;
        for (k = j * L; k < hi; k++) {
            if (N > TT_DENSE_S32_MAX_N) {
                /* started from the first product (N >= 1 here): a constant 0 start is one GCC
                 * may load with VFP registers in hard-float builds */
                int64_t acc = (int64_t)((int32_t)e[0] * tt_wblk_q(w, k, w4)) * ((int64_t)1 << ws[j]);
                for (n = 1; n < N; n++)
                    acc += (int64_t)((int32_t)e[n] * tt_wblk_q(w, n * K + k, w4)) * ((int64_t)1 << ws[n * nb + j]);
                scratch[k] = acc;
            } else {
                int32_t s = 0;
                uint32_t a;
                for (n = 0; n < N; n++)
                    s += (int32_t)e[n] * tt_wblk_q(w, n * K + k, w4) * ((int32_t)1 << ws[n * nb + j]);
                scratch[k] = s;
                a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
                if (a > m) m = a;
            }
        }
    }
    if (N > TT_DENSE_S32_MAX_N) return ee + ew + tt_requant_s8_from_s64(scratch, K, dx, ctx->stats);
    return ee + ew + tt_requant_s8_from_s64_max(scratch, K, m, dx, ctx->stats);
}

int32_t tt_dense_fwd_s8_w4blk(const tt_ctx *ctx, const tt_dense_w4blk_params *p, const int8_t *x,
                              int32_t ex, int8_t *y)
{
    return tt_wblk_fwd(ctx, p->K, p->N, p->L, p->w, p->ws, p->ew, p->b, p->eb, x, ex, y, 1);
}

int32_t tt_dense_fwd_s8_w8blk(const tt_ctx *ctx, const tt_dense_w8blk_params *p, const int8_t *x,
                              int32_t ex, int8_t *y)
{
    return tt_wblk_fwd(ctx, p->K, p->N, p->L, p->w, p->ws, p->ew, p->b, p->eb, x, ex, y, 0);
}

int32_t tt_dense_bwd_s8_w4blk(const tt_ctx *ctx, const tt_dense_w4blk_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx)
{
    return tt_wblk_bwd(ctx, p->K, p->N, p->L, p->w, p->ws, p->ew, e, ee, dx, 1);
}

int32_t tt_dense_bwd_s8_w8blk(const tt_ctx *ctx, const tt_dense_w8blk_params *p, const int8_t *e,
                              int32_t ee, int8_t *dx)
{
    return tt_wblk_bwd(ctx, p->K, p->N, p->L, p->w, p->ws, p->ew, e, ee, dx, 0);
}

void tt_dense_grad_s32_w4blk(const tt_dense_w4blk_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb)
{
    const tt_dense_params q = {p->K, p->N, 0, p->ew, p->b, p->eb};
    tt_dense_grad_s32(&q, e, x, gw, gb);
}

void tt_dense_grad_s32_w8blk(const tt_dense_w8blk_params *p, const int8_t *e, const int8_t *x,
                             int32_t *gw, int32_t *gb)
{
    const tt_dense_params q = {p->K, p->N, 0, p->ew, p->b, p->eb};
    tt_dense_grad_s32(&q, e, x, gw, gb);
}

/* rshift_round(v, s), ties toward +inf, in 32 bits (|v| <= 32767: no overflow). */
static inline int32_t tt_wblk_rr(int32_t v, int32_t s)
{
    return s ? (v >> s) + ((v >> (s - 1)) & 1) : v;
}

/* Narrow row n of the master (K values from element i = n * K on) into q and the row's shifts.
 * Nibbles are written masked: a row of odd K shares a byte with its neighbour, which may be
 * skipped (tt_wblock_refresh_rows_*). */
static inline void tt_wblk_refresh_row(const int16_t *mp, void *q, uint8_t *ws, int32_t i, int32_t K, int32_t L,
                                       int w4)
{
    const int32_t nb = (K + L - 1) / L, qmax = w4 ? 7 : 127, smax = w4 ? 12 : 8;
    uint8_t *q4 = (uint8_t *)q + (i >> 1);
    int8_t *q8 = (int8_t *)q + i;
    int32_t j, k;
    for (j = 0; j < nb; j++, ws++) {
        const int32_t len = (j + 1) * L < K ? L : K - j * L;
        int32_t M = 0, s = 0;
        for (k = 0; k < len; k++) {
            const int32_t v = mp[k], a = v < 0 ? -v : v;
            if (a > M) M = a;
        }
        while (s < smax && tt_wblk_rr(M, s) > qmax) s++;
        *ws = (uint8_t)s;
        for (k = 0; k < len; k++, i++) {
            const int32_t r = tt_wblk_rr(mp[k], s), c = r > qmax ? qmax : r < -qmax ? -qmax : r;
            const uint32_t v = (uint32_t)c & 15u;  /* the nibble of c (two's complement) */
            if (!w4) {
                *q8++ = (int8_t)c;
            } else if (i & 1) {
                *q4 = (uint8_t)((*q4 & 15u) | (v << 4));
                q4++;
            } else {
                *q4 = (uint8_t)((*q4 & 0xF0u) | v);
            }
        }
        mp += len;
    }
}

static inline void tt_wblk_refresh(const int16_t *mw, void *q, uint8_t *ws, int32_t N, int32_t K, int32_t L,
                                   const int8_t *e, int w4)
{
    const int32_t nb = (K + L - 1) / L;
    int32_t n;
    for (n = 0; n < N; n++)
        if (!e || e[n]) tt_wblk_refresh_row(mw + n * K, q, ws + n * nb, n * K, K, L, w4);
}

void tt_wblock_refresh_s16_w4(const int16_t *m, uint8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L)
{
    tt_wblk_refresh(m, q, ws, N, K, L, 0, 1);
}

void tt_wblock_refresh_s16_w8(const int16_t *m, int8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L)
{
    tt_wblk_refresh(m, q, ws, N, K, L, 0, 0);
}

void tt_wblock_refresh_rows_s16_w4(const int16_t *m, uint8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L,
                                   const int8_t *e)
{
    tt_wblk_refresh(m, q, ws, N, K, L, e, 1);
}

void tt_wblock_refresh_rows_s16_w8(const int16_t *m, int8_t *q, uint8_t *ws, int32_t N, int32_t K, int32_t L,
                                   const int8_t *e)
{
    tt_wblk_refresh(m, q, ws, N, K, L, e, 0);
}
