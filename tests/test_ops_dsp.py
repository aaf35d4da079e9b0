"""Cortex-M DSP paths (TT_HAVE_DSP) == portable paths, bit for bit.

The runtime is built twice for the host: as usual (portable scalar paths) and with
-DTT_HAVE_DSP=1, where tinytrain/firmware/include/tt_dsp.h takes the ACLE intrinsics from the plain C
definitions of tests/c/tt_dsp_emul.h (semantics of the Arm ARM) and the kernels compile their
DSP paths. Both, and the numpy reference, must agree on every output, exponent and saturation
count. The same DSP paths run on the emulated Cortex-M4/M7 boards (test_device_qemu.py checks
them against the simulator there, and the portable ones on Cortex-M3).
"""
from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.device import cbuild
from tinytrain.ops import dense as rd
from tinytrain.graph.optim import update_direct_ref

from .conftest import HERE, examples, runtime_cdef
from .test_ops_batchnorm import assert_same as bn_assert_same
from .test_ops_batchnorm import c_run as bn_c_run
from .test_ops_batchnorm import ref_run as bn_ref_run
from .test_ops_conv import assert_same as conv_assert_same
from .test_ops_conv import run_c as conv_run_c
from .test_ops_conv import run_ref as conv_run_ref
from .oputil import c_ctx, c_i8, c_i16, c_i32, draw_array


@pytest.fixture(scope="session")
def dsplib():
    """(ffi, lib) of the runtime with the DSP paths (emulated intrinsics, UBSan on)."""
    srcs = cbuild.runtime_sources(["tt_fixedpoint", "tt_dense", "tt_sgd", "tt_conv", "tt_batchnorm", "tt_pool",
                                     "tt_relu"])
    return cbuild.compile_shared([*srcs, HERE / "c" / "tt_test_shim.c"], runtime_cdef(),
                                 include_dirs=[HERE / "c"], extra_flags=["-DTT_HAVE_DSP=1"],
                                 sanitize=True, name="ttrt_dsp")


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")
@pytest.mark.parametrize("cpu,flags,dsp", [("cortex-m4", [], True), ("cortex-m4", ["-DTT_HAVE_DSP=0"], False),
                                          ("cortex-m33", [], True), ("cortex-m3", [], False)])
def test_dsp_path_is_in_the_built_object(tmp_path, cpu, flags, dsp):
    """The DSP kernels are what a DSP core's build really runs: SMLAD (dual 16-bit MAC) in the
    disassembly of tt_dense.o and SSAT16 (the fused update's per-lane guard) in tt_sgd.o for
    Cortex-M4/M33, neither for M3 or with -DTT_HAVE_DSP=0 (the portable paths), so a silent
    fallback to the portable C fails here (also SEL in the MaxPool, SMLATT and SMMULR in the batch
    norm kernels)."""
    from tinytrain.codegen.memory import CPU_FLAGS

    for src, insn in (("tt_dense", "smlad"), ("tt_sgd", "ssat16"), ("tt_conv", "smlad"), ("tt_relu", "sel"),
                      ("tt_pool", "sel"), ("tt_batchnorm", "smlatt"), ("tt_batchnorm", "smmulr")):
        obj = tmp_path / f"{src}-{cpu}.o"
        subprocess.run(["arm-none-eabi-gcc", "-std=c99", "-O2", "-c", *CPU_FLAGS[cpu], *flags,
                        f"-I{cbuild.FIRMWARE_INCLUDE}", str(cbuild.FIRMWARE_SRC / f"{src}.c"), "-o", str(obj)],
                       check=True, capture_output=True)
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", str(obj)], capture_output=True, text=True,
                             check=True).stdout
        assert (f"\t{insn}" in dis) == dsp, f"{src} on {cpu} {flags}: {insn} {'missing' if dsp else 'present'}"


@pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")
@pytest.mark.parametrize("cpu", [["-mcpu=cortex-m4", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"], ["-mcpu=cortex-m0"]],
                         ids=["m4-hard-float", "m0"])
@pytest.mark.parametrize("opt", ["-O0", "-Og", "-Os"])
def test_runtime_compiles_at_every_optimization_level(tmp_path, cpu, opt):
    """A user's firmware builds the runtime with its own flags (PlatformIO's debug build -Og,
    Arduino -Os, -O0 by hand): every source compiles warning-free there too; the inline-asm loops
    need registers an -O0 frame pointer takes, so they are for optimized builds only."""
    inc = cbuild.runtime_sources()[0].parent.parent / "include"
    for src in cbuild.runtime_sources():
        r = subprocess.run(["arm-none-eabi-gcc", "-std=c99", opt, "-Wall", "-Wextra", "-Werror", "-c", *cpu, "-mthumb",
                            f"-I{inc}", str(src), "-o", str(tmp_path / (src.stem + ".o"))],
                           capture_output=True, text=True)
        assert r.returncode == 0, f"{src.name} {opt} {cpu[0]}: {r.stderr.strip().splitlines()[:2]}"


@st.composite
def dense_case(draw):
    K = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 31, 32, 33, 63, 64, 65, 66, 127, 130]))
    N = draw(st.integers(1, 13))
    x = draw_array(draw, (K,), np.int8, -127, 127)
    w = draw_array(draw, (N, K), np.int16, -32767, 32767)
    b = draw_array(draw, (N,), np.int32, -(2**31) + 1, 2**31 - 1)
    e = draw_array(draw, (N,), np.int8, -127, 127)
    ex, ew, eb, ee = (draw(st.integers(-40, 12)) for _ in range(4))
    return x, w, b, e, ex, ew, eb, ee


def _fwd_bwd(lib, ffi, case):
    x, w, b, e, ex, ew, eb, ee = case
    N, K = w.shape
    y, dx = np.zeros(N, np.int8), np.zeros(K, np.int8)
    scratch = np.zeros(max(N, K), np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    p = ffi.new("tt_dense_params *", dict(K=K, N=N, w=c_i16(ffi, w), ew=ew, b=c_i32(ffi, b), eb=eb))
    ey = lib.tt_dense_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y))
    edx = lib.tt_dense_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dx))
    return ey, y, edx, dx, st_c.saturated


@settings(max_examples=200, deadline=None)
@given(dense_case())
def test_dense_forward_backward_dsp_equals_portable(clib, dsplib, case):
    got = _fwd_bwd(dsplib[1], dsplib[0], case)
    want = _fwd_bwd(clib[1], clib[0], case)
    assert got[0] == want[0] and np.array_equal(got[1], want[1])
    assert got[2] == want[2] and np.array_equal(got[3], want[3]) and got[4] == want[4]
    x, w, b, e, ex, ew, eb, ee = case
    y_ref, ey_ref, _ = rd.forward(x, ex, w, ew, b, eb)
    dx_ref, edx_ref, _, _ = rd.backward(e, ee, x, ex, w, ew)
    assert got[0] == ey_ref and np.array_equal(got[1], y_ref)
    assert got[2] == edx_ref and np.array_equal(got[3], dx_ref)


def _fwd_bwd_w8(lib, ffi, case, off):
    """tt_dense_fwd_s8_w8 / bwd with the weights `off` bytes past a word (rows at any alignment)."""
    x, w, b, e, ex, ew, eb, ee = case
    N, K = w.shape
    y, dx = np.zeros(N, np.int8), np.zeros(K, np.int8)
    buf = np.zeros(off + w.size, np.int8)
    buf[off:] = w.reshape(-1)
    scratch = np.zeros(max(N, K), np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    p = ffi.new("tt_dense_w8_params *", dict(K=K, N=N, w=ffi.cast("int8_t *", ffi.from_buffer(buf)) + off, ew=ew,
                                             b=c_i32(ffi, b), eb=eb))
    ey = lib.tt_dense_fwd_s8_w8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y))
    edx = lib.tt_dense_bwd_s8_w8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dx))
    return ey, y, edx, dx, st_c.saturated


@settings(max_examples=200, deadline=None)
@given(dense_case(), st.integers(0, 3), st.booleans())
def test_dense_w8_forward_backward_dsp_equals_portable_and_reference(clib, dsplib, case, off, extreme):
    """int8 weights (SXTB16 + SMLAD two rows a pass on DSP cores): drawn K (off the four-byte
    words), N (odd: the last row alone), weights at any alignment, values at the int8 ends."""
    x, w, b, e, ex, ew, eb, ee = case
    rng = np.random.default_rng(int(w.size) + off)
    w8 = (rng.choice(np.array([-127, 127], np.int8), w.shape) if extreme
          else rng.integers(-127, 128, w.shape).astype(np.int8))
    case = (x, w8, b, e, ex, ew, eb, ee)
    got, want = _fwd_bwd_w8(dsplib[1], dsplib[0], case, off), _fwd_bwd_w8(clib[1], clib[0], case, off)
    assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[4] == want[4]
    assert got[2] == want[2] and np.array_equal(got[3], want[3])
    y_ref, ey_ref, _ = rd.forward(x, ex, w8, ew, b, eb)
    dx_ref, edx_ref, _, _ = rd.backward(e, ee, x, ex, w8, ew)
    assert got[0] == ey_ref and np.array_equal(got[1], y_ref)
    assert got[2] == edx_ref and np.array_equal(got[3], dx_ref)


@pytest.mark.parametrize("K", [1, 2, 3, 4, 5, 8, 12, 32, 60, 63, 64, 65, 66, 67, 128, 129, 130, 258])
def test_dense_dsp_row_groups_chunks_and_bias_shifts(clib, dsplib, K):
    """Every row-group split (N = 1..13: fours, then a two, then a one), chunk boundaries, odd K,
    one-chunk K a multiple of 4 (the four-row passes of tt_dense_rows4_1c, N >= 4), and bias alignments on both sides of the rounding-shift fast case (ea - eb in -3..40), with
    extreme values: DSP == portable == reference."""
    rng = np.random.default_rng(K)
    for N in range(1, 14):
        for d in (-3, -1, 0, 1, 2, 30, 31, 32, 40):
            x = rng.choice(np.array([-127, -1, 0, 1, 127], np.int8), K)
            w = rng.choice(np.array([-32767, -1, 0, 1, 32767], np.int16), (N, K))
            b = rng.choice(np.array([-(2**31) + 1, -(2**30), -3, -1, 0, 1, 2, 3, 2**30, 2**31 - 1], np.int32), N)
            e = rng.integers(-127, 128, N).astype(np.int8)
            case = (x, w, b, e, -3, -4, -7 - d, 0)
            got = _fwd_bwd(dsplib[1], dsplib[0], case)
            want = _fwd_bwd(clib[1], clib[0], case)
            assert got[0] == want[0] and np.array_equal(got[1], want[1]) and got[4] == want[4]
            y_ref, ey_ref, _ = rd.forward(x, -3, w, -4, b, -7 - d)
            assert got[0] == ey_ref and np.array_equal(got[1], y_ref)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([4, 8, 12, 30, 32, 33, 64, 66, 130]), st.integers(1, 13), st.integers(0, 2**32 - 1),
       st.sampled_from([0.0, 0.3, 0.7, 0.9, 1.0]), st.booleans())
