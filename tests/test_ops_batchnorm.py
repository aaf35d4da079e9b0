"""BatchNorm: reference == numba == C (train and eval, running statistics, backward), exact
helpers against Python ints / fractions, and float64 batch norm as a yardstick for accuracy."""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain import fixedpoint as fp
from tinytrain.kernels import batchnorm as kb
from tinytrain.ops import batchnorm as rb

from .oputil import c_ctx, c_i8, c_i16, c_i32, draw_array


@st.composite
def bn_case(draw, max_p=64):
    C = draw(st.integers(1, 8))
    kind = draw(st.sampled_from(["hwc", "hwc", "lc", "lc", "c"]))
    if kind == "hwc":
        shape = (draw(st.integers(1, 8)), draw(st.integers(1, 8)), C)
    else:
        shape = (draw(st.integers(1, max_p)), C) if kind == "lc" else (C,)
    x = draw_array(draw, shape, np.int8, -127, 127)
    e = draw_array(draw, shape, np.int8, -127, 127)
    gamma = draw_array(draw, (C,), np.int16, -32767, 32767)
    beta = draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1)
    rmean = draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1)
    rvar = draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1)
    ex, ee = draw(st.integers(-24, 24)), draw(st.integers(-24, 8))
    e_g, e_b = draw(st.integers(-15, -6)), draw(st.integers(-32, 0))
    e_rm, e_rv = draw(st.integers(-28, 4)), draw(st.integers(-31, 4))
    cfg = rb.config(eps=draw(st.sampled_from([0.0, 1e-5, 1e-3, 0.1, 7.0])),
                    momentum=draw(st.sampled_from([1.0, 0.5, 0.1, 0.01, 2**-20])))
    return dict(x=x, e=e, gamma=gamma, beta=beta, rmean=rmean, rvar=rvar, ex=ex, ee=ee, e_g=e_g,
                e_b=e_b, e_rm=e_rm, e_rv=e_rv, cfg=cfg)


def ref_run(k, train):
    y, ey, nsat, saved, rm, rv = rb.forward(
        k["x"], k["ex"], k["gamma"], k["e_g"], k["beta"], k["e_b"], k["rmean"], k["e_rm"],
        k["rvar"], k["e_rv"], train=train, **k["cfg"])
    dx, edx, nsat_b, grads = rb.backward(k["e"], k["ee"], k["x"], k["ex"], saved, k["gamma"],
                                         k["e_g"], train=train)
    return dict(y=y, ey=ey, nsat=nsat, saved=saved, rm=rm, rv=rv, dx=dx, edx=edx,
                nsat_b=nsat_b, gg=grads[0], gb=grads[1])


def numba_run(k, train):
    x2 = k["x"].reshape(-1, k["x"].shape[-1])
    P, C = x2.shape
    rm, rv = k["rmean"].copy(), k["rvar"].copy()
    saved, scratch = np.zeros((3, C), np.int32), np.zeros(3 * C, np.int64)
    y, stats = np.zeros((P, C), np.int8), np.zeros(4, np.int64)
    c = k["cfg"]
    ey = kb.batchnorm_fwd(x2, k["ex"], k["gamma"], k["e_g"], k["beta"], k["e_b"], rm, k["e_rm"],
                          rv, k["e_rv"], c["eps_m"], c["eps_k"], c["mom_k"], train, saved,
                          scratch, y, stats)
    nsat = int(stats[0])
    dx = np.zeros((P, C), np.int8)
    e2 = k["e"].reshape(P, C)
    edx = kb.batchnorm_bwd(e2, k["ee"], x2, k["ex"], saved, k["gamma"], k["e_g"], train, scratch,
                           dx, stats)
    gg, gb = np.zeros(C, np.int32), np.zeros(C, np.int32)
    kb.batchnorm_grad(e2, x2, saved, train, gg, gb)
    return dict(y=y.reshape(k["x"].shape), ey=ey, nsat=nsat, saved=saved, rm=rm, rv=rv,
                dx=dx.reshape(k["x"].shape), edx=edx, nsat_b=int(stats[0]) - nsat, gg=gg, gb=gb)


