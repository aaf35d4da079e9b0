"""numba twins of tinytrain.fixedpoint and ops/_common (scalar, int64 arithmetic)."""
from __future__ import annotations

import numpy as np
from numba import njit

ALIGN_LIM = 1 << 30


@njit(cache=True, inline="always")
def rshift_round(x, s):
    if s == 0:
        return x
    return (x >> s) + ((x >> (s - 1)) & 1)


@njit(cache=True, inline="always")
def bitwidth(v):
    n = 0
    while v > 0:
        v >>= 1
        n += 1
    return n


@njit(cache=True, inline="always")
def requant_shift(max_abs, bits):
    s = bitwidth(max_abs) - (bits - 1)
    return s if s > 0 else 0


@njit(cache=True, inline="always")
def sat(x, lo, hi):
    return lo if x < lo else hi if x > hi else x


@njit(cache=True, inline="always")
def align(v, e_from, e_to):
    v = np.int64(v)
    if e_to >= e_from:
        d = e_to - e_from
        r = rshift_round(v, d if d < 62 else 62)
    else:
        d = e_from - e_to
        r = v << (d if d < 31 else 31)
    return sat(r, -ALIGN_LIM, ALIGN_LIM)


@njit(cache=True)
def requant_s8(acc, y, stats):
    """acc: int64 array (flat), y: int8 array (flat) -> shift s; stats[0] += saturations.
    An int16 y (int16 activations and errors) takes the same rule at 16 bits (+-32767): the
    width is the output's (ops/_common.requant)."""
    bits = y.itemsize * 8
    qmax = (1 << (bits - 1)) - 1
    m = np.int64(0)
    for i in range(acc.size):
        a = acc[i]
        if a < 0:
            a = -a
        if a > m:
            m = a
    s = requant_shift(m, bits)
    for i in range(acc.size):
        r = rshift_round(acc[i], s)
        if r > qmax:
            r = qmax
            stats[0] += 1
        elif r < -qmax:
            r = -qmax
            stats[0] += 1
        y[i] = r
    return s
