"""Leaky ReLU, reference implementation. Any shape (the op is elementwise).

The negative slope is an integer in Q8, ``slope_q8 = round(alpha * 256)`` in 1..255, fixed
when the layer is built (the float alpha never reaches the device).

Forward:  y = x where x > 0, else (x * slope_q8 + 128) >> 8 (arithmetic shift: the product
          rounded to the nearest integer, ties toward +inf), at exponent ey = ex. Since
          slope_q8 < 256, |y| <= |x|: never saturates (nsat = 0); y is in [-127, 127]
          (int16 activations, the same rule: [-32767, 32767]; |x * slope_q8| < 2^23, int32).
Backward: dx = e where the SAVED OUTPUT y > 0 (equivalently x > 0), else
          (e * slope_q8 + 128) >> 8 with the same tie rule, at exponent edx = ee; nsat = 0,
          no parameters (grads = []).
"""
from __future__ import annotations

import numpy as np


def slope_q8(alpha: float) -> int:
    """The Q8 slope of a float alpha; ValueError outside the representable (0, 1)."""
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 < alpha < 1):
        raise ValueError(f"LeakyReLU alpha must be a number in (0, 1), got {alpha!r}")
    q = int(np.floor(alpha * 256 + 0.5))
    if not 1 <= q <= 255:
        raise ValueError(f"LeakyReLU alpha {alpha!r} rounds to {q}/256: use a value in [1/512, 1 - 1/512)")
    return q


def _scale(v, s):
    return ((v.astype(np.int32) * s + 128) >> 8).astype(v.dtype)


def forward(x, ex, s):
    x = np.asarray(x)
    return np.where(x > 0, x, _scale(x, s)).astype(x.dtype), ex, 0


def backward(e, ee, y, s, need_dx=True):
    """Returns (dx, edx, nsat, grads) with grads = []."""
    if not need_dx:
        return None, 0, 0, []
    e = np.asarray(e)
    return np.where(y > 0, e, _scale(e, s)).astype(e.dtype), ee, 0, []
