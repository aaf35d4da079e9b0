"""The end-of-batch apply of int32 masters with their int16 copy as the Cortex-M4 runs it (the
inline-asm pair loop of tt_sgd.c's sgd_apply_s32_wd_asm under momentum + decay, with and without
stochastic rounding, and the C paths of every other configuration), on hypothesis-drawn cases
(test_ops_dsp.apply_s32_copy_case: odd sizes, accumulators, velocities and masters at the int32
limits, both sides of every fast path's bounds) built into one image per example
(tests/c/sgd_apply_main.c) and run under QEMU mps2-an386, against apply_accumulated_ref and the copy's
rule: masters, copy (also at an odd int16 offset: the loop's unaligned word store; or none, the
apply of a bias), accumulators,
velocities, saturation count, PRNG state. test_ops_dsp.py checks the same cases on the host, where the
asm loop is its C twin."""
from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .qemu_image import MARKS, c_array, run_m4
from .test_ops_dsp import apply_s32_copy_case

pytestmark = MARKS

PRNG0 = 987654321


def _header(cases):
    out = ["typedef struct { const int32_t *w, *A, *V; int32_t n, off, mu_m, mu_k, wd_m, wd_k, ib_m, ib_k, batch, sr; }"
           " sgd_case;\n"]
    rows = []
    for i, (A, V, w, mu, wd, sr, batch, off) in enumerate(cases):
        ib = (16384, 16) if batch > 1 else (0, 0)
        out += [c_array(f"w{i}", w, "int32_t"), c_array(f"A{i}", A, "int32_t"), c_array(f"V{i}", V, "int32_t")]
        rows.append(f"{{w{i}, A{i}, V{i}, {w.size}, {off}, {mu[0]}, {mu[1]}, {wd[0]}, {wd[1]}, {ib[0]}, {ib[1]}, "
                    f"{batch}, {sr}}}")
    out.append(f"#define SGD_NCASES {len(cases)}\n#define SGD_MAX_N {max(c[2].size for c in cases)}\n")
    out.append("static const sgd_case sgd_cases[SGD_NCASES] = {\n  " + ",\n  ".join(rows) + "\n};\n")
    return "".join(out)


def _run_m4(cases, tmp):
    return run_m4("sgd_apply_main.c", ["tt_sgd.c", "tt_fixedpoint.c"], "sgd_cases.h", _header(cases), tmp)


