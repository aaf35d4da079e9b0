"""tinytrain.torch: quantization-aware training in PyTorch that reproduces tinytrain's integer
forward, and the classic QAT schedule as one call (the ``interop`` extra installs torch).

    net = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), ...)
    qnet = tinytrain.torch.qat(net, ds, float_epochs=10, qat_epochs=10)   # warm-up, QAT, freeze
    model = tinytrain.torch.convert(qnet, ds)                             # a tinytrain model

What is emulated (fake quantization, straight-through gradients: forward quantized, backward
identity):
* activations: after every layer that rounds in tinytrain (Linear, Conv, BatchNorm, AvgPool,
  global average pooling; ReLU, MaxPool and Flatten are exact on int8 codes) the tensor is
  rounded to int8 with tinytrain's dynamic exponent, per sample: e = floor(log2 max|a|) - 6
  (``fixedpoint.requant_shift``: the smallest e with max|a| < 2^(e+7)), q = floor(a 2^-e + 1/2)
  (ties toward +inf, ``rshift_round``) saturated to [-127, 127];
* weights: int16 at the exponent tinytrain gives the layer (from its fan-in), scaled down by the
  importer's power of two when they outgrow it (``interop.ir.weight_shift``), rounded half up;
* inputs: the data's int8 codes at the model's input exponent (``qat`` feeds them).
Not emulated: the int32 bias grid (2^-20 and finer) and batch norm's Q12 arithmetic, both far
below the int8 activation step. The schedule: ``float_epochs`` of float training (warm-up),
then fake quantization on (the exponents need no calibration: they are dynamic, as on the
board) for ``qat_epochs``, batch-norm statistics frozen (eval mode) from epoch
``freeze_bn_epoch`` of the QAT phase on, then ``convert`` imports the result.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn
from torch.nn.utils import parametrize


def fake_quant_act(a: torch.Tensor) -> torch.Tensor:
    """int8 with tinytrain's per-sample dynamic exponent (see the module doc), STE gradient."""
    with torch.no_grad():
        m = a.detach().abs().reshape(len(a), -1).amax(dim=1).clamp_min(torch.finfo(a.dtype).tiny)
        e = torch.floor(torch.log2(m)) - 6
        e = e.reshape((-1,) + (1,) * (a.ndim - 1))
        q = torch.clamp(torch.floor(a * torch.exp2(-e) + 0.5), -127, 127) * torch.exp2(e)
    return a + (q - a).detach()


class ActQuant(nn.Module):
    """Fake int8 activation quantization (identity when ``enabled`` is False); the importer
    skips it."""
    _tinytrain_passthrough = True

    def __init__(self):
        super().__init__()
        self.enabled = True

    def forward(self, x):
        return fake_quant_act(x) if self.enabled else x


class WeightQuant(nn.Module):
    """Parametrization: int16 at 2^(exp + k), k = interop.ir.weight_shift(max|w|, exp), STE."""

    def __init__(self, exp: int):
        super().__init__()
        self.exp = int(exp)
        self.enabled = True

    def forward(self, w):
        if not self.enabled:
            return w
        from tinytrain.interop.ir import weight_shift
        with torch.no_grad():
            e = self.exp + weight_shift(float(w.detach().abs().max()), self.exp)
            q = torch.clamp(torch.floor(w * 2.0**-e + 0.5), -32767, 32767) * 2.0**e
        return w + (q - w).detach()


_ROUNDS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.AvgPool2d,
           nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)


def _flat_children(net):
    for m in net.children():
        if isinstance(m, nn.Sequential):
            yield from _flat_children(m)
        else:
            yield m


def prepare_qat(net: nn.Module, example_input) -> nn.Sequential:
    """An nn.Sequential of net's layers (nested Sequentials flattened; the modules are shared,
    not copied) with fake quantization: an ActQuant after each layer that rounds in tinytrain
    and a WeightQuant parametrization on each Linear/Conv weight at tinytrain's exponent."""
    from tinytrain.interop.ir import WEIGHTED, to_model
    from tinytrain.interop.torch_import import torch_graph

    if not isinstance(net, nn.Sequential):
        raise TypeError("prepare_qat needs an nn.Sequential of supported layers")
    ops, shape = torch_graph(net, example_input)
    built = to_model(ops, shape)
    exps = iter([l.params[0].exp for op, l in zip(built.ops, built.model.layers) if op.kind in WEIGHTED])
    mods = []
    for m in _flat_children(net):
        mods.append(m)
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
            if not parametrize.is_parametrized(m, "weight"):
                parametrize.register_parametrization(m, "weight", WeightQuant(next(exps)))
            else:
                next(exps)
        if isinstance(m, _ROUNDS):
            mods.append(ActQuant())
    return nn.Sequential(*mods)


def set_quant(net: nn.Module, enabled: bool) -> None:
    """Turn every fake quantization in net on or off."""
    for m in net.modules():
        if isinstance(m, (ActQuant, WeightQuant)):
            m.enabled = enabled


