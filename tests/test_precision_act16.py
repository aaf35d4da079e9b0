"""int16 activations and errors (precision "activations": "int16", "errors": "int16";
graph/act16.py): the policy's checks, the kernels (reference = numba = C) on drawn int16 values,
whole models trained by the reference, numba and C side by side on drawn graphs x policies x
optimizer options, the .tt round trip and the memory plan, and QEMU Cortex-M4 / Cortex-M0."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from tinytrain.graph import io as tio
from tinytrain.graph.conv import AvgPool2d, Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool, MaxPool1d, MaxPool2d
from tinytrain.graph.layers import Dense, Flatten, LeakyReLU, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.residual import Residual
from tinytrain.graph.optim import SGD
from tinytrain.graph.precision import PRESETS, Precision, PrecisionError
from tinytrain.ops import conv1d as r_c1
from tinytrain.ops import conv2d as r_c2
from tinytrain.ops import dense as rdense
from tinytrain.ops import depthwise as r_dw
from tinytrain.ops import leaky_relu as rleaky
from tinytrain.ops import softmax_ce as rsm

from tinytrain import fixedpoint as fp

from .conftest import examples
from .oputil import c_ctx, c_i16, c_i32, draw_array
from .test_exactness import _data, _out, any_optimizer, three_way
from .test_precision import _qemu_missing

A16 = {"activations": "int16", "errors": "int16"}


# ------------------------------------------------------------------------------ the policy
def test_the_preset_is_both_keys():
    assert PRESETS["int16-act16"] == Precision.parse(A16) and PRESETS["int16-act16"].a16
    assert Precision.parse(A16).to_dict() == A16 and PRESETS["int16-act16"].act_bits == 16


@pytest.mark.parametrize("spec, match", [
    ({"activations": "int16"}, 'give "activations" and "errors" the same value'),
    ({"errors": "int16"}, 'give "activations" and "errors" the same value'),
    ({**A16, "weights": "int8"}, 'implemented with int16 weights only, and weights is "int8"'),
    ({**A16, "loss_scale": "global"}, "takes the loss head's error at its dynamic exponent"),
])
def test_bad_int16_policies_name_the_field(spec, match):
    with pytest.raises(PrecisionError, match=match):
        Precision.parse(spec)


def test_layers_without_int16_kernels_are_refused_with_the_fix():
    with pytest.raises(ModelError, match=r'layer 1 \(residual\): precision activations = "int16" is implemented for '
                                         r'avgpool2d, batchnorm, conv1d, conv2d, dense, depthwise_conv2d, flatten, '
                                         r'global_avgpool, leaky_relu, maxpool1d, maxpool2d, relu layers only: use '
                                         r'"activations": "int8"'):
        Sequential([Conv2d(2, 3, padding="same"), Residual([Conv2d(2, 3, padding="same")]), Flatten(), Dense(3)],
                   input_shape=(4, 4, 1), precision=A16)
    with pytest.raises(ModelError, match=r"layer 0 \(conv1d\): 70000 output positions; with int16 errors the bias "
                                         r"gradient .* fits int32 up to 65538: use a larger stride"):
        Sequential([Conv1d(1, 1), Flatten(), Dense(3)], input_shape=(70000, 1), n_classes=3, precision=A16)
    with pytest.raises(ModelError, match="implemented with the softmax_ce head only"):
        Sequential([Dense(3)], input_shape=(4,), loss="mse", precision=A16)
    with pytest.raises(ModelError, match="pruning is not implemented with int16 activations"):
        Sequential([Dense(3)], input_shape=(4,), n_classes=3, precision=A16,
                   prune={"schedule": "one_shot", "final_sparsity": 0.5})
    l = Dense(3)
    l.precision = A16
    with pytest.raises(ModelError, match=r"layer 0 \(dense\) precision: activations is one width for the whole model"):
        Sequential([l], input_shape=(4,), n_classes=3)


# ----------------------------------------------------------------------------- the kernels
@pytest.fixture(scope="session")
def altlib():
    """(ffi, lib) of tt_act16.c with its other paths: the DSP forward (SMLALD, emulated
    intrinsics) and the update's two-product form of the Cortex-M0 (TT_A16_SPLIT_MUL), UBSan on."""
    from pathlib import Path

    from tinytrain.device import cbuild

    from .conftest import runtime_cdef

    here = Path(__file__).parent
    srcs = cbuild.runtime_sources(["tt_fixedpoint", "tt_dense", "tt_sgd", "tt_act16"])
    return cbuild.compile_shared([*srcs, here / "c" / "tt_test_shim.c"], runtime_cdef(), include_dirs=[here / "c"],
                                 extra_flags=["-DTT_HAVE_DSP=1", "-DTT_A16_SPLIT_MUL=1"], sanitize=True,
                                 name="ttrt_a16alt")


@st.composite
def dense_case(draw):
    K, N = draw(st.integers(1, 40)), draw(st.integers(1, 12))
    x = draw_array(draw, (K,), np.int16, -32767, 32767)
    e = draw_array(draw, (N,), np.int16, -32767, 32767)
    w = draw_array(draw, (N, K), np.int16, -32767, 32767)
    b = draw_array(draw, (N,), np.int32, -2**31 + 1, 2**31 - 1)
    return x, e, w, b, draw(st.integers(-20, 0)), draw(st.integers(-16, -8)), draw(st.integers(-30, -10))


