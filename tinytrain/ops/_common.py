"""Helpers shared by the reference ops: requantization of wide accumulators to int8 (or int16,
the precision policy's ``"activations": "int16"``)."""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import ALIGN_LIM, align, maxabs, requant_shift, rshift_round, sat_s8, sat_s16  # noqa: F401

#: the activation / error dtype of each width
ACT_DTYPE = {8: np.int8, 16: np.int16}


def requant(acc: np.ndarray, e_acc: int, bits: int = 8):
    """Dynamic requantization of an int32/int64 tensor to int8 (bits 8) or int16 (bits 16).

    s = requant_shift(max|acc|, bits); y = sat(rshift_round(acc, s)) to +-(2^(bits-1) - 1);
    exponent e_acc + s. Returns (y, exponent, n_saturated). Saturation happens only when
    rounding reaches 2^(bits-1).
    """
    acc = np.asarray(acc, dtype=np.int64)
    s = requant_shift(maxabs(acc), bits)
    r = rshift_round(acc, s)
    y = (sat_s8(r) if bits == 8 else sat_s16(r)).astype(ACT_DTYPE[bits])
    nsat = int(np.count_nonzero(r != y))
    return y, e_acc + s, nsat


def requant_s8(acc: np.ndarray, e_acc: int):
    """requant to int8: (y int8, exponent, n_saturated)."""
    return requant(acc, e_acc, 8)


def act_bits(a) -> int:
    """Bits of an activation or error array (int8: 8, int16: 16)."""
    return 8 * np.asarray(a).dtype.itemsize
