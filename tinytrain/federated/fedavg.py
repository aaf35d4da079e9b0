"""Integer FedAvg and the model tensors it averages.

The tensors a federation exchanges and averages are a model's *parameter store*, one tensor
per parameter in schema order: the int32 master copy where the optimizer keeps one, otherwise
the parameter itself (int16 weights, int32 biases, batch-norm statistics). Optimizer buffers
(accumulators, momentum) are **reset to zero** at the start of every round: they are local
state, and averaging them would make a device's next step depend on the others' batch
positions. The int16 compute copy of a master weight is refreshed from the averaged master.

Rounding rule of the average (one definition, integer only)::

    S = sum_i n_i * w_i            (int64; n_i = samples device i trained on this round)
    N = sum_i n_i                  (0 < N < 2^31, so |S| < 2^62 for int32 tensors)
    w = floor((S + floor(N / 2)) / N)

i.e. round to nearest with ties toward +inf, the tie rule of ``fixedpoint.rshift_round``
(for odd N no tie exists). ``div_floor`` is numpy's ``//`` on int64 with a positive divisor.
A weighted mean lies between the inputs, so the result always fits the tensor's dtype.
"""
from __future__ import annotations

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.graph.optim import refresh_compute_copy

__all__ = ["store_tensors", "set_store", "start_state", "Aggregator", "fedavg", "client_seed"]


def store_tensors(model) -> list[np.ndarray]:
    """The model's parameter store (views, not copies), schema order."""
    out = []
    for li, l in enumerate(model.layers):
        for pi, p in enumerate(l.params):
            out.append(model.master.get((li, pi), p.data))
    return out


def set_store(model, tensors) -> None:
    """Write a parameter store into the model in place (compute copies refreshed)."""
    k = 0
    for li, l in enumerate(model.layers):
        for pi, p in enumerate(l.params):
            key = (li, pi)
            dst = model.master.get(key, p.data)
            dst[...] = tensors[k]
            if key in model.master:
                refresh_compute_copy(dst, p.data, model.master_shift[key])
            k += 1


def client_seed(seed: int, rnd: int, device: int) -> int:
    """The per-(federation seed, round, device) 32-bit seed: CRC-32 of three little-endian
    uint32. The device's training PRNG starts at prng_seed(client_seed) and its data order
    at prng_seed(client_seed ^ 0x5EED) (see devices.local_order)."""
    import struct

    return fp.crc32(struct.pack("<III", seed & 0xFFFFFFFF, rnd & 0xFFFFFFFF, device & 0xFFFFFFFF))


def start_state(model, store, seed: int, rnd: int, device: int, step: int) -> None:
    """Put `model` in the state a device starts round `rnd` from: the global store, zeroed
    optimizer buffers, training PRNG from client_seed, optimizer step `step` (the global
    step, so lr schedules continue), no samples pending in a batch."""
    set_store(model, store)
    for d in (model.accum, model.velocity):
        for a in d.values():
            a[...] = 0
    model.meta[0] = fp.prng_seed(client_seed(seed, rnd, device))
    model.meta[1] = int(step)
    model.meta[2] = 0


def add_count(agg, n: int, updates: int) -> None:
    """Count `n` more samples (from `updates` updates) in an aggregation's N and count; the int64
    sums stay exact while N < 2^31 (the largest term is an int32 value times N)."""
    if agg.N + n >= 2**31:
        raise OverflowError("more than 2^31 - 1 samples in one round: the int64 sum could overflow")
    agg.N += n
    agg.count += updates


class Aggregator:
    """Streaming integer FedAvg: add (store, n) updates one by one, then result()."""

    def __init__(self, like):
        self.dtypes = [np.asarray(t).dtype for t in like]
        self.S = [np.zeros(np.shape(t), np.int64) for t in like]
        self.N = 0
        self.count = 0

    def add_update(self, u) -> None:
        """Add a decoded update (codec.Update)."""
        self.add(u.store, u.n_samples)

    def add(self, tensors, n: int) -> None:
        n = int(n)
        if n <= 0:
            raise ValueError(f"an update must count at least one sample, got {n}")
        add_count(self, n, 1)
        for s, t in zip(self.S, tensors):
            s += np.asarray(t, np.int64) * n

    def merge(self, other: "Aggregator") -> None:
        """Add another aggregation's sums (a worker's share of the round's devices)."""
        add_count(self, other.N, other.count)
        for s, t in zip(self.S, other.S):
            s += t

    def result(self) -> list[np.ndarray]:
        if self.N == 0:
            raise ValueError("no updates to aggregate")
        half = self.N // 2
        return [((s + half) // self.N).astype(dt) for s, dt in zip(self.S, self.dtypes)]


def fedavg(updates) -> list[np.ndarray]:
    """Integer FedAvg of [(store tensors, n_samples), ...] (the rule in the module docstring)."""
    updates = list(updates)
    agg = Aggregator(updates[0][0])
    for t, n in updates:
        agg.add(t, n)
    return agg.result()