@settings(max_examples=examples(120), deadline=None)
@given(dense_case())
def test_dense_s16_c_and_numba_equal_the_reference(clib, altlib, case):
    """int64 sums of int16 x int16 products (K 32767^2 >= 2^31), requantized to +-32767; the C
    portable and with the DSP forward (SMLALD)."""
    from tinytrain.kernels.dense import dense_bwd, dense_fwd, dense_grad

    x, e, w, b, ex, ew, eb = case
    N, K = w.shape
    y_ref, ey_ref, ns_ref = rdense.forward(x, ex, w, ew, b, eb)
    dx_ref, edx_ref, nsb_ref, grads = rdense.backward(e, 0, x, ex, w, ew)
    assert y_ref.dtype == np.int16 and np.abs(y_ref.astype(np.int32)).max() <= 32767
    for ffi, lib in (clib, altlib):
        scratch = np.zeros(max(K, N), np.int64)
        ctx, stc = c_ctx(ffi, scratch)
        p = ffi.new("tt_dense_params *", {"K": K, "N": N, "w": c_i16(ffi, w), "ew": ew, "b": c_i32(ffi, b), "eb": eb})
        y, dx = np.zeros(N, np.int16), np.zeros(K, np.int16)
        assert lib.tt_dense_fwd_s16(ctx, p, c_i16(ffi, x), ex, c_i16(ffi, y)) == ey_ref and np.array_equal(y, y_ref)
        assert lib.tt_dense_bwd_s16(ctx, p, c_i16(ffi, e), 0, c_i16(ffi, dx)) == edx_ref and np.array_equal(dx, dx_ref)
        assert stc.saturated == ns_ref + nsb_ref
        gw, gb = np.zeros((N, K), np.int32), np.zeros(N, np.int32)
        lib.tt_dense_grad_s32_s16(p, c_i16(ffi, e), c_i16(ffi, x), c_i32(ffi, gw), c_i32(ffi, gb))
        assert np.array_equal(gw, grads[0][0]) and np.array_equal(gb, grads[1][0])
    stats = np.zeros(4, np.int64)
    yn, dn = np.zeros(N, np.int16), np.zeros(K, np.int16)
    assert dense_fwd(x, ex, w, ew, b, eb, np.zeros(N, np.int64), yn, stats) == ey_ref and np.array_equal(yn, y_ref)
    assert dense_bwd(e, 0, w, ew, np.zeros(K, np.int64), dn, stats) == edx_ref and np.array_equal(dn, dx_ref)
    gwn, gbn = np.zeros((N, K), np.int32), np.zeros(N, np.int32)
    dense_grad(e, x, gwn, gbn)
    assert np.array_equal(gwn, gw) and np.array_equal(gbn, gb) and stats[0] == ns_ref + nsb_ref


@settings(max_examples=examples(100), deadline=None)
@given(st.data())
def test_softmax_ce_s16_c_and_numba_equal_the_reference(clib, data):
    """int16 logits over their whole range (|d LOG2E_Q15| up to 2^32) and exponents putting the
    shift 7 - ez below 0, in [0, 31], at 32..62 and beyond."""
    from tinytrain.kernels.loss import softmax_ce

    ffi, lib = clib
    N = data.draw(st.integers(1, 30))
    z = draw_array(data.draw, (N,), np.int16, -32767, 32767)
    ez, label = data.draw(st.integers(-80, 14)), data.draw(st.integers(0, N - 1))
    e_ref, ee_ref, ns_ref, loss_ref, pred_ref = rsm.forward_backward(z, ez, label)
    assert e_ref.dtype == np.int16
    scratch = np.zeros(N, np.int64)
    ctx, stc = c_ctx(ffi, scratch)
    e = np.zeros(N, np.int16)
    out = ffi.new("tt_loss_s16_out *", {"e": c_i16(ffi, e)})
    assert lib.tt_softmax_ce_s16(ctx, c_i16(ffi, z), ez, label, N, out) == pred_ref
    assert (out.ee, out.loss_q16, stc.saturated) == (ee_ref, loss_ref, ns_ref) and np.array_equal(e, e_ref)
    e_nb, stats = np.zeros(N, np.int16), np.zeros(4, np.int64)
    assert softmax_ce(z, ez, label, np.zeros(N, np.int64), e_nb, stats) == (ee_ref, loss_ref, pred_ref)
    assert np.array_equal(e_nb, e_ref) and stats[0] == ns_ref


def test_softmax_ce_s16_wide_differences_need_64_bits():
    """(z_i - max z) LOG2E_Q15 beyond 2^31 at a shift of 32: the reference's Python ints, the C's
    int64 and numba agree (a 32-bit product or numba's old 'shift > 31 is 0' would not)."""
    z, ez = np.array([32767, -32767, 0], np.int16), -25
    assert abs(-65534 * 47274) > 2**31
    e_ref, ee, _, loss, _ = rsm.forward_backward(z, ez, 1)
    from tinytrain.kernels.loss import softmax_ce

    e_nb = np.zeros(3, np.int16)
    assert softmax_ce(z, ez, 1, np.zeros(3, np.int64), e_nb, np.zeros(4, np.int64))[:2] == (ee, loss)
    assert np.array_equal(e_nb, e_ref)


