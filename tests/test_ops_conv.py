"""Conv2d, DepthwiseConv2d, Conv1d: reference == numba == C on hypothesis-drawn shapes, values,
exponents, strides and paddings; the reference against direct integer computations; backward
as the exact adjoint of forward's linear part; the int32 gradient bound."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from tinytrain.kernels import conv as kc
from tinytrain.ops import conv1d as r1
from tinytrain.ops import conv2d as r2
from tinytrain.ops import depthwise as rdw

from .oputil import c_ctx, c_i8, c_i16, c_i32, draw_array

GUARD = 3  # sentinel elements after every buffer the C kernels write


def guarded(n, dtype, fill=0):
    """A flat buffer of n elements followed by GUARD sentinels; returns (buffer, view of n)."""
    a = np.full(n + GUARD, 0x5A, dtype)
    a[:n] = fill
    return a, a[:n]


def untouched(a, n):
    return bool(np.all(a[n:] == 0x5A))


# ----------------------------------------------------------------------------- drawing


@st.composite
def conv_case(draw, depthwise=False, one_d=False):
    H = 1 if one_d else draw(st.integers(1, 8))
    W = draw(st.integers(1, 12 if one_d else 8))
    KH = 1 if one_d else draw(st.integers(1, 4))
    KW = draw(st.integers(1, 5 if one_d else 4))
    stride = (1 if one_d else draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    if draw(st.booleans()):
        padding = draw(st.sampled_from(["valid", "same"]))
    else:
        padding = (0, 0) if one_d else (draw(st.integers(0, KH)), draw(st.integers(0, KH)))
        padding = (*padding, draw(st.integers(0, KW)), draw(st.integers(0, KW)))
    try:
        OH, OW, _, pads = r2.geometry(H, W, KH, KW, stride, padding)
    except ValueError:
        assume(False)
    Cin = draw(st.integers(1, 6))
    Cout = Cin if depthwise else draw(st.integers(1, 6))
    wshape = (KH, KW, Cin) if depthwise else (Cout, KH, KW, Cin)
    x = draw_array(draw, (H, W, Cin), np.int8, -127, 127)
    w = draw_array(draw, wshape, np.int16, -32767, 32767)
    b = draw_array(draw, (Cout,), np.int32, -(2**31) + 1, 2**31 - 1)
    e = draw_array(draw, (OH, OW, Cout), np.int8, -127, 127)
    exps = tuple(draw(st.integers(-30, 10)) for _ in range(4))
    return dict(x=x, w=w, b=b, e=e, exps=exps, stride=stride, padding=padding, pads=pads)


# ------------------------------------------------------------- three implementations


def run_ref(mod, c, **cfg):
    x, w, b, e = c["x"], c["w"], c["b"], c["e"]
    ex, ew, eb, ee = c["exps"]
    y, ey, nsat = mod.forward(x, ex, w, ew, b, eb, **cfg)
    dx, edx, nsat_dx, grads = mod.backward(e, ee, x, ex, w, ew, **cfg)
    _, _, _, grads_nodx = mod.backward(e, ee, x, ex, w, ew, **cfg, need_dx=False)
    assert all(np.array_equal(g, h) and eg == eh for (g, eg), (h, eh) in zip(grads, grads_nodx))
    assert y.dtype == np.int8 and dx.dtype == np.int8 and dx.shape == x.shape
    assert [g.dtype for g, _ in grads] == [np.int32, np.int32]
    assert grads[0][0].shape == w.shape and grads[0][1] == ee + ex and grads[1][1] == ee
    return y, ey, nsat, dx, edx, nsat_dx, grads[0][0], grads[1][0]


def run_numba(fwd, bwd, grad, c, cfg_args, x, w, e):
    ex, ew, eb, ee = c["exps"]
    stats = np.zeros(4, np.int64)
    scratch = np.full(max(e.size, x.size), -(2**62), np.int64)  # shared, stale contents
    y = np.zeros(e.shape, np.int8)
    ey = fwd(x, ex, w, ew, c["b"], eb, *cfg_args, scratch, y, stats)
    nsat = int(stats[0])
    dx = np.zeros(x.shape, np.int8)
    scratch[:] = 2**62
    edx = bwd(e, ee, w, ew, *cfg_args, scratch, dx, stats)
    gw, gb = np.zeros(w.shape, np.int32), np.zeros(e.shape[-1], np.int32)
    grad(e, x, *cfg_args, gw, gb)
    return y, ey, nsat, dx, edx, int(stats[0]) - nsat, gw, gb


def run_c(ffi, fwd, bwd, grad, c, ctype, dims, x, w, e):
    """ctype, dims: the C params struct and its geometry fields (w, ew, b, eb are added here)."""
    ex, ew, eb, ee = c["exps"]
    nscr = max(e.size, x.size)
    scr_g, scr = guarded(nscr, np.int64, fill=-(2**62))
    ctx, st_c = c_ctx(ffi, scr_g)
    p = ffi.new(f"{ctype} *", dict(dims, w=c_i16(ffi, w), ew=ew, b=c_i32(ffi, c["b"]), eb=eb))
    y_g, y = guarded(e.size, np.int8)
    ey = fwd(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y_g))
    nsat = st_c.saturated
    dx_g, dx = guarded(x.size, np.int8)
    edx = bwd(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dx_g))
    gw_g, gw = guarded(w.size, np.int32, fill=7)
    gb_g, gb = guarded(e.shape[-1], np.int32, fill=7)
    grad(p, c_i8(ffi, e), c_i8(ffi, x), c_i32(ffi, gw_g), c_i32(ffi, gb_g))
    for buf, n in ((scr_g, nscr), (y_g, e.size), (dx_g, x.size), (gw_g, w.size), (gb_g, gb.size)):
        assert untouched(buf, n), "C kernel wrote past its buffer"
    return (y.reshape(e.shape), ey, nsat, dx.reshape(x.shape), edx, st_c.saturated - nsat,
            gw.reshape(w.shape), gb)


def assert_same(ref, other, who):
    names = ("y", "ey", "nsat", "dx", "edx", "nsat_dx", "gw", "gb")
    for name, r, o in zip(names, ref, other):
        if isinstance(r, np.ndarray):
            assert o.dtype == r.dtype and o.shape == r.shape, (who, name)
            if not np.array_equal(r, o):
                i = tuple(int(v) for v in np.argwhere(r != o)[0])
                pytest.fail(f"{who}: {name} differs first at {i}: ref {r[i]} vs {o[i]}")
        else:
            assert r == o, (who, name, r, o)


def check_conv2d(clib, c):
    ffi, lib = clib
    x, w, e = c["x"], c["w"], c["e"]
    ref = run_ref(r2, c, stride=c["stride"], padding=c["padding"])
    (sh, sw), (pt, _, pl, _) = c["stride"], c["pads"]
    cfg = (sh, sw, pt, pl)
    nb = run_numba(kc.conv2d_fwd, kc.conv2d_bwd, kc.conv2d_grad, c, cfg, x, w, e)
    assert_same(ref, nb, "numba")
    H, W, Cin = x.shape
    Cout, KH, KW, _ = w.shape
    OH, OW, _ = e.shape
    dims = dict(H=H, W=W, Cin=Cin, Cout=Cout, kh=KH, kw=KW, stride_h=sh, stride_w=sw, pad_h=pt, pad_w=pl,
                Ho=OH, Wo=OW)
    assert_same(ref, run_c(ffi, lib.tt_conv2d_fwd_s8, lib.tt_conv2d_bwd_s8, lib.tt_conv2d_grad_s32,
                           c, "tt_conv_params", dims, x, w, e), "C")


def check_depthwise(clib, c):
    ffi, lib = clib
    x, w, e = c["x"], c["w"], c["e"]
    ref = run_ref(rdw, c, stride=c["stride"], padding=c["padding"])
    (sh, sw), (pt, _, pl, _) = c["stride"], c["pads"]
    cfg = (sh, sw, pt, pl)
    nb = run_numba(kc.depthwise_fwd, kc.depthwise_bwd, kc.depthwise_grad, c, cfg, x, w, e)
    assert_same(ref, nb, "numba")
    H, W, C = x.shape
    KH, KW, _ = w.shape
    OH, OW, _ = e.shape
    dims = dict(H=H, W=W, Cin=C, Cout=C, kh=KH, kw=KW, stride_h=sh, stride_w=sw, pad_h=pt, pad_w=pl,
                Ho=OH, Wo=OW)
    assert_same(ref, run_c(ffi, lib.tt_depthwise_fwd_s8, lib.tt_depthwise_bwd_s8,
                           lib.tt_depthwise_grad_s32, c, "tt_conv_params", dims, x, w, e), "C")


def as_1d(c):
    """The Conv1d view of a case drawn with H = KH = 1."""
    pad = c["padding"] if isinstance(c["padding"], str) else c["padding"][2:]
    x, w, e = (np.ascontiguousarray(a) for a in (c["x"][0], c["w"][:, 0], c["e"][0]))
    return dict(c, x=x, w=w, e=e, stride=c["stride"][1], padding=pad,
                pads=c["pads"][2:])


def check_conv1d(clib, c):
    ffi, lib = clib
    x, w, e = c["x"], c["w"], c["e"]
    ref = run_ref(r1, c, stride=c["stride"], padding=c["padding"])
    s, pl = c["stride"], c["pads"][0]
    assert_same(ref, run_numba(kc.conv1d_fwd, kc.conv1d_bwd, kc.conv1d_grad, c, (s, pl), x, w, e),
                "numba")
    L, Cin = x.shape
    Cout, K, _ = w.shape
    dims = dict(L=L, Cin=Cin, Cout=Cout, k=K, stride=s, pad=pl, Lo=e.shape[0])
    assert_same(ref, run_c(ffi, lib.tt_conv1d_fwd_s8, lib.tt_conv1d_bwd_s8, lib.tt_conv1d_grad_s32,
                           c, "tt_conv1d_params", dims, x, w, e), "C")


# --------------------------------------------------------------- equality properties


@settings(max_examples=120, deadline=None)
@given(conv_case())
def test_conv2d_ref_numba_c_equal(clib, c):
    check_conv2d(clib, c)


@settings(max_examples=120, deadline=None)
@given(conv_case(depthwise=True))
def test_depthwise_ref_numba_c_equal(clib, c):
    check_depthwise(clib, c)


@settings(max_examples=120, deadline=None)
@given(conv_case(one_d=True))
def test_conv1d_ref_numba_c_equal(clib, c):
    check_conv1d(clib, as_1d(c))


@settings(max_examples=20, deadline=None)
@given(conv_case(), conv_case(depthwise=True), conv_case(one_d=True))
def test_conv_family_under_ubsan(clib_ubsan, c2, cdw, c1):
    check_conv2d(clib_ubsan, c2)
    check_depthwise(clib_ubsan, cdw)
    check_conv1d(clib_ubsan, as_1d(c1))


@pytest.mark.parametrize("xv, wv, ev", [(127, 32767, 127), (-127, 32767, -127), (127, -32767, 127)])
def test_conv_extremes(clib, clib_ubsan, xv, wv, ev):
    """All-extreme tensors: the largest accumulators, the saturation path and its count."""
    for lib in (clib, clib_ubsan):
        c = dict(x=np.full((7, 6, 5), xv, np.int8), w=np.full((4, 3, 3, 5), wv, np.int16),
                 b=np.full(4, 2**31 - 1, np.int32), e=np.full((4, 3, 4), ev, np.int8),
                 exps=(-7, -15, -3, -9), stride=(2, 2), padding="same", pads=(1, 1, 0, 1))
        assert r2.geometry(7, 6, 3, 3, 2, "same") == (4, 3, (2, 2), (1, 1, 0, 1))
        check_conv2d(lib, c)
        cdw = dict(c, w=np.full((3, 3, 5), wv, np.int16), b=np.full(5, -(2**31) + 1, np.int32),
                   e=np.full((4, 3, 5), ev, np.int8))
        check_depthwise(lib, cdw)
        c1 = as_1d(dict(c, x=c["x"][:1], w=c["w"][:, :1], e=c["e"][:1], stride=(1, 2),
                        padding=(0, 0, 1, 1), pads=(0, 0, 1, 1)))
        check_conv1d(lib, c1)


# ---------------------------------------------------- the reference against exact math


def test_conv2d_forward_acc_against_python_ints():
    rng = np.random.default_rng(1)
    x = rng.integers(-127, 128, (5, 6, 3)).astype(np.int8)
    w = rng.integers(-32767, 32768, (2, 3, 2, 3)).astype(np.int16)
    sh, sw, (pt, pb, pl, pr) = 2, 1, (1, 0, 2, 1)
    acc = r2.forward_acc(x, w, (sh, sw), (pt, pb, pl, pr))
    OH, OW = (5 + 1 - 3) // 2 + 1, (6 + 3 - 2) + 1
    assert acc.shape == (OH, OW, 2) and acc.dtype == np.int64
    for oh in range(OH):
        for ow in range(OW):
            for co in range(2):
                want = 0
                for kh in range(3):
                    for kw in range(2):
                        ih, iw = oh * sh + kh - pt, ow * sw + kw - pl
                        if 0 <= ih < 5 and 0 <= iw < 6:
                            want += sum(int(x[ih, iw, ci]) * int(w[co, kh, kw, ci])
                                        for ci in range(3))
                assert int(acc[oh, ow, co]) == want


def test_conv2d_forward_requant_against_python_ints():
    rng = np.random.default_rng(2)
    x = rng.integers(-127, 128, (4, 4, 2)).astype(np.int8)
    w = rng.integers(-32767, 32768, (3, 2, 2, 2)).astype(np.int16)
    b = rng.integers(-(2**31) + 1, 2**31, 3).astype(np.int32)
    y, ey, _ = r2.forward(x, -4, w, -15, b, -25, 1, "valid")
    acc = r2.forward_acc(x, w, 1, "valid").astype(object)
    # b at -25 aligned to -4 + -15 = -19: round-to-nearest right shift by 6
    acc = acc + np.array([(int(v) >> 6) + ((int(v) >> 5) & 1) for v in b], dtype=object)
    m = max(abs(int(a)) for a in acc.ravel())
    s = max(0, m.bit_length() - 7)
    want = [max(-127, min(127, (int(a) >> s) + ((int(a) >> (s - 1)) & 1) if s else int(a)))
            for a in acc.ravel()]
    assert y.ravel().tolist() == want and ey == -19 + s


@pytest.mark.parametrize("stride, pads", [(1, (0, 0)), (2, (0, 0)), (3, (2, 1)), (1, (4, 4))])
def test_conv1d_against_np_correlate(stride, pads):
    rng = np.random.default_rng(3)
    x = rng.integers(-127, 128, (23, 1)).astype(np.int8)
    w = rng.integers(-32767, 32768, (1, 4, 1)).astype(np.int16)
    acc = r1.forward_acc(x, w, stride, pads)
    xp = np.pad(x[:, 0].astype(np.int64), pads)
    want = np.correlate(xp, w[0, :, 0].astype(np.int64), "valid")
    assert np.array_equal(acc[:, 0], want[::stride])


@settings(max_examples=40, deadline=None)
@given(conv_case(depthwise=True))
def test_depthwise_is_conv2d_with_diagonal_weights(c):
    """Depthwise == Conv2d whose weight is zero off the channel diagonal: same y, dx and nsat;
    the depthwise gw and gb are the diagonal of Conv2d's."""
    C = c["x"].shape[2]
    eye = np.eye(C, dtype=np.int16)
    w2 = np.einsum("hwc,cd->chwd", c["w"], eye).astype(np.int16)
    cfg = dict(stride=c["stride"], padding=c["padding"])
    ref_dw = run_ref(rdw, c, **cfg)
    ref_2 = run_ref(r2, dict(c, w=w2), **cfg)
    gw2 = ref_2[6]
    ref_2 = (*ref_2[:6], np.einsum("chwc->hwc", gw2), ref_2[7])
    assert_same(ref_2, ref_dw, "depthwise vs conv2d")


