"""fit/evaluate: shuffling from a separate data PRNG, metrics, checkpoints, bit-identical
resume, reference == fast path, input validation, and integer-only training steps."""
from __future__ import annotations

import numpy as np
import pytest

from tinytrain import data, fixedpoint as fp
from tinytrain.graph import io as tio
from tinytrain.graph import model as tmodel
from tinytrain.graph import optim as topt
from tinytrain.graph.models import build_model
from tinytrain.train import DATA_SEED_XOR, TrainError, evaluate, fit


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


def test_three_epochs_of_w1_reach_90_percent(digits):
    m = build_model("digits-mlp", digits)
    h = fit(m, digits, 3, seed=0, progress=False)
    assert [e["epoch"] for e in h.epochs] == [1, 2, 3]
    assert h.last["test_accuracy"] > 0.90
    assert h.epochs[0]["train_loss"] > h.last["train_loss"] > 0
    assert h.last["samples"] == len(digits.x_train)
    assert evaluate(m, digits)["accuracy"] == h.last["test_accuracy"]


def test_shuffle_order_and_prngs_are_separate(digits):
    """The data order is permutation(prng_seed(seed ^ 0x5EED)); the model PRNG is untouched
    by shuffling (no stochastic rounding here, so meta[0] stays at its seed)."""
    m = build_model("digits-mlp", digits, seed=7)
    ref = build_model("digits-mlp", digits, seed=7)
    fit(m, digits, 2, seed=5, progress=False, limit=100)
    st = fp.prng_seed(5 ^ DATA_SEED_XOR)
    for _ in range(2):
        st, order = fp.permutation(st, 100)
        for i in order:
            ref.ref_train_step(digits.x_train[i], digits.y_train[i])
    assert m.state_hash() == ref.state_hash()
    assert int(m.meta[0]) == fp.prng_seed(7)


@pytest.mark.parametrize("opt", [{}, {"batch_size": 4, "momentum": 0.9, "stochastic_rounding": True},
                                 {"master_weights": True, "schedule": "cosine", "total_steps": 1208}])
def test_resume_is_bit_identical(digits, tmp_path, opt):
    # 302 samples with batch 4: a batch straddles each epoch end, so the checkpoint holds a
    # half-filled accumulator
    straight = build_model("digits-mlp", digits, **opt)
    fit(straight, digits, 4, seed=1, progress=False, limit=302)
    ck = tmp_path / "ck.tt"
    a = build_model("digits-mlp", digits, **opt)
    fit(a, digits, 2, seed=1, progress=False, limit=302, checkpoint=ck)
    b = build_model("digits-mlp", digits, **opt)
    h = fit(b, digits, 4, seed=1, progress=False, limit=302, checkpoint=ck, resume=True)
    assert h.resumed_from == 2 and [e["epoch"] for e in h.epochs] == [1, 2, 3, 4]
    assert b.state_hash() == straight.state_hash()
    loaded, extra = tio.load(ck)
    assert loaded.state_hash() == straight.state_hash() and extra["epoch"] == 4


def test_resume_refuses_other_model(digits, tmp_path):
    ck = tmp_path / "ck.tt"
    fit(build_model("digits-mlp", digits), digits, 1, progress=False, limit=50, checkpoint=ck)
    with pytest.raises(TrainError, match="optimizer.lr"):
        fit(build_model("digits-mlp", digits, lr=0.1), digits, 2, progress=False, limit=50, checkpoint=ck, resume=True)
    with pytest.raises(TrainError, match="seed"):
        fit(build_model("digits-mlp", digits), digits, 2, seed=9, progress=False, limit=50, checkpoint=ck, resume=True)


def test_resume_without_checkpoint_starts_fresh(digits, tmp_path):
    m = build_model("digits-mlp", digits)
    h = fit(m, digits, 1, progress=False, limit=50, checkpoint=tmp_path / "new.tt", resume=True)
    assert h.resumed_from == 0 and (tmp_path / "new.tt").exists()


def test_reference_equals_fast_path(digits):
    a = build_model("digits-mlp", digits, batch_size=2, stochastic_rounding=True)
    b = build_model("digits-mlp", digits, batch_size=2, stochastic_rounding=True)
    ha = fit(a, digits, 2, seed=3, progress=False, limit=60)
    hb = fit(b, digits, 2, seed=3, progress=False, limit=60, reference=True)
    assert a.state_hash() == b.state_hash()
    for ea, eb in zip(ha.epochs, hb.epochs):
        for k in ("train_loss", "train_accuracy", "test_accuracy", "act_saturations", "weight_saturations"):
            assert ea[k] == eb[k], k


