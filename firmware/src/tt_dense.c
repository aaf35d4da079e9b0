/** Dense layer kernels: portable scalar path and Cortex-M DSP path (TT_HAVE_DSP), same bits. */
#include "tt_dense.h"
#include "tt_dsp.h"

/* The int32 paths below hold only when the bounds of tt_dense.h hold (inputs and errors in the
 * symmetric int8 range, weights int16, aligned bias clamped to 2^30):
 *   forward  |acc| <= 2^30 + K * 127 * 32767 < 2^31 for K <= TT_DENSE_S32_MAX_K;
 *   backward |acc| <= N * 127 * 32767 < 2^31 for N <= TT_DENSE_S32_MAX_N.
 * Both paths compute every partial sum exactly, so the order of summation does not matter. */

#if TT_HAVE_DSP
/* x widened to int16 pairs in chunks of this many inputs (stack: TT_DENSE_CHUNK * 2 bytes) */
#define TT_DENSE_CHUNK 64

/* s[i] += sum_j row_i[2j..2j+1] . xx[j] for the four rows r, r + K, r + 2K, r + 3K. */
static inline void tt_dense_dot4(const int16_t *r, int32_t K, const uint32_t *xx, int32_t np,
                                 int32_t *s)
{
    int32_t s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3], j;
    for (j = 0; j < np; j++, r += 2) {
        const int32_t X = (int32_t)xx[j];
        s0 = __smlad((int32_t)tt_ld_s16x2(r), X, s0);
        s1 = __smlad((int32_t)tt_ld_s16x2(r + K), X, s1);
        s2 = __smlad((int32_t)tt_ld_s16x2(r + 2 * K), X, s2);
        s3 = __smlad((int32_t)tt_ld_s16x2(r + 3 * K), X, s3);
    }
    s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3;
}

/* acc[n] = align(b[n]) + sum_k x[k] w[n][k] in int32 (SMLAD: two products per instruction, four
 * rows per pass sharing the widened inputs); returns max |acc[n]|. */
static uint32_t tt_dense_fwd_rows_s32(const int8_t *x, const int16_t *w, const int32_t *b,
                                      int32_t eb, int32_t ea, int32_t K, int32_t N, int64_t *acc)
{
    uint32_t xx[TT_DENSE_CHUNK / 2], m = 0;
    int32_t k0, n, j, i;
    for (k0 = 0; k0 < K; k0 += TT_DENSE_CHUNK) {
        const int32_t len = K - k0 < TT_DENSE_CHUNK ? K - k0 : TT_DENSE_CHUNK, np = len / 2;
        tt_widen_s8(x + k0, 2 * np, 0, xx);
        for (n = 0; n < N; n += 4) {
            const int32_t rows = N - n < 4 ? N - n : 4;
            const int16_t *r = w + n * K + k0;
            int32_t s[4] = {0, 0, 0, 0};
            for (i = 0; i < rows; i++) s[i] = k0 == 0 ? tt_align_s32(b[n + i], eb, ea) : (int32_t)acc[n + i];
            if (rows == 4) {
                tt_dense_dot4(r, K, xx, np, s);
            } else {
                for (i = 0; i < rows; i++)
                    for (j = 0; j < np; j++) s[i] = __smlad((int32_t)tt_ld_s16x2(r + i * K + 2 * j), (int32_t)xx[j], s[i]);
            }
            for (i = 0; i < rows; i++) {
                if (len & 1) s[i] += (int32_t)x[k0 + len - 1] * (int32_t)r[i * K + len - 1];
                acc[n + i] = s[i];
            }
        }
    }
    for (n = 0; n < N; n++) {
        const int32_t v = (int32_t)acc[n];
        const uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
        if (a > m) m = a;
    }
    return m;
}

/* Store v into acc and raise *m to |v|. */
static inline void tt_dense_put(int64_t *acc, int32_t v, uint32_t *m)
{
    const uint32_t a = v < 0 ? 0u - (uint32_t)v : (uint32_t)v;
    *acc = v;
    if (a > *m) *m = a;
}

/* acc[k] = sum_n e[n] w[n][k] in int32, four columns per pass (SMLABB/SMLABT on weight pairs);
 * returns max |acc[k]|. */