def test_dense_backward_zero_error_rows_dsp_equals_portable_and_reference(clib, dsplib, K, N, seed, p0, extreme):
    """The DSP errors skip row pairs whose errors are both 0 and every row after the last nonzero
    error (all zero, leading/trailing/interior zeros, odd N: the lone last row): DSP == portable ==
    reference, weights at +-32767 and errors at -128/127 when extreme."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, K).astype(np.int8)
    w = (rng.choice(np.array([-32767, 32767], np.int16), (N, K)) if extreme
         else rng.integers(-32767, 32768, (N, K)).astype(np.int16))
    e = (rng.choice(np.array([-128, 127], np.int8), N) if extreme else rng.integers(-127, 128, N).astype(np.int8))
    e = np.where(rng.random(N) < p0, 0, e).astype(np.int8)
    b = rng.integers(-(2**20), 2**20, N).astype(np.int32)
    case = (x, w, b, e, -7, -9, -16, -3)
    got, want = _fwd_bwd(dsplib[1], dsplib[0], case), _fwd_bwd(clib[1], clib[0], case)
    assert got[2] == want[2] and np.array_equal(got[3], want[3]) and got[4] == want[4]
    dx_ref, edx_ref, _, _ = rd.backward(e, -3, x, -7, w, -9)
    assert got[2] == edx_ref and np.array_equal(got[3], dx_ref)


@settings(max_examples=examples(60), deadline=None)
@given(st.integers(1, 41), st.integers(0, 2**32 - 1))
def test_relu_dsp_equals_portable_and_reference(clib, dsplib, n, seed):
    """ReLU forward and backward of the DSP build (four lanes per word: SSUB8 + SEL, then a scalar
    tail) == the portable build == the numpy reference, on every length's word/tail split and
    the int8 edges (-128, -1, 0, 1, 127), y of both signs in the backward."""
    from tinytrain.ops import relu as rrelu

    rng = np.random.default_rng(seed)
    edges = np.array([-128, -127, -1, 0, 1, 127], np.int8)
    x = np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.integers(-128, 128, n)).astype(np.int8)
    y = np.where(rng.random(n) < 0.5, rng.choice(edges, n), rng.integers(-128, 128, n)).astype(np.int8)
    e = rng.integers(-128, 128, n).astype(np.int8)
    y_ref, _, _ = rrelu.forward(x, -3)
    dx_ref = np.where(y > 0, e, 0).astype(np.int8)
    for ffi, lib in (clib, dsplib):
        st_c = ffi.new("tt_stats *")
        yc, dxc = np.zeros(n, np.int8), np.zeros(n, np.int8)
        assert lib.tt_relu_fwd_s8(c_i8(ffi, x), -3, n, c_i8(ffi, yc), st_c) == -3
        assert lib.tt_relu_bwd_s8(c_i8(ffi, e), 5, c_i8(ffi, y), n, c_i8(ffi, dxc), st_c) == 5
        assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref) and st_c.saturated == 0
    dx_ref2, _, _, _ = rrelu.backward(e, 5, y_ref)
    assert np.array_equal(dx_ref2, np.where(y_ref > 0, e, 0))


# weights at the edges of the DSP guard (|w| <= 16383 / 16384) and of int16
W_EDGES = np.array([-32768, -32767, -32766, -16385, -16384, -16383, -1, 0, 1, 16382, 16383, 16384,
                    32766, 32767], np.int64)


@st.composite
def sgd_case(draw):
    K = draw(st.sampled_from([1, 2, 3, 4, 5, 6, 9, 32, 33, 63, 64, 65, 66, 129]))
    N = draw(st.integers(1, 9))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    e = draw_array(draw, (N,), np.int8, -128, 127)
    mode = draw(st.sampled_from(["drawn", "edges", "near_guard", "near_limits"]))
    if mode == "drawn":
        w = draw_array(draw, (N, K), np.int16, -32768, 32767)
    else:
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        w = rng.choice(W_EDGES, (N, K))
        if mode == "near_guard":  # mostly in [-16384, 16383] with a few edge weights
            w = np.where(rng.random((N, K)) < 0.9, rng.integers(-16384, 16384, (N, K)), w)
        if mode == "near_limits":  # trained-model rows: |w| up to 32767, some within a step of it
            near = rng.integers(32767 - 2 ** int(rng.integers(0, 15)), 32768, (N, K)) * rng.choice([-1, 1], (N, K))
            w = np.where(rng.random((N, K)) < 0.5, near, rng.integers(-32767, 32768, (N, K)))
            w = np.where(rng.random((N, K)) < 0.02, -32768, w)
        w = w.astype(np.int16)
    b = draw_array(draw, (N,), np.int32, -(2**31), 2**31 - 1)
    m_t = draw(st.sampled_from([0, 1, 2, 255, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-2, 33))  # weight shift ew + k - (ee + ex), both sides of [1, 31]
    sb = draw(st.integers(-2, 33))  # bias shift eb + k - ee
    return x, e, w, b, m_t, s, sb


def _sgd(lib, ffi, case, k=20, offset=0):
    """offset: the weights start that many int16 into a buffer (1: rows not 4-byte aligned)."""
    x, e, w, b, m_t, s, sb = case
    N, K = w.shape
    ee, ex = -7, -6
    ew, eb = s - k + ee + ex, sb - k + ee
    buf = np.zeros(w.size + offset, np.int16)
    buf[offset:] = w.ravel()
    w, b = buf[offset:].reshape(N, K), b.copy()
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "cosine": cos})
    prng = ffi.new("uint32_t *", 1)
    st_c = ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
    p = ffi.new("tt_sgd_dense_s16_params *", dict(K=K, N=N, w=c_i16(ffi, buf) + offset, ew=ew, b=c_i32(ffi, b), eb=eb))
    lib.tt_sgd_dense_direct_s16(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
    return w.copy(), b, st_c.saturated, (ew, ee + ex, eb, ee, k)


@settings(max_examples=300, deadline=None)
@given(sgd_case())
def test_fused_sgd_dsp_equals_portable_and_reference(clib, dsplib, case):
    wd, bd, nd, exps = _sgd(dsplib[1], dsplib[0], case)
    wp, bp, np_, _ = _sgd(clib[1], clib[0], case)
    assert np.array_equal(wd, wp), f"first difference at {np.argwhere(wd != wp)[0]}"
    assert np.array_equal(bd, bp) and nd == np_
    # the reference on the same update (weights whose product m_t * e[n] * x[k] is 0 keep their
    # values in the C paths, which the reference only matches when no such weight is -32768: a
    # state that updates never produce, only a loaded blob could hold it)
    x, e, w, b, m_t, s, sb = case
    if (w[np.outer(m_t * e.astype(np.int64), x) == 0] == -32768).any() or (w[_rows_to_0(e, m_t, s)] == -32768).any():
        return
    ew, eg, eb, ee, k = exps
    opt = _opt(m_t, k)
    wr, br = w.copy(), b.copy()
    g = np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32)
    n1 = update_direct_ref(wr, ew, g, eg, opt, m_t, [1])
    n2 = update_direct_ref(br, eb, e.astype(np.int32), ee, opt, m_t, [1])
    assert np.array_equal(wd, wr) and np.array_equal(bd, br) and nd == n1 + n2


def _rows_to_0(e, m_t, s):
    """The rows the fused int16 update skips as a whole besides zero-error rows (C's
    tt_sgd_row_rounds_to_0, shift s in [8, 31]): -2^(s-8) < m_t e <= 2^(s-8), where every step
    round(m_t e x / 2^s) of an int8 x is 0, so the row keeps its weights (the reference clamps an
    old -32768 there, a weight no update stores)."""
    a = m_t * e.astype(np.int64)
    if not 8 <= s <= 31:
        return np.zeros(a.shape, bool)
    lim = 1 << (s - 8)
    return (a != 0) & (a > -lim) & (a <= lim)


def _opt(m_t, k):
    from tinytrain.graph.optim import IntSGD

    return IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=0, ib_k=0, batch_size=1,
                  schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                  cosine=np.zeros(65, np.int32), sr=False, master=False)


@st.composite
def zero_input_case(draw):
    """Inputs with drawn zero patterns (all zero, none zero, zero pairs, zero lanes, random), odd
    and even K across the 64-input chunks, weights near the guard and the limits, biases."""
    K = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 15, 31, 32, 33, 62, 63, 64, 65, 66, 127, 129, 130]))
    N = draw(st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = rng.integers(-128, 128, K)
    x[x == 0] = 1
    pattern = draw(st.sampled_from(["all", "none", "pairs", "lanes", "random"]))
    if pattern == "all":
        x[:] = 0
    elif pattern == "pairs":  # whole pairs (2j, 2j + 1) zero, the others not
        x[np.repeat(rng.random((K + 1) // 2) < draw(st.floats(0, 1)), 2)[:K]] = 0
    elif pattern == "lanes":  # one input of a pair zero
        x[draw(st.integers(0, 1))::2] = 0
    elif pattern == "random":
        x[rng.random(K) < draw(st.floats(0, 1))] = 0
    e = rng.integers(-128, 128, N)
    e[rng.random(N) < 0.3] = 0
    w = rng.choice(W_EDGES[1:], (N, K))  # -32768: never stored by an update (see IntSGD)
    w = np.where(rng.random((N, K)) < draw(st.sampled_from([0.0, 0.5, 0.9, 1.0])),
                 rng.integers(-16384, 16384, (N, K)), w)
    b = rng.integers(-(2**31), 2**31, N)
    m_t = draw(st.sampled_from([1, 255, 26214, 32767]) | st.integers(0, 32767))
    s, sb = draw(st.integers(1, 33)), draw(st.integers(-1, 33))
    return (x.astype(np.int8), e.astype(np.int8), w.astype(np.int16), b.astype(np.int32), m_t, s, sb)


@settings(max_examples=400, deadline=None)
@given(zero_input_case(), st.sampled_from([0, 1]))
def test_fused_sgd_zero_input_patterns_equal_portable_and_reference(clib, dsplib, case, offset):
    """The fused int16 Dense update with zero inputs (the DSP path's list of nonzero input pairs,
    rows two at a time over it, or all pairs when few are zero; offset 1: rows not 4-byte aligned)
    == the portable path == the reference (weights, biases, saturation count): a zero input or a
    zero row error leaves its weights as they are, which the reference does too for every weight
    an update can store."""
    x, e, w, b, m_t, s, sb = case
    wd, bd, nd, exps = _sgd(dsplib[1], dsplib[0], case, offset=offset)
    wp, bp, np_, _ = _sgd(clib[1], clib[0], case)
    assert np.array_equal(wd, wp), f"first difference at {np.argwhere(wd != wp)[0]}"
    assert np.array_equal(bd, bp) and nd == np_
    wr, br, nr, _ = _sgd_ref(x, e, w, b, m_t, exps)
    assert np.array_equal(wd, wr), f"first difference at {np.argwhere(wd != wr)[0]}"
    assert np.array_equal(bd, br) and nd == nr


@st.composite
def rounds_to_0_case(draw):
    """Rows whose error puts a = m_t e at or next to the bound 2^(s-8) of the whole-row skip
    (lim - 1, lim, lim + 1 and their negatives), inputs holding the int8 ends -128 and 127 (where
    a step first becomes +-1) or drawn, weights drawn or at the edges (no -32768: no update stores
    it), both alignments of the rows."""
    s = draw(st.integers(1, 33))
    lim = 1 << max(s - 8, 0)
    K = draw(st.sampled_from([1, 2, 3, 5, 8, 31, 64, 65, 130]))
    N = draw(st.integers(1, 9))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    if draw(st.booleans()):
        x[draw(st.integers(0, K - 1))] = -128
        x[draw(st.integers(0, K - 1))] = 127
    # a = m_t e near +-lim: e a power of two (or +-1, +-3) and m_t = target / e rounded
    targets = [lim - 1, lim, lim + 1, -(lim - 1), -lim, -(lim + 1), 0, 1, -1]
    e = np.zeros(N, np.int8)
    m_t = draw(st.sampled_from([1, 2, 3, 255, 4096, 32767]))
    for n in range(N):
        t = draw(st.sampled_from(targets))
        e[n] = np.int8(max(-128, min(127, t // m_t if t >= 0 else -((-t) // m_t))))
    if draw(st.booleans()):  # m_t = 1: every a of the list exactly (|a| <= 128)
        m_t = 1
        e = np.array([draw(st.sampled_from([t for t in targets if -128 <= t <= 127] or [0])) for _ in range(N)], np.int8)
    w = (draw_array(draw, (N, K), np.int16, -32767, 32767) if draw(st.booleans())
         else np.random.default_rng(draw(st.integers(0, 2**32 - 1))).choice(W_EDGES[1:], (N, K)).astype(np.int16))
    b = draw_array(draw, (N,), np.int32, -(2**31), 2**31 - 1)
    return x, e, w, b, m_t, s, draw(st.integers(-1, 33))


@settings(max_examples=examples(400), deadline=None)
@given(rounds_to_0_case(), st.sampled_from([0, 1]))
def test_fused_sgd_skips_rows_whose_steps_all_round_to_0(clib, dsplib, case, offset):
    """A row whose every step rounds to 0 for any int8 input (-2^(s-8) < m_t e <= 2^(s-8)) is
    skipped as a whole: DSP == portable == reference (weights, biases, saturations) at the bound
    (a = lim: the step of x = -128 is floor((-2^(s-1) + 2^(s-1)) / 2^s) = 0, kept; a = -lim: that
    of x = -128 is floor(2^s / 2^s) = 1, updated) and next to it, with inputs at -128 and 127."""
    x, e, w, b, m_t, s, sb = case
    wd, bd, nd, exps = _sgd(dsplib[1], dsplib[0], case, offset=offset)
    wp, bp, np_, _ = _sgd(clib[1], clib[0], case)
    assert np.array_equal(wd, wp), f"first difference at {np.argwhere(wd != wp)[0]}"
    assert np.array_equal(bd, bp) and nd == np_
    wr, br, nr, _ = _sgd_ref(x, e, w, b, m_t, exps)
    assert np.array_equal(wd, wr), f"first difference at {np.argwhere(wd != wr)[0]}"
    assert np.array_equal(bd, br) and nd == nr
    # the skipped rows are exactly those the reference leaves unchanged for every int8 input
    skip = _rows_to_0(e, m_t, s)
    if 1 <= s <= 31:
        a = m_t * e.astype(np.int64)
        every = np.arange(-128, 128, dtype=np.int64)
        d = (np.outer(a, every) + (1 << (s - 1))) >> s
        assert np.array_equal(skip, (a != 0) & (d == 0).all(axis=1))


def test_fused_sgd_row_skip_at_the_bound():
    """The bound itself on one case each side, for s = 8 (lim = 1) and s = 20 (lim = 4096)."""
    for s in (8, 20):
        lim = 1 << (s - 8)
        e = np.array([1, -1], np.int8)
        assert _rows_to_0(e, lim, s).tolist() == [True, False]
        assert _rows_to_0(e, lim - 1, s).tolist() == ([True, True] if lim > 1 else [False, False])
        assert _rows_to_0(e, lim + 1, s).tolist() == [False, False]


def _sgd_ref(x, e, w, b, m_t, exps):
    """The reference update of _sgd's weights and biases: (w, b, saturations, gradient)."""
    ew, eg, eb, ee, k = exps
    wr, br = w.copy(), b.copy()
    g = np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32)
    n = update_direct_ref(wr, ew, g, eg, _opt(m_t, k), m_t, [1])
    n += update_direct_ref(br, eb, e.astype(np.int32), ee, _opt(m_t, k), m_t, [1])
    return wr, br, n, g


