"""The fused Dense update (tt_sgd_dense_direct_s8 / _s16 / _s32, gradient e[n] x[k] formed on the
fly) under every element rule: drawn stochastic rounding, weight decay, learning-rate multipliers
(both sides of the 32-bit fast paths' 2^15) and shifts from left shifts to far past 31 (a trained
model's small errors give s > 31, where the stochastic step floors p by 2^(s - 31) first), on int8, int16 and int32
(with and without the int16 copy) weights and int32 biases. The portable build, the DSP build
(emulated intrinsics, UBSan) and the reference (update_direct_ref on the gradient buffer, then
the copy's refresh) must agree on every weight, the saturation count and the PRNG state."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.fixedpoint import prng_jump, prng_jump_table, prng_next
from tinytrain.graph.optim import SGD, IntSGD, update_direct_ref

from .oputil import c_i8, c_i16, c_i32, draw_array
from .test_ops_dsp import dsplib  # noqa: F401 - the session fixture

LIM = {"int8": 127, "int16": 32767, "int32": 2**31 - 1}
K_SIZES = [1, 2, 3, 5, 17, 32, 63, 64, 65, 130]


@st.composite
def dense_update_case(draw):
    wt = draw(st.sampled_from(["int8", "int16", "int32", "int32+copy"]))
    K, N = draw(st.sampled_from(K_SIZES)), draw(st.integers(1, 9))
    x = draw_array(draw, (K,), np.int8, -128, 127)
    e = draw_array(draw, (N,), np.int8, -128, 127)
    e[draw(st.lists(st.integers(0, N - 1), max_size=N))] = 0  # zero-error rows (their draws are made)
    lim = LIM[wt.split("+")[0]]
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    w = rng.integers(-lim, lim + 1, (N, K), dtype=np.int64)
    if draw(st.booleans()):  # at and next to the symmetric limits
        w = np.where(rng.random((N, K)) < 0.3, rng.choice([-lim, -lim + 1, lim - 1, lim], (N, K)), w)
    dt = {"int8": np.int8, "int16": np.int16}.get(wt, np.int32)
    b = draw_array(draw, (N,), np.int32, -(2**31) + 1, 2**31 - 1)
    sr, wd = draw(st.booleans()), draw(st.sampled_from([0.0, 0.0, 1e-4, 1e-3, 3e-2]))
    m_t = draw(st.sampled_from([0, 1, 255, 26214, 32767, 32768, 40000]) | st.integers(0, 32767))
    s = draw(st.integers(-3, 70))   # weight shift ew + k - (ee + ex)
    sb = draw(st.integers(-3, 70))  # bias shift eb + k - ee
    return wt, x, e, w.astype(dt), b, sr, wd, m_t, s, sb, draw(st.integers(1, 2**32 - 1))


def _opt(case, k=20) -> IntSGD:
    wt, x, e, w, b, sr, wd, m_t, s, sb, seed = case
    base = SGD(lr=0.05, weight_decay=wd, stochastic_rounding=sr).compile()
    return IntSGD(m=m_t, k=k, mu_m=0, mu_k=0, wd_m=base.wd_m, wd_k=base.wd_k, ib_m=1, ib_k=0, batch_size=1,
                  schedule=0, gamma_q15=32768, step_size=1, total_steps=1, cosine=np.zeros(65, np.int32),
                  sr=sr, master=False)


def _exps(case, k=20):
    s, sb = case[8], case[9]
    ee, ex = -7, -6
    return s - k + ee + ex, ee + ex, sb - k + ee, ee


def _c(lib, ffi, case, jump=False):
    """One call of the C update: (weights, biases, copy or None, saturations, PRNG state); with
    `jump` (int8) the table of K PRNG steps the code generator emits for stochastic rounding."""
    wt, x, e, w, b, sr, wd, m_t, s, sb, seed = case
    o_py = _opt(case)
    ew, _, eb, ee = _exps(case)
    N, K = w.shape
    cos = ffi.new("int32_t[65]")
    o = ffi.new("tt_sgd *", {"m": m_t, "k": o_py.k, "wd_m": o_py.wd_m, "wd_k": o_py.wd_k, "ib_m": 1,
                             "batch_size": 1, "sr": int(sr), "cosine": cos})
    prng, st_c = ffi.new("uint32_t *", seed), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": o, "m_t": m_t, "prng": prng, "stats": st_c})
    w, b = w.copy(), b.copy()
    wc, bc, copy = {"int8": c_i8, "int16": c_i16}.get(wt, c_i32)(ffi, w), c_i32(ffi, b), None
    if wt == "int8":
        fields = dict(K=K, N=N, w=wc, ew=ew, b=bc, eb=eb)
        if jump:
            tab = ffi.new("uint32_t[8][16]", prng_jump_table(K).tolist())
            fields["jump"] = tab
        p = ffi.new("tt_sgd_dense_s8_params *", fields)
        lib.tt_sgd_dense_direct_s8(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), -6)
    elif wt == "int16":
        p = ffi.new("tt_sgd_dense_s16_params *", dict(K=K, N=N, w=wc, ew=ew, b=bc, eb=eb))
        lib.tt_sgd_dense_direct_s16(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), -6)
    else:
        copy = np.zeros((N, K), np.int16) if wt == "int32+copy" else None
        cc = c_i16(ffi, copy) if copy is not None else ffi.NULL
        p = ffi.new("tt_sgd_dense_s32_params *", dict(K=K, N=N, w=wc, ew=ew, b=bc, eb=eb, copy=cc))
        lib.tt_sgd_dense_direct_s32(u, p, c_i8(ffi, e), ee, c_i8(ffi, x), -6)
    return w, b, copy, st_c.saturated, prng[0]


@settings(max_examples=400, deadline=None)
@given(dense_update_case())
def test_fused_dense_update_every_rule_portable_dsp_reference(clib, dsplib, case):  # noqa: F811
    wt, x, e, w, b, sr, wd, m_t, s, sb, seed = case
    runs = {"portable": _c(clib[1], clib[0], case), "dsp": _c(dsplib[1], dsplib[0], case)}
    if wt == "int8":  # zero rows' draws at once, as generated code for stochastic rounding does
        runs["portable, PRNG jump"] = _c(clib[1], clib[0], case, jump=True)
        runs["dsp, PRNG jump"] = _c(dsplib[1], dsplib[0], case, jump=True)
    ew, eg, eb, ee = _exps(case)
    opt, prng = _opt(case), [seed]
    wr, br = w.copy(), b.copy()
    g = np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32)
    nsat = update_direct_ref(wr, ew, g, eg, opt, m_t, prng)
    nsat += update_direct_ref(br, eb, e.astype(np.int32), ee, opt, m_t, prng)
    for name, (wc, bc, copy, nc, pc) in runs.items():
        assert np.array_equal(wc, wr), f"{name}: first weight difference at {np.argwhere(wc != wr)[0]}"
        assert np.array_equal(bc, br), f"{name}: first bias difference at {np.argwhere(bc != br)[0]}"
        assert (nc, pc) == (nsat, prng[0]), f"{name}: saturations, PRNG {(nc, pc)} != {(nsat, prng[0])}"
        if copy is not None:
            ref_copy = np.clip((wr.astype(np.int64) + (1 << 15)) >> 16, -32767, 32767)
            assert np.array_equal(copy, ref_copy), f"{name}: copy differs at {np.argwhere(copy != ref_copy)[0]}"


@pytest.mark.parametrize("wt", ["int8", "int16", "int32", "int32+copy"])
@pytest.mark.parametrize("s", [1, 29, 30, 31, 32, 33, 40, 62, 63, 64, 70])
@pytest.mark.parametrize("sr,wd", [(True, 0.0), (True, 1e-3), (False, 1e-3), (False, 0.0)])
def test_fused_dense_update_at_the_shift_edges(clib, dsplib, wt, s, sr, wd):  # noqa: F811
    """Full-range errors and inputs at the largest multipliers the 32-bit paths take (|p| near
    2^29), where the stochastic step by s >= 31 is -1, 0 or +1, and for s > 31 comes from p floored by
    2^(s - 31) first."""
    rng = np.random.default_rng(s * 7 + len(wt))
    K, N = 67, 6
    x = rng.integers(-128, 128, K).astype(np.int8)
    e = np.array([-128, 127, 0, -1, 99, -77], np.int8)
    lim = LIM[wt.split("+")[0]]
    w = rng.integers(-lim, lim + 1, (N, K), dtype=np.int64).astype({"int8": np.int8, "int16": np.int16}.get(wt, np.int32))
    for m_t in (32767, 26214, 32768):
        case = (wt, x, e, w, rng.integers(-2**20, 2**20, N).astype(np.int32), sr, wd, m_t, s, s - 8, 0x9E3779B9)
        test_fused_dense_update_every_rule_portable_dsp_reference.hypothesis.inner_test(clib, dsplib, case)


@settings(max_examples=200, deadline=None)
@given(k=st.integers(0, 300), state=st.integers(1, 2**32 - 1))
def test_prng_jump_is_k_steps(k, state):
    """prng_jump_table(k): the k xorshift32 steps at once, from any non-zero state."""
    want = state
    for _ in range(k):
        want = prng_next(want)
    assert prng_jump(prng_jump_table(k), state) == want


@settings(max_examples=100, deadline=None)
@given(K=st.sampled_from(K_SIZES), N=st.integers(1, 6), seed=st.integers(1, 2**32 - 1), data=st.data())
def test_int8_zero_rows_jump_keep_the_old_minimum_rule(clib, dsplib, K, N, seed, data):  # noqa: F811
    """Stochastic rounding rows of zero error with the PRNG jump: the state K draws on, and every
    old -128 (at any position of a row, off the four-byte words too) clamped to -127 and counted,
    as the reference does."""
    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (N, K)).astype(np.int8)
    w[rng.random((N, K)) < data.draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))] = -128
    e = rng.integers(-127, 128, N).astype(np.int8)
    e[rng.random(N) < 0.7] = 0
    x = rng.integers(-128, 128, K).astype(np.int8)
    b = np.zeros(N, np.int32)
    case = ("int8", x, e, w, b, True, 0.0, 26214, 33, 33, seed)
    ew, eg, eb, ee = _exps(case)
    opt, prng = _opt(case), [seed]
    wr, br = w.copy(), b.copy()
    nsat = update_direct_ref(wr, ew, np.outer(e.astype(np.int32), x.astype(np.int32)).astype(np.int32), eg, opt,
                             26214, prng)
    nsat += update_direct_ref(br, eb, e.astype(np.int32), ee, opt, 26214, prng)
    for lib in (clib, dsplib):
        wc, bc, _, nc, pc = _c(lib[1], lib[0], case, jump=True)
        assert np.array_equal(wc, wr) and np.array_equal(bc, br) and (nc, pc) == (nsat, prng[0])
