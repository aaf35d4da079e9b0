"""Training loop on the host: epochs, deterministic shuffling, metrics, checkpoints, resume.

Two PRNGs, never mixed: the model's training PRNG (``model.meta[0]``, stochastic rounding,
consumed inside a step exactly as on the device) and the *data* PRNG that orders the samples:
``state = prng_seed(seed ^ 0x5EED)``, then per epoch ``state, order = permutation(state, n)``.
A checkpoint stores the data PRNG state after its last completed epoch, so training
2 epochs + save + load + 2 epochs leaves the same state hash as 4 epochs straight.

Floats appear only in the metrics (loss in nats, accuracies), computed from integer outputs:
loss_q16 is log2 units in Q16, so loss_nats = loss_q16 / 65536 * ln 2.
"""
from __future__ import annotations

import dataclasses
import math
import time
import warnings
from pathlib import Path

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.data import DataError, Dataset, quantize_inputs

DATA_SEED_XOR = 0x5EED
_CHUNK = 2048  # samples per simulator call (progress granularity)


class TrainError(ValueError):
    """Training cannot start or continue (bad arguments, incompatible checkpoint)."""


class TrainWarning(UserWarning):
    """The first epoch shows the model cannot learn (dead layer, every update rounded to zero)."""


def data_prng(seed: int) -> int:
    return fp.prng_seed(int(seed) ^ DATA_SEED_XOR)


def loss_nats(loss_q16) -> float:
    return float(np.mean(loss_q16)) / 65536.0 * math.log(2.0)


@dataclasses.dataclass
class History:
    """Per-epoch metrics. ``epochs`` is a list of dicts with keys epoch, train_loss (nats),
    train_accuracy (online, during the epoch), test_accuracy, act_saturations,
    weight_saturations, update_underflows (nonzero gradients whose weight step rounded to 0:
    consider stochastic rounding or master weights when large), seconds, samples."""

    epochs: list = dataclasses.field(default_factory=list)
    seed: int = 0
    data_input_exp: int | None = None
    resumed_from: int = 0

    def __getitem__(self, key):
        return [e[key] for e in self.epochs]

    @property
    def last(self) -> dict:
        return self.epochs[-1] if self.epochs else {}

    @property
    def train_seconds(self) -> float:
        return float(sum(e["seconds"] for e in self.epochs))

    def to_dict(self) -> dict:
        return {"epochs": self.epochs, "seed": self.seed, "data_input_exp": self.data_input_exp,
                "resumed_from": self.resumed_from}

    @classmethod
    def from_dict(cls, d: dict) -> "History":
        return cls(epochs=list(d.get("epochs", [])), seed=int(d.get("seed", 0)),
                   data_input_exp=d.get("data_input_exp"), resumed_from=int(d.get("resumed_from", 0)))


# ----------------------------------------------------------------------- validation