def c_run(ffi, lib, k, train):
    x = np.ascontiguousarray(k["x"])
    C = x.shape[-1]
    P = x.size // C
    rm, rv = k["rmean"].copy(), k["rvar"].copy()
    buf, scratch = np.zeros(5 * C + 1, np.int32), np.zeros(max(3 * C, P * C), np.int64)
    assert buf.nbytes == 20 * C + 4  # TT_BATCHNORM_SAVED_SIZE(C); scratch: TT_BATCHNORM_BUFFER_SIZE(P, C)
    y = np.zeros(x.shape, np.int8)
    ctx, stc = c_ctx(ffi, scratch)
    c = k["cfg"]
    p = ffi.new("tt_batchnorm_params *", dict(
        P=P, C=C, gamma=c_i16(ffi, k["gamma"]), e_g=k["e_g"], beta=c_i32(ffi, k["beta"]), e_b=k["e_b"],
        rmean=c_i32(ffi, rm), e_rm=k["e_rm"], rvar=c_i32(ffi, rv), e_rv=k["e_rv"], eps_m=c["eps_m"],
        eps_k=c["eps_k"], mom_k=c["mom_k"], saved=c_i32(ffi, buf)))
    mode = "" if train else "_eval"
    ey = getattr(lib, f"tt_batchnorm_fwd{mode}_s8")(ctx, p, c_i8(ffi, x), k["ex"], c_i8(ffi, y))
    assert buf[3 * C] == k["ex"]  # the input exponent, saved for backward
    nsat = stc.saturated
    dx = np.zeros(x.shape, np.int8)
    e = np.ascontiguousarray(k["e"])
    edx = getattr(lib, f"tt_batchnorm_bwd{mode}_s8")(ctx, p, c_i8(ffi, e), k["ee"], c_i8(ffi, x), c_i8(ffi, dx))
    gg, gb = np.zeros(C, np.int32), np.zeros(C, np.int32)
    getattr(lib, f"tt_batchnorm_grad{mode}_s32")(p, c_i8(ffi, e), c_i8(ffi, x), c_i32(ffi, gg), c_i32(ffi, gb))
    saved = buf[:3 * C].reshape(3, C)
    nsat_b = stc.saturated - nsat
    if train:  # the gradients the generated code takes from the backward's sums: the same
        gg2, gb2 = np.full(C, 7, np.int32), np.full(C, 7, np.int32)
        lib.tt_batchnorm_grad_saved_s32(p, c_i32(ffi, gg2), c_i32(ffi, gb2))
        assert np.array_equal(gg2, gg) and np.array_equal(gb2, gb)
    return dict(y=y, ey=ey, nsat=nsat, saved=saved, rm=rm, rv=rv, dx=dx, edx=edx,
                nsat_b=nsat_b, gg=gg, gb=gb)


def assert_same(ref, other, who):
    for name in ("ey", "nsat", "edx", "nsat_b"):
        assert ref[name] == other[name], (who, name, ref[name], other[name])
    for name in ("y", "saved", "rm", "rv", "dx"):
        a, b = ref[name], other[name]
        assert a.dtype == b.dtype and a.shape == b.shape, (who, name)
        if not np.array_equal(a, b):
            i = np.argwhere(a != b)[0]
            i = tuple(i)
            raise AssertionError(f"{who} {name} differs first at {i}: {a[i]} vs {b[i]}")
    assert np.array_equal(ref["gg"][0], other["gg"]), (who, "dgamma")
    assert np.array_equal(ref["gb"][0], other["gb"]), (who, "dbeta")


def check_int_dtypes(r):
    for name in ("y", "dx"):
        assert r[name].dtype == np.int8
    for name in ("saved", "rm", "rv"):
        assert r[name].dtype == np.int32
    assert r["gg"][0].dtype == np.int32 and r["gb"][0].dtype == np.int32
    assert all(type(r[n]) is int for n in ("ey", "edx", "nsat", "nsat_b"))
    assert type(r["gg"][1]) is int and type(r["gb"][1]) is int


@settings(max_examples=120, deadline=None)
@given(bn_case(), st.booleans())
def test_batchnorm_ref_numba_c_equal(clib, k, train):
    ffi, lib = clib
    if train and k["x"].size // k["x"].shape[-1] < 2:
        with pytest.raises(ValueError, match="BatchNorm"):
            ref_run(k, train)
        return
    ref = ref_run(k, train)
    check_int_dtypes(ref)
    assert_same(ref, numba_run(k, train), "numba")
    assert_same(ref, c_run(ffi, lib, k, train), "C")
    if not train:
        assert np.array_equal(ref["rm"], k["rmean"]) and np.array_equal(ref["rv"], k["rvar"])


