"""Scalar helpers the generated simulator calls (numba twins of optim.IntSGD methods)."""
from numba import njit

from .kernels._common import rshift_round


@njit(cache=True)
def lr_mult(m, schedule, gamma_q15, step_size, total_steps, cos, t):
    if schedule == 0:
        return m
    if schedule == 1:
        f = 32768
        for _ in range(t // step_size):
            f = rshift_round(f * gamma_q15, 15)
    else:
        T = total_steps if total_steps > 1 else 1
        j = (64 * t) // T
        f = cos[64 if j > 64 else j]
    return rshift_round(m * f, 15)