@settings(max_examples=examples(60), deadline=None)
@given(st.data())
def test_elementwise_s16_c_equals_the_reference(clib, data):
    ffi, lib = clib
    n = data.draw(st.integers(1, 50))
    x = draw_array(data.draw, (n,), np.int16, -32767, 32767)
    e = draw_array(data.draw, (n,), np.int16, -32767, 32767)
    s = data.draw(st.integers(1, 255))
    _, st_ = c_ctx(ffi)
    y, d = np.zeros(n, np.int16), np.zeros(n, np.int16)
    lib.tt_relu_fwd_s16(c_i16(ffi, x), 0, n, c_i16(ffi, y), st_)
    assert np.array_equal(y, np.maximum(x, 0))
    lib.tt_relu_bwd_s16(c_i16(ffi, e), 0, c_i16(ffi, y), n, c_i16(ffi, d), st_)
    assert np.array_equal(d, np.where(y > 0, e, 0))
    y_ref = rleaky.forward(x, 0, s)[0]
    lib.tt_leaky_relu_fwd_s16(c_i16(ffi, x), 0, n, s, c_i16(ffi, y), st_)
    assert y_ref.dtype == np.int16 and np.array_equal(y, y_ref)
    exact = [v if v > 0 else (v * s + 128) // 256 for v in x.tolist()]  # Python ints: floor division
    assert y.tolist() == exact
    lib.tt_leaky_relu_bwd_s16(c_i16(ffi, e), 0, c_i16(ffi, y), n, s, c_i16(ffi, d), st_)
    assert np.array_equal(d, rleaky.backward(e, 0, y, s)[0])


@settings(max_examples=examples(150), deadline=None)
@given(st.data())
def test_fused_update_equals_the_rule_on_both_multiplies(clib, altlib, data):
    """tt_dense_update_direct_s16_a16 (one SMULL, or two int32 products) == the reference rule
    w = sat(w - rshift_round(m_t e x, s)) in Python ints, for every shift it takes (it declines,
    returning 0 and writing nothing, outside [17, 62], with stochastic rounding or weight decay)."""
    from tinytrain.fixedpoint import rshift_round

    K, N = data.draw(st.integers(1, 20)), data.draw(st.integers(1, 6))
    x = draw_array(data.draw, (K,), np.int16, -32767, 32767)
    e = draw_array(data.draw, (N,), np.int16, -32767, 32767)
    w0 = draw_array(data.draw, (N, K), np.int16, -32767, 32767)
    m_t, k = data.draw(st.integers(0, 32767)), data.draw(st.integers(0, 60))
    ew, ee, ex = data.draw(st.integers(-20, 0)), data.draw(st.integers(-40, 0)), data.draw(st.integers(-20, 0))
    sr, wd = data.draw(st.sampled_from([(0, 0), (0, 0), (1, 0), (0, 5)]))
    s = ew + k - ee - ex
    taken = not sr and not wd and 17 <= s <= 62
    want = w0.copy()
    if taken:
        for n in range(N):
            for j in range(K):
                v = int(w0[n, j]) - rshift_round(m_t * int(e[n]) * int(x[j]), s)
                want[n, j] = max(-32767, min(32767, v))
    for ffi, lib in (clib, altlib):
        w = w0.copy()
        st_ = ffi.new("tt_stats *")
        cfg = ffi.new("tt_sgd *", {"k": k, "sr": sr, "wd_m": wd, "wd_k": 3})
        prng = ffi.new("uint32_t *", 1)
        u = ffi.new("tt_sgd_step *", {"cfg": cfg, "m_t": m_t, "prng": prng, "stats": st_})
        p = ffi.new("tt_sgd_dense_s16_params *", {"K": K, "N": N, "w": c_i16(ffi, w), "ew": ew})
        assert lib.tt_dense_update_direct_s16_a16(u, p, c_i16(ffi, e), ee, c_i16(ffi, x), ex) == int(taken)
        assert np.array_equal(w, want), (s, np.argwhere(w != want)[:1])
        if taken:
            moved = [max(-32767, min(32767, v)) != v for v in
                     (int(w0[n, j]) - rshift_round(m_t * int(e[n]) * int(x[j]), s) for n in range(N) for j in range(K))]
            assert st_.saturated == sum(moved)


# ------------------------------------------------------- convolutions and pooling (tt_act16_conv.c)
@st.composite
def conv16_case(draw, kind):
    """An int16 case of conv2d / depthwise / conv1d: shapes, strides, paddings, channels, values
    over the whole int16 range (edge draws put every |e x| at 32767^2)."""
    one_d, dw = kind == "conv1d", kind == "depthwise"
    H = 1 if one_d else draw(st.integers(1, 7))
    W = draw(st.integers(1, 12 if one_d else 7))
    KH = 1 if one_d else draw(st.integers(1, 3))
    KW = draw(st.integers(1, 4))
    stride = (1 if one_d else draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    if draw(st.booleans()):
        padding = draw(st.sampled_from(["valid", "same"]))
    else:
        padding = (0, 0) if one_d else (draw(st.integers(0, KH)), draw(st.integers(0, KH)))
        padding = (*padding, draw(st.integers(0, KW)), draw(st.integers(0, KW)))
    try:
        OH, OW, _, pads = r_c2.geometry(H, W, KH, KW, stride, padding)
    except ValueError:
        assume(False)
    Cin = draw(st.integers(1, 5))
    Cout = Cin if dw else draw(st.integers(1, 5))
    wshape = (KH, KW, Cin) if dw else (Cout, KH, KW, Cin)
    x = draw_array(draw, (H, W, Cin), np.int16, -32767, 32767)
    w = draw_array(draw, wshape, np.int16, -32767, 32767)
    b = draw_array(draw, (Cout,), np.int32, -(2**31) + 1, 2**31 - 1)
    e = draw_array(draw, (OH, OW, Cout), np.int16, -32767, 32767)
    ex, ew, eb, ee = (draw(st.integers(-30, 10)) for _ in range(4))
    c = dict(x=x, w=w, b=b, e=e, ex=ex, ew=ew, eb=eb, ee=ee, stride=stride, padding=padding, pads=pads)
    if one_d:  # the Conv1d view (H = KH = 1)
        c.update(x=np.ascontiguousarray(x[0]), w=np.ascontiguousarray(w[:, 0]), e=np.ascontiguousarray(e[0]),
                 stride=stride[1], padding=padding if isinstance(padding, str) else padding[2:], pads=pads[2:])
    return c


def _conv16_ref(kind, c):
    mod = {"conv2d": r_c2, "depthwise": r_dw, "conv1d": r_c1}[kind]
    cfg = dict(stride=c["stride"], padding=c["padding"])
    y, ey, ns = mod.forward(c["x"], c["ex"], c["w"], c["ew"], c["b"], c["eb"], **cfg)
    dx, edx, nsd, grads = mod.backward(c["e"], c["ee"], c["x"], c["ex"], c["w"], c["ew"], **cfg)
    assert y.dtype == dx.dtype == np.int16 and [g.dtype for g, _ in grads] == [np.int32, np.int32]
    npos = int(np.prod(c["e"].shape[:-1]))
    gs = r_c2.grad_shift(npos)
    assert grads[0][1] == c["ee"] + c["ex"] + gs and grads[1][1] == c["ee"]
    assert np.abs(grads[0][0].astype(np.int64)).max() <= 2**30
    return y, ey, ns, dx, edx, nsd, grads[0][0], grads[1][0], gs


@pytest.mark.parametrize("kind", ["conv2d", "depthwise", "conv1d"])
@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(data=st.data())
def test_conv_s16_c_and_numba_equal_the_reference(clib, clib_ubsan, kind, data):
    """Reference = numba = C (and under UBSan), the weight gradient also a few output channels at
    a time (the generated step's by-channel update) and against Python ints."""
    from tinytrain.fixedpoint import rshift_round
    from tinytrain.kernels import conv as kc

    c = data.draw(conv16_case(kind))
    x, w, e = c["x"], c["w"], c["e"]
    y_r, ey_r, ns_r, dx_r, edx_r, nsd_r, gw_r, gb_r, gs = _conv16_ref(kind, c)
    # the rounded gradient against Python ints, one weight
    if kind == "conv2d" and w.size:
        import itertools

        xp = np.pad(x.astype(object), ((c["pads"][0], c["pads"][1]), (c["pads"][2], c["pads"][3]), (0, 0)))
        sh, sw = c["stride"]
        OH, OW, _ = e.shape
        co, kh, kw, ci = (data.draw(st.integers(0, n - 1)) for n in w.shape)
        exact = sum(int(e[oh, ow, co]) * int(xp[oh * sh + kh, ow * sw + kw, ci]) for oh, ow in itertools.product(range(OH), range(OW)))
        assert gw_r[co, kh, kw, ci] == rshift_round(exact, gs)
    if kind == "conv1d":
        nb_cfg, s, pl = (c["stride"], c["pads"][0]), c["stride"], c["pads"][0]
    else:
        (sh, sw), (pt, _, pl, _) = c["stride"], c["pads"]
        nb_cfg = (sh, sw, pt, pl)
    name = kind
    fwd, bwd, grad = (getattr(kc, f"{name}_{k}") for k in ("fwd", "bwd", "grad_a16"))
    stats = np.zeros(4, np.int64)
    scratch = np.full(max(e.size, x.size), 2**62, np.int64)
    y, dx = np.zeros(e.shape, np.int16), np.zeros(x.shape, np.int16)
    assert fwd(x, c["ex"], w, c["ew"], c["b"], c["eb"], *nb_cfg, scratch, y, stats) == ey_r and np.array_equal(y, y_r)
    assert bwd(e, c["ee"], w, c["ew"], *nb_cfg, scratch, dx, stats) == edx_r and np.array_equal(dx, dx_r)
    gw, gb = np.zeros(w.shape, np.int32), np.zeros(e.shape[-1], np.int32)
    grad(e, x, *nb_cfg, gs, gw, gb)
    assert np.array_equal(gw, gw_r) and np.array_equal(gb, gb_r) and stats[0] == ns_r + nsd_r
    for ffi, lib in (clib, clib_ubsan):
        if kind == "conv1d":
            L, Cin = x.shape
            Cout, K, _ = w.shape
            ctype, dims = "tt_conv1d_params", dict(L=L, Cin=Cin, Cout=Cout, k=K, stride=s, pad=pl, Lo=e.shape[0])
        else:
            H, W, Cin = x.shape
            KH, KW = w.shape[-3:-1]
            ctype = "tt_conv_params"
            dims = dict(H=H, W=W, Cin=Cin, Cout=e.shape[-1], kh=KH, kw=KW, stride_h=sh, stride_w=sw, pad_h=pt,
                        pad_w=pl, Ho=e.shape[0], Wo=e.shape[1])
        p = ffi.new(f"{ctype} *", dict(dims, w=c_i16(ffi, w), ew=c["ew"], b=c_i32(ffi, c["b"]), eb=c["eb"]))
        scr = np.full(max(e.size, x.size) + 2, -(2**62), np.int64)
        ctx, stc = c_ctx(ffi, scr)
        yc, dxc = np.full(e.size + 2, 77, np.int16), np.full(x.size + 2, 77, np.int16)
        assert getattr(lib, f"tt_{name}_fwd_s16")(ctx, p, c_i16(ffi, x), c["ex"], c_i16(ffi, yc)) == ey_r
        assert getattr(lib, f"tt_{name}_bwd_s16")(ctx, p, c_i16(ffi, e), c["ee"], c_i16(ffi, dxc)) == edx_r
        assert np.array_equal(yc[:-2].reshape(e.shape), y_r) and np.array_equal(dxc[:-2].reshape(x.shape), dx_r)
        assert list(yc[-2:]) == list(dxc[-2:]) == [77, 77] and stc.saturated == ns_r + nsd_r
        gwc, gbc = np.full(w.size + 1, 5, np.int32), np.full(gb.size + 1, 5, np.int32)
        getattr(lib, f"tt_{name}_grad_s32_s16")(p, c_i16(ffi, e), c_i16(ffi, x), gs, c_i32(ffi, gwc), c_i32(ffi, gbc))
        assert np.array_equal(gwc[:-1].reshape(w.shape), gw_r) and np.array_equal(gbc[:-1], gb_r)
        assert gwc[-1] == gbc[-1] == 5
        if kind != "depthwise":  # by channel: nco output channels from co
            Cout = w.shape[0]
            co = data.draw(st.integers(0, Cout - 1))
            nco = data.draw(st.integers(1, Cout - co))
            chan = w.size // Cout
            gch = np.full(nco * chan + 1, 5, np.int32)
            getattr(lib, f"tt_{name}_grad_w_chan_s32_s16")(p, c_i16(ffi, e), c_i16(ffi, x), gs, co, nco, c_i32(ffi, gch))
            assert np.array_equal(gch[:-1], gw_r.reshape(Cout, -1)[co:co + nco].reshape(-1)) and gch[-1] == 5
            gbc[:] = 5
            getattr(lib, f"tt_{name}_grad_b_s32_s16")(p, c_i16(ffi, e), c_i32(ffi, gbc))
            assert np.array_equal(gbc[:-1], gb_r)


def test_conv_s16_gradient_at_its_bound():
    """Every |e x| = 32767^2 over OH*OW positions: the int64 sum rounded by grad_shift stays
    within 2^30 (an int32 sum would wrap from three positions on)."""
    for npos in (1, 2, 3, 64, 65, 4096):
        g = r_c2.grad_shift(npos)
        top = npos * 32767 * 32767
        assert top >= 2**31 or npos <= 2
        from tinytrain.fixedpoint import rshift_round

        assert rshift_round(top, g) <= 2**30 and rshift_round(-top, g) >= -(2**30)
    x = np.full((8, 8, 1), 32767, np.int16)
    e = np.full((8, 8, 1), -32767, np.int16)
    w = np.zeros((1, 1, 1, 1), np.int16)
    (gw, egw), (gb, egb) = r_c2.backward(e, 0, x, 0, w, 0, need_dx=False)[3]
    assert egw == 6 and gw.ravel()[0] == -(64 * 32767 * 32767 >> 6) and gb[0] == -64 * 32767


@settings(max_examples=examples(80), deadline=None)
@given(st.data())
def test_maxpool_s16_c_and_numba_equal_the_reference(clib, clib_ubsan, data):
    """2-D and 1-D, strides below the kernel (overlap: the routed sums requantized at 16 bits)
    and at or above it, ties (edge draws)."""
    from tinytrain.kernels import pool as kp
    from tinytrain.ops import maxpool as rmp

    one_d = data.draw(st.booleans())
    H = 1 if one_d else data.draw(st.integers(1, 6))
    W, C = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 4))
    kh = 1 if one_d else data.draw(st.integers(1, H))
    kw = data.draw(st.integers(1, W))
    sh = 1 if one_d else data.draw(st.integers(1, 3))
    sw = data.draw(st.integers(1, 3))
    x = draw_array(data.draw, (H, W, C), np.int16, -32767, 32767)
    OH, OW = (H - kh) // sh + 1, (W - kw) // sw + 1
    e = draw_array(data.draw, (OH, OW, C), np.int16, -32767, 32767)
    y_r, ey_r, _ = rmp.forward(x, 3, (kh, kw), (sh, sw))
    dx_r, edx_r, ns_r, _ = rmp.backward(e, -4, x, (kh, kw), (sh, sw))
    assert y_r.dtype == dx_r.dtype == np.int16 and ey_r == 3
    stats = np.zeros(4, np.int64)
    y, dx = np.zeros(e.shape, np.int16), np.zeros(x.shape, np.int16)
    assert kp.maxpool2d_fwd(x, 3, kh, kw, sh, sw, y, stats) == 3 and np.array_equal(y, y_r)
    assert kp.maxpool2d_bwd(e, -4, x, kh, kw, sh, sw, np.zeros(x.size, np.int32), dx, stats) == edx_r
    assert np.array_equal(dx, dx_r) and stats[0] == ns_r
    for ffi, lib in (clib, clib_ubsan):
        scr = np.zeros(x.size, np.int64)
        ctx, stc = c_ctx(ffi, scr)
        yc, dxc = np.zeros(e.shape, np.int16), np.zeros(x.shape, np.int16)
        if one_d:
            p = ffi.new("tt_pool1d_params *", dict(L=W, C=C, k=kw, stride=sw))
            fwd, bwd = lib.tt_maxpool1d_fwd_s16, lib.tt_maxpool1d_bwd_s16
        else:
            p = ffi.new("tt_pool_params *", dict(H=H, W=W, C=C, kh=kh, kw=kw, stride_h=sh, stride_w=sw))
            fwd, bwd = lib.tt_maxpool2d_fwd_s16, lib.tt_maxpool2d_bwd_s16
        assert fwd(ctx, p, c_i16(ffi, x), 3, c_i16(ffi, yc)) == 3 and np.array_equal(yc, y_r)
        assert bwd(ctx, p, c_i16(ffi, e), -4, c_i16(ffi, x), c_i16(ffi, dxc)) == edx_r
        assert np.array_equal(dxc, dx_r) and stc.saturated == ns_r


