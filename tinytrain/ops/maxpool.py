"""MaxPool2d (valid padding), reference implementation; 1-D signals (L, C) are H = 1.

Shapes: x (H, W, C) int8 at exponent ex; kernel (kh, kw); stride (sh, sw), default the
kernel; OH = (H - kh) // sh + 1, OW = (W - kw) // sw + 1; y (OH, OW, C).

Forward:  y[oh, ow, c] = max over i < kh, j < kw of x[oh*sh + i, ow*sw + j, c]; ey = ex.
          Exact, nsat = 0.
Argmax:   the FIRST maximum in row-major window order (i, then j), i.e. a strict ``>`` scan.
          Nothing is saved: backward RECOMPUTES it from the saved input x (when ReLU precedes
          the pool, x is ReLU's saved output, so this costs no RAM; indices would cost
          OH*OW*C more values).
Backward: dx_acc[h, w, c] = sum of e[oh, ow, c] over the windows whose argmax is (h, w)
          (exact; |dx_acc| <= 127 * ceil(kh/sh) * ceil(kw/sw), int32 in C);
          dx, edx, nsat = requant_s8(dx_acc, ee). Positions no window selects get 0.
          Without overlap (sh >= kh and sw >= kw) every |dx_acc| <= 127, the requant shift is
          0 and dx is e routed to the argmaxes at exponent ee: kernels write it directly and
          need no scratch. With overlap the shift is 0 unless routed errors pile up past 127.
No parameters: grads = [].
int16 activations and errors: the same rule on int16 (+-32767, requant with 16 bits).
"""
from __future__ import annotations

import numpy as np

from tinytrain.ops._common import act_bits, requant
from tinytrain.ops._pool import geometry, window


def argmax(x, kernel, stride=None):
    """(max, idx): the window maxima (OH, OW, C) (x's dtype) and the flat input index h*W + w of
    each window's first maximum (OH, OW, C) int64."""
    H, W, C = x.shape
    kh, kw, sh, sw, OH, OW = geometry(x.shape, kernel, stride)
    oh = np.arange(OH, dtype=np.int64)[:, None, None]
    ow = np.arange(OW, dtype=np.int64)[None, :, None]
    best = idx = None
    for i in range(kh):
        for j in range(kw):
            v = window(x, i, j, sh, sw, OH, OW)
            pos = np.broadcast_to((oh * sh + i) * W + ow * sw + j, v.shape)
            if best is None:
                best, idx = v.copy(), pos.copy()
            else:
                upd = v > best
                best = np.where(upd, v, best)
                idx = np.where(upd, pos, idx)
    return best.astype(x.dtype), idx


def forward(x, ex, kernel, stride=None):
    y, _ = argmax(x, kernel, stride)
    return y, ex, 0


def backward_acc(e, x, kernel, stride=None):
    """dx_acc (H, W, C) int64: each error added at its window's argmax."""
    H, W, C = x.shape
    _, idx = argmax(x, kernel, stride)
    acc = np.zeros(H * W * C, np.int64)
    np.add.at(acc, (idx * C + np.arange(C)).reshape(-1), e.astype(np.int64).reshape(-1))
    return acc.reshape(H, W, C)


def backward(e, ee, x, kernel, stride=None, need_dx=True):
    """Returns (dx, edx, nsat, grads) with dx (H, W, C) int8 and grads = []."""
    if not need_dx:
        return None, 0, 0, []
    dx, edx, nsat = requant(backward_acc(e, x, kernel, stride), ee, act_bits(e))
    return dx, edx, nsat, []


def forward1d(x, ex, kernel: int, stride: int | None = None):
    """x (L, C) -> y (OL, C): ``forward`` with H = 1, kernel (1, kernel), stride (1, stride)."""
    y, ey, nsat = forward(x[None], ex, (1, kernel), (1, kernel if stride is None else stride))
    return y[0], ey, nsat


def backward1d(e, ee, x, kernel: int, stride: int | None = None, need_dx=True):
    dx, edx, nsat, grads = backward(e[None], ee, x[None], (1, kernel),
                                    (1, kernel if stride is None else stride), need_dx)
    return (None if dx is None else dx[0]), edx, nsat, grads
