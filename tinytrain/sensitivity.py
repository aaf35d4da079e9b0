"""Layer-wise sensitivity of a trained model (Distiller's sensitivity analysis, in integer), to
sparsity and to weight bits, with what each level changes on the board.

    r = sensitivity(model, dataset, levels=(0.0, 0.1, ..., 0.9), policies=("int16", "int8-master16", "int8"),
                    board="microbit", jobs=2)

One prunable weight tensor at a time (dense and convolution layers that learn; graph/prune.py),
the rest of the model unchanged, no fine-tuning, accuracy on the split by the numba simulator:

* **sparsity** s: that tensor pruned to round(s n) zeros by the training's own criterion (the k
  smallest (|v|, index) of the store: the int32 master where there is one);
* **weight bits**: that layer alone under a precision policy (a preset of graph/precision.py,
  as the layer's own ``"precision"`` object; its trained weights converted by
  :func:`tinytrain.graph.convert.with_precision`: narrowed by the rounding rule of every
  narrowing). The default levels are every preset without an int32 master, so a new weight
  width added to the presets is a new row.

With ``board``: each variant as the board would train it -- a pruned tensor keeps its mask (the
pruning event lies in the past, so the schedule is over and a Dense int16 tensor is stored sparse,
codegen/sparse.py), a converted layer its policy --
measured by :func:`tinytrain.cost.device_cost`: RAM and flash of the linked firmware, the
instructions per training sample on QEMU over ``steps`` steps verified bit for bit. Reported as
the change from the unchanged model. Each distinct variant (same configuration, schema and
state: sweep.config_key) is built and run once per call, in a folder of this call; level 0 and
the model's own policy are the unchanged model. Integer and deterministic: a rerun gives the
same numbers. ``jobs`` processes share the work (the accuracy of each tensor, each policy
variant and each device measurement is a task); ``work=`` receives how it split.
"""
from __future__ import annotations

import tempfile

import numpy as np

from tinytrain.graph import prune as P
from tinytrain.graph.layers import ModelError
from tinytrain.graph.precision import PRESETS, PrecisionError
from tinytrain.sweep import Costs, config_key, run_tasks
from tinytrain.train import TrainError, prepare_inputs

DEFAULT_LEVELS = tuple(round(0.1 * i, 1) for i in range(10))
#: weight-bit levels by default: the presets that narrow (an int32 master only widens; int16
#: activations widen, and are model-wide, not a layer's)
DEFAULT_POLICIES = tuple(n for n, p in PRESETS.items() if p.master != "int32" and not p.a16)
#: device figures whose change is reported
DEVICE_FIELDS = ("ram_total", "flash_total", "training_ram", "instructions_per_sample")


def _levels(levels) -> list[float]:
    out = [float(v) for v in levels]
    bad = [v for v in out if not 0 <= v < 1]
    if not out or bad:
        raise TrainError(f"--levels: each sparsity level must be in [0, 1), got {bad[0] if bad else 'none'}")
    return sorted(set(out))


def _policies(policies) -> list[str]:
    out = list(dict.fromkeys(policies))
    bad = [p for p in out if p not in PRESETS]
    if bad:
        raise TrainError(f"--policies: unknown precision preset {bad[0]!r}: use some of {', '.join(PRESETS)}")
    return out


def emulated(board: str) -> str:
    """The name of an emulated board (instructions per sample are counted in QEMU)."""
    from tinytrain.device.boards import get_board

    b = get_board(board)
    if not b.is_emulated:
        raise TrainError(f"--board {b.name} is a real board: instructions per sample are counted on an emulated "
                         "one (tinytrain boards lists them)")
    return b.name


