"""Layer-wise pruning sensitivity of a trained model (Distiller's sensitivity analysis, in integer).

    r = sensitivity(model, dataset, levels=(0.0, 0.1, ..., 0.9))

For each prunable weight tensor (dense and convolution layers that learn; graph/prune.py), for
each sparsity level s: a copy of the trained weights with that one tensor pruned to round(s n)
zeros by the training's own criterion (the k smallest (|v|, index) of the store: the int32
master where there is one), no fine-tuning, evaluated on the split by the numba simulator. The
rest of the model is unchanged. Integer and deterministic: a rerun gives the same numbers.

Beside the accuracy drop, what pruning that tensor adds to the device (the same on every level,
as storage stays dense): the mask (ceil(n / 32) uint32 words) in RAM and its copy in the load
shadow, and its reset image in flash. Instructions per sample are not reported: the kernels
are dense, so they do not fall with the sparsity (docs/pruning.md).
"""
from __future__ import annotations

import numpy as np

from tinytrain.graph import prune as P
from tinytrain.train import TrainError, prepare_inputs

DEFAULT_LEVELS = tuple(round(0.1 * i, 1) for i in range(10))


def _levels(levels) -> list[float]:
    out = [float(v) for v in levels]
    bad = [v for v in out if not 0 <= v < 1]
    if not out or bad:
        raise TrainError(f"--levels: each sparsity level must be in [0, 1), got {bad[0] if bad else 'none'}")
    return sorted(set(out))


def sensitivity(model, dataset, levels=DEFAULT_LEVELS, split: str = "test") -> dict:
    """Accuracy of `model` with one tensor at a time pruned to each level (see the module)."""
    from tinytrain.sim.simulator import Simulator

    levels = _levels(levels)
    if split not in ("train", "test"):
        raise TrainError(f"split={split!r}: use 'train' or 'test'")
    X, Y, Xt, Yt = prepare_inputs(model, dataset)
    x, y = (X, Y) if split == "train" else (Xt, Yt)
    if not len(x):
        raise TrainError(f"the {split} split of {dataset.name} is empty")
    work = model.copy()
    sim = Simulator(work)  # predicts with work's arrays, in place
    stats = work.stats.copy()

    def acc() -> float:
        return float(np.mean(sim.predict(x) == y))

    base = acc()
    keys = [(li, pi) for li, l in enumerate(work.layers) for pi in P._prunable(l) if work.learns(li, pi)]
    if not keys:
        raise TrainError("the model has no dense or convolution weights that learn: nothing to prune")
    rows = []
    for li, pi in keys:
        p = work.layers[li].params[pi]
        keep = p.data.copy()
        store = model.master.get((li, pi), model.layers[li].params[pi].data)
        points = []
        for s in levels:
            k = P.zeros_for(s, p.data.size)
            P.apply(P.select(store, k), p.data)
            a = acc()
            points.append({"sparsity": s, "zeros": k, "accuracy": a, "drop_points": 100.0 * (base - a)})
            p.data[...] = keep
        words = P.mask_words(p.data.size)
        rows.append({"layer": li, "kind": work.layers[li].kind, "param": p.name, "elements": int(p.data.size),
                     "ram_bytes": 8 * words, "flash_bytes": 4 * words, "points": points})
    work.stats[...] = stats
    return {"split": split, "samples": int(len(y)), "accuracy": base, "levels": levels, "layers": rows,
            "note": "one tensor pruned at a time, no fine-tuning; RAM: its mask and the load shadow's copy; "
                    "flash: the mask's reset image; instructions: unchanged (dense kernels)"}


def table(r: dict) -> str:
    head = f"{'layer':>5s} {'kind':8s} {'n':>6s} " + " ".join(f"{int(100 * s):>5d}%" for s in r["levels"]) + \
           "   +RAM  +flash"
    lines = [f"accuracy on {r['split']} ({r['samples']} samples): {100 * r['accuracy']:.2f} %; drop in points "
             "with one tensor pruned (no fine-tuning)", head]
    for row in r["layers"]:
        lines.append(f"{row['layer']:5d} {row['kind']:8s} {row['elements']:6d} "
                     + " ".join(f"{p['drop_points']:6.2f}" for p in row["points"])
                     + f" {row['ram_bytes']:6d} {row['flash_bytes']:7d}")
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    """Accuracy drop against sparsity, one line per tensor (matplotlib; written atomically)."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinytrain.graph.io import atomic_write

    fig, ax = plt.subplots(figsize=(6, 4))
    for row in r["layers"]:
        ax.plot([100 * p["sparsity"] for p in row["points"]], [p["drop_points"] for p in row["points"]],
                marker="o", label=f"layer {row['layer']} {row['kind']} ({row['elements']})")
    ax.set_xlabel("sparsity of the one pruned tensor (%)")
    ax.set_ylabel(f"accuracy drop ({r['split']}, points)")
    ax.set_title("pruning sensitivity (no fine-tuning)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    p = Path(path)
    atomic_write(p, lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
