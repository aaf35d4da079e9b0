/** Residual add kernels: portable scalar path. |acc| <= 254, so int32 is exact. */
#include <string.h>
#include "tt_add.h"

int32_t tt_add_fwd_s8(const int8_t *a, int32_t ea, const int8_t *b, int32_t eb, int32_t n,
                      int8_t *y, tt_stats *st)
{
    const int32_t e = ea > eb ? ea : eb;
    int32_t i, s;
    uint32_t m = 0;
    for (i = 0; i < n; i++) {
        int32_t v = (int32_t)(tt_align(a[i], ea, e) + tt_align(b[i], eb, e));
        uint32_t u = v < 0 ? (uint32_t)-v : (uint32_t)v;
        if (u > m) m = u;
    }
    s = tt_requant_shift(m, 8);
    for (i = 0; i < n; i++) {
        int32_t r = tt_rshift_round_s32((int32_t)(tt_align(a[i], ea, e) + tt_align(b[i], eb, e)), s);
        if (r > TT_S8_MAX || r < -TT_S8_MAX) st->saturated++;
        y[i] = tt_sat_s8(r);
    }
    return e + s;
}

int32_t tt_add_bwd_s8(const int8_t *e, int32_t ee, int32_t n, int8_t *da, int8_t *db,
                      tt_stats *st)
{
    (void)st;
    if (n <= 0) return ee;
    if (da && da != e) memmove(da, e, (size_t)n);
    if (db && db != e) memmove(db, e, (size_t)n);
    return ee;
}
