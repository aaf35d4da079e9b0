/* The end-of-batch apply of int32 masters with their int16 copy on a board, for
 * tests/test_sgd_apply_qemu.py: runs every case of the generated sgd_cases.h through
 * tt_sgd_apply_accumulated_s32_copy (the copy at an even or odd int16 offset: off 0 or 1) or, for
 * off 2, tt_sgd_apply_accumulated_s32 (no copy), and prints the
 * saturations, the PRNG state, masters, copy, accumulators and velocities as one line of decimal
 * integers on the UART. */
#include <stdint.h>
#include <string.h>

#include "tt_sgd.h"
#include "tt_port.h"

#include "sgd_cases.h"
#include "tt_test_sgd.h"
#include "tt_test_uart.h"

static int32_t w[SGD_MAX_N], A[SGD_MAX_N], V[SGD_MAX_N];
static int16_t cp[SGD_MAX_N + 3];

int main(void)
{
    int32_t k, i;
    tt_port_init();
    for (k = 0; k < SGD_NCASES; k++) {
        const sgd_case *t = &sgd_cases[k];
        tt_sgd o;
        tt_stats st;
        uint32_t prng;
        tt_sgd_step u;
        int16_t *c = cp + t->off;
        tt_test_sgd_setup(&o, &u, &st, &prng, 983, 20, t->mu_m, t->mu_k, t->wd_m, t->wd_k, t->ib_m, t->ib_k,
                          t->batch, t->sr);
        memcpy(w, t->w, 4 * (size_t)t->n);
        memcpy(A, t->A, 4 * (size_t)t->n);
        memcpy(V, t->V, 4 * (size_t)t->n);
        if (t->off == 2) tt_sgd_apply_accumulated_s32(&u, w, A, t->mu_m ? V : 0, t->n);
        else tt_sgd_apply_accumulated_s32_copy(&u, w, c, A, t->mu_m ? V : 0, t->n);
        put_i32((int32_t)st.saturated);
        put_i32((int32_t)prng);
        for (i = 0; i < t->n; i++) put_i32(w[i]);
        for (i = 0; i < t->n && t->off != 2; i++) put_i32(c[i]);
        for (i = 0; i < t->n; i++) put_i32(A[i]);
        for (i = 0; i < t->n; i++) put_i32(V[i]);
        tt_port_puts("\r\n");
    }
    tt_port_puts("END\r\n");
    return 0;
}