def pruned(model, key, sparsity: float):
    """A copy of `model` with tensor `key` pruned to round(s n) zeros and its mask kept (a
    layer "prune" object, one shot at step 0: in the past, the device honours the mask)."""
    li, pi = key
    m = model.copy()
    k = P.zeros_for(sparsity, m.layers[li].params[pi].data.size)
    if k == 0:
        return m
    old = {kk: v.copy() for kk, v in m.masks.items()}
    m.layers[li].prune = P.Prune(schedule="one_shot", final_sparsity=float(sparsity), begin_step=0)
    m.prune_table = P.compile(m)
    m.masks = P.init_masks(m)
    for kk, v in old.items():
        if kk in m.masks:
            m.masks[kk][...] = v
    m.masks[key][...] = P.select(m._store(li, pi)[0], k)
    P.apply_key(m, key)
    return m


def with_layer_policy(model, li: int, preset: str):
    """A copy of `model` whose layer li trains under the preset (its weights converted); the
    model itself when the layer already does."""
    from tinytrain.graph.convert import with_precision

    spec = PRESETS[preset].to_dict(only_changed=False)  # every key: a width may need its exponent too
    spec.pop("loss_scale", None)  # model-wide: a layer's policy may not carry it
    if all(getattr(model.layers[li].policy, k) == v for k, v in spec.items()):
        return model.copy()

    def edit(cfg):
        cfg["layers"][li]["precision"] = spec
    return with_precision(model, None, edit=edit)


# ------------------------------------------------------------------ tasks (top level: picklable)

def _sparsity_task(t):
    """Accuracy of the model with tensor key pruned to each level (in place, one simulator)."""
    from tinytrain.sim.simulator import Simulator

    model, key, levels, x, y = t
    work = model.copy()
    sim = Simulator(work)
    li, pi = key
    p = work.layers[li].params[pi]
    keep = p.data.copy()
    store = model.master.get(key, model.layers[li].params[pi].data)
    out = []
    for s in levels:
        k = P.zeros_for(s, p.data.size)
        P.apply(P.select(store, k), p.data)
        out.append((k, float(np.mean(sim.predict(x) == y))))
        p.data[...] = keep
    return out


def _accuracy_task(t):
    from tinytrain.sim.simulator import Simulator

    model, x, y = t
    return float(np.mean(Simulator(model.copy()).predict(x) == y))


def _cost_task(t):
    model, costs = t
    return costs(model)


def _add(variants: dict, model) -> str:
    k = config_key(model)
    variants.setdefault(k, model)
    return k


def _delta(cost: dict, base: dict) -> dict:
    d = {"fits": cost["fits"], "why": cost["why"], "shadow": cost["shadow"], "steps": cost["steps"]}
    for f in DEVICE_FIELDS:
        v, b = cost.get(f), base.get(f)
        d[f] = v
        d[f"delta_{f}"] = None if v is None or b is None else v - b
    return d


