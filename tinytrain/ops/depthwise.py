"""DepthwiseConv2d layer (channel multiplier 1), reference implementation.

Shapes: x (H, W, C) int8 at ex; w (KH, KW, C) int16 at ew; b (C,) int32 at eb; stride and
padding exactly as Conv2d (``conv2d.geometry``: "valid", "same" or (top, bottom, left, right)).
Output (OH, OW, C). xp is x zero-padded and p = (oh*sh + kh, ow*sw + kw).

Forward:  acc[oh, ow, c] = sum_{kh, kw} xp[p, c] * w[kh, kw, c] + align(b[c], eb, ex + ew)
          y, ey = requant_s8(acc, ex + ew)                  (int64, exact; one shift per tensor)
Backward (pre-update weights, dx first):
          dxp[p, c] = sum_{oh, ow, kh, kw} e[oh, ow, c] * w[kh, kw, c]  (int64), cropped to
          (H, W, C) -> requant_s8(., ee + ew)
          gw[kh, kw, c] = sum_{oh, ow} e[oh, ow, c] * xp[p, c]   at ee + ex  (int32)
          gb[c]         = sum_{oh, ow} e[oh, ow, c]              at ee       (int32)
Bounds: |acc| <= KH*KW * 127*32767 + 2^30 (forward), KH*KW * 127*32767 (dx), int64 everywhere.
gw sums OH*OW terms of |e*x| <= 127*127, so it fits int32 iff OH*OW <= 133144
(conv2d.GRAD_MAX_POSITIONS); ``conv2d.geometry`` rejects larger outputs with ValueError.
int16 activations and errors: as ops/conv2d.py (requant to 16 bits, gw rounded by
conv2d.grad_shift(OH*OW) at ee + ex + that shift).
"""
from __future__ import annotations

import numpy as np

from tinytrain.ops._common import act_bits, align, requant
from tinytrain.ops.conv2d import geometry, round_grad, windows


def forward_acc(x, w, stride=(1, 1), padding=(0, 0, 0, 0)):
    """The linear part of forward: int64 (OH, OW, C) accumulator without bias."""
    H, W, C = x.shape
    KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding, "depthwise")
    xp = np.pad(x.astype(np.int64), ((pt, pb), (pl, pr), (0, 0)))
    acc = np.zeros((OH, OW, C), np.int64)
    w64 = w.astype(np.int64)
    for kh, kw, xs in windows(xp, KH, KW, sh, sw, OH, OW):
        acc += xs * w64[kh, kw]
    return acc


def backward_acc(e, w, x_shape, stride=(1, 1), padding=(0, 0, 0, 0)):
    """The transposed linear part: int64 (H, W, C) dx accumulator, adjoint of forward_acc."""
    H, W, C = x_shape
    KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding, "depthwise")
    dxp = np.zeros((H + pt + pb, W + pl + pr, C), np.int64)
    e64, w64 = e.astype(np.int64), w.astype(np.int64)
    for kh, kw, ds in windows(dxp, KH, KW, sh, sw, OH, OW):
        ds += e64 * w64[kh, kw]
    return dxp[pt : pt + H, pl : pl + W]


def forward(x, ex, w, ew, b, eb, stride=(1, 1), padding=(0, 0, 0, 0)):
    """Returns (y (OH, OW, C) int8, ey, nsat)."""
    acc = forward_acc(x, w, stride, padding) + align(b, eb, ex + ew)
    return requant(acc, ex + ew, act_bits(x))


def backward(e, ee, x, ex, w, ew, stride=(1, 1), padding=(0, 0, 0, 0), need_dx=True):
    """Returns (dx, edx, nsat, grads) with grads = [(gw, ee+ex), (gb, ee)]."""
    H, W, C = x.shape
    KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding, "depthwise")
    xp = np.pad(x.astype(np.int64), ((pt, pb), (pl, pr), (0, 0)))
    e64 = e.astype(np.int64)
    gw = np.zeros(w.shape, np.int64)
    for kh, kw, xs in windows(xp, KH, KW, sh, sw, OH, OW):
        gw[kh, kw] = (e64 * xs).sum(axis=(0, 1))
    gw, g = round_grad(gw, OH * OW, act_bits(e))
    grads = [(gw, ee + ex + g), (e64.sum(axis=(0, 1)).astype(np.int32), ee)]
    if not need_dx:
        return None, 0, 0, grads
    dx, edx, nsat = requant(backward_acc(e, w, x.shape, stride, padding), ee + ew, act_bits(e))
    return dx, edx, nsat, grads
