"""The blocks format's fused direct update (tt_sparse_blocks_sgd_direct_s16) at the kernel level.

Its Cortex-M4 path (built for the host with -DTT_HAVE_DSP=1 and tests/c/tt_dsp_emul.h, UBSan)
equals the portable path on drawn shapes (K that 4 divides: the full-block row loop that reads x
in place and updates the biases itself; other K: the widened x and the short blocks), block
masks, weights (any int16, -32768 and +-32767 included, rows near the limits), inputs, errors,
learning-rate multipliers, weight shifts (c = 8 below 23, c = 0 above, outside [1, 31]) and
bias shifts, biases near the int32 limits: packed weights, biases and the saturation count.
Both equal the reference rule (graph/optim.update_direct_ref on the kept weights, the biases)
whenever no weight is -32768 (a state updates never produce: the C keeps a weight whose step is
skipped, the reference clamps it). The QEMU runs of whole models are in test_prune_blocks.py.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.codegen.sparse import block_code
from tinytrain.device import cbuild
from tinytrain.graph.optim import update_direct_ref

from .conftest import HERE, examples, runtime_cdef
from .oputil import c_i8, c_i16, c_i32

W_EDGES = np.array([-32768, -32767, -32766, -16385, -16384, -16383, -1, 0, 1, 16382, 16383, 16384,
                    32766, 32767], np.int64)
B_EDGES = np.array([-(2**31), -(2**31) + 1, -(2**31) + 2**20, -1, 0, 1, 2**31 - 2**20, 2**31 - 2, 2**31 - 1], np.int64)


@pytest.fixture(scope="module")
def libs():
    """{"portable": (ffi, lib), "dsp": (ffi, lib)}: the whole runtime for the host, the second with
    the DSP paths on tt_dsp_emul.h's intrinsics; both with UBSan."""
    srcs = [p for p in cbuild.runtime_sources()
            if p.stem not in ("tt_protocol", "tt_cobs", "tt_crc32", "tt_fedcodec", "tt_state")]
    out = {}
    for name, flags in (("portable", []), ("dsp", ["-DTT_HAVE_DSP=1"])):
        out[name] = cbuild.compile_shared([*srcs, HERE / "c" / "tt_test_shim.c"], runtime_cdef(),
                                          include_dirs=[HERE / "c"], extra_flags=flags, sanitize=True,
                                          name=f"ttrt_blocks_{name}")
    return out


@st.composite
def update_case(draw):
    K = draw(st.sampled_from([4, 8, 12, 32, 64, 1, 3, 5, 7, 37]))
    N = draw(st.integers(1, 12))
    B = -(-K // 4)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    blocks = rng.random((N, B)) < draw(st.sampled_from([0.2, 0.5, 1.0]))
    kept = np.repeat(blocks, 4, axis=1)[:, :K]
    mode = draw(st.sampled_from(["drawn", "edges", "near_limits", "small"]))
    if mode == "drawn":
        w = rng.integers(-32768, 32768, (N, K))
    elif mode == "edges":
        w = rng.choice(W_EDGES, (N, K))
    elif mode == "small":
        w = rng.integers(-16383, 16384, (N, K))
    else:  # trained pruned rows: many weights at or within a step of +-32767, a few -32768
        near = rng.integers(32767 - 2 ** int(rng.integers(0, 15)), 32768, (N, K)) * rng.choice([-1, 1], (N, K))
        w = np.where(rng.random((N, K)) < 0.5, near, rng.integers(-32767, 32768, (N, K)))
        w = np.where(rng.random((N, K)) < 0.02, -32768, w)
    w = np.where(kept, w, 0).astype(np.int16)
    lo = draw(st.sampled_from([-128, 0]))  # inputs of any sign, or >= 0 (pixels, ReLU outputs)
    x = rng.integers(lo, 128, K).astype(np.int8)
    x[rng.random(K) < 0.3] = 0
    e = rng.integers(-128, 128, N).astype(np.int8)
    e[rng.random(N) < draw(st.sampled_from([0.0, 0.5, 0.9]))] = 0
    b = np.where(rng.random(N) < 0.5, rng.choice(B_EDGES, N), rng.integers(-(2**31), 2**31, N)).astype(np.int32)
    m_t = draw(st.sampled_from([0, 1, 2, 255, 4096, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.sampled_from([1, 2, 8, 15, 16, 22, 23, 24, 30, 31, 32, 0, -1]) | st.integers(-2, 33))
    sb = draw(st.sampled_from([1, 2, 12, 22, 23, 31, 32, 0]) | st.integers(-2, 33))
    return kept, w, x, e, b, m_t, s, sb, draw(st.sampled_from([0, 0, 1]))


def _run(lib, ffi, case, k=20):
    """The packed weights, the biases and the saturation count after one call (the packed weights
    at an odd int16 offset when case[-1] is 1: rows not 4-byte aligned, the general loop)."""
    kept, w, x, e, b, m_t, s, sb, odd = case
    N, K = w.shape
    ee, ex = -7, -6
    ew, eb = s - k + ee + ex, sb - k + ee
    code = block_code(kept)
    buf = np.zeros(w[kept].size + 2, np.int16)
    wp, bp = buf[odd:odd + w[kept].size], b.copy()
    wp[:] = w[kept]
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": m_t, "k": k, "batch_size": 1, "cosine": cos})
    prng = ffi.new("uint32_t *", 1)
    stats = ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": stats})
    cw, cb, cc = c_i16(ffi, wp), c_i32(ffi, bp), ffi.new("uint8_t[]", code.tolist())
    work = ffi.new("int32_t[]", max(K, 2))
    p = ffi.new("tt_sparse_rows_sgd_s16_params *", dict(K=K, N=N, code=cc, w=cw, ew=ew, b=cb, eb=eb, work=work))
    lib.tt_sparse_blocks_sgd_direct_s16(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), ex)
    got_w = np.frombuffer(ffi.buffer(cw, 2 * wp.size), np.int16).copy()
    got_b = np.frombuffer(ffi.buffer(cb, 4 * N), np.int32).copy()
    return got_w, got_b, int(stats.saturated), (ew, ee + ex, eb, ee, k)


def _opt(m_t, k):
    from tinytrain.graph.optim import IntSGD

    return IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=0, wd_k=0, ib_m=0, ib_k=0, batch_size=1,
                  schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                  cosine=np.zeros(65, np.int32), sr=False, master=False)


def _check(libs, case):
    wd, bd, nd, exps = _run(*reversed(libs["dsp"]), case)
    wp, bp, np_, _ = _run(*reversed(libs["portable"]), case)
    assert np.array_equal(wd, wp), f"weights: first difference at packed index {np.argwhere(wd != wp)[0]}"
    assert np.array_equal(bd, bp), f"biases: first difference at {np.argwhere(bd != bp)[0]}"
    assert nd == np_
    kept, w, x, e, b, m_t, s, sb, _ = case
    if (w[kept] == -32768).any():
        return
    ew, eg, eb, ee, k = exps
    wr, br = w[kept].astype(np.int16), b.copy()
    g = np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32)[kept]
    n1 = update_direct_ref(wr, ew, g, eg, _opt(m_t, k), m_t, [1])
    n2 = update_direct_ref(br, eb, e.astype(np.int32), ee, _opt(m_t, k), m_t, [1])
    assert np.array_equal(wd, wr), f"weights vs reference: first difference at {np.argwhere(wd != wr)[0]}"
    assert np.array_equal(bd, br) and nd == n1 + n2


