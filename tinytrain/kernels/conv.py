"""numba kernels for Conv2d, DepthwiseConv2d and Conv1d, bit-exact with tinytrain.ops.conv2d,
ops.depthwise and ops.conv1d (tests/test_ops_conv.py).

Static configuration: stride (sh, sw) and the top / left padding (pt, pl); the output size is
y.shape / e.shape (bottom / right padding only decide it). Resolve it with
``ops.conv2d.geometry``, which also rejects layers whose int32 weight gradient could overflow.
Scratch: acc is a flat int64 array of at least one element per output (fwd) or per input
(bwd); only that prefix is used, so one buffer of the larger size serves both, as in C
(TT_CONV2D_BUFFER_SIZE). All arrays must be C-contiguous.
"""
from __future__ import annotations

from numba import njit

from tinytrain.kernels._common import align, requant_s8, rshift_round


@njit(cache=True)
def conv2d_fwd(x, ex, w, ew, b, eb, sh, sw, pt, pl, acc, y, stats):
    """x (H, W, Cin) int8, w (Cout, KH, KW, Cin) int16, b (Cout,) int32,
    acc (>= OH*OW*Cout,) int64 scratch, y (OH, OW, Cout) int8 -> ey."""
    H, W, Cin = x.shape
    Cout, KH, KW, _ = w.shape
    OH, OW, _ = y.shape
    ea = ex + ew
    i = 0
    for oh in range(OH):
        for ow in range(OW):
            for co in range(Cout):
                a = align(b[co], eb, ea)
                for kh in range(KH):
                    ih = oh * sh - pt + kh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(KW):
                        iw = ow * sw - pl + kw
                        if iw < 0 or iw >= W:
                            continue
                        for ci in range(Cin):
                            a += x[ih, iw, ci] * w[co, kh, kw, ci]
                acc[i] = a
                i += 1
    return ea + requant_s8(acc[: y.size], y.reshape(-1), stats)


@njit(cache=True)
def conv2d_bwd(e, ee, w, ew, sh, sw, pt, pl, acc, dx, stats):
    """e (OH, OW, Cout) int8, dx (H, W, Cin) int8 = requant(transposed conv of e);
    acc (>= H*W*Cin,) int64 scratch -> edx."""
    OH, OW, Cout = e.shape
    _, KH, KW, _ = w.shape
    H, W, Cin = dx.shape
    a3 = acc[: dx.size].reshape(H, W, Cin)
    a3[:] = 0
    for oh in range(OH):
        for ow in range(OW):
            for co in range(Cout):
                ev = e[oh, ow, co]
                if ev == 0:
                    continue
                for kh in range(KH):
                    ih = oh * sh - pt + kh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(KW):
                        iw = ow * sw - pl + kw
                        if iw < 0 or iw >= W:
                            continue
                        for ci in range(Cin):
                            a3[ih, iw, ci] += ev * w[co, kh, kw, ci]
    return ee + ew + requant_s8(acc[: dx.size], dx.reshape(-1), stats)


@njit(cache=True)
def conv2d_grad(e, x, sh, sw, pt, pl, gw, gb):
    """gw (Cout, KH, KW, Cin) int32 = sum_{oh, ow} e * x-window, gb (Cout,) int32 = sum e."""
    OH, OW, Cout = e.shape
    H, W, Cin = x.shape
    _, KH, KW, _ = gw.shape
    gw[:] = 0
    gb[:] = 0
    for oh in range(OH):
        for ow in range(OW):
            for co in range(Cout):
                ev = e[oh, ow, co]
                gb[co] += ev
                if ev == 0:
                    continue
                for kh in range(KH):
                    ih = oh * sh - pt + kh
                    if ih < 0 or ih >= H:
                        continue
                    for kw in range(KW):
                        iw = ow * sw - pl + kw
                        if iw < 0 or iw >= W:
                            continue
                        for ci in range(Cin):
                            gw[co, kh, kw, ci] += ev * x[ih, iw, ci]


@njit(cache=True)
def depthwise_fwd(x, ex, w, ew, b, eb, sh, sw, pt, pl, acc, y, stats):
    """x (H, W, C) int8, w (KH, KW, C) int16, b (C,) int32, acc (>= OH*OW*C,) int64 scratch,
    y (OH, OW, C) int8 -> ey."""
    H, W, C = x.shape
    KH, KW, _ = w.shape
    OH, OW, _ = y.shape
    ea = ex + ew
    a3 = acc[: y.size].reshape(OH, OW, C)
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                a3[oh, ow, c] = align(b[c], eb, ea)
            for kh in range(KH):
                ih = oh * sh - pt + kh
                if ih < 0 or ih >= H:
                    continue
                for kw in range(KW):
                    iw = ow * sw - pl + kw
                    if iw < 0 or iw >= W:
                        continue
                    for c in range(C):
                        a3[oh, ow, c] += x[ih, iw, c] * w[kh, kw, c]
    return ea + requant_s8(acc[: y.size], y.reshape(-1), stats)


@njit(cache=True)
def depthwise_bwd(e, ee, w, ew, sh, sw, pt, pl, acc, dx, stats):
    """e (OH, OW, C) int8, dx (H, W, C) int8; acc (>= H*W*C,) int64 scratch -> edx."""
    OH, OW, C = e.shape
    KH, KW, _ = w.shape
    H, W, _ = dx.shape
    a3 = acc[: dx.size].reshape(H, W, C)
    a3[:] = 0
    for oh in range(OH):
        for ow in range(OW):
            for kh in range(KH):
                ih = oh * sh - pt + kh
                if ih < 0 or ih >= H:
                    continue
                for kw in range(KW):
                    iw = ow * sw - pl + kw
                    if iw < 0 or iw >= W:
                        continue
                    for c in range(C):
                        a3[ih, iw, c] += e[oh, ow, c] * w[kh, kw, c]
    return ee + ew + requant_s8(acc[: dx.size], dx.reshape(-1), stats)