def sensitivity(model, dataset, levels=DEFAULT_LEVELS, split: str = "test", *, policies=DEFAULT_POLICIES,
                board: str | None = None, steps: int = 20, jobs: int = 1, layers=None, progress=None,
                work: dict | None = None) -> dict:
    """Accuracy (and with `board` the device cost) of `model` with one tensor at a time pruned to
    each level and one layer at a time under each policy (see the module). layers: only these
    layer indices (default: every layer with prunable weights). work: a dict that receives the
    work split (sweep.run_tasks; CPU and wall seconds vary, so they are not in the result, which
    a rerun reproduces exactly)."""
    levels, policies = _levels(levels), _policies(policies)
    if split not in ("train", "test"):
        raise TrainError(f"split={split!r}: use 'train' or 'test'")
    board = emulated(board) if board is not None else None
    X, Y, Xt, Yt = prepare_inputs(model, dataset)
    x, y = (X, Y) if split == "train" else (Xt, Yt)
    if not len(x):
        raise TrainError(f"the {split} split of {dataset.name} is empty")
    keys = [(li, pi) for li, l in enumerate(model.layers) for pi in P._prunable(l) if model.learns(li, pi)]
    if not keys:
        raise TrainError("the model has no dense or convolution weights that learn: nothing to prune")
    if layers is not None:
        bad = sorted(set(layers) - {li for li, _ in keys})
        if bad:
            raise TrainError(f"--layers: layer {bad[0]} has no dense or convolution weights that learn: use some of "
                             f"{', '.join(str(li) for li, _ in keys)}")
        keys = [k for k in keys if k[0] in set(layers)]

    base_key = config_key(model)
    variants = {base_key: model}  # key -> model: each distinct one is evaluated and measured once
    prune_keys, policy_keys = {}, {}
    if board is not None:
        for key in keys:
            for s in levels:
                prune_keys[key, s] = _add(variants, pruned(model, key, s))
    cannot = {}  # (layer, policy) -> why the layer cannot take it (e.g. row exponents on a conv)
    for li, pi in keys:
        for pol in policies:
            try:
                policy_keys[li, pol] = _add(variants, with_layer_policy(model, li, pol))
            except (ModelError, PrecisionError) as exc:
                policy_keys[li, pol], cannot[li, pol] = None, str(exc).split(": ", 1)[-1]
    acc_keys = sorted({k for k in policy_keys.values() if k is not None} | {base_key})
    tasks = [(_sparsity_task, (model, key, levels, x, y)) for key in keys]
    tasks += [(_accuracy_task, (variants[k], x, y)) for k in acc_keys]
    own = tempfile.TemporaryDirectory(prefix="tinytrain-sens-") if board is not None else None
    if board is not None:
        costs = Costs(board, dataset, steps, own.name)
        cost_keys = sorted(variants)
        tasks += [(_cost_task, (variants[k], costs)) for k in cost_keys]
    if progress is not None:
        progress.reset(total=len(tasks))
    try:
        # a device measurement (build, QEMU) outweighs a sparsity row (one evaluation per level),
        # which outweighs one accuracy
        weights = [{_cost_task: 2, _sparsity_task: 1}.get(f, 0) for f, _ in tasks]
        if board is not None:
            costs.prepare()
        results, spent = run_tasks(_dispatch, tasks, jobs, progress, weights)
        if work is not None:
            work.update(spent)
    finally:
        if own is not None:
            own.cleanup()
    prune_res, rest = results[:len(keys)], results[len(keys):]
    acc = dict(zip(acc_keys, rest[:len(acc_keys)]))
    cost = dict(zip(cost_keys, rest[len(acc_keys):])) if board is not None else {}
    base = acc[base_key]
    rows = []
    for key, res in zip(keys, prune_res):
        li, pi = key
        p = model.layers[li].params[pi]
        points = []
        for s, (k, a) in zip(levels, res):
            pt = {"sparsity": s, "zeros": k, "accuracy": a, "drop_points": 100.0 * (base - a)}
            if board is not None:
                pt["device"] = _delta(cost[prune_keys[key, s]], cost[base_key])
            points.append(pt)
        pol_rows = []
        for pol in policies:
            k = policy_keys[li, pol]
            pr = PRESETS[pol]
            if k is None:  # reported, not measured: the sweep goes on with the other policies
                pol_rows.append({"policy": pol, "weights": pr.weights, "weight_bits": pr.weight_bits,
                                 "master": pr.master, "accuracy": None, "drop_points": None, "unchanged": False,
                                 "applicable": False, "why": cannot[li, pol]})
                continue
            r = {"policy": pol, "weights": pr.weights, "weight_bits": pr.weight_bits, "master": pr.master,
                 "accuracy": acc[k], "drop_points": 100.0 * (base - acc[k]), "unchanged": k == base_key}
            if board is not None:
                r["device"] = _delta(cost[k], cost[base_key])
            pol_rows.append(r)
        words = P.mask_words(p.data.size)
        rows.append({"layer": li, "kind": model.layers[li].kind, "param": p.name, "elements": int(p.data.size),
                     "ram_bytes": 8 * words, "flash_bytes": 4 * words, "points": points, "policies": pol_rows})
    out = {"split": split, "samples": int(len(y)), "accuracy": base, "levels": levels, "policies": policies,
           "layers": rows, "board": board, "steps": steps if board else 0,
           "note": "one tensor pruned (or one layer converted) at a time, no fine-tuning; ram_bytes/flash_bytes: "
                   "the mask, its load-shadow copy and its reset image" +
                   ("; device: linked firmware and QEMU instructions per sample, change from the unchanged model"
                    if board else "; give --board for RAM, flash and instructions per sample measured on the board")}
    if board is not None:
        out["device"] = {f: cost[base_key].get(f) for f in DEVICE_FIELDS + ("fits", "why", "shadow")}
    return out


