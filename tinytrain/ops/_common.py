"""Helpers shared by the reference ops: requantization of wide accumulators to int8."""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import ALIGN_LIM, align, maxabs, requant_shift, rshift_round, sat_s8  # noqa: F401


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
