"""Reference = numba simulator = generated C, every step, on graphs and optimizer settings the
workloads do not contain: residual blocks holding batch norm, convolutions, pools and dense
layers in any order, at any position (first, middle, last), and every optimizer option.

The numpy reference (``Sequential.ref_train_step``) is the specification; the numba simulator
and the C (UBSan build) must leave the model in the same state (hash over parameters, master
weights, accumulators, momentum, running statistics, PRNG and step counters) and return the
same loss and prediction after every sample.
"""
from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.codegen.host import HostModel
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.conv import (AvgPool2d, Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool, MaxPool1d,
                                   MaxPool2d)
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.residual import Residual
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.state import outside_symmetric
from tinytrain.sim.simulator import Simulator

from .conftest import examples


def _out(layer, shape):
    """Output shape of `layer` on `shape` (None if it does not apply), without touching it."""
    try:
        return copy.deepcopy(layer).build(shape, np.random.default_rng(0))
    except ModelError:
        return None


def _spatial_layer(draw, shape, inside):
    """One layer for a (L, C) or (H, W, C) input; inside a residual block it keeps the shape."""
    one_d = len(shape) == 2
    C = shape[-1]
    kinds = ["conv", "bn", "relu"] + ([] if one_d else ["depthwise"]) + ([] if inside else ["pool"])
    kind = draw(st.sampled_from(kinds))
    if kind == "conv":
        k = draw(st.sampled_from([1, 3]))
        if inside:
            return Conv1d(C, k, padding="same") if one_d else Conv2d(C, k, padding="same")
        n, stride, pad = draw(st.integers(1, 4)), draw(st.integers(1, 2)), draw(st.sampled_from(["valid", "same"]))
        return Conv1d(n, k, stride=stride, padding=pad) if one_d else Conv2d(n, k, stride=stride, padding=pad)
    if kind == "depthwise":
        return DepthwiseConv2d(3, padding="same") if inside else DepthwiseConv2d(
            draw(st.sampled_from([1, 3])), stride=draw(st.integers(1, 2)), padding=draw(st.sampled_from(["valid", "same"])))
    if kind == "bn":
        return BatchNorm()
    if kind == "relu":
        return ReLU()
    return MaxPool1d(2) if one_d else draw(st.sampled_from([MaxPool2d, AvgPool2d]))(2)


def _flat_layer(draw, n, inside):
    return ReLU() if draw(st.integers(0, 2)) == 0 else Dense(n if inside else draw(st.integers(2, 12)))


def _residual(draw, shape):
    inner, cur = [], shape
    for _ in range(draw(st.integers(1, 4))):
        l = (_flat_layer(draw, shape[0], True) if len(shape) == 1 else _spatial_layer(draw, cur, True))
        nxt = _out(l, cur)
        if nxt is not None:
            inner.append(l)
            cur = nxt
    return Residual(inner) if inner and cur == shape else None


@st.composite
def any_graph(draw):
    """A model with 0-3 spatial stages, then 0-3 flat stages and a Dense head (optionally
    followed by a residual block): every stage is a plain layer or a residual block."""
    rank = draw(st.sampled_from([1, 2, 3]))
    if rank == 1:
        shape = (draw(st.integers(3, 12)),)
    elif rank == 2:
        shape = (draw(st.integers(4, 16)), draw(st.integers(1, 3)))
    else:
        shape = (draw(st.integers(3, 7)), draw(st.integers(3, 7)), draw(st.integers(1, 3)))
    layers, cur = [], shape
    if rank > 1:
        for _ in range(draw(st.integers(0, 3))):
            l = _residual(draw, cur) if draw(st.booleans()) else _spatial_layer(draw, cur, False)
            nxt = _out(l, cur) if l is not None else None
            if nxt is not None:
                layers.append(l)
                cur = nxt
        l = draw(st.sampled_from([Flatten, GlobalAvgPool]))()
        layers.append(l)
        cur = _out(l, cur)
    for _ in range(draw(st.integers(0, 3))):
        l = _residual(draw, cur) if draw(st.booleans()) else _flat_layer(draw, cur[0], False)
        nxt = _out(l, cur) if l is not None else None
        if nxt is not None:
            layers.append(l)
            cur = nxt
    n_cls = draw(st.integers(2, 5))
    layers.append(Dense(n_cls))
    if draw(st.integers(0, 3)) == 0:
        layers.append(Residual([Dense(n_cls)] + ([ReLU()] if draw(st.booleans()) else [])))
    return shape, layers, n_cls