@settings(max_examples=60, deadline=None)
@given(conv_case(), conv_case(depthwise=True), conv_case(one_d=True))
def test_backward_is_adjoint_of_forward(c2, cdw, c1):
    """<dx_acc, x> == <e, y_acc> exactly (int64, Python-int sums), bias excluded."""
    def dot(a, b):
        return int(np.sum(a.astype(object) * b.astype(object)))

    c1 = as_1d(c1)
    for mod, c in ((r2, c2), (rdw, cdw), (r1, c1)):
        cfg = (c["stride"], c["padding"])
        fa = mod.forward_acc(c["x"], c["w"], *cfg)
        ba = mod.backward_acc(c["e"], c["w"], c["x"].shape, *cfg)
        assert fa.dtype == np.int64 and ba.dtype == np.int64 and fa.shape == c["e"].shape
        assert dot(ba, c["x"]) == dot(c["e"], fa)


# -------------------------------------------------------------- geometry and the bound


def test_geometry_valid_and_same():
    assert r2.geometry(8, 8, 3, 3, 1, "valid") == (6, 6, (1, 1), (0, 0, 0, 0))
    assert r2.geometry(8, 8, 3, 3, 1, "same") == (8, 8, (1, 1), (1, 1, 1, 1))
    # TF rule: out = ceil(n / s), the odd pad goes after
    assert r2.geometry(8, 7, 3, 4, (2, 3), "same") == (4, 3, (2, 3), (0, 1, 1, 2))
    assert r1.geometry(40, 5, 2, "same") == (20, 2, (1, 2))
    assert r1.geometry(40, 5, 3, (2, 0)) == (13, 3, (2, 0))
    with pytest.raises(ValueError, match="does not fit"):
        r2.geometry(2, 2, 3, 3, 1, "valid")
    with pytest.raises(ValueError, match="padding"):
        r2.geometry(8, 8, 3, 3, 1, "full")


