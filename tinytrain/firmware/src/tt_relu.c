/** ReLU kernels: portable scalar path. */
#include "tt_relu.h"

int32_t tt_relu_fwd_s8(const int8_t *x, int32_t ex, int32_t n, int8_t *y, tt_stats *st)
{
    int32_t i;
    (void)st;
    for (i = 0; i < n; i++) y[i] = x[i] > 0 ? x[i] : 0;
    return ex;
}

int32_t tt_relu_bwd_s8(const int8_t *e, int32_t ee, const int8_t *y, int32_t n, int8_t *dx,
                       tt_stats *st)
{
    int32_t i;
    (void)st;
    for (i = 0; i < n; i++) dx[i] = y[i] > 0 ? e[i] : 0;
    return ee;
}