@settings(max_examples=examples(400), deadline=None)
@given(update_case())
def test_blocks_direct_update_dsp_equals_portable_and_reference(libs, case):
    _check(libs, case)


@pytest.mark.parametrize("s", [1, 9, 17, 22, 23, 31])
@pytest.mark.parametrize("w0", [-32768, -32767, -32766, -16385, 16384, 32766, 32767])
def test_blocks_direct_update_at_the_int16_limits(libs, s, w0):
    """Rows of kept weights at or next to +-32767 (and -32768), inputs of both signs and at
    -128/127, errors and multipliers from 0 to the largest: steps that saturate, that reach
    +-32767 exactly and that stop one short, rows past amax (the exact rule), on the
    full-block loop (K = 8) and the general one (K = 9)."""
    for K in (8, 9):
        rng = np.random.default_rng(K * 1000 + s * 10 + (w0 & 0xFF))
        x = rng.integers(-128, 128, K).astype(np.int8)
        x[:4] = np.array([-128, 127, 1, -1], np.int8)
        e = np.array([0, 1, -1, 127, -128, 64, -3, 5], np.int8)
        kept = np.ones((e.size, K), bool)
        kept[1::3, 4:8] = False
        w = np.where(kept, w0, 0).astype(np.int16)
        w[:, ::3] = np.where(kept[:, ::3], np.int16(-w0 if w0 != -32768 else 32767), 0)
        b = np.array([0, 2**31 - 1, -(2**31), 2**31 - 2, -(2**31) + 1, 5, -5, 0], np.int32)
        for m_t in (1, 255, 26214, 32767):
            _check(libs, (kept, w, x, e, b, m_t, s, 1, 0))


