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
    """z (N,) int8 (or int16) logits; g (N,) int64 scratch; e (N,) int8 (int16) error out.
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
        # |v| < 2^24 (int8 logits) or 2^32 (int16): a shift of 62 or more rounds v to 0, as 62 does
        t = rshift_round(v, sh if sh < 62 else 62) if sh >= 0 else v << (-sh)
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


#: LS, the loss-scale constants train_run reads (data, not literals: one compiled loop for
#: every setting): [mode (1 global, 2 static), growth_factor, backoff_factor, growth_interval,
#: min_scale, max_scale]
LS_MODES = {"global": 1, "static": 2}


def ls_constants(ls) -> np.ndarray:
    return np.array([LS_MODES.get(ls.mode, 0), ls.growth_factor, ls.backoff_factor, ls.growth_interval,
                     ls.min_scale, ls.max_scale], np.int64)


@njit(cache=True)
def loss_scale(g, eg, e, SC, LS, stats):
    """numba twin of graph/loss_scale.quantize + step: the head error g (int64, at eg) into e
    at exponent -SC[0], the scaler state SC advanced. Returns (ee, skip)."""
    E = SC[0]
    s = -E - eg
    if s > 62:
        s = 62
    nsat = 0
    for i in range(g.size):
        v = g[i]
        if s >= 0:
            r = rshift_round(v, s)
        elif v > 127:
            r = np.int64(128)
        elif v < -127:
            r = np.int64(-128)
        else:
            r = v << (-s)
        y = r
        if y > 127:
            y = 127
        elif y < -127:
            y = -127
        if y != r:
            nsat += 1
        e[i] = y
    stats[0] += nsat
    if LS[0] == 2:
        if nsat:
            SC[2] += 1
        return -E, False
    if nsat:
        E -= LS[2]
        SC[0] = E if E > LS[4] else LS[4]
        SC[1] = 0
        SC[2] += 1
        return -SC[0], True
    SC[1] += 1
    if SC[1] >= LS[3]:
        up = E + LS[1]
        SC[0] = up if up < LS[5] else LS[5]
        SC[1] = 0
    return -E, False
