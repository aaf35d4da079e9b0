"""Built-in models, model files (JSON/TOML) and their errors, memory estimate."""
from __future__ import annotations

import json

import pytest

from tinytrain import data
from tinytrain.graph.layers import ModelError
from tinytrain.codegen.memory import memory_estimate
from tinytrain.graph.models import MODELS, available, build_model


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


def test_digits_mlp_shape_and_input_scale(digits):
    m = build_model("digits-mlp", digits)
    assert [l.kind for l in m.layers] == ["dense", "relu", "dense"]
    assert m.input_shape == (64,) and m.n_classes == 10
    assert m.input_exp == digits.input_exp - 4  # pixels 0..16 read as [0, 1]
    assert m.data_input_exp == digits.input_exp
    assert m.optimizer.lr == 0.05 and m.optimizer.batch_size == 1


def test_overrides_and_seed(digits):
    a = build_model("digits-mlp", digits, seed=1, lr=0.01, batch_size=4, momentum=0.9)
    assert (a.optimizer.lr, a.optimizer.batch_size, a.optimizer.momentum) == (0.01, 4, 0.9)
    assert a.seed == 1
    assert build_model("digits-mlp", digits, seed=1).state_hash() != build_model("digits-mlp", digits).state_hash()


def test_unavailable_builtins_say_so(digits):
    for name in MODELS:
        if not available(name):
            with pytest.raises(ModelError, match="not yet available"):
                build_model(name, digits)


def test_unknown_name(digits):
    with pytest.raises(ModelError, match="built-in models are digits-mlp"):
        build_model("resnet50", digits)


SPEC = {"layers": [{"type": "dense", "units": 16}, {"type": "relu"}, {"type": "dense", "units": 10}],
        "optimizer": {"lr": 0.02}, "name": "small"}


def test_json_and_toml_files_agree(digits, tmp_path):
    pj = tmp_path / "m.json"
    pj.write_text(json.dumps(SPEC))
    pt = tmp_path / "m.toml"
    pt.write_text('name = "small"\n[optimizer]\nlr = 0.02\n[[layers]]\ntype = "dense"\nunits = 16\n'
                  '[[layers]]\ntype = "relu"\n[[layers]]\ntype = "dense"\nunits = 10\n')
    a, b = build_model(pj, digits), build_model(str(pt), digits)
    assert a.config() == b.config()
    assert a.state_hash() == b.state_hash()
    assert a.name == "small" and a.optimizer.lr == 0.02


@pytest.mark.parametrize("spec, match", [
    ({"layers": [{"type": "dense2", "units": 10}]}, "unknown layer type 'dense2'"),
    ({"layers": [{"type": "dense", "units": -3}]}, "units = -3 must be a positive integer"),
    ({"layers": [{"type": "dense", "units": True}]}, "units = true must be a positive integer"),
    ({"layers": [{"type": "dense", "units": 10, "activation": "relu"}]}, r"dense: unknown key\(s\) activation: known keys are units"),
    ({"layers": [{"type": "dense", "units": 7}]}, "7 outputs but the data has 10 classes"),
    ({"layers": [{"type": "dense", "units": 10}], "optimizer": {"lrate": 0.1}}, "unknown optimizer option"),
    ({"layers": [{"type": "dense", "units": 10}], "optimizer": {"lr": -1}}, "learning rate"),
    ({"layers": [{"type": "dense", "units": 10}], "activation": 1}, "unknown key"),
    ({"layers": []}, "non-empty list"),
    ({"layers": ["dense"]}, "layer 0"),
    ({"layers": [{"type": "dense", "units": 10}], "input_scale": "log"}, "input_scale"),
])
def test_model_file_errors(digits, tmp_path, spec, match):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(spec))
    with pytest.raises(ModelError, match=match):
        build_model(p, digits)


