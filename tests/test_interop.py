"""Import (PyTorch, ONNX, TFLite) and export (ONNX): layouts converted exactly, PTQ accuracy,
residual blocks, the imported model trains, generates C, federates and verifies bit for bit
(host and QEMU M4); QAT matches the integer model; the pretrain-then-adapt example runs.
Needs the interop extra (torch, onnx, onnxruntime), which CI installs (scripts/bootstrap.sh):
without it these tests fail on the import below instead of skipping."""
from __future__ import annotations

import io
import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from torch import nn

import tinytrain as tt
import tinytrain.torch as ttt
from tinytrain import cli
from tinytrain.interop import ir
from tinytrain.interop.onnx_import import onnx_graph
from tinytrain.interop.torch_import import torch_graph
from tinytrain.sim.simulator import Simulator

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def digits():
    return tt.load_dataset("digits")


@pytest.fixture(scope="module")
def digits_image():
    return tt.load_dataset("digits-image")


@pytest.fixture(scope="module")
def w3_torch(digits_image):
    """W3's shape trained in PyTorch float for 20 epochs (seed 0)."""
    torch.manual_seed(0)
    net = ttt.digits_cnn()
    ttt.train(net, ttt.dataset_inputs(digits_image, quantized=False), digits_image.y_train, 20, seed=0)
    return net


def _onnx_of(net, x, **kw):
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.from_numpy(x),), f, dynamo=False, **kw)
    return onnx.load_from_string(f.getvalue())


# ------------------------------------------------------------------ layouts, exactly

def _random_init(net, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.3)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return net.eval()


