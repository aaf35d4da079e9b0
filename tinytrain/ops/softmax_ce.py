"""Integer softmax cross-entropy: loss head on int8 logits, gradient to int8 errors.

Given logits z (N,) int8 at exponent ez and a label c:
  d_i  = z_i - max(z)                                   (in [-254, 0])
  t_i  = shift_round(d_i * LOG2E_Q15, max(7 - ez, -24)), clamped to >= -4097  (Q8, log2 units)
  p~_i = exp2_neg_q15(t_i)                              (Q15, the max entry is 32768)
  S    = sum p~_i;   p_i = div_trunc(p~_i << 15, S)     (Q15 probabilities)
  g_i  = p_i - 32768 * [i == c]                          (dLoss/dz at exponent -15)
  e, ee = requant_s8(g, -15)                             (error fed to backward)
  loss_q16 = (15 << 16) - log2_q16(max(p_c, 1))          (-log2 p_c in Q16; report only)
Prediction is argmax(z), the first index on ties.

int16 logits (precision ``"activations": "int16"``): the same rule, d_i in [-65534, 0], so
|d_i * LOG2E_Q15| < 2^32 is formed in int64 (C: tt_softmax_ce_s16), and e is requant(g, -15, 16):
|g| <= 32768 gives s <= 1, so the error keeps the Q15 gradient to within one rounding.
"""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import LOG2E_Q15, exp2_neg_q15, log2_q16, shift_round
from tinytrain.ops._common import act_bits, requant

T_MIN = -16 * 256 - 1  # below this exp2_neg_q15 is 0


def probabilities(z, ez):
    d = z.astype(np.int64) - int(z.max())
    sh = max(7 - ez, -24)  # a left shift beyond 24 only pushes nonzero d further below T_MIN
    t = np.array([max(T_MIN, int(shift_round(int(v) * LOG2E_Q15, sh))) for v in d], dtype=np.int64)
    pn = np.array([exp2_neg_q15(int(v)) for v in t], dtype=np.int64)
    S = int(pn.sum())
    return ((pn << 15) // S).astype(np.int32)  # all operands >= 0: floor == truncation


def forward_backward(z, ez, label):
    """Returns (e int8, ee, nsat, loss_q16, pred)."""
    p = probabilities(z, ez)
    g = p.astype(np.int64)
    g[label] -= 32768
    e, ee, nsat = requant(g, -15, act_bits(z))
    loss_q16 = (15 << 16) - log2_q16(max(int(p[label]), 1))
    return e, ee, nsat, loss_q16, int(np.argmax(z))


def error(z, ez, label):
    """The loss error g (N,) int64 at exponent -15, before requantization (what a global loss
    scale quantizes at its own exponent, graph/loss_scale.py)."""
    g = probabilities(z, ez).astype(np.int64)
    g[label] -= 32768
    return g, -15
