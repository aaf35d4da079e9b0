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
#include "tt_test_uart.h"

static int32_t w[SGD_MAX_N], A[SGD_MAX_N], V[SGD_MAX_N];
static int16_t cp[SGD_MAX_N + 3];
static const int32_t cosine[65];

int main(void)
{
    int32_t k, i;
    tt_port_init();
    for (k = 0; k < SGD_NCASES; k++) {
        const sgd_case *t = &sgd_cases[k];
        tt_sgd o;
        tt_stats st;
        uint32_t prng = 987654321u;
        tt_sgd_step u;
        int16_t *c = cp + t->off;
        memset(&o, 0, sizeof o);
        memset(&st, 0, sizeof st);
        o.m = 983; o.k = 20; o.mu_m = t->mu_m; o.mu_k = t->mu_k; o.wd_m = t->wd_m; o.wd_k = t->wd_k;
        o.ib_m = t->ib_m; o.ib_k = t->ib_k; o.batch_size = t->batch; o.sr = t->sr; o.cosine = cosine;
        o.gamma_q15 = 32768; o.step_size = 1; o.total_steps = 1;
        u.cfg = &o; u.m_t = 983; u.prng = &prng; u.stats = &st;
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