def test_evaluate_leaves_state_alone(digits):
    m = build_model("digits-mlp", digits)
    fit(m, digits, 1, progress=False, limit=100)
    h, s = m.state_hash(), m.stats.copy()
    r = evaluate(m, digits)
    assert m.state_hash() == h and np.array_equal(m.stats, s)
    assert r["samples"] == 360 and sum(map(sum, r["confusion"])) == 360
    assert evaluate(m, digits, reference=True)["accuracy"] == r["accuracy"]


def test_plot_and_progress(digits, tmp_path, capsys):
    png = tmp_path / "curve.png"
    lines = []
    fit(build_model("digits-mlp", digits), digits, 2, progress=True, limit=64, plot=png, log=lines.append)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(lines) == 2 and lines[1].startswith("epoch   2/2")


def test_requantizes_data_with_another_exponent(digits):
    """A model built for the digits exponent reads data quantized with 7 bits correctly."""
    m = build_model("digits-mlp", digits)
    fit(m, digits, 1, progress=False, limit=200)
    coarse = data.load("digits", bits=7)
    assert coarse.input_exp != digits.input_exp
    assert evaluate(m, coarse)["accuracy"] == evaluate(m, digits)["accuracy"]


# ------------------------------------------------------------------- validation

def test_label_out_of_range(digits):
    m = build_model("digits-mlp", digits)
    bad = data.from_arrays(digits.float_x_train, np.arange(len(digits.x_train)) % 12,
                           digits.float_x_test, digits.y_test, name="twelve")
    with pytest.raises(data.DataError, match="label 11 in y_train is out of range for the model's 10 classes"):
        fit(m, bad, 1, progress=False)


def test_wrong_input_shape(digits):
    m = build_model("digits-mlp", digits)
    with pytest.raises(data.DataError, match=r"expects \(64,\).*digits-image"):
        fit(m, data.load("digits-image"), 1, progress=False)


def test_nan_in_data(digits):
    x = digits.float_x_train.copy()
    x[3, 5] = np.nan
    with pytest.raises(data.DataError, match="NaN"):
        data.from_arrays(x, digits.y_train, digits.float_x_test, digits.y_test)


def test_bad_arguments(digits):
    m = build_model("digits-mlp", digits)
    with pytest.raises(TrainError, match="epochs"):
        fit(m, digits, -1, progress=False)
    with pytest.raises(TrainError, match="Dataset"):
        fit(m, (digits.x_train, digits.y_train), 1, progress=False)
    fit(m, digits, 1, progress=False, limit=10)
    with pytest.raises(TrainError, match="batch size"):
        fit(m, digits, 2, progress=False, limit=10, batch_size=8)


# ------------------------------------------------------- integer-only training step

def _check_int(what, v):
    if isinstance(v, np.ndarray):
        assert v.dtype.kind in "iu", f"{what}: dtype {v.dtype}"
    elif isinstance(v, (tuple, list)):
        for j, x in enumerate(v):
            _check_int(f"{what}[{j}]", x)
    elif v is not None:
        assert isinstance(v, (int, np.integer)), f"{what}: {type(v).__name__} (floats are not allowed in a step)"


@pytest.mark.parametrize("opt", [{}, {"batch_size": 2, "momentum": 0.9, "weight_decay": 1e-3,
                                      "stochastic_rounding": True, "master_weights": True}])
def test_every_tensor_in_a_reference_step_is_integer(digits, monkeypatch, opt):
    m = build_model("digits-mlp", digits, **opt)
    seen = []
    for li, layer in enumerate(m.layers):
        def wrap(fn, tag, li=li):
            def inner(*a, **k):
                out = fn(*a, **k)
                _check_int(f"layer {li} {tag} inputs", [x for x in a if not isinstance(x, bool)])
                _check_int(f"layer {li} {tag} outputs", out)
                seen.append((li, tag))
                return out
            return inner
        monkeypatch.setattr(layer, "ref_forward", wrap(layer.ref_forward, "forward"))
        monkeypatch.setattr(layer, "ref_backward", wrap(layer.ref_backward, "backward"))
    for mod, name in [(tmodel.r_ce, "forward_backward"), (tmodel.r_opt, "update_direct_ref"),
                      (tmodel.r_opt, "accumulate_ref"), (tmodel.r_opt, "apply_accumulated_ref"),
                      (tmodel.r_opt, "refresh_compute_copy")]:
        fn = getattr(mod, name)
        def inner(*a, _fn=fn, _name=name, **k):
            out = _fn(*a, **k)
            _check_int(f"{_name} args", [x for x in a if isinstance(x, np.ndarray)])
            _check_int(f"{_name} result", out)
            seen.append(_name)
            return out
        monkeypatch.setattr(mod, name, inner)
    assert not isinstance(m.opt, topt.SGD)
    for i in range(4):
        m.ref_train_step(digits.x_train[i], digits.y_train[i])
        for a in m.state_tensors():
            assert a.dtype.kind in "iu"
    assert ("forward_backward" in seen) and (2, "backward") in seen and (0, "forward") in seen
    assert ("update_direct_ref" in seen) or ("apply_accumulated_ref" in seen)


