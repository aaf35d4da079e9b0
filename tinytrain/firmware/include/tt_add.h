/** Residual add kernels (see tinytrain/ops/add.py for the exact arithmetic). */
#ifndef TT_ADD_H
#define TT_ADD_H

#include <stdint.h>
#include "tt_fixedpoint.h"

#ifdef __cplusplus
extern "C" {
#endif

/** No scratch: the forward makes two passes (max |acc|, then round). */
#define TT_ADD_BUFFER_SIZE(n) 0

/** y[n] = requant_s8(align(a, ea, e) + align(b, eb, e), e), e = max(ea, eb); returns ey.
 * y may alias a or b. */
int32_t tt_add_fwd_s8(const int8_t *a, int32_t ea, const int8_t *b, int32_t eb, int32_t n,
                      int8_t *y, tt_stats *st);

/** da[n] = db[n] = e[n]; returns ee. Either output may be NULL (not needed) or alias e. */
int32_t tt_add_bwd_s8(const int8_t *e, int32_t ee, int32_t n, int8_t *da, int8_t *db,
                      tt_stats *st);

#ifdef __cplusplus
}
#endif

#endif /* TT_ADD_H */
