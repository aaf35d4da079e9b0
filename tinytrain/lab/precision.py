"""The precision lab: a workload's float twin trained in the float formats of the low-precision
training literature, per tensor role, beside tinytrain's integer policies, in one table.

Host only: these formats never reach the device (soft-float would break the integer-only
proof); they are here for comparison and for host pre-training.

Formats (casts by ml_dtypes, whose casts do not saturate: values are clipped to the format's
largest finite value first, and a clipped value counts as an overflow): ``fp32``, ``tf32`` (fp32
with the mantissa rounded to 10 bits, nearest-even), ``fp16``, ``bf16``, ``fp8_e4m3`` (E4M3FN,
max 448), ``fp8_e5m2`` (max 57344). Rounding is to nearest-even, or stochastic (``sr``: up or down
with probability proportional to the distance) for the weight storage.

A recipe gives a format to each role, with straight-through fake quantization:

- ``weights``: the copy forward and backward compute with. With ``master`` an fp32 master copy
  takes the optimizer's update and the compute copy is cast from it every step; without, the
  weights live in their format and each update is cast back (and may round to nothing);
- ``activations``: every layer's output, in training and in evaluation;
- ``gradients``: the errors flowing back into every layer's output, and the weight gradients.

Loss scaling (GradScaler semantics): ``none``; ``static`` (the loss times 2^8, gradients divided
back before the update); ``dynamic`` (start 2^16; a step whose gradients overflow the gradient
format is skipped and the scale halved; after 2000 clean steps it doubles). FP8 ``delayed``
scaling (Transformer Engine's recipe): each FP8 tensor is multiplied by fmax / max(amax history)
before the cast and divided after, the history holding the last 16 steps' amax of that tensor
(margin 0); the ``hybrid`` recipe is E4M3 forward (weights, activations), E5M2 backward.

Training: SGD as the float twins (``twins.train``) but on mini-batches (``--batch-size``, default
32, lr scaled by the batch size's square root) so the whole table fits in minutes; the integer rows
train as tinytrain does (batch 1, the workload's own hyper-parameters).
"""
from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