@settings(max_examples=25, deadline=None)
@given(bn_case(max_p=300), st.booleans())
def test_batchnorm_c_ubsan(clib_ubsan, k, train):
    ffi, lib = clib_ubsan
    train = train and k["x"].size // k["x"].shape[-1] >= 2
    assert_same(ref_run(k, train), c_run(ffi, lib, k, train), "C-ubsan")


@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_worst_case_p4096(clib, clib_ubsan, train):
    """Largest P with extreme values: the int32/int64 bounds of the docstring hold."""
    rng = np.random.default_rng(7)
    x = np.full((64, 64, 3), 127, np.int8)
    x[0, 0, 0] = -127                       # one outlier: max |x_hat| = sqrt(P-1)
    x[:, :32, 1] = -127                     # two clusters: |x_hat| = 1 everywhere
    x[..., 2] = rng.integers(-127, 128, (64, 64))
    e = np.where(x > 0, 127, -127).astype(np.int8)  # e aligned with x_hat: sum e*x_hat maximal
    st0 = rb.init_state(3)
    k = dict(x=x, e=e, gamma=np.array([32767, -32767, 1000], np.int16),
             beta=np.array([2**31 - 1, -(2**31) + 1, 0], np.int32), rmean=st0["running_mean"],
             rvar=st0["running_var"], ex=-7, ee=-3, e_g=-14, e_b=-20, e_rm=-16, e_rv=-16,
             cfg=rb.config(eps=0.0))
    ref = ref_run(k, train)
    if train:
        assert abs(int(ref["gg"][0][1])) < 2**31 - 1 and ref["nsat"] == 0
    for lib in (clib, clib_ubsan):
        assert_same(ref, c_run(*lib, k, train), "C")
    assert_same(ref, numba_run(k, train), "numba")


@pytest.mark.parametrize("momentum", [1.0, 0.5, 0.25, 0.1, 2**-20])
@pytest.mark.parametrize("P", [2, 5, 16])
def test_running_stats_ema_at_the_int32_ends(clib, clib_ubsan, momentum, P):
    """The shift-EMA r + round((b - r) / 2^k) with r and the batch statistic b at opposite ends
    of int32 (|b - r| up to 2^31 - 1, the rounding's + 1 at its edge: momentum 0.5 once wrapped
    in the C's 32-bit path), every momentum; reference == numba == C == C under UBSan."""
    C = 6
    x = np.zeros((P, C), np.int8)
    x[:, 3] = 127
    x[:, 4] = -127
    x[0, 5], x[1:, 5] = 127, -127
    big = 2**31 - 1
    k = dict(x=x, e=np.ones((P, C), np.int8), gamma=np.full(C, 1 << 14, np.int16),
             beta=np.zeros(C, np.int32),
             rmean=np.array([-big, big, -big + 1, -big, big, 0], np.int32),
             rvar=np.array([-big, big, 1, -big, 0, big], np.int32),
             ex=0, ee=0, e_g=-14, e_b=0, e_rm=0, e_rv=0, cfg=rb.config(eps=0.0, momentum=momentum))
    ref = ref_run(k, True)
    for lib in (clib, clib_ubsan):
        assert_same(ref, c_run(*lib, k, True), "C")
    assert_same(ref, numba_run(k, True), "numba")
    if momentum == 0.5:  # the case that wrapped: 0 - (-(2^31 - 1)) rounded half up
        assert int(ref["rm"][0]) == -big + (big + 1) // 2