@pytest.mark.parametrize("K", [1, 2, 7, 64, 65])
@pytest.mark.parametrize("s", [1, 9, 17, 31, 32, 40])
@pytest.mark.parametrize("w0", [-32768, -32767, -32766, -16385, 16384, 32766, 32767])
def test_fused_sgd_dsp_at_the_int16_limits(clib, dsplib, K, s, w0):
    """Rows of weights at or next to +-32767 (and -32768) with steps of both signs and sizes from 0
    to the largest the DSP path takes: saturating and exactly-reaching updates, |w - d| = 32767
    boundaries, and the all-zero steps of s >= 32."""
    rng = np.random.default_rng(K * 1000 + s * 10 + (w0 & 0xFF))
    x = rng.integers(-128, 128, K).astype(np.int8)
    x[:4] = np.array([-128, 127, 1, -1], np.int8)[:min(4, K)]
    e = np.array([0, 1, -1, 127, -128, 64, -3, 5], np.int8)
    w = np.full((e.size, K), w0, np.int16)
    w[:, ::3] = np.int16(-w0 if w0 != -32768 else 32767)
    b = np.zeros(e.size, np.int32)
    for m_t in (1, 255, 26214, 32767):
        case = (x, e, w, b, m_t, s, 12)
        wd, bd, nd, exps = _sgd(dsplib[1], dsplib[0], case)
        wp, bp, np_, _ = _sgd(clib[1], clib[0], case)
        assert np.array_equal(wd, wp), f"first difference at {np.argwhere(wd != wp)[0]}"
        assert np.array_equal(bd, bp) and nd == np_
        # the reference, on the weights the C path updates (e[n] x[k] != 0, for s < 32; the others
        # keep their values, where the reference would clamp an old -32768)
        wr, br, nr, g = _sgd_ref(x, e, w, b, m_t, exps)
        live = (g != 0) & ~_rows_to_0(e, m_t, s)[:, None] if s < 32 else np.broadcast_to((e != 0)[:, None], g.shape)
        assert np.array_equal(wd[live], wr[live]) and np.array_equal(wd[~live], w[~live])
        assert np.array_equal(bd, br) and nd == nr - int(np.count_nonzero(w[~live] == -32768))


@pytest.mark.parametrize("s", [31, 32, 40, 62, 63, 64, 94, 95, 109, 200])
def test_update_direct_stochastic_shift_beyond_63_bits(clib_ubsan, s):
    """Stochastic rounding with shifts past the width of int64 (tiny gradients at a large weight
    exponent): the C rounds as the reference does (floor, 0 or -1) instead of shifting int64 by 64
    or more (undefined behaviour, which UBSan turns into an abort)."""
    ffi, lib = clib_ubsan
    from tinytrain.graph.optim import IntSGD

    g = np.array([2**31 - 1, -(2**31), 1, -1, 0, 12345, -54321], np.int32)
    w = np.array([5, -5, 0, 1, -1, 2**31 - 1, -(2**31)], np.int32)
    opt = IntSGD(m=32767, k=0, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=0, ib_k=0, batch_size=1, schedule=0,
                 gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32), sr=True, master=False)
    wr, prng_ref = w.copy(), [7]
    update_direct_ref(wr, s, g, 0, opt, 32767, prng_ref)
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": 32767, "k": 0, "batch_size": 1, "sr": 1, "cosine": cos})
    prng, st_c = ffi.new("uint32_t *", 7), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": 32767, "prng": prng, "stats": st_c})
    wc = w.copy()
    lib.tt_sgd_update_direct_s32(u, c_i32(ffi, wc), w.size, s, c_i32(ffi, g), 0)
    assert np.array_equal(wc, wr) and prng[0] == prng_ref[0]


@pytest.mark.parametrize("s", [31, 32, 40, 62, 63, 64, 94, 95, 109, 200])
def test_numba_update_direct_stochastic_shift_beyond_63_bits(s):
    """The numba twin of the test above: the same floor (0 or -1) past 63 bits, same PRNG draws."""
    from tinytrain.graph.optim import IntSGD
    from tinytrain.kernels.optim import update_direct

    g = np.array([2**31 - 1, -(2**31), 1, -1, 0, 12345, -54321], np.int32)
    w = np.array([5, -5, 0, 1, -1, 2**31 - 1, -(2**31)], np.int32)
    opt = IntSGD(m=32767, k=0, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=0, ib_k=0, batch_size=1, schedule=0,
                 gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32), sr=True, master=False)
    wr, prng_ref = w.copy(), [7]
    update_direct_ref(wr, s, g, 0, opt, 32767, prng_ref)
    wn, meta, stats = w.copy(), np.array([7, 0, 0], np.int64), np.zeros(4, np.int64)
    update_direct(wn, s, g, 0, 0, 32767, True, 0, 0, -(2**31), 2**31 - 1, meta, stats)
    assert np.array_equal(wn, wr) and int(meta[0]) == prng_ref[0]


# ------------------------------------------------------------------ convolutions