def _dispatch(t):
    fn, arg = t
    return fn(arg)


# --------------------------------------------------------------------------------- output

def _dev(d) -> str:
    if d is None:
        return ""
    if not d["fits"]:
        return f"  does not fit: {d['why']}"
    di = d["delta_instructions_per_sample"]
    return (f"  RAM {d['delta_ram_total']:+6d} flash {d['delta_flash_total']:+6d} instr/sample "
            + ("n/a" if di is None else f"{di:+9.0f}"))


def table(r: dict) -> str:
    head = f"{'layer':>5s} {'kind':8s} {'n':>6s} " + " ".join(f"{int(100 * s):>5d}%" for s in r["levels"]) + \
           "   +RAM  +flash"
    lines = [f"accuracy on {r['split']} ({r['samples']} samples): {100 * r['accuracy']:.2f} %; drop in points "
             "with one tensor pruned (no fine-tuning)", head]
    for row in r["layers"]:
        lines.append(f"{row['layer']:5d} {row['kind']:8s} {row['elements']:6d} "
                     + " ".join(f"{p['drop_points']:6.2f}" for p in row["points"])
                     + f" {row['ram_bytes']:6d} {row['flash_bytes']:7d}")
    lines.append("weight bits, one layer at a time: drop in points" + (f"; change on {r['board']}" if r["board"] else ""))
    for row in r["layers"]:
        for p in row["policies"]:
            if p["drop_points"] is None:
                lines.append(f"{row['layer']:5d} {row['kind']:8s} {p['policy']:14s}    n/a  ({p['why']})")
                continue
            lines.append(f"{row['layer']:5d} {row['kind']:8s} {p['policy']:14s} {p['drop_points']:6.2f}"
                         + _dev(p.get("device")))
    if r["board"]:
        d = r["device"]
        lines.append(f"device on {r['board']} (unchanged model): RAM {d['ram_total']} B, flash {d['flash_total']} B, "
                     f"instructions/sample {d['instructions_per_sample']}; per sparsity level:")
        for row in r["layers"]:
            for p in row["points"]:
                lines.append(f"{row['layer']:5d} {row['kind']:8s} {int(100 * p['sparsity']):3d} %"
                             + " " * 9 + _dev(p["device"]))
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    """Accuracy drop against sparsity and against weight bits, one line per tensor (matplotlib;
    written atomically)."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinytrain.graph.io import atomic_write

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(10, 4))
    for row in r["layers"]:
        label = f"layer {row['layer']} {row['kind']} ({row['elements']})"
        ax.plot([100 * p["sparsity"] for p in row["points"]], [p["drop_points"] for p in row["points"]],
                marker="o", label=label)
        pols = [p for p in row["policies"] if p["drop_points"] is not None]
        bx.plot([p["policy"] for p in pols], [p["drop_points"] for p in pols], marker="s", label=label)
    ax.set_xlabel("sparsity of the one pruned tensor (%)")
    bx.set_xlabel("precision policy of the one layer")
    for a in (ax, bx):
        a.set_ylabel(f"accuracy drop ({r['split']}, points)")
        a.grid(alpha=0.3)
    ax.set_title("pruning sensitivity (no fine-tuning)")
    bx.set_title("weight-bit sensitivity (no fine-tuning)")
    ax.legend()
    fig.tight_layout()
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