def prepare_inputs(model, dataset: Dataset) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test) checked against the model, with inputs quantized at
    the exponent the model was built for (``model.data_input_exp``): a dataset quantized with
    another exponent is re-quantized from its float originals."""
    if not isinstance(dataset, Dataset):
        raise TrainError(f"expected a tinytrain Dataset (tinytrain.data.load), got {type(dataset).__name__}")
    xs = [dataset.x_train, dataset.x_test]
    want = getattr(model, "data_input_exp", None)
    if want is not None and want != dataset.input_exp:
        xs = [quantize_inputs(fx, 8, want, what=f"{dataset.name} x_{s}")[0]
              for fx, s in ((dataset.float_x_train, "train"), (dataset.float_x_test, "test"))]
    for x, split in zip(xs, ("train", "test")):
        if not isinstance(x, np.ndarray) or x.dtype != np.int8:
            raise DataError(f"{dataset.name}: x_{split} must be an int8 array (quantize with "
                            f"tinytrain.data.quantize_inputs), got {getattr(x, 'dtype', type(x).__name__)}")
        if tuple(x.shape[1:]) != model.input_shape:
            hint = ""
            if int(np.prod(x.shape[1:])) == int(np.prod(model.input_shape)):
                hint = " (same size, other layout: e.g. 'digits' is flat (64,), 'digits-image' is (8, 8, 1))"
            raise DataError(f"{dataset.name}: samples have shape {tuple(x.shape[1:])} but the model "
                            f"{model.name!r} expects {model.input_shape}{hint}")
    ys = [dataset.y_train, dataset.y_test]
    if model.loss == "softmax_ce":
        if dataset.n_classes <= 0:
            raise DataError(f"{dataset.name} is a regression dataset but the model is a classifier")
        for y, split in zip(ys, ("train", "test")):
            y = np.asarray(y)
            if y.ndim != 1 or y.dtype.kind not in "iu":
                raise DataError(f"{dataset.name}: y_{split} must be one integer label per sample")
            if len(y) and (int(y.min()) < 0 or int(y.max()) >= model.n_classes):
                bad = int(y.max()) if int(y.max()) >= model.n_classes else int(y.min())
                raise DataError(f"{dataset.name}: label {bad} in y_{split} is out of range for the "
                                f"model's {model.n_classes} classes (labels must be 0..{model.n_classes - 1})")
    else:
        raise TrainError("training with the mse loss is not wired into fit() yet: use ref_train_step")
    for x, y, split in zip(xs, ys, ("train", "test")):
        if len(x) != len(y):
            raise DataError(f"{dataset.name}: x_{split} has {len(x)} samples but y_{split} has {len(y)}")
    return (np.ascontiguousarray(xs[0]), np.ascontiguousarray(ys[0], dtype=np.int32),
            np.ascontiguousarray(xs[1]), np.ascontiguousarray(ys[1], dtype=np.int32))


def _configure_optimizer(model, batch_size, total_steps):
    """Set batch size (before training starts only) and the cosine horizon (if unset)."""
    opt = model.optimizer
    fresh = int(model.meta[1]) == 0 and int(model.meta[2]) == 0
    if batch_size is not None and batch_size != opt.batch_size:
        if not fresh:
            raise TrainError(f"cannot change the batch size from {opt.batch_size} to {batch_size} after "
                             "training started: the optimizer state depends on it")
        if not (isinstance(batch_size, int) and batch_size >= 1):
            raise TrainError(f"batch size must be a positive integer, got {batch_size!r}")
        opt.batch_size = batch_size
        model.opt = opt.compile()
        model._init_training_state()  # accumulators appear/disappear with the batch mode
    if opt.schedule == "cosine" and not opt.total_steps:
        opt.total_steps = int(total_steps)
        model.opt = opt.compile()


def _copy_state(dst, src):
    """Overwrite dst's training state in place with src's (same config)."""
    for ld, ls in zip(dst.layers, src.layers):
        for pd, ps in zip(ld.params, ls.params):
            pd.data[...] = ps.data
    for name in ("master", "accum", "velocity", "masks"):
        a, b = getattr(dst, name), getattr(src, name)
        if set(a) != set(b):
            raise TrainError(f"checkpoint {name} buffers do not match the model")
        for k in a:
            a[k][...] = b[k]
    dst.meta[...] = src.meta
    dst.stats[...] = src.stats
    dst.data_input_exp = getattr(src, "data_input_exp", None)


def _first_difference(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            d = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if d:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        for i, (x, y) in enumerate(zip(a, b)):
            d = _first_difference(x, y, f"{path}[{i}]")
            if d:
                return d
        return None
    return None if a == b else f"{path}: checkpoint has {a!r}, this run has {b!r}"


def _resume_from(model, path, seed):
    from tinytrain.graph import io as tio
    saved, extra = tio.load(path)
    mine, theirs = model.config(), saved.config()
    diff = _first_difference(theirs, mine)
    if diff:
        raise TrainError(f"cannot resume from {path}: it holds a different model ({diff}); "
                         "use the same --model/--lr/--batch-size, or drop --resume to start over")
    if "epoch" not in extra or "data_prng" not in extra:
        raise TrainError(f"cannot resume from {path}: it is not a training checkpoint (no epoch/data "
                         "PRNG recorded)")
    if int(extra.get("seed", seed)) != int(seed):
        raise TrainError(f"cannot resume from {path}: it was trained with seed {extra['seed']}, this run "
                         f"uses seed {seed}")
    model.optimizer = saved.optimizer
    model.opt = saved.opt
    _copy_state(model, saved)
    return int(extra["epoch"]), int(extra["data_prng"]), History.from_dict(extra.get("history", {}))


# ----------------------------------------------------------------------- the loop

class _Runner:
    """Training and prediction through the numba simulator or the plain reference."""

    def __init__(self, model, reference: bool):
        self.model, self.reference = model, reference
        if not reference:
            from tinytrain.sim.simulator import Simulator
            self.sim = Simulator(model)

    def warm_up(self, X):
        """Load/compile the numba functions outside the timed epochs (no state change)."""
        if not self.reference:
            s = self.model.stats.copy()
            self.sim.train(X, np.zeros(len(X), np.int32), np.zeros(0, np.int64))
            self.sim.predict(X[:1])
            self.model.stats[...] = s

    def train(self, X, Y, order):
        if not self.reference:
            return self.sim.train(X, Y, order)
        out = np.zeros((len(order), 2), np.int64)
        for n, i in enumerate(order):
            out[n] = self.model.ref_train_step(X[i], Y[i])
        return out

    def predict(self, X):
        if not self.reference:
            return self.sim.predict(X)
        return np.array([self.model.ref_predict(x) for x in X], dtype=np.int64)


def _accuracy(pred, y) -> float:
    return float(np.mean(np.asarray(pred) == np.asarray(y))) if len(y) else float("nan")


def fit(model, dataset: Dataset, epochs: int, seed: int = 0, *, batch_size: int | None = None,
        progress: bool | None = None, checkpoint=None, resume: bool = False, plot=None,
        reference: bool = False, limit: int | None = None, log=None) -> History:
    """Train ``model`` in place for ``epochs`` epochs in total; returns the History.

    seed: data-shuffling seed (the model's own PRNG is seeded by its config).
    batch_size: overrides the optimizer's batch size (before training starts only).
    checkpoint: path saved after every epoch (model + data PRNG + epoch + history).
    resume: continue from ``checkpoint`` if it exists (bit-identical to not stopping).
    plot: path of a PNG training-curve plot written at the end.
    reference: use the plain numpy reference step (slow; for checks) instead of numba.
    limit: train on the first ``limit`` training samples only (quick runs, tests).
    log: callable(str) receiving one line per epoch (e.g. print), or None.
    progress: a tqdm bar on stderr; None (default): only when stderr is a terminal.
    After the first epoch a TrainWarning says so if the model cannot learn (see cannot_learn).
    """
    if not (isinstance(epochs, int) and epochs >= 0):
        raise TrainError(f"epochs must be a non-negative integer, got {epochs!r}")
    if not (isinstance(seed, int) and seed >= 0):
        raise TrainError(f"seed must be an integer >= 0, got {seed!r}")
    X, Y, Xt, Yt = prepare_inputs(model, dataset)
    if limit is not None:
        if not (isinstance(limit, int) and limit >= 1):
            raise TrainError(f"limit must be a positive number of samples, got {limit!r}")
        X, Y = X[:limit], Y[:limit]
    n = len(X)
    if n == 0:
        raise DataError(f"{dataset.name}: no training samples")
    bs = model.optimizer.batch_size
    if epochs and bs > n:
        raise TrainError(f"batch size {bs} is larger than the {n} training samples: no update would "
                         f"happen in an epoch; use a batch size of at most {n}")
    _configure_optimizer(model, batch_size, total_steps=epochs * n // max(1, model.optimizer.batch_size))
    if getattr(model, "data_input_exp", None) is None:
        model.data_input_exp = int(dataset.input_exp)
    start, state, history = 0, data_prng(seed), History(seed=seed, data_input_exp=model.data_input_exp)
    if resume and checkpoint is not None and Path(checkpoint).exists():
        start, state, history = _resume_from(model, checkpoint, seed)
        history.resumed_from = start
    if checkpoint is not None and start == 0 and epochs == 0:
        _save_checkpoint(model, checkpoint, 0, state, seed, dataset, history)
    runner = _Runner(model, reference)
    if start < epochs:
        runner.warm_up(X)
    bar = None
    from tinytrain.progress import enabled

    if enabled(force=progress) and start < epochs:
        from tqdm.auto import tqdm
        bar = tqdm(total=(epochs - start) * n, unit="sample", desc=f"{model.name} epoch {start + 1}/{epochs}",
                   leave=False, dynamic_ncols=True)
    try:
        for ep in range(start, epochs):
            state, order = fp.permutation(state, n)
            s0 = model.stats.copy()
            sc0 = model.scaler.copy()
            before = _trainable_copy(model) if ep == 0 else None
            t0 = time.perf_counter()
            outs = []
            for c in range(0, n, _CHUNK):
                outs.append(runner.train(X, Y, order[c:c + _CHUNK]))
                if bar is not None:
                    bar.update(len(order[c:c + _CHUNK]))
            dt = time.perf_counter() - t0
            out = np.concatenate(outs)
            ds = model.stats - s0
            rec = {"epoch": ep + 1, "train_loss": loss_nats(out[:, 0]),
                   "train_accuracy": _accuracy(out[:, 1], Y[order]),
                   "test_accuracy": _eval_accuracy(model, runner, Xt, Yt),
                   "act_saturations": int(ds[0]), "weight_saturations": int(ds[1]),
                   "update_underflows": int(ds[2]), "seconds": dt, "samples": n}
            rec.update(loss_scale_record(model, sc0))
            history.epochs.append(rec)
            if before is not None:
                for msg in cannot_learn(model, X, before, rec):
                    warnings.warn(msg, TrainWarning, stacklevel=2)
            if bar is not None:
                bar.set_description(f"{model.name} epoch {min(ep + 2, epochs)}/{epochs}")
                bar.set_postfix(loss=f"{rec['train_loss']:.3f}", test_acc=f"{rec['test_accuracy']:.3f}")
            if log is not None:
                log(format_epoch(rec, epochs))
            if checkpoint is not None:
                _save_checkpoint(model, checkpoint, ep + 1, state, seed, dataset, history)
    finally:
        if bar is not None:
            bar.close()
    if plot is not None:
        plot_history(history, plot, title=f"{model.name} on {dataset.name}")
    return history


def _trainable_copy(model) -> list:
    """The trainable tensors (int32 master copies where kept) before an epoch."""
    return [np.array(t) for t in model.state_tensors()[:-1]]


def cannot_learn(model, X, before: list, rec: dict, probe: int = 64) -> list[str]:
    """Reasons the first epoch says this model cannot learn (empty if it can): a layer before
    the head that outputs zero for every probed training sample (nothing below it gets a
    gradient, the output is constant), or no trainable tensor changed (every update rounded to
    zero). Checked once, after epoch 1, on the reference forward of the first `probe` samples."""
    out = []
    hint = (f"the model reads its inputs at exponent {model.input_exp}; "
            "build it with tt.Sequential(layers, dataset=ds) or tt.build_model, which scale the "
            "data into about [-1, 1], or lower the learning rate")
    dead = None
    for x in X[:probe]:
        a, ea = x, model.input_exp
        alive = []
        for l in model.layers[:-1]:
            a, ea, _, _ = l.ref_forward(a, ea, False)
            alive.append(bool(np.any(a)))
        dead = alive if dead is None else [d or a_ for d, a_ in zip(dead, alive)]
        if all(dead):
            break
    if dead is not None and not all(dead):
        li = dead.index(False)
        out.append(f"layer {li} ({model.layers[li].kind}) outputs only zeros after epoch 1 for every "
                   f"probed training sample: the layers below it get no gradient and the prediction "
                   f"is constant (test accuracy {rec['test_accuracy']:.2f}); {hint}")
    after = _trainable_copy(model)
    if all(np.array_equal(a, b) for a, b in zip(before, after)):
        out.append(f"no trainable parameter changed in epoch 1: every update rounded to zero "
                   f"({rec['update_underflows']} update underflows); raise the learning rate or use "
                   "master weights / stochastic rounding (SGD(master_weights=True, stochastic_rounding=True))")
    return out


def _save_checkpoint(model, path, epoch, state, seed, dataset, history):
    from tinytrain.graph import io as tio
    tio.save(model, path, extra={"epoch": epoch, "data_prng": int(state), "seed": seed,
                                 "dataset": dataset.name, "data_source": dataset.source,
                                 "history": history.to_dict()})


def _eval_accuracy(model, runner, Xt, Yt) -> float:
    if len(Xt) == 0:
        return float("nan")
    s = model.stats.copy()
    acc = _accuracy(runner.predict(Xt), Yt)
    model.stats[...] = s  # evaluation saturations are not training saturations
    return acc


def loss_scale_record(model, before) -> dict:
    """An epoch's loss-scale fields (graph/loss_scale.py), from the scaler state before it:
    the exponent at its end, the steps skipped (global) or trained on a saturated error
    (static) in it, and the total since training began. Empty under the dynamic default."""
    ls = model.loss_scale
    if not ls.enabled:
        return {}
    key = "skipped_steps" if ls.mode == "global" else "saturated_steps"
    return {"loss_scale_exponent": int(model.scaler[0]), key: int(model.scaler[2] - before[2]),
            f"{key}_total": int(model.scaler[2])}


def format_epoch(rec: dict, epochs: int) -> str:
    ls = next((f"  scale 2^{rec['loss_scale_exponent']} {k.split('_')[0]} {rec[k]}" for k in ("skipped_steps", "saturated_steps")
               if k in rec), "")
    return (f"epoch {rec['epoch']:3d}/{epochs}  loss {rec['train_loss']:.4f}  train acc "
            f"{rec['train_accuracy']:.4f}  test acc {rec['test_accuracy']:.4f}  saturations "
            f"act {rec['act_saturations']} w {rec['weight_saturations']} underflow {rec.get('update_underflows', 0)}{ls}"
            f"  {rec['seconds']:.2f}s")


def evaluate(model, dataset: Dataset, split: str = "test", reference: bool = False) -> dict:
    """Accuracy (and confusion matrix, activation saturations) of ``model`` on a split.
    The model's training state is not changed (its saturation counters are restored)."""
    if split not in ("train", "test"):
        raise TrainError(f"split={split!r}: use 'train' or 'test'")
    X, Y, Xt, Yt = prepare_inputs(model, dataset)
    x, y = (X, Y) if split == "train" else (Xt, Yt)
    s = model.stats.copy()
    runner = _Runner(model, reference)
    t0 = time.perf_counter()
    pred = runner.predict(x) if len(x) else np.zeros(0, np.int64)
    dt = time.perf_counter() - t0
    sat = int(model.stats[0] - s[0])
    model.stats[...] = s
    k = model.n_classes
    conf = np.zeros((k, k), np.int64)
    np.add.at(conf, (y, pred), 1)
    return {"split": split, "samples": int(len(y)), "accuracy": _accuracy(pred, y),
            "correct": int(np.sum(pred == y)), "act_saturations": sat,
            "per_class_accuracy": [float(conf[c, c] / conf[c].sum()) if conf[c].sum() else None for c in range(k)],
            "confusion": conf.tolist(), "seconds": dt}


def plot_history(history: History, path, title: str = "training") -> Path:
    """Write a PNG with the loss and accuracy curves and, beside them, what the integer
    arithmetic lost per training sample each epoch: update underflows (nonzero gradients whose
    step rounded to 0) and saturations of activations/errors and of weights (matplotlib, Agg)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    ep = history["epoch"]
    fig, (a1, a2, a3) = plt.subplots(1, 3, figsize=(13.5, 3.5))
    a1.plot(ep, history["train_loss"], marker="o", ms=3)
    a1.set_xlabel("epoch")
    a1.set_ylabel("train loss (nats)")
    a1.grid(alpha=0.3)
    a2.plot(ep, history["train_accuracy"], marker="o", ms=3, label="train (online)")
    a2.plot(ep, history["test_accuracy"], marker="s", ms=3, label="test")
    a2.set_xlabel("epoch")
    a2.set_ylabel("accuracy")
    a2.grid(alpha=0.3)
    a2.legend()
    n = [max(1, int(e.get("samples") or 1)) for e in history.epochs]
    for key, label, mk in (("update_underflows", "update underflows", "o"), ("act_saturations", "activation/error saturations", "s"),
                           ("weight_saturations", "weight saturations", "^")):
        v = [float(e.get(key, 0) or 0) / k for e, k in zip(history.epochs, n)]
        if any(v):
            a3.plot(ep, v, marker=mk, ms=3, label=label)
    a3.set_xlabel("epoch")
    a3.set_ylabel("per training sample")
    a3.set_yscale("symlog", linthresh=0.01)
    a3.grid(alpha=0.3)
    if a3.get_legend_handles_labels()[0]:
        a3.legend(fontsize=8)
    a3.set_title("integer losses (per layer: tinytrain info --fixed-point)", fontsize=8)
    from matplotlib.ticker import MaxNLocator
    for ax in (a1, a2, a3):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    fig.tight_layout()
    from tinytrain.graph.io import atomic_write  # a crash leaves the old picture or the new one

    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)