def test_running_stats_over_steps(clib):
    """Several train steps update the running statistics identically, then eval uses them."""
    ffi, lib = clib
    rng = np.random.default_rng(3)
    C = 4
    s = rb.init_state(C)
    k = dict(gamma=s["gamma"], beta=s["beta"], e_g=s["e_g"], e_b=s["e_b"], e_rm=s["e_rm"],
             e_rv=s["e_rv"], rmean=s["running_mean"], rvar=s["running_var"], cfg=rb.config(),
             ee=-7)
    k_np, k_c = dict(k), dict(k)
    for step in range(12):
        x = (rng.normal(3.0, 2.0, (6, 5, C)) * 16).clip(-127, 127).astype(np.int8)
        e = rng.integers(-127, 128, x.shape).astype(np.int8)
        for kk in (k, k_np, k_c):
            kk.update(x=x, e=e, ex=-4)
        ref, nb, cc = ref_run(k, True), numba_run(k_np, True), c_run(ffi, lib, k_c, True)
        assert_same(ref, nb, "numba")
        assert_same(ref, cc, "C")
        for kk, out in ((k, ref), (k_np, nb), (k_c, cc)):
            kk["rmean"], kk["rvar"] = out["rm"], out["rv"]
    mean = k["rmean"] * 2.0 ** k["e_rm"]
    var = k["rvar"] * 2.0 ** k["e_rv"]
    assert np.all(np.abs(mean - 3.0) < 0.7) and np.all(np.abs(var - 4.0) < 2.0)  # EMA converged
    assert_same(ref_run(k, False), c_run(ffi, lib, k_c, False), "C eval")


# ----------------------------------------------------------------- exact helpers


def test_div_floor():
    for a in [-7, -6, -1, 0, 1, 5, 6, 2**40 + 3, -(2**40) - 3]:
        for b in [1, 2, 3, 6, 4095 * 4096]:
            assert fp.div_floor(a, b) == math.floor(Fraction(a, b))
    arr = np.array([-7, -6, 5, 6], np.int64)
    assert fp.div_floor(arr, 3).tolist() == [-3, -2, 1, 2]
    with pytest.raises(ValueError):
        fp.div_floor(1, 0)


@settings(max_examples=300, deadline=None)
@given(st.integers(-(2**40) + 1, 2**40 - 1), st.integers(-70, 70), st.integers(1, 2**24))
def test_rdiv_exact(n, a, d):
    want = math.floor(Fraction(n) * Fraction(2) ** a / d + Fraction(1, 2))
    assert rb.rdiv(n, a, d) == max(fp.INT32_MIN, min(fp.INT32_MAX, want))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 2**62 - 1), st.integers(-40, 40))
def test_inv_sqrt_accuracy(v, e_v):
    inv, n = rb.inv_sqrt(v, e_v)
    assert (n - e_v) % 2 == 0 and 2**29 <= inv <= 2**30
    approx = inv * 2.0 ** (n / 2 - rb.INV_BITS)
    assert abs(approx * math.sqrt(v) - 1) < 2**-14


@given(st.integers(0, 2**39), st.integers(-80, 80))
def test_scale_cap(n, t):
    want = math.floor(Fraction(n) * Fraction(2) ** t + Fraction(1, 2))
    assert rb.scale_cap(n, t) == min(want, rb.EPS_CAP)


def test_batch_statistics_exact():
    """With momentum 1 (mom_k = 0) the running statistics ARE the rounded batch statistics."""
    rng = np.random.default_rng(11)
    x = rng.integers(-127, 128, (5, 7, 3)).astype(np.int8)
    ex, e_rm, e_rv = -3, -12, -9
    s = rb.init_state(3, e_rm=e_rm, e_rv=e_rv)
    _, _, _, saved, rm, rv = rb.forward(x, ex, s["gamma"], -14, s["beta"], -20, s["running_mean"],
                                        e_rm, s["running_var"], e_rv, train=True,
                                        **rb.config(momentum=1.0))
    for c in range(3):
        v = [int(t) for t in x[..., c].ravel()]
        P = len(v)
        mean = Fraction(sum(v), P)
        var_unb = sum((Fraction(t) - mean) ** 2 for t in v) / (P - 1)
        assert rm[c] == math.floor(mean * Fraction(2) ** (ex - e_rm) + Fraction(1, 2))
        assert rv[c] == math.floor(var_unb * Fraction(2) ** (2 * ex - e_rv) + Fraction(1, 2))
        assert saved[0, c] == sum(v)


