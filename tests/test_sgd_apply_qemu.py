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
