"""Conv2d layer, reference implementation (one sample, channels-last).

Shapes: x (H, W, Cin) int8 at ex; w (Cout, KH, KW, Cin) int16 at ew ("OHWI"); b (Cout,) int32
at eb; stride (sh, sw); zero padding (top, bottom, left, right), or "valid" / "same" (see
``geometry``). Output (OH, OW, Cout) with OH = (H + top + bottom - KH) // sh + 1 (floor; rows
of x past the last window are unused and get dx = 0), likewise OW.
Write xp for x zero-padded, and p = (oh*sh + kh, ow*sw + kw) for an index into xp.

Forward:  acc[oh, ow, co] = sum_{kh, kw, ci} xp[p, ci] * w[co, kh, kw, ci]
                            + align(b[co], eb, ex + ew)                  (int64, exact)
          y, ey = requant_s8(acc, ex + ew)        (one shift for the whole output tensor)
Backward (pre-update weights, dx first):
          dxp[p, ci] = sum_{oh, ow, co, kh, kw} e[oh, ow, co] * w[co, kh, kw, ci]  (int64, exact;
          the transposed convolution), cropped to (H, W, Cin) -> requant_s8(., ee + ew)
          gw[co, kh, kw, ci] = sum_{oh, ow} e[oh, ow, co] * xp[p, ci]   at ee + ex  (int32)
          gb[co]             = sum_{oh, ow} e[oh, ow, co]               at ee       (int32)
Bounds. Forward: |acc| <= KH*KW*Cin * 127*32767 + 2^30; dx: |acc| <= Cout*KH*KW * 127*32767;
both exact in int64 (C uses int64 too). Gradients: each term |e*x| <= 127*127 = 16129 (errors
and activations are symmetric int8) and gw sums OH*OW terms, so |gw| <= 16129 * OH*OW, which
fits int32 iff OH*OW <= GRAD_MAX_POSITIONS = 133144 (|gb| <= 127 * OH*OW is then smaller).
``geometry`` raises ValueError for larger outputs, so an unsafe layer is rejected when the
graph is built, never wrapped at run time; the C kernel accumulates gw in int32 on that proof.

int16 activations and errors (precision ``"activations": "int16"``): x, e, y, dx are int16
(+-32767), y and dx requantized with 16 bits instead of 8; the sums stay exact in int64
(fan-in * 32767^2 + 2^30). A gradient term |e*x| <= 32767^2 < 2^30, so gw sums up to
OH*OW * 2^30: it is summed in int64 and rounded, gw = rshift_round(sum, g) with the static
g = grad_shift(OH*OW) = bitwidth(OH*OW - 1) (|gw| <= 2^30, the bound of a Dense gradient
under the same policy), at exponent ee + ex + g; gb = sum e (|gb| <= 32767 * OH*OW, int32
while OH*OW <= A16_MAX_POSITIONS) at ee.
"""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import INT32_MAX, INT8_MAX, rshift_round
from tinytrain.ops._common import act_bits, align, requant

#: Largest number of output positions whose gradient sum of int8 x int8 terms fits int32.
GRAD_MAX_POSITIONS = INT32_MAX // (INT8_MAX * INT8_MAX)  # 133144
#: int16 activations: most output positions whose bias gradient sum of int16 errors fits int32
A16_MAX_POSITIONS = INT32_MAX // 32767  # 65538


def grad_shift(npos: int, bits: int = 16) -> int:
    """The static right shift of a weight gradient summing ``npos`` products of ``bits``-bit
    errors and activations: 0 for int8, bitwidth(npos - 1) for int16 (|gw| <= 2^30)."""
    return 0 if bits == 8 else (int(npos) - 1).bit_length()


def round_grad(gw, npos: int, bits: int):
    """(gw int32, g): the int64 weight gradient sums rounded by grad_shift (see the docstring)."""
    g = grad_shift(npos, bits)
    return rshift_round(gw, g).astype(np.int32), g