@st.composite
def conv_dsp_case(draw, rows3=False, pairs2=False):
    """Conv2d cases for the int32 paths: channel counts across the register blocks (4 output rows,
    2 x 4 and 4 x 1 gradient blocks, 4-wide input-gradient blocks) and their tails, Cin = 1 (W3's
    conv1), strides and paddings, and columns past TT_CONV_COL_MAX (the int64 path). rows3: only
    windows of KH <= 3 rows of KW * Cin = 3 values (the forward's R3 path, W3's conv1 among them),
    and Cout up to 17 on either side of its Cout >= words bound. pairs2: 3-wide kernels at
    stride_w 1 over 3 or 4 output columns (two position pairs a row: the weight gradient's
    unrolled rows, W3's conv2), two output channels or more."""
    from tinytrain.ops import conv2d as r2

    H, W = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    KH, KW = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    if rows3:
        KH, (KW, Cin) = draw(st.integers(1, 3)), draw(st.sampled_from([(3, 1), (3, 1), (1, 3)]))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    padding = draw(st.sampled_from(["valid", "same", (1, 0, 2, 1), (0, 2, 0, 0)]))
    if pairs2:
        KW, stride = 3, (stride[0], 1)
        padding, W = draw(st.sampled_from([("same", 3), ("same", 4), ("valid", 5), ("valid", 6)]))
    try:
        OH, OW, _, pads = r2.geometry(H, W, KH, KW, stride, padding)
    except ValueError:
        from hypothesis import assume
        assume(False)
    if not rows3:
        Cin = draw(st.sampled_from([1, 1, 2, 3, 4, 5, 7, 8, 9, 16, 17, 29]))
    Cout = draw(st.sampled_from([2, 3, 4, 16] if pairs2 else [1, 2, 3, 4, 5, 7, 8, 9, 16, 17]))
    mode = draw(st.sampled_from(["drawn", "extreme"]))
    if mode == "drawn":
        x = draw_array(draw, (H, W, Cin), np.int8, -127, 127)
        w = draw_array(draw, (Cout, KH, KW, Cin), np.int16, -32767, 32767)
        e = draw_array(draw, (OH, OW, Cout), np.int8, -127, 127)
    else:  # the largest sums: every product at +-127 * 32767
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        x = rng.choice(np.array([-127, 127], np.int8), (H, W, Cin))
        w = rng.choice(np.array([-32767, 32767], np.int16), (Cout, KH, KW, Cin))
        e = rng.choice(np.array([-127, 127], np.int8), (OH, OW, Cout))
    b = draw_array(draw, (Cout,), np.int32, -(2**31) + 1, 2**31 - 1)
    exps = tuple(draw(st.integers(-30, 10)) for _ in range(4))
    return dict(x=x, w=w, b=b, e=e, exps=exps, stride=stride, padding=padding, pads=pads)


def _conv2d_dims(c):
    """The geometry fields of tt_conv_params for case c."""
    (sh, sw), (pt, _, pl, _) = c["stride"], c["pads"]
    H, W, Cin = c["x"].shape
    Cout, KH, KW, _ = c["w"].shape
    OH, OW, _ = c["e"].shape
    return dict(H=H, W=W, Cin=Cin, Cout=Cout, kh=KH, kw=KW, stride_h=sh, stride_w=sw, pad_h=pt, pad_w=pl,
                Ho=OH, Wo=OW)


def _conv2d_c(lib, c):
    ffi, L = lib
    return conv_run_c(ffi, L.tt_conv2d_fwd_s8, L.tt_conv2d_bwd_s8, L.tt_conv2d_grad_s32, c, "tt_conv_params",
                      _conv2d_dims(c), c["x"], c["w"], c["e"])


@settings(max_examples=150, deadline=None)
@given(conv_dsp_case())
def test_conv2d_dsp_equals_portable_and_reference(clib, dsplib, c):
    """Forward, input gradient and weight gradient of the DSP build (SMLAD rows, the short-column
    forward, SMLAD input-gradient and weight-gradient blocks) == the portable build == the numpy reference, outputs, exponents and
    saturation counts, with guard words around every buffer."""
    _check_conv2d_dsp(clib, dsplib, c)


def _check_conv2d_dsp(clib, dsplib, c):
    from tinytrain.ops import conv2d as r2

    ref = conv_run_ref(r2, c, stride=c["stride"], padding=c["padding"])
    conv_assert_same(ref, _conv2d_c(clib, c), "portable")
    conv_assert_same(ref, _conv2d_c(dsplib, c), "DSP")


@settings(max_examples=150, deadline=None)
@given(conv_dsp_case(rows3=True))
def test_conv2d_rows3_dsp_equals_portable_and_reference(clib, dsplib, c):
    """The R3 forward (rows of three values, conv1's shape; its int32 sums and the four-a-step
    requantization) equals the portable path and the reference on drawn shapes and extremes."""
    _check_conv2d_dsp(clib, dsplib, c)


def _grad_w_chan(lib, c, co, nco):
    from .test_ops_conv import guarded, untouched

    ffi, L = lib
    x, w, e = c["x"], c["w"], c["e"]
    _, KH, KW, Cin = w.shape
    p = ffi.new("tt_conv_params *", dict(_conv2d_dims(c), w=c_i16(ffi, w), ew=0, b=c_i32(ffi, c["b"]), eb=0))
    n = nco * KH * KW * Cin
    g_g, g = guarded(n, np.int32, fill=7)
    L.tt_conv2d_grad_w_chan_s32(p, c_i8(ffi, e), c_i8(ffi, x), co, nco, c_i32(ffi, g_g))
    assert untouched(g_g, n), "tt_conv2d_grad_w_chan_s32 wrote past its buffer"
    return g.reshape(nco, KH, KW, Cin)


@settings(max_examples=examples(60), deadline=None)
@given(conv_dsp_case(), st.data())
def test_conv2d_grad_by_channel_dsp_equals_portable_and_reference(clib, dsplib, c, data):
    """The weight gradient of a channel range (what a training step calls, two channels at a
    time): the DSP build (SMLAD over position pairs, padded int16 copies) == the portable build ==
    the numpy reference's slice, for drawn ranges, odd output widths and strides."""
    from tinytrain.ops import conv2d as r2

    Cout = c["w"].shape[0]
    co = data.draw(st.integers(0, Cout - 1))
    _check_grad_by_channel(clib, dsplib, c, co, data.draw(st.integers(1, Cout - co)))


@settings(max_examples=examples(60), deadline=None)
@given(conv_dsp_case(pairs2=True), st.data())
def test_conv2d_grad_two_pair_rows_dsp_equals_portable_and_reference(clib, dsplib, c, data):
    """The weight gradient's unrolled rows (two position pairs a row, two channels a call, as W3's
    conv2 takes it), the whole tensor and channel ranges, == the portable build == the reference."""
    Cout = c["w"].shape[0]
    _check_conv2d_dsp(clib, dsplib, c)
    co = data.draw(st.integers(0, Cout - 2))
    _check_grad_by_channel(clib, dsplib, c, co, 2)


def _check_grad_by_channel(clib, dsplib, c, co, nco):
    from tinytrain.ops import conv2d as r2

    ref = conv_run_ref(r2, c, stride=c["stride"], padding=c["padding"])[6][co:co + nco]
    for who, lib in (("portable", clib), ("DSP", dsplib)):
        got = _grad_w_chan(lib, c, co, nco)
        if not np.array_equal(ref, got):
            i = tuple(int(v) for v in np.argwhere(ref != got)[0])
            pytest.fail(f"{who}: gw differs first at {i}: ref {ref[i]} vs {got[i]}")


# ------------------------------------------------------------------ element-wise SGD update


@st.composite
def update_case(draw):
    """A direct-mode update of an int16 tensor from an int32 gradient (a conv weight's, a batch
    norm gamma's): gradient magnitudes on both sides of the int32 fast path's bound, weights at
    the int16 and guard edges, shifts on both sides of [1, 31], and the options that leave the
    fast path (stochastic rounding, weight decay)."""
    n = draw(st.sampled_from([1, 2, 3, 7, 8, 72, 129, 1152]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gb = draw(st.sampled_from([0, 1, 7, 14, 20, 24, 31]))
    g = rng.integers(-(2**gb), 2**gb + 1, n).astype(np.int64)
    if draw(st.booleans()):
        g[rng.integers(0, n)] = draw(st.sampled_from([-(2**31), 2**31 - 1, 0, 1, -1]))
    g = np.clip(g, -(2**31), 2**31 - 1).astype(np.int32)
    wkind = draw(st.sampled_from(["edges", "uniform", "guarded"]))
    if wkind == "edges":
        w = rng.choice(W_EDGES, n).astype(np.int16)
    elif wkind == "uniform":
        w = rng.integers(-32767, 32768, n).astype(np.int16)
    else:  # mostly inside the DSP guard's [-16384, 16383], a few edges: blocks on both sides of it
        w = np.where(rng.random(n) < 0.97, rng.integers(-16384, 16384, n), rng.choice(W_EDGES, n)).astype(np.int16)
    m_t = draw(st.sampled_from([0, 1, 255, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-2, 40))
    sr, wd = draw(st.sampled_from([(0, 0), (0, 0), (0, 0), (1, 0), (0, 1)]))
    return w, g, m_t, s, sr, wd


def _update(lib, ffi, case, k=20, offset=0):
    """offset: the weights start that many int16 into a buffer (1: not 4-byte aligned, the DSP
    path's word loads instead of LDRD/STRD)."""
    w, g, m_t, s, sr, wd = case
    buf = np.zeros(w.size + offset, np.int16)
    buf[offset:] = w
    w = buf[offset:]
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "sr": sr, "wd_m": 300 * wd, "wd_k": 20,
                             "cosine": cos})
    prng, st_c = ffi.new("uint32_t *", 12345), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
    ew, eg = s - k - 3, -3
    lib.tt_sgd_update_direct_s16(u, c_i16(ffi, buf) + offset, w.size, ew, c_i32(ffi, g), eg)
    return w.copy(), st_c.saturated, prng[0]


@settings(max_examples=300, deadline=None)
@given(update_case(), st.sampled_from([0, 1]))
def test_update_direct_s16_dsp_equals_portable_and_reference(clib, dsplib, case, offset):
    """tt_sgd_update_direct_s16 (its plain-SGD int32 fast path: DSP blocks of eight with the
    saturation guard, aligned (LDRD/STRD) or not, and the generic path for the other options) ==
    the numpy reference: weights, saturation count and PRNG state."""
    from tinytrain.graph.optim import IntSGD

    wd_, nd, pd = _update(dsplib[1], dsplib[0], case, offset=offset)
    wp, np_, pp = _update(clib[1], clib[0], case)
    assert np.array_equal(wd_, wp), f"first difference at {np.argwhere(wd_ != wp)[0]}"
    assert nd == np_ and pd == pp
    w, g, m_t, s, sr, wd = case
    opt = IntSGD(m=m_t, k=20, mu_m=0, mu_k=0, wd_m=300 * wd, wd_k=20, ib_m=0, ib_k=0, batch_size=1,
                 schedule=0, gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32),
                 sr=bool(sr), master=False)
    wr, prng = w.copy(), [12345]
    nr = update_direct_ref(wr, s - 20 - 3, g, -3, opt, m_t, prng)
    assert np.array_equal(wd_, wr) and nd == nr and pd == prng[0]