def test_grad_bound_rejected_at_build_time():
    assert r2.GRAD_MAX_POSITIONS == 133144 == (2**31 - 1) // (127 * 127)
    assert r2.GRAD_MAX_POSITIONS * 127 * 127 <= 2**31 - 1 < (r2.GRAD_MAX_POSITIONS + 1) * 127 * 127
    r1.geometry(133144, 1)
    with pytest.raises(ValueError, match="overflows int32"):
        r1.geometry(133145, 1)
    with pytest.raises(ValueError, match="overflows int32"):
        r2.geometry(400, 400, 3, 3, 1, "same")
    x = np.zeros((400, 400, 1), np.int8)
    with pytest.raises(ValueError, match="overflows int32"):
        rdw.forward(x, 0, np.zeros((3, 3, 1), np.int16), 0, np.zeros(1, np.int32), 0, 1, "same")


def test_grad_exact_at_the_int32_bound(clib):
    """OH*OW = GRAD_MAX_POSITIONS with every |e*x| = 127*127: gw = 2147479576, no wrap anywhere."""
    ffi, lib = clib
    n = r2.GRAD_MAX_POSITIONS
    x = np.full((n, 1), -127, np.int8)
    e = np.full((n, 1), 127, np.int8)
    want = -n * 127 * 127
    _, _, _, grads = r1.backward(e, 0, x, 0, np.ones((1, 1, 1), np.int16), 0, need_dx=False)
    assert int(grads[0][0][0, 0, 0]) == want and int(grads[1][0][0]) == n * 127
    gw, gb = np.zeros((1, 1, 1), np.int32), np.zeros(1, np.int32)
    kc.conv1d_grad(e, x, 1, 0, gw, gb)
    assert int(gw[0, 0, 0]) == want and int(gb[0]) == n * 127
    gw[:], gb[:] = 0, 0
    p = ffi.new("tt_conv1d_params *", dict(L=n, Cin=1, Cout=1, k=1, stride=1, pad=0, Lo=n))
    lib.tt_conv1d_grad_s32(p, c_i8(ffi, e), c_i8(ffi, x), c_i32(ffi, gw), c_i32(ffi, gb))
    assert int(gw[0, 0, 0]) == want and int(gb[0]) == n * 127