@njit(cache=True)
def depthwise_grad(e, x, sh, sw, pt, pl, gw, gb):
    """gw (KH, KW, C) int32, gb (C,) int32."""
    OH, OW, C = e.shape
    H, W, _ = x.shape
    KH, KW, _ = gw.shape
    gw[:] = 0
    gb[:] = 0
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                gb[c] += e[oh, ow, c]
            for kh in range(KH):
                ih = oh * sh - pt + kh
                if ih < 0 or ih >= H:
                    continue
                for kw in range(KW):
                    iw = ow * sw - pl + kw
                    if iw < 0 or iw >= W:
                        continue
                    for c in range(C):
                        gw[kh, kw, c] += e[oh, ow, c] * x[ih, iw, c]


@njit(cache=True)
def conv1d_fwd(x, ex, w, ew, b, eb, s, pad_left, acc, y, stats):
    """x (L, Cin) int8, w (Cout, K, Cin) int16, b (Cout,) int32, acc (>= OL*Cout,) int64,
    y (OL, Cout) int8 -> ey. Conv2d with H = KH = 1."""
    L, Cin = x.shape
    Cout, K, _ = w.shape
    OL = y.shape[0]
    return conv2d_fwd(x.reshape(1, L, Cin), ex, w.reshape(Cout, 1, K, Cin), ew, b, eb,
                      1, s, 0, pad_left, acc, y.reshape(1, OL, Cout), stats)


@njit(cache=True)
def conv1d_bwd(e, ee, w, ew, s, pad_left, acc, dx, stats):
    """e (OL, Cout) int8, dx (L, Cin) int8; acc (>= L*Cin,) int64 scratch -> edx."""
    OL, Cout = e.shape
    _, K, Cin = w.shape
    L = dx.shape[0]
    return conv2d_bwd(e.reshape(1, OL, Cout), ee, w.reshape(Cout, 1, K, Cin), ew,
                      1, s, 0, pad_left, acc, dx.reshape(1, L, Cin), stats)


@njit(cache=True)
def conv1d_grad(e, x, s, pad_left, gw, gb):
    """gw (Cout, K, Cin) int32, gb (Cout,) int32."""
    OL, Cout = e.shape
    L, Cin = x.shape
    _, K, _ = gw.shape
    conv2d_grad(e.reshape(1, OL, Cout), x.reshape(1, L, Cin), 1, s, 0, pad_left,
                gw.reshape(Cout, 1, K, Cin), gb)


# ---------------------------------------------- int16 activations and errors (graph/act16.py)
# fwd and bwd above take int16 x, e, y, dx as they are (the products in int64, requant_s8 at the
# width of y / dx); the weight gradients sum up to OH*OW terms of 32767^2 and are rounded by the
# static shift g = ops.conv2d.grad_shift(OH*OW) (ops/conv2d.py), summed here in int64 per weight.


@njit(cache=True)
def _sum_e(e, c):
    """sum over positions of e[:, :, c] (a bias gradient)."""
    OH, OW, _ = e.shape
    t = 0
    for oh in range(OH):
        for ow in range(OW):
            t += e[oh, ow, c]
    return t


@njit(cache=True)
def _window_dot(e, co, x, ci, kh, kw, sh, sw, pt, pl):
    """sum over output positions of e[oh, ow, co] * x[oh*sh - pt + kh, ow*sw - pl + kw, ci], the
    padding (out-of-range input positions) skipped: one weight's gradient before its rounding."""
    OH, OW, _ = e.shape
    H, W, _ = x.shape
    a = 0
    for oh in range(OH):
        ih = oh * sh - pt + kh
        if ih < 0 or ih >= H:
            continue
        for ow in range(OW):
            iw = ow * sw - pl + kw
            if iw < 0 or iw >= W:
                continue
            a += e[oh, ow, co] * x[ih, iw, ci]
    return a


@njit(cache=True)
def conv2d_grad_a16(e, x, sh, sw, pt, pl, g, gw, gb):
    """gw (Cout, KH, KW, Cin) int32 = rshift_round(sum_{oh, ow} e * x-window, g), gb = sum e."""
    Cout, KH, KW, Cin = gw.shape
    for co in range(Cout):
        gb[co] = _sum_e(e, co)
        for kh in range(KH):
            for kw in range(KW):
                for ci in range(Cin):
                    gw[co, kh, kw, ci] = rshift_round(_window_dot(e, co, x, ci, kh, kw, sh, sw, pt, pl), g)


@njit(cache=True)
def depthwise_grad_a16(e, x, sh, sw, pt, pl, g, gw, gb):
    """gw (KH, KW, C) int32 = rshift_round(sum of e * x over positions, g), gb (C,) = sum e."""
    KH, KW, C = gw.shape
    for c in range(C):
        gb[c] = _sum_e(e, c)
        for kh in range(KH):
            for kw in range(KW):
                gw[kh, kw, c] = rshift_round(_window_dot(e, c, x, c, kh, kw, sh, sw, pt, pl), g)


@njit(cache=True)
def conv1d_grad_a16(e, x, s, pad_left, g, gw, gb):
    """gw (Cout, K, Cin) int32, gb (Cout,) int32 (Conv2d with H = KH = 1)."""
    OL, Cout = e.shape
    L, Cin = x.shape
    _, K, _ = gw.shape
    conv2d_grad_a16(e.reshape(1, OL, Cout), x.reshape(1, L, Cin), 1, s, 0, pad_left, g,
                    gw.reshape(Cout, 1, K, Cin), gb)
