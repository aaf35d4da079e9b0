"""numba twins of ops/softmax_ce.py and ops/mse.py."""
from __future__ import annotations

import numpy as np
from numba import njit

from tinytrain.fixedpoint import EXP2_NEG_Q15, LOG2_Q16, LOG2E_Q15
from tinytrain.kernels._common import bitwidth, requant_s8, rshift_round

_EXP2 = EXP2_NEG_Q15.astype(np.int64)
_LOG2 = LOG2_Q16.astype(np.int64)
T_MIN = -16 * 256 - 1


@njit(cache=True, inline="always")
def exp2_neg_q15(t):
    u = -t
    n = u >> 8
    if n > 15:
        return np.int64(0)
    return rshift_round(_EXP2[u & 255], n)


@njit(cache=True, inline="always")
def log2_q16(x):
    n = bitwidth(x) - 1
    if n >= 8:
        f = (x >> (n - 8)) & 255
    else:
        f = (x << (8 - n)) & 255
    return (n << 16) + _LOG2[f]


@njit(cache=True)
def softmax_ce(z, ez, label, g, e, stats):
    """z (N,) int8 logits; g (N,) int64 scratch; e (N,) int8 error out.
    Returns (ee, loss_q16, pred)."""
    N = z.size
    zmax = z[0]
    pred = 0
    for i in range(1, N):
        if z[i] > zmax:
            zmax = z[i]
            pred = i
    sh = 7 - ez
    if sh < -24:
        sh = -24
    S = np.int64(0)
    for i in range(N):
        d = np.int64(z[i]) - zmax
        v = d * LOG2E_Q15
        t = rshift_round(v, sh) if sh >= 0 else v << (-sh)
        if t < T_MIN:
            t = T_MIN
        p = exp2_neg_q15(t)
        g[i] = p
        S += p
    for i in range(N):
        g[i] = (g[i] << 15) // S
    pc = g[label]
    g[label] -= 32768
    ee = -15 + requant_s8(g, e, stats)
    loss = (15 << 16) - log2_q16(pc if pc > 1 else 1)
    return ee, loss, pred


@njit(cache=True)
def mse(y, ey, t, et, g, e, stats):
    """Returns (ee, loss_sum_sq, loss_exp)."""
    emin = ey if ey < et else et
    L = np.int64(0)
    for i in range(y.size):
        d = (np.int64(y[i]) << (ey - emin)) - (np.int64(t[i]) << (et - emin))
        g[i] = d
        L += d * d
    return emin + requant_s8(g, e, stats), L, 2 * emin
