/* A Dense layer's waiting weight accumulate and its end-of-step apply on a board, for
 * tests/test_sgd_apply_qemu.py: every case of the generated kept_cases.h runs
 * tt_sgd_dense_accumulate_s32 (keep in state 1: the accumulate waits; state 0 when the case's
 * accumulators hold sums) then
 * tt_sgd_dense_apply_kept_s32, and prints the keep state after the accumulate, the saturations,
 * the PRNG state, masters, copy, accumulators and velocities as one line of decimal integers. */
#include <stdint.h>
#include <string.h>

#include "tt_sgd.h"
#include "tt_port.h"

#include "kept_cases.h"
#include "tt_test_sgd.h"
#include "tt_test_uart.h"

static int32_t w[KEPT_MAX_N], A[KEPT_MAX_N], V[KEPT_MAX_N];
static int16_t cp[KEPT_MAX_N];
static int8_t ek[KEPT_MAX_NN];

int main(void)
{
    int32_t c, i;
    tt_port_init();
    for (c = 0; c < KEPT_NCASES; c++) {
        const kept_case *t = &kept_cases[c];
        const int32_t n = t->K * t->N;
        tt_sgd o;
        tt_stats st;
        uint32_t prng;
        tt_sgd_step u;
        tt_sgd_dense_keep keep = {ek, 0, 0, 0, 1};
        keep.state = t->A ? 0 : 1; /* accumulators that hold sums: not known 0 */
        tt_sgd_dense_accum_params p;
        tt_test_sgd_setup(&o, &u, &st, &prng, t->m_t, t->k, t->mu_m, t->mu_k, t->wd_m, t->wd_k, 0, 0, 1, t->sr);
        p.K = t->K; p.N = t->N; p.wa = A; p.ew = t->ew; p.ba = 0; p.eb = 0; p.keep = &keep;
        memcpy(w, t->w, 4 * (size_t)n);
        if (t->A) memcpy(A, t->A, 4 * (size_t)n);
        else memset(A, 0, 4 * (size_t)n);
        memcpy(V, t->V, 4 * (size_t)n);
        tt_sgd_dense_accumulate_s32(&u, &p, t->e, t->ee, t->x, t->ex);
        put_i32(keep.state);
        tt_sgd_dense_apply_kept_s32(&u, &p, w, cp, t->mu_m ? V : 0);
        put_i32((int32_t)st.saturated);
        put_i32((int32_t)prng);
        for (i = 0; i < n; i++) put_i32(w[i]);
        for (i = 0; i < n; i++) put_i32(cp[i]);
        for (i = 0; i < n; i++) put_i32(A[i]);
        for (i = 0; i < n; i++) put_i32(V[i]);
        put_i32(keep.state);
        tt_port_puts("\r\n");
    }
    tt_port_puts("END\r\n");
    return 0;
}
