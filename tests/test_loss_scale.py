"""The global and static loss scale (graph/loss_scale.py): its spelling, its quantization against
exact integers, GradScaler's skip / backoff / growth, the scaler state in the hash and the .tt
file, and reference = numba = C every step on drawn graphs x scale settings x optimizer options
(plus the Cortex-M4 under QEMU)."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain import data
from tinytrain.graph import io as tio
from tinytrain.graph.layers import Dense, ModelError, ReLU
from tinytrain.graph.loss_scale import LossScale, quantize, step
from tinytrain.graph.model import Sequential
from tinytrain.graph.models import build_model
from tinytrain.graph.precision import Precision, PrecisionError
from tinytrain.kernels.loss import loss_scale as nb_loss_scale, ls_constants
from tinytrain.sim.simulator import Simulator

from .conftest import examples
from .test_boards_qemu import needs_qemu
from .test_exactness import _data, any_graph, three_way
from .test_precision import _build


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


# ------------------------------------------------------------------------------ spelling
def test_object_and_compact_string_are_one_policy():
    a = Precision.parse({"loss_scale": {"mode": "global", "init_scale": 6, "growth_interval": 100}})
    b = Precision.parse({"loss_scale": "global:growth_interval=100,init_scale=6"})
    assert a == b and a.loss_scale == str(a.scaler)
    assert a.scaler == LossScale("global", init_scale=6, growth_interval=100)
    assert Precision.parse({"loss_scale": "global"}).scaler == LossScale("global")
    assert Precision.parse({"loss_scale": {"mode": "dynamic"}}) == Precision()
    assert Precision.parse({"loss_scale": "static:init_scale=5"}).scaler == LossScale("static", init_scale=5)


@pytest.mark.parametrize("spec, match", [
    ({"mode": "grad"}, "mode = 'grad' must be one of dynamic, global, static"),
    ({"mode": "global", "init": 3}, "unknown key.s. init: known keys are mode, init_scale"),
    ("global:init_scale", "is not KEY=INTEGER"),
    ({"mode": "global", "init_scale": 2.5}, "init_scale = 2.5 must be an integer"),
    ({"mode": "global", "init_scale": 20}, "init_scale = 20 must lie in min_scale .. max_scale"),
    ({"mode": "global", "backoff_factor": 0}, "backoff_factor >= 1"),
    ({"mode": "global", "growth_interval": 0}, "growth_interval = 0 must be a positive integer"),
    ("static:growth_interval=5", "takes only init_scale"),
    ({"mode": "dynamic", "init_scale": 3}, "takes no keys"),
    (7, "loss_scale = 7 must be \"dynamic\", \"global\", \"static\""),
])
def test_bad_loss_scales_name_the_key(spec, match):
    with pytest.raises(PrecisionError, match=match):
        Precision.parse({"loss_scale": spec})


def test_a_layer_cannot_override_the_model_scale():
    with pytest.raises(ModelError, match="loss_scale is one scale for the whole model"):
        Sequential.from_config({"input_shape": [4], "layers": [{"type": "dense", "units": 3,
                                                                "precision": {"loss_scale": "global"}}]})


def test_dynamic_models_keep_their_state_and_schema():
    a = Sequential([Dense(3)], input_shape=(4,))
    b = Sequential([Dense(3)], input_shape=(4,), precision={"loss_scale": "dynamic"})
    assert a.schema_hash() == b.schema_hash() and a.state_hash() == b.state_hash()
    assert len(a.state_tensors()) == len(b.state_tensors())
    c = Sequential([Dense(3)], input_shape=(4,), precision={"loss_scale": "global"})
    assert len(c.state_tensors()) == len(a.state_tensors()) + 1 and c.schema_hash() != a.schema_hash()


# --------------------------------------------------------------------------- quantization
def _exact(g, eg, E):
    """sat_s8(round-half-up(g * 2^(eg + E))) with Fractions."""
    import math

    v = Fraction(int(g)) * Fraction(2) ** (eg + E)
    r = math.floor(v + Fraction(1, 2))
    return max(-127, min(127, r)), r != max(-127, min(127, r))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.integers(-2**40, 2**40), st.sampled_from([0, 1, -1, 127, -127, 128, -128, 2**15, -2**15,
                                                                        63, 64, -64, 2**15 - 1])), min_size=1, max_size=12),
       st.integers(-30, 10), st.integers(-24, 24))
def test_quantize_is_exact_rounding_and_saturation(g, eg, E):
    g = np.array(g, np.int64)
    e, ee, nsat = quantize(g, eg, E)
    want = [_exact(v, eg, E) for v in g]
    if -E - eg <= 62:  # beyond, both shift by 62 (everything below 2^61 rounds to 0)
        assert [int(v) for v in e] == [w for w, _ in want] and nsat == sum(s for _, s in want)
    assert ee == -E
    sc = np.array([E, 0, 0], np.int64)
    e2 = np.zeros(g.size, np.int8)
    stats = np.zeros(4, np.int64)
    nb_loss_scale(g, eg, e2, sc, ls_constants(LossScale("static", init_scale=0, min_scale=-24, max_scale=24)), stats)
    assert (e2 == e).all() and stats[0] == nsat


def test_gradscaler_skip_backoff_growth():
    ls = LossScale("global", init_scale=7, growth_factor=2, backoff_factor=3, growth_interval=3, min_scale=2, max_scale=10)
    s = ls.initial_state()
    assert [step(ls, s, 0) for _ in range(2)] == [False, False] and list(s) == [7, 2, 0]
    assert not step(ls, s, 0) and list(s) == [9, 0, 0]          # 3 clean steps: grow by 2
    assert step(ls, s, 1) and list(s) == [6, 0, 1]              # overflow: skip, back off 3, restart
    for _ in range(9):
        step(ls, s, 0)
    assert s[0] == 10                                            # capped at max_scale
    for _ in range(4):
        assert step(ls, s, 5)
    assert list(s) == [2, 0, 5]                                  # floored at min_scale
    st_ = LossScale("static", init_scale=4)
    s = st_.initial_state()
    assert not step(st_, s, 3) and not step(st_, s, 0) and list(s) == [4, 0, 1]  # saturated, applied, counted


def test_a_skipped_step_changes_only_the_scaler(digits):
    """A scale far too large overflows on every sample: nothing but the scaler moves, and the
    step after the backoff trains."""
    m = build_model("digits-mlp", digits, precision={"loss_scale": {"mode": "global", "init_scale": 15,
                                                                   "growth_interval": 1000}})
    before = [t.copy() for t in m.state_tensors()[:-1]]
    m.ref_train_step(digits.x_train[0], digits.y_train[0])
    after = m.state_tensors()
    assert all((a == b).all() for a, b in zip(before, after[:-1]))   # params, PRNG, step counter
    assert list(after[-1]) == [14, 0, 1]
    steps = 0
    while m.scaler[2] == steps:  # back off until a sample goes through
        steps += 1
        m.ref_train_step(digits.x_train[steps], digits.y_train[steps])
    # the first clean step updated the weights
    while int(m.meta[1]) == 0:
        steps += 1
        m.ref_train_step(digits.x_train[steps], digits.y_train[steps])
    assert not all((a == b).all() for a, b in zip(before, m.state_tensors()[:-1]))


# -------------------------------------------------------------- reference = numba = C
SCALES = st.one_of(
    st.builds(lambda e, gi, gf, bf: {"mode": "global", "init_scale": e, "growth_interval": gi, "growth_factor": gf,
                                      "backoff_factor": bf}, st.integers(4, 12), st.integers(1, 6), st.integers(0, 2),
              st.integers(1, 2)),
    st.builds(lambda e: f"static:init_scale={e}", st.integers(4, 10)))


# one drawn graph per run (each compiles a simulator and a C model, ~20 s; TINYTRAIN_EXAMPLES=N
# for N); the W1 test below drives skips, backoff and growth through C on every run
@settings(max_examples=examples(1), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_graph_any_scale_any_optimizer_reference_sim_c_equal(data):
    shape, layers, n_cls = data.draw(any_graph())
    policy = {"loss_scale": data.draw(SCALES)}
    if data.draw(st.booleans()):
        policy["weights"] = "int8"
    ref = _build(data, shape, layers, policy)
    x, y = _data(data.draw(st.integers(4, 8)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y, epochs=1)


def test_w1_skips_agree_on_every_path(digits):
    """W1 where steps do overflow (a scale above the error's range, a short growth interval)
    with momentum at batch 2 and a pruning schedule whose event falls among the skips: the
    scaler (exponent, count, skipped steps) and the masks are in every step's hash."""
    m = build_model("digits-mlp", digits, precision={"loss_scale": "global:init_scale=9,growth_interval=4"},
                    momentum=0.9, batch_size=2,
                    prune={"schedule": "polynomial", "final_sparsity": 0.5, "begin_step": 2, "end_step": 8, "frequency": 2})
    three_way(m, digits.x_train[:30], digits.y_train[:30], epochs=1)
    assert m.scaler[2] > 0 and any(mk.any() for mk in m.masks.values())


def test_mse_head_under_a_global_scale_reference_equals_sim():
    rng = np.random.default_rng(3)
    x = rng.integers(-100, 100, (30, 5)).astype(np.int8)
    t = rng.integers(-100, 100, (30, 2)).astype(np.int8)
    a = Sequential([Dense(6), ReLU(), Dense(2)], input_shape=(5,), input_exp=-7, loss="mse",
                   precision={"loss_scale": "global:init_scale=6,growth_interval=2"})
    b = a.copy()
    sim = Simulator(b)
    for i in range(30):
        la = a.ref_train_step(x[i], t[i])
        lb = sim.train(x, None, [i], T=t)[0]
        assert a.state_hash() == b.state_hash() and tuple(la) == tuple(lb), i
    assert a.scaler[2] > 0


# ------------------------------------------------------------------------------ files
def test_a_resumed_training_continues_identically(tmp_path, digits):
    spec = {"loss_scale": "global:init_scale=8,growth_interval=7"}
    a = build_model("digits-mlp", digits, precision=spec)
    b = a.copy()
    sa, sb = Simulator(a), Simulator(b)
    sa.train(digits.x_train, digits.y_train, range(200))
    sb.train(digits.x_train, digits.y_train, range(100))
    tio.save(b, tmp_path / "m.tt")
    c, _ = tio.load(tmp_path / "m.tt")
    assert list(c.scaler) == list(b.scaler) and c.state_hash() == b.state_hash()
    Simulator(c).train(digits.x_train, digits.y_train, range(100, 200))
    assert c.state_hash() == a.state_hash() and list(c.scaler) == list(a.scaler) and a.scaler[2] > 0


def test_train_json_info_and_fixed_point_report_count_skipped_steps(tmp_path, digits, capsys):
    from tinytrain.fixedpoint_report import fixed_point_report, format_report
    from tinytrain.train import fit

    m = build_model("digits-mlp", digits, precision={"loss_scale": "global:init_scale=9,growth_interval=20"})
    h = fit(m, digits, epochs=1, progress=False)
    rec = h.epochs[0]
    assert rec["skipped_steps"] == rec["skipped_steps_total"] == int(m.scaler[2]) > 0
    assert rec["loss_scale_exponent"] == int(m.scaler[0])
    r = fixed_point_report(m, digits, samples=200)
    assert r["loss_scale"]["overflow_steps_total"] == int(m.scaler[2])
    assert "steps skipped so far" in format_report(r)
    import json

    from tinytrain import cli

    tio.save(m, tmp_path / "m.tt")
    assert cli.main(["info", "--model", str(tmp_path / "m.tt"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["loss_scale"] == {"policy": str(m.loss_scale), "exponent": int(m.scaler[0]),
                                  "clean_steps": int(m.scaler[1]), "overflow_steps": int(m.scaler[2])}


# ------------------------------------------------------------------------------ boards
@pytest.mark.qemu
@needs_qemu
def test_global_scale_trains_bit_exact_on_the_cortex_m4(digits):
    from tinytrain.verify import verify

    m = build_model("digits-mlp", digits, precision={"loss_scale": "global:init_scale=9,growth_interval=5"})
    r = verify(m, digits, 60, board="mps2_an386", json=True)
    assert r["steps"] == 60 and r["mismatches"] == 0, r["first_mismatch"]
