"""The accuracy / device-cost Pareto frontier of a model on one board, every point measured.

    r = pareto("digits-cnn", ds, "microbit", budget={"ram": 16384}, jobs=2)

A grid of configurations -- width (every dense layer's units but the last, every convolution's
filters, scaled and rounded, at least 1), precision policy (a preset), sparsity (gradual
magnitude pruning, polynomial from 0 over the first two thirds of training, 100 steps apart)
and what the device trains (``all``, ``bias``, ``last:K``) -- and for each point:

* **accuracy** on the host. Validation is carved from the training set (a fixed integer
  permutation; ``val_fraction`` of it, 15 % by default), the points are trained on the rest and
  chosen by validation accuracy; test accuracy is reported beside it and never used to choose.
  A point that trains everything is trained from scratch for ``epochs``. A partial point
  (``bias``, ``last:K``) is what a device would do with a host-pretrained model: the weights of
  the ``all`` point of the same width, policy and sparsity, then ``device_epochs`` epochs of
  the partial training on the same training part (its frozen weights go to flash, so it needs
  less RAM);
* **RAM and flash** of the firmware linked for the board, and **instructions per training
  sample** on QEMU over ``steps`` steps, each step compared with the simulator by state hash
  (tinytrain.cost.device_cost; no cost model: every point that fits the board and the RAM and
  flash budget is run on the board, so every frontier point is verified there). A point that
  does not fit is kept, marked, and never chosen.

Feasible: fits the board and the budget (``ram``: the firmware's whole RAM, as the board counts
it; ``flash``; ``instructions`` per sample). The frontiers are the feasible points no other
feasible point beats in validation accuracy at no more training RAM (resp. instructions); the
chosen point has the best validation accuracy (ties: less training RAM, then fewer
instructions). No feasible point: a ParetoError naming the constraint the closest point misses
and by how much. Deterministic: integer training and counts, seeds fixed.
"""
from __future__ import annotations

import copy
import dataclasses
import tempfile

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.cost import BUDGET_KEYS, budget_limits, fits_budget, worst_excess
from tinytrain.graph.precision import PRESETS
from tinytrain.sweep import Costs, run_tasks

DEFAULT_WIDTHS = (0.5, 0.75, 1.0)
DEFAULT_POLICIES = ("int16", "int8-master16")
DEFAULT_SPARSITIES = (0.0, 0.5)
DEFAULT_TRAINS = ("all", "bias", "last:1")
VAL_FRACTION = 0.15
VAL_SEED = 4242  # the validation carve's PRNG seed (apart from the model's and the shuffles')


class ParetoError(ValueError):
    """A grid or budget that cannot be used, or a budget no configuration meets (exit 2)."""


# ----------------------------------------------------------------------------- inputs

def parse_budget(text: str | None) -> dict:
    """``ram=16384,flash=262144,instructions=2000000`` -> {key: int}; bytes and instructions."""
    out = {}
    for part in (text or "").split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("=")
        k = k.strip()
        if not sep or k not in BUDGET_KEYS:
            raise ParetoError(f"--budget {part.strip()!r}: give KEY=INTEGER with KEY one of {', '.join(BUDGET_KEYS)} "
                              "(e.g. ram=16384,instructions=2000000)")
        try:
            n = int(v.strip().replace("_", ""))
        except ValueError:
            n = 0
        if n < 1:
            raise ParetoError(f"--budget {k}={v.strip()!r}: give a positive integer ({'bytes' if k != 'instructions' else 'instructions per sample'})")
        out[k] = n
    return out


def base_spec(model: str, dataset) -> dict:
    """The model description of a built-in name or a .json/.toml model file."""
    from pathlib import Path

    from tinytrain.graph import models

    if model in models.MODELS:
        return models.model_spec(model, dataset)
    if Path(model).suffix.lower() in (".json", ".toml"):
        return models.read_model_file(model)
    raise ParetoError(f"--model {model!r}: pareto trains each configuration from scratch: give a built-in name "
                      f"({', '.join(models.MODELS)}) or a .json/.toml model description")


def scaled(spec: dict, width: float) -> dict:
    """The description with every convolution's filters and every dense layer's units but the
    last (the classes) scaled by `width` (rounded half up, at least 1)."""
    s = copy.deepcopy(spec)
    dense = [i for i, l in enumerate(s["layers"]) if l.get("type") == "dense"]
    for i, l in enumerate(s["layers"]):
        for key in ("filters", "units"):
            if key in l and not (key == "units" and dense and i == dense[-1]):
                l[key] = max(1, int(np.floor(l[key] * width + 0.5)))
    return s


