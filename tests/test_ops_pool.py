"""MaxPool, AvgPool, GlobalAvgPool (2-D and 1-D): reference == numba == C on hypothesis-drawn
shapes, kernels, strides, values and exponents, plus exact checks of the references."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from numpy.lib.stride_tricks import sliding_window_view

from tinytrain.fixedpoint import to_mult_shift
from tinytrain.kernels import pool as kp
from tinytrain.ops import avgpool as ravg
from tinytrain.ops import maxpool as rmax

from .oputil import c_ctx, c_i8, draw_array

NULL_I32 = np.zeros(1, np.int32)  # stands for "no scratch"


@st.composite
def pool_case(draw, one_d=False):
    kh = 1 if one_d else draw(st.integers(1, 4))
    kw = draw(st.integers(1, 4))
    sh = 1 if one_d else draw(st.integers(1, 4))
    sw = draw(st.integers(1, 4))
    H = 1 if one_d else draw(st.integers(kh, 9))
    W = draw(st.integers(kw, 9))
    C = draw(st.integers(1, 5))
    OH, OW = (H - kh) // sh + 1, (W - kw) // sw + 1
    x = draw_array(draw, (H, W, C), np.int8, -127, 127)
    e = draw_array(draw, (OH, OW, C), np.int8, -127, 127)
    ex, ee = draw(st.integers(-30, 10)), draw(st.integers(-30, 10))
    return x, e, (kh, kw), (sh, sw), ex, ee


def _maxpool_c(lib, ffi, x, e, ex, ee, k, s):
    H, W, C = x.shape
    OH, OW, _ = e.shape
    y, dx = np.zeros((OH, OW, C), np.int8), np.zeros_like(x)
    scratch = np.zeros(max(1, H * W * C), np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    p = ffi.new("tt_pool_params *", dict(H=H, W=W, C=C, kh=k[0], kw=k[1], stride_h=s[0], stride_w=s[1]))
    ey = lib.tt_maxpool2d_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y))
    edx = lib.tt_maxpool2d_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, x), c_i8(ffi, dx))
    return y, ey, dx, edx, st_c.saturated


@settings(max_examples=150, deadline=None)
@given(pool_case())
def test_maxpool2d_equal(clib, case):
    ffi, lib = clib
    x, e, k, s, ex, ee = case
    H, W, C = x.shape
    y_ref, ey_ref, nsat = rmax.forward(x, ex, k, s)
    dx_ref, edx_ref, nsat_b, grads = rmax.backward(e, ee, x, k, s)
    assert y_ref.dtype == np.int8 and dx_ref.dtype == np.int8 and grads == []
    assert y_ref.shape == e.shape and ey_ref == ex and nsat == 0
    # the window maximum, straight from numpy
    win = sliding_window_view(x, k, axis=(0, 1))[:: s[0], :: s[1]]
    assert np.array_equal(y_ref, win.max(axis=(3, 4)))

    stats = np.zeros(4, np.int64)
    y, dx = np.zeros_like(y_ref), np.zeros_like(x)
    scratch = np.zeros(H * W * C, np.int32)
    assert kp.maxpool2d_fwd(x, ex, *k, *s, y, stats) == ex and np.array_equal(y, y_ref)
    assert kp.maxpool2d_bwd(e, ee, x, *k, *s, scratch, dx, stats) == edx_ref
    assert np.array_equal(dx, dx_ref) and stats[0] == nsat_b

    yc, eyc, dxc, edxc, nsat_c = _maxpool_c(lib, ffi, x, e, ex, ee, k, s)
    assert eyc == ex and np.array_equal(yc, y_ref)
    assert edxc == edx_ref and np.array_equal(dxc, dx_ref) and nsat_c == nsat_b


@settings(max_examples=60, deadline=None)
@given(pool_case(one_d=True))
def test_maxpool1d_equal(clib, case):
    ffi, lib = clib
    x3, e3, (_, k), (_, s), ex, ee = case
    x, e = x3[0], e3[0]
    L, C = x.shape
    y_ref, ey_ref, _ = rmax.forward1d(x, ex, k, s)
    dx_ref, edx_ref, nsat_b, _ = rmax.backward1d(e, ee, x, k, s)
    assert np.array_equal(y_ref, rmax.forward(x3, ex, (1, k), (1, s))[0][0])

    stats = np.zeros(4, np.int64)
    y, dx, scratch = np.zeros_like(y_ref), np.zeros_like(x), np.zeros(L * C, np.int32)
    assert kp.maxpool1d_fwd(x, ex, k, s, y, stats) == ey_ref and np.array_equal(y, y_ref)
    assert kp.maxpool1d_bwd(e, ee, x, k, s, scratch, dx, stats) == edx_ref
    assert np.array_equal(dx, dx_ref) and stats[0] == nsat_b

    scratch = np.zeros(L * C, np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    p = ffi.new("tt_pool1d_params *", dict(L=L, C=C, k=k, stride=s))
    yc, dxc = np.zeros_like(y_ref), np.zeros_like(x)
    assert lib.tt_maxpool1d_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc)) == ey_ref
    assert lib.tt_maxpool1d_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, x), c_i8(ffi, dxc)) == edx_ref
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref)


def test_maxpool_ties_and_overlap(clib_ubsan):
    """First maximum wins (row-major); overlapping windows add their errors and requantize;
    no-overlap pooling needs no scratch."""
    ffi, lib = clib_ubsan
    x = np.full((3, 3, 1), 5, np.int8)
    e = np.full((2, 2, 1), 127, np.int8)
    # kernel 2, stride 1: every window's first maximum is its top-left corner
    dx, edx, nsat, _ = rmax.backward(e, -4, x, 2, 1)
    acc = rmax.backward_acc(e, x, 2, 1)
    assert acc[:, :, 0].tolist() == [[127, 127, 0], [127, 127, 0], [0, 0, 0]]
    assert edx == -4 and nsat == 0 and dx[:, :, 0].tolist() == acc[:, :, 0].tolist()
    # all four windows pick the centre: 4 * 127 = 508 -> shift 2 -> 127 at exponent -2
    x[1, 1, 0] = 9
    dx, edx, _, _ = rmax.backward(e, -4, x, 2, 1)
    assert dx[1, 1, 0] == 127 and edx == -2 and np.count_nonzero(dx) == 1
    yc, _, dxc, edxc, _ = _maxpool_c(lib, ffi, x, e, 0, -4, (2, 2), (1, 1))
    assert np.array_equal(dxc, dx) and edxc == edx and (yc == 9).all()
    # non-overlapping: scratch untouched (NULL would do; pass a sentinel and check it)
    x = np.array([[[-3], [-3]], [[-3], [-3]]], np.int8)
    sentinel, dxc = np.full(4, 77, np.int64), np.zeros_like(x)
    ctx, st_c = c_ctx(ffi, sentinel)
    p = ffi.new("tt_pool_params *", dict(H=2, W=2, C=1, kh=2, kw=2, stride_h=2, stride_w=2))
    edxc = lib.tt_maxpool2d_bwd_s8(ctx, p, c_i8(ffi, np.array([[[-127]]], np.int8)), 3, c_i8(ffi, x),
                                   c_i8(ffi, dxc))
    assert edxc == 3 and dxc[:, :, 0].tolist() == [[-127, 0], [0, 0]] and (sentinel == 77).all()


@settings(max_examples=30, deadline=None)
@given(pool_case())
def test_maxpool_backward_is_adjoint(case):
    """With the argmax fixed, y = S x and dx_acc = S^T e: <dx_acc, x> == <e, y>."""
    x, e, k, s, _, _ = case
    y, _, _ = rmax.forward(x, 0, k, s)
    acc = rmax.backward_acc(e, x, k, s)
    assert int((acc * x).sum()) == int((e.astype(np.int64) * y).sum())


# --------------------------------------------------------------------------- AvgPool


def test_reciprocal():
    for P in (1, 2, 4, 8, 64, 1024):
        assert ravg.reciprocal(P) == (1, P.bit_length() - 1)
    for P in (3, 5, 6, 7, 9, 25, 49, 100, 1000):
        m, k = ravg.reciprocal(P)
        assert (m, k) == to_mult_shift(1.0 / P) and 2**14 <= m < 2**15
        assert abs(m * P - 2**k) * 2 <= P  # m = round(2^k / P), exact to half a unit


def _avgpool_all(lib, ffi, x, e, k, s, ex, ee):
    H, W, C = x.shape
    m, sh = ravg.reciprocal(k[0] * k[1])
    y_ref, ey_ref, nsat_f = ravg.forward(x, ex, k, s)
    dx_ref, edx_ref, nsat_b, grads = ravg.backward(e, ee, x.shape, k, s)
    assert y_ref.dtype == np.int8 and dx_ref.dtype == np.int8 and grads == []

    stats = np.zeros(4, np.int64)
    y, dx = np.zeros_like(y_ref), np.zeros_like(x)
    assert kp.avgpool2d_fwd(x, ex, *k, *s, m, sh, y, stats) == ey_ref
    assert np.array_equal(y, y_ref) and stats[0] == nsat_f
    assert kp.avgpool2d_bwd(e, ee, *k, *s, m, sh, dx, stats) == edx_ref
    assert np.array_equal(dx, dx_ref) and stats[0] == nsat_f + nsat_b

    ctx, st_c = c_ctx(ffi)
    p = ffi.new("tt_pool_params *", dict(H=H, W=W, C=C, kh=k[0], kw=k[1], stride_h=s[0], stride_w=s[1], mult=m,
                                         shift=sh))
    yc, dxc = np.zeros_like(y_ref), np.zeros_like(x)
    assert lib.tt_avgpool2d_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc)) == ey_ref
    assert np.array_equal(yc, y_ref) and st_c.saturated == nsat_f
    assert lib.tt_avgpool2d_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dxc)) == edx_ref
    assert np.array_equal(dxc, dx_ref) and st_c.saturated == nsat_f + nsat_b
    return y_ref, ey_ref, dx_ref, edx_ref


@settings(max_examples=150, deadline=None)
@given(pool_case())
def test_avgpool2d_equal(clib, case):
    ffi, lib = clib
    x, e, k, s, ex, ee = case
    _avgpool_all(lib, ffi, x, e, k, s, ex, ee)


@settings(max_examples=60, deadline=None)
@given(pool_case(one_d=True))
def test_avgpool1d_equal(clib, case):
    ffi, lib = clib
    x3, e3, (_, k), (_, s), ex, ee = case
    x, e = x3[0], e3[0]
    L, C = x.shape
    m, sh = ravg.reciprocal(k)
    y_ref, ey_ref, _ = ravg.forward1d(x, ex, k, s)
    dx_ref, edx_ref, _, _ = ravg.backward1d(e, ee, L, k, s)
    assert np.array_equal(y_ref, ravg.forward(x3, ex, (1, k), (1, s))[0][0])

    stats = np.zeros(4, np.int64)
    y, dx = np.zeros_like(y_ref), np.zeros_like(x)
    assert kp.avgpool1d_fwd(x, ex, k, s, m, sh, y, stats) == ey_ref and np.array_equal(y, y_ref)
    assert kp.avgpool1d_bwd(e, ee, k, s, m, sh, dx, stats) == edx_ref and np.array_equal(dx, dx_ref)

    ctx, _ = c_ctx(ffi)
    p = ffi.new("tt_pool1d_params *", dict(L=L, C=C, k=k, stride=s, mult=m, shift=sh))
    yc, dxc = np.zeros_like(y_ref), np.zeros_like(x)
    assert lib.tt_avgpool1d_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc)) == ey_ref
    assert lib.tt_avgpool1d_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dxc)) == edx_ref
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref)


@st.composite
def global_case(draw):
    shape = (draw(st.integers(1, 12)), draw(st.integers(1, 12)), draw(st.integers(1, 6)))
    x = draw_array(draw, shape, np.int8, -127, 127)
    e = draw_array(draw, shape[2:], np.int8, -127, 127)
    return x, e, draw(st.integers(-30, 10)), draw(st.integers(-30, 10))


@settings(max_examples=80, deadline=None)
@given(global_case())
def test_global_avgpool_equal(clib, case):
    ffi, lib = clib
    x, e, ex, ee = case
    H, W, C = x.shape
    P = H * W
    m, sh = ravg.reciprocal(P)
    y_ref, ey_ref, nsat_f = ravg.global_forward(x, ex)
    dx_ref, edx_ref, nsat_b, grads = ravg.global_backward(e, ee, x.shape)
    assert y_ref.shape == (C,) and y_ref.dtype == np.int8 and dx_ref.dtype == np.int8
    assert dx_ref.shape == x.shape and grads == []
    # the 1-D view (L, C) = (H*W, C) gives the same result
    assert np.array_equal(ravg.global_forward(x.reshape(P, C), ex)[0], y_ref)

    stats = np.zeros(4, np.int64)
    y, dx = np.zeros(C, np.int8), np.zeros((P, C), np.int8)
    assert kp.global_avgpool_fwd(x.reshape(P, C), ex, m, sh, y, stats) == ey_ref
    assert kp.global_avgpool_bwd(e, ee, m, sh, dx, stats) == edx_ref
    assert np.array_equal(y, y_ref) and np.array_equal(dx.reshape(x.shape), dx_ref)
    assert stats[0] == nsat_f + nsat_b

    ctx, st_c = c_ctx(ffi)
    p = ffi.new("tt_global_pool_params *", dict(P=P, C=C, mult=m, shift=sh))
    yc, dxc = np.zeros(C, np.int8), np.zeros_like(x)
    assert lib.tt_global_avgpool_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc)) == ey_ref
    assert lib.tt_global_avgpool_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dxc)) == edx_ref
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref)
    assert st_c.saturated == nsat_f + nsat_b


@pytest.mark.parametrize("k,s", [((2, 2), (2, 2)), ((3, 3), (1, 1)), ((3, 2), (2, 3)), ((5, 5), (1, 2))])
def test_avgpool_against_python_ints(k, s):
    """Window sums, multiplier and requantization recomputed with Python ints; and for a
    power-of-two window, y * 2^ey is the exact mean rounded half up to the output grid."""
    rng = np.random.default_rng(k[0] * 10 + s[1])
    x = rng.integers(-127, 128, (9, 8, 3)).astype(np.int8)
    y, ey, _ = ravg.forward(x, -7, k, s)
    P = k[0] * k[1]
    m, kk = ravg.reciprocal(P)
    OH, OW = (9 - k[0]) // s[0] + 1, (8 - k[1]) // s[1] + 1
    acc = {(oh, ow, c): m * sum(int(x[oh * s[0] + i, ow * s[1] + j, c]) for i in range(k[0]) for j in range(k[1]))
           for oh in range(OH) for ow in range(OW) for c in range(3)}
    sh = max(0, max(abs(v) for v in acc.values()).bit_length() - 7)
    for (oh, ow, c), v in acc.items():
        want = max(-127, min(127, (2 * v + 2**sh) // 2 ** (sh + 1) if sh else v))
        assert y[oh, ow, c] == want
    assert ey == -7 - kk + sh
    if P & (P - 1) == 0:
        from fractions import Fraction
        for (oh, ow, c), v in acc.items():
            mean = Fraction(v, P) * Fraction(2) ** -7  # the exact real mean
            q = mean / Fraction(2) ** ey  # on the output grid
            assert y[oh, ow, c] == min(127, max(-127, (q + Fraction(1, 2)).__floor__()))


@settings(max_examples=30, deadline=None)
@given(pool_case())
def test_avgpool_backward_is_adjoint(case):
    """Forward's linear part y_acc = m * S x, backward's dx_acc = m * S^T e."""
    x, e, k, s, _, _ = case
    y_acc, dk_f = ravg.forward_acc(x, k, s)
    dx_acc, dk_b = ravg.backward_acc(e, x.shape, k, s)
    assert dk_f == dk_b
    assert int((dx_acc * x).sum()) == int((e.astype(np.int64) * y_acc).sum())


def test_pool_edges_ubsan(clib_ubsan):
    """All +-127 inputs, big windows (int64 products), saturation counting, under UBSan."""
    ffi, lib = clib_ubsan
    full = np.full((8, 8, 2), 127, np.int8)
    full[:, :, 1] = -127
    e = np.full((2, 2, 2), -127, np.int8)
    for k, s in [((8, 8), (1, 1)), ((7, 5), (1, 3)), ((4, 4), (4, 4)), ((3, 3), (2, 2))]:
        OH, OW = (8 - k[0]) // s[0] + 1, (8 - k[1]) // s[1] + 1
        ee = np.resize(e, (OH, OW, 2))
        y, ey, dx, edx = _avgpool_all(lib, ffi, full, ee, k, s, 0, 0)
        assert (y[..., 0] == 127).all() and (y[..., 1] == -127).all()
        yc, _, dxc, edxc, _ = _maxpool_c(lib, ffi, full, ee, 0, 0, k, s)
        assert np.array_equal(yc, rmax.forward(full, 0, k, s)[0])
        assert np.array_equal(dxc, rmax.backward(ee, 0, full, k, s)[0])
    # a mean of three 127s with (m, k) = (21845, 16): 127 * 3 * 21845 = 8322945 has 23 bits,
    # shift 16: 126.998.. rounds to 127 at exponent 0
    y, ey, nsat = ravg.forward(full[:1, :3, :1], 0, (1, 3))
    assert y.reshape(-1).tolist() == [127] and ey == 0 and nsat == 0
    # the one saturation: a sum that rounds up to 128 (255 -> shift 1 -> 128 -> 127); -255
    # rounds (ties toward +inf) to -127 and does not saturate
    x = np.array([[[127], [127], [1], [0], [-127], [-127], [-1], [0]]], np.int8)
    y, ey, nsat = ravg.forward(x, 0, (1, 4))
    assert y.reshape(-1).tolist() == [127, -127] and ey == -1 and nsat == 1
    (ctx, st_c), yc = c_ctx(ffi), np.zeros(2, np.int8)
    p = ffi.new("tt_pool1d_params *", dict(L=8, C=1, k=4, stride=4, mult=1, shift=2))
    assert lib.tt_avgpool1d_fwd_s8(ctx, p, c_i8(ffi, x[0]), 0, c_i8(ffi, yc)) == -1
    assert yc.tolist() == [127, -127] and st_c.saturated == 1
