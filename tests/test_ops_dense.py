"""Dense: reference == numba == C on hypothesis-drawn shapes, values and exponents."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.kernels import dense as kd
from tinytrain.ops import dense as rd

from .oputil import c_ctx, c_i8, c_i16, c_i32, draw_array


@st.composite
def dense_case(draw):
    K = draw(st.integers(1, 80))
    N = draw(st.integers(1, 40))
    x = draw_array(draw, (K,), np.int8, -127, 127)
    w = draw_array(draw, (N, K), np.int16, -32767, 32767)
    b = draw_array(draw, (N,), np.int32, -(2**31) + 1, 2**31 - 1)
    e = draw_array(draw, (N,), np.int8, -127, 127)
    ex, ew, eb, ee = (draw(st.integers(-30, 10)) for _ in range(4))
    return x, w, b, e, ex, ew, eb, ee


@settings(max_examples=150, deadline=None)
@given(dense_case())
def test_dense_forward_backward_equal(clib, case):
    ffi, lib = clib
    x, w, b, e, ex, ew, eb, ee = case
    N, K = w.shape
    y_ref, ey_ref, nsat_ref = rd.forward(x, ex, w, ew, b, eb)
    dx_ref, edx_ref, _, grads = rd.backward(e, ee, x, ex, w, ew)
    assert y_ref.dtype == np.int8 and dx_ref.dtype == np.int8
    assert all(g.dtype == np.int32 for g, _ in grads)

    stats = np.zeros(4, np.int64)
    y = np.zeros(N, np.int8)
    ey = kd.dense_fwd(x, ex, w, ew, b, eb, np.zeros(N, np.int64), y, stats)
    assert ey == ey_ref and np.array_equal(y, y_ref) and stats[0] == nsat_ref
    dx = np.zeros(K, np.int8)
    edx = kd.dense_bwd(e, ee, w, ew, np.zeros(K, np.int64), dx, stats)
    assert edx == edx_ref and np.array_equal(dx, dx_ref)
    gw, gb = np.zeros((N, K), np.int32), np.zeros(N, np.int32)
    kd.dense_grad(e, x, gw, gb)
    assert np.array_equal(gw, grads[0][0]) and np.array_equal(gb, grads[1][0])

    yc = np.zeros(N, np.int8)
    scratch = np.zeros(max(N, K), np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    p = ffi.new("tt_dense_params *", dict(K=K, N=N, w=c_i16(ffi, w), ew=ew, b=c_i32(ffi, b), eb=eb))
    eyc = lib.tt_dense_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc))
    assert eyc == ey_ref and np.array_equal(yc, y_ref) and st_c.saturated == nsat_ref
    dxc = np.zeros(K, np.int8)
    edxc = lib.tt_dense_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dxc))
    assert edxc == edx_ref and np.array_equal(dxc, dx_ref)
    gwc, gbc = np.zeros((N, K), np.int32), np.zeros(N, np.int32)
    lib.tt_dense_grad_s32(p, c_i8(ffi, e), c_i8(ffi, x), c_i32(ffi, gwc), c_i32(ffi, gbc))
    assert np.array_equal(gwc, grads[0][0]) and np.array_equal(gbc, grads[1][0])


def test_dense_forward_exact_against_python_ints():
    rng = np.random.default_rng(0)
    x = rng.integers(-127, 128, 5).astype(np.int8)
    w = rng.integers(-32767, 32768, (3, 5)).astype(np.int16)
    b = rng.integers(-1000, 1000, 3).astype(np.int32)
    y, ey, _ = rd.forward(x, -3, w, -14, b, -22)
    # b at -22 aligned to -3 + -14 = -17: round-to-nearest right shift by 5
    acc = [sum(int(x[k]) * int(w[n, k]) for k in range(5)) + ((int(b[n]) >> 5) + ((int(b[n]) >> 4) & 1))
           for n in range(3)]
    m = max(abs(a) for a in acc)
    s = max(0, m.bit_length() - 7)
    want = [max(-127, min(127, (a >> s) + ((a >> (s - 1)) & 1) if s else a)) for a in acc]
    assert y.tolist() == want and ey == -17 + s