@st.composite
def any_optimizer(draw, layers):
    with_params = [i for i, l in enumerate(layers) if l.params]
    train = draw(st.sampled_from(["all", "bias", "last", "list"]))
    if train == "last":
        train = f"last:{draw(st.integers(1, len(with_params)))}"
    elif train == "list":
        train = sorted(draw(st.sets(st.sampled_from(with_params), min_size=1)))
    return SGD(lr=draw(st.sampled_from([0.01, 0.05, 0.2])), momentum=draw(st.sampled_from([0.0, 0.9])),
               weight_decay=draw(st.sampled_from([0.0, 1e-3])), batch_size=draw(st.integers(1, 3)),
               schedule=draw(st.sampled_from(["constant", "step", "cosine"])), gamma=0.5,
               step_size=draw(st.integers(1, 4)), total_steps=draw(st.integers(3, 12)),
               stochastic_rounding=draw(st.booleans()), master_weights=draw(st.booleans()), train=train)


def _data(n, shape, n_cls, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(-127, 128, (n, *shape)).astype(np.int8), rng.integers(0, n_cls, n).astype(np.int32)


def three_way(ref: Sequential, x, y, epochs=2):
    """Train the reference, the simulator and the C side by side; compare after every step."""
    fast = ref.copy()
    sim, hm = Simulator(fast), HostModel(fast, sanitize=True)
    for epoch in range(epochs):
        for i in range(len(x)):
            a = tuple(int(v) for v in ref.ref_train_step(x[i], y[i]))
            b = tuple(int(v) for v in sim.train(x, y, [i])[0])
            c = tuple(int(v) for v in hm.train_step(x[i], y[i]))
            hashes = (ref.state_hash(), fast.state_hash(), hm.state_hash())
            assert hashes[0] == hashes[1] == hashes[2], f"epoch {epoch} step {i}: hashes {hashes}\n{ref.summary()}"
            assert a == b == c, f"epoch {epoch} step {i}: (loss, pred) {a} {b} {c}"
            # saturation and update-underflow counters (the C keeps one total, not compared)
            assert list(ref.stats) == list(fast.stats), f"epoch {epoch} step {i}: stats {ref.stats} {fast.stats}"
            # nothing leaves the symmetric int8/int16 range (the C equals it: the hashes)
            assert outside_symmetric(ref) is None, f"epoch {epoch} step {i}: {outside_symmetric(ref)}"
    assert [ref.ref_predict(v) for v in x] == list(sim.predict(x)) == [hm.predict(v) for v in x]


# no shrinking: every example compiles a simulator and a C model; the failing draw is printed as is
@settings(max_examples=examples(10), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_any_graph_any_optimizer_reference_sim_c_equal(data):
    shape, layers, n_cls = data.draw(any_graph())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = data.draw(any_optimizer(probe.layers))
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)))
    x, y = _data(data.draw(st.integers(4, 9)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


# residual block with batch norm followed by a layer with parameters: the reference once left
# the parameters after the batch norm untrained (gradients paired by position)
BN_THEN_PARAMS = [
    ((6, 6, 2), lambda: [Residual([Conv2d(2, 3, padding="same"), BatchNorm(), ReLU(), Conv2d(2, 3, padding="same")]),
                         Flatten(), Dense(3)]),
    ((10, 2), lambda: [Conv1d(3, 3), Residual([BatchNorm(), Conv1d(3, 1, padding="same")]), GlobalAvgPool(), Dense(3)]),
    ((5, 5, 1), lambda: [Conv2d(2, 3, padding="same"), Residual([BatchNorm(), DepthwiseConv2d(3, padding="same"),
                                                                  BatchNorm(), Conv2d(2, 1)]), Flatten(), Dense(3)]),
]


@pytest.mark.parametrize("case", range(len(BN_THEN_PARAMS)))
def test_residual_batchnorm_then_params(case):
    shape, layers = BN_THEN_PARAMS[case]
    ref = Sequential(layers(), input_shape=shape, input_exp=-7, optimizer=SGD(lr=0.05), seed=case)
    block = ref.layers[1 if case else 0]
    before = {p.name: p.data.copy() for p in block.params}
    x, y = _data(6, shape, 3, case)
    three_way(ref, x, y)
    # every trainable inner parameter after the first batch norm learned
    first_bn = next(k for k, l in enumerate(block.inner) if l.kind == "batchnorm")
    after_bn = [p.name for p in block.params if p.trainable and int(p.name.split("_")[0]) > first_bn]
    assert after_bn and all((before[n] != p.data).any() for p in block.params for n in [p.name] if n in after_bn), after_bn


# every combination of the optimizer options on one model that holds all parameter kinds
# (dense, conv, batch norm inside a residual block); one sample order, 3 epochs of 6 samples
OPT_GRID = list(itertools.product([0.0, 0.9], [0.0, 1e-3], [False, True], [False, True], [1, 3],
                                  ["constant", "step", "cosine"]))


def _grid_model(opt):
    return Sequential([Conv1d(2, 3), Residual([BatchNorm(), ReLU(), Conv1d(2, 3, padding="same")]),
                       Flatten(), Dense(4), ReLU(), Dense(3)],
                      input_shape=(8, 1), input_exp=-7, optimizer=opt, seed=3)


@pytest.mark.parametrize("momentum,wd,sr,master,batch,schedule", OPT_GRID)
def test_every_optimizer_combination_reference_sim_c_equal(momentum, wd, sr, master, batch, schedule):
    opt = SGD(lr=0.1, momentum=momentum, weight_decay=wd, stochastic_rounding=sr, master_weights=master,
              batch_size=batch, schedule=schedule, gamma=0.5, step_size=2, total_steps=6)
    x, y = _data(6, (8, 1), 3, 7)
    three_way(_grid_model(opt), x, y, epochs=3)


# fixed positions the random graphs reach only by chance: a batch-norm residual block first /
# in the middle / last, each with momentum, stochastic rounding, master weights, and a frozen
# layer after a learning one (the C once ran frozen layers' gradient kernels into buffers sized
# for learning layers only: out of bounds)
POSITIONS = [
    ((6, 2), lambda: [Residual([BatchNorm(), Conv1d(2, 3, padding="same")]), Conv1d(3, 3), Flatten(), Dense(3)], [0, 3]),
    ((6, 2), lambda: [Conv1d(2, 3, padding="same"), Residual([Conv1d(2, 1), BatchNorm(), ReLU(), Conv1d(2, 3, padding="same")]),
                      Flatten(), Dense(3)], [1]),
    ((5, 5, 2), lambda: [Conv2d(2, 3, padding="same"), ReLU(), Residual([DepthwiseConv2d(3, padding="same"), BatchNorm()])],
     [0]),
]


def _pos_model(case, opt):
    shape, layers, train = POSITIONS[case]
    ls = layers()
    if ls[-1].kind == "residual":  # a spatial residual block last: the head follows it
        ls += [GlobalAvgPool(), Dense(3)]
    return Sequential(ls, input_shape=shape, input_exp=-7, optimizer=opt, seed=case), train


@pytest.mark.parametrize("case", range(len(POSITIONS)))
@pytest.mark.parametrize("batch", [1, 2])
def test_batchnorm_residual_positions_with_frozen_layers(case, batch):
    _, _, train = POSITIONS[case]
    opt = SGD(lr=0.1, momentum=0.9, stochastic_rounding=True, master_weights=True, batch_size=batch, train=train)
    ref, _ = _pos_model(case, opt)
    three_way(ref, *_data(6, ref.input_shape, 3, case))


# partial training with a frozen layer after a learning one, in every update mode
@pytest.mark.parametrize("train", [[0], "bias", [0, 2]])
@pytest.mark.parametrize("momentum,batch", [(0.0, 1), (0.0, 3), (0.9, 1)])
def test_frozen_after_learning_every_mode(train, momentum, batch):
    from tinytrain.codegen.emit import generate

    opt = SGD(lr=0.1, momentum=momentum, batch_size=batch, train=train)
    layers = [Conv1d(3, 3), BatchNorm(), Flatten(), Dense(20), ReLU(), Dense(3)]
    if train == [0, 2]:
        layers = [Dense(12), ReLU(), Dense(50), Dense(3)]
        x, y = _data(6, (10,), 3, 1)
        ref = Sequential(layers, input_shape=(10,), input_exp=-7, optimizer=opt, seed=1)
    else:
        x, y = _data(6, (8, 2), 3, 1)
        ref = Sequential(layers, input_shape=(8, 2), input_exp=-7, optimizer=opt, seed=1)
    src = generate(ref, "tt_model").source
    frozen = [li for li, l in enumerate(ref.layers) if l.params and not any(ref.trainable[li])]
    step = src[src.index("tt_model_train_step("):]
    for li in frozen:  # a frozen layer runs no gradient kernel (its buffers are not planned)
        block = step[step.index(f"/* backward {li}:"):] if f"/* backward {li}:" in step else ""
        block = block[:block.index("/* backward", 5)] if "/* backward" in block[5:] else block
        assert "_grad_s32" not in block, f"layer {li}: {block}"
    three_way(ref, x, y)
