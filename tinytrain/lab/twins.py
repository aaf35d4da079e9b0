"""float32 PyTorch twins of the benchmark models: same layers, init, data order and optimizer.

Init: each twin draws its weights from `np.random.default_rng(seed)` in the same order and
shapes as the tinytrain layers do at build time (Dense: uniform(-b, b, (units, fan_in)) with the
He-uniform bound b = sqrt(6 / fan_in); Conv2d (filters, KH, KW, C) and Conv1d (filters, K, C)
the same with fan_in = KH*KW*C or K*C, permuted to PyTorch's channels-first layout; biases
zero; BatchNorm gamma 1, beta 0), so twin and integer model start from the same real numbers
before tinytrain rounds them to int16.  `init_weights_match` checks that against a built model.

Layout: tinytrain is channels-last, so a twin permutes its input to channels-first and back
before Flatten (the Dense weights see features in tinytrain's (H, W, C) / (L, C) order).
'same' padding puts the odd pixel after (TF's rule, as tinytrain), written as an explicit pad.
BatchNorm: train mode during training (statistics over the positions of the one sample at batch
1, as tinytrain), eval mode (running statistics) for test accuracy; eps 1e-5 and momentum
2^-mom_k = 1/8, the shift-EMA tinytrain actually runs for its configured 0.1.

Training: plain SGD (no momentum, no weight decay), softmax cross-entropy averaged over the
batch, one update per batch.  Schedule "cosine": update t uses lr * f[min(64, 64 t // T)] with
f tinytrain's own Q15 table / 2^15 and T the updates of the whole run (optim.py), so the float
run follows the same piecewise-constant cosine.

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


def _same_pads(n: int, k: int, s: int) -> tuple[int, int]:
    """'same' padding of one axis: out = ceil(n / s), the odd pixel after (ops/conv2d.py)."""
    total = max((-(-n // s) - 1) * s + k - n, 0)
    return total // 2, total - total // 2


class _Permute(nn.Module):
    def __init__(self, *dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)


def _he_uniform_conv(conv: nn.Module, tt_shape: tuple, to_torch: tuple, rng: np.random.Generator) -> nn.Module:
    """Set conv's weight from tinytrain's draw of shape tt_shape (filters, *kernel, C), permuted
    by to_torch into PyTorch's (filters, C, *kernel); zero bias."""
    bound = math.sqrt(6.0 / int(np.prod(tt_shape[1:])))
    w = rng.uniform(-bound, bound, tt_shape).astype(np.float32).transpose(to_torch)
    with torch.no_grad():
        conv.weight.copy_(torch.from_numpy(np.ascontiguousarray(w)))
        conv.bias.zero_()
    return conv


BN_EPS, BN_MOMENTUM = 1e-5, 2.0**-3  # tinytrain BatchNorm(eps=1e-5, momentum=0.1): mom_k = 3