@settings(max_examples=examples(80), deadline=None)
@given(st.data())
def test_avgpool_s16_c_and_numba_equal_the_reference(clib, clib_ubsan, data):
    """AvgPool2d (windows overlapping or not, power-of-two and other sizes) and GlobalAvgPool on
    int16 extremes: reference == numba == C == C under UBSan."""
    from tinytrain.kernels import pool as kp
    from tinytrain.ops import avgpool as ravg

    glob = data.draw(st.booleans())
    H, W, C = data.draw(st.integers(1, 6)), data.draw(st.integers(1, 9)), data.draw(st.integers(1, 4))
    kh, kw = (H, W) if glob else (data.draw(st.integers(1, H)), data.draw(st.integers(1, W)))
    sh, sw = (1, 1) if glob else (data.draw(st.integers(1, 3)), data.draw(st.integers(1, 3)))
    m, k = ravg.reciprocal(kh * kw)
    x = draw_array(data.draw, (H, W, C), np.int16, -32767, 32767)
    OH, OW = (H - kh) // sh + 1, (W - kw) // sw + 1
    e = draw_array(data.draw, (OH, OW, C), np.int16, -32767, 32767)
    if glob:
        y_r, ey_r, ns_r = ravg.global_forward(x, 3)
        dx_r, edx_r, nb_r, _ = ravg.global_backward(e.reshape(C), -4, x.shape)
    else:
        y_r, ey_r, ns_r = ravg.forward(x, 3, (kh, kw), (sh, sw))
        dx_r, edx_r, nb_r, _ = ravg.backward(e, -4, x.shape, (kh, kw), (sh, sw))
    assert y_r.dtype == dx_r.dtype == np.int16
    stats = np.zeros(4, np.int64)
    y, dx = np.zeros(y_r.shape, np.int16), np.zeros(x.shape, np.int16)
    if glob:
        assert kp.global_avgpool_fwd(x.reshape(-1, C), 3, m, k, y, stats) == ey_r
        assert kp.global_avgpool_bwd(e.reshape(C), -4, m, k, dx.reshape(-1, C), stats) == edx_r
    else:
        assert kp.avgpool2d_fwd(x, 3, kh, kw, sh, sw, m, k, y, stats) == ey_r
        assert kp.avgpool2d_bwd(e, -4, kh, kw, sh, sw, m, k, dx, stats) == edx_r
    assert np.array_equal(y, y_r) and np.array_equal(dx, dx_r) and stats[0] == ns_r + nb_r
    for ffi, lib in (clib, clib_ubsan):
        scratch = np.zeros(x.size, np.int64)  # alive while the ctx is used (c_ctx does not own it)
        ctx, stc = c_ctx(ffi, scratch)
        yc, dxc = np.zeros(y_r.shape, np.int16), np.zeros(x.shape, np.int16)
        if glob:
            p = ffi.new("tt_global_pool_params *", dict(P=H * W, C=C, mult=m, shift=k))
            fwd, bwd = lib.tt_global_avgpool_fwd_s16, lib.tt_global_avgpool_bwd_s16
        else:
            p = ffi.new("tt_pool_params *", dict(H=H, W=W, C=C, kh=kh, kw=kw, stride_h=sh, stride_w=sw, mult=m, shift=k))
            fwd, bwd = lib.tt_avgpool2d_fwd_s16, lib.tt_avgpool2d_bwd_s16
        assert fwd(ctx, p, c_i16(ffi, x), 3, c_i16(ffi, yc)) == ey_r and np.array_equal(yc, y_r)
        assert bwd(ctx, p, c_i16(ffi, np.ascontiguousarray(e)), -4, c_i16(ffi, dxc)) == edx_r
        assert np.array_equal(dxc, dx_r) and stc.saturated == ns_r + nb_r