def _expected(case):
    from tinytrain.graph.optim import IntSGD, apply_accumulated_ref

    A, V, w, mu, wd, sr, batch, off = case
    ib = (16384, 16) if batch > 1 else (0, 0)
    opt = IntSGD(m=983, k=20, mu_m=mu[0], mu_k=mu[1], wd_m=wd[0], wd_k=wd[1], ib_m=ib[0], ib_k=ib[1],
                 batch_size=batch, schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                 cosine=np.zeros(65, np.int32), sr=bool(sr), master=True)
    Ar, Vr, wr, prng = A.copy(), V.copy(), w.copy(), [PRNG0]
    nsat = apply_accumulated_ref(wr, Ar, Vr if mu[0] else None, opt, prng)
    copy = np.clip(((wr.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767)
    prng_i32 = prng[0] - 2**32 if prng[0] >= 2**31 else prng[0]
    return [nsat, prng_i32, *wr.tolist(), *(copy.tolist() if off != 2 else []), *Ar.tolist(), *Vr.tolist()]


@st.composite
def asm_case(draw):
    """apply_s32_copy_case, half of the time in the asm loop's configuration (momentum, decay with
    wd_k - G in [1, 32] and wd_m 2^(32 - s) < 2^31, batch 1), and a copy offset of 0 or 1 int16."""
    A, V, w, mu, wd, sr, batch = draw(apply_s32_copy_case())
    if draw(st.booleans()):
        mk = draw(st.integers(1, 31))
        mu = (draw(st.integers(1, 2**mk - 1) | st.sampled_from([2 ** (mk - 1), 2 ** (mk - 1) - 1, 2**mk - 1])), mk)
        ws = draw(st.integers(1, 32))
        wm = draw(st.integers(1, max(1, min(32767, (2**31 - 1) >> (32 - ws)))))
        wd, batch = (wm, ws + 8), 1
    return A, V, w, mu, wd, sr, batch, draw(st.integers(0, 2))


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases=st.lists(asm_case(), min_size=12, max_size=20))
def test_apply_s32_copy_bit_exact_on_m4(tmp_path_factory, cases):
    got = _run_m4(cases, tmp_path_factory.mktemp("sgd"))
    assert len(got) == len(cases)
    for i, (k, g) in enumerate(zip(cases, got)):
        want = _expected(k)
        assert len(g) == len(want), (i, len(g), len(want))
        if g != want:
            j = next(j for j in range(len(want)) if g[j] != want[j])
            raise AssertionError(f"case {i} (n {k[2].size}, mu {k[3]}, wd {k[4]}, sr {k[5]}, batch {k[6]}): "
                                 f"value {j} differs: {g[j]} on M4, {want[j]} reference")


def test_apply_s32_copy_rails_on_m4(tmp_path):
    """The asm loop's saturations: masters at and next to the int32 limits under velocities and
    accumulators at the limits (weights, velocities and copies saturating, copies at -32768 made
    -32767, pairs with one and two saturated weights), odd and even sizes, both copy offsets and
    none."""
    lim = 2**31 - 1
    w = np.array([-lim - 1, -lim, lim, lim - 1, -lim - 1, lim, 0, 1, -lim + 40000, lim - 40000, -lim - 1], np.int32)
    A = np.array([lim, lim, -lim - 1, -lim - 1, 0, 0, lim, -lim - 1, 2**30, -(2**30), 12345], np.int32)
    V = np.array([lim, -lim - 1, -lim - 1, lim, lim, -lim - 1, lim, lim, -5, 5, -lim - 1], np.int32)
    cases = []
    for n in (10, 11):
        for sr in (0, 1):
            for off in (0, 1, 2):
                for mu in ((29491, 15), (3, 3)):  # SMMLAR (mu >= 1/2) and SMMULR
                    cases.append((A[:n].copy(), V[:n].copy(), w[:n].copy(), mu, (26844, 33), sr, 1, off))
    got = _run_m4(cases, tmp_path)
    for i, (k, g) in enumerate(zip(cases, got)):
        assert g == _expected(k), f"case {i}"


@st.composite
def kept_case(draw):
    """A Dense layer's weight accumulate and apply at batch 1 (tt_sgd_dense_accumulate_s32 with a keep,
    then tt_sgd_dense_apply_kept_s32): K odd and even (above the one-pass path's 64 too), errors and
    inputs with zeros and -128, m_t at its limits, the accumulate's shift s = ew + k - (ee + ex) - G
    from -34 to 2 (waits for s in [-32, 0]: the one pass's D = 1..3 rows and the rows beyond it, t = 0),
    masters at the int32 limits, velocities up to them, momentum and decay in and out of the one pass's
    bounds, stochastic rounding on or off; one case in six with accumulators that hold sums (keep state
    0: nothing waits)."""
    K, N = draw(st.sampled_from([2, 3, 13, 17, 64, 65])), draw(st.sampled_from([1, 2, 5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    i8 = lambda n, p0: np.where(rng.random(n) < p0, 0, rng.choice(  # noqa: E731
        [rng.integers(-128, 128), -128, 127, 1, -1], n, p=[0.6, 0.1, 0.1, 0.1, 0.1])).astype(np.int8)
    xb = draw(st.sampled_from([127, 15, 3]))
    e, x = i8(N, draw(st.sampled_from([0.0, 0.3]))), (i8(K, 0.3).astype(np.int32) * xb // 127).astype(np.int8)
    if draw(st.booleans()):
        x[rng.integers(0, K)] = -128
    m_t = draw(st.sampled_from([0, 1, 26214, 32767]) | st.integers(0, 32767))
    s = draw(st.integers(-34, 2))
    ee, ex, k = draw(st.integers(-14, -2)), draw(st.integers(-8, -4)), draw(st.integers(8, 22))
    ew = s - k + ee + ex + 8
    edge = np.array([-(2**31), -(2**31) + 1, 2**31 - 200, 2**31 - 1, 0, -1, 32767, -32768], np.int64)
    n = K * N
    w = np.where(rng.random(n) < 0.7, rng.integers(-(2**31), 2**31, n), rng.choice(edge, n)).astype(np.int32)
    vb = draw(st.sampled_from([0, 20, 31]))
    V = rng.integers(-(2**vb), 2**vb, n, endpoint=True).clip(-(2**31), 2**31 - 1).astype(np.int32)
    mk = draw(st.integers(1, 31))
    mu = draw(st.sampled_from([29491 * 2**mk // 2**15 or 1, 2 ** (mk - 1), 2 ** (mk - 1) - 1, 0]) | st.integers(1, 2**mk - 1))
    wm, wk = draw(st.sampled_from([(26844, 29), (32767, 9), (1, 40), (0, 29)]) | st.tuples(st.integers(0, 32767), st.integers(0, 45)))
    A = rng.integers(-(2**30), 2**30, n).astype(np.int32) if draw(st.integers(0, 5)) == 0 else None
    return dict(K=K, N=N, e=e, x=x, m_t=m_t, k=k, ew=ew, ee=ee, ex=ex, w=w, V=V, mu=(mu, mk), wd=(wm, wk),
                sr=draw(st.sampled_from([1, 1, 0])), A=A)


def _run_kept_m4(cases, tmp):
    out = ["typedef struct { const int8_t *e, *x; const int32_t *w, *V, *A; int32_t K, N, m_t, k, ew, ee, ex, mu_m, mu_k, "
           "wd_m, wd_k, sr; } kept_case;\n"]
    rows = []
    for i, c in enumerate(cases):
        out += [c_array(f"e{i}", c["e"], "int8_t"), c_array(f"x{i}", c["x"], "int8_t"), c_array(f"w{i}", c["w"], "int32_t"),
                c_array(f"V{i}", c["V"], "int32_t")] + ([c_array(f"A{i}", c["A"], "int32_t")] if c["A"] is not None else [])
        rows.append(f"{{e{i}, x{i}, w{i}, V{i}, {f'A{i}' if c['A'] is not None else 0}, {c['K']}, {c['N']}, {c['m_t']}, {c['k']}, {c['ew']}, {c['ee']}, {c['ex']}, "
                    f"{c['mu'][0]}, {c['mu'][1]}, {c['wd'][0]}, {c['wd'][1]}, {c['sr']}}}")
    out.append(f"#define KEPT_NCASES {len(cases)}\n#define KEPT_MAX_N {max(c['K'] * c['N'] for c in cases)}\n"
               f"#define KEPT_MAX_NN {max(c['N'] for c in cases)}\n")
    out.append("static const kept_case kept_cases[KEPT_NCASES] = {\n  " + ",\n  ".join(rows) + "\n};\n")
    return run_m4("sgd_kept_main.c", ["tt_sgd.c", "tt_fixedpoint.c"], "kept_cases.h", "".join(out), tmp)


def _kept_expected(c):
    from tinytrain.graph.optim import GUARD_BITS, IntSGD, accumulate_ref, apply_accumulated_ref

    opt = IntSGD(m=c["m_t"], k=c["k"], mu_m=c["mu"][0], mu_k=c["mu"][1], wd_m=c["wd"][0], wd_k=c["wd"][1], ib_m=0,
                 ib_k=0, batch_size=1, schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                 cosine=np.zeros(65, np.int32), sr=bool(c["sr"]), master=True)
    K, N = c["K"], c["N"]
    A = np.zeros(K * N, np.int32) if c["A"] is None else c["A"].copy()
    V, w, prng = c["V"].copy(), c["w"].copy(), [PRNG0]
    g = (c["e"].astype(np.int32)[:, None] * c["x"].astype(np.int32)[None, :]).reshape(-1)
    accumulate_ref(A, c["ew"], g, c["ee"] + c["ex"], opt, c["m_t"], prng)
    nsat = apply_accumulated_ref(w, A, V if c["mu"][0] else None, opt, prng)
    copy = np.clip(((w.astype(np.int64) >> 15) + 1) >> 1, -32767, 32767)
    s = c["ew"] + c["k"] - (c["ee"] + c["ex"]) - GUARD_BITS
    waits = 2 if -32 <= s <= 0 and c["A"] is None else 0 if c["A"] is not None else 1
    prng_i32 = prng[0] - 2**32 if prng[0] >= 2**31 else prng[0]
    return [waits, nsat, prng_i32, *w.tolist(), *copy.tolist(), *A.tolist(), *V.tolist(), 1]


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases=st.lists(kept_case(), min_size=16, max_size=24))
def test_dense_apply_kept_bit_exact_on_m4(tmp_path_factory, cases):
    """tt_sgd_dense_accumulate_s32 with a keep then tt_sgd_dense_apply_kept_s32 on the M4 (the one-pass
    asm rows of sgd_apply_kept_fast, the rows it hands to sgd_apply_s32_wd_asm, odd rows' last
    elements, and the portable accumulate + apply otherwise) == accumulate_ref then
    apply_accumulated_ref: whether the accumulate waited, masters, copy, accumulators (0 after),
    velocities, saturations, PRNG state."""
    got = _run_kept_m4(cases, tmp_path_factory.mktemp("kept"))
    assert len(got) == len(cases)
    for i, (c, g) in enumerate(zip(cases, got)):
        want = _kept_expected(c)
        assert len(g) == len(want), (i, len(g), len(want))
        if g != want:
            j = next(j for j in range(len(want)) if g[j] != want[j])
            raise AssertionError(f"case {i} (K {c['K']}, N {c['N']}, m_t {c['m_t']}, s {c['ew'] + c['k'] - c['ee'] - c['ex'] - 8}, "
                                 f"mu {c['mu']}, wd {c['wd']}, sr {c['sr']}): value {j} differs: {g[j]} on M4, {want[j]} reference")