def _all_layer_models():
    from tinytrain.graph.layers import Dense, Flatten, ReLU
    from tinytrain.graph.conv import AvgPool2d, Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool, MaxPool1d, MaxPool2d
    from tinytrain.graph.norm import BatchNorm
    from tinytrain.graph.model import Sequential
    yield Sequential([Conv2d(4, 3, padding="same"), BatchNorm(), ReLU(), MaxPool2d(2), DepthwiseConv2d(3, padding="same"),
                      ReLU(), AvgPool2d(2), Flatten(), Dense(5)], input_shape=(8, 8, 1), input_exp=-7, seed=0)
    yield Sequential([Conv1d(4, 3, stride=2), BatchNorm(), ReLU(), MaxPool1d(2), Conv1d(3, 3, padding="same"),
                      GlobalAvgPool(), Dense(5)], input_shape=(20, 2), input_exp=-7,
                     optimizer=topt.SGD(lr=0.05, batch_size=2, momentum=0.9, stochastic_rounding=True), seed=0)


@pytest.mark.parametrize("idx", [0, 1])
def test_every_layer_type_step_is_integer(monkeypatch, idx):
    """Every op of every layer type (conv, depthwise, pooling, batch norm...), forward and
    backward, takes and returns integer tensors and integer exponents only."""
    m = list(_all_layer_models())[idx]
    seen = set()
    for li, layer in enumerate(m.layers):
        for tag in ("ref_forward", "ref_backward"):
            fn = getattr(layer, tag)

            def inner(*a, _fn=fn, _tag=tag, _li=li, **k):
                out = _fn(*a, **k)
                _check_int(f"layer {_li} {_tag} inputs", [x for x in a if not isinstance(x, bool)])
                _check_int(f"layer {_li} {_tag} outputs", out)
                seen.add((_li, _tag))
                return out
            monkeypatch.setattr(layer, tag, inner)
    rng = np.random.default_rng(idx)
    x = rng.integers(-127, 128, (4, *m.input_shape)).astype(np.int8)
    for i in range(4):
        m.ref_train_step(x[i], i % 5)
    assert all((li, t) in seen for li in range(len(m.layers)) for t in ("ref_forward", "ref_backward"))
    for a in m.state_tensors():
        assert a.dtype.kind in "iu"


def test_update_underflow_counted_same_in_reference_and_simulator(digits):
    """Underflow of weight updates (nonzero gradient, step rounded to 0) is counted by the
    reference and the simulator alike; stochastic rounding removes most of it."""
    from tinytrain.sim.simulator import Simulator
    counts = {}
    for sr in (False, True):
        a = build_model("digits-mlp", digits, lr=0.001, stochastic_rounding=sr)
        b = a.copy()
        sim = Simulator(b)
        X = digits.x_train
        for i in range(30):
            a.ref_train_step(X[i], digits.y_train[i])
        sim.train(X, digits.y_train, list(range(30)))
        assert a.stats[2] == b.stats[2] and a.state_hash() == b.state_hash()
        counts[sr] = int(a.stats[2])
    assert counts[False] > 0 and counts[True] < counts[False]


def test_training_plot_shows_the_integer_losses_beside_the_loss(tmp_path):
    """The curve PNG has a third panel: underflows and saturations per sample, per epoch."""
    import matplotlib.image as mpimg

    from tinytrain.train import History, plot_history

    h = History(epochs=[{"epoch": e, "train_loss": 1.0 / e, "train_accuracy": 0.5, "test_accuracy": 0.5,
                         "act_saturations": 3 * e, "weight_saturations": 0, "update_underflows": 1000 * e,
                         "seconds": 0.1, "samples": 100} for e in (1, 2, 3)])
    img = mpimg.imread(plot_history(h, tmp_path / "c.png"))
    assert img.shape[1] > 3.5 * img.shape[0]  # three panels side by side