def _bn16_ref(k, train):
    from tinytrain.ops import batchnorm as rb

    y, ey, nsat, saved, rm, rv = rb.forward(k["x"], k["ex"], k["gamma"], k["e_g"], k["beta"], k["e_b"], k["rmean"],
                                            k["e_rm"], k["rvar"], k["e_rv"], train=train, **k["cfg"])
    out = dict(y=y, ey=ey, nsat=nsat, saved=saved, rm=rm, rv=rv)
    if train:
        dx, edx, nsat_b, grads = rb.backward(k["e"], k["ee"], k["x"], k["ex"], saved, k["gamma"], k["e_g"], train=True)
        out.update(dx=dx, edx=edx, nsat_b=nsat_b, gg=grads[0][0], egg=grads[0][1], gb=grads[1][0])
    return out


def _bn16_numba(k, train):
    from tinytrain.kernels import batchnorm as kb
    from tinytrain.ops import conv2d as rc

    x2 = k["x"].reshape(-1, k["x"].shape[-1])
    P, C = x2.shape
    rm, rv, c = k["rmean"].copy(), k["rvar"].copy(), k["cfg"]
    saved, scratch, stats = np.zeros((3, C), np.int32), np.zeros(3 * C, np.int64), np.zeros(4, np.int64)
    y = np.zeros((P, C), np.int16)
    ey = kb.batchnorm_fwd(x2, k["ex"], k["gamma"], k["e_g"], k["beta"], k["e_b"], rm, k["e_rm"], rv, k["e_rv"],
                          c["eps_m"], c["eps_k"], c["mom_k"], train, saved, scratch, y, stats)
    out = dict(y=y.reshape(k["x"].shape), ey=ey, nsat=int(stats[0]), saved=saved, rm=rm, rv=rv)
    if train:
        dx, e2 = np.zeros((P, C), np.int16), k["e"].reshape(P, C)
        edx = kb.batchnorm_bwd(e2, k["ee"], x2, k["ex"], saved, k["gamma"], k["e_g"], True, scratch, dx, stats)
        gg, gb = np.zeros(C, np.int32), np.zeros(C, np.int32)
        kb.batchnorm_grad(e2, x2, saved, True, gg, gb, rc.grad_shift(P))
        out.update(dx=dx.reshape(k["x"].shape), edx=edx, nsat_b=int(stats[0]) - out["nsat"], gg=gg, gb=gb)
    return out


