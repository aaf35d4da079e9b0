"""Flatten, reference implementation: (H, W, C) (or any shape) -> (H*W*C,) in C order.

Forward:  y = x.reshape(-1), ey = ex. Backward: dx = e.reshape(shape), edx = ee.
No arithmetic at all (nsat = 0, grads = []; int8 or int16, the dtype is kept); channels-last means the flat index of
x[h, w, c] is (h*W + w)*C + c, which is how Dense after a conv sees its input.
"""
from __future__ import annotations

import numpy as np


def forward(x, ex):
    return np.ascontiguousarray(x).reshape(-1).copy(), ex, 0


def backward(e, ee, shape, need_dx=True):
    """Returns (dx, edx, nsat, grads) with dx of the input's ``shape`` and grads = []."""
    if not need_dx:
        return None, 0, 0, []
    return np.asarray(e).reshape(tuple(shape)).copy(), ee, 0, []