def test_flat_model_on_images_needs_flatten(digits, tmp_path):
    img = data.load("digits-image")
    p = tmp_path / "m.json"
    p.write_text(json.dumps({"layers": [{"type": "dense", "units": 10}]}))
    with pytest.raises(ModelError, match="Flatten"):
        build_model(p, img)
    m = build_model("digits-mlp", img)  # the built-in adds the Flatten itself
    assert m.layers[0].kind == "flatten"


def test_syntax_errors_and_file_types(digits, tmp_path):
    p = tmp_path / "m.json"
    p.write_text('{"layers": [')
    with pytest.raises(ModelError, match="invalid JSON at line 1"):
        build_model(p, digits)
    q = tmp_path / "m.yaml"
    q.write_text("layers: []")
    with pytest.raises(ModelError, match="unsupported model file type"):
        build_model(q, digits)


def test_saved_model_as_model_argument(digits, tmp_path):
    from tinytrain.graph import io as tio
    m = build_model("digits-mlp", digits, seed=3)
    tio.save(m, tmp_path / "m.tt")
    m2 = build_model(tmp_path / "m.tt", digits)
    assert m2.state_hash() == m.state_hash()
    with pytest.raises(ModelError, match="saved model"):
        build_model(tmp_path / "m.tt", digits, lr=0.1)


def test_memory_estimate_partial_update(digits):
    full = memory_estimate(build_model("digits-mlp", digits))
    last = memory_estimate(build_model("digits-mlp", digits, train="last:1"))
    bias = memory_estimate(build_model("digits-mlp", digits, train="bias"))
    assert full["flash_frozen_params"] == 0
    assert full["ram_trainable_params"] == 32 * 64 * 2 + 32 * 4 + 10 * 32 * 2 + 10 * 4
    assert last["flash_frozen_params"] == 32 * 64 * 2 + 32 * 4
    assert last["ram_gradients"] == 0  # Dense layers update in place without a gradient buffer
    assert bias["ram_trainable_params"] == (32 + 10) * 4
    assert full["ram_total"] > last["ram_total"] and full["ram_total"] > bias["ram_total"]


def test_mnist1d_cnn():
    assert available("mnist1d-cnn")  # conv1d is registered: no skip may hide its absence
    ds = data.load("mnist1d")
    m = build_model("mnist1d-cnn", ds)
    assert [l.kind for l in m.layers] == ["conv1d", "relu"] * 3 + ["flatten", "dense"]
    assert m.output_shape == (10,) and m.optimizer.schedule == "cosine"


def test_mnist1d_cnn_pool_trains_reference_equal_numba():
    """The W2 model of issue 11: stride-1 convolutions + max pooling, 12 filters; a few training
    steps of the numpy reference and the numba simulator leave the same state."""
    import numpy as np

    from tinytrain.sim.simulator import Simulator
    from tinytrain.train import prepare_inputs

    assert available("mnist1d-cnn-pool") and MODELS["mnist1d-cnn-pool"][2] == "mnist1d"
    ds = data.load("mnist1d")
    ref = build_model("mnist1d-cnn-pool", ds, seed=0, total_steps=40)
    assert [l.kind for l in ref.layers] == ["conv1d", "relu", "maxpool1d"] * 3 + ["flatten", "dense"]
    assert ref.output_shape == (10,) and ref.param_count() == 1570
    assert ref.optimizer.lr == 0.03 and ref.optimizer.schedule == "cosine"
    assert ref.input_exp == ds.input_exp - 3
    x, y, xt, _ = prepare_inputs(ref, ds)
    fast = ref.copy()
    sim = Simulator(fast)
    h0 = ref.state_hash()
    for i in range(20):
        a = ref.ref_train_step(x[i], y[i])
        o = sim.train(x, y, [i])
        assert tuple(a) == tuple(o[0]) and ref.state_hash() == fast.state_hash(), f"step {i}"
    assert ref.state_hash() != h0
    assert [ref.ref_predict(v) for v in xt[:20]] == list(sim.predict(xt[:20]))
