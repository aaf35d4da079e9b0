"""Integer mean squared error head (regression).

Prediction y (N,) int8 at ey, target t (N,) int8 at et. Both are aligned to e = min(ey, et)
by exact left shifts (int32): diff = (y << (ey - e)) - (t << (et - e)).
Gradient: g = diff at exponent e (the derivative of 1/2 * sum diff^2; the constant 2/N of the
mean is folded into the learning rate), e_out, ee = requant_s8(g, e).
loss_q16 = sum(diff^2) at exponent 2e, reported as sum over outputs (float only in reports).
"""
from __future__ import annotations

import numpy as np

from tinytrain.ops._common import requant_s8


def forward_backward(y, ey, t, et):
    e = min(ey, et)
    diff = (y.astype(np.int64) << (ey - e)) - (t.astype(np.int64) << (et - e))
    err, ee, nsat = requant_s8(diff, e)
    return err, ee, nsat, int((diff * diff).sum()), 2 * e


def error(y, ey, t, et):
    """The loss error (diff, int64) and its exponent before requantization (graph/loss_scale.py)."""
    e = min(ey, et)
    return (y.astype(np.int64) << (ey - e)) - (t.astype(np.int64) << (et - e)), e
