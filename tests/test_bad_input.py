"""Bad input, one table: every row runs the CLI in process and must exit 2 with ONE line on
stderr naming the problem (the row's substring), no internal error, no traceback, and no
file left behind or changed. A new field, option or command gets its cases by adding rows.

A row: (id, argv, expected substring, files to create in the working folder, setup). Files
are {name: bytes | str | dict (written as JSON)}; setup(tmp_path, monkeypatch) runs before
the command (patching PATH, making an existing model, ...). Rows that need QEMU carry the
``qemu`` marker and are skipped without the tools.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tinytrain import cli

TRAIN = ["train", "--data", "digits", "--model"]
PARETO = ["pareto", "--model", "digits-mlp", "--board", "microbit"]
DENSE10 = {"layers": [{"type": "dense", "units": 10}]}


def spec(layers=None, **top):
    """A model description: DENSE10 with extra top-level keys, or other layers."""
    return {"layers": layers if layers is not None else DENSE10["layers"], **top}


def opt(**o):
    return spec(optimizer=o)


def latin1(text: str) -> bytes:
    return text.encode("latin-1")


CSV_OK = "1,2,0\n3,4,1\n5,6,0\n7,8,1\n9,10,0\n"


def no_tool_on_path(tmp_path, monkeypatch):
    """PATH with nothing on it: no gcc, no qemu-system-arm, no arm-none-eabi-gcc."""
    empty = tmp_path.parent / f"{tmp_path.name}-emptybin"
    empty.mkdir(exist_ok=True)
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)


def saved_with_minimum(tmp_path, monkeypatch):
    """m.tt: W1 with one int16 weight at -32768 (outside the symmetric range; save does not check)."""
    from tinytrain import data
    from tinytrain.graph import io
    from tinytrain.graph.models import build_model

    m = build_model("digits-mlp", data.load("digits"), seed=0)
    m.layers[2].params[0].data[3, 5] = -32768
    io.save(m, tmp_path / "m.tt")


def saved_model(name, model="digits-mlp"):
    def setup(tmp_path, monkeypatch):
        assert cli.main(["train", "--data", "digits", "--model", model, "--epochs", "0", "--out",
                         str(tmp_path / name)]) == 0
    return setup


def disk_full(tmp_path, monkeypatch):
    def fsync(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(os, "fsync", fsync)


def _missing_tools():  # as in test_device_qemu.py
    missing = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        missing.append("platformio")
    return missing


qemu = [pytest.mark.qemu, pytest.mark.skipif(bool(_missing_tools()), reason=f"missing: {', '.join(_missing_tools())}")]


# ---- import/export sources (the interop extra: torch, onnx; CI installs it)

def onnx_file(name, kind):
    """An ONNX file that cannot be imported: an unsupported op, a dynamic shape, a missing weight."""
    def setup(tmp_path, monkeypatch):
        import onnx
        from onnx import TensorProto, helper, numpy_helper
        dims = ["N", "K"] if kind == "dynamic" else ["N", 64]
        inits = [numpy_helper.from_array(np.zeros((10, 64), np.float32), "W"),
                 numpy_helper.from_array(np.zeros(10, np.float32), "B")]
        if kind == "missing-weight":
            inits = inits[1:]
        nodes = [helper.make_node("Gemm", ["x", "W", "B"], ["h"], name="fc", transB=1)]
        nodes.append(helper.make_node("Sigmoid" if kind == "unsupported" else "Relu", ["h"], ["y"], name="act"))
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 10])], inits)
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), str(tmp_path / name))
    return setup


def torch_file(name, kind):
    """A .pt that cannot be imported: an unsupported layer, a state_dict, a model for other data."""
    def setup(tmp_path, monkeypatch):
        import torch
        from torch import nn
        net = {"unsupported": lambda: nn.Sequential(nn.Linear(64, 10), nn.Sigmoid()),
               "state-dict": lambda: nn.Linear(64, 10).state_dict(),
               "shape": lambda: nn.Sequential(nn.Linear(40, 10)),
               "branch": lambda: Branchy()}[kind]()
        torch.save(net, tmp_path / name)
    return setup


try:
    from torch import nn as _nn

    class Branchy(_nn.Module):  # module level: torch.save pickles it by reference
        def __init__(self):
            super().__init__()
            self.a, self.b = _nn.Linear(64, 10), _nn.Linear(64, 10)

        def forward(self, x):
            return self.a(x) + self.b(x)
except ImportError:  # the interop extra is missing: the import rows fail, loudly
    Branchy = None

IMPORT = ["import", "m.onnx", "--data", "digits", "--out", "out.tt"]


def compress_toml(*stages: str) -> str:
    """A compress schedule (docs/compress.md) for W1 with these [[stage]] bodies."""
    return 'model = "digits-mlp"\n' + "".join(f"[[stage]]\n{s}\n" for s in stages)


COMPRESS = ["compress", "--schedule", "s.toml", "--out", "c"]
TRAIN2 = 'kind = "train"\nepochs = 1'

R = pytest.param
ROWS = [
    # ---- argparse's own usage errors: one line too, with the way to --help
    R(["info", "m.tt", "--samples", "0"], "argument --samples: expected a positive integer, got '0' (see `tinytrain info --help`)",
      {}, None, id="usage-bad-type"),
    R(["boards", "--bogus"], "unrecognized arguments: --bogus (see `tinytrain --help`)", {}, None, id="usage-unknown-option"),
    R(["train", "--data", "digits"], "required: --model (see `tinytrain train --help`)", {}, None, id="usage-missing-required"),
    # ---- model files (.tt): wrong magic, empty, not a model, a directory
    R(["verify", "--board", "host", "--model", "bad.tt"], "bad.tt: not a tinytrain model file (wrong magic",
      {"bad.tt": b"\xff\xfe\x00junk" * 8}, None, id="tt-wrong-magic-verify"),
    R([*TRAIN, "bad.tt"], "bad.tt: not a tinytrain model file (wrong magic", {"bad.tt": b"\xff\xfe\x00junk" * 8},
      None, id="tt-wrong-magic-train"),
    R(["eval", "--model", "bad.tt", "--data", "digits"], "not a tinytrain model file", {"bad.tt": '{"layers": []}'},
      None, id="tt-json-eval"),
    R(["info", "bad.tt"], "not a tinytrain model file", {"bad.tt": b"\xff\xfe\x00junk" * 8}, None, id="tt-wrong-magic-info"),
    R([*TRAIN, "empty.tt"], "empty.tt: empty file (0 bytes)", {"empty.tt": b""}, None, id="tt-empty-train"),
    R(["verify", "--board", "host", "--model", "empty.tt"], "empty file (0 bytes)", {"empty.tt": b""}, None,
      id="tt-empty-verify"),
    R(["eval", "--model", "missing.tt", "--data", "digits"], "no such model file", {}, None, id="tt-missing-eval"),
    R(["info", "missing.tt"], "no such model file", {}, None, id="tt-missing-info"),
    R(["info", "sub"], "sub is a directory", {"sub/x": ""}, None, id="tt-directory-info"),
    # ---- model descriptions (.json/.toml): syntax, encoding, every field's type and range
    R([*TRAIN, "m.json"], "units = true must be a positive integer", {"m.json": spec([{"type": "dense", "units": True}])},
      None, id="units-true"),
    R([*TRAIN, "m.json"], 'units = "10" must be a positive integer', {"m.json": spec([{"type": "dense", "units": "10"}])},
      None, id="units-string"),
    R([*TRAIN, "m.json"], "dense needs units", {"m.json": spec([{"type": "dense"}])}, None, id="units-missing"),
    R([*TRAIN, "m.json"], "alpha = 2 must be a number in (0, 1)",
      {"m.json": spec([{"type": "dense", "units": 8}, {"type": "leaky_relu", "alpha": 2}, {"type": "dense", "units": 10}])},
      None, id="leaky-alpha-range"),
    R([*TRAIN, "m.json"], "rounds to 0/256",
      {"m.json": spec([{"type": "dense", "units": 8}, {"type": "leaky_relu", "alpha": 0.001}, {"type": "dense", "units": 10}])},
      None, id="leaky-alpha-too-small"),
    R(["precision-lab", "--workload", "w1", "--recipe", "fp4"], "unknown recipe 'fp4'", {}, None, id="lab-unknown-recipe"),
    R(["precision-lab", "--workload", "w2-pool"], "--workload 'w2-pool' is not a workload: use one of w1, w2, w2-strided, w3", {}, None, id="lab-unknown-workload"),
    # ---- precision policies (docs/precision.md)
    R([*TRAIN, "digits-mlp", "--precision", '{"weights": "int4"}'], 'int4 weights need a finer exponent than one per '
      'tensor: add "exponent": "row" or "block32"', {}, None, id="precision-int4-tensor-exponent"),
    R([*TRAIN, "digits-mlp", "--precision", '{"weights": "int4", "exponent": "row"}'],
      'from an int16 master copy, and master is \'none\': use "master": "int16"', {}, None, id="precision-int4-no-master"),
    R([*TRAIN, "digits-mlp", "--precision", '{"weights": "int4", "exponent": "block32", "master": "int32"}'],
      'use "master": "int16"', {}, None, id="precision-block32-master32"),
    R([*TRAIN, "digits-mlp", "--precision", '{"weights": "int4", "exponent": "row", "master": "int16", "momentum": "int4"}'],
      'momentum = "int4" must be one of', {}, None, id="precision-int4-momentum"),
    R([*TRAIN, "digits-mlp", "--precision", '{"momentum": "int8", "master": "int32"}'],
      'momentum = "int8" has no int8 store to follow: an int32 master keeps int32 momentum', {}, None,
      id="precision-int8-momentum-master32"),
    R([*TRAIN, "digits-mlp", "--precision", '{"momentum": "int8", "rounding": "nearest"}'],
      'momentum = "int8" stores its slot with stochastic rounding', {}, None, id="precision-int8-momentum-nearest"),
    R([*TRAIN, "m.json"], 'precision momentum = "int8" with optimizer.master_weights',
      {"m.json": spec(precision={"momentum": "int8"}, optimizer={"lr": 0.05, "momentum": 0.9, "master_weights": True})},
      None, id="precision-int8-momentum-master-weights"),
    R([*TRAIN, "digits-mlp", "--precision", '{"exponent": "row", "master": "int32"}'],
      "is for int8 or int4 weights", {}, None, id="precision-row-int16-weights"),
    R(["train", "--data", "digits-image", "--model", "digits-cnn", "--precision", "int4-row-master16"],
      'is implemented for dense layers only: give this layer "precision"', {}, None, id="precision-row-on-conv"),
    R([*TRAIN, "digits-mlp", "--precision", '{"weights": "int8", "rounding": "nearest"}'],
      'cannot train with rounding = "nearest"', {}, None, id="precision-int8-nearest"),
    R([*TRAIN, "digits-mlp", "--precision", "int16-bias16", "--prune",
       '{"schedule": "one_shot", "final_sparsity": 0.5, "storage": "sparse"}'],
      'prune: storage = "sparse": layer 0 (dense): sparse storage needs an int32 bias', {}, None,
      id="precision-bias16-sparse-storage"),
    R([*TRAIN, "digits-mlp", "--precision", '{"activations": "int16"}'],
      'activations = "int16" with errors = "int8": the kernels take both at one width', {}, None,
      id="precision-activations-int16-alone"),
    R(["train", "--data", "digits-image", "--model", "m.json", "--precision", "int16-act16"],
      'layer 1 (residual): precision activations = "int16" is implemented for avgpool2d, batchnorm, conv1d, conv2d, dense, depthwise_conv2d, flatten, global_avgpool, leaky_relu, maxpool1d, maxpool2d, relu layers only',
      {"m.json": spec([{"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"},
                       {"type": "residual", "layers": [{"type": "conv2d", "filters": 4, "kernel": 3, "padding": "same"}]},
                       {"type": "flatten"}, {"type": "dense", "units": 10}])}, None, id="precision-act16-on-residual"),
    R([*TRAIN, "digits-mlp", "--precision", "{weights: int8}"], "--precision: not valid JSON", {}, None,
      id="precision-bad-json"),
    R(["verify", "--board", "host", "--model", "digits-mlp", "--steps", "1", "--reference", "--checker", "reference"],
      "with --checker reference it is already what the target is compared with: drop --reference", {}, None,
      id="verify-reference-twice"),
    R(["verify", "--board", "host", "--model", "digits-mlp", "--precision", "int3", "--steps", "1"],
      "unknown preset 'int3'", {}, None, id="precision-unknown-preset"),
    R([*TRAIN, "m.json"], "precision: unknown key(s) weight: known keys are", {"m.json": spec(precision={"weight": "int8"})},
      None, id="precision-unknown-key"),
    R([*TRAIN, "m.json"], 'dense precision: master = "int64" must be one of',
      {"m.json": spec([{"type": "dense", "units": 10, "precision": {"master": "int64"}}])}, None, id="precision-layer-value"),
    R([*TRAIN, "m.json"], "master = 'int16' is not wider than the int16 weights",
      {"m.json": spec(precision={"master": "int16"})}, None, id="precision-master-not-wider"),
    # ---- loss scale (docs/precision.md "loss_scale")
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": "gradscaler"}'],
      "loss_scale: mode = 'gradscaler' must be one of dynamic, global, static", {}, None, id="loss-scale-unknown-mode"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": {"mode": "global", "init": 7}}'],
      "loss_scale: unknown key(s) init: known keys are mode, init_scale", {}, None, id="loss-scale-unknown-key"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": "global:init_scale=40"}'],
      "init_scale = 40 must lie in min_scale .. max_scale", {}, None, id="loss-scale-out-of-range"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": "static:init_scale=6,growth_interval=9"}'],
      'mode "static" has a fixed exponent and takes only init_scale', {}, None, id="loss-scale-static-growth"),
    R([*TRAIN, "m.json"], "loss_scale is one scale for the whole model: move it to the model's",
      {"m.json": spec([{"type": "dense", "units": 10, "precision": {"loss_scale": "global"}}])}, None,
      id="loss-scale-layer-override"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": "global:init_scale=3,init_scale=4"}'],
      "loss_scale: init_scale is given twice in 'global:init_scale=3,init_scale=4': keep one", {}, None,
      id="loss-scale-key-twice"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": {"init_scale": 5}}'],
      'loss_scale: the object has no "mode": add "mode": "global"', {}, None, id="loss-scale-no-mode"),
    R([*TRAIN, "m.json"], "loss_scale: growth_interval = [1] must be an integer (a count of steps)",
      {"m.json": spec(precision={"loss_scale": {"mode": "global", "growth_interval": [1]}})}, None,
      id="loss-scale-interval-list"),
    R([*TRAIN, "digits-mlp", "--precision", '{"loss_scale": {"mode": "global", "init_scale": true}}'],
      "loss_scale: init_scale = true must be an integer (an exponent of two)", {}, None, id="loss-scale-init-bool"),


    # ---- pruning (docs/pruning.md): the model file's "prune" object, a layer's, and --prune
    R([*TRAIN, "m.json"], "end_step = 5 is begin_step = 10: the schedule ends before it begins",
      {"m.json": spec(prune={"schedule": "polynomial", "final_sparsity": 0.5, "begin_step": 10, "end_step": 5})},
      None, id="prune-ends-before-begin"),
    R([*TRAIN, "m.json"], "prune: final_sparsity = 1 must be a number in [0, 1)",
      {"m.json": spec(prune={"schedule": "one_shot", "final_sparsity": 1})}, None, id="prune-sparsity-one"),
    R([*TRAIN, "m.json"], "dense: prune: initial_sparsity = -0.2 must be a number in [0, 1)",
      {"m.json": spec([{"type": "dense", "units": 10, "prune": {"schedule": "polynomial", "final_sparsity": 0.5,
                                                                  "initial_sparsity": -0.2, "end_step": 9}}])},
      None, id="prune-layer-sparsity-negative"),
    R([*TRAIN, "m.json"], "prune: unknown key(s) sparsity",
      {"m.json": spec(prune={"schedule": "one_shot", "sparsity": 0.5})}, None, id="prune-unknown-key"),
    R([*TRAIN, "m.json"], 'prune: schedule = "agp" must be one of "constant", "polynomial", "one_shot"',
      {"m.json": spec(prune={"schedule": "agp", "final_sparsity": 0.5})}, None, id="prune-unknown-schedule"),
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "polynomial", "final_sparsity": 0.5, "begin_step": 3, '
       '"end_step": 3}'], "end_step = 3 must come after begin_step = 3", {}, None, id="prune-cli-empty-span"),
    R([*TRAIN, "digits-mlp", "--prune", "{schedule: polynomial}"], "--prune: invalid JSON", {}, None,
      id="prune-cli-bad-json"),
    R(["sensitivity", "--model", "digits-mlp", "--levels", "0.5,1"], "each sparsity level must be in [0, 1), got 1.0",
      {}, None, id="sensitivity-level-one"),
    R(["sensitivity", "--model", "digits-mlp", "--levels", "half"], "--levels 'half': give numbers in [0, 1)",
      {}, None, id="sensitivity-level-text"),
    R([*TRAIN, "m.json"], "layer 0 (relu): prune: this layer has no weights to prune",
      {"m.json": spec([{"type": "relu", "prune": {"schedule": "one_shot", "final_sparsity": 0.5}},
                       {"type": "dense", "units": 10}])}, None, id="prune-layer-without-weights"),
    # ---- structured pruning (docs/pruning.md, "Structured pruning") and `tinytrain shrink`
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "one_shot", "final_sparsity": 0.5, "structure": "rows"}'],
      'prune: structure = "rows" must be one of "weights", "neurons", "channels", "filters", "blocks"', {}, None,
      id="prune-unknown-structure"),
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "one_shot", "final_sparsity": 0.5, "structure": "blocks", '
       '"criterion": "gamma"}'], 'prune: criterion "gamma" ranks whole channels; blocks are ranked by their weights',
      {}, None, id="prune-blocks-gamma"),
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "one_shot", "final_sparsity": 0.5, "storage": "blocks"}'],
      'prune: storage = "blocks": layer 0 (dense): the blocks format holds layers pruned by 1 x 4 blocks', {}, None,
      id="prune-blocks-storage-without-blocks"),
    R([*TRAIN, "m.json"], 'layer 0 (dense): prune: structure "neurons": this layer cannot shrink: its units are '
      "the model's outputs", {"m.json": spec([{"type": "dense", "units": 10, "prune": {
          "schedule": "one_shot", "final_sparsity": 0.5, "structure": "neurons"}}])}, None, id="prune-neurons-output-layer"),
    R([*TRAIN, "m.json"], 'layer 0 (dense): prune: structure "channels" prunes conv1d and conv2d layers; for this '
      'layer use "neurons"', {"m.json": spec([{"type": "dense", "units": 8, "prune": {
          "schedule": "one_shot", "final_sparsity": 0.5, "structure": "channels"}}, {"type": "dense", "units": 10}])},
      None, id="prune-channels-on-dense"),
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "one_shot", "final_sparsity": 0.5, "criterion": "gamma"}'],
      "prune: criterion ranks the units of structured pruning", {}, None, id="prune-criterion-without-structure"),
    R([*TRAIN, "digits-mlp", "--prune", '{"schedule": "one_shot", "final_sparsity": 0.5, "structure": "neurons", '
       '"criterion": "gamma"}'], 'layer 0 (dense): prune: criterion "gamma" ranks the channels by the batch norm', {},
      None, id="prune-gamma-without-batchnorm"),
    R(["shrink", "--model", "m.tt", "--out", "s.tt"], "shrink: the model has no structured pruning", {},
      saved_model("m.tt"), id="shrink-not-structured"),
    R(["shrink", "--model", "m.tt", "--out", "m.tt"], "--out m.tt exists: pass --force", {}, saved_model("m.tt"),
      id="shrink-out-exists"),
    R(["shrink", "--model", "nosuch.tt", "--out", "s.tt"], "nosuch.tt: no such model file", {}, None,
      id="shrink-missing-model"),
    # ---- sparse storage of pruned layers (docs/pruning.md, "Sparse storage on the device")
    R([*TRAIN, "m.json"], 'prune: storage = "packed" must be one of "auto", "dense", "sparse"',
      {"m.json": spec(prune={"schedule": "one_shot", "final_sparsity": 0.5, "storage": "packed"})}, None,
      id="prune-storage-unknown"),
    R(["codegen", "--model", "m.json", "--out", "gen"], 'storage = "sparse": the pruning schedule still has events',
      {"m.json": spec(prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 5, "storage": "sparse"})},
      None, id="prune-storage-sparse-before-the-end"),
    R(["codegen", "--model", "m.json", "--out", "gen"],
      'storage = "rows": layer 2 (dense): the rows format takes at most 255 inputs (it has 300): use "bitmap"',
      {"m.json": spec([{"type": "dense", "units": 300}, {"type": "relu"}, {"type": "dense", "units": 10}],
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "storage": "rows"})},
      None, id="prune-storage-rows-too-wide"),
    R([*TRAIN, "m.json", "--out", "m.tt"],
      'prune: storage = "rows": layer 2 (dense): the rows format takes at most 255 inputs (it has 300): use "bitmap"',
      {"m.json": spec([{"type": "dense", "units": 300}, {"type": "relu"}, {"type": "dense", "units": 10}],
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "storage": "rows"})},
      None, id="prune-storage-rows-too-wide-train"),
    R([*TRAIN, "m.json", "--out", "m.tt"],
      'prune: storage = "bitmap": layer 0 (dense): sparse storage has no kernel for int8 momentum: use momentum "int32"',
      {"m.json": spec(precision={"momentum": "int8"}, optimizer={"lr": 0.01, "momentum": 0.9},
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "storage": "bitmap"})},
      None, id="prune-storage-int8-momentum-train"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--precision", "int8", "--prune",
       '{"schedule": "one_shot", "final_sparsity": 0.5, "storage": "rows"}'],
      'storage = "rows": layer 0 (dense): sparse storage needs int16 weights (a precision policy gives int8): use storage "auto"',
      {}, None, id="prune-storage-int8-weights-train"),
    R(["train", "--data", "digits-image", "--model", "digits-cnn", "--prune",
       '{"schedule": "one_shot", "final_sparsity": 0.5, "storage": "sparse"}'],
      'layer 0 (conv2d): sparse storage covers Dense weights only so far: use storage "auto"', {}, None,
      id="prune-storage-conv-train"),
    R(COMPRESS, 'stage 1 (prune): prune: storage = "bitmap": layer 0 (dense): sparse storage has no kernel for int8 momentum',
      {"m.json": spec(precision={"momentum": "int8"}, optimizer={"lr": 0.01, "momentum": 0.9}),
       "s.toml": 'model = "m.json"\n[[stage]]\nkind = "prune"\nepochs = 1\n'
                 'prune = {schedule = "one_shot", final_sparsity = 0.5, storage = "bitmap"}\n'},
      None, id="compress-storage-int8-momentum"),
    R(["info", "--model", "nosuch.tt", "--fixed-point"], "nosuch.tt", {}, None, id="info-fixed-point-missing-file"),
    R([*TRAIN, "m.json"], "unknown key(s) activation: known keys are units",
      {"m.json": spec([{"type": "dense", "units": 10, "activation": "relu"}])}, None, id="layer-unknown-key"),
    R([*TRAIN, "m.json"], "relu: unknown key(s) alpha: known keys are none",
      {"m.json": spec([{"type": "relu", "alpha": 0.1}, {"type": "dense", "units": 10}])}, None, id="relu-takes-nothing"),
    R([*TRAIN, "m.json"], 'kernel = "3" must be a positive integer or a list of two',
      {"m.json": spec([{"type": "conv2d", "filters": 4, "kernel": "3"}])}, None, id="conv2d-kernel-string"),
    R([*TRAIN, "m.json"], 'padding = "full" must be "valid", "same" or a list of 2',
      {"m.json": spec([{"type": "conv1d", "filters": 4, "padding": "full"}])}, None, id="conv1d-padding"),
    R([*TRAIN, "m.json"], 'momentum = "0.1" must be a number',
      {"m.json": spec([{"type": "batchnorm", "momentum": "0.1"}])}, None, id="batchnorm-momentum-string"),
    R([*TRAIN, "m.json"], "unknown layer type 'dense2'", {"m.json": spec([{"type": "dense2", "units": 10}])}, None,
      id="layer-unknown-type"),
    R([*TRAIN, "m.json"], "unknown key(s) activation: known keys are input_scale",
      {"m.json": spec(activation="relu")}, None, id="top-unknown-key"),
    R([*TRAIN, "m.json"], "seed = true must be an integer", {"m.json": spec(seed=True)}, None, id="top-seed-bool"),
    R([*TRAIN, "m.json"], "seed = -1 must be an integer >= 0", {"m.json": spec(seed=-1)}, None, id="top-seed-negative"),
    R([*TRAIN, "m.json"], "no 'layers'", {"m.json": {"optimizer": {"lr": 0.1}}}, None, id="top-no-layers"),
    R([*TRAIN, "m.json"], 'optimizer: stochastic_rounding = "false" must be true or false',
      {"m.json": opt(stochastic_rounding="false")}, None, id="stochastic-rounding-string"),
    R([*TRAIN, "m.json"], 'optimizer: master_weights = "no" must be true or false',
      {"m.json": opt(master_weights="no")}, None, id="master-weights-string"),
    R([*TRAIN, "m.toml"], 'master_weights = "true" must be true or false',
      {"m.toml": '[optimizer]\nmaster_weights = "true"\n[[layers]]\ntype = "dense"\nunits = 10\n'}, None,
      id="toml-bool-string"),
    R([*TRAIN, "m.json"], "train='last:0': K must be 1..1", {"m.json": opt(train="last:0")}, None, id="train-last-0"),
    R([*TRAIN, "m.json"], "train='last:99': K must be 1..1", {"m.json": opt(train="last:99")}, None, id="train-last-99"),
    R([*TRAIN, "m.json"], 'train = "last:x" must be', {"m.json": opt(train="last:x")}, None, id="train-last-x"),
    R([*TRAIN, "m.json"], "selects no trainable parameter", {"m.json": opt(train=[])}, None, id="train-empty-list"),
    R([*TRAIN, "m.json"], "step_size = 0 must be a positive integer", {"m.json": opt(schedule="step", step_size=0)},
      None, id="step-size-0"),
    R([*TRAIN, "m.json"], "total_steps = -5 must be an integer >= 1",
      {"m.json": opt(schedule="cosine", total_steps=-5)}, None, id="total-steps-negative"),
    R([*TRAIN, "m.json"], "learning rate 1e+12 is too large to train", {"m.json": opt(lr=1e12)}, None, id="lr-1e12"),
    R([*TRAIN, "m.json"], "lr = ", {"m.json": opt(lr=10**400)}, None, id="lr-beyond-float"),
    R([*TRAIN, "m.json"], 'schedule = "linear" must be one of "constant"', {"m.json": opt(schedule="linear")}, None,
      id="schedule-unknown"),
    R([*TRAIN, "m.json"], "batch_size = 2.5 must be a positive integer", {"m.json": opt(batch_size=2.5)}, None,
      id="batch-size-float"),
    R([*TRAIN, "m.json"], "unknown optimizer option(s) lrate", {"m.json": opt(lrate=0.1)}, None, id="optimizer-unknown"),
    R([*TRAIN, "m.json"], "invalid JSON at line 1", {"m.json": "{layers: ["}, None, id="json-syntax"),
    R([*TRAIN, "m.json"], "m.json: not UTF-8 text", {"m.json": b'{"name": "caf\xe9"}'}, None, id="json-latin1"),
    R([*TRAIN, "m.yaml"], "unsupported model file type '.yaml'", {"m.yaml": "layers: []"}, None, id="model-yaml"),
    R([*TRAIN, "nope"], "unknown model 'nope'", {}, None, id="model-unknown"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--lr", "-1"], "learning rate", {}, None, id="lr-negative"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--batch-size", "0"], "batch_size = 0 must be a positive",
      {}, None, id="batch-size-0"),
    # ---- data
    R(["train", "--data", "d.csv", "--model", "digits-mlp"], "d.csv line 2, column 0: 1e300 is beyond the float32 range",
      {"d.csv": CSV_OK.replace("3,4,1", "1e300,4,1")}, None, id="csv-1e300"),
    R(["train", "--data", "d.csv", "--model", "digits-mlp"], "d.csv: not UTF-8 text (byte 0xe9",
      {"d.csv": latin1("x,y,label\n" + CSV_OK.replace("3,4", "3,\xe9"))}, None, id="csv-latin1"),
    R(["train", "--data", "d.csv", "--model", "digits-mlp"], "d.csv: not UTF-8 text",
      {"d.csv": bytes(range(256)) * 4}, None, id="csv-binary"),
    R(["train", "--data", "d.csv", "--model", "digits-mlp"], "label 1000000: class labels must be 0..K-1 with K <= 65535",
      {"d.csv": CSV_OK.replace("3,4,1", "3,4,1000000")}, None, id="csv-label-1e6"),
    R(["train", "--data", "d.csv", "--model", "digits-mlp"], "(label 2 never does)",
      {"d.csv": CSV_OK.replace("3,4,1", "3,4,5")}, None, id="csv-label-gap"),
    R(["train", "--data", "nodata.npz", "--model", "digits-mlp"], "no such file", {}, None, id="data-missing"),
    R(["train", "--data", "d.parquet", "--model", "digits-mlp"], "unsupported file type '.parquet'",
      {"d.parquet": "x"}, None, id="data-unsupported"),
    # ---- train options and outputs
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "-1"], "--epochs must be >= 0", {}, None,
      id="epochs-negative"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--limit", "0"], "limit must be a positive", {}, None,
      id="limit-0"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--seed", "-1"], "seed -1 must be an integer >= 0", {},
      None, id="seed-negative"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--batch-size", "5000"],
      "batch size 5000 is larger than the 1437 training samples", {}, None, id="batch-larger-than-data"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--resume"], "--resume needs --out", {}, None,
      id="resume-without-out"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--out", "m.tt", "--resume", "--force"],
      "pass one of them", {}, None, id="resume-and-force"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--out", "afile/m.tt"],
      "afile is a file, not a directory", {"afile": "x"}, None, id="out-under-a-file"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--plot", "afile/p.png"],
      "afile is a file, not a directory", {"afile": "x"}, None, id="plot-under-a-file"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--out", "sub"], "sub is a directory",
      {"sub/keep": ""}, None, id="out-is-a-directory"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--limit", "20", "--out", "m.tt"],
      "cannot write m.tt: No space left on device", {}, disk_full, id="disk-full"),
    R(["train", "--data", "digits", "--model", "m.json", "--epochs", "1", "--out", "old.tt"],
      "old.tt holds a different model", {"m.json": DENSE10}, saved_model("old.tt"), id="out-different-model"),
    R(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--out", "notes.tt"],
      "notes.tt exists and is not a readable tinytrain model: pass --force", {"notes.tt": "my notes"}, None,
      id="out-not-a-model"),
    # ---- device commands
    R(["verify", "--board", "host", "--model", "digits-mlp", "--steps", "-5"], "--steps must be >= 1", {}, None,
      id="verify-steps-negative"),
    R(["verify", "--board", "nosuch", "--model", "digits-mlp", "--steps", "5"], "unknown board 'nosuch'", {}, None,
      id="verify-unknown-board"),
    R(["verify", "--board", "host", "--model", "digits-mlp", "--steps", "5"], "C compiler 'gcc' not found: install gcc",
      {}, no_tool_on_path, id="verify-host-without-gcc"),
    R(["emulate", "--board", "mps2_an386", "--firmware", "m.json"], "m.json is not an ELF file", {"m.json": DENSE10},
      None, id="emulate-not-elf"),
    R(["emulate", "--board", "mps2_an386", "--firmware", sys.executable], "not ARM (40)", {}, None,
      id="emulate-host-elf"),
    R(["codegen", "--model", "digits-mlp", "--out", "afile/gen"], "afile is a file, not a directory", {"afile": "x"},
      None, id="codegen-out-under-a-file"),
    R(["build", "--model", "digits-mlp", "--board", "mps2_an386", "--out", "afile"], "afile is a file: give a folder",
      {"afile": "x"}, None, id="build-out-is-a-file"),
    R(["verify", "--board", "mps2_an386", "--model", "m.json", "--data", "wide.npz", "--steps", "2"],
      "a sample of 300 bytes (+2 for the label) does not fit the device's max payload of 256 bytes",
      {"m.json": spec([{"type": "dense", "units": 2}])}, lambda t, m: np.savez(
          t / "wide.npz", x=np.random.default_rng(0).normal(size=(40, 300)), y=np.arange(40) % 2),
      id="verify-sample-over-max-payload", marks=qemu),
    R(["codegen", "--model", "digits-cnn", "--precision", "int16-master32", "--board", "microbit", "--out", "gen"],
      "to train but microbit has 16384", {}, None, id="codegen-does-not-fit-writes-nothing"),
    R(["codegen", "--model", "digits-mlp", "--board", "nosuch", "--out", "gen"], "unknown board 'nosuch'", {}, None,
      id="codegen-unknown-board"),
    R(["codegen", "--model", "m.tt", "--out", "gen"], "tensor layer 2 dense w (param) holds -32768 at [3, 5], outside "
      "the symmetric range [-32767, 32767] that tinytrain's arithmetic keeps; the file was not written by tinytrain or "
      "was edited: clamp the values and save again", {}, saved_with_minimum, id="codegen-model-holding-int16-minimum"),
    R(["codegen", "--model", "digits-mlp", "--out", "gen", "--plot", "afile/m.png"], "afile is a file, not a directory",
      {"afile": "x"}, None, id="codegen-plot-under-a-file"),
    R(["build", "--model", "digits-cnn", "--precision", "int16-master32", "--board", "microbit", "--out", "fw"],
      "to train but microbit has 16384", {}, None, id="build-does-not-fit-writes-nothing"),
    R(["info", "m.tt", "--plot", "afile/m.png"], "afile is a file, not a directory", {"afile": "x"}, None,
      id="info-plot-under-a-file"),
    R(["info", "m.tt", "--board", "nosuch"], "unknown board 'nosuch'", {}, saved_model("m.tt"), id="info-unknown-board"),
    R(["boards", "--model", "nope"], "unknown model 'nope'", {}, None, id="boards-unknown-model"),
    # ---- federate
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--plot"],
      "--plot without a FILE writes OUT/federated.png: give --out DIR", {}, None, id="federate-plot-without-out"),
    R(["federate", "--ports", "/dev/nonexistent", "--rounds", "1", "--model", "digits-mlp"],
      "no device could be reached: device 0: cannot connect: cannot open '/dev/nonexistent'", {}, None,
      id="federate-port-missing"),
    R(["federate", "--board", "mps2_an386", "--devices", "2", "--rounds", "1", "--model", "digits-mlp"],
      "qemu-system-arm not found", {}, no_tool_on_path, id="federate-board-without-qemu"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--out", "afile/fed"],
      "afile is a file, not a directory", {"afile": "x"}, None, id="federate-out-under-a-file"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--out", "afile"],
      "afile is a file: give a folder", {"afile": "x"}, None, id="federate-out-is-a-file"),
    R(["federate", "--simulated", "2", "--rounds", "0", "--model", "digits-mlp"], "--rounds must be >= 1", {}, None,
      id="federate-rounds-0"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--local-epochs", "0", "--model", "digits-mlp"],
      "--local-epochs must be >= 1", {}, None, id="federate-local-epochs-0"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--quorum", "-1"],
      "--quorum must be a fraction in (0, 1) or a count 1..2", {}, None, id="federate-quorum-negative"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--quorum", "3"],
      "count 1..2 of the 2 devices, got 3", {}, None, id="federate-quorum-over-devices"),
    R(["federate", "--simulated", "0", "--rounds", "1", "--model", "digits-mlp"], "--simulated must be >= 1", {}, None,
      id="federate-no-devices"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--partition", "foo"],
      "partition 'foo'", {}, None, id="federate-partition"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--server-momentum", "1"],
      "--server-momentum 1.0: must be in [0, 0.99]", {}, None, id="federate-server-momentum"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--server-lr", "0"],
      "--server-lr 0.0: must be in (0, 4]", {}, None, id="federate-server-lr"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--prox-mu", "-1"],
      "--prox-mu -1.0: must be a finite number >= 0", {}, None, id="federate-prox-mu-negative"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--prox-mu", "2"],
      "lr 0.05 x mu x --prox-every 16 = 1.6 >= 1 would pull past the global model: lower --prox-mu",
      {}, None, id="federate-prox-too-strong"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--prox-mu", "0.1",
       "--prox-every", "0"], "--prox-every 0: must be an integer >= 1", {}, None, id="federate-prox-every-0"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--residual-bits", "8"],
      "--residual-bits 8: use one of 64, 32, 16", {}, None, id="federate-residual-bits"),
    R(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--preloaded"],
      "--preloaded with an uncompressed broadcast changes nothing", {}, None, id="federate-preloaded-uncompressed"),
    # ---- import / export (issue 14)
    R(IMPORT, "unsupported op Sigmoid at node 'act'", {}, onnx_file("m.onnx", "unsupported"), id="import-onnx-unsupported-op"),
    R(IMPORT, "dynamic dimension 1 (K)", {}, onnx_file("m.onnx", "dynamic"), id="import-onnx-dynamic-shape"),
    R(IMPORT, "node 'fc' (Gemm): its weight 'W' is not an initializer", {}, onnx_file("m.onnx", "missing-weight"),
      id="import-onnx-missing-weight"),
    R(["import", "m.onnx", "--data", "digits-image", "--out", "out.tt"], "does not match the data 'digits-image'", {},
      onnx_file("m.onnx", "ok"), id="import-onnx-wrong-data-shape"),
    R(IMPORT, "m.onnx: not a readable ONNX model", {"m.onnx": b"\x00garbage" * 4}, None, id="import-onnx-garbage"),
    R(["import", "m.pt", "--data", "digits", "--out", "out.tt"], "unsupported op Sigmoid at node '_1'", {},
      torch_file("m.pt", "unsupported"), id="import-torch-unsupported-layer"),
    R(["import", "m.pt", "--data", "digits", "--out", "out.tt"], "a state_dict holds weights but not the layers", {},
      torch_file("m.pt", "state-dict"), id="import-torch-state-dict"),
    R(["import", "m.pt", "--data", "digits", "--out", "out.tt"], "does not accept an input of shape (1, 64)", {},
      torch_file("m.pt", "shape"), id="import-torch-wrong-data-shape"),
    R(["import", "m.pt", "--data", "digits", "--out", "out.tt"], "only chains of layers", {},
      torch_file("m.pt", "branch"), id="import-torch-branch"),
    R(["import", "m.tflite", "--data", "digits", "--out", "out.tt"], "not a TFLite model", {"m.tflite": b"junk" * 8},
      None, id="import-tflite-garbage"),
    R(["import", "m.h5", "--data", "digits", "--out", "out.tt"], "unknown model format '.h5'", {"m.h5": b"x"}, None,
      id="import-unknown-format"),
    R(["import", "none.onnx", "--data", "digits", "--out", "out.tt"], "none.onnx: no such file", {}, None,
      id="import-missing-file"),
    R([*IMPORT, "--calibrate", "0"], "--calibrate must be >= 1", {}, onnx_file("m.onnx", "ok"), id="import-calibrate-0"),
    R([*IMPORT, "--input-scale", "big"], "--input-scale 'big'", {}, onnx_file("m.onnx", "ok"), id="import-input-scale"),
    R(IMPORT, "out.tt exists: pass --force", {"out.tt": b"x"}, onnx_file("m.onnx", "ok"), id="import-out-exists"),
    R(["export", "--model", "missing.tt", "--onnx", "o.onnx"], "no such model file", {}, None, id="export-missing-model"),
    R(["export", "--model", "m.tt", "--onnx", "sub"], "sub is a directory", {"sub/x": ""}, saved_model("m.tt"),
      id="export-onnx-is-a-directory"),
    # ---- compress (issue 12)
    R(COMPRESS, 'stage 1: kind = "distill" must be one of', {"s.toml": compress_toml('kind = "distill"')}, None,
      id="compress-unknown-stage-kind"),
    R(COMPRESS, "stage 2 (quantize): precision: unknown preset 'int3'",
      {"s.toml": compress_toml(TRAIN2, 'kind = "quantize"\nepochs = 1\nprecision = "int3"')}, None,
      id="compress-unknown-policy"),
    R(COMPRESS, "stage 2 (prune): prune: end_epoch = 1 is before begin_epoch = 2: the schedule ends before it begins",
      {"s.toml": compress_toml(TRAIN2, 'kind = "prune"\nepochs = 3\nprune = {final_sparsity = 0.5, begin_epoch = 2, '
                               'end_epoch = 1}')}, None, id="compress-prune-ends-before-it-begins"),
    R(COMPRESS, "stage 2 (prune): prune: final_sparsity = 1.0 must be a number in [0, 1)",
      {"s.toml": compress_toml(TRAIN2, 'kind = "prune"\nepochs = 1\nprune = {schedule = "one_shot", '
                               'final_sparsity = 1.0}')}, None, id="compress-sparsity-outside"),
    R(COMPRESS, "stage 2 (adaptive): max_sparsity = 1.2 must be a number in [0, 1)",
      {"s.toml": compress_toml(TRAIN2, 'kind = "adaptive"\nmax_sparsity = 1.2')}, None,
      id="compress-adaptive-sparsity-outside"),
    R(COMPRESS, "stage 2 (adaptive): max_sparsity = 0.1 is below initial_sparsity = 0.5: the search ends before it begins",
      {"s.toml": compress_toml(TRAIN2, 'kind = "adaptive"\ninitial_sparsity = 0.5\nmax_sparsity = 0.1')}, None,
      id="compress-adaptive-ends-before-it-begins"),
    R(COMPRESS, "stage 2 (prune): prune: the schedule ends at update 2586 of the stage, after its last (1292",
      {"s.toml": compress_toml(TRAIN2, 'kind = "prune"\nepochs = 1\nprune = {final_sparsity = 0.5, end_epoch = 2}')},
      None, id="compress-prune-beyond-the-stage"),
    R(COMPRESS, "stage 2 (adaptive): unknown key(s) epochs", {"s.toml": compress_toml(TRAIN2, 'kind = "adaptive"\nepochs = 3')},
      None, id="compress-adaptive-epochs"),
    R(COMPRESS, "stage 1 (adaptive): the model has not been trained yet",
      {"s.toml": compress_toml('kind = "adaptive"')}, None, id="compress-adaptive-untrained"),
    R(COMPRESS, 'stage 1 (train): epochs = "3" must be an integer >= 1', {"s.toml": compress_toml('kind = "train"\nepochs = "3"')},
      None, id="compress-epochs-mistyped"),
    R(COMPRESS, "stage 1 (finetune): unknown key(s) precision", {"s.toml": compress_toml(
        'kind = "finetune"\nepochs = 1\nprecision = "int8"')}, None, id="compress-key-not-of-the-kind"),
    R(COMPRESS, "stage 1 (quantize): precision is missing", {"s.toml": compress_toml('kind = "quantize"\nepochs = 1')},
      None, id="compress-quantize-without-policy"),
    R(COMPRESS, "no [[stage]] tables", {"s.toml": 'model = "digits-mlp"\n'}, None, id="compress-no-stages"),
    R(COMPRESS, "s.toml: no such schedule file", {}, None, id="compress-missing-schedule"),
    R(COMPRESS, "s.toml: invalid TOML", {"s.toml": "[[stage]\n"}, None, id="compress-bad-toml"),
    R([*COMPRESS, "--board", "nosuch"], "unknown board 'nosuch'", {"s.toml": compress_toml(TRAIN2)}, None,
      id="compress-unknown-board"),
    # ---- sensitivity with weight bits and a board, pareto (issue 12)
    R(["sensitivity", "--model", "digits-mlp", "--policies", "int16,int9"], "--policies: unknown precision preset 'int9'",
      {}, None, id="sensitivity-unknown-policy"),
    R(["sensitivity", "--model", "digits-mlp", "--board", "nucleo_f446re"], "nucleo_f446re is a real board",
      {}, None, id="sensitivity-real-board"),
    R(["sensitivity", "--model", "digits-mlp", "--epochs", "0", "--layers", "1"],
      "--layers: layer 1 has no dense or convolution weights that learn: use some of 0, 2", {}, None,
      id="sensitivity-layer-without-weights"),
    R([*PARETO, "--budget", "speed=3"], "--budget 'speed=3': give KEY=INTEGER with KEY one of ram, flash, instructions",
      {}, None, id="pareto-budget-key"),
    R([*PARETO, "--budget", "ram=lots"], "--budget ram='lots': give a positive integer", {}, None,
      id="pareto-budget-value"),
    R(["pareto", "--model", "digits-mlp", "--board", "nucleo_f446re"], "nucleo_f446re is a real board", {}, None,
      id="pareto-real-board"),
    R([*PARETO, "--out", "best.onnx"], "--out best.onnx: write the chosen configuration as .tt", {}, None,
      id="pareto-out-suffix"),
    R([*PARETO, "--train", "bias,last:1"], "--train: include 'all'", {}, None, id="pareto-train-without-all"),
    R([*PARETO, "--train", "all,last:9"], "--train 'last:9'", {}, None, id="pareto-train-last-too-many"),
    R([*PARETO, "--widths", "0,1"], "--widths: 0.0 is not a width factor in (0, 4]", {}, None, id="pareto-width-zero"),
    R([*PARETO, "--sparsities", "0,1"], "--sparsities: 1.0 is not a sparsity in [0, 1)", {}, None,
      id="pareto-sparsity-one"),
    R([*PARETO, "--policies", "int9"], "--policies: unknown precision preset 'int9'", {}, None, id="pareto-policy"),
    R(["pareto", "--model", "m.tt", "--board", "microbit"], "pareto trains each configuration from scratch", {},
      saved_model("m.tt"), id="pareto-saved-model"),
    R([*PARETO, "--widths", "0.25", "--policies", "int16", "--sparsities", "0", "--train", "all", "--epochs", "1",
       "--budget", "ram=1000", "--out", "best.tt"],
      "no configuration meets --budget ram = 1000: the closest (width 0.25, int16, sparsity 0, train all) needs",
      {}, None, id="pareto-budget-unmet", marks=qemu),
]


def _write(root: Path, files: dict):
    for name, content in files.items():
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, dict):
            content = json.dumps(content)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())


def _snapshot(root: Path) -> dict:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in root.rglob("*")}


@pytest.mark.parametrize("argv, match, files, setup", ROWS)
def test_bad_input(capsys, tmp_path, monkeypatch, argv, match, files, setup):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TINYTRAIN_DEBUG", raising=False)
    _write(tmp_path, files)
    if setup is not None:
        setup(tmp_path, monkeypatch)
    before = _snapshot(tmp_path)
    capsys.readouterr()
    code = cli.main([str(a) for a in argv])
    _, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("tinytrain: error: "), err
    assert match in lines[0], err
    assert "internal error" not in err and "Traceback" not in err
    assert _snapshot(tmp_path) == before, "a failed command left files behind or changed them"


def test_every_builtin_layer_declares_its_fields():
    """A layer type without a fields table would skip the model-file type check."""
    import inspect

    from tinytrain.graph.layers import LAYER_TYPES
    from tinytrain.graph.model import Sequential  # noqa: F401  (registers every layer type)

    for kind, cls in LAYER_TYPES.items():
        assert cls.fields is not None, kind
        args = [n for n in inspect.signature(cls.__init__).parameters if n != "self"]
        assert sorted(args) == sorted(cls.fields), kind


def test_broken_pipe_is_quiet(tmp_path):
    """`tinytrain info m.tt | head`: when the reader has gone, exit without a message or a
    traceback (Python's SIGPIPE recipe). The pipe's read end is closed before the command
    starts, so its first print fails every time."""
    exe = Path(sys.executable).parent / "tinytrain"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tinytrain.cli"]
    m = tmp_path / "m.tt"
    assert subprocess.run([*cmd, "train", "--data", "digits", "--model", "digits-mlp", "--epochs", "0",
                           "--out", str(m)], capture_output=True, timeout=300).returncode == 0
    rd, wr = os.pipe()
    os.close(rd)
    try:
        r = subprocess.run([*cmd, "info", str(m)], stdout=wr, stderr=subprocess.PIPE, text=True,
                           timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    finally:
        os.close(wr)
    assert r.returncode == 1 and r.stderr == "", r.stderr


def test_linker_overflow_line_is_shown():
    """A RAM overflow at link time shows ld's own line (the summary used to drop it)."""
    from tinytrain.device.boards import get_board
    from tinytrain.device.pio_project import _explain_failure

    log = ("Linking .pio/build/microbit/firmware.elf\n/usr/bin/arm-none-eabi-ld: .pio/build/microbit/"
           "firmware.elf section `.bss' will not fit in region `RAM'\n/usr/bin/arm-none-eabi-ld: region "
           "`RAM' overflowed by 1234 bytes\ncollect2: error: ld returned 1 exit status\n")
    msg = _explain_failure(get_board("microbit"), ["pio", "run"], log)
    assert "region `RAM' overflowed by 1234 bytes" in msg and "\n" not in msg


def test_sample_over_max_payload_is_named():
    """DeviceLink refuses a sample the device cannot receive, naming both sizes, before sending."""
    from tinytrain.device import protocol as P

    class Silent:  # any write would be a bug: the check comes first
        name = "fake"

        def write(self, data):
            raise AssertionError("sent a frame the device cannot take")

    link = P.DeviceLink(Silent(), hello=False)
    link.info = P.DeviceInfo(P.PROTOCOL_VERSION, True, 256, 0, 0, 0, 0, 300, 2, 0)
    with pytest.raises(ValueError, match=r"sample of 300 bytes \(\+2 for the label\).*max payload of 256"):
        link.train(np.zeros(300, np.int8), 1)


def test_broken_pipe_elsewhere_is_an_error_not_silence(capsys, monkeypatch):
    """A BrokenPipeError that is not stdout's (a board's socket closing under a write) is an
    I/O error on one line; stdout stays as it was (it used to be pointed at devnull, which
    also silenced the test runner's own output)."""
    from tinytrain import cli

    def boom(args):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setitem(cli.SUBCOMMANDS, "boards", cli.Subcommand("boards", "x", lambda p: None, boom))
    before = os.fstat(1)
    rc = cli.main(["boards"])
    after = os.fstat(1)
    assert rc == 2 and "Broken pipe" in capsys.readouterr().err
    assert (before.st_ino, before.st_dev) == (after.st_ino, after.st_dev)
