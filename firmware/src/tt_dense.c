/** Dense layer kernels: portable scalar path. */
#include "tt_dense.h"

int32_t tt_dense_fwd_s8(const int8_t *x, int32_t ex, const int16_t *w, int32_t ew,
                        const int32_t *b, int32_t eb, int32_t K, int32_t N,
                        int64_t *scratch, int8_t *y, tt_stats *st)
{
    int32_t n, k;
    const int32_t ea = ex + ew;
    if (K <= TT_DENSE_S32_MAX_K) {
        /* |bias| <= 2^30 after alignment and K * 127 * 32767 < 2^30: int32 cannot overflow */
        for (n = 0; n < N; n++) {
            const int16_t *row = w + (int64_t)n * K;
            int32_t acc = (int32_t)tt_align(b[n], eb, ea);
            for (k = 0; k < K; k++) acc += (int32_t)x[k] * (int32_t)row[k];
            scratch[n] = acc;
        }
        return ea + tt_requant_s8_from_s64(scratch, N, y, st);
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
        /* N * 127 * 32767 < 2^31: an int32 column sum cannot overflow */
        for (k = 0; k < K; k++) {
            int32_t acc = 0;
            for (n = 0; n < N; n++) acc += (int32_t)e[n] * (int32_t)w[(int64_t)n * K + k];
            scratch[k] = acc;
        }
        return ee + ew + tt_requant_s8_from_s64(scratch, K, dx, st);
    }
    for (k = 0; k < K; k++) scratch[k] = 0;
    for (n = 0; n < N; n++) {
        const int16_t *row = w + (int64_t)n * K;
        const int32_t en = e[n];
        if (en == 0) continue;
        for (k = 0; k < K; k++) scratch[k] += en * (int32_t)row[k];
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
