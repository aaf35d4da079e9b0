/* The optimizer and step of one drawn SGD kernel case, shared by the kernel images' mains
 * (tests/c/sgd_*_main.c): lr m_t 2^-k, momentum, decay, 1/batch as the case gives them, a
 * constant schedule, the PRNG and statistics the caller owns. */
#ifndef TT_TEST_SGD_H
#define TT_TEST_SGD_H

#include <stdint.h>
#include <string.h>

#include "tt_sgd.h"

static const int32_t tt_test_cosine[65];

static void tt_test_sgd_setup(tt_sgd *o, tt_sgd_step *u, tt_stats *st, uint32_t *prng, int32_t m_t, int32_t k,
                              int32_t mu_m, int32_t mu_k, int32_t wd_m, int32_t wd_k, int32_t ib_m, int32_t ib_k,
                              int32_t batch, int32_t sr)
{
    memset(o, 0, sizeof *o);
    memset(st, 0, sizeof *st);
    o->m = m_t; o->k = k; o->mu_m = mu_m; o->mu_k = mu_k; o->wd_m = wd_m; o->wd_k = wd_k;
    o->ib_m = ib_m; o->ib_k = ib_k; o->batch_size = batch; o->sr = sr; o->cosine = tt_test_cosine;
    o->gamma_q15 = 32768; o->step_size = 1; o->total_steps = 1;
    *prng = 987654321u;
    u->cfg = o; u->m_t = m_t; u->prng = prng; u->stats = st;
}

#endif