def strip(net: nn.Module) -> nn.Module:
    """Bake the quantized weights into plain parameters and drop the ActQuant modules: the
    module the importer reads."""
    for m in net.modules():
        if parametrize.is_parametrized(m, "weight"):
            parametrize.remove_parametrizations(m, "weight", leave_parametrized=True)
    if isinstance(net, nn.Sequential):
        return nn.Sequential(*[m for m in net if not isinstance(m, ActQuant)])
    return net


# ----------------------------------------------------------------------------- training

def dataset_inputs(dataset, split: str = "train", input_scale="unit", quantized: bool = True) -> np.ndarray:
    """A split's inputs as the imported model reads them, in PyTorch's channels-first layout:
    the data's int8 codes times 2^input_exp (quantized=True, what tinytrain computes on) or the
    float originals, times the input scale ("unit": 2^-unit_shift, "data": 1, or a number)."""
    from tinytrain.data import unit_shift
    from tinytrain.interop.torch_import import channels_first

    c = 2.0**-unit_shift(dataset) if input_scale == "unit" else 1.0 if input_scale == "data" else float(input_scale)
    if quantized:
        x = getattr(dataset, f"x_{split}").astype(np.float64) * 2.0**dataset.input_exp * c
    else:
        x = getattr(dataset, f"float_x_{split}").astype(np.float64) * c
    return channels_first(x.astype(np.float32))


def train(net: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, *, lr: float = 0.05, momentum: float = 0.9,
          batch_size: int = 32, seed: int = 0, freeze_bn_epoch: int | None = None) -> nn.Module:
    """Plain minibatch SGD with softmax cross-entropy on channels-first float inputs; the
    order of samples comes from torch.Generator(seed). freeze_bn_epoch: from that epoch on the
    BatchNorm layers stay in eval mode (running statistics frozen)."""
    torch.manual_seed(seed)
    xt, yt = torch.from_numpy(np.ascontiguousarray(x, np.float32)), torch.from_numpy(np.asarray(y, np.int64))
    opt = torch.optim.SGD(net.parameters(), lr=lr, momentum=momentum)
    g = torch.Generator().manual_seed(seed)
    for ep in range(epochs):
        net.train()
        if freeze_bn_epoch is not None and ep >= freeze_bn_epoch:
            for m in net.modules():
                if isinstance(m, nn.modules.batchnorm._BatchNorm):
                    m.eval()
        perm = torch.randperm(len(xt), generator=g)
        for i in range(0, len(xt), batch_size):
            idx = perm[i:i + batch_size]
            loss = nn.functional.cross_entropy(net(xt[idx]), yt[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    net.eval()
    return net


def accuracy(net: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    net.eval()
    with torch.no_grad():
        pred = net(torch.from_numpy(np.ascontiguousarray(x, np.float32))).argmax(1).numpy()
    return float(np.mean(pred == np.asarray(y)))


def qat(net: nn.Sequential, dataset, *, float_epochs: int = 10, qat_epochs: int = 10,
        freeze_bn_epoch: int | None = None, input_scale="unit", lr: float = 0.05, qat_lr: float | None = None,
        momentum: float = 0.9, batch_size: int = 32, seed: int = 0) -> nn.Sequential:
    """The classic schedule in one call: float warm-up for float_epochs on the data's float
    inputs, then fake-quantized training for qat_epochs on its int8 codes (lr qat_lr, default
    lr / 10), batch-norm statistics frozen from QAT epoch freeze_bn_epoch on (default: half
    way). Returns the QAT model (fake quantization on, eval mode); ``convert`` imports it."""
    xf = dataset_inputs(dataset, "train", input_scale, quantized=False)
    xq = dataset_inputs(dataset, "train", input_scale)
    if float_epochs:
        train(net, xf, dataset.y_train, float_epochs, lr=lr, momentum=momentum, batch_size=batch_size, seed=seed)
    qnet = prepare_qat(net, xq[:1])
    if qat_epochs:
        fz = qat_epochs // 2 if freeze_bn_epoch is None else freeze_bn_epoch
        train(qnet, xq, dataset.y_train, qat_epochs, lr=qat_lr or lr / 10, momentum=momentum,
              batch_size=batch_size, seed=seed + 1, freeze_bn_epoch=fz)
    return qnet.eval()


def convert(qnet: nn.Module, dataset, *, input_scale="unit", **kwargs):
    """The tinytrain model of a QAT model (its weights baked in, ActQuant dropped): see
    interop.torch_import.from_torch for kwargs; the report is model.import_report."""
    from tinytrain.interop.torch_import import from_torch
    return from_torch(strip(qnet), None, dataset=dataset, input_scale=input_scale, **kwargs)


# ------------------------------------------------------------------- the built-in shapes

def digits_mlp() -> nn.Sequential:
    """W1's shape in PyTorch: 64-32-10 MLP, ReLU (input (N, 64))."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def digits_cnn() -> nn.Sequential:
    """W3's shape in PyTorch (input (N, 1, 8, 8)): [Conv2d(f, 3x3, padding 1) + BatchNorm2d +
    ReLU + MaxPool 2x2] for f = 8, 16, Flatten, Linear(64, 10)."""
    layers = []
    for c_in, f in ((1, 8), (8, 16)):
        layers += [nn.Conv2d(c_in, f, 3, padding=1), nn.BatchNorm2d(f), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*layers, nn.Flatten(), nn.Linear(64, 10))