def test_errors_and_helpers():
    s = rb.init_state(5)
    args = (s["gamma"], -14, s["beta"], -20, s["running_mean"], -16, s["running_var"], -16)
    with pytest.raises(ValueError, match="BatchNorm needs spatial positions at batch 1"):
        rb.forward(np.zeros(5, np.int8), 0, *args, train=True, **rb.config())
    with pytest.raises(ValueError, match="positions"):
        rb.forward(np.zeros((1, 1, 5), np.int8), 0, *args, train=True, **rb.config())
    with pytest.raises(ValueError, match="4096"):
        rb.forward(np.zeros((65, 64, 5), np.int8), 0, *args, train=True, **rb.config())
    y, *_ = rb.forward(np.ones(5, np.int8), 0, *args, train=False, **rb.config())  # eval: P = 1
    assert y.shape == (5,) and y.dtype == np.int8
    assert rb.config(momentum=0.1)["mom_k"] == 3 and rb.config(eps=0.0)["eps_m"] == 0
    assert s["gamma"][0] * 2.0**-14 == 1.0 and s["running_var"][0] * 2.0**-16 == 1.0
    for key in ("gamma", "beta", "running_mean", "running_var"):
        assert np.issubdtype(s[key].dtype, np.integer)


def test_eval_saturation_counted_everywhere(clib):
    """Stale statistics (var 0, eps 0) make x_hat overflow int32: saturated and counted."""
    ffi, lib = clib
    C = 2
    k = dict(x=np.array([[127, -127], [5, 0]], np.int8), e=np.array([[1, 2], [3, 4]], np.int8),
             gamma=np.array([16384, 16384], np.int16), beta=np.zeros(C, np.int32),
             rmean=np.zeros(C, np.int32), rvar=np.zeros(C, np.int32), ex=6, ee=0, e_g=-14,
             e_b=-20, e_rm=-16, e_rv=-30, cfg=rb.config(eps=0.0))
    ref = ref_run(k, False)
    assert ref["nsat"] >= 2
    assert_same(ref, numba_run(k, False), "numba")
    assert_same(ref, c_run(ffi, lib, k, False), "C")


# --------------------------------------------- float64 batch norm as a yardstick


def float_bn(k, train):
    x = k["x"].reshape(-1, k["x"].shape[-1]) * 2.0 ** k["ex"]
    dy = k["e"].reshape(x.shape) * 2.0 ** k["ee"]
    g, b = k["gamma"] * 2.0 ** k["e_g"], k["beta"] * 2.0 ** k["e_b"]
    eps = k["cfg"]["eps_m"] * 2.0 ** -k["cfg"]["eps_k"]
    if train:
        mu, var = x.mean(0), x.var(0)
    else:
        mu, var = k["rmean"] * 2.0 ** k["e_rm"], np.maximum(k["rvar"], 0) * 2.0 ** k["e_rv"]
    xhat = (x - mu) / np.sqrt(var + eps)
    y = g * xhat + b
    if train:
        dx = g / np.sqrt(var + eps) * (dy - dy.mean(0) - xhat * (dy * xhat).mean(0))
    else:
        dx = g / np.sqrt(var + eps) * dy
    # x_hat_q rounds to 2^-13 and its inverse sqrt is good to ~2^-15 relative
    y_tol = np.abs(g) * (2.0**-13 + 2.0**-14 * np.abs(xhat))
    if not train:  # the running mean is rounded to 2^(ex - EVAL_FRAC)
        y_tol = y_tol + np.abs(g) / np.sqrt(var + eps) * 2.0 ** (k["ex"] - rb.EVAL_FRAC - 1)
    return y, dx, np.max(np.abs(g / np.sqrt(var + eps))) * np.max(np.abs(dy)), y_tol


@st.composite
def float_case(draw):
    C = draw(st.integers(1, 6))
    P = draw(st.integers(2, 64))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    x = rng.integers(-127, 128, (P, C))
    x[0] = 127
    x[1] = -127                      # non-degenerate variance
    e = rng.integers(-127, 128, (P, C))
    gamma = rng.integers(-32767, 32768, C)
    beta = rng.integers(-(2**22), 2**22, C)
    s = rb.init_state(C)
    return dict(x=x.astype(np.int8), e=e.astype(np.int8), gamma=gamma.astype(np.int16),
                beta=beta.astype(np.int32), rmean=rng.integers(-(2**20), 2**20, C).astype(np.int32),
                rvar=rng.integers(2**12, 2**22, C).astype(np.int32), ex=draw(st.integers(-12, 2)),
                ee=draw(st.integers(-12, 2)), e_g=-14, e_b=-20, e_rm=s["e_rm"], e_rv=s["e_rv"],
                cfg=rb.config(eps=1e-5))


