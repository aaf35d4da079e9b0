"""Precision policies (graph/precision.py): parsing, what a policy builds, conversion, files, and
reference = numba = C every step on drawn graphs x policies x optimizer options.

int16 activations and errors (preset int16-act16) take MLP graphs only: tests/test_precision_act16.py."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.codegen.emit import CodegenError, generate
from tinytrain.graph import io as tio
from tinytrain.graph.conv import Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.convert import with_precision
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU, layer_from_config
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.precision import PRESETS, Precision, PrecisionError, parse_cli
from tinytrain.graph.residual import Residual
from tinytrain.sim.simulator import Simulator

from .conftest import examples
from .test_exactness import _data, any_graph, any_optimizer, three_way

#: the presets of any graph (int16-act16, for MLPs: tests/test_precision_act16.py)
GRAPH_PRESETS = [n for n, p in PRESETS.items() if not p.a16]
POLICIES = GRAPH_PRESETS + [{"momentum": "int16"}, {"weights": "int8", "momentum": "int16"},
                             {"weights": "int8", "master": "int16", "momentum": "int16"},
                             {"momentum": "int8"}, {"weights": "int8", "master": "int16", "momentum": "int8"},
                             {"bias": "int16", "momentum": "int16"}, {"bias": "int16", "master": "int32"},
                             {"weights": "int8", "master": "int16", "bias": "int16", "momentum": "int8"}]


# ------------------------------------------------------------------------------ parsing
def test_presets_and_objects_parse_to_the_same_policy():
    assert Precision.parse("int8") == Precision.parse({"weights": "int8"}) == Precision(weights="int8")
    assert Precision.parse(None) == Precision() == PRESETS["int16"]
    assert Precision.parse({"master": "int16"}, base=Precision(weights="int8")) == PRESETS["int8-master16"]
    assert Precision().to_dict() == {} and PRESETS["int8-master16"].to_dict() == {"weights": "int8", "master": "int16"}


@pytest.mark.parametrize("spec, match", [
    ({"weight": "int8"}, "unknown key(s) weight"),
    ({"weights": "int7"}, 'weights = "int7" must be one of'),
    ({"weights": "int4"}, "int4 weights need a finer exponent than one per tensor"),
    ({"momentum": "int8", "master": "int32"}, 'momentum = "int8" has no int8 store to follow'),
    ({"activations": "int16"}, 'give "activations" and "errors" the same value'),
    ({"exponent": "block32"}, "is for int8 or int4 weights"),
    ({"master": "int16"}, "not wider than the int16 weights"),
    ({"weights": "int8", "rounding": "nearest"}, "cannot train with rounding"),
    ("int9", "unknown preset 'int9'"),
    (7, "must be a preset name or an object"),
])
def test_bad_policies_name_the_key(spec, match):
    with pytest.raises(PrecisionError, match=match.replace("(", r"\(").replace(")", r"\)")):
        Precision.parse(spec)


def test_cli_spelling():
    assert parse_cli("int8") == "int8"
    assert parse_cli('{"weights": "int8", "master": "int16"}') == {"weights": "int8", "master": "int16"}
    with pytest.raises(PrecisionError, match="not valid JSON"):
        parse_cli("{weights: int8}")


def test_rounding_is_one_for_the_model():
    l = Dense(4)
    l.precision = {"weights": "int16", "rounding": "nearest"}
    with pytest.raises(ModelError, match="rounding is one for the model"):
        Sequential([l, Dense(3)], input_shape=(5,), precision="int8")
    # int8 without a master turns stochastic rounding on (rounding "auto"); with a master it stays off
    assert Sequential([Dense(3)], input_shape=(5,), precision="int8").opt.sr
    assert not Sequential([Dense(3)], input_shape=(5,), precision="int8-master16").opt.sr
    assert Sequential([Dense(3)], input_shape=(5,), precision={"rounding": "stochastic"}).opt.sr


# -------------------------------------------------------------------------- what it builds
@pytest.mark.parametrize("name", GRAPH_PRESETS)
def test_policy_builds_its_widths(name):
    pol = PRESETS[name]
    m = Sequential([Dense(6), ReLU(), Residual([Dense(6)]), Dense(3)], input_shape=(9,), input_exp=-7, precision=name)
    ref = Sequential([Dense(6), ReLU(), Residual([Dense(6)]), Dense(3)], input_shape=(9,), input_exp=-7)
    for l, r in zip(m.layers, ref.layers):
        for p, q in zip(l.params, r.params):
            if p.role == "weight":
                assert p.data.dtype == pol.weight_dtype
                # the same range in fewer bits: the exponent moves by the difference (block
                # exponents: the int16 one, each block's shift on top, tests/test_wblock.py)
                assert p.exp == q.exp + (0 if pol.blocked else 16 - pol.weight_bits)
                lim = np.iinfo(p.data.dtype).max
                assert -lim <= int(p.data.min()) and int(p.data.max()) <= lim
            elif p.role == "bias" and pol.bias == "int16":  # at the exponent of the layer's int16 weights
                w16 = next(r for r in l.params if r.role == "weight").exp - (0 if pol.blocked else 16 - pol.weight_bits)
                assert p.data.dtype == np.int16 and q.data.dtype == np.int32 and p.exp == w16 == q.exp + 8
            else:
                assert p.data.dtype == q.data.dtype and p.exp == q.exp
    weights = [(li, pi) for li, l in enumerate(m.layers) for pi, p in enumerate(l.params) if p.role == "weight"]
    if pol.master == "none":
        assert m.master == {}
    else:
        assert sorted(m.master) == weights
        for key in weights:
            w = m.layers[key[0]].params[key[1]]
            assert m.master[key].dtype == np.dtype(pol.master)
            if pol.blocked:  # the master holds the decoded weights q << s at their exponent
                from tinytrain.ops.wblock import expand

                s = m.layers[key[0]].params[key[1] + 2]
                assert m.master_shift[key] == 0 and s.name.endswith("w_exp")
                assert (expand(w.data, s.data, pol.block_len(w.data.shape[1])) == m.master[key]).all()
                continue
            assert m.master_shift[key] == np.dtype(pol.master).itemsize * 8 - pol.weight_bits
            assert (m.master[key] >> m.master_shift[key] == w.data).all()


def test_default_policy_changes_nothing():
    """A model under the default policy is the model without one: schema, C, state."""
    a = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7)
    b = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, precision="int16")
    assert a.schema_hash() == b.schema_hash() and a.state_hash() == b.state_hash()
    assert generate(a).source == generate(b).source
    assert "precision" not in a.config() and "precision" not in a.schema()


def test_optimizer_master_weights_is_an_int32_master():
    a = Sequential([Dense(3)], input_shape=(5,), optimizer=SGD(master_weights=True))
    b = Sequential([Dense(3)], input_shape=(5,), precision="int16-master32")
    assert a.master.keys() == b.master.keys() and all((a.master[k] == b.master[k]).all() for k in a.master)
    c = Sequential([Dense(3)], input_shape=(5,), precision="int8", optimizer=SGD(master_weights=True))
    assert c.master[(0, 0)].dtype == np.int32 and c.master_shift[(0, 0)] == 24


def test_layer_override_from_a_model_file():
    from tinytrain.data import load_digits
    from tinytrain.graph.models import from_spec

    ds = load_digits()
    spec = {"precision": "int8", "layers": [{"type": "dense", "units": 8, "precision": {"master": "int16"}},
                                            {"type": "relu"}, {"type": "dense", "units": 10}]}
    m = from_spec(spec, ds)
    assert [p.data.dtype for p in m.layers[0].params] == [np.int8, np.int32]
    assert m.master.keys() == {(0, 0)} and m.master[(0, 0)].dtype == np.int16
    assert m.opt.sr  # the second dense has int8 weights and no master
    assert m.config()["layers"][0]["precision"] == {"master": "int16"}
    with pytest.raises(ModelError, match="dense precision: unknown key"):
        layer_from_config({"type": "dense", "units": 3, "precision": {"bits": 8}})


# ------------------------------------------------------------------------------ conversion
def test_conversion_keeps_the_range_and_rounds():
    a = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, precision="int16-master32", seed=4)
    x, y = _data(30, (9,), 3, 2)
    Simulator(a).train(x, y, np.arange(30))
    b = with_precision(a, "int8-master16")
    for key in ((0, 0), (2, 0)):
        w_old, w_new = a.layers[key[0]].params[key[1]], b.layers[key[0]].params[key[1]]
        assert w_new.exp == w_old.exp + 8
        # the new int16 master (at e_old + 8 - 8) from the old int32 master (at e_old - 16): 16 bits,
        # rounded; it equals the old int16 compute copy
        m32 = a.master[key].astype(np.int64)
        assert (b.master[key] == np.clip((m32 >> 16) + ((m32 >> 15) & 1), -32767, 32767)).all()
        assert (b.master[key] == w_old.data).all()
        assert (w_new.data == np.clip((b.master[key].astype(np.int64) >> 8) + ((b.master[key] >> 7) & 1), -127, 127)).all()
    assert (b.meta[:2] == a.meta[:2]).all()
    back = with_precision(b, "int16")  # widening is exact
    assert all((p.data == q.data.astype(np.int16) << 8).all() for p, q in zip(back.layers[0].params[:1], b.layers[0].params[:1]))


def test_converted_model_saves_loads_and_trains_equal(tmp_path):
    a = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, seed=1)
    x, y = _data(12, (9,), 3, 3)
    Simulator(a).train(x, y, np.arange(12))
    b = with_precision(a, "int8")
    tio.save(b, tmp_path / "b.tt")
    c, _ = tio.load(tmp_path / "b.tt")
    assert c.schema() == b.schema() and c.state_hash() == b.state_hash()
    assert [p.exp for l in c.layers for p in l.params] == [p.exp for l in b.layers for p in l.params]
    three_way(c, x, y, epochs=1)


# ------------------------------------------------------- reference = numba = C, drawn policies
@st.composite
def flat_model(draw):
    n_in = draw(st.integers(3, 12))
    layers = []
    for _ in range(draw(st.integers(0, 2))):
        kind = draw(st.sampled_from(["dense", "relu", "residual"]))
        n = layers[-1].units if layers and isinstance(layers[-1], Dense) else None
        if kind == "dense":
            layers.append(Dense(draw(st.integers(2, 12))))
        elif kind == "relu":
            layers.append(ReLU())
        elif n:
            layers.append(Residual([Dense(n)] + ([ReLU()] if draw(st.booleans()) else [])))
    n_cls = draw(st.integers(2, 5))
    layers.append(Dense(n_cls))
    for l in layers:  # per-layer overrides of the model's policy
        if l.params and draw(st.integers(0, 3)) == 0:
            l.precision = draw(st.sampled_from([{"weights": "int16"}, {"weights": "int8", "master": "int16"},
                                                {"master": "int32"}, {"weights": "int8"}, {"momentum": "int16"},
                                                {"momentum": "int8"}, {"bias": "int16"},
                                                {"bias": "int32", "weights": "int8", "master": "int16"}]))
    return (n_in,), layers, n_cls


def _build(data, shape, layers, policy):
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, precision=policy)
    opt = data.draw(any_optimizer(probe.layers))
    if Precision.parse(policy).momentum == "int8":  # an int32 master keeps int32 momentum: refused with it
        opt = replace(opt, master_weights=False)
    return Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                      seed=data.draw(st.integers(0, 1000)), precision=policy)


@settings(max_examples=examples(4), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_policy_any_optimizer_reference_sim_c_equal(data):
    shape, layers, n_cls = data.draw(flat_model())
    try:
        ref = _build(data, shape, layers, data.draw(st.sampled_from(POLICIES)))
    except ModelError as exc:  # a drawn override may ask for nearest rounding beside int8: refused
        assert "rounding" in str(exc) or "not wider" in str(exc) or "from an int16 master" in str(exc) \
            or "keeps int32 momentum" in str(exc)
        return
    x, y = _data(data.draw(st.integers(4, 9)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_graph_under_a_policy_reference_sim_c_equal(data):
    """Any graph (convs, depthwise, batch norm, pools, residual blocks) under a policy: the int8
    conv kernels (tt_conv_w8.c) as well as the dense ones."""
    shape, layers, n_cls = data.draw(any_graph())
    # block exponents are for dense layers (conv layers refuse them: tests/test_wblock.py)
    ref = _build(data, shape, layers, data.draw(st.sampled_from([p for p in POLICIES if not Precision.parse(p).blocked])))
    x, y = _data(data.draw(st.integers(4, 8)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y, epochs=1)


@pytest.mark.parametrize("layers, shape", [
    (lambda: [Conv1d(3, 3, stride=2, padding="same"), ReLU(), Flatten(), Dense(3)], (9, 2)),
    (lambda: [Conv2d(2, 3, padding="same"), DepthwiseConv2d(3, stride=2), Flatten(), Dense(3)], (6, 5, 1)),
    (lambda: [Residual([Conv2d(2, 3, padding="same"), BatchNorm(), ReLU()]), GlobalAvgPool(), Dense(3)], (4, 4, 2)),
])
@pytest.mark.parametrize("policy", ["int8"])
def test_int8_conv_layers_reference_sim_c_equal(layers, shape, policy):
    ref = Sequential(layers(), input_shape=shape, input_exp=-7, optimizer=SGD(lr=0.05, momentum=0.9, batch_size=2),
                     seed=2, precision=policy)
    assert any(p.data.dtype == np.int8 for l in ref.layers for p in l.params)
    three_way(ref, *_data(6, shape, 3, 5), epochs=2)


def test_a_layer_without_int8_kernels_is_refused_by_codegen_with_the_fix(monkeypatch):
    """A layer type with int8 weights and no C variant (a plugin's, or as conv layers were)
    is named with the fix, not compiled into a call of a missing kernel."""
    from tinytrain.codegen import emit

    monkeypatch.setattr(emit, "C_WEIGHT_VARIANTS", {"dense"})
    m = Sequential([Conv1d(2, 3), Flatten(), Dense(3)], input_shape=(8, 1), input_exp=-7, precision="int8")
    with pytest.raises(CodegenError, match=r'layer 0 \(conv1d\) has int8 weights.*"weights": "int16"'):
        generate(m)
    m = Sequential([Residual([Conv2d(1, 3, padding="same")]), Flatten(), Dense(3)], input_shape=(4, 4, 1),
                   input_exp=-7, precision="int8")
    with pytest.raises(CodegenError, match=r"layer 0 \(inner layer 0\) \(conv2d\)"):
        generate(m)


@pytest.mark.skipif(__import__("shutil").which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")
@pytest.mark.parametrize("policy", ["int8", "int8-master16", "int8-master32"])
def test_int8_policies_are_integer_only_on_cortex_m(policy):
    """No float helper on M0, no VFP instruction in hard-float M4/M33 builds (GCC may move
    64-bit zeros through VFP registers: the int8 kernels are written not to let it)."""
    from tinytrain.codegen import memory

    opt = SGD(lr=0.05, batch_size=2, momentum=0.9) if policy.endswith("32") else SGD(lr=0.05)
    em = generate(Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, optimizer=opt,
                             precision=policy))
    assert memory.float_symbols(memory.compile_arm(em, "cortex-m0")["undefined"]) == []
    for cpu in ("cortex-m4", "cortex-m33"):
        assert memory.vfp_instructions(memory.compile_arm(em, cpu)["disasm"]) == [], cpu


def test_conv_gradients_by_channel_shrink_the_buffer_and_w3_fits_the_microbit():
    """Conv layers form their weight gradient a few output channels at a time (the training
    step applies them before forming the next): W3's gradient buffer is one block of conv2
    (2 channels x 72), not its 1,152 weights, and W3 fits the micro:bit's 16 KB under the
    default policy and with int8 weights."""
    from tinytrain import data
    from tinytrain.codegen.emit import Emitter
    from tinytrain.codegen.memory import breakdown
    from tinytrain.graph.models import build_model

    ds = data.load("digits-image")
    m = build_model("digits-cnn", ds)
    grads = [t for t in Emitter(m, "tt_model").plan() if t.role == "grad"]
    # grad0: one block of conv2 (2 x 72; also a BN layer's gamma), grad1: the BNs' beta (16)
    assert [(t.name, t.count) for t in grads] == [("tt_model_grad0", 144), ("tt_model_grad1", 16)]
    src = generate(m).source
    assert "tt_conv2d_grad_w_chan_s32(" in src and "tt_conv2d_grad_s32(" not in src
    for policy in (None, "int8"):
        bd = breakdown(build_model("digits-cnn", ds, precision=policy), "microbit", shadow=False)
        assert bd.fits()["ram"], (policy, bd.ram_total)


def test_int16_momentum_saturates_in_its_width_on_every_path():
    """momentum int16: the velocity of int8/int16 stores is int16 (a bias or an int32 master keeps
    int32), saturating symmetrically; reference = numba = C with a learning rate that drives it
    to the limit."""
    opt = SGD(lr=0.2, momentum=0.9, batch_size=2)
    m = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, optimizer=opt, seed=1,
                   precision={"weights": "int8", "momentum": "int16"})
    assert {k: v.dtype.name for k, v in m.velocity.items()} == {(0, 0): "int16", (0, 1): "int32", (2, 0): "int16",
                                                                (2, 1): "int32"}
    m32 = Sequential([Dense(3)], input_shape=(9,), optimizer=opt, precision={"master": "int32", "momentum": "int16"})
    assert m32.velocity[(0, 0)].dtype == np.int32
    x, y = _data(16, (9,), 3, 6)
    three_way(m, x, y, epochs=3)
    assert int(np.abs(m.velocity[(0, 0)]).max()) <= 32767


@pytest.mark.parametrize("policy, opt", [(None, SGD(lr=0.05, master_weights=True)), ("int8-master16", SGD(lr=0.05)),
                                         ("int8-master32", SGD(lr=0.05, momentum=0.9, batch_size=2))])
def test_writing_the_state_refreshes_the_compute_copies(policy, opt):
    """The state blob holds a master, not its compute copy: after write_state (LOAD_PARAMS on a
    board, a federated broadcast, a FedProx pull) the C narrows every compute copy again from its
    master, or it would train on the weights it had before (boards drifted from simulated
    devices from round 2 of a federation of master-weight models)."""
    from tinytrain.codegen.host import HostModel

    a = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, optimizer=opt, seed=1, precision=policy)
    x, y = _data(10, (9,), 3, 2)
    b = a.copy()
    Simulator(b).train(x, y, np.arange(10))
    hm = HostModel(a.copy(), sanitize=True)  # the C still at the initial state
    assert hm.write_state(b"".join(t.astype(t.dtype.newbyteorder("<")).tobytes() for t in b.state_tensors())) == 0
    sim = Simulator(b)
    for i in range(5):
        assert tuple(int(v) for v in sim.train(x, y, [i])[0]) == tuple(int(v) for v in hm.train_step(x[i], y[i]))
        assert b.state_hash() == hm.state_hash(), i


def _qemu_missing():
    import shutil

    missing = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        missing.append("platformio")
    return missing


@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@pytest.mark.parametrize("policy, board", [("int8", "microbit"), ({"weights": "int8", "master": "int16", "momentum": "int16"},
                                                                  "mps2_an386")])
def test_policies_train_bit_exact_on_qemu_boards(policy, board):
    """W1 under an int8 policy on the Cortex-M0 (SR fast path, int8 kernels) and, with an int16
    master and int16 momentum at batch 2, on the Cortex-M4 (DSP build): every step verified."""
    from tinytrain import data
    from tinytrain.graph.models import build_model
    from tinytrain.verify import verify

    ds = data.load("digits")
    m = build_model("digits-mlp", ds, precision=policy, **({"momentum": 0.9, "batch_size": 2} if board == "mps2_an386" else {}))
    r = verify(m, ds, 80, board=board, json=True)
    assert r["steps"] == 80 and r["mismatches"] == 0, r["first_mismatch"]


# ------------------------------------------------------------------------------ int16 biases
def test_int16_bias_builds_saves_and_loads(tmp_path):
    """"bias": "int16", global or per layer: int16 biases at the int16 weights' exponent, no master
    (the master is the weights'), int16/int8 momentum as an int16 store; .tt round trip; a
    default-policy file (int32 biases) loads as it was."""
    l0 = Dense(6)
    l0.precision = {"bias": "int16"}
    opt = SGD(lr=0.05, momentum=0.9, batch_size=2)
    m = Sequential([l0, ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, optimizer=opt, seed=1,
                   precision={"master": "int32", "momentum": "int16"})
    assert [p.data.dtype.name for l in m.layers for p in l.params] == ["int16", "int16", "int16", "int32"]
    assert sorted(m.master) == [(0, 0), (2, 0)] and m.velocity[(0, 1)].dtype == np.int16
    x, y = _data(10, (9,), 3, 4)
    Simulator(m).train(x, y, np.arange(10))
    assert m.layers[0].params[1].data.any()
    tio.save(m, tmp_path / "m.tt")
    c, _ = tio.load(tmp_path / "m.tt")
    assert c.schema() == m.schema() and c.state_hash() == m.state_hash()
    assert c.layers[0].params[1].data.dtype == np.int16 and (c.layers[0].params[1].data == m.layers[0].params[1].data).all()
    old = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, seed=1)
    tio.save(old, tmp_path / "old.tt")
    assert tio.load(tmp_path / "old.tt")[0].layers[0].params[1].data.dtype == np.int32


def test_int16_bias_saturates_symmetrically_on_every_path():
    """An int16 bias saturates to 32767 like an int16 weight (the same symmetric clip): bias 0 of
    the last layer starts next to the limit and every label is class 0, so every error pushes it
    up; reference = numba = C every step, and the saturations are counted."""
    m = Sequential([Dense(4), ReLU(), Dense(3)], input_shape=(5,), input_exp=-7, optimizer=SGD(lr=0.5), seed=3,
                   precision="int16-bias16")
    m.layers[2].params[1].data[:] = [32760, 0, 0]
    x, _ = _data(8, (5,), 3, 9)
    three_way(m, x, np.zeros(8, np.int32), epochs=2)
    assert m.layers[2].params[1].data[0] == 32767 and m.stats[1] > 0


def test_int16_bias_in_c_is_widened_into_the_scratch_not_a_buffer():
    """The C forward widens an int16 bias into the scratch past its kernel's words: the kernels are
    the int32-bias ones, and W1's biases cost 2 B per element and no new buffer."""
    from tinytrain.codegen.emit import Emitter
    from tinytrain.graph.optable import scratch_words

    m = Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, precision="int16-bias16")
    src = generate(m).source
    assert ".b = ((int32_t *)(SCRATCH + 32))" in src and "tt_widen_s16_s32(tt_model_l0_b, 32, ((int32_t *)(SCRATCH + 32)))" in src
    assert "static int16_t tt_model_l0_b[32]" in src
    assert scratch_words(m.layers[0]) == 64 and scratch_words(m.layers[2]) == 32  # 32 + 16 words, 10 + 5
    wide = Sequential([Dense(4), ReLU(), Dense(60)], input_shape=(5,), input_exp=-6, precision="int16-bias16")
    assert scratch_words(wide.layers[2]) == 60 + 30
    plan = {t.name: t.bytes for t in Emitter(m, "tt_model").plan()}
    base = {t.name: t.bytes for t in Emitter(Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,),
                                                         input_exp=-6), "tt_model").plan()}
    assert plan["tt_model_l0_b"] == 64 and base["tt_model_l0_b"] == 128
    assert plan["tt_model_scratch"] == base["tt_model_scratch"] == 8 * 64


