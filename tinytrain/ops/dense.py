"""Dense (fully connected) layer, reference implementation.

Shapes: x (K,) int8 at exponent ex; w (N, K) int16 at ew; b (N,) int32 at eb.

Forward:  acc[n] = sum_k x[k] * w[n, k] + align(b[n], eb, ex + ew)      (int64, exact)
          y, ey  = requant_s8(acc, ex + ew)
Backward: dx_acc[k] = sum_n e[n] * w[n, k]  -> requant_s8(dx_acc, ee + ew)  (old weights)
          gw[n, k] = e[n] * x[k]  at exponent ee + ex  (int32, |gw| < 2^14)
          gb[n]    = e[n]         at exponent ee
int16 activations and errors (precision ``"activations": "int16"``): x, e, y, dx are int16
(+-32767) and requantized with 16 bits instead of 8, the rest as above: |gw| <= 32767^2 < 2^30
(int32), the forward and input-error sums in int64 (K * 32767 * 32767 + 2^30 >= 2^31 from K = 2).

Accumulator bound: |acc| <= K * 127 * 32767 + 2^31; C uses int32 when K * 127 * 32767 +
2^30 < 2^31 after saturating the aligned bias to +-2^30, int64 otherwise. The reference is
exact int64 and both agree whenever the C width is chosen by that rule.
"""
from __future__ import annotations

import numpy as np

from tinytrain.ops._common import act_bits, align, requant


def forward(x, ex, w, ew, b, eb):
    acc = w.astype(np.int64) @ x.astype(np.int64)
    acc += align(b, eb, ex + ew)
    return requant(acc, ex + ew, act_bits(x))


def backward(e, ee, x, ex, w, ew, need_dx=True):
    """Returns (dx, edx, nsat, grads) with grads = [(gw, ee+ex), (gb, ee)]."""
    e64 = e.astype(np.int64)
    grads = [(np.outer(e64, x.astype(np.int64)).astype(np.int32), ee + ex), (e.astype(np.int32), ee)]
    if not need_dx:
        return None, 0, 0, grads
    dx, edx, nsat = requant(w.astype(np.int64).T @ e64, ee + ew, act_bits(e))
    return dx, edx, nsat, grads