class Functional(nn.Module):
    """A module that is not a Sequential: F.relu, torch.flatten-by-view, layers called in forward."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn, self.fc = nn.Conv2d(2, 4, 3, stride=2, padding=1), nn.BatchNorm2d(4), nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        x = torch.nn.functional.relu(self.bn(self.conv(x)))
        return self.fc(x.view(x.size(0), -1))


class ResNetLike(nn.Module):
    """A residual block y = relu(x + bn(conv(relu(bn(conv(x)))))) between plain layers."""

    def __init__(self, c_in=1, c=8, classes=10, hw=8):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(c_in, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU())
        self.f = nn.Sequential(nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU(),
                               nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c))
        self.head = nn.Sequential(nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(), nn.Linear(c * (hw // 2) ** 2, classes))

    def forward(self, x):
        x = self.stem(x)
        return self.head(x + self.f(x))


NETS = {
    "functional-view": (Functional, (2, 8, 8)),
    "residual": (lambda: ResNetLike(2, 4, 5), (2, 8, 8)),
    "conv2d-bn-pool-dense": (lambda: nn.Sequential(
        nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 5, (3, 2), stride=(1, 2)), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 2 * 2, 6)), (3, 8, 8)),
    "depthwise-avgpool-gap": (lambda: nn.Sequential(
        nn.ZeroPad2d((1, 0, 2, 1)), nn.Conv2d(3, 3, 3, groups=3), nn.ReLU(), nn.AvgPool2d(2),
        nn.Conv2d(3, 6, 1), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(6, 4)), (3, 8, 8)),
    "conv1d-maxpool": (lambda: nn.Sequential(
        nn.Conv1d(2, 5, 5, stride=2, padding=2), nn.BatchNorm1d(5), nn.ReLU(), nn.MaxPool1d(2),
        nn.Conv1d(5, 4, 3, padding="same"), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 5, 3)), (2, 20)),
    "leaky": (lambda: nn.Sequential(nn.Conv2d(1, 3, 3), nn.LeakyReLU(0.125), nn.Flatten(), nn.Linear(3 * 4 * 4, 4)),
              (1, 6, 6)),
    "mlp-bn-folded": (lambda: nn.Sequential(
        nn.Linear(10, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.5), nn.Linear(8, 3), nn.Softmax(dim=1)), (10,)),
}


@pytest.mark.parametrize("name", NETS)
def test_float_graph_equals_pytorch(name):
    """The converted float graph (channels-last, Dense columns permuted) computes what the
    PyTorch module computes, for every supported layer and layout (up to float rounding)."""
    make, shape = NETS[name]
    torch.manual_seed(1)
    net = _random_init(make())
    x = np.random.default_rng(0).standard_normal((7, *shape)).astype(np.float32)
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    if isinstance(net, nn.Sequential) and isinstance(net[-1], nn.Softmax):  # dropped on import: tinytrain's loss head replaces it
        with torch.no_grad():
            want = net[:-1](torch.from_numpy(x)).numpy()
    ops, in_shape = torch_graph(net, x[:1])
    built = ir.to_model(ops, in_shape)
    xl = np.moveaxis(x, 1, -1) if x.ndim > 2 else x
    got = ir.float_forward(built.ops, xl.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    # and the ONNX of the same module gives the same float graph and the same integer model
    ops2, in_shape2 = onnx_graph(_onnx_of(net, x[:1], training=torch.onnx.TrainingMode.PRESERVE))
    built2 = ir.to_model(ops2, in_shape2)
    assert in_shape2 == in_shape
    np.testing.assert_allclose(ir.float_forward(built2.ops, xl.astype(np.float64)), want, rtol=1e-4, atol=1e-5)
    assert built2.model.state_hash() == built.model.state_hash()


def test_onnx_matmul_add_and_gemm_attributes():
    """MatMul + Add is a Linear; Gemm with transB 0, alpha and beta; a final Softmax is dropped."""
    from onnx import TensorProto, helper, numpy_helper
    rng = np.random.default_rng(0)
    w1, b1, w2, b2 = (rng.standard_normal(s).astype(np.float32) for s in ((6, 5), (5,), (5, 3), (3,)))
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h2"]),
         helper.make_node("Relu", ["h2"], ["h3"]),
         helper.make_node("Gemm", ["h3", "w2", "b2"], ["z"], alpha=0.5, beta=2.0),
         helper.make_node("Softmax", ["z"], ["y"], axis=1)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        [numpy_helper.from_array(v, n) for v, n in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))])
    ops, shape = onnx_graph(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert shape == (6,) and [o.kind for o in ops] == ["dense", "relu", "dense"]
    x = rng.standard_normal((4, 6))
    want = 0.5 * np.maximum(x @ w1 + b1, 0) @ w2 + 2.0 * b2
    np.testing.assert_allclose(ir.float_forward(ops, x), want, rtol=1e-5, atol=1e-5)


def test_cli_input_scale_and_fold_batchnorm(digits, digits_image, w3_torch, tmp_path, capsys):
    """--input-scale: a model trained on pixels / 10 (not a power of two) imports exactly;
    --fold-batchnorm: no BatchNorm layer left, accuracy kept."""
    torch.manual_seed(0)
    net = ttt.digits_mlp()
    ttt.train(net, ttt.dataset_inputs(digits, input_scale=0.1, quantized=False), digits.y_train, 10)
    pt = tmp_path / "w1.pt"
    torch.save(net, pt)
    assert cli.main(["import", str(pt), "--data", "digits", "--out", str(tmp_path / "a.tt"), "--input-scale", "0.1",
                     "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    acc = ttt.accuracy(net, ttt.dataset_inputs(digits, "test", input_scale=0.1, quantized=False), digits.y_test)
    assert rep["float_accuracy"] == acc and abs(rep["integer_accuracy"] - acc) <= 0.01
    torch.save(w3_torch, pt)
    assert cli.main(["import", str(pt), "--data", "digits-image", "--out", str(tmp_path / "b.tt"), "--fold-batchnorm",
                     "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert "batchnorm" not in [l["type"] for l in rep["layers"]]
    assert rep["float_accuracy"] - rep["integer_accuracy"] <= 0.01


def test_residual_block_imports_trains_and_exports(digits_image, tmp_path):
    """x + f(x) becomes tinytrain's Residual: PTQ within a point, generated C equal to the
    simulator, and the ONNX export agreeing with it."""
    torch.manual_seed(0)
    net = ResNetLike()
    ttt.train(net, ttt.dataset_inputs(digits_image, quantized=False), digits_image.y_train, 5)
    m = tt.from_torch(net, None, dataset=digits_image)
    assert [l.kind for l in m.layers][:4] == ["conv2d", "batchnorm", "relu", "residual"]
    r = m.import_report
    assert r["float_accuracy"] - r["integer_accuracy"] <= 0.01, r
    path = tmp_path / "res.tt"
    tt.save(m, path)
    assert cli.main(["verify", "--board", "host", "--model", str(path), "--steps", "20"]) == 0
    onx = tmp_path / "res.onnx"
    tt.to_onnx(m, onx)
    logits = ort.InferenceSession(str(onx)).run(None, {"input": digits_image.float_x_test})[0]
    assert np.mean(logits.argmax(1) == Simulator(m).predict(digits_image.x_test)) >= 0.99


def test_fold_batchnorm_keeps_the_function():
    make, shape = NETS["conv2d-bn-pool-dense"]
    net = _random_init(make())
    x = np.random.default_rng(2).standard_normal((5, *shape)).astype(np.float32)
    ops, s = torch_graph(net, x[:1], fold_batchnorm=True)
    assert "batchnorm" not in [o.kind for o in ops]
    got = ir.float_forward(ir.to_model(ops, s).ops, np.moveaxis(x, 1, -1).astype(np.float64))
    with torch.no_grad():
        np.testing.assert_allclose(got, net(torch.from_numpy(x)).numpy(), rtol=1e-4, atol=1e-5)


def test_oversized_weights_are_scaled_by_a_power_of_two(digits):
    """A layer whose weights outgrow its int16 range is stored scaled by 2^-k (ReLU commutes
    with the scale, the next layer's bias carries it): no saturation, the same predictions."""
    torch.manual_seed(0)
    net = ttt.digits_mlp()
    ttt.train(net, ttt.dataset_inputs(digits, quantized=False), digits.y_train, 3)
    big = ttt.digits_mlp()
    big.load_state_dict(net.state_dict())
    with torch.no_grad():  # the same function: hidden layer x 64, output weights / 64
        big[0].weight.mul_(64)
        big[0].bias.mul_(64)
        big[2].weight.div_(64)
    m1 = tt.from_torch(net, None, dataset=digits)
    m2 = tt.from_torch(big, None, dataset=digits)
    l0 = m2.import_report["layers"][0]
    assert l0["weight_shift"] >= 5 and l0["param_saturations"] == 0
    assert m2.import_report["float_accuracy"] == m1.import_report["float_accuracy"]
    agree = np.mean(Simulator(m2).predict(digits.x_test) == Simulator(m1).predict(digits.x_test))
    assert agree >= 0.99


# ------------------------------------------------------------------ PTQ targets

def test_w3_ptq_within_one_point(w3_torch, digits_image):
    """W3 trained 20 epochs in PyTorch float, imported: integer accuracy within 1.0 point of the
    float model, which the float graph reproduces exactly."""
    m = tt.from_torch(w3_torch, None, dataset=digits_image)
    r = m.import_report
    acc = ttt.accuracy(w3_torch, ttt.dataset_inputs(digits_image, "test", quantized=False), digits_image.y_test)
    assert r["float_accuracy"] == acc and acc > 0.95
    assert r["float_accuracy"] - r["integer_accuracy"] <= 0.010, r
    assert [l["type"] for l in r["layers"]] == [l.kind for l in m.layers]
    assert all(l["rel_rms_error"] < 0.1 for l in r["layers"]), r["layers"]


def test_onnx_import_equals_torch_import(w3_torch, digits_image):
    x = ttt.dataset_inputs(digits_image, quantized=False)[:1]
    mt = tt.from_torch(w3_torch, None, dataset=digits_image)
    mo = tt.from_onnx(_onnx_of(w3_torch, x, training=torch.onnx.TrainingMode.PRESERVE),
                      dataset=digits_image)
    assert mo.state_hash() == mt.state_hash()
    folded = tt.from_onnx(_onnx_of(w3_torch, x), dataset=digits_image)  # the exporter folds BatchNorm
    assert "batchnorm" not in [l.kind for l in folded.layers]
    assert folded.import_report["float_accuracy"] - folded.import_report["integer_accuracy"] <= 0.010


# ------------------------------------------------------------------ the CLI, then train/codegen/verify

def test_cli_import_then_train_codegen_verify(w3_torch, digits_image, tmp_path, capsys):
    pt = tmp_path / "w3.pt"
    torch.save(w3_torch, pt)
    out = tmp_path / "w3.tt"
    assert cli.main(["import", str(pt), "--data", "digits-image", "--out", str(out), "--calibrate", "50",
                     "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)  # pure JSON
    assert rep["calibration_samples"] == 50 and rep["out"] == str(out)
    assert rep["float_accuracy"] - rep["integer_accuracy"] <= 0.010
    model, extra = tt.load(out)
    assert extra["dataset"] == "digits-image" and f"{model.state_hash():08x}" == rep["state_hash"]
    assert tt.evaluate(model, digits_image)["accuracy"] == rep["integer_accuracy"]
    tuned = tmp_path / "tuned.tt"
    assert cli.main(["train", "--data", "digits-image", "--model", str(out), "--epochs", "1", "--out", str(tuned),
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_accuracy"] > 0.95
    assert cli.main(["codegen", "--model", str(out), "--out", str(tmp_path / "gen")]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--board", "host", "--model", str(out), "--steps", "50", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["mismatches"] == 0 and r["steps"] == 50
    assert cli.main(["federate", "--simulated", "2", "--rounds", "1", "--model", str(out), "--data", "digits-image",
                     "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["final_accuracy"] > 0.95


def test_cli_import_human_report(w3_torch, tmp_path, capsys):
    pt = tmp_path / "w3.pt"
    torch.save(w3_torch, pt)
    assert cli.main(["import", str(pt), "--data", "digits-image", "--out", str(tmp_path / "m.tt")]) == 0
    out = capsys.readouterr().out
    assert "rel. RMS error" in out and "accuracy on digits-image test: float" in out


# ------------------------------------------------------------------ export

@pytest.mark.parametrize("qdq", [False, True])
def test_export_w1_agrees_with_the_simulator(digits, tmp_path, capsys, qdq):
    m = tt.build_model("digits-mlp", digits, seed=0)
    tt.fit(m, digits, epochs=5, seed=0)
    path = tmp_path / "m.tt"
    tt.save(m, path)
    onx = tmp_path / "w1.onnx"
    argv = ["export", "--model", str(path), "--onnx", str(onx), "--json"] + (["--qdq"] if qdq else [])
    assert cli.main(argv) == 0
    info = json.loads(capsys.readouterr().out)
    assert "2^" in info["input_scaling"]
    props = {p.key: p.value for p in onnx.load(str(onx)).metadata_props}
    assert int(props["tinytrain.data_input_exp"]) == digits.input_exp
    logits = ort.InferenceSession(str(onx)).run(None, {"input": digits.float_x_test})[0]
    agree = np.mean(logits.argmax(1) == Simulator(m).predict(digits.x_test))
    assert agree >= 0.99, agree


def test_export_w3_agrees_with_the_simulator(w3_torch, digits_image, tmp_path):
    m = tt.from_torch(w3_torch, None, dataset=digits_image)
    tt.fit(m, digits_image, epochs=1, seed=0)  # trained on in integers, then exported
    for qdq in (False, True):
        onx = tmp_path / f"w3{qdq}.onnx"
        tt.to_onnx(m, onx, qdq=qdq)
        logits = ort.InferenceSession(str(onx)).run(None, {"input": digits_image.float_x_test})[0]
        agree = np.mean(logits.argmax(1) == Simulator(m).predict(digits_image.x_test))
        assert agree >= 0.99, (qdq, agree)


def test_export_qdq_holds_the_integers(digits):
    m = tt.build_model("digits-mlp", digits, seed=3)
    onx = tt.to_onnx(m, qdq=True)
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in onx.graph.initializer}
    q = [v for k, v in inits.items() if k.startswith("l0_w_q")][0]
    np.testing.assert_array_equal(q, m.layers[0].params[0].data)


# ------------------------------------------------------------------ QAT

@pytest.mark.parametrize("name", ["w1", "w3"])
def test_qat_integer_equals_qat_model(name, digits, digits_image):
    """The classic schedule (float warm-up, fake-quant training, BN frozen half way) and the
    conversion: the integer model's accuracy equals the QAT model's within 0.3 point."""
    ds = digits if name == "w1" else digits_image
    torch.manual_seed(0)
    net = ttt.digits_mlp() if name == "w1" else ttt.digits_cnn()
    q = ttt.qat(net, ds, float_epochs=5, qat_epochs=5, seed=0)
    qacc = ttt.accuracy(q, ttt.dataset_inputs(ds, "test"), ds.y_test)
    m = ttt.convert(q, ds)
    iacc = tt.evaluate(m, ds)["accuracy"]
    assert abs(iacc - qacc) <= 0.003, (qacc, iacc)
    assert qacc > 0.9


def test_fake_quant_act_is_tinytrains_requantization():
    """fake_quant_act on an integer accumulator equals requant_s8 (dynamic exponent, ties up)."""
    from tinytrain.ops._common import requant_s8
    rng = np.random.default_rng(0)
    for _ in range(50):
        acc = rng.integers(-2**20, 2**20, size=(1, 37))
        acc[0, 0] = rng.choice([255, 256, 257, -256, 2**17 + 2**9])  # edges: powers of two, ties
        y, ey, _ = requant_s8(acc[0], -12)
        got = ttt.fake_quant_act(torch.from_numpy(acc.astype(np.float64) * 2.0**-12)).numpy()[0]
        np.testing.assert_array_equal(got, y.astype(np.float64) * 2.0**ey)


# ------------------------------------------------------------------ TFLite

def _tflite_of(net, x_channels_first, int8=True) -> bytes:
    from tinytrain.interop.tflite_writer import write_tflite
    ops, shape = torch_graph(net, x_channels_first[:1])
    xl = np.moveaxis(x_channels_first, 1, -1) if x_channels_first.ndim > 2 else x_channels_first
    return write_tflite(ir.to_model(ops, shape).ops, xl, int8=int8)


def test_tflite_int8_w1_matches_the_interpreter_then_trains(digits, tmp_path, capsys):
    """An int8 .tflite of W1 (per-channel weight scales, written with the flatbuffer schema)
    imports, predicts what the TFLite interpreter predicts on >= 99 % of the test set, and
    trains on (CLI import, then train)."""
    from tinytrain.interop.tflite_writer import run_interpreter

    torch.manual_seed(0)
    net = ttt.digits_mlp()
    x = ttt.dataset_inputs(digits, quantized=False)
    ttt.train(net, x, digits.y_train, 20)
    buf = _tflite_of(net, x)
    lite = run_interpreter(buf, ttt.dataset_inputs(digits, "test", quantized=False)).argmax(1)
    m = tt.from_tflite(buf, dataset=digits)
    agree = np.mean(Simulator(m).predict(digits.x_test) == lite)
    assert agree >= 0.99, agree
    path = tmp_path / "w1.tflite"
    path.write_bytes(buf)
    out = tmp_path / "w1.tt"
    assert cli.main(["import", str(path), "--data", "digits", "--out", str(out), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["integer_accuracy"] == tt.evaluate(m, digits)["accuracy"]
    assert cli.main(["train", "--data", "digits", "--model", str(out), "--epochs", "2", "--out",
                     str(tmp_path / "t.tt"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["test_accuracy"] >= rep["integer_accuracy"] - 0.02


def test_tflite_cnn_layouts(digits_image):
    """A CNN with conv, depthwise, max and average pooling, 1x1 conv, reshape and dense: its
    float .tflite computes what PyTorch computes (the writer's layout), the importer's float
    graph of it too (the reader's), and the int8 file imports to a model that agrees with the
    interpreter on >= 98 % of the test set."""
    from tinytrain.interop.tflite_import import tflite_graph
    from tinytrain.interop.tflite_writer import run_interpreter

    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 8, 3, padding=1, groups=8), nn.ReLU(), nn.AvgPool2d(2), nn.Conv2d(8, 16, 1),
                        nn.ReLU(), nn.Flatten(), nn.Linear(64, 10))
    x = ttt.dataset_inputs(digits_image, quantized=False)
    ttt.train(net, x, digits_image.y_train, 5)
    xt = ttt.dataset_inputs(digits_image, "test", quantized=False)
    with torch.no_grad():
        want = net.eval()(torch.from_numpy(xt)).numpy()
    flt = _tflite_of(net, x, int8=False)
    np.testing.assert_allclose(run_interpreter(flt, np.moveaxis(xt, 1, -1)), want, rtol=1e-4, atol=1e-4)
    ops, shape = tflite_graph(flt)
    assert shape == (8, 8, 1) and [o.kind for o in ops][:4] == ["conv2d", "relu", "maxpool2d", "depthwise_conv2d"]
    np.testing.assert_allclose(ir.float_forward(ops, np.moveaxis(xt, 1, -1).astype(np.float64)), want,
                               rtol=1e-4, atol=1e-4)
    q = _tflite_of(net, x)
    lite = run_interpreter(q, np.moveaxis(xt, 1, -1)).argmax(1)
    m = tt.from_tflite(q, dataset=digits_image)
    assert np.mean(Simulator(m).predict(digits_image.x_test) == lite) >= 0.98


# ------------------------------------------------------------------ the board

def _needs_qemu(f):
    from tests.test_bad_input import qemu  # the qemu marker, skipped only without the tools
    for mark in qemu:
        f = mark(f)
    return f


@_needs_qemu
def test_imported_w3_verifies_bit_exact_on_qemu_m4(w3_torch, digits_image, tmp_path, capsys):
    """The PTQ import of W3 trains on the emulated Cortex-M4 to the simulator's state, step by step."""
    pt = tmp_path / "w3.pt"
    torch.save(w3_torch, pt)
    out = tmp_path / "w3.tt"
    assert cli.main(["import", str(pt), "--data", "digits-image", "--out", str(out), "--json"]) == 0
    capsys.readouterr()
    assert cli.main(["verify", "--board", "mps2_an386", "--model", str(out), "--steps", "100", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["mismatches"] == 0 and r["steps"] == 100 and r["board"] == "mps2_an386"


@_needs_qemu
def test_pretrain_then_adapt_example_runs():
    """examples/pretrain_then_adapt.py end to end, shortened: import, QEMU verify, three partial
    updates with their RAM, the adapted model verified on QEMU."""
    import subprocess
    import sys
    from pathlib import Path

    ex = Path(__file__).resolve().parent.parent / "examples" / "pretrain_then_adapt.py"
    r = subprocess.run([sys.executable, str(ex), "--pretrain-epochs", "3", "--epochs", "1", "--steps", "20"],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("0 mismatches with the simulator") == 2, r.stdout
    rows = [line.split() for line in r.stdout.splitlines() if line.strip().startswith(("bias ", "last:1 ", "all "))]
    assert [row[0] for row in rows] == ["bias", "last:1", "all"]
    ram = {row[0]: int(row[5].replace(",", "")) for row in rows}
    assert ram["last:1"] < ram["all"]
