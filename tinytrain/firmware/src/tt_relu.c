/** ReLU kernels: portable scalar path and Cortex-M DSP path (TT_HAVE_DSP), same bits. */
#include "tt_relu.h"
#include "tt_dsp.h"

int32_t tt_relu_fwd_s8(const int8_t *x, int32_t ex, int32_t n, int8_t *y, tt_stats *st)
{
    int32_t i = 0;
    (void)st;
#if TT_HAVE_DSP
    /* four lanes per word: SSUB8(x, 0) sets GE where x >= 0, SEL keeps those lanes, else 0 */
    for (; i + 4 <= n; i += 4) {
        const uint32_t v = tt_ld_s8x4(x + i);
        (void)__ssub8((int32_t)v, 0);
        tt_st_s8x4(y + i, __sel(v, 0));
    }
#endif
    for (; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
    return ex;
}

int32_t tt_relu_bwd_s8(const int8_t *e, int32_t ee, const int8_t *y, int32_t n, int8_t *dx,
                       tt_stats *st)
{
    int32_t i = 0;
    (void)st;
#if TT_HAVE_DSP
    /* SSUB8(0, y) sets GE where y <= 0 (the exact difference, so y = -128 too): SEL gives 0
     * there, e elsewhere */
    for (; i + 4 <= n; i += 4) {
        (void)__ssub8(0, (int32_t)tt_ld_s8x4(y + i));
        tt_st_s8x4(dx + i, __sel(0, tt_ld_s8x4(e + i)));
    }
#endif
    for (; i < n; i++) dx[i] = y[i] > 0 ? e[i] : 0;
    return ee;
}