static uint32_t tt_dense_bwd_cols_s32(const int8_t *e, const int16_t *w, int32_t K, int32_t N,
                                      int64_t *acc)
{
    uint32_t m = 0;
    int32_t k, n;
    if (N <= 0) { /* no rows: all sums 0 (said apart, else GCC may store the constant 0s with
                   * VFP registers in hard-float builds, which must stay VFP-free) */
        memset(acc, 0, (size_t)K * sizeof *acc);
        return 0;
    }
    for (k = 0; k + 4 <= K; k += 4) {
        int32_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        const int16_t *col = w + k;
        for (n = 0; n < N; n++, col += K) {
            const int32_t en = e[n];
            const int32_t w01 = (int32_t)tt_ld_s16x2(col), w23 = (int32_t)tt_ld_s16x2(col + 2);
            s0 = __smlabb(en, w01, s0);
            s1 = __smlabt(en, w01, s1);
            s2 = __smlabb(en, w23, s2);
            s3 = __smlabt(en, w23, s3);
        }
        tt_dense_put(acc + k, s0, &m);
        tt_dense_put(acc + k + 1, s1, &m);
        tt_dense_put(acc + k + 2, s2, &m);
        tt_dense_put(acc + k + 3, s3, &m);
    }
    for (; k < K; k++) {
        const int16_t *col = w + k;
        int32_t s0 = 0;
        for (n = 0; n < N; n++, col += K) s0 += (int32_t)e[n] * (int32_t)col[0];
        tt_dense_put(acc + k, s0, &m);
    }
    return m;
}
#else
/* acc[n] = align(b[n]) + sum_k x[k] w[n][k] in int32, four products per loop turn;
 * returns max |acc[n]|. */
static uint32_t tt_dense_fwd_rows_s32(const int8_t *x, const int16_t *w, const int32_t *b,
                                      int32_t eb, int32_t ea, int32_t K, int32_t N, int64_t *acc)
{
    uint32_t m = 0;
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int16_t *row = w + n * K;
        int32_t s = tt_align_s32(b[n], eb, ea), a;
        for (k = 0; k + 4 <= K; k += 4) {
            s += (int32_t)x[k] * (int32_t)row[k];
            s += (int32_t)x[k + 1] * (int32_t)row[k + 1];
            s += (int32_t)x[k + 2] * (int32_t)row[k + 2];
            s += (int32_t)x[k + 3] * (int32_t)row[k + 3];
        }
        for (; k < K; k++) s += (int32_t)x[k] * (int32_t)row[k];
        acc[n] = s;
        a = s < 0 ? -s : s; /* |s| < 2^31 by the bound */
        if ((uint32_t)a > m) m = (uint32_t)a;
    }
    return m;
}

/* acc[k] = sum_n e[n] w[n][k] in int32, column by column. */
static uint32_t tt_dense_bwd_cols_s32(const int8_t *e, const int16_t *w, int32_t K, int32_t N,
                                      int64_t *acc)
{
    uint32_t m = 0;
    int32_t n, k;
    for (k = 0; k < K; k++) {
        const int16_t *col = w + k;
        int32_t s = 0;
        uint32_t a;
        for (n = 0; n < N; n++, col += K) s += (int32_t)e[n] * (int32_t)col[0];
        acc[k] = s;
        a = s < 0 ? 0u - (uint32_t)s : (uint32_t)s;
        if (a > m) m = a;
    }
    return m;
}
#endif

int32_t tt_dense_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                        const int32_t *b, int32_t eb, int32_t K, int32_t N,
                        int64_t *scratch, int8_t *y, tt_stats *st)
{
    int32_t n, k;
    const int32_t ea = ex + ew;
    if (K <= TT_DENSE_S32_MAX_K) {
        const uint32_t m = tt_dense_fwd_rows_s32(x, w, b, eb, ea, K, N, scratch);
        return ea + tt_requant_s8_from_s64_max(scratch, N, m, y, st);
    }
    for (n = 0; n < N; n++) {
        const int16_t *row = w + (int64_t)n * K;
        int64_t acc = tt_align(b[n], eb, ea);
        for (k = 0; k < K; k++) acc += (int32_t)x[k] * (int32_t)row[k];
        scratch[n] = acc;
    }
    return ea + tt_requant_s8_from_s64(scratch, N, y, st);
}

int32_t tt_dense_bwd_s8(const int8_t *e, int32_t ee, const int16_t *w, int32_t ew,
                        int32_t K, int32_t N, int64_t *scratch, int8_t *dx, tt_stats *st)
{
    int32_t n, k;
    if (N <= TT_DENSE_S32_MAX_N) {
        const uint32_t m = tt_dense_bwd_cols_s32(e, w, K, N, scratch);
        return ee + ew + tt_requant_s8_from_s64_max(scratch, K, m, dx, st);
    }
    for (k = 0; k < K; k++) { /* column sums in int64 (also keeps 64-bit zero fills, which
                                 * GCC may do with VFP registers, out of hard-float builds) */
        const int16_t *col = w + k;
        int64_t acc = 0;
        for (n = 0; n < N; n++, col += K) acc += (int32_t)e[n] * (int32_t)col[0];
        scratch[k] = acc;
    }
    return ee + ew + tt_requant_s8_from_s64(scratch, K, dx, st);
}

void tt_dense_grad_s32(const int8_t *e, const int8_t *x, int32_t K, int32_t N,
                       int32_t *gw, int32_t *gb)
{
    int32_t n, k;
    for (n = 0; n < N; n++) {
        const int32_t en = e[n];
        int32_t *row = gw + (int64_t)n * K;
        for (k = 0; k < K; k++) row[k] = en * (int32_t)x[k];
        gb[n] = en;
    }
}