@pytest.mark.parametrize("s", [9, 16, 22, 23, 31])
@pytest.mark.parametrize("m_t", [1, 3, 255])
def test_blocks_direct_update_rows_whose_steps_round_to_zero(libs, s, m_t):
    """Rows with m_t |e| 128 < 2^(s-1) (every step rounds to 0) beside rows with larger errors
    (ez and ez + 1 both drawn): both builds pass them as rows of error 0 (their biases still
    updated); weights and biases as the portable build, and the reference when no -32768 is left
    in (a state the contract refuses); with one, the C keeps it where the reference would clamp it."""
    for K in (8, 64):
        rng = np.random.default_rng(K * 100 + s + 7 * m_t)
        ez = ((2 ** (s - 1) - 1) >> 7) // m_t
        N = 8
        kept = np.repeat(rng.random((N, K // 4)) < 0.6, 4, axis=1)
        kept[:, :4] = True
        w = rng.integers(-32767, 32768, (N, K))
        w[::2, 0:2] = -32768  # an old -32768 over an input 0 (kept) and over an input not 0 (clamped)
        x = rng.integers(-128, 128, K).astype(np.int8)
        x[0], x[1] = 0, -128
        e = np.array([min(ez, 127), -min(ez, 128), 1, -1, 0, min(ez + 1, 127), 2, -min(ez, 128)], np.int8)
        for case_w in (np.where(kept, w, 0), np.where(kept & (w != -32768), w, 0)):
            b = rng.integers(-(2**31), 2**31, N).astype(np.int32)
            for odd in (0, 1):  # the full-block row loop, and the general one (rows not 4-byte aligned)
                case = (kept, case_w.astype(np.int16), x, e, b, m_t, s, 12, odd)
                _check(libs, case)
                wd = _run(*reversed(libs["dsp"]), case)[0]
                zero = np.abs(e.astype(np.int64)) <= ez
                rows = np.repeat(np.arange(N)[:, None], K, axis=1)[kept]
                assert np.array_equal(wd[zero[rows]], case_w[kept][zero[rows]])  # untouched, -32768 too


@st.composite
def fwd_bwd_case(draw):
    K = draw(st.sampled_from([4, 8, 12, 32, 64, 1, 3, 5, 7, 37]))
    N = draw(st.integers(1, 12))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    kept = np.repeat(rng.random((N, -(-K // 4))) < draw(st.sampled_from([0.2, 0.5, 1.0])), 4, axis=1)[:, :K]
    w = np.where(kept, rng.choice(W_EDGES, (N, K)) if draw(st.booleans()) else rng.integers(-32767, 32768, (N, K)),
                 0).astype(np.int16)
    w[w == -32768] = -32767  # the forward's weights: the symmetric range
    x = rng.integers(-128, 128, K).astype(np.int8)
    e = rng.integers(-128, 128, N).astype(np.int8)
    e[rng.random(N) < draw(st.sampled_from([0.0, 0.5, 0.9]))] = 0
    b = np.where(rng.random(N) < 0.3, rng.choice(B_EDGES, N), rng.integers(-(2**31) + 1, 2**31, N)).astype(np.int32)
    b[b == -(2**31)] = -(2**31) + 1
    ex, ew, ee = (draw(st.integers(-12, 4)) for _ in range(3))
    eb = ex + ew - draw(st.sampled_from([-2, 0, 1, 5, 31, 32, 40]) | st.integers(-3, 33))  # the bias shift d
    return kept, w, x, e, b, ex, ew, eb, ee, draw(st.sampled_from([0, 0, 1]))


def _fwd_bwd(lib, ffi, case, sparse):
    """(exponent, y, exponent, dx, saturations) of the blocks kernels (sparse) or of the dense ones on
    the masked weights."""
    from .oputil import c_ctx

    kept, w, x, e, b, ex, ew, eb, ee, odd = case
    N, K = w.shape
    y, dx = np.zeros(N, np.int8), np.zeros(K, np.int8)
    scratch = np.zeros(N + 2 * K + 4, np.int64)
    ctx, stats = c_ctx(ffi, scratch)
    if sparse:
        buf = np.zeros(w[kept].size + 2, np.int16)
        wp = buf[odd:odd + w[kept].size]
        wp[:] = w[kept]
        cc = ffi.new("uint8_t[]", block_code(kept).tolist())
        p = ffi.new("tt_sparse_rows_params *", dict(K=K, N=N, code=cc, w=c_i16(ffi, wp), ew=ew, b=c_i32(ffi, b), eb=eb))
        ey = lib.tt_sparse_blocks_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y))
        edx = lib.tt_sparse_blocks_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dx))
    else:
        p = ffi.new("tt_dense_params *", dict(K=K, N=N, w=c_i16(ffi, w), ew=ew, b=c_i32(ffi, b), eb=eb))
        ey = lib.tt_dense_fwd_s8(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, y))
        edx = lib.tt_dense_bwd_s8(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dx))
    return ey, y.tolist(), edx, dx.tolist(), int(stats.saturated)


@settings(max_examples=examples(300), deadline=None)
@given(fwd_bwd_case())
def test_blocks_forward_input_error_dsp_equals_portable_and_dense(libs, case):
    """The blocks forward (its full-block row loop with the bias's rounding shift, or the general
    one) and input error (the four-sum scatter, the OR of the sums) of the DSP build equal the
    portable build's, and both the dense kernels' on the masked weights (rows of odd alignment
    and short blocks included), every bias shift case."""
    want = _fwd_bwd(*reversed(libs["portable"]), case, sparse=False)
    assert _fwd_bwd(*reversed(libs["portable"]), case, sparse=True) == want
    assert _fwd_bwd(*reversed(libs["dsp"]), case, sparse=True) == want
