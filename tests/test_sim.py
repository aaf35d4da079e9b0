"""The numba simulator equals the numpy reference step by step; its compiled cache is keyed
by the kernel sources."""
from __future__ import annotations

import pytest

from tinytrain import data
from tinytrain.graph.layers import Dense, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.sim import simulator as tsim


@pytest.fixture(scope="module")
def digits():
    return data.load_digits()


@pytest.mark.parametrize("opt", [
    SGD(lr=0.05), SGD(lr=0.05, stochastic_rounding=True),
    SGD(lr=0.05, batch_size=4, momentum=0.9, weight_decay=1e-4),
    SGD(lr=0.05, master_weights=True, schedule="cosine", total_steps=150),
    SGD(lr=0.2, schedule="step", step_size=20, gamma=0.5, batch_size=2),
], ids=["plain", "sr", "batch-momentum-decay", "master-cosine", "step"])
def test_simulator_equals_reference_every_step(digits, opt):
    a = Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=digits.input_exp - 4, optimizer=opt, seed=0)
    b = a.copy()
    s = tsim.Simulator(b)
    for i in range(150):
        la = a.ref_train_step(digits.x_train[i], digits.y_train[i])
        o = s.train(digits.x_train, digits.y_train, [i])
        assert a.state_hash() == b.state_hash(), f"step {i}"
        assert tuple(la) == tuple(o[0])
        assert (a.stats[:3] == b.stats[:3]).all()
    assert [a.ref_predict(x) for x in digits.x_test[:50]] == list(s.predict(digits.x_test[:50]))


def test_generated_source_is_keyed_by_kernel_sources(digits, monkeypatch):
    m = Sequential([Dense(4), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, seed=0)
    src = tsim.generate_source(m)
    assert f"# kernels {tsim._kernels_fingerprint()}" in src
    monkeypatch.setattr(tsim, "_kernels_fingerprint", lambda: "0" * 16)
    assert tsim.generate_source(m) != src
