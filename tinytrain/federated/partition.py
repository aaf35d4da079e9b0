"""Split a training set among devices: IID or non-IID by a Dirichlet draw over labels.

Partitioning is data preparation on the host (it decides which samples a device holds), not
part of a training step, so it may use numpy's seeded Generator. Results are sorted index
arrays, deterministic in (labels, K, spec, seed).

* ``iid``: a seeded permutation cut into K parts whose sizes differ by at most one.
* ``dirichlet:ALPHA``: for each class c, proportions p_c ~ Dir(ALPHA * 1_K); the class's
  samples (shuffled) are cut at round(cumsum(p_c) * n_c). Small ALPHA = few classes per device.
  A device left empty takes one sample from the largest part, so every device has data.
"""
from __future__ import annotations

import numpy as np

__all__ = ["partition", "parse_partition"]


def parse_partition(spec: str) -> tuple[str, float]:
    spec = str(spec).strip().lower()
    if spec == "iid":
        return "iid", 0.0
    if spec.startswith("dirichlet"):
        _, _, a = spec.partition(":")
        try:
            alpha = float(a) if a else 0.5
        except ValueError:
            alpha = -1.0
        if not alpha > 0:
            raise ValueError(f"partition {spec!r}: ALPHA must be a positive number, e.g. dirichlet:0.5")
        return "dirichlet", alpha
    raise ValueError(f"partition {spec!r}: use iid or dirichlet:ALPHA (e.g. dirichlet:0.5)")


def partition(labels, k: int, spec: str = "iid", seed: int = 0) -> list[np.ndarray]:
    """Indices of the samples each of `k` devices holds."""
    labels = np.asarray(labels)
    n = len(labels)
    if not (isinstance(k, int) and 1 <= k <= n):
        raise ValueError(f"cannot split {n} samples among {k} devices (need 1 <= K <= {n})")
    kind, alpha = parse_partition(spec)
    rng = np.random.default_rng([int(seed), 0xFED])
    if kind == "iid":
        perm = rng.permutation(n)
        parts = [np.sort(p) for p in np.array_split(perm, k)]
    else:
        buckets = [[] for _ in range(k)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            p = rng.dirichlet(np.full(k, alpha))
            cuts = np.round(np.cumsum(p)[:-1] * len(idx)).astype(np.int64)
            for d, piece in enumerate(np.split(idx, cuts)):
                buckets[d].extend(piece.tolist())
        for d in range(k):
            while not buckets[d]:
                big = max(range(k), key=lambda j: len(buckets[j]))
                buckets[d].append(buckets[big].pop())
        parts = [np.sort(np.asarray(b, np.int64)) for b in buckets]
    return [p.astype(np.int64) for p in parts]