def _bn16_c(ffi, lib, k, train):
    x = np.ascontiguousarray(k["x"])
    C = x.shape[-1]
    P = x.size // C
    rm, rv, c = k["rmean"].copy(), k["rvar"].copy(), k["cfg"]
    buf, scratch = np.zeros(5 * C + 1, np.int32), np.zeros(max(3 * C, P * C), np.int64)
    ctx, stc = c_ctx(ffi, scratch)
    p = ffi.new("tt_batchnorm_params *", dict(
        P=P, C=C, gamma=c_i16(ffi, k["gamma"]), e_g=k["e_g"], beta=c_i32(ffi, k["beta"]), e_b=k["e_b"],
        rmean=c_i32(ffi, rm), e_rm=k["e_rm"], rvar=c_i32(ffi, rv), e_rv=k["e_rv"], eps_m=c["eps_m"],
        eps_k=c["eps_k"], mom_k=c["mom_k"], saved=c_i32(ffi, buf)))
    y = np.zeros(x.shape, np.int16)
    fwd = lib.tt_batchnorm_fwd_s16 if train else lib.tt_batchnorm_fwd_eval_s16
    ey = fwd(ctx, p, c_i16(ffi, x), k["ex"], c_i16(ffi, y))
    out = dict(y=y, ey=ey, nsat=stc.saturated, saved=buf[:3 * C].reshape(3, C).copy(), rm=rm, rv=rv)
    if train:
        e, dx = np.ascontiguousarray(k["e"]), np.zeros(x.shape, np.int16)
        edx = lib.tt_batchnorm_bwd_s16(ctx, p, c_i16(ffi, e), k["ee"], c_i16(ffi, x), c_i16(ffi, dx))
        gg2, gb2 = np.full(C, 7, np.int32), np.full(C, 7, np.int32)
        lib.tt_batchnorm_grad_saved_s32(p, c_i32(ffi, gg2), c_i32(ffi, gb2))  # the backward's sums
        gg, gb = np.zeros(C, np.int32), np.zeros(C, np.int32)
        lib.tt_batchnorm_grad_s32_s16(p, c_i16(ffi, e), c_i16(ffi, x), c_i32(ffi, gg), c_i32(ffi, gb))
        assert np.array_equal(gg2, gg) and np.array_equal(gb2, gb)
        out.update(dx=dx, edx=edx, nsat_b=stc.saturated - out["nsat"], gg=gg, gb=gb)
    return out


@st.composite
def bn16_case(draw):
    """int16 x and e (edges included), any gamma / beta / running statistics, exponents over the
    ranges int16 activations take (ex down to -40), eps and momentum drawn; P up to 64 (the
    bound test below takes P = 4096)."""
    from tinytrain.ops import batchnorm as rb

    C = draw(st.integers(1, 6))
    shape = (draw(st.integers(1, 6)), draw(st.integers(1, 6)), C) if draw(st.booleans()) else (draw(st.integers(1, 64)), C)
    i32 = (-(2**31) + 1, 2**31 - 1)
    return dict(x=draw_array(draw, shape, np.int16, -32767, 32767), e=draw_array(draw, shape, np.int16, -32767, 32767),
                gamma=draw_array(draw, (C,), np.int16, -32767, 32767), beta=draw_array(draw, (C,), np.int32, *i32),
                rmean=draw_array(draw, (C,), np.int32, *i32), rvar=draw_array(draw, (C,), np.int32, *i32),
                ex=draw(st.integers(-40, 16)), ee=draw(st.integers(-40, 8)), e_g=draw(st.integers(-15, -6)),
                e_b=draw(st.integers(-32, 0)), e_rm=draw(st.integers(-28, 4)), e_rv=draw(st.integers(-31, 4)),
                cfg=rb.config(eps=draw(st.sampled_from([0.0, 1e-5, 1e-3, 0.1, 7.0])),
                              momentum=draw(st.sampled_from([1.0, 0.5, 0.1, 0.01, 2**-20]))))


def _bn16_same(ref, other, who):
    for name, a in ref.items():
        if name == "egg":  # the gradient's exponent: the graph's grad_exp
            continue
        b = other[name]
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and a.shape == b.shape, (who, name, a.dtype, b.dtype)
            if not np.array_equal(a, b):
                i = tuple(np.argwhere(a != b)[0])
                raise AssertionError(f"{who} {name} differs first at {i}: {a[i]} vs {b[i]}")
        else:
            assert a == b, (who, name, a, b)


@settings(max_examples=examples(150), deadline=None)
@given(bn16_case(), st.booleans())
def test_batchnorm_s16_c_and_numba_equal_the_reference(clib, clib_ubsan, k, train):
    """Batch norm on int16 (train: forward, running statistics, backward, both gradient calls;
    eval: forward): reference == numba == C == C under UBSan; y and dx use the int16 range."""
    from tinytrain.ops import batchnorm as rb

    P = k["x"].size // k["x"].shape[-1]
    if train and P < 2:
        return
    ref = _bn16_ref(k, train)
    assert ref["y"].dtype == np.int16 and (not train or ref["dx"].dtype == np.int16)
    if train:
        assert ref["egg"] == k["ee"] - rb.XHAT_FRAC + (P - 1).bit_length()
    _bn16_same(ref, _bn16_numba(k, train), "numba")
    for ffi, lib in (clib, clib_ubsan):
        _bn16_same(ref, _bn16_c(ffi, lib, k, train), "C")