def test_buffer_size_macros():
    """The TT_*_BUFFER_SIZE macros give 8 bytes per element of the larger of input and output,
    which is exactly the scratch the guarded C runs above use."""
    from tinytrain.device import cbuild

    src = """#include "tt_conv.h"
int32_t m2(int32_t H, int32_t W, int32_t Ci, int32_t OH, int32_t OW, int32_t Co)
{ return TT_CONV2D_BUFFER_SIZE(H, W, Ci, OH, OW, Co); }
int32_t mdw(int32_t H, int32_t W, int32_t C, int32_t OH, int32_t OW)
{ return TT_DEPTHWISE_BUFFER_SIZE(H, W, C, OH, OW); }
int32_t m1(int32_t L, int32_t Ci, int32_t OL, int32_t Co)
{ return TT_CONV1D_BUFFER_SIZE(L, Ci, OL, Co); }
int32_t mpos(void) { return TT_CONV_GRAD_MAX_POSITIONS; }
"""
    cdef = """int32_t m2(int32_t, int32_t, int32_t, int32_t, int32_t, int32_t);
int32_t mdw(int32_t, int32_t, int32_t, int32_t, int32_t);
int32_t m1(int32_t, int32_t, int32_t, int32_t); int32_t mpos(void);"""
    _, lib = cbuild.compile_shared([("tt_conv_macros.c", src)], cdef, name="ttconvmacros")
    assert lib.mpos() == r2.GRAD_MAX_POSITIONS
    for H, W, Ci, OH, OW, Co in [(8, 8, 1, 8, 8, 4), (8, 8, 16, 4, 4, 3), (1, 40, 1, 1, 20, 32)]:
        assert lib.m2(H, W, Ci, OH, OW, Co) == 8 * max(H * W * Ci, OH * OW * Co)
        assert lib.mdw(H, W, Ci, OH, OW) == 8 * Ci * max(H * W, OH * OW)
        assert lib.m1(W, Ci, OW, Co) == 8 * max(W * Ci, OW * Co)