def _pads_1d(n: int, k: int, s: int, mode: str) -> tuple[int, int]:
    """'valid': no padding. 'same': out = ceil(n / s), total = max((out-1)*s + k - n, 0),
    before = total // 2, after = total - before (the extra pixel goes after, as in TF)."""
    if mode == "valid":
        return 0, 0
    if mode == "same":
        out = -(-n // s)
        total = max((out - 1) * s + k - n, 0)
        return total // 2, total - total // 2
    raise ValueError(f"padding must be 'valid', 'same' or a tuple of ints, not {mode!r}")


def check_grad_positions(npos: int, op: str = "conv") -> None:
    """Raise if a gradient summing ``npos`` int8 x int8 products could overflow int32."""
    if npos > GRAD_MAX_POSITIONS:
        raise ValueError(
            f"{op}: {npos} output positions; the weight gradient sums one |e*x| <= 127*127 term "
            f"per position and overflows int32 beyond {GRAD_MAX_POSITIONS} positions "
            f"(use a larger stride or split the layer)"
        )


def geometry(H, W, KH, KW, stride=(1, 1), padding=(0, 0, 0, 0), op="conv2d"):
    """Resolve the static configuration: returns (OH, OW, (sh, sw), (top, bottom, left, right)).

    ``stride`` is an int or (sh, sw) >= 1; ``padding`` is "valid", "same" or 4 ints >= 0.
    Raises ValueError for an empty output or a gradient that could overflow int32.
    """
    sh, sw = (stride, stride) if isinstance(stride, int) else (int(stride[0]), int(stride[1]))
    if sh < 1 or sw < 1:
        raise ValueError(f"{op}: stride must be >= 1, got {(sh, sw)}")
    if isinstance(padding, str):
        pads = (*_pads_1d(H, KH, sh, padding), *_pads_1d(W, KW, sw, padding))
    else:
        pads = tuple(int(p) for p in padding)
        if len(pads) != 4 or min(pads) < 0:
            raise ValueError(f"{op}: padding must be 4 ints >= 0 (top, bottom, left, right)")
    OH = (H + pads[0] + pads[1] - KH) // sh + 1
    OW = (W + pads[2] + pads[3] - KW) // sw + 1
    if KH < 1 or KW < 1 or OH < 1 or OW < 1:
        raise ValueError(f"{op}: kernel {KH}x{KW} does not fit input {H}x{W} with padding {pads}")
    check_grad_positions(OH * OW, op)
    return OH, OW, (sh, sw), pads


def windows(xp, KH, KW, sh, sw, OH, OW):
    """For each (kh, kw): the (OH, OW, C) slice of the padded input it multiplies."""
    for kh in range(KH):
        for kw in range(KW):
            yield kh, kw, xp[kh : kh + sh * (OH - 1) + 1 : sh, kw : kw + sw * (OW - 1) + 1 : sw]


def forward_acc(x, w, stride=(1, 1), padding=(0, 0, 0, 0)):
    """The linear part of forward: int64 (OH, OW, Cout) accumulator without bias."""
    H, W, _ = x.shape
    Cout, KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding)
    xp = np.pad(x.astype(np.int64), ((pt, pb), (pl, pr), (0, 0)))
    acc = np.zeros((OH, OW, Cout), np.int64)
    w64 = w.astype(np.int64)
    for kh, kw, xs in windows(xp, KH, KW, sh, sw, OH, OW):
        acc += xs @ w64[:, kh, kw, :].T
    return acc


def backward_acc(e, w, x_shape, stride=(1, 1), padding=(0, 0, 0, 0)):
    """The transposed linear part: int64 (H, W, Cin) dx accumulator, adjoint of forward_acc."""
    H, W, Cin = x_shape
    Cout, KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding)
    dxp = np.zeros((H + pt + pb, W + pl + pr, Cin), np.int64)
    e64, w64 = e.astype(np.int64), w.astype(np.int64)
    for kh, kw, ds in windows(dxp, KH, KW, sh, sw, OH, OW):
        ds += e64 @ w64[:, kh, kw, :]  # ds is a view of dxp; windows of one (kh, kw) never overlap
    return dxp[pt : pt + H, pl : pl + W]


def forward(x, ex, w, ew, b, eb, stride=(1, 1), padding=(0, 0, 0, 0)):
    """Returns (y (OH, OW, Cout) int8 (int16 for an int16 x), ey, nsat)."""
    acc = forward_acc(x, w, stride, padding) + align(b, eb, ex + ew)
    return requant(acc, ex + ew, act_bits(x))


def backward(e, ee, x, ex, w, ew, stride=(1, 1), padding=(0, 0, 0, 0), need_dx=True):
    """Returns (dx, edx, nsat, grads) with grads = [(gw, ee+ex), (gb, ee)]."""
    H, W, _ = x.shape
    Cout, KH, KW, _ = w.shape
    OH, OW, (sh, sw), (pt, pb, pl, pr) = geometry(H, W, KH, KW, stride, padding)
    xp = np.pad(x.astype(np.int64), ((pt, pb), (pl, pr), (0, 0)))
    e2 = e.astype(np.int64).reshape(OH * OW, Cout)
    gw = np.zeros(w.shape, np.int64)
    for kh, kw, xs in windows(xp, KH, KW, sh, sw, OH, OW):
        gw[:, kh, kw, :] = e2.T @ xs.reshape(OH * OW, -1)
    gw, g = round_grad(gw, OH * OW, act_bits(e))
    grads = [(gw, ee + ex + g), (e2.sum(axis=0).astype(np.int32), ee)]
    if not need_dx:
        return None, 0, 0, grads
    dx, edx, nsat = requant(backward_acc(e, w, x.shape, stride, padding), ee + ew, act_bits(e))
    return dx, edx, nsat, grads
