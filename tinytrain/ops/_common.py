"""Helpers shared by the reference ops: requantization of wide accumulators to int8."""
from __future__ import annotations

import numpy as np

from ..fixedpoint import maxabs, requant_shift, rshift_round, sat_s8

ALIGN_LIM = 2**30


def requant_s8(acc: np.ndarray, e_acc: int):
    """Dynamic requantization of an int32/int64 tensor to int8.

    s = requant_shift(max|acc|, 8); y = sat_s8(rshift_round(acc, s)); exponent e_acc + s.
    Returns (y int8, exponent, n_saturated). Saturation happens only when rounding reaches 128.
    """
    acc = np.asarray(acc, dtype=np.int64)
    s = requant_shift(maxabs(acc), 8)
    r = rshift_round(acc, s)
    y = sat_s8(r).astype(np.int8)
    nsat = int(np.count_nonzero(r != y))
    return y, e_acc + s, nsat


def align_to(v: np.ndarray, e_from: int, e_to: int) -> np.ndarray:
    """Re-express v (int32, exponent e_from) at exponent e_to as int64: rounding (ties +inf)
    when dropping bits, left shift when adding bits, then clamp to [-2^30, 2^30] so that one
    aligned term plus a bounded sum stays inside int32. Used for biases and residual adds."""
    v = np.asarray(v, dtype=np.int64)
    if e_to >= e_from:
        r = rshift_round(v, min(e_to - e_from, 62))
    else:
        r = np.clip(v, -(2**31), 2**31) << min(e_from - e_to, 31)
    return np.clip(r, -ALIGN_LIM, ALIGN_LIM)