W32_EDGES = np.array([-(2**31), -(2**31) + 1, -(2**31) + 2, -(2**30), -1, 0, 1, 2**30, 2**31 - 2, 2**31 - 1],
                     np.int64)


def _update32(lib, ffi, w, g, m_t, s, sr, wd, k=20):
    w = w.copy()
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "sr": sr, "wd_m": 300 * wd, "wd_k": 20,
                             "cosine": cos})
    prng, st_c = ffi.new("uint32_t *", 12345), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
    lib.tt_sgd_update_direct_s32(u, c_i32(ffi, w), w.size, s - k - 3, c_i32(ffi, g), -3)
    return w, st_c.saturated, prng[0]


@settings(max_examples=200, deadline=None)
@given(update_case(), st.booleans(), st.integers(0, 2**32 - 1), st.none() | st.integers(30, 70))
def test_update_direct_s32_equals_reference(clib, dsplib, case, edges, seed, s_wide):
    """tt_sgd_update_direct_s32 (a bias's, a batch-norm beta's: its plain-SGD SMMULR and SMULL-high
    paths, the generic path for the other options and shifts) of the portable and the DSP builds == the numpy
    reference, weights at and near the int32 limits included: weights, saturations, PRNG state."""
    from tinytrain.graph.optim import IntSGD

    w16, g, m_t, s, sr, wd = case
    s = s if s_wide is None else s_wide  # shifts of a bias's update reach past 32 (its SMULL-high path)
    rng = np.random.default_rng(seed)
    w = (rng.choice(W32_EDGES, w16.size) if edges else rng.integers(-(2**31), 2**31, w16.size)).astype(np.int32)
    opt = IntSGD(m=m_t, k=20, mu_m=0, mu_k=0, wd_m=300 * wd, wd_k=20, ib_m=0, ib_k=0, batch_size=1,
                 schedule=0, gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32),
                 sr=bool(sr), master=False)
    wr, prng = w.copy(), [12345]
    nr = update_direct_ref(wr, s - 20 - 3, g, -3, opt, m_t, prng)
    for who, (ffi, lib) in (("portable", clib), ("DSP", dsplib)):
        wc, nc, pc = _update32(lib, ffi, w, g, m_t, s, sr, wd)
        assert np.array_equal(wc, wr), f"{who}: first difference at {np.argwhere(wc != wr)[0]}"
        assert nc == nr and pc == prng[0], who


@st.composite
def accum_case(draw):
    """Accumulate-mode updates (per sample, then at the end of the batch) with every option:
    momentum, weight decay, stochastic rounding, int16 or int32 (master) weights, batch sizes 1
    and > 1, shifts on both sides of the fast paths' ranges."""
    n = draw(st.sampled_from([1, 2, 5, 64, 130]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gb = draw(st.sampled_from([0, 7, 14, 20, 31]))
    g = np.clip(rng.integers(-(2**gb), 2**gb + 1, n), -(2**31), 2**31 - 1).astype(np.int32)
    A = np.clip(rng.integers(-(2**draw(st.sampled_from([0, 20, 31]))), 2**31, n), -(2**31), 2**31 - 1).astype(np.int32)
    V = rng.integers(-(2**31), 2**31, n).astype(np.int32)
    wide = draw(st.booleans())
    w = (rng.integers(-(2**31), 2**31, n) if wide else rng.choice(W_EDGES, n)).astype(np.int32 if wide else np.int16)
    m_t = draw(st.sampled_from([0, 1, 983, 26214, 32767]))
    s = draw(st.integers(-2, 40))
    mu = draw(st.sampled_from([(0, 0), (29491, 15), (1, 1), (16384, 15), (32767, 15), (3, 2), (100, 40)]))
    wd = draw(st.sampled_from([(0, 0), (27488, 40), (27488, 31), (19661, 20), (32767, 9), (5, 8), (300, 3)]))
    batch = draw(st.sampled_from([1, 1, 1, 4]))
    sr = draw(st.integers(0, 1))
    return g, A, V, w, m_t, s, mu, wd, batch, sr


def _accum(lib, ffi, case):
    g, A, V, w, m_t, s, mu, wd, batch, sr = case
    A, V, w = A.copy(), V.copy(), w.copy()
    cos = ffi.new("int32_t[65]")
    ib = (16384, 16) if batch > 1 else (0, 0)
    o = ffi.new("tt_sgd *", {"m": m_t, "k": 20, "mu_m": mu[0], "mu_k": mu[1], "wd_m": wd[0], "wd_k": wd[1],
                             "ib_m": ib[0], "ib_k": ib[1], "batch_size": batch, "sr": sr, "cosine": cos})
    prng, st_c = ffi.new("uint32_t *", 987654321), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
    lib.tt_sgd_accumulate_s32(u, c_i32(ffi, A), A.size, s - 20 + 8 - 3, c_i32(ffi, g), -3)
    Vp = c_i32(ffi, V) if mu[0] else ffi.NULL
    if w.dtype == np.int16:
        lib.tt_sgd_apply_accumulated_s16(u, c_i16(ffi, w), c_i32(ffi, A), Vp, w.size)
    else:
        lib.tt_sgd_apply_accumulated_s32(u, c_i32(ffi, w), c_i32(ffi, A), Vp, w.size)
    return A, V, w, st_c.saturated, prng[0]


@settings(max_examples=300, deadline=None)
@given(accum_case())
def test_accumulate_apply_dsp_equals_portable_and_reference(clib, dsplib, case):
    """tt_sgd_accumulate_s32 then tt_sgd_apply_accumulated_s16/_s32 (fast paths for batch 1 and
    in-range shifts, generic otherwise) on the DSP and the portable builds == the numpy
    reference: accumulators, velocities, weights, saturations, PRNG state."""
    from tinytrain.graph.optim import IntSGD, accumulate_ref, apply_accumulated_ref

    got, want = _accum(dsplib[1], dsplib[0], case), _accum(clib[1], clib[0], case)
    for a, b in zip(got, want):
        assert np.array_equal(a, b)
    g, A, V, w, m_t, s, mu, wd, batch, sr = case
    ib = (16384, 16) if batch > 1 else (0, 0)
    opt = IntSGD(m=m_t, k=20, mu_m=mu[0], mu_k=mu[1], wd_m=wd[0], wd_k=wd[1], ib_m=ib[0], ib_k=ib[1],
                 batch_size=batch, schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                 cosine=np.zeros(65, np.int32), sr=bool(sr), master=False)
    Ar, Vr, wr, prng = A.copy(), V.copy(), w.copy(), [987654321]
    accumulate_ref(Ar, s - 20 + 8 - 3, g, -3, opt, m_t, prng)
    nr = apply_accumulated_ref(wr, Ar, Vr if mu[0] else None, opt, prng)
    assert np.array_equal(got[0], Ar) and np.array_equal(got[2], wr) and got[3] == nr and got[4] == prng[0]
    if mu[0]:
        assert np.array_equal(got[1], Vr)


@settings(max_examples=examples(60), deadline=None)
@given(accum_case(), st.booleans())
def test_fused_accumulate_apply_equals_two_calls(clib, dsplib, case, with_copy):
    """tt_sgd_accumulate_apply_s16/_s32 (one pass: accumulate, apply, refresh of the int16 copy;
    batch 1, no stochastic rounding) == tt_sgd_accumulate_s32 + tt_sgd_apply_accumulated (+
    tt_sgd_refresh_copy), on the DSP and the portable builds: accumulators, velocities, weights,
    copy, saturations, PRNG state."""
    g, A, V, w, m_t, s, mu, wd, batch, sr = case
    case = (g, A, V, w, m_t, s, mu, wd, 1, 0)
    for ffi, lib in (dsplib, clib):
        want = _accum(lib, ffi, case)
        A2, V2, w2 = A.copy(), V.copy(), w.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": 20, "mu_m": mu[0], "mu_k": mu[1], "wd_m": wd[0], "wd_k": wd[1],
                                 "ib_m": 0, "ib_k": 0, "batch_size": 1, "sr": 0, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 987654321), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        Vp = c_i32(ffi, V2) if mu[0] else ffi.NULL
        if w.dtype == np.int16:
            lib.tt_sgd_accumulate_apply_s16(u, c_i16(ffi, w2), c_i32(ffi, A2), Vp, w.size, s - 20 + 8 - 3, c_i32(ffi, g), -3)
        else:
            cp = np.full(w.size, 7, np.int16)
            lib.tt_sgd_accumulate_apply_s32(u, c_i32(ffi, w2), c_i16(ffi, cp) if with_copy else ffi.NULL, c_i32(ffi, A2),
                                            Vp, w.size, s - 20 + 8 - 3, c_i32(ffi, g), -3)
            if with_copy:
                r = ((want[2] >> 15) + 1) >> 1
                assert np.array_equal(cp, np.clip(r, -32767, 32767).astype(np.int16))
        for a_, b_ in zip((A2, V2, w2, st_c.saturated, prng[0]), want):
            assert np.array_equal(a_, b_)


def test_refresh_copy_edges(clib, dsplib):
    """int16 compute copy of an int32 master at the rounding and saturation edges."""
    m = np.array([0, 1, -1, 32767, 32768, -32768, -32769, 2**31 - 1, -(2**31), 2**31 - 32769, -(2**31) + 32768,
                  32767 * 65536 + 32767, 32767 * 65536 + 32768, -32767 * 65536 - 32768, -32767 * 65536 - 32769],
                 np.int64).astype(np.int32)
    from tinytrain.fixedpoint import rshift_round

    want = np.clip(rshift_round(m.astype(np.int64), 16), -32767, 32767).astype(np.int16)
    for ffi, lib in (clib, dsplib):
        w = np.zeros(m.size, np.int16)
        lib.tt_sgd_refresh_copy(c_i32(ffi, m), c_i16(ffi, w), m.size)
        assert np.array_equal(w, want)


# ------------------------------------------------------------------ pooling


@st.composite
def maxpool_2x2_case(draw):
    """2x2 stride-2 max pooling (the DSP path: four channels per word, then a scalar tail) on
    channel counts across the word split, odd sizes (rows / columns no window reads), and inputs
    full of ties (few distinct values, so the first-maximum rule decides) or drawn."""
    H, W = draw(st.integers(2, 9)), draw(st.integers(2, 9))
    C = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    mode = draw(st.sampled_from(["ties", "edges", "drawn"]))
    if mode == "ties":
        x = rng.integers(-1, 2, (H, W, C)).astype(np.int8)
    elif mode == "edges":
        x = rng.choice(np.array([-128, -127, -1, 0, 1, 126, 127], np.int8), (H, W, C))
    else:
        x = draw_array(draw, (H, W, C), np.int8, -128, 127)
    e = rng.integers(-127, 128, (H // 2, W // 2, C)).astype(np.int8)  # errors are in +-127
    return x, e, draw(st.integers(-30, 10)), draw(st.integers(-30, 10))


@settings(max_examples=examples(150), deadline=None)
@given(maxpool_2x2_case())
def test_maxpool_2x2_dsp_equals_portable_and_reference(clib, dsplib, case):
    """MaxPool 2x2/2 forward and backward of the DSP build (SSUB8 + SEL maxima, the first maximum
    of the window picked lane by lane) == the portable build == the numpy reference: outputs,
    exponents, saturation counts, and dx written everywhere (guard-filled buffers)."""
    from tinytrain.ops import maxpool as rmax

    x, e, ex, ee = case
    H, W, C = x.shape
    y_ref, ey_ref, _ = rmax.forward(x, ex, (2, 2), (2, 2))
    dx_ref, edx_ref, nsat_ref, _ = rmax.backward(e, ee, x, (2, 2), (2, 2))
    for who, (ffi, lib) in (("portable", clib), ("DSP", dsplib)):
        y, dx = np.full(e.shape, 77, np.int8), np.full(x.shape, 77, np.int8)
        scratch = np.zeros(1, np.int64)  # alive while the ctx is used (c_ctx does not own it)
        ctx, st_c = c_ctx(ffi, scratch)
        p = ffi.new("tt_pool_params *", dict(H=H, W=W, C=C, kh=2, kw=2, stride_h=2, stride_w=2))
        assert lib.tt_maxpool2d_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y)) == ey_ref, who
        assert lib.tt_maxpool2d_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, x), c_i8(ffi, dx)) == edx_ref, who
        assert np.array_equal(y, y_ref), f"{who}: y differs first at {np.argwhere(y != y_ref)[0]}"
        assert np.array_equal(dx, dx_ref), f"{who}: dx differs first at {np.argwhere(dx != dx_ref)[0]}"
        assert st_c.saturated == nsat_ref, who


