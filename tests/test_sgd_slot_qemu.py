"""The end-of-batch apply of int8 and int16 weights with a narrow velocity slot (policy "momentum":
"int8" | "int16", tt_sgd.c's sgd_apply_v8_fast and sgd_apply_v16_fast at batch 1 without decay, the
int64 loop otherwise) as the Cortex-M4 runs it, in both builds: the DSP paths (SMMULR, QADD, SSAT)
and, with -DTT_HAVE_DSP=0 on the same board, their portable twins that the M0 and M3 run. Cases are
hypothesis-drawn (odd sizes; accumulators, velocities and weights at their limits; mu_k from 1 to 31
and mu_m up to 2^15 - 1, above 1 too; stochastic rounding on and off; a few at batch 2 or with decay,
the generic loop), built into one image per example (tests/c/sgd_slot_main.c) and run under QEMU
mps2-an386 against apply_accumulated_ref: weights, accumulators, velocities, saturation count and PRNG
state."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .qemu_image import MARKS, c_array, run_m4

pytestmark = MARKS

PRNG0 = 987654321
BUILDS = {"dsp": (), "portable": ("-DTT_HAVE_DSP=0",)}


def _header(cases):
    out = ["typedef struct { const int32_t *w, *A, *V; int32_t n, w8, v8, mu_m, mu_k, wd_m, wd_k, ib_m, ib_k, batch, sr; }"
           " slot_case;\n"]
    rows = []
    for i, c in enumerate(cases):
        ib = (16384, 15) if c["batch"] > 1 else (0, 0)
        out += [c_array(f"cw{i}", c["w"], "int32_t"), c_array(f"cA{i}", c["A"], "int32_t"), c_array(f"cV{i}", c["V"], "int32_t")]
        rows.append(f"{{cw{i}, cA{i}, cV{i}, {c['w'].size}, {int(c['w'].dtype == np.int8)}, {int(c['V'].dtype == np.int8)}, "
                    f"{c['mu'][0]}, {c['mu'][1]}, {c['wd'][0]}, {c['wd'][1]}, {ib[0]}, {ib[1]}, {c['batch']}, {c['sr']}}}")
    out.append(f"#define SLOT_NCASES {len(cases)}\n#define SLOT_MAX_N {max(c['w'].size for c in cases)}\n")
    out.append("static const slot_case slot_cases[SLOT_NCASES] = {\n  " + ",\n  ".join(rows) + "\n};\n")
    return "".join(out)


def _expected(c):
    from tinytrain.graph.optim import IntSGD, apply_accumulated_ref

    ib = (16384, 15) if c["batch"] > 1 else (0, 0)
    opt = IntSGD(m=983, k=20, mu_m=c["mu"][0], mu_k=c["mu"][1], wd_m=c["wd"][0], wd_k=c["wd"][1], ib_m=ib[0],
                 ib_k=ib[1], batch_size=c["batch"], schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                 cosine=np.zeros(65, np.int32), sr=bool(c["sr"]), master=False)
    A, V, w, prng = c["A"].copy(), c["V"].copy(), c["w"].copy(), [PRNG0]
    nsat = apply_accumulated_ref(w, A, V, opt, prng)
    prng_i32 = prng[0] - 2**32 if prng[0] >= 2**31 else prng[0]
    return [nsat, prng_i32, *w.tolist(), *A.tolist(), *V.tolist()]


def _ints(draw, rng, n, dtype, edges, bits):
    """n integers of dtype: uniform below 2^bits (bits drawn) with a share of the edges."""
    info = np.iinfo(dtype)
    b = draw(st.sampled_from(bits))
    v = rng.integers(max(info.min, -(2**b)), min(info.max, 2**b) + 1, n)
    e = np.array([x for x in edges if info.min <= x <= info.max], np.int64)
    share = draw(st.sampled_from([0.0, 0.1, 0.5]))
    return np.where(rng.random(n) < share, rng.choice(e, n), v).astype(dtype)


@st.composite
def slot_case(draw):
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    n = draw(st.sampled_from([1, 2, 3, 7, 8, 9, 16, 33]) | st.integers(1, 40))
    wt, vt = draw(st.sampled_from([np.int8, np.int16])), draw(st.sampled_from([np.int8, np.int16]))
    lim = 2**31 - 1
    A = _ints(draw, rng, n, np.int32, [lim, -lim - 1, lim - 127, lim - 128, lim - 255, lim - 256, 2**30, -(2**30),
                                        2**30 - 1, -(2**30) - 1, 0, 127, 128, -128, -129, 32767, -32767], [4, 12, 20, 31])
    V = _ints(draw, rng, n, vt, [127, -127, -128, 32767, -32767, -32768, 0, 1, -1], [3, 7, 12, 15])
    w = _ints(draw, rng, n, wt, [127, -127, -128, 32767, -32767, -32768, 32700, -32700, 0], [4, 7, 12, 15])
    mk = draw(st.integers(1, 31))
    mu = draw(st.sampled_from([min(32767, 29491 * 2**mk // 2**15) or 1, 2 ** (mk - 1), min(32767, 2**mk - 1), 32767, 0])
              | st.integers(1, min(32767, 2**mk - 1)))
    kind = draw(st.sampled_from(["fast"] * 6 + ["batch2", "decay"]))
    return dict(w=w, A=A, V=V, mu=(mu, mk), sr=draw(st.sampled_from([0, 1])),
                batch=2 if kind == "batch2" else 1, wd=(26844, 33) if kind == "decay" else (0, 0))


def _check(cases, build, tmp):
    got = run_m4("sgd_slot_main.c", ["tt_sgd.c", "tt_fixedpoint.c"], "slot_cases.h", _header(cases), tmp, BUILDS[build])
    assert len(got) == len(cases)
    for i, (c, g) in enumerate(zip(cases, got)):
        want = _expected(c)
        assert len(g) == len(want), (i, len(g), len(want))
        if g != want:
            j = next(j for j in range(len(want)) if g[j] != want[j])
            raise AssertionError(f"{build} case {i} (n {c['w'].size}, w {c['w'].dtype}, V {c['V'].dtype}, mu {c['mu']}, "
                                 f"sr {c['sr']}, batch {c['batch']}, wd {c['wd']}): value {j} differs: {g[j]} on M4, "
                                 f"{want[j]} reference")


@pytest.mark.parametrize("build", list(BUILDS))
@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases=st.lists(slot_case(), min_size=12, max_size=20))
def test_slot_apply_bit_exact_on_m4(tmp_path_factory, build, cases):
    _check(cases, build, tmp_path_factory.mktemp("slot"))


@pytest.mark.parametrize("build", list(BUILDS))
def test_slot_apply_rails_on_m4(tmp_path, build):
    """Every store at its limits: accumulators at the int32 rails (the QADD saturations), velocities
    and weights at +-max and the minimum (-128, -32768: the slots' floor -127, -32767), mu above 1."""
    lim = 2**31 - 1
    A = np.array([lim, -lim - 1, lim - 127, lim - 255, 2**30, -(2**30) - 1, 0, 1, -1, 12345, -lim, lim - 128], np.int32)
    cases = []
    for wt in (np.int8, np.int16):
        for vt in (np.int8, np.int16):
            iw, iv = np.iinfo(wt), np.iinfo(vt)
            w = np.array([iw.max, iw.min, iw.min + 1, 0, iw.max - 1, 3, -3, iw.max, iw.min, 0, 1, -1], wt)
            V = np.array([iv.max, iv.min, iv.min, iv.max, 0, iv.min + 1, iv.max, iv.min, 5, -5, iv.max, iv.min], vt)
            for sr in (0, 1):
                for mu in ((29491, 15), (32767, 1), (1, 31), (32767, 31)):
                    cases.append(dict(w=w.copy(), A=A.copy(), V=V.copy(), mu=mu, sr=sr, batch=1, wd=(0, 0)))
    _check(cases, build, tmp_path)
