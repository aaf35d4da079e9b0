"""AvgPool2d (valid padding) and GlobalAvgPool, reference implementation; 1-D signals
(L, C) are H = 1.

Shapes: x (H, W, C) int8 at exponent ex; kernel (kh, kw); stride (sh, sw), default the
kernel; OH = (H - kh) // sh + 1, OW = (W - kw) // sw + 1; y (OH, OW, C). GlobalAvgPool is
AvgPool2d with kernel (H, W), output reshaped to (C,).

Division by the window size P = kh*kw is a multiplier and an exponent, 1/P ~= m * 2^-k:
  * P a power of two: (m, k) = (1, log2 P), exact: only the exponent changes;
  * otherwise (m, k) = fixedpoint.to_mult_shift(1/P) (15 bits: m in [2^14, 2^15), relative
    error <= 2^-15), computed once at build time (``reciprocal``) and passed to the kernels.
Forward:  s[oh, ow, c] = sum_{i<kh, j<kw} x[oh*sh + i, ow*sw + j, c]     (|s| <= 127 P)
          y, ey, nsat = requant_s8(m * s, ex - k)                     (the one rounding)
Backward: dx_acc[h, w, c] = m * sum of e[oh, ow, c] over the windows that cover (h, w)
          (positions no window covers get 0); dx, edx, nsat = requant_s8(dx_acc, ee - k).
          This is the exact transpose of the forward's linear map s -> m*s.
Bounds:   |m * s| < 127 * P * 2^15: int32 only while P <= 516, so the C kernels sum in int32
          (P < 2^24) and multiply in int64. The kernels need no scratch: requant_s8 needs the
          max over all outputs first, so they make two passes (max, then round) and recompute
          the window sums instead of storing them.
No parameters: grads = [].
int16 activations and errors: the same rule on int16 (+-32767, requant with 16 bits); |s| <=
32767 P < 2^39 and |m * s| < 2^54 (int64 sums in the C).
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np

from tinytrain.fixedpoint import to_mult_shift
from tinytrain.ops._common import act_bits, requant
from tinytrain.ops._pool import geometry, window


@lru_cache(maxsize=None)
def reciprocal(P: int) -> tuple[int, int]:
    """(m, k) with 1/P ~= m * 2^-k (see the module docstring). Build time only."""
    P = int(P)
    if P < 1:
        raise ValueError(f"pool window size must be >= 1, got {P}")
    if P & (P - 1) == 0:
        return 1, P.bit_length() - 1
    return to_mult_shift(1.0 / P)


def forward_acc(x, kernel, stride=None):
    """(m * window sums) (OH, OW, C) int64 and its exponent offset -k."""
    kh, kw, sh, sw, OH, OW = geometry(x.shape, kernel, stride)
    m, k = reciprocal(kh * kw)
    s = np.zeros((OH, OW, x.shape[2]), np.int64)
    for i in range(kh):
        for j in range(kw):
            s += window(x, i, j, sh, sw, OH, OW)
    return s * m, -k


def forward(x, ex, kernel, stride=None):
    acc, dk = forward_acc(x, kernel, stride)
    return requant(acc, ex + dk, act_bits(x))


def backward_acc(e, shape, kernel, stride=None):
    """dx_acc (H, W, C) int64 and its exponent offset -k."""
    kh, kw, sh, sw, OH, OW = geometry(shape, kernel, stride)
    m, k = reciprocal(kh * kw)
    acc = np.zeros(tuple(shape), np.int64)
    e64 = e.astype(np.int64)
    for i in range(kh):
        for j in range(kw):
            window(acc, i, j, sh, sw, OH, OW)[...] += e64
    return acc * m, -k


def backward(e, ee, shape, kernel, stride=None, need_dx=True):
    """Returns (dx, edx, nsat, grads); ``shape`` is the input's (H, W, C); grads = []."""
    if not need_dx:
        return None, 0, 0, []
    acc, dk = backward_acc(e, shape, kernel, stride)
    dx, edx, nsat = requant(acc, ee + dk, act_bits(e))
    return dx, edx, nsat, []


def forward1d(x, ex, kernel: int, stride: int | None = None):
    """x (L, C) -> y (OL, C): ``forward`` with H = 1, kernel (1, kernel), stride (1, stride)."""
    y, ey, nsat = forward(x[None], ex, (1, kernel), (1, kernel if stride is None else stride))
    return y[0], ey, nsat


def backward1d(e, ee, L: int, kernel: int, stride: int | None = None, need_dx=True):
    dx, edx, nsat, grads = backward(e[None], ee, (1, L, e.shape[1]), (1, kernel),
                                    (1, kernel if stride is None else stride), need_dx)
    return (None if dx is None else dx[0]), edx, nsat, grads


def global_forward(x, ex):
    """GlobalAvgPool: x (H, W, C) (or (L, C)) -> y (C,) averaged over all positions."""
    x3 = x if x.ndim == 3 else x[None]
    y, ey, nsat = forward(x3, ex, x3.shape[:2])
    return y.reshape(-1), ey, nsat


def global_backward(e, ee, shape, need_dx=True):
    """e (C,) -> dx of ``shape`` ((H, W, C) or (L, C)): m*e[c] everywhere, requantized."""
    shape3 = tuple(shape) if len(shape) == 3 else (1, *shape)
    dx, edx, nsat, grads = backward(e.reshape(1, 1, -1), ee, shape3, shape3[:2], None, need_dx)
    return (None if dx is None else dx.reshape(tuple(shape))), edx, nsat, grads
