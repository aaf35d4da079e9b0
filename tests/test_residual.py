"""Residual blocks: reference, simulator and generated C agree every step; config round trip;
shape errors."""
from __future__ import annotations

import numpy as np
import pytest

from tinytrain.codegen.host import HostModel
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.conv import Conv2d, MaxPool2d
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.residual import Residual
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.sim.simulator import Simulator

CASES = [
    ((12,), lambda: [Dense(16), ReLU(), Residual([Dense(16), ReLU(), Dense(16)]), ReLU(), Dense(5)], SGD(lr=0.05)),
    ((8, 8, 1), lambda: [Conv2d(4, 3, padding="same"), ReLU(), Residual([Conv2d(4, 3, padding="same"), BatchNorm(), ReLU()]),
                         MaxPool2d(2), Flatten(), Dense(5)],
     SGD(lr=0.05, batch_size=2, momentum=0.9, stochastic_rounding=True)),
    ((12,), lambda: [Residual([Dense(12), ReLU()]), Dense(5)], SGD(lr=0.05, master_weights=True)),
    ((12,), lambda: [Dense(12), Residual([Dense(12), ReLU()]), Dense(5)], SGD(lr=0.05, train="last:2")),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_residual_reference_sim_c_equal(case):
    shape, layers, opt = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.integers(-127, 128, (24, *shape)).astype(np.int8)
    y = rng.integers(0, 5, 24).astype(np.int32)
    ref = Sequential(layers(), input_shape=shape, input_exp=-7, optimizer=opt, seed=1)
    fast = ref.copy()
    sim, hm = Simulator(fast), HostModel(fast, sanitize=True)
    for i in range(24):
        a = ref.ref_train_step(x[i], y[i])
        b = tuple(sim.train(x, y, [i])[0])
        c = hm.train_step(x[i], y[i])
        assert ref.state_hash() == fast.state_hash() == hm.state_hash(), f"step {i}"
        assert tuple(a) == b == c
    assert [ref.ref_predict(v) for v in x] == list(sim.predict(x)) == [hm.predict(v) for v in x]


def test_residual_config_round_trip_and_errors():
    m = Sequential([Dense(8), Residual([Dense(8), ReLU()]), Dense(3)], input_shape=(5,), input_exp=-7, seed=2)
    m2 = Sequential.from_config(m.config())
    assert m2.state_hash() == m.state_hash() and m2.schema_hash() == m.schema_hash()
    with pytest.raises(ModelError, match="keep the shape"):
        Sequential([Residual([Dense(4)]), Dense(3)], input_shape=(5,))
    with pytest.raises(ModelError, match="unknown layer type"):
        Sequential([Residual([{"type": "nope"}]), Dense(3)], input_shape=(5,))