def _conv1d_twin(seed: int, filters: int, stride: int, pool: bool) -> nn.Module:
    """Three Conv1d(filters, k, stride, same) + ReLU (+ MaxPool1d(2)) for k = 5, 3, 3 on
    (40, 1), Flatten (L, C order), Dense(10)."""
    rng = np.random.default_rng(seed)
    mods, L, C = [_Permute(0, 2, 1)], 40, 1  # (N, L, C) -> (N, C, L)
    for k in (5, 3, 3):
        mods += [nn.ConstantPad1d(_same_pads(L, k, stride), 0.0),
                 _he_uniform_conv(nn.Conv1d(C, filters, k, stride=stride), (filters, k, C), (0, 2, 1), rng), nn.ReLU()]
        L, C = -(-L // stride), filters
        if pool:
            mods.append(nn.MaxPool1d(2))
            L //= 2
    mods += [_Permute(0, 2, 1), nn.Flatten(), _he_uniform_linear(L * C, 10, rng)]
    return nn.Sequential(*mods)


def w2_twin(seed: int) -> nn.Module:
    """mnist1d-cnn (workload w2-strided): three stride-2 convolutions of 25 filters
    (lengths 40 -> 20 -> 10 -> 5)."""
    return _conv1d_twin(seed, 25, 2, pool=False)


def w2_pool_twin(seed: int) -> nn.Module:
    """W2 mnist1d-cnn-pool: three stride-1 convolutions of 12 filters, each + ReLU +
    MaxPool1d(2) (lengths 40 -> 20 -> 10 -> 5)."""
    return _conv1d_twin(seed, 12, 1, pool=True)


def w3_twin(seed: int) -> nn.Module:
    """W3 digits-cnn on (8, 8, 1): [Conv2d(f, 3x3, same) + BatchNorm + ReLU + MaxPool 2x2] for
    f = 8, 16 (8x8 -> 4x4 -> 2x2), Flatten (H, W, C order), Dense(10)."""
    rng = np.random.default_rng(seed)
    mods, HW, C = [_Permute(0, 3, 1, 2)], 8, 1  # (N, H, W, C) -> (N, C, H, W)
    for f in (8, 16):
        top, bottom = _same_pads(HW, 3, 1)
        mods += [nn.ZeroPad2d((top, bottom, top, bottom)),
                 _he_uniform_conv(nn.Conv2d(C, f, 3), (f, 3, 3, C), (0, 3, 1, 2), rng),
                 nn.BatchNorm2d(f, eps=BN_EPS, momentum=BN_MOMENTUM), nn.ReLU(), nn.MaxPool2d(2)]
        HW, C = HW // 2, f
    mods += [_Permute(0, 2, 3, 1), nn.Flatten(), _he_uniform_linear(HW * HW * C, 10, rng)]
    return nn.Sequential(*mods)


TWINS = {"w1": w1_twin, "w2": w2_pool_twin, "w2-strided": w2_twin, "w3": w3_twin}


def twin(name: str, seed: int) -> nn.Module:
    return TWINS[name](seed)


def cosine_factors() -> np.ndarray:
    """tinytrain's cosine schedule table (Q15 integers) as floats: f[i] ~ (1 + cos(pi i / 64)) / 2."""
    from tinytrain.graph.optim import SGD
    return SGD(schedule="cosine").compile().cosine.astype(np.float64) / 32768.0


def train(net: nn.Module, x: np.ndarray, y: np.ndarray, orders, lr: float, batch_size: int = 1,
          schedule: str = "constant", total_steps: int | None = None) -> int:
    """SGD over x[order] for each order (one per epoch); a shorter last batch is kept.
    x float32 (n, ...), y int labels.  schedule "cosine" decays over total_steps updates
    (default: the updates of these orders).  Returns the number of samples seen."""
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    sched = None
    if schedule == "cosine":
        T = max(1, total_steps or sum(-(-len(o) // batch_size) for o in orders))
        f = cosine_factors()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: float(f[min(len(f) - 1, (len(f) - 1) * t // T)]))
    elif schedule != "constant":
        raise ValueError(f"schedule {schedule!r}: the twins know constant and cosine")
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
            if sched is not None:
                sched.step()
        seen += len(idx)
    return seen


_TO_TORCH = {4: (0, 3, 1, 2), 3: (0, 2, 1), 2: (0, 1)}  # tinytrain weight ndim -> permutation


def init_weights_match(net: nn.Module, model) -> float:
    """Largest |twin weight - tinytrain weight| over conv/dense weights in layer order, in units
    of the tinytrain weight's LSB (<= 0.5 when both start from the same draws); raises if the
    shapes or the number of tensors differ."""
    tt = [(p.data, p.exp) for l in model.layers if l.kind in ("dense", "conv2d", "conv1d") for p in l.params[:1]]
    tw = [m.weight.detach().numpy() for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    if len(tt) != len(tw):
        raise ValueError(f"twin has {len(tw)} weight tensors, the tinytrain model {len(tt)}")
    worst = 0.0
    for (q, e), w in zip(tt, tw):
        ref = q.transpose(_TO_TORCH[q.ndim]).astype(np.float64) * 2.0**e
        if ref.shape != w.shape:
            raise ValueError(f"weight shapes differ: twin {w.shape}, tinytrain {ref.shape} (permuted)")
        worst = max(worst, float(np.abs(w - ref).max()) / 2.0**e)
    return worst


@torch.no_grad()
def accuracy(net: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    net.eval()
    pred = net(torch.from_numpy(np.ascontiguousarray(x))).argmax(1).numpy()
    return float((pred == y).mean())