@settings(max_examples=150, deadline=None)
@given(float_case(), st.booleans())
def test_close_to_float_batchnorm(k, train):
    r = ref_run(k, train)
    y_f, dx_f, dx_scale, y_tol = float_bn(k, train)
    y = r["y"].reshape(y_f.shape) * 2.0 ** r["ey"]
    dx = r["dx"].reshape(dx_f.shape) * 2.0 ** r["edx"]
    # int8 rounding is half an LSB; the integer pipeline adds a small fraction of an LSB. dx
    # is a difference of terms of size gamma/sigma*|e|*|x_hat|^2 with x_hat in Q12: when the
    # true dx is much smaller (e.g. P = 2: dx ~ eps), edx gets tiny and that Q12 error shows.
    # requant_s8 may round the largest value up to 128 and saturate it to 127: one LSB there.
    lsb = np.where(np.abs(r["y"].reshape(y_f.shape)) == 127, 1.0, 0.5) * 2.0 ** r["ey"]
    assert np.all(np.abs(y - y_f) <= lsb + y_tol)
    dxi = r["dx"].reshape(dx_f.shape)
    lsb = np.where(np.abs(dxi) == 127, 1.0, 0.5) * 2.0 ** r["edx"]
    assert np.all(np.abs(dx - dx_f) <= lsb + 2.0**-12 * dx_scale * len(dx_f) ** 0.5)
    assert np.max(np.abs(r["y"])) >= 64 or r["ey"] == k["e_g"] - rb.XHAT_FRAC  # int8 range used
    gg = r["gg"][0] * 2.0 ** r["gg"][1]
    x = k["x"].reshape(-1, y_f.shape[1]).astype(np.float64)
    dy = k["e"].reshape(x.shape) * 2.0 ** k["ee"]
    if train:
        xhat = (x - x.mean(0)) / np.sqrt(x.var(0) + 1e-5 * 2.0 ** (-2 * k["ex"]))
        atol = 2.0 ** (k["ee"] - 13) * 128 * len(x)  # 127 * half a Q12 LSB per term
        assert np.allclose(gg, (dy * xhat).sum(0), rtol=1e-3, atol=atol)
    assert np.array_equal(r["gb"][0] * 2.0 ** r["gb"][1], dy.sum(0))


@pytest.mark.parametrize("P, C", [(2, 70), (3, 65), (5, 3), (6, 1), (64, 8), (16, 16), (300, 2)])
@pytest.mark.parametrize("train", [True, False])
def test_batchnorm_c_shapes_past_the_fast_paths(clib, P, C, train):
    """Channel counts past the 64-channel mask of the train backward's int32 paths, P below and
    above 3 (scratch: max(3C, PC) words), W3's shapes, trained-like and extreme values: C ==
    reference."""
    rng = np.random.default_rng(P * 1000 + C)
    for mode in ("drawn", "extreme", "constant"):
        if mode == "drawn":
            x = rng.integers(-127, 128, (P, C)).astype(np.int8)
            e = rng.integers(-127, 128, (P, C)).astype(np.int8)
        elif mode == "extreme":
            x = rng.choice(np.array([-127, 127], np.int8), (P, C))
            e = rng.choice(np.array([-127, 127], np.int8), (P, C))
        else:  # zero variance: x_hat from eps alone
            x = np.full((P, C), 5, np.int8)
            e = rng.integers(-127, 128, (P, C)).astype(np.int8)
        st0 = rb.init_state(C)
        k = dict(x=x, e=e, gamma=rng.integers(-32767, 32768, C).astype(np.int16),
                 beta=rng.integers(-(2**31) + 1, 2**31, C).astype(np.int32), rmean=st0["running_mean"],
                 rvar=st0["running_var"], ex=-7, ee=-5, e_g=-14, e_b=-20, e_rm=-16, e_rv=-16,
                 cfg=rb.config(eps=1e-5))
        assert_same(ref_run(k, train), c_run(*clib, k, train), f"C {mode}")