@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_int16_bias_trains_bit_exact_on_the_cortex_m4(data):
    """Drawn MLPs on digits with int16 biases (global or one layer), int16/int8 weights, masters,
    momentum, SR and batch sizes on QEMU mps2_an386 (DSP build): every step's state hash verified
    against the simulator."""
    from tinytrain import data as tdata
    from tinytrain.verify import verify

    ds = tdata.load("digits")
    layers = [Dense(data.draw(st.integers(4, 24))), ReLU(), Dense(10)]
    if data.draw(st.booleans()):
        layers[data.draw(st.sampled_from([0, 2]))].precision = {"bias": "int32"}
    policy = {"bias": "int16", **data.draw(st.sampled_from([{}, {"weights": "int8"}, {"master": "int32"},
                                                            {"weights": "int8", "master": "int16", "momentum": "int8"}]))}
    opt = SGD(lr=0.02, momentum=data.draw(st.sampled_from([0.0, 0.9])), batch_size=data.draw(st.sampled_from([1, 2])),
              stochastic_rounding=data.draw(st.booleans()))
    if policy.get("momentum") == "int8" and not opt.momentum:
        opt = replace(opt, momentum=0.9)
    m = Sequential(layers, dataset=ds, seed=data.draw(st.integers(0, 100)), optimizer=opt, precision=policy)
    r = verify(m, ds, 30, board="mps2_an386", json=True)
    assert r["steps"] == 30 and r["mismatches"] == 0, (m.summary(), r["first_mismatch"])