# ------------------------------------------------------------------ batch norm


@st.composite
def bn_dsp_case(draw):
    """Batch norm cases for the DSP paths: channel counts across the four-channel words and
    their scalar tails, P on both sides of the int16-lane limit of the sums (255), int8 inputs
    down to -128, drawn exponents, parameters and running statistics (eval with stale ones
    saturates x_hat: the element-by-element fallbacks)."""
    from tinytrain.ops import batchnorm as rb

    C = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 17]))
    P = draw(st.sampled_from([1, 2, 3, 4, 7, 16, 63, 64, 100, 255, 256, 300]))
    x = draw_array(draw, (P, C), np.int8, -128, 127)
    e = draw_array(draw, (P, C), np.int8, -127, 127)
    if draw(st.booleans()):  # a shifted, narrow distribution per channel (a trained layer's)
        rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        x = np.clip(rng.normal(rng.integers(-60, 60, C), rng.integers(1, 30, C), (P, C)), -127, 127).astype(np.int8)
    return dict(
        x=x, e=e, gamma=draw_array(draw, (C,), np.int16, -32767, 32767),
        beta=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        rmean=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        rvar=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        ex=draw(st.integers(-24, 24)), ee=draw(st.integers(-24, 8)), e_g=draw(st.integers(-15, -6)),
        e_b=draw(st.integers(-32, 0)), e_rm=draw(st.integers(-28, 4)), e_rv=draw(st.integers(-31, 4)),
        cfg=rb.config(eps=draw(st.sampled_from([0.0, 1e-5, 1e-3, 0.1, 7.0])),
                      momentum=draw(st.sampled_from([1.0, 0.5, 0.1, 0.01, 2**-20]))))


@settings(max_examples=examples(150), deadline=None)
@given(bn_dsp_case(), st.booleans())
def test_batchnorm_dsp_equals_portable_and_reference(clib, dsplib, k, train):
    """Batch norm forward (train and eval), backward and gradients of the DSP build (four-channel
    SIMD statistics) == the portable build == the numpy reference: outputs, exponents, saved
    constants, running statistics, saturation counts, dgamma and dbeta."""
    train = train and k["x"].shape[0] >= 2
    ref = bn_ref_run(k, train)
    bn_assert_same(ref, bn_c_run(*clib, k, train), "portable")
    bn_assert_same(ref, bn_c_run(*dsplib, k, train), "DSP")


