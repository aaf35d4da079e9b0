"""On-device adaptation, simulated on a laptop.

A W1 digits MLP (64-32-10) is pre-trained "at the factory" on digits 0-6 only. The device
then meets all ten digits and adapts from a small labelled set it collects itself
(``--per-class`` samples of each digit), with a *partial update* that fits its RAM:

* ``last:1``  only the last Dense layer learns; the first layer's weights stay in flash;
* ``bias``    only the biases learn (smallest RAM);
* ``all``     full backpropagation, for comparison.

Every step is the same integer training step the device runs (the numba simulator is
bit-exact with the reference and with the generated C). For each variant the script prints
test accuracy before/after on all digits, on the old ones (0-6) and on the new ones (7-9),
and the RAM the device needs for that update (trainable parameters, gradient buffers,
optimizer state, activations kept for the backward pass, error buffers) next to the frozen
parameters that can stay in flash.

    .venv/bin/python examples/on_device_adaptation.py [--per-class 20] [--epochs 10]
"""
from __future__ import annotations

import argparse
import dataclasses

import numpy as np

from tinytrain import data
from tinytrain.graph.models import build_model
from tinytrain.codegen.memory import memory_estimate
from tinytrain.train import evaluate, fit

OLD = list(range(7))


def subset(ds, train_mask, name):
    """The dataset with only the masked training samples (test set unchanged)."""
    return dataclasses.replace(ds, name=name, x_train=ds.x_train[train_mask], y_train=ds.y_train[train_mask],
                               float_x_train=ds.float_x_train[train_mask])


def device_set(ds, per_class, seed):
    """per_class training samples of every digit: what a device could collect and label."""
    rng = np.random.default_rng(seed)
    keep = np.zeros(len(ds.y_train), bool)
    for c in range(ds.n_classes):
        idx = np.flatnonzero(ds.y_train == c)
        keep[rng.choice(idx, size=min(per_class, len(idx)), replace=False)] = True
    return subset(ds, keep, f"device-{per_class}-per-class")


def accuracies(model, ds):
    r = evaluate(model, ds)
    conf = np.array(r["confusion"])
    new = [c for c in range(ds.n_classes) if c not in OLD]
    return r["accuracy"], float(np.trace(conf[OLD][:, OLD]) / conf[OLD].sum()), float(conf[new, new].sum() / conf[new].sum())


def adapt_copy(pretrained, ds, train, lr):
    """A model with the pre-trained weights and a fresh optimizer that updates only `train`."""
    m = build_model("digits-mlp", ds, train=train, lr=lr)
    for ld, ls in zip(m.layers, pretrained.layers):
        for pd, ps in zip(ld.params, ls.params):
            pd.data[...] = ps.data
    return m


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrain-epochs", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=10, help="adaptation epochs on the device set")
    ap.add_argument("--per-class", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    ds = data.load("digits")
    factory = subset(ds, np.isin(ds.y_train, OLD), "digits-0-6")
    base = build_model("digits-mlp", ds, seed=a.seed)
    fit(base, factory, a.pretrain_epochs, seed=a.seed, progress=False)
    dev = device_set(ds, a.per_class, a.seed)
    all0, old0, new0 = accuracies(base, ds)
    print(f"pre-trained on digits 0-6 ({len(factory.x_train)} samples, {a.pretrain_epochs} epochs): "
          f"test accuracy all {all0:.3f}, old 0-6 {old0:.3f}, new 7-9 {new0:.3f}")
    print(f"device set: {len(dev.x_train)} samples ({a.per_class} per digit), {a.epochs} epochs, lr {a.lr}\n")
    print(f"{'update':8s} {'all':>6s} {'0-6':>6s} {'7-9':>6s} | {'RAM B':>6s} {'flash B':>7s}  "
          "RAM = params + grads + opt state + activations + errors + scratch + stack")
    for train in ("bias", "last:1", "all"):
        m = adapt_copy(base, ds, train, a.lr)
        fit(m, dev, a.epochs, seed=a.seed, progress=False)
        acc, old, new = accuracies(m, ds)
        mem = memory_estimate(m)
        parts = (mem["ram_trainable_params"] + mem["ram_master_weights"], mem["ram_gradients"],
                 mem["ram_optimizer_buffers"], mem["ram_activations_kept"],
                 mem["ram_error_buffers"], mem["ram_scratch"] + mem["ram_meta"], mem["ram_stack_estimate"])
        print(f"{train:8s} {acc:6.3f} {old:6.3f} {new:6.3f} | {mem['ram_total']:6d} {mem['flash_frozen_params']:7d}  "
              + " + ".join(str(p) for p in parts))
    print("\n(RAM/flash: the code generator's memory plan, tinytrain.codegen.memory.memory_estimate; frozen "
          "layers are const data in flash; stack is a fixed estimate without a cross compiler)")


if __name__ == "__main__":
    main()
