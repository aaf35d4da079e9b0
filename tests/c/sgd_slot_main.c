/* The end-of-batch apply of int8 and int16 weights with an int8 or int16 velocity slot (policy
 * "momentum": "int8" | "int16") on a board, for tests/test_sgd_slot_qemu.py: runs every case of
 * the generated slot_cases.h through tt_sgd_apply_accumulated_s{8,16}_v{8,16} and prints the
 * saturations, the PRNG state, weights, accumulators and velocities as one line of decimal
 * integers on the UART. */
#include <stdint.h>
#include <string.h>

#include "tt_sgd.h"
#include "tt_port.h"

#include "slot_cases.h"
#include "tt_test_sgd.h"
#include "tt_test_uart.h"

static int32_t A[SLOT_MAX_N];
static int16_t w16[SLOT_MAX_N], V16[SLOT_MAX_N];
static int8_t w8[SLOT_MAX_N], V8[SLOT_MAX_N];

int main(void)
{
    int32_t k, i;
    tt_port_init();
    for (k = 0; k < SLOT_NCASES; k++) {
        const slot_case *t = &slot_cases[k];
        tt_sgd o;
        tt_stats st;
        uint32_t prng;
        tt_sgd_step u;
        tt_test_sgd_setup(&o, &u, &st, &prng, 983, 20, t->mu_m, t->mu_k, t->wd_m, t->wd_k, t->ib_m, t->ib_k,
                          t->batch, t->sr);
        for (i = 0; i < t->n; i++) {
            A[i] = t->A[i];
            w8[i] = (int8_t)t->w[i]; w16[i] = (int16_t)t->w[i];
            V8[i] = (int8_t)t->V[i]; V16[i] = (int16_t)t->V[i];
        }
        if (t->w8 && t->v8) tt_sgd_apply_accumulated_s8_v8(&u, w8, A, V8, t->n);
        else if (t->w8) tt_sgd_apply_accumulated_s8_v16(&u, w8, A, V16, t->n);
        else if (t->v8) tt_sgd_apply_accumulated_s16_v8(&u, w16, A, V8, t->n);
        else tt_sgd_apply_accumulated_s16_v16(&u, w16, A, V16, t->n);
        put_i32((int32_t)st.saturated);
        put_i32((int32_t)prng);
        for (i = 0; i < t->n; i++) put_i32(t->w8 ? w8[i] : w16[i]);
        for (i = 0; i < t->n; i++) put_i32(A[i]);
        for (i = 0; i < t->n; i++) put_i32(t->v8 ? V8[i] : V16[i]);
        tt_port_puts("\r\n");
    }
    tt_port_puts("END\r\n");
    return 0;
}