def test_batchnorm_s16_at_its_bounds(clib_ubsan):
    """P = 4096 positions of int16 extremes (one channel +-32767 alternating, one all but one at
    -32767), errors at +-32767, eps 0: the int64 sums at their largest stay exact (UBSan), the
    gamma gradient rounded by g = 12 fits int32, and C == reference."""
    from tinytrain.ops import batchnorm as rb

    P = rb.MAX_P
    x = np.zeros((P, 2), np.int16)
    x[:, 0] = np.where(np.arange(P) % 2, 32767, -32767)
    x[:, 1] = -32767
    x[0, 1] = 32767
    e = np.where(x > 0, 32767, -32767).astype(np.int16)
    k = dict(x=x, e=e, gamma=np.array([32767, -32767], np.int16), beta=np.array([2**31 - 1, -(2**31) + 1], np.int32),
             rmean=np.zeros(2, np.int32), rvar=np.full(2, 2**31 - 1, np.int32), ex=-40, ee=-40, e_g=-15, e_b=0,
             e_rm=4, e_rv=4, cfg=rb.config(eps=0.0, momentum=0.5))
    ref = _bn16_ref(k, True)
    assert ref["egg"] == -40 - 12 + 12 and np.abs(ref["gg"].astype(np.int64)).max() < 2**28
    G = [sum(int(a) * int(b) for a, b in zip(e[:, c], rb.xhat(x.astype(np.int64), P, ref["saved"])[0][:, c]))
         for c in range(2)]
    assert max(abs(g) for g in G) > 2**36  # beyond int32 before the rounding shift
    assert list(ref["gg"]) == [int(fp.rshift_round(g, 12)) for g in G]
    _bn16_same(ref, _bn16_c(*clib_ubsan, k, True), "C")
    _bn16_same(ref, _bn16_numba(k, True), "numba")


# ------------------------------------------------- reference = numba = C, drawn models and options
@st.composite
def a16_model(draw):
    n_in = draw(st.integers(3, 12))
    flat = draw(st.booleans())
    layers = [Flatten()] if flat else []
    for _ in range(draw(st.integers(0, 2))):
        layers.append(Dense(draw(st.integers(2, 12))))
        layers.append(draw(st.sampled_from([ReLU, lambda: LeakyReLU(0.1)]))())
    n_cls = draw(st.integers(2, 5))
    layers.append(Dense(n_cls))
    shape = (n_in, 2) if flat else (n_in,)
    policy = {**A16, **draw(st.sampled_from([{}, {"master": "int32"}, {"bias": "int16"}, {"momentum": "int16"},
                                             {"momentum": "int8"}]))}
    return shape, layers, n_cls, policy


@st.composite
def a16_cnn(draw):
    """A small CNN with int16 activations: 1-3 spatial layers (conv2d / depthwise / conv1d with
    drawn kernel, stride, padding and filters, batch norm, ReLU, max and average pooling), Flatten or
    global average pooling, optional hidden Dense,
    the Dense head; the policy's other keys drawn."""
    one_d = draw(st.booleans())
    shape = (draw(st.integers(4, 14)), draw(st.integers(1, 3))) if one_d else \
        (draw(st.integers(3, 7)), draw(st.integers(3, 7)), draw(st.integers(1, 3)))
    layers, cur = [], shape
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["conv", "conv", "relu", "pool", "bn"] + ([] if one_d else ["depthwise", "avg"])))
        k, stride, pad = draw(st.sampled_from([1, 2, 3])), draw(st.integers(1, 2)), draw(st.sampled_from(["valid", "same"]))
        n = draw(st.integers(1, 4))
        l = {"conv": lambda: Conv1d(n, k, stride=stride, padding=pad) if one_d else Conv2d(n, k, stride=stride, padding=pad),
             "depthwise": lambda: DepthwiseConv2d(k, stride=stride, padding=pad), "relu": ReLU, "bn": BatchNorm,
             "avg": lambda: AvgPool2d(draw(st.sampled_from([2, (1, 2), (2, 1), 3]))),
             "pool": lambda: MaxPool1d(2) if one_d else MaxPool2d(draw(st.sampled_from([2, (1, 2), (2, 1)])))}[kind]()
        nxt = _out(l, cur)
        if nxt is not None:
            layers.append(l)
            cur = nxt
    layers.append(draw(st.sampled_from([Flatten, Flatten, GlobalAvgPool]))())
    if draw(st.booleans()):
        layers += [Dense(draw(st.integers(2, 8))), ReLU()]
    n_cls = draw(st.integers(2, 4))
    layers.append(Dense(n_cls))
    policy = {**A16, **draw(st.sampled_from([{}, {"master": "int32"}, {"bias": "int16"}, {"momentum": "int16"},
                                             {"momentum": "int8"}]))}
    return shape, layers, n_cls, policy


@settings(max_examples=examples(8), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_int16_cnn_any_optimizer_reference_sim_c_equal(data):
    """Drawn CNNs (shapes, strides, paddings, channels) x policies x optimizer options: the
    reference, numba and C (UBSan) train side by side, every step's state hash equal."""
    shape, layers, n_cls, policy = data.draw(a16_cnn())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, n_classes=n_cls, precision=policy)
    opt = data.draw(any_optimizer(probe.layers))
    if policy.get("momentum") == "int8":
        opt = replace(opt, master_weights=False)
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), n_classes=n_cls,
                     optimizer=opt, seed=data.draw(st.integers(0, 1000)), precision=policy)
    x, y = _data(data.draw(st.integers(4, 8)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


@settings(max_examples=examples(8), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_int16_policy_any_optimizer_reference_sim_c_equal(data):
    shape, layers, n_cls, policy = data.draw(a16_model())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, n_classes=n_cls, precision=policy)
    opt = data.draw(any_optimizer(probe.layers))
    if policy.get("momentum") == "int8":  # an int32 master keeps int32 momentum: refused with it
        opt = replace(opt, master_weights=False)
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), n_classes=n_cls,
                     optimizer=opt, seed=data.draw(st.integers(0, 1000)), precision=policy)
    x, y = _data(data.draw(st.integers(4, 9)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


# -------------------------------------------------------------------- files and memory
def test_the_policy_survives_a_tt_round_trip_and_old_files_load(tmp_path):
    from tinytrain.sim.simulator import Simulator

    m = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, seed=1, precision="int16-act16")
    x, y = _data(10, (9,), 3, 4)
    Simulator(m).train(x, y, np.arange(10))
    tio.save(m, tmp_path / "m.tt")
    c, _ = tio.load(tmp_path / "m.tt")
    assert c.precision.a16 and c.schema() == m.schema() and c.state_hash() == m.state_hash()
    Simulator(c).train(x, y, np.arange(10))
    Simulator(m).train(x, y, np.arange(10))
    assert c.state_hash() == m.state_hash()
    old = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, seed=1)
    tio.save(old, tmp_path / "old.tt")
    assert not tio.load(tmp_path / "old.tt")[0].precision.a16


