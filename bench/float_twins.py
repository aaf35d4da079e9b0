"""float32 PyTorch twins of the benchmark models: same layers, init, data order and optimizer.

Init: each twin draws its weights from `np.random.default_rng(seed)` in the same order and
shapes as the tinytrain layers do at build time (Dense: uniform(-b, b, (units, fan_in)) with the
He-uniform bound b = sqrt(6 / fan_in); biases zero), so twin and integer model start from the
same real numbers before tinytrain rounds them to int16.  Training: plain SGD (no momentum, no
weight decay), softmax cross-entropy averaged over the batch, one update per batch.

`twin(name, seed)` builds one; `train` and `accuracy` run any of them.
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def _he_uniform_linear(fan_in: int, units: int, rng: np.random.Generator) -> nn.Linear:
    """nn.Linear with tinytrain's Dense init (same draw from rng), zero bias."""
    lin = nn.Linear(fan_in, units)
    bound = math.sqrt(6.0 / fan_in)
    w = rng.uniform(-bound, bound, (units, fan_in)).astype(np.float32)
    with torch.no_grad():
        lin.weight.copy_(torch.from_numpy(w))
        lin.bias.zero_()
    return lin


def w1_twin(seed: int) -> nn.Module:
    """W1 digits-mlp: 64-32-10, ReLU."""
    rng = np.random.default_rng(seed)
    return nn.Sequential(_he_uniform_linear(64, 32, rng), nn.ReLU(), _he_uniform_linear(32, 10, rng))


def w2_twin(seed: int) -> nn.Module:
    raise NotImplementedError(
        "W2 mnist1d-cnn twin: define the tinytrain model in bench/workloads.py first, then mirror "
        "its layers here, drawing conv weights from np.random.default_rng(seed) in the same order "
        "and shapes as tinytrain's Conv1D init (channels-last (40, 1) input: permute to NCL)")


def w3_twin(seed: int) -> nn.Module:
    raise NotImplementedError(
        "W3 digits-cnn twin: define the tinytrain model in bench/workloads.py first, then mirror "
        "its layers here (conv + batch norm + ReLU + pooling + dense; 8x8x1 channels-last input: "
        "permute to NCHW; batch norm in train mode with tinytrain's momentum and epsilon)")


TWINS = {"w1": w1_twin, "w2": w2_twin, "w3": w3_twin}


def twin(name: str, seed: int) -> nn.Module:
    return TWINS[name](seed)


def train(net: nn.Module, x: np.ndarray, y: np.ndarray, orders, lr: float, batch_size: int = 1) -> int:
    """SGD over x[order] for each order (one per epoch); a shorter last batch is kept.
    x float32 (n, ...), y int labels.  Returns the number of samples seen."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    xt, yt = torch.from_numpy(np.ascontiguousarray(x)), torch.from_numpy(y.astype(np.int64))
    net.train()
    seen = 0
    for order in orders:
        idx = torch.from_numpy(np.asarray(order, np.int64))
        xe, ye = xt[idx], yt[idx]
        for s in range(0, len(idx), batch_size):
            loss = F.cross_entropy(net(xe[s:s + batch_size]), ye[s:s + batch_size])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        seen += len(idx)
    return seen


@torch.no_grad()
def accuracy(net: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    net.eval()
    pred = net(torch.from_numpy(np.ascontiguousarray(x))).argmax(1).numpy()
    return float((pred == y).mean())