@st.composite
def bn_bwd_case(draw):
    """Train batch norm cases aimed at the backward's int32 paths: P from 2 (tiny variance, eps
    dominating) to past 64, odd P (the two-a-turn loops' tails), channel counts off the four-lane
    words; channels constant, two-valued, narrow or full-range; errors zero (shift 0), +-1,
    +-127 in mirrored pairs (J = a and -(a + 1): the maximum settled from J ^ (J >> 31)) or drawn;
    gamma zero, small or extreme."""
    from tinytrain.ops import batchnorm as rb

    C = draw(st.sampled_from([1, 2, 3, 5, 8, 13, 16, 17]))
    P = draw(st.sampled_from([2, 3, 5, 15, 16, 17, 33, 64, 65]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    xk = draw(st.sampled_from(["full", "narrow", "two", "const"]))
    if xk == "full":
        x = rng.integers(-128, 128, (P, C))
    elif xk == "narrow":
        x = np.clip(rng.normal(rng.integers(-60, 60, C), rng.integers(1, 8, C), (P, C)), -128, 127)
    elif xk == "two":
        x = np.where(rng.random((P, C)) < 0.5, rng.integers(-128, 0, C), rng.integers(0, 128, C))
    else:
        x = np.broadcast_to(rng.integers(-128, 128, C), (P, C))
    ek = draw(st.sampled_from(["zero", "unit", "mirror", "drawn"]))
    if ek == "zero":
        e = np.zeros((P, C), np.int64)
    elif ek == "unit":
        e = rng.integers(-1, 2, (P, C))
    elif ek == "mirror":
        half = rng.choice([-127, -64, 64, 127], ((P + 1) // 2, C))
        e = np.concatenate([half, -half])[:P]
        x = np.concatenate([x[:(P + 1) // 2], -np.clip(x[:(P + 1) // 2], -127, 127)])[:P]
    else:
        e = rng.integers(-127, 128, (P, C))
    gk = draw(st.sampled_from(["one", "zero", "drawn", "extreme"]))
    gamma = {"one": np.full(C, 1 << 14), "zero": np.zeros(C), "drawn": rng.integers(-32767, 32768, C),
             "extreme": rng.choice([-32767, 32767, 1, -1], C)}[gk]
    return dict(
        x=np.ascontiguousarray(x, np.int8), e=np.ascontiguousarray(e, np.int8), gamma=gamma.astype(np.int16),
        beta=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        rmean=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        rvar=draw_array(draw, (C,), np.int32, -(2**31) + 1, 2**31 - 1),
        ex=draw(st.integers(-12, 4)), ee=draw(st.integers(-24, 8)), e_g=draw(st.sampled_from([-14, -15, -6])),
        e_b=draw(st.integers(-32, 0)), e_rm=draw(st.integers(-28, 4)), e_rv=draw(st.integers(-31, 4)),
        cfg=rb.config(eps=draw(st.sampled_from([0.0, 1e-5, 0.1])), momentum=0.1))


@settings(max_examples=examples(300), deadline=None)
@given(bn_bwd_case())
def test_batchnorm_train_backward_int32_paths(clib, dsplib, k):
    """The train backward's int32 paths (x_hat + 2^30 with Se and G from one sum, J and its
    maximum two positions a turn, the maximum settled when the shift depends on it) on the DSP
    build and the portable one == the numpy reference: dx, its exponent, saturation counts,
    dgamma and dbeta."""
    ref = bn_ref_run(k, True)
    bn_assert_same(ref, bn_c_run(*clib, k, True), "portable")
    bn_assert_same(ref, bn_c_run(*dsplib, k, True), "DSP")


@st.composite
def momentum_case(draw):
    """The momentum step fused at a tensor's backward (batch 1, no decay, no stochastic rounding):
    drawn sizes (the DSP loop's blocks of four and their tails), gradients and accumulators of
    every magnitude, velocities up to the int32 limits, weights at and around the DSP guard and
    the int16 limits, learning-rate multipliers and shifts on both sides of the fast path's range,
    momentum multipliers above and below 2^(mu_k - 1) (SMMLAR or SMMULR)."""
    n = draw(st.integers(0, 70))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gb, ab, vb = (draw(st.sampled_from([0, 7, 14, 20, 26, 31])) for _ in range(3))
    g = rng.integers(-(2**gb), 2**gb, n, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)
    A = rng.integers(-(2**ab), 2**ab, n, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)
    V = rng.integers(-(2**vb), 2**vb, n, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)
    if draw(st.booleans()):
        w = rng.integers(-(2**31), 2**31, n).astype(np.int32)
    else:
        w = np.where(rng.random(n) < 0.7, rng.integers(-16384, 16384, n), rng.choice(W_EDGES, n)).astype(np.int16)
    m_t = draw(st.sampled_from([0, 1, 983, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-1, 33))
    mk = draw(st.integers(1, 31))
    mu = draw(st.integers(1, 2**mk - 1) | st.sampled_from([2 ** (mk - 1), 2 ** (mk - 1) - 1, 1]))
    return g, A, V, w, m_t, s, (mu, mk)


@settings(max_examples=400, deadline=None)
@given(momentum_case(), st.booleans())
def test_momentum_fused_step_equals_reference(clib, dsplib, case, with_copy):
    """tt_sgd_accumulate_apply_s16/_s32 with momentum (the DSP build's LDRD/SMMLAR/SSUB16 loop, the
    portable build's sgd_apply_body) == the numpy reference accumulate_ref + apply_accumulated_ref:
    accumulators, velocities, weights, the int16 copy of int32 weights, saturation count."""
    from tinytrain.graph.optim import IntSGD, accumulate_ref, apply_accumulated_ref

    g, A, V, w, m_t, s, mu = case
    opt = IntSGD(m=m_t, k=20, mu_m=mu[0], mu_k=mu[1], wd_m=0, wd_k=0, ib_m=1, ib_k=0, batch_size=1,
                 schedule=0, gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32),
                 sr=False, master=False)
    Ar, Vr, wr = A.copy(), V.copy(), w.copy()
    accumulate_ref(Ar, s - 20 + 8 - 3, g, -3, opt, m_t, [1])
    nr = apply_accumulated_ref(wr, Ar, Vr, opt, [1])
    for ffi, lib in (dsplib, clib):
        A2, V2, w2 = A.copy(), V.copy(), w.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": 20, "mu_m": mu[0], "mu_k": mu[1], "ib_m": 1, "ib_k": 0,
                                 "batch_size": 1, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 1), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        if w.dtype == np.int16:
            lib.tt_sgd_accumulate_apply_s16(u, c_i16(ffi, w2), c_i32(ffi, A2), c_i32(ffi, V2), w.size, s - 20 + 8 - 3,
                                            c_i32(ffi, g), -3)
        else:
            cp = np.full(w.size, 7, np.int16)
            lib.tt_sgd_accumulate_apply_s32(u, c_i32(ffi, w2), c_i16(ffi, cp) if with_copy else ffi.NULL,
                                            c_i32(ffi, A2), c_i32(ffi, V2), w.size, s - 20 + 8 - 3, c_i32(ffi, g), -3)
            if with_copy:
                want = np.clip(((wr.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767).astype(np.int16)
                assert np.array_equal(cp, want)
        assert np.array_equal(A2, Ar) and np.array_equal(V2, Vr)
        assert np.array_equal(w2, wr), f"first difference at {np.argwhere(w2 != wr)[0]}"
        assert st_c.saturated == nr and prng[0] == 1


@st.composite
def dense_acc_case(draw):
    """A Dense layer's momentum step at batch 1 (tt_sgd_dense_accumulate_apply): drawn K (chunks of
    64 and the DSP loop's tails), N, inputs and errors over the whole int8 range, accumulators and
    velocities up to the int32 limits, int16 weights at the guard and int16 edges or int32 masters,
    m_t, shifts past both ends of the DSP path's range, momentum multipliers on both sides of
    2^(mu_k - 1), frozen weights or biases, rows of zero error among the others."""
    K = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 67, 130]))
    N = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    e = draw_array(draw, (N,), np.int8, -128, 127)
    if draw(st.booleans()):  # rows of zero error (ReLU's) beside the others: the loop that reads no input
        e = np.where(rng.random(N) < 0.5, 0, e).astype(np.int8)
    ab, vb = (draw(st.sampled_from([0, 14, 26, 31])) for _ in range(2))
    big = lambda b, shape: rng.integers(-(2**b), 2**b, shape, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)  # noqa: E731
    A, V, bA, bV = big(ab, (N, K)), big(vb, (N, K)), big(ab, N), big(vb, N)
    if draw(st.booleans()):
        w = big(31, (N, K))
    else:
        w = np.where(rng.random((N, K)) < 0.8, rng.integers(-16384, 16384, (N, K)), rng.choice(W_EDGES, (N, K))).astype(np.int16)
    b = big(draw(st.sampled_from([10, 31])), N)
    m_t = draw(st.sampled_from([0, 1, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-3, 33) | st.integers(-34, -4))  # ew + k - (ee + ex) - G (left shifts: int32 masters)
    sb = draw(st.integers(-16, 33))
    mk = draw(st.integers(1, 31))
    mu = draw(st.integers(1, 2**mk - 1) | st.sampled_from([2 ** (mk - 1), 2 ** (mk - 1) - 1]))
    learn = draw(st.sampled_from([(1, 1), (1, 1), (1, 0), (0, 1)]))
    return x, e, A, V, bA, bV, w, b, m_t, s, sb, (mu, mk), learn


@settings(max_examples=300, deadline=None)
@given(dense_acc_case())
def test_dense_accumulate_apply_equals_reference(clib, dsplib, case):
    """tt_sgd_dense_accumulate_apply_s16/_s32 (no gradient buffer; the DSP build's SMMULR step on
    widened inputs, the portable build's chunks) == the reference accumulate_ref +
    apply_accumulated_ref on g = e x^T and e: weights, int16 copy of a master, accumulators,
    velocities, biases, saturations; frozen tensors untouched."""
    from tinytrain.graph.optim import IntSGD, accumulate_ref, apply_accumulated_ref

    x, e, A, V, bA, bV, w, b, m_t, s, sb, mu, learn = case
    N, K = w.shape
    k, ee, ex = 20, -7, -6
    ew, eb = s - k + ee + ex + 8, sb - k + ee + 8
    opt = IntSGD(m=m_t, k=k, mu_m=mu[0], mu_k=mu[1], wd_m=0, wd_k=0, ib_m=1, ib_k=0, batch_size=1,
                 schedule=0, gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32),
                 sr=False, master=False)
    Ar, Vr, wr, bAr, bVr, br, nr = A.copy(), V.copy(), w.copy(), bA.copy(), bV.copy(), b.copy(), 0
    if learn[0]:
        accumulate_ref(Ar, ew, np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32), ee + ex, opt, m_t, [1])
        nr += apply_accumulated_ref(wr, Ar, Vr, opt, [1])
    if learn[1]:
        accumulate_ref(bAr, eb, e.astype(np.int32), ee, opt, m_t, [1])
        nr += apply_accumulated_ref(br, bAr, bVr, opt, [1])
    for ffi, lib in (dsplib, clib):
        A2, V2, w2, bA2, bV2, b2 = A.copy(), V.copy(), w.copy(), bA.copy(), bV.copy(), b.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "mu_m": mu[0], "mu_k": mu[1], "ib_m": 1, "ib_k": 0,
                                 "batch_size": 1, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 1), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        f = dict(K=K, N=N, w=(c_i16 if w.dtype == np.int16 else c_i32)(ffi, w2) if learn[0] else ffi.NULL, ew=ew,
                 wa=c_i32(ffi, A2), wv=c_i32(ffi, V2), b=c_i32(ffi, b2) if learn[1] else ffi.NULL, eb=eb,
                 ba=c_i32(ffi, bA2), bv=c_i32(ffi, bV2))
        cp = np.full((N, K), 7, np.int16)
        if w.dtype == np.int16:
            lib.tt_sgd_dense_accumulate_apply_s16(u, ffi.new("tt_sgd_dense_acc_s16_params *", f), c_i8(ffi, e), ee,
                                                  c_i8(ffi, x), ex)
        else:
            f["copy"] = c_i16(ffi, cp)
            lib.tt_sgd_dense_accumulate_apply_s32(u, ffi.new("tt_sgd_dense_acc_s32_params *", f), c_i8(ffi, e), ee,
                                                  c_i8(ffi, x), ex)
            if learn[0]:
                assert np.array_equal(cp, np.clip(((wr.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767).astype(np.int16))
        assert np.array_equal(w2, wr), f"first difference at {np.argwhere(w2 != wr)[0]}"
        assert np.array_equal(A2, Ar) and np.array_equal(V2, Vr)
        assert np.array_equal(b2, br) and np.array_equal(bA2, bAr) and np.array_equal(bV2, bVr)
        assert st_c.saturated == nr and prng[0] == 1


@st.composite
def master_case(draw):
    """Plain SGD on int32 master weights of a Dense layer (tt_sgd_dense_direct_s32): drawn K (chunks
    of 64, blocks of four and their tails), N, inputs and errors over the int8 range with zero
    rows, masters anywhere in int32 or next to its limits (saturating steps, copies rounding to
    +-32768), m_t, shifts past both ends of the DSP path's [1, 31], with or without the int16 copy."""
    K = draw(st.sampled_from([1, 2, 3, 4, 5, 7, 8, 9, 63, 64, 65, 67, 130]))
    N = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    e = draw_array(draw, (N,), np.int8, -128, 127)
    e[rng.random(N) < 0.2] = 0
    edge = np.array([-(2**31), -(2**31) + 1, -(2**31) + 32767, -(2**31) + 32768, 2**31 - 32769, 2**31 - 32768,
                     2**31 - 2, 2**31 - 1, 0, -1, 32767, -32768], np.int64)
    w = np.where(rng.random((N, K)) < 0.5, rng.integers(-(2**31), 2**31, (N, K)), rng.choice(edge, (N, K)))
    m_t = draw(st.sampled_from([0, 1, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-2, 33))
    return x, e, w.astype(np.int32), m_t, s, draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(master_case())
def test_dense_direct_s32_equals_reference(clib, dsplib, case):
    """tt_sgd_dense_direct_s32 (the DSP build's SMMULR/QSUB/PKHTB rows under the Q flag, the
    portable rows) == update_direct_ref on the int32 weights and tt_sgd_refresh_copy's rule for the
    copy: weights, copy, saturations."""
    x, e, w, m_t, s, with_copy = case
    N, K = w.shape
    k, ee, ex = 20, -7, -6
    ew = s - k + ee + ex
    opt = _opt(m_t, k)
    wr = w.copy()
    nr = update_direct_ref(wr, ew, np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32), ee + ex, opt, m_t, [1])
    want_copy = np.clip(((wr.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767).astype(np.int16)
    for ffi, lib in (dsplib, clib):
        w2, cp = w.copy(), np.full((N, K), 7, np.int16)
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 1), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        p = ffi.new("tt_sgd_dense_s32_params *", dict(K=K, N=N, w=c_i32(ffi, w2), ew=ew, b=ffi.NULL, eb=0,
                                                       copy=c_i16(ffi, cp) if with_copy else ffi.NULL))
        lib.tt_sgd_dense_direct_s32(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
        assert np.array_equal(w2, wr), f"first difference at {np.argwhere(w2 != wr)[0]}"
        assert st_c.saturated == nr
        if with_copy:
            assert np.array_equal(cp, want_copy), f"copy: first difference at {np.argwhere(cp != want_copy)[0]}"


@st.composite
def dense_options_case(draw):
    """A Dense direct-mode update with weight decay and/or stochastic rounding on int16 weights:
    drawn K (chunks of 64 and tails), N, inputs and errors with zero rows, weights at the int16
    edges, m_t, shifts past both ends of [1, 31], decay multipliers and shifts on both sides of
    the DSP path's wd_k >= 16 (and past 31, where the decay rounds to 0)."""
    K = draw(st.sampled_from([1, 2, 3, 5, 8, 9, 63, 64, 65, 130]))
    N = draw(st.integers(1, 6))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    e = draw_array(draw, (N,), np.int8, -128, 127)
    e[rng.random(N) < 0.2] = 0
    w = np.where(rng.random((N, K)) < 0.6, rng.integers(-32768, 32768, (N, K)), rng.choice(W_EDGES, (N, K))).astype(np.int16)
    m_t = draw(st.sampled_from([0, 1, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-2, 33))
    wd = (draw(st.sampled_from([0, 1, 26844, 32767]) | st.integers(0, 32767)), draw(st.integers(0, 62)))
    return x, e, w, m_t, s, wd, draw(st.integers(0, 1))


@settings(max_examples=300, deadline=None)
@given(dense_options_case())
def test_dense_direct_s16_options_equal_reference(clib, dsplib, case):
    """tt_sgd_dense_direct_s16 with weight decay / stochastic rounding (the DSP build's SMMULR rows,
    the portable rows) == update_direct_ref on g = e x^T: weights, saturations, PRNG state."""
    from tinytrain.graph.optim import IntSGD

    x, e, w, m_t, s, wd, sr = case
    N, K = w.shape
    k, ee, ex = 20, -7, -6
    ew = s - k + ee + ex
    opt = IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=wd[0], wd_k=wd[1], ib_m=1, ib_k=0, batch_size=1, schedule=0,
                 gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32), sr=bool(sr), master=False)
    wr, prng_r = w.copy(), [12345]
    g = np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32)
    nr = update_direct_ref(wr, ew, g, ee + ex, opt, m_t, prng_r)
    for ffi, lib in (dsplib, clib):
        w2 = w.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "sr": sr, "wd_m": wd[0], "wd_k": wd[1], "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 12345), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        p = ffi.new("tt_sgd_dense_s16_params *", dict(K=K, N=N, w=c_i16(ffi, w2), ew=ew, b=ffi.NULL, eb=0))
        lib.tt_sgd_dense_direct_s16(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
        if not (sr or wd[0]):  # plain SGD skips weights with m_t e[n] x[k] = 0 and rows whose steps all
            # round to 0 (an old -32768 stays: see above)
            live = (np.outer(m_t * e.astype(np.int64), x) != 0) & ~_rows_to_0(e, m_t, s)[:, None]
            assert np.array_equal(w2[live], wr[live])
            if 1 <= s <= 31:
                assert np.array_equal(w2[~live], w[~live])
            continue
        assert np.array_equal(w2, wr), f"first difference at {np.argwhere(w2 != wr)[0]}"
        assert st_c.saturated == nr and prng[0] == prng_r[0]


@settings(max_examples=300, deadline=None)
@given(dense_acc_case(), st.integers(0, 1))
def test_dense_accumulate_equals_reference(clib, dsplib, case, sr):
    """tt_sgd_dense_accumulate_s32 (no gradient buffer; the DSP build's QADD(A, SMMULR(X, A_n)), the
    portable build's row chunks, stochastic rounding through tt_sgd_accumulate_s32) ==
    accumulate_ref on g = e x^T then on e: accumulators and PRNG state; frozen tensors untouched."""
    from tinytrain.graph.optim import IntSGD, accumulate_ref

    x, e, A, V, bA, bV, w, b, m_t, s, sb, mu, learn = case
    N, K = w.shape
    k, ee, ex = 20, -7, -6
    ew, eb = s - k + ee + ex + 8, sb - k + ee + 8
    opt = IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=16384, ib_k=16, batch_size=4, schedule=0,
                 gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32), sr=bool(sr), master=False)
    Ar, bAr, prng_r = A.copy(), bA.copy(), [12345]
    if learn[0]:
        accumulate_ref(Ar, ew, np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32), ee + ex, opt, m_t, prng_r)
    if learn[1]:
        accumulate_ref(bAr, eb, e.astype(np.int32), ee, opt, m_t, prng_r)
    for ffi, lib in (dsplib, clib):
        A2, bA2 = A.copy(), bA.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "ib_m": 16384, "ib_k": 16, "batch_size": 4, "sr": sr, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 12345), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        p = ffi.new("tt_sgd_dense_accum_params *", dict(K=K, N=N, wa=c_i32(ffi, A2) if learn[0] else ffi.NULL, ew=ew,
                                                         ba=c_i32(ffi, bA2) if learn[1] else ffi.NULL, eb=eb))
        lib.tt_sgd_dense_accumulate_s32(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
        assert np.array_equal(A2, Ar), f"first difference at {np.argwhere(A2 != Ar)[0]}"
        assert np.array_equal(bA2, bAr) and prng[0] == prng_r[0]


@pytest.mark.parametrize("t", range(0, 33))
@pytest.mark.parametrize("m_t", [1, 300, 9000, 32767])
def test_dense_accumulate_left_shifts_at_every_width(clib, dsplib, t, m_t):
    """The left-shift accumulate of tt_sgd_dense_accumulate_s32 (an int32 master's: s = -t) at every
    t and row width, so each of the DSP build's 2^J-QADD rows (J = 0, 1, 2) and the 64-bit rows
    beyond run: errors over the int8 range, inputs at both ends, accumulators at zero and at both
    int32 limits (where the repeated QADD must stop at the rail as sat32 does) == accumulate_ref."""
    from tinytrain.graph.optim import IntSGD, accumulate_ref

    rng = np.random.default_rng(1000 * t + m_t)
    N, K = 9, 67
    e = np.array([-128, 127, 0, 1, -1, 64, -65, 17, -3], np.int8)
    x = rng.integers(-128, 128, K).astype(np.int8)
    x[:4] = [-128, 127, 0, -1]
    A = rng.choice(np.array([0, 0, 1, -1, 2**31 - 1, -(2**31), 2**30, -(2**30)], np.int64), (N, K)).astype(np.int32)
    k, ee, ex = 20, -7, -6
    ew = -t - k + ee + ex + 8
    opt = IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=16384, ib_k=16, batch_size=4, schedule=0,
                 gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32), sr=False, master=False)
    Ar = A.copy()
    accumulate_ref(Ar, ew, np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32), ee + ex, opt, m_t, [1])
    for ffi, lib in (dsplib, clib):
        A2 = A.copy()
        cos = ffi.new("int32_t[65]")
        o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "ib_m": 16384, "ib_k": 16, "batch_size": 4, "cosine": cos})
        prng, st_c = ffi.new("uint32_t *", 1), ffi.new("tt_stats *")
        u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
        p = ffi.new("tt_sgd_dense_accum_params *", dict(K=K, N=N, wa=c_i32(ffi, A2), ew=ew, ba=ffi.NULL, eb=0))
        lib.tt_sgd_dense_accumulate_s32(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
        assert np.array_equal(A2, Ar), f"first difference at {np.argwhere(A2 != Ar)[0]}"


@st.composite
def apply_s32_copy_case(draw):
    """The end-of-batch apply of an int32 master with its int16 copy (tt_sgd_apply_accumulated_s32_copy):
    drawn n (odd sizes), accumulators and velocities up to the int32 limits, masters anywhere in int32
    or at its limits, momentum on or off (multipliers on both sides of 2^(mu_k - 1)), decay multipliers
    and shifts on both sides of the 32-bit path's wd_k - G in [1, 32] with wd_m 2^(32 - s) < 2^31,
    stochastic rounding on or off, batch 1 or 4."""
    n = draw(st.sampled_from([1, 2, 3, 7, 64, 131]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    big = lambda b: rng.integers(-(2**b), 2**b, n, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)  # noqa: E731
    A, V = big(draw(st.sampled_from([0, 14, 26, 31]))), big(draw(st.sampled_from([0, 14, 26, 31])))
    edge = np.array([-(2**31), -(2**31) + 1, -(2**31) + 200, 2**31 - 200, 2**31 - 1, 0, -1, 32767, -32768], np.int64)
    w = np.where(rng.random(n) < 0.5, rng.integers(-(2**31), 2**31, n), rng.choice(edge, n)).astype(np.int32)
    mk = draw(st.integers(1, 31))
    mu = draw(st.just(0) | st.integers(1, 2**mk - 1) | st.sampled_from([2 ** (mk - 1), 2 ** (mk - 1) - 1]))
    wk = draw(st.integers(0, 45))
    wm = draw(st.sampled_from([0, 1, 26844, 32767]) | st.integers(0, 32767))
    return A, V, w, (mu, mk), (wm, wk), draw(st.integers(0, 1)), draw(st.sampled_from([1, 1, 1, 4]))


@settings(max_examples=400, deadline=None)
@given(apply_s32_copy_case())
def test_apply_accumulated_s32_copy_equals_reference(clib, dsplib, case):
    """tt_sgd_apply_accumulated_s32_copy (the 32-bit SMMULR decay path with momentum and stochastic
    rounding, fused with the copy's refresh; the generic paths otherwise) on the DSP and portable
    builds == apply_accumulated_ref then tt_sgd_refresh_copy's rule: masters, copy, accumulators,
    velocities, saturations, PRNG state; and == tt_sgd_apply_accumulated_s32 + tt_sgd_refresh_copy."""
    from tinytrain.graph.optim import IntSGD, apply_accumulated_ref

    A, V, w, mu, wd, sr, batch = case
    ib = (16384, 16) if batch > 1 else (0, 0)
    opt = IntSGD(m=983, k=20, mu_m=mu[0], mu_k=mu[1], wd_m=wd[0], wd_k=wd[1], ib_m=ib[0], ib_k=ib[1],
                 batch_size=batch, schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                 cosine=np.zeros(65, np.int32), sr=bool(sr), master=True)
    Ar, Vr, wr, prng_r = A.copy(), V.copy(), w.copy(), [987654321]
    nr = apply_accumulated_ref(wr, Ar, Vr if mu[0] else None, opt, prng_r)
    want_copy = np.clip(((wr.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767).astype(np.int16)
    for ffi, lib in (dsplib, clib):
        for fused in (True, False):
            A2, V2, w2, cp = A.copy(), V.copy(), w.copy(), np.full(w.size, 7, np.int16)
            cos = ffi.new("int32_t[65]")
            o = ffi.new("tt_sgd *", {"m": 983, "k": 20, "mu_m": mu[0], "mu_k": mu[1], "wd_m": wd[0], "wd_k": wd[1],
                                     "ib_m": ib[0], "ib_k": ib[1], "batch_size": batch, "sr": sr, "cosine": cos})
            prng, st_c = ffi.new("uint32_t *", 987654321), ffi.new("tt_stats *")
            u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": 983, "prng": prng, "stats": st_c})
            Vp = c_i32(ffi, V2) if mu[0] else ffi.NULL
            if fused:
                lib.tt_sgd_apply_accumulated_s32_copy(u, c_i32(ffi, w2), c_i16(ffi, cp), c_i32(ffi, A2), Vp, w.size)
            else:
                lib.tt_sgd_apply_accumulated_s32(u, c_i32(ffi, w2), c_i32(ffi, A2), Vp, w.size)
                lib.tt_sgd_refresh_copy(c_i32(ffi, w2), c_i16(ffi, cp), w.size)
            assert np.array_equal(w2, wr), f"first difference at {np.argwhere(w2 != wr)[0]}"
            assert np.array_equal(cp, want_copy) and np.array_equal(A2, Ar)
            assert st_c.saturated == nr and prng[0] == prng_r[0]
            if mu[0]:
                assert np.array_equal(V2, Vr)