def test_the_memory_plan_holds_int16_activations_and_errors():
    """W1's shape: the activations, the error ping-pong and the widened input are int16; no
    gradient buffer (the dense update goes row by row through the scratch)."""
    from tinytrain.codegen.emit import Emitter, generate

    mk = lambda p: Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, precision=p)  # noqa: E731
    a16 = {t.name: (t.ctype, t.bytes, t.role) for t in Emitter(mk("int16-act16"), "tt_model").plan()}
    a8 = {t.name: (t.ctype, t.bytes, t.role) for t in Emitter(mk(None), "tt_model").plan()}
    assert a16["tt_model_a0"] == ("int16_t", 64, "activation") and a8["tt_model_a0"] == ("int8_t", 32, "activation")
    assert a16["tt_model_err0"] == ("int16_t", 64, "error") and a16["tt_model_xin"] == ("int16_t", 128, "activation")
    assert not any(r == "grad" for _, _, r in a16.values())
    src = generate(mk("int16-act16")).source
    assert "tt_widen_s8_s16(x, 64, tt_model_xin);" in src and "tt_softmax_ce_s16(&CTX" in src
    assert "tt_dense_grad_row_s32_s16(tt_model_xin, 64, tt_model_err0[n], (int32_t *)SCRATCH);" in src


# ------------------------------------------------------------------------------ QEMU boards
@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_int16_activations_train_bit_exact_on_qemu_boards(data):
    """Drawn MLPs on digits with int16 activations and errors, masters, int16 biases, momentum,
    SR and batch sizes, on QEMU mps2_an386 (Cortex-M4, DSP build) or microbit (Cortex-M0):
    every step's state hash verified against the simulator."""
    from tinytrain import data as tdata
    from tinytrain.verify import verify

    ds = tdata.load("digits")
    layers = [Dense(data.draw(st.integers(4, 24))), data.draw(st.sampled_from([ReLU, lambda: LeakyReLU(0.1)]))(), Dense(10)]
    policy = {**A16, **data.draw(st.sampled_from([{}, {"master": "int32"}, {"bias": "int16"}, {"momentum": "int8"}]))}
    opt = SGD(lr=0.02, momentum=data.draw(st.sampled_from([0.0, 0.9])), batch_size=data.draw(st.sampled_from([1, 2])),
              stochastic_rounding=data.draw(st.booleans()), weight_decay=data.draw(st.sampled_from([0.0, 1e-3])))
    if policy.get("momentum") == "int8" and not opt.momentum:
        opt = replace(opt, momentum=0.9)
    m = Sequential(layers, dataset=ds, seed=data.draw(st.integers(0, 100)), optimizer=opt, precision=policy)
    board = data.draw(st.sampled_from(["mps2_an386", "microbit"]))
    if board == "microbit":
        from tinytrain.codegen.project import choose_shadow

        try:
            choose_shadow(m, board)
        except MemoryError:  # e.g. int32 momentum of 20 units: ~16.6 KB of static RAM
            board = "mps2_an386"
    r = verify(m, ds, 30, board=board, json=True)
    assert r["steps"] == 30 and r["mismatches"] == 0, (board, m.summary(), r["first_mismatch"])


@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_int16_activation_cnns_train_bit_exact_on_qemu_boards(data):
    """Small CNNs with int16 activations and errors: a 2-D one on digits images (conv2d same /
    strided, ReLU, max pooling, Flatten, Dense) or a 1-D one on MNIST-1D (conv1d, ReLU,
    maxpool1d), with momentum and SR drawn, on QEMU mps2_an386 (Cortex-M4) and microbit
    (Cortex-M0): every step's state hash verified against the simulator."""
    from tinytrain import data as tdata
    from tinytrain.verify import verify

    if data.draw(st.booleans()):
        ds = tdata.load_digits("image")
        layers = [Conv2d(data.draw(st.integers(2, 6)), 3, padding="same"), ReLU(), MaxPool2d(2),
                  Conv2d(data.draw(st.integers(2, 6)), 3, stride=data.draw(st.integers(1, 2)), padding="same"), ReLU(),
                  Flatten(), Dense(10)]
    else:
        ds = tdata.load_mnist1d("signal")
        layers = [Conv1d(data.draw(st.integers(2, 6)), 5, padding="same"), ReLU(), MaxPool1d(2),
                  Conv1d(4, 3, stride=2), ReLU(), Flatten(), Dense(10)]
    opt = SGD(lr=0.02, momentum=data.draw(st.sampled_from([0.0, 0.9])), stochastic_rounding=data.draw(st.booleans()))
    m = Sequential(layers, dataset=ds, seed=data.draw(st.integers(0, 100)), optimizer=opt, precision=A16)
    for board in ("mps2_an386", "microbit"):
        r = verify(m.copy(), ds, 20, board=board, json=True)
        assert r["steps"] == 20 and r["mismatches"] == 0, (board, m.summary(), r["first_mismatch"])


@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_int16_activation_cnns_with_batch_norm_train_bit_exact_on_qemu(data):
    """W3's shape with int16 activations and errors (conv, batch norm, ReLU, max or average
    pooling, twice; Flatten or global average pooling; Dense) with drawn widths, momentum and SR
    on QEMU mps2_an386 (Cortex-M4): every step's state hash verified against the simulator."""
    from tinytrain import data as tdata
    from tinytrain.verify import verify

    ds = tdata.load_digits("image")
    pool = data.draw(st.sampled_from([MaxPool2d, AvgPool2d]))
    layers = [Conv2d(data.draw(st.integers(2, 6)), 3, padding="same"), BatchNorm(), ReLU(), pool(2),
              Conv2d(data.draw(st.integers(2, 8)), 3, padding="same"), BatchNorm(), ReLU(),
              data.draw(st.sampled_from([Flatten, GlobalAvgPool]))(), Dense(10)]
    opt = SGD(lr=0.02, momentum=data.draw(st.sampled_from([0.0, 0.9])), stochastic_rounding=data.draw(st.booleans()))
    m = Sequential(layers, dataset=ds, seed=data.draw(st.integers(0, 100)), optimizer=opt, precision=A16)
    r = verify(m, ds, 20, board="mps2_an386", json=True)
    assert r["steps"] == 20 and r["mismatches"] == 0, (m.summary(), r["first_mismatch"])


def test_the_fixed_point_report_shows_int16_tensors_and_int64_sums():
    from tinytrain import data as tdata
    from tinytrain.fixedpoint_report import fixed_point_report
    from tinytrain.graph.models import build_model

    ds = tdata.load("digits")
    r = fixed_point_report(build_model("digits-mlp", ds, precision="int16-act16"), ds, 30)
    acts = [L[k] for L in r["layers"] for k in ("activation", "input_error") if L[k] and "dtype" in L[k]]
    assert acts and all(a["dtype"] == "int16" and a["max_abs"] <= 32767 and a["headroom_bits"] >= 0 for a in acts)
    assert max(a["max_abs"] for a in acts) > 127  # the values use the int16 range
    dense = r["layers"][0]["accumulators"]
    assert [(a["what"], a["width"]) for a in dense][:2] == [("forward sum", 64), ("input-error sum", 64)]