FORMATS = ("fp32", "tf32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2")
BYTES = {"fp32": 4, "tf32": 4, "fp16": 2, "bf16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1}
STATIC_SCALE = 2.0**8
DYNAMIC_INIT, GROWTH_INTERVAL = 2.0**16, 2000
AMAX_HISTORY, MARGIN = 16, 0


def _dtype(fmt):
    import ml_dtypes
    return {"fp16": np.float16, "bf16": ml_dtypes.bfloat16, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
            "fp8_e5m2": ml_dtypes.float8_e5m2}[fmt]


def fmax(fmt) -> float:
    import ml_dtypes
    if fmt in ("fp32", "tf32"):
        return float(np.finfo(np.float32).max)
    return float(ml_dtypes.finfo(_dtype(fmt)).max)


@dataclasses.dataclass
class Counts:
    """Per role: values cast, nonzero values that became zero (underflow), values clipped."""
    cast: int = 0
    underflow: int = 0
    overflow: int = 0


def cast(a: np.ndarray, fmt: str, counts: Counts | None = None, rng: np.random.Generator | None = None) -> np.ndarray:
    """``a`` (float32) rounded into ``fmt`` and back to float32: nearest-even, or stochastic
    with ``rng``; clipped to the format's range first (counted as overflow)."""
    a = np.asarray(a, np.float32)
    if fmt == "fp32":
        q = a
    elif fmt == "tf32":
        i = a.view(np.int32)
        q = ((i + 0x0FFF + ((i >> 13) & 1)) & ~np.int32(0x1FFF)).view(np.float32)
    else:
        dt, mx = _dtype(fmt), fmax(fmt)
        over = np.abs(a) > mx
        c = np.clip(a, -mx, mx)
        qd = c.astype(dt)
        if rng is not None:
            err = c - qd.astype(np.float32)
            # step toward the largest finite value of the error's sign (E4M3FN has no infinity:
            # its inf is NaN, and nextafter toward NaN is NaN)
            toward = np.where(err > 0, np.float32(mx), np.float32(-mx)).astype(dt)
            other = np.nextafter(qd, toward)
            span = np.abs(other.astype(np.float32) - qd.astype(np.float32))
            with np.errstate(invalid="ignore", divide="ignore"):
                p = np.where(span > 0, np.abs(err) / np.where(span > 0, span, 1), 0)
            qd = np.where(rng.random(a.shape) < p, other, qd)
        q = qd.astype(np.float32)
        if counts is not None:
            counts.overflow += int(over.sum())
    if counts is not None:
        counts.cast += a.size
        counts.underflow += int(np.count_nonzero((a != 0) & (q == 0)))
    return q


class _Delayed:
    """Delayed scaling of one FP8 tensor: the scale from the amax of its previous steps."""

    def __init__(self, fmt):
        self.fmt, self.hist = fmt, []

    def __call__(self, a, counts, rng=None):
        amax = float(np.abs(a).max(initial=0.0))
        ref = max(self.hist) if self.hist else amax
        self.hist = (self.hist + [amax])[-AMAX_HISTORY:]
        if ref == 0 or not math.isfinite(ref):
            return cast(a, self.fmt, counts, rng)
        s = np.float32(fmax(self.fmt) / ref / 2.0**MARGIN)
        return cast(a * s, self.fmt, counts, rng) / s


class LossScale:
    """GradScaler's semantics: ``none`` (1, never skips), ``static`` (STATIC_SCALE; a step whose
    gradients overflow is skipped), ``dynamic`` (DYNAMIC_INIT; an overflow skips the step and
    halves the scale, GROWTH_INTERVAL clean steps in a row double it)."""

    def __init__(self, kind: str):
        self.kind, self.clean = kind, 0
        self.scale = {"none": 1.0, "static": STATIC_SCALE, "dynamic": DYNAMIC_INIT}[kind]

    def step(self, overflow: bool) -> bool:
        """Record one step's outcome; True: skip its update."""
        if self.kind == "none":
            return False
        if overflow:
            if self.kind == "dynamic":
                self.scale, self.clean = self.scale / 2, 0
            return True
        if self.kind == "dynamic":
            self.clean += 1
            if self.clean == GROWTH_INTERVAL:
                self.scale, self.clean = self.scale * 2, 0
        return False


@dataclasses.dataclass(frozen=True)
class Recipe:
    name: str
    weights: str = "fp32"
    activations: str = "fp32"
    gradients: str = "fp32"
    master: bool = False
    loss_scale: str = "none"       # none | static | dynamic
    delayed: bool = False          # FP8 delayed scaling
    sr: bool = False               # stochastic rounding of the weight storage


RECIPES = [
    Recipe("fp32"),
    Recipe("tf32", "tf32", "tf32", "tf32"),
    Recipe("fp16", "fp16", "fp16", "fp16"),
    Recipe("fp16 + master", "fp16", "fp16", "fp16", master=True),
    Recipe("fp16 + master + static scale", "fp16", "fp16", "fp16", master=True, loss_scale="static"),
    Recipe("fp16 + master + dynamic scale", "fp16", "fp16", "fp16", master=True, loss_scale="dynamic"),
    Recipe("bf16", "bf16", "bf16", "bf16"),
    Recipe("bf16 + sr", "bf16", "bf16", "bf16", sr=True),
    Recipe("bf16 + master", "bf16", "bf16", "bf16", master=True),
    # the same without the BF16 errors and weight gradients: which role costs what (W2, docs/precision-lab.md)
    Recipe("bf16 + master, fp32 gradients", "bf16", "bf16", "fp32", master=True),
    Recipe("fp8 e4m3 + master", "fp8_e4m3", "fp8_e4m3", "fp8_e4m3", master=True),
    Recipe("fp8 e5m2 + master", "fp8_e5m2", "fp8_e5m2", "fp8_e5m2", master=True),
    Recipe("fp8 hybrid + master", "fp8_e4m3", "fp8_e4m3", "fp8_e5m2", master=True),
    Recipe("fp8 hybrid + master + delayed scaling", "fp8_e4m3", "fp8_e4m3", "fp8_e5m2", master=True, delayed=True),
]


def recipe(name: str) -> Recipe:
    for r in RECIPES:
        if r.name == name:
            return r
    raise ValueError(f"unknown recipe {name!r}: known are {', '.join(r.name for r in RECIPES)}")


class _Quantizer:
    """The casts of one training run: per tensor (delayed scaling keeps one history each)."""

    def __init__(self, r: Recipe, seed: int):
        self.r, self.counts = r, {"weights": Counts(), "activations": Counts(), "gradients": Counts()}
        self.delayed, self.rng = {}, np.random.default_rng(10_000 + seed)

    def __call__(self, role, key, a, sr=False):
        fmt = getattr(self.r, role)
        rng = self.rng if sr else None
        if self.r.delayed and fmt.startswith("fp8"):
            d = self.delayed.setdefault((role, key), _Delayed(fmt))
            return d(a, self.counts[role], rng)
        return cast(a, fmt, self.counts[role], rng)


def _instrument(net, q: _Quantizer):
    """Fake-quantize every layer's output (straight-through) and the error flowing into it."""
    import torch

    def hook(mod, inp, out, key):
        qa = torch.from_numpy(q("activations", key, out.detach().numpy()))
        y = out + (qa - out).detach()
        if y.requires_grad:
            y.register_hook(lambda g: torch.from_numpy(q("gradients", ("err", key), g.numpy())))
        return y
    return [m.register_forward_hook(lambda mod, i, o, k=k: hook(mod, i, o, k)) for k, m in enumerate(net)]


def float_lr(wl, batch_size: int) -> float:
    """The float twins' learning rate: the workload's ``lab_lr`` when it has one (W2: its
    integer lr scaled by sqrt(32) is at the edge of stability at batch 32), else its lr times
    the square root of the batch size."""
    return wl.lab_lr if wl.lab_lr is not None else wl.lr * math.sqrt(batch_size)


def train_float(wl, ds, seed: int, r: Recipe, epochs: int, batch_size: int, schedule: str = "constant",
                lr: float | None = None) -> dict:
    """One float-twin run under recipe r; returns its accuracy and counts.  schedule "cosine":
    the lr follows tinytrain's cosine table over the run's updates (as twins.train); lr None:
    `float_lr`."""
    import torch
    import torch.nn.functional as F

    from tinytrain.lab import twins
    from tinytrain.lab.workloads import epoch_orders

    torch.manual_seed(seed)
    net = twins.twin(wl.name, seed)
    q = _Quantizer(r, seed)
    hooks = _instrument(net, q)
    params = [p for p in net.parameters()]
    names = [n for n, _ in net.named_parameters()]
    masters = [p.detach().clone() for p in params] if r.master else None
    with torch.no_grad():  # the weights start in their format
        for i, p in enumerate(params):
            p.copy_(torch.from_numpy(q("weights", names[i], p.numpy())))
    xtr, xte = wl.float_inputs(ds)
    xt, yt = torch.from_numpy(np.ascontiguousarray(xtr)), torch.from_numpy(ds.y_train.astype(np.int64))
    lr = float_lr(wl, batch_size) if lr is None else float(lr)
    ls = LossScale(r.loss_scale)
    skipped = steps = 0
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule {schedule!r}: use constant or cosine")
    f = twins.cosine_factors() if schedule == "cosine" else None
    total = epochs * -(-len(xtr) // batch_size)
    net.train()
    for order in epoch_orders(seed, len(xtr), epochs):
        idx = torch.from_numpy(order)
        for s in range(0, len(idx), batch_size):
            b = idx[s:s + batch_size]
            if r.master:
                with torch.no_grad():
                    for i, p in enumerate(params):
                        p.copy_(torch.from_numpy(q("weights", names[i], masters[i].numpy())))
            for p in params:
                p.grad = None
            loss = F.cross_entropy(net(xt[b]), yt[b])
            if ls.scale != 1.0:
                loss = loss * ls.scale
            over0 = q.counts["gradients"].overflow
            loss.backward()
            grads = [q("gradients", ("w", names[i]), p.grad.numpy()) for i, p in enumerate(params)]
            overflow = q.counts["gradients"].overflow > over0 or not all(np.isfinite(g).all() for g in grads)
            steps += 1
            s = ls.scale  # the scale this step's gradients carry (step() may change it)
            if ls.step(overflow):
                skipped += 1
                continue
            lr_t = lr if f is None else lr * float(f[min(len(f) - 1, (len(f) - 1) * (steps - 1) // total)])
            with torch.no_grad():
                for i, p in enumerate(params):
                    g = torch.from_numpy(grads[i] if s == 1.0 else grads[i] / np.float32(s))
                    if r.master:
                        masters[i].add_(g, alpha=-lr_t)
                    else:
                        p.add_(g, alpha=-lr_t)  # as torch.optim.SGD: fp32 equals twins.train exactly
                        if r.weights != "fp32":
                            p.copy_(torch.from_numpy(q("weights", names[i], p.numpy(), sr=r.sr)))
    if r.master:
        with torch.no_grad():
            for i, p in enumerate(params):
                p.copy_(torch.from_numpy(q("weights", names[i], masters[i].numpy())))
    acc = twins.accuracy(net, xte, ds.y_test)
    for h in hooks:
        h.remove()
    return {"accuracy": acc, "steps": steps, "skipped_steps": skipped, "final_scale": ls.scale, "net": net,
            "masters": None if masters is None else [m.numpy() for m in masters],
            "counts": {k: dataclasses.asdict(v) for k, v in q.counts.items()}}


def _role_bytes(wl, ds, r: Recipe | None) -> dict:
    """Bytes per tensor role of one training sample: weights (+ master), activations kept,
    errors (gradients of the activations) and weight gradients."""
    m = wl.model(ds, 0)
    n_w = m.param_count()
    n_a = sum(l.out_size for l in m.layers)
    if r is None:  # tinytrain's integer policy (today): int16 weights, int32 bias, int8 act/err
        w = sum(p.data.nbytes for l in m.layers for p in l.params if p.trainable)
        return {"weights": w, "master": 0, "activations": n_a, "errors": n_a, "weight_gradients": 4 * n_w}
    return {"weights": BYTES[r.weights] * n_w, "master": 4 * n_w if r.master else 0,
            "activations": BYTES[r.activations] * n_a, "errors": BYTES[r.gradients] * n_a,
            "weight_gradients": BYTES[r.gradients] * n_w}


#: tinytrain's integer rows: optimizer overrides, and a "precision" policy (graph/precision.py)
INTEGER_POLICIES = {
    "tinytrain int16 w / int8 act+err (today)": {},
    "tinytrain + int32 master": {"master_weights": True},
    "tinytrain + stochastic rounding": {"stochastic_rounding": True},
    "tinytrain int8 w, no master (stochastic rounding)": {"precision": "int8"},
    "tinytrain int8 w + int16 master": {"precision": "int8-master16"},
    # loss scaling in integer (graph/loss_scale.py): the head's error at a static or a GradScaler exponent
    "tinytrain static loss scale 2^6": {"precision": {"loss_scale": "static:init_scale=6"}},
    "tinytrain global loss scale (GradScaler, 2^7, 200)": {"precision": {"loss_scale": "global"}},
}


def integer_model(wl, ds, seed: int, overrides: dict):
    """The workload's integer model with optimizer overrides and a "precision" policy."""
    from tinytrain.graph.model import Sequential

    m = wl.model(ds, seed)
    if overrides:
        cfg = m.config()
        over = dict(overrides)
        if "precision" in over:
            cfg["precision"] = over.pop("precision")
        cfg["optimizer"].update(over)
        base, m = m, Sequential.from_config(cfg)
        if "data_input_exp" in base.__dict__:
            m.data_input_exp = base.data_input_exp
    return m


def train_integer(wl, ds, seed: int, opt_overrides: dict) -> dict:
    from tinytrain.lab.workloads import epoch_orders
    from tinytrain.sim.simulator import Simulator

    m = integer_model(wl, ds, seed, opt_overrides)
    sim = Simulator(m)
    steps = 0
    for order in epoch_orders(seed, len(ds.x_train), wl.epochs):
        sim.train(ds.x_train, ds.y_train, order)
        steps += len(order)
    return {"accuracy": float((sim.predict(ds.x_test) == ds.y_test).mean()), "steps": steps,
            "skipped_steps": int(m.scaler[2]) if m.loss_scale.mode == "global" else 0,
            "scaler": [int(v) for v in m.scaler] if m.loss_scale.enabled else None,  # [E, clean, overflow steps]
            "act_saturations": int(m.stats[0]), "weight_saturations": int(m.stats[1]),
            "update_underflows": int(m.stats[2])}


def validation_split(ds, fraction: float):
    """``ds`` with its test split replaced by a held-out part of its training set: the last
    ``fraction`` of a fixed permutation (PRNG seed 999) of the training samples, the rest
    training.  For choosing a recipe without looking at the test set."""
    if not 0 < fraction < 1:
        raise ValueError(f"validation fraction {fraction!r}: use a number between 0 and 1, e.g. 0.2")
    order = np.random.default_rng(999).permutation(len(ds.x_train))
    n_val = int(round(fraction * len(order)))
    tr, va = np.sort(order[:-n_val]), np.sort(order[-n_val:])
    return dataclasses.replace(ds, name=f"{ds.name} (validation {fraction:g} of train)",
                               x_train=ds.x_train[tr], y_train=ds.y_train[tr], float_x_train=ds.float_x_train[tr],
                               x_test=ds.x_train[va], y_test=ds.y_train[va], float_x_test=ds.float_x_train[va])


def _load(workload: str, validation: float):
    from tinytrain.lab.workloads import WORKLOADS
    wl = WORKLOADS[workload]
    ds = wl.load()
    return wl, (validation_split(ds, validation) if validation else ds)


def _one_run(task):
    """One training run of `run`'s table (a module-level function: jobs > 1 pickles it)."""
    import torch
    torch.set_num_threads(1)  # small models: threads only contend (and the machine is shared)
    kind, workload, validation, seed, what, epochs, batch_size, schedule, lr = task
    wl, ds = _load(workload, validation)
    if kind == "float":
        out = train_float(wl, ds, seed, recipe(what) if isinstance(what, str) else what, epochs, batch_size, schedule, lr)
        out.pop("net"), out.pop("masters")
        return out
    return train_integer(wl, ds, seed, INTEGER_POLICIES[what] if isinstance(what, str) else what)


def run(workload: str, seeds=(0, 1, 2), recipes=None, epochs: int | None = None, batch_size: int = 32,
        integer: bool = True, progress=None, schedule: str | None = None, lr: float | None = None,
        validation: float = 0.0, jobs: int = 1) -> dict:
    """The lab's table for one workload: accuracy mean and std over seeds, bytes per role,
    skipped steps and underflow fractions per recipe, then tinytrain's integer policies.
    schedule: the float twins' lr schedule (None: the workload's ``lab_schedule``);
    lr: the float twins' (None: `float_lr`); validation > 0: accuracies on that held-out
    fraction of the training set instead of the test set (`validation_split`); jobs: training
    runs at once in worker processes (each run is the same computation as with jobs 1)."""
    from tinytrain.lab.workloads import WORKLOADS

    if workload not in WORKLOADS:
        raise ValueError(f"unknown workload {workload!r}: use one of {', '.join(WORKLOADS)}")
    wl, ds = _load(workload, validation)
    recipes = list(RECIPES) if recipes is None else [recipe(n) if isinstance(n, str) else n for n in recipes]
    epochs = (wl.lab_epochs or wl.epochs) if epochs is None else int(epochs)
    schedule = wl.lab_schedule if schedule is None else schedule
    if schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule {schedule!r}: use constant or cosine")
    lr = float_lr(wl, batch_size) if lr is None else float(lr)
    tasks = [("float", workload, validation, s, r, epochs, batch_size, schedule, lr) for r in recipes for s in seeds]
    policies = list(INTEGER_POLICIES.items()) if integer else []
    tasks += [("integer", workload, validation, s, name, None, None, None, None) for name, _ in policies for s in seeds]
    t0, results = time.time(), []

    def done(out):
        results.append(out)
        if progress is not None:
            progress.update(1)
    if jobs > 1:
        import concurrent.futures as cf
        import multiprocessing as mp
        with cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn")) as ex:
            futures = [ex.submit(_one_run, t) for t in tasks]
            for f in futures:
                done(f.result())
    else:
        for t in tasks:
            done(_one_run(t))
    seconds = (time.time() - t0) / max(1, len(tasks))  # per run, spread evenly (jobs > 1 overlaps them)
    rows, k = [], 0
    for r in recipes:
        runs, k = results[k:k + len(seeds)], k + len(seeds)
        acc = 100 * np.array([x["accuracy"] for x in runs])
        under = {role: (sum(x["counts"][role]["underflow"] for x in runs) / max(1, sum(x["counts"][role]["cast"] for x in runs)))
                 for role in ("weights", "activations", "gradients")}
        rows.append({"recipe": r.name, "kind": "float", **dataclasses.asdict(r), "accuracy_mean": float(acc.mean()),
                     "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                     "accuracies": [float(a) for a in acc], "skipped_steps": [x["skipped_steps"] for x in runs],
                     "underflow_fraction": under,
                     "overflows": {role: sum(x["counts"][role]["overflow"] for x in runs) for role in under},
                     "bytes": _role_bytes(wl, ds, r), "seconds": seconds * len(seeds)})
    for name, over in policies:
        runs, k = results[k:k + len(seeds)], k + len(seeds)
        acc = 100 * np.array([x["accuracy"] for x in runs])
        b = _role_bytes(wl, ds, None)
        built = integer_model(wl, ds, 0, over)  # the policy's widths, masters of the tensors it gives one
        b["weights"] = sum(p.data.nbytes for l in built.layers for p in l.params if p.trainable)
        b["master"] = sum(v.nbytes for v in built.master.values())
        grads = max(1, sum(x["steps"] for x in runs))
        rows.append({"recipe": name, "kind": "integer", "optimizer": over, "accuracy_mean": float(acc.mean()),
                     "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
                     "accuracies": [float(a) for a in acc], "skipped_steps": [x["skipped_steps"] for x in runs],
                     "update_underflows_per_step": sum(x["update_underflows"] for x in runs) / grads,
                     "saturations": {"activations": sum(x["act_saturations"] for x in runs),
                                     "weights": sum(x["weight_saturations"] for x in runs)},
                     "bytes": b, "seconds": seconds * len(seeds)})
    base = next((r["accuracy_mean"] for r in rows if r["recipe"] == "fp32"), None)
    for row in rows:
        row["vs_fp32_points"] = None if base is None else row["accuracy_mean"] - base
    return {"workload": workload, "title": wl.title, "seeds": list(seeds), "epochs": epochs,
            "batch_size": batch_size, "schedule": schedule, "lr_float": lr, "validation": validation,
            "rows": rows}


def n_runs(seeds, recipes, integer) -> int:
    return len(seeds) * ((len(RECIPES) if recipes is None else len(recipes)) + (len(INTEGER_POLICIES) if integer else 0))


FAIL_POINTS = 1.0  # a float recipe "fails" when its mean is more than this many points under fp32

#: (recipe, the same formats with the help added, what the help is)
HELPS = [("fp16", "fp16 + master", "master weights"), ("bf16", "bf16 + master", "master weights"),
         ("bf16", "bf16 + sr", "stochastic rounding"),
         ("bf16 + master", "bf16 + master, fp32 gradients", "fp32 gradients"),
         ("fp16 + master", "fp16 + master + static scale", "static loss scaling"),
         ("fp16 + master", "fp16 + master + dynamic scale", "dynamic loss scaling"),
         ("fp8 e4m3 + master", "fp8 hybrid + master", "E5M2 gradients"),
         ("fp8 hybrid + master", "fp8 hybrid + master + delayed scaling", "delayed scaling")]


def failures(res: dict, points: float = FAIL_POINTS) -> str:
    """One line: the float recipes more than `points` under fp32, and for each what the help
    of HELPS (master weights, loss or delayed scaling, ...) brings it to; '' without fp32."""
    rows = {r["recipe"]: r for r in res["rows"] if r["kind"] == "float"}
    if "fp32" not in rows:
        return ""
    d = {n: r["accuracy_mean"] - rows["fp32"]["accuracy_mean"] for n, r in rows.items()}
    failed = [n for n in rows if d[n] < -points]
    out = []
    for n in failed:
        helped = [f"{what} {d[h]:+.2f}" for base, h, what in HELPS if base == n and h in d]
        out.append(f"{n} {d[n]:+.2f}" + (f" (with {', '.join(helped)})" if helped else ""))
    return (f"fail (more than {points:g} point under fp32): " + ("; ".join(out) if out else "none")
            + "; vs fp32, mean over the seeds")


def format_table(res: dict) -> str:
    out = [f"precision lab: {res['workload']} ({res['title']}), seeds {res['seeds']}, float twins {res['epochs']} epochs "
           f"at batch {res['batch_size']} (lr {res['lr_float']:.3g}{', cosine' if res.get('schedule') == 'cosine' else ''}); integer rows as tinytrain trains (batch 1)"
           + (f"; accuracy on a validation split ({res['validation']:g} of train), not the test set" if res.get("validation") else ""),
           f"{'recipe':<42} {'accuracy %':>14} {'vs fp32':>8} {'skipped':>8} {'underflow w/a/g %':>20} {'bytes w+m/a/e/g':>24}"]
    for r in res["rows"]:
        acc = f"{r['accuracy_mean']:.2f} ± {r['accuracy_std']:.2f}"
        vs = "" if r["vs_fp32_points"] is None else f"{r['vs_fp32_points']:+.2f}"
        if r["kind"] == "float":
            u = r["underflow_fraction"]
            uf = f"{100 * u['weights']:.1f}/{100 * u['activations']:.1f}/{100 * u['gradients']:.1f}"
        else:
            uf = f"{r['update_underflows_per_step']:.0f} upd/step"
        b = r["bytes"]
        by = f"{b['weights'] + b['master']}/{b['activations']}/{b['errors']}/{b['weight_gradients']}"
        out.append(f"{r['recipe']:<42} {acc:>14} {vs:>8} {sum(r['skipped_steps']):>8} {uf:>20} {by:>24}")
    fails = failures(res)
    return "\n".join(out + ([fails] if fails else []))


def plot(results: list[dict], path: str) -> None:
    """Accuracy (mean ± std) per recipe, one panel per workload."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(7 * len(results), 6), squeeze=False)
    for ax, res in zip(axes[0], results):
        rows = res["rows"]
        y = np.arange(len(rows))
        ax.barh(y, [r["accuracy_mean"] for r in rows], xerr=[r["accuracy_std"] for r in rows],
                color=["tab:orange" if r["kind"] == "integer" else "tab:blue" for r in rows])
        ax.set_yticks(y, [r["recipe"] for r in rows], fontsize=8)
        ax.invert_yaxis()
        lo = min(r["accuracy_mean"] for r in rows)
        ax.set_xlim(max(0, lo - 5), 100)
        ax.set_xlabel("test accuracy % (mean ± std over seeds)")
        ax.set_title(f"{res['workload']} {res['title']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
