"""The batch-norm kernels as the Cortex-M4 runs them (the inline-asm loops of the train
backward, SMMULR/SMMLAR/SMMLA, the two-a-turn loops and their tails), on hypothesis-drawn cases
built into one image per example (tests/c/bn_kernel_main.c) and run under QEMU mps2-an386,
against the numpy reference: outputs, exponents, saturation counts, saved constants, running
statistics and gradients. test_ops_dsp.py checks the same cases on the host (portable and DSP
builds with emulated intrinsics, where the asm loops are their C twins)."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from .qemu_image import MARKS, c_array, run_m4
from .test_ops_batchnorm import ref_run
from .test_ops_dsp import bn_bwd_case, bn_dsp_case

pytestmark = MARKS


def _header(cases):
    out = ["typedef struct { const int8_t *x, *e; const int16_t *gamma; const int32_t *beta, *rm, *rv;\n"
           "  int32_t P, C, ex, ee, e_g, e_b, e_rm, e_rv, eps_m, eps_k, mom_k; } bn_case;\n"]
    rows = []
    for i, k in enumerate(cases):
        C = k["x"].shape[-1]
        P = k["x"].size // C
        out += [c_array(f"x{i}", k["x"], "int8_t"), c_array(f"e{i}", k["e"], "int8_t"), c_array(f"g{i}", k["gamma"], "int16_t"),
                c_array(f"b{i}", k["beta"], "int32_t"), c_array(f"rm{i}", k["rmean"], "int32_t"),
                c_array(f"rv{i}", k["rvar"], "int32_t")]
        c = k["cfg"]
        rows.append(f"{{x{i}, e{i}, g{i}, b{i}, rm{i}, rv{i}, {P}, {C}, {k['ex']}, {k['ee']}, {k['e_g']}, {k['e_b']}, "
                    f"{k['e_rm']}, {k['e_rv']}, {c['eps_m']}, {c['eps_k']}, {c['mom_k']}}}")
    n = max(k["x"].size for k in cases)
    cmax = max(k["x"].shape[-1] for k in cases)
    out.append(f"#define BN_NCASES {len(cases)}\n#define BN_MAX_N {n}\n#define BN_MAX_C {cmax}\n"
               f"#define BN_MAX_SCRATCH {max(n, 3 * cmax)}\n")
    out.append("static const bn_case bn_cases[BN_NCASES] = {\n  " + ",\n  ".join(rows) + "\n};\n")
    return "".join(out)


def _run_m4(cases, tmp):
    return run_m4("bn_kernel_main.c", ["tt_batchnorm.c", "tt_fixedpoint.c"], "bn_cases.h", _header(cases), tmp)


def _expected(k):
    ref = ref_run(k, True)
    v = [ref["ey"], ref["nsat"], ref["edx"], ref["nsat_b"]]
    for name in ("y", "dx"):
        v += ref[name].reshape(-1).tolist()
    v += ref["rm"].tolist() + ref["rv"].tolist() + ref["saved"].reshape(-1).tolist()
    return v + ref["gg"][0].tolist() + ref["gb"][0].tolist()


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow, HealthCheck.data_too_large])
@given(cases=st.lists(st.one_of(bn_bwd_case(), bn_dsp_case().filter(lambda k: k["x"].shape[0] >= 2)),
                      min_size=8, max_size=12))
def test_batchnorm_kernels_bit_exact_on_m4(tmp_path_factory, cases):
    """Train forward, backward and gradients of drawn cases (P 2..300, odd and even, channel
    counts off the four-lane words, tiny variance, zero and mirrored errors, extreme gamma) on
    mps2_an386 == the reference, value for value."""
    got = _run_m4(cases, tmp_path_factory.mktemp("bn"))
    assert len(got) == len(cases)
    for i, (k, g) in enumerate(zip(cases, got)):
        want = _expected(k)
        assert len(g) == len(want), (i, len(g), len(want))
        if g != want:
            j = next(j for j in range(len(want)) if g[j] != want[j])
            raise AssertionError(f"case {i} (P, C = {k['x'].shape}): value {j} differs: {g[j]} on M4, {want[j]} reference")
