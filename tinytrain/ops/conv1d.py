"""Conv1d layer, reference implementation: Conv2d with H = KH = 1 (same arithmetic).

Shapes: x (L, Cin) int8 at ex; w (Cout, K, Cin) int16 at ew; b (Cout,) int32 at eb; stride s;
zero padding (left, right) or "valid" / "same" (same: OL = ceil(L / s), the extra pad on the
right). Output (OL, Cout), OL = (L + left + right - K) // s + 1. xp is x zero-padded.

Forward:  acc[o, co] = sum_{k, ci} xp[o*s + k, ci] * w[co, k, ci] + align(b[co], eb, ex + ew)
          y, ey = requant_s8(acc, ex + ew)                       (int64, exact)
Backward (pre-update weights, dx first):
          dxp[o*s + k, ci] = sum_{o, co, k} e[o, co] * w[co, k, ci] (int64), cropped to (L, Cin)
          -> requant_s8(., ee + ew)
          gw[co, k, ci] = sum_o e[o, co] * xp[o*s + k, ci]   at ee + ex  (int32)
          gb[co]        = sum_o e[o, co]                     at ee       (int32)
Bounds: as Conv2d (int16 activations too: ops/conv2d.py, the shift over OL positions). |acc| <= K*Cin * 127*32767 + 2^30 in int64; gw sums OL terms of
|e*x| <= 127*127 and fits int32 iff OL <= 133144 (``geometry`` raises ValueError otherwise).
"""
from __future__ import annotations

from tinytrain.ops import conv2d


def geometry(L, K, stride=1, padding=(0, 0)):
    """Resolve the static configuration: returns (OL, stride, (left, right))."""
    _, OL, (_, s), (_, _, pl, pr) = conv2d.geometry(1, L, 1, K, *_as2d(stride, padding), "conv1d")
    return OL, s, (pl, pr)


def _as2d(stride, padding):
    """The Conv2d (stride, padding) of this Conv1d: H = 1, no vertical stride or padding."""
    return (1, int(stride)), padding if isinstance(padding, str) else (0, 0, *padding)


def forward_acc(x, w, stride=1, padding=(0, 0)):
    """int64 (OL, Cout) accumulator without bias."""
    return conv2d.forward_acc(x[None], w[:, None], *_as2d(stride, padding))[0]


def backward_acc(e, w, x_shape, stride=1, padding=(0, 0)):
    """int64 (L, Cin) dx accumulator, adjoint of forward_acc."""
    return conv2d.backward_acc(e[None], w[:, None], (1, *x_shape), *_as2d(stride, padding))[0]


def forward(x, ex, w, ew, b, eb, stride=1, padding=(0, 0)):
    """Returns (y (OL, Cout) int8, ey, nsat)."""
    y, ey, nsat = conv2d.forward(x[None], ex, w[:, None], ew, b, eb, *_as2d(stride, padding))
    return y[0], ey, nsat


def backward(e, ee, x, ex, w, ew, stride=1, padding=(0, 0), need_dx=True):
    """Returns (dx, edx, nsat, grads) with grads = [(gw (Cout, K, Cin), ee+ex), (gb, ee)]."""
    dx, edx, nsat, grads = conv2d.backward(e[None], ee, x[None], ex, w[:, None], ew,
                                           *_as2d(stride, padding), need_dx=need_dx)
    (gw, egw), gb = grads
    return (None if dx is None else dx[0]), edx, nsat, [(gw[:, 0], egw), gb]
