/* Exhaustive check of tt_batchnorm.c's bn_isqrt_hi: floor(sqrt(x)) for every x in [2^30, 2^32),
 * against the exact integer condition s^2 <= x < (s + 1)^2 (about a minute on a host):
 *
 *   gcc -O2 -Itinytrain/firmware/include bench/dev/bn_isqrt_check.c tinytrain/firmware/src/tt_fixedpoint.c \
 *       -o /tmp/bn_isqrt_check && /tmp/bn_isqrt_check
 */
#include <stdio.h>
#include "../../tinytrain/firmware/src/tt_batchnorm.c"

int main(void)
{
    uint64_t x;
    for (x = (uint64_t)1 << 30; x < (uint64_t)1 << 32; x++) {
        const uint64_t s = bn_isqrt_hi((uint32_t)x);
        if (s * s > x || (s + 1) * (s + 1) <= x) {
            printf("bn_isqrt_hi(%llu) = %llu: wrong\n", (unsigned long long)x, (unsigned long long)s);
            return 1;
        }
    }
    printf("bn_isqrt_hi: every x in [2^30, 2^32) exact\n");
    return 0;
}
