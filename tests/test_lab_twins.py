"""The float twins are the integer models' architecture: started from tinytrain's own initial
weights (dequantized) and fed its quantized inputs, each twin's logits follow the integer
forward's up to int8 rounding; and the twins draw the same initial weights (<= 0.5 LSB)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from tinytrain.lab import twins
from tinytrain.lab.workloads import WORKLOADS

_TT_TO_TORCH = {4: (0, 3, 1, 2), 3: (0, 2, 1), 2: (0, 1)}


def _load_tt_weights(net: nn.Module, model) -> None:
    """Copy the integer model's weights and biases (as real numbers) into the twin."""
    tt = [l for l in model.layers if l.kind in ("dense", "conv2d", "conv1d")]
    tw = [m for m in net.modules() if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))]
    assert len(tt) == len(tw)
    with torch.no_grad():
        for l, m in zip(tt, tw):
            w, b = l.params[0], l.params[1]
            m.weight.copy_(torch.from_numpy((w.data.astype(np.float64) * 2.0**w.exp).transpose(_TT_TO_TORCH[w.data.ndim])))
            m.bias.copy_(torch.from_numpy(b.data.astype(np.float64) * 2.0**b.exp))


@pytest.mark.parametrize("name", ["w2", "w2-strided", "w3"])
def test_twin_forward_follows_the_integer_forward(name):
    torch.set_num_threads(1)
    wl = WORKLOADS[name]
    ds = wl.load()
    model = wl.model(ds, 1)
    net = twins.twin(name, 1)
    assert twins.init_weights_match(net, model) <= 0.5 + 1e-3
    _load_tt_weights(net, model)
    net.eval()
    xs = ds.x_test[:40]
    tt = np.stack([(lambda z, e: z.astype(np.float64) * 2.0**e)(*model.ref_forward(x)[:2]) for x in xs])
    with torch.no_grad():
        fl = net(torch.from_numpy((xs.astype(np.float32) * np.float32(2.0**model.input_exp)))).numpy()
    assert fl.shape == tt.shape == (40, ds.n_classes)
    # int8 activations at three or four layers: a few percent of the logits' spread, never a
    # different architecture (a wrong padding, pool or flatten order decorrelates them)
    assert np.corrcoef(fl.ravel(), tt.ravel())[0, 1] > 0.99
    assert np.abs(fl - tt).max() < 0.1 * np.abs(tt).max()
    assert (fl.argmax(1) == tt.argmax(1)).mean() >= 0.9


def test_w2_is_the_pool_model_and_the_strided_one_keeps_a_name():
    assert WORKLOADS["w2"].builtin == "mnist1d-cnn-pool" and WORKLOADS["w2"].goal_min_pct == 94.0
    assert WORKLOADS["w2-strided"].builtin == "mnist1d-cnn"
    assert [type(m) for m in twins.twin("w2", 0) if isinstance(m, (nn.Conv1d, nn.MaxPool1d))] == [nn.Conv1d, nn.MaxPool1d] * 3
