"""numba kernels for MaxPool2d, AvgPool2d and GlobalAvgPool (and their 1-D forms), bit-exact
with tinytrain.ops.maxpool and ops.avgpool (tests/test_ops_pool.py). Arrays are (H, W, C)
(1-D: (L, C)) C-contiguous; (kh, kw, sh, sw) as in ops/_pool.geometry; (mult, shift) from
ops.avgpool.reciprocal(kh*kw)."""
from __future__ import annotations

from numba import njit

from tinytrain.kernels._common import requant_shift, rshift_round


@njit(cache=True, inline="always")
def _round_q(acc, s, qmax, stats):
    r = rshift_round(acc, s)
    if r > qmax:
        stats[0] += 1
        return qmax
    if r < -qmax:
        stats[0] += 1
        return -qmax
    return r


@njit(cache=True, inline="always")
def _argmax(x, h0, w0, c, kh, kw):
    """(h, w) of the first maximum of the window at (h0, w0), strict > row-major scan."""
    bh, bw, best = h0, w0, x[h0, w0, c]
    for i in range(kh):
        for j in range(kw):
            v = x[h0 + i, w0 + j, c]
            if v > best:
                best, bh, bw = v, h0 + i, w0 + j
    return bh, bw


@njit(cache=True)
def maxpool2d_fwd(x, ex, kh, kw, sh, sw, y, stats):
    """y (OH, OW, C) = window maxima of x (H, W, C); returns ex."""
    OH, OW, C = y.shape
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                bh, bw = _argmax(x, oh * sh, ow * sw, c, kh, kw)
                y[oh, ow, c] = x[bh, bw, c]
    return ex


@njit(cache=True)
def maxpool2d_bwd(e, ee, x, kh, kw, sh, sw, scratch, dx, stats):
    """dx (H, W, C) = requant_s8 (at dx's width) of the errors routed to the argmaxes recomputed from x; returns
    edx. scratch: int32 (H*W*C,) when the windows overlap, unused (may be empty) otherwise."""
    OH, OW, C = e.shape
    H, W, _ = x.shape
    if sh >= kh and sw >= kw:
        dx[...] = 0
        for oh in range(OH):
            for ow in range(OW):
                for c in range(C):
                    bh, bw = _argmax(x, oh * sh, ow * sw, c, kh, kw)
                    dx[bh, bw, c] = e[oh, ow, c]
        return ee
    acc = scratch[: H * W * C].reshape((H, W, C))
    acc[...] = 0
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                bh, bw = _argmax(x, oh * sh, ow * sw, c, kh, kw)
                acc[bh, bw, c] += e[oh, ow, c]
    m = 0
    for v in scratch[: H * W * C]:
        m = max(m, abs(v))
    bits = dx.itemsize * 8  # int8, or int16 (int16 activations and errors: the same rule)
    s = requant_shift(m, bits)
    for h in range(H):
        for w in range(W):
            for c in range(C):
                dx[h, w, c] = _round_q(acc[h, w, c], s, (1 << (bits - 1)) - 1, stats)
    return ee + s


@njit(cache=True, inline="always")
def _window_sum(x, h0, w0, c, kh, kw):
    t = 0
    for i in range(kh):
        for j in range(kw):
            t += x[h0 + i, w0 + j, c]
    return t


@njit(cache=True)
def avgpool2d_fwd(x, ex, kh, kw, sh, sw, mult, shift, y, stats):
    """y (OH, OW, C) = requant_s8(mult * window sums, ex - shift); returns ey. Two passes
    (max, then round), no scratch."""
    OH, OW, C = y.shape
    m = 0
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                m = max(m, abs(mult * _window_sum(x, oh * sh, ow * sw, c, kh, kw)))
    bits = y.itemsize * 8  # int8, or int16 (int16 activations and errors: the same rule)
    s = requant_shift(m, bits)
    for oh in range(OH):
        for ow in range(OW):
            for c in range(C):
                y[oh, ow, c] = _round_q(mult * _window_sum(x, oh * sh, ow * sw, c, kh, kw), s, (1 << (bits - 1)) - 1, stats)
    return ex - shift + s


@njit(cache=True, inline="always")
def _cover(h, k, s, n_out):
    """Range [lo, hi) of windows (stride s, size k, n_out of them) that contain index h."""
    lo = 0 if h < k else (h - k + s) // s
    hi = h // s + 1
    return lo, (hi if hi < n_out else n_out)


@njit(cache=True, inline="always")
def _spread_sum(e, h, w, c, kh, kw, sh, sw):
    OH, OW, _ = e.shape
    lo_h, hi_h = _cover(h, kh, sh, OH)
    lo_w, hi_w = _cover(w, kw, sw, OW)
    t = 0
    for oh in range(lo_h, hi_h):
        for ow in range(lo_w, hi_w):
            t += e[oh, ow, c]
    return t


@njit(cache=True)
def avgpool2d_bwd(e, ee, kh, kw, sh, sw, mult, shift, dx, stats):
    """dx (H, W, C) = requant_s8(mult * sum of the errors of the windows covering each
    position, ee - shift); returns edx. Two passes, no scratch."""
    H, W, C = dx.shape
    m = 0
    for h in range(H):
        for w in range(W):
            for c in range(C):
                m = max(m, abs(mult * _spread_sum(e, h, w, c, kh, kw, sh, sw)))
    bits = dx.itemsize * 8
    s = requant_shift(m, bits)
    for h in range(H):
        for w in range(W):
            for c in range(C):
                dx[h, w, c] = _round_q(mult * _spread_sum(e, h, w, c, kh, kw, sh, sw), s, (1 << (bits - 1)) - 1, stats)
    return ee - shift + s


# ------------------------------------------------------------------ 1-D and global forms


@njit(cache=True)
def maxpool1d_fwd(x, ex, k, s, y, stats):
    """x (L, C) -> y (OL, C)."""
    return maxpool2d_fwd(x.reshape((1,) + x.shape), ex, 1, k, 1, s, y.reshape((1,) + y.shape), stats)


@njit(cache=True)
def maxpool1d_bwd(e, ee, x, k, s, scratch, dx, stats):
    return maxpool2d_bwd(e.reshape((1,) + e.shape), ee, x.reshape((1,) + x.shape), 1, k, 1, s,
                         scratch, dx.reshape((1,) + dx.shape), stats)


@njit(cache=True)
def avgpool1d_fwd(x, ex, k, s, mult, shift, y, stats):
    return avgpool2d_fwd(x.reshape((1,) + x.shape), ex, 1, k, 1, s, mult, shift,
                         y.reshape((1,) + y.shape), stats)


@njit(cache=True)
def avgpool1d_bwd(e, ee, k, s, mult, shift, dx, stats):
    return avgpool2d_bwd(e.reshape((1,) + e.shape), ee, 1, k, 1, s, mult, shift,
                         dx.reshape((1,) + dx.shape), stats)


@njit(cache=True)
def global_avgpool_fwd(x, ex, mult, shift, y, stats):
    """x (P, C) (an (H, W, C) image as x.reshape(H*W, C)) -> y (C,); (mult, shift) from
    reciprocal(P)."""
    P, C = x.shape
    return avgpool2d_fwd(x.reshape((1, P, C)), ex, 1, P, 1, 1, mult, shift, y.reshape((1, 1, C)), stats)


@njit(cache=True)
def global_avgpool_bwd(e, ee, mult, shift, dx, stats):
    """e (C,) -> dx (P, C)."""
    P, C = dx.shape
    return avgpool2d_bwd(e.reshape((1, 1, C)), ee, 1, P, 1, 1, mult, shift, dx.reshape((1, P, C)), stats)
