"""The benchmark workloads (DESIGN.md, Benchmarks): data, tinytrain model, hyper-parameters.

One `Workload` per benchmark model; bench_accuracy.py and bench_speed.py take its name.  A
workload's float twin lives in float_twins.py under the same name.  To add W2/W3: write the
tinytrain model factory and the twin, and add an entry to WORKLOADS.

Inputs: the integer model reads the dataset's int8 codes with input_exp = ds.input_exp -
input_shift; its float twin reads float_x / 2**input_shift, the same real values.
Shuffling: epoch e of seed s visits the training set in the order of the e-th
`fixedpoint.permutation` drawn from `prng_seed(ORDER_SEED_BASE + s)`; the twin uses the same
orders, so the two runs differ only by arithmetic.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from tinytrain import data
from tinytrain import fixedpoint as fp
from tinytrain.layers import Dense, ReLU
from tinytrain.model import Sequential
from tinytrain.optim import SGD

ORDER_SEED_BASE = 1000  # keeps the shuffle stream apart from the model's own PRNG (seed s)
SEEDS = (0, 1, 2)


@dataclasses.dataclass(frozen=True)
class Workload:
    name: str             # w1, w2, w3
    title: str            # digits-mlp, ...
    load: Callable[[], data.Dataset]
    layers: Callable[[], list]  # fresh tinytrain layers
    input_shift: int      # float input = float_x / 2**input_shift
    lr: float
    epochs: int

    def model(self, ds: data.Dataset, seed: int, batch_size: int = 1) -> Sequential:
        return Sequential(self.layers(), input_shape=ds.input_shape,
                          input_exp=ds.input_exp - self.input_shift, n_classes=ds.n_classes,
                          optimizer=SGD(lr=self.lr, batch_size=batch_size), seed=seed,
                          name=f"{self.name}-{self.title}")

    def float_inputs(self, ds: data.Dataset) -> tuple[np.ndarray, np.ndarray]:
        s = np.float32(2.0 ** -self.input_shift)
        return ds.float_x_train * s, ds.float_x_test * s


def epoch_orders(seed: int, n: int, epochs: int) -> list[np.ndarray]:
    """The per-epoch training orders shared by the integer model and its twin."""
    state, orders = fp.prng_seed(ORDER_SEED_BASE + seed), []
    for _ in range(epochs):
        state, order = fp.permutation(state, n)
        orders.append(order.astype(np.int64))
    return orders


def train_macs(model: Sequential) -> int:
    """MACs of one training sample: forward, weight gradients (as many as forward), and the
    error propagated through every parameterised layer but the first (the input needs no dx).
    Dense and conv layers only; the update's multiply per weight is not counted."""
    with_params = [l for l in model.layers if l.macs()]
    return 2 * model.macs() + sum(l.macs() for l in with_params[1:])


W1 = Workload(name="w1", title="digits-mlp", load=lambda: data.load_digits("flat"),
              layers=lambda: [Dense(32), ReLU(), Dense(10)], input_shift=4, lr=0.05, epochs=20)

WORKLOADS = {"w1": W1}
