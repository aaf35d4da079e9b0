/* Batch norm kernels on a board, for tests/test_bn_kernel_qemu.py: runs every case of the
 * generated bn_cases.h (train forward, backward, gradients from the backward's sums) and prints
 * each result as a line of decimal integers on the UART. */
#include <stdint.h>
#include <string.h>

#include "tt_batchnorm.h"
#include "tt_port.h"

#include "bn_cases.h"
#include "tt_test_uart.h"

static int64_t scratch[BN_MAX_SCRATCH];
static int32_t saved[5 * BN_MAX_C + 1], rm[BN_MAX_C], rv[BN_MAX_C], gg[BN_MAX_C], gb[BN_MAX_C];
static int8_t y[BN_MAX_N], dx[BN_MAX_N];

int main(void)
{
    int32_t k, i;
    tt_port_init();
    for (k = 0; k < BN_NCASES; k++) {
        const bn_case *t = &bn_cases[k];
        const int32_t n = t->P * t->C;
        tt_stats st = {0};
        tt_ctx ctx = {scratch, &st};
        tt_batchnorm_params p;
        int32_t ey, edx;
        uint32_t nsat;
        memcpy(rm, t->rm, 4 * (size_t)t->C);
        memcpy(rv, t->rv, 4 * (size_t)t->C);
        p.P = t->P; p.C = t->C; p.gamma = t->gamma; p.e_g = t->e_g; p.beta = t->beta; p.e_b = t->e_b;
        p.rmean = rm; p.e_rm = t->e_rm; p.rvar = rv; p.e_rv = t->e_rv; p.eps_m = t->eps_m;
        p.eps_k = t->eps_k; p.mom_k = t->mom_k; p.saved = saved;
        ey = tt_batchnorm_fwd_s8(&ctx, &p, t->x, t->ex, y);
        nsat = st.saturated;
        edx = tt_batchnorm_bwd_s8(&ctx, &p, t->e, t->ee, t->x, dx);
        tt_batchnorm_grad_saved_s32(&p, gg, gb);
        put_i32(ey); put_i32((int32_t)nsat); put_i32(edx); put_i32((int32_t)(st.saturated - nsat));
        for (i = 0; i < n; i++) put_i32(y[i]);
        for (i = 0; i < n; i++) put_i32(dx[i]);
        for (i = 0; i < t->C; i++) put_i32(rm[i]);
        for (i = 0; i < t->C; i++) put_i32(rv[i]);
        for (i = 0; i < 3 * t->C; i++) put_i32(saved[i]);
        for (i = 0; i < t->C; i++) put_i32(gg[i]);
        for (i = 0; i < t->C; i++) put_i32(gb[i]);
        tt_port_puts("\r\n");
    }
    tt_port_puts("END\r\n");
    return 0;
}