def carve(ds, fraction: float = VAL_FRACTION):
    """(training part, validation part) of ds's training set: the last round(fraction n) of a
    fixed permutation (xorshift32, VAL_SEED) are validation. The validation part is returned
    as a dataset whose *test* split it is, for fit() to report."""
    n = len(ds.x_train)
    k = int(np.floor(n * fraction + 0.5))
    if not 1 <= k < n:
        raise ParetoError(f"--val-fraction {fraction}: leaves {k} of {n} training samples for validation; "
                          "use a fraction in (0, 1) that keeps both parts non-empty")
    _, order = fp.permutation(fp.prng_seed(VAL_SEED), n)
    order = np.asarray(order, np.int64)
    tr, va = np.sort(order[:n - k]), np.sort(order[n - k:])
    part = dataclasses.replace(ds, x_train=ds.x_train[tr], y_train=ds.y_train[tr], float_x_train=ds.float_x_train[tr],
                               x_test=ds.x_train[va], y_test=ds.y_train[va], float_x_test=ds.float_x_train[va])
    return part


@dataclasses.dataclass(frozen=True)
class Grid:
    widths: tuple = DEFAULT_WIDTHS
    policies: tuple = DEFAULT_POLICIES
    sparsities: tuple = DEFAULT_SPARSITIES
    trains: tuple = DEFAULT_TRAINS

    def check(self, spec: dict, dataset) -> None:
        """Every value, before anything trains (a ParetoError names the option)."""
        from tinytrain.graph.layers import ModelError
        from tinytrain.graph.models import from_spec

        for name in ("widths", "policies", "sparsities", "trains"):
            if not getattr(self, name):
                raise ParetoError(f"--{name}: give at least one value")
        bad = [w for w in self.widths if not 0 < w <= 4]
        if bad:
            raise ParetoError(f"--widths: {bad[0]} is not a width factor in (0, 4]")
        bad = [p for p in self.policies if p not in PRESETS]
        if bad:
            raise ParetoError(f"--policies: unknown precision preset {bad[0]!r}: use some of {', '.join(PRESETS)}")
        bad = [s for s in self.sparsities if not 0 <= s < 1]
        if bad:
            raise ParetoError(f"--sparsities: {bad[0]} is not a sparsity in [0, 1)")
        if "all" not in self.trains:
            raise ParetoError("--train: include 'all': partial points start from the host-pretrained 'all' point")
        for t in self.trains:
            try:
                from_spec(spec, dataset, train=t)
            except ModelError as exc:
                raise ParetoError(f"--train {t!r}: {exc}") from None

    def size(self) -> int:
        return len(self.widths) * len(self.policies) * len(self.sparsities) * len(self.trains)


