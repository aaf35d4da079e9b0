"""One stage of a pipeline applied to a model: the validation split, the model a stage trains
(its lr, precision policy and prune object over the previous stage's state), and what a stage
reports. Integer only: every change here is a rebuild from the model's config plus a copy of
its training state, so the result trains bit for bit like any other model on every path.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from tinytrain import fixedpoint as fp

#: the seed of the validation split: the same held-out samples for every seed of a schedule
VALIDATION_SEED = 0x7A11D
#: stage i (from 1) shuffles its epochs with fit's seed `seed + STAGE_SEED_STRIDE * i`
STAGE_SEED_STRIDE = 1000


def split_validation(ds, fraction: float):
    """(train, validation) Datasets: round(fraction * n) training samples (at least 1, at most
    n - 1) held out by a fixed xorshift permutation (seed VALIDATION_SEED), the rest kept in their
    order. The test split stays the test split of `train`; `validation`'s test split is the
    held-out part (so ``evaluate(model, validation)`` scores it)."""
    n = len(ds.x_train)
    k = min(max(int(round(fraction * n)), 1), n - 1)
    _, perm = fp.permutation(fp.prng_seed(VALIDATION_SEED), n)
    val, keep = np.sort(perm[:k]), np.sort(perm[k:])
    train = dataclasses.replace(ds, x_train=ds.x_train[keep], y_train=ds.y_train[keep],
                                float_x_train=ds.float_x_train[keep])
    valid = dataclasses.replace(ds, x_test=ds.x_train[val], y_test=ds.y_train[val],
                                float_x_test=ds.float_x_train[val])
    return train, valid


def stage_seed(seed: int, index: int) -> int:
    return int(seed) + STAGE_SEED_STRIDE * int(index)


def copy_state(dst, src) -> None:
    """dst's training state := src's, tensor by tensor (same layers and widths); masks where
    both prune the tensor (a new prune object keeps the masks until its first event)."""
    for ld, ls in zip(dst.layers, src.layers):
        for pd, ps in zip(ld.params, ls.params):
            pd.exp, pd.data[...] = ps.exp, ps.data
    for name in ("master", "accum", "velocity"):
        a, b = getattr(dst, name), getattr(src, name)
        for k in a.keys() & b.keys():
            a[k][...] = b[k]
    for k in dst.masks.keys() & src.masks.keys():
        dst.masks[k][...] = src.masks[k]
    dst.meta[...] = src.meta
    dst.stats[...] = src.stats
    for attr in ("data_input_exp", "target_exp"):
        if attr in src.__dict__:
            setattr(dst, attr, getattr(src, attr))


def restage(model, *, lr=None, precision=None, prune=None):
    """The model a stage trains: `model` with a new learning rate, precision policy (converted by
    ``with_precision``: narrowed weights rounded, accumulators and momentum restarted) and/or
    prune object (absolute steps; it replaces every prune object of the model, per layer too).
    Nothing given: `model` itself."""
    from tinytrain.graph.convert import with_precision
    from tinytrain.graph.model import Sequential

    if lr is None and prune is None and precision is None:
        return model
    if precision is not None:
        model = with_precision(model, precision)
    if lr is None and prune is None:
        return model
    cfg = model.config()
    if lr is not None:
        cfg["optimizer"] = dict(cfg["optimizer"], lr=float(lr))
    if prune is not None:
        cfg["prune"] = prune
        for layer in cfg["layers"]:
            layer.pop("prune", None)
    new = Sequential.from_config(cfg)
    copy_state(new, model)
    return new


def sparsity_of(model) -> dict:
    """Zeros in the masks: overall (over the pruned tensors) and per tensor ``L{li}.w``."""
    from tinytrain.graph.prune import sparsity

    per = sparsity(model)
    zeros, total = sum(z for z, _ in per.values()), sum(n for _, n in per.values())
    prunable = sum(l.params[pi].data.size for li, l in enumerate(model.layers)
                   for pi, p in enumerate(l.params) if p.name.endswith("w") and model.learns(li, pi))
    return {"sparsity": zeros / prunable if prunable else 0.0, "zeros": zeros, "weights": prunable,
            "per_tensor": {k: {"zeros": z, "of": n} for k, (z, n) in per.items()},
            "pruned_tensors_sparsity": zeros / total if total else 0.0}


def precision_name(model) -> str:
    """The model's policy as a preset name when it is one, else its keys as JSON."""
    import json

    from tinytrain.graph.precision import PRESETS

    d = model.precision.to_dict()
    for name, p in PRESETS.items():
        if p.to_dict() == d:
            return name
    return json.dumps(d, sort_keys=True)