def prune_spec(sparsity: float, steps: int) -> dict | None:
    """Gradual magnitude pruning over the first two thirds of `steps` (None: dense)."""
    if sparsity == 0:
        return None
    end = max(1, 2 * steps // 3)
    return {"schedule": "polynomial", "final_sparsity": float(sparsity), "begin_step": 0, "end_step": end,
            "frequency": max(1, min(100, end))}


# ------------------------------------------------------------------------------ work

def _accuracies(model, part, ds) -> tuple[float, float]:
    from tinytrain.train import evaluate

    return evaluate(model, part)["accuracy"], evaluate(model, ds)["accuracy"]


def _family(t):
    """One width x policy x sparsity: train 'all' from scratch, then each partial training from
    it. Returns (points, models); the device is measured afterwards, one task per point."""
    from tinytrain.graph.convert import with_precision
    from tinytrain.graph.models import from_spec
    from tinytrain.train import fit

    spec, (w, pol, s), trains, part, ds, epochs, device_epochs, seed = t
    sw = scaled(spec, w)
    pr = prune_spec(s, epochs * len(part.x_train))
    if pr is not None:
        sw["prune"] = pr
    pre = from_spec(sw, part, where=spec.get("name", "model"), seed=seed, precision=pol)
    fit(pre, part, epochs, seed=seed, progress=False, log=None)
    points, models = [], []
    for tr in trains:
        if tr == "all":
            m = pre
        else:
            m = with_precision(pre, None, edit=lambda cfg, tr=tr: cfg["optimizer"].update(train=tr))
            fit(m, part, device_epochs, seed=seed, progress=False, log=None)
        val, test = _accuracies(m, part, ds)
        points.append({"width": w, "policy": pol, "sparsity": s, "train": tr, "params": m.param_count(),
                       "val_accuracy": val, "test_accuracy": test})
        models.append((m, _description(sw, pol, tr)))
    return points, models


def _measure(t):
    """The device figures of one point: linked sizes, then QEMU if the board and the RAM/flash
    budget allow."""
    m, costs, budget = t
    c = costs(m, instructions=False)
    if fits_budget(c, {k: v for k, v in budget.items() if k != "instructions"}):
        c = costs(m)
    return {"fits": c["fits"], "why": c["why"], "shadow": c["shadow"], "training_ram": c["training_ram"],
            "ram_total": c["ram_total"], "flash_total": c["flash_total"],
            "instructions_per_sample": c["instructions_per_sample"], "verified_steps": c["steps"]}


def _description(spec: dict, policy: str, train: str) -> dict:
    """The chosen configuration as a model file (.json): layers, policy, pruning, what trains."""
    d = copy.deepcopy(spec)
    d["precision"] = policy
    d.setdefault("optimizer", {})["train"] = train
    return d


def frontier(points: list[dict], x: str, y: str = "val_accuracy") -> list[int]:
    """Indices of the points no other beats: higher `y` at no more `x`, or as high at less
    (points with x None are left out). Order: by x ascending; among equal points the first."""
    cand = [i for i, p in enumerate(points) if p.get(x) is not None]
    cand.sort(key=lambda i: (points[i][x], -points[i][y], i))
    out, best = [], -np.inf
    for i in cand:
        if points[i][y] > best:
            out.append(i)
            best = points[i][y]
    return out


def closest_miss(points: list[dict], budget: dict, board_ram: int, board_flash: int) -> str:
    """The one line for a budget no point meets: the point whose worst excess is smallest, its
    worst constraint and by how much."""
    limits = budget_limits({"board_ram": board_ram, "board_flash": board_flash}, budget)
    best = None
    for p in points:
        worst = worst_excess(p, limits)
        if best is None or worst < best[0]:
            best = (worst, p)
    (excess, key, have, lim), p = best
    src = ("--budget " + key) if key in budget and budget[key] <= {"ram": board_ram, "flash": board_flash}.get(key, lim) \
        else f"the board's {key}"
    unit = "instructions per sample" if key == "instructions" else "B"
    return (f"no configuration meets {src} = {lim}: the closest ({label(p)}) needs {have} {unit}, "
            f"{have - lim} over ({100 * excess:.1f} %); raise the budget or widen the grid")


def label(p: dict) -> str:
    return f"width {p['width']:g}, {p['policy']}, sparsity {p['sparsity']:g}, train {p['train']}"


def pareto(model: str, dataset, board: str, *, budget: dict | None = None, grid: Grid = Grid(),
           epochs: int = 20, device_epochs: int = 2, seed: int = 0, val_fraction: float = VAL_FRACTION,
           steps: int = 20, jobs: int = 1, progress=None) -> dict:
    """Sweep `grid` for `model` on `board` (see the module). Returns the report; the trained
    models of the points are in report["_models"] (not JSON) for :func:`write_chosen`."""
    from tinytrain.device.boards import get_board
    from tinytrain.sensitivity import emulated

    budget = dict(budget or {})
    board = emulated(board)
    b = get_board(board)
    spec = base_spec(model, dataset)
    grid.check(spec, dataset)
    part = carve(dataset, val_fraction)
    families = [(w, p, s) for w in grid.widths for p in grid.policies for s in grid.sparsities]
    tasks = [(spec, f, tuple(grid.trains), part, dataset, int(epochs), int(device_epochs), int(seed)) for f in families]
    if progress is not None:
        progress.reset(total=len(tasks) + grid.size())
    results, trained = run_tasks(_family, tasks, jobs, progress)
    points, models = [], []
    for ps, ms in results:
        points += ps
        models += ms
    own = tempfile.TemporaryDirectory(prefix="tinytrain-pareto-")
    try:
        costs = Costs(board, part, steps, own.name)
        costs.prepare()
        measured, work = run_tasks(_measure, [(m, costs, budget) for m, _ in models], jobs, progress)
    finally:
        own.cleanup()
    for p, c in zip(points, measured):
        p.update(c)
    for i, p in enumerate(points):
        p["id"] = i
        p["feasible"] = fits_budget(p, budget)
    feas = [p for p in points if p["feasible"]]
    if not feas:
        raise ParetoError(closest_miss(points, budget, b.ram, b.flash))
    fr_ram = [feas[i]["id"] for i in frontier(feas, "training_ram")]
    fr_ins = [feas[i]["id"] for i in frontier(feas, "instructions_per_sample")]
    chosen = min(feas, key=lambda p: (-p["val_accuracy"], p["training_ram"], p["instructions_per_sample"], p["id"]))
    for p in points:
        p["frontier"] = p["id"] in fr_ram or p["id"] in fr_ins
    return {"model": model, "data": dataset.name, "board": board, "board_ram": b.ram, "board_flash": b.flash,
            "budget": budget, "grid": dataclasses.asdict(grid), "epochs": epochs, "device_epochs": device_epochs,
            "seed": seed, "val_fraction": val_fraction, "train_samples": int(len(part.x_train)),
            "val_samples": int(len(part.x_test)), "steps": steps, "points": points,
            "frontier_training_ram": fr_ram, "frontier_instructions": fr_ins, "chosen": chosen["id"],
            "work": {"training": trained, "device": work}, "_models": models}


def write_chosen(r: dict, path) -> None:
    """The chosen point as a model file: ``.tt`` its trained model with its training state
    (what codegen/build/verify take to deploy it), ``.json`` its configuration (a model
    description: built fresh, untrained)."""
    import json
    from pathlib import Path

    from tinytrain.graph import io as tio

    m, desc = r["_models"][r["chosen"]]
    p = Path(path)
    if p.suffix.lower() == ".json":
        tio.atomic_write(p, lambda f: f.write(json.dumps(desc, indent=2).encode() + b"\n"))
    else:
        tio.save(m, p, {"dataset": r["data"], "pareto": {k: v for k, v in r["points"][r["chosen"]].items()}})


def check_out(path) -> None:
    from pathlib import Path

    from tinytrain.graph import io as tio

    if Path(path).suffix.lower() not in (".tt", ".json"):
        raise ParetoError(f"--out {path}: write the chosen configuration as .tt (trained, with its state) or .json "
                          "(its model description)")
    tio.check_writable(path)


# ------------------------------------------------------------------------------ output

def table(r: dict) -> str:
    lines = [f"{r['model']} on {r['board']} ({r['board_ram']} B RAM): {len(r['points'])} points, "
             f"validation {r['val_samples']} of the training samples; budget {r['budget'] or 'none'}",
             f"{'id':>3s} {'width':>5s} {'policy':14s} {'sparse':>6s} {'train':7s} {'val %':>6s} {'test %':>6s} "
             f"{'train RAM':>9s} {'RAM':>6s} {'flash':>6s} {'instr/sample':>12s}  "]
    for p in r["points"]:
        ins = "-" if p["instructions_per_sample"] is None else f"{p['instructions_per_sample']:.0f}"
        mark = ("*" if p["id"] == r["chosen"] else "F" if p["frontier"] else "") + \
               ("" if p["fits"] else " does not fit") + ("" if p["feasible"] or not p["fits"] else " over budget")
        lines.append(f"{p['id']:3d} {p['width']:5g} {p['policy']:14s} {p['sparsity']:6g} {p['train']:7s} "
                     f"{100 * p['val_accuracy']:6.2f} {100 * p['test_accuracy']:6.2f} {p['training_ram']:9d} "
                     f"{p['ram_total']:6d} {p['flash_total'] or 0:6d} {ins:>12s}  {mark}")
    c = r["points"][r["chosen"]]
    lines.append(f"F: on a frontier (accuracy vs training RAM or vs instructions); *: chosen, {label(c)}: "
                 f"validation {100 * c['val_accuracy']:.2f} %, test {100 * c['test_accuracy']:.2f} %, "
                 f"{c['ram_total']} B RAM, verified {c['verified_steps']} steps on {r['board']}")
    return "\n".join(lines)


def plot(r: dict, path) -> None:
    """Validation accuracy against training RAM and against instructions per sample: every
    point, the feasible ones in colour, the frontiers as steps, the chosen one starred."""
    from pathlib import Path

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from tinytrain.graph.io import atomic_write

    pts = r["points"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, x, fr, name in ((axes[0], "training_ram", r["frontier_training_ram"], "training RAM (B)"),
                            (axes[1], "instructions_per_sample", r["frontier_instructions"], "instructions per sample (QEMU)")):
        for p in pts:
            if p[x] is None:
                continue
            ax.scatter(p[x], 100 * p["val_accuracy"], s=22, color="C0" if p["feasible"] else "0.75",
                       marker="o" if p["train"] == "all" else "^")
        f = [pts[i] for i in fr]
        ax.step([p[x] for p in f], [100 * p["val_accuracy"] for p in f], where="post", color="C3", label="frontier")
        c = pts[r["chosen"]]
        ax.scatter(c[x], 100 * c["val_accuracy"], s=160, marker="*", color="C1", zorder=3, label="chosen")
        ax.set_xlabel(name)
        ax.set_ylabel("validation accuracy (%)")
        ax.grid(alpha=0.3)
    axes[0].legend(loc="best")
    fig.suptitle(f"{r['model']} on {r['board']}: grey does not fit or is over budget; triangles train part")
    fig.tight_layout()
    atomic_write(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)


def public(r: dict) -> dict:
    """The report without the trained models (JSON)."""
    return {k: v for k, v in r.items() if not k.startswith("_")}
