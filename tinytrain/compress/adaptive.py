"""Adaptive (accuracy-aware) compression: NNCF's adaptive compression level search, in integer
training, braked by tinytrain's own saturation and underflow counters.

The policy (:class:`Controller`) is pure: it sees, after every epoch, the number of correct
validation predictions and the counters per training sample, and says what to train next. The
runner (:func:`run`) trains, validates and keeps the model copies it names. Defaults are
NNCF's (``accuracy_aware_training``, mode ``adaptive_compression_level``):

* budget: a level is *within* when its best validation accuracy is at least
  (1 - max_relative_drop / 100) times the uncompressed model's (1 %), compared exactly on the
  counts of correct predictions (Fractions);
* initial phase: ``initial_epochs`` (5) epochs at ``initial_sparsity`` (0), its counters the
  reference of the brake;
* each later level trains ``patience`` (3) epochs; then the sparsity moves by ``step`` (0.1)
  up when the level was within and down when it was not (from the best copy kept so far: a
  level that failed is undone, its saturated weights are not carried on), the step multiplied by
  ``step_factor`` (0.5) every time the direction flips; the search stops when the step would go
  below ``min_step`` (0.025), above ``max_sparsity`` (0.95), below ``initial_sparsity``, or past
  ``max_epochs`` (100) epochs in the stage;
* the brake: an epoch whose saturations (activations + weights) per training sample exceed
  ``max_saturation_growth`` (4) times the reference's, or whose update underflows per sample
  exceed ``max_underflow_growth`` (2) times the reference's (each reference at least 0.01 per
  sample), does not count as within, whatever its accuracy;
* ``precisions`` (a ladder of policies, e.g. ["int8-master16", "int8"]) are tried before the
  sparsity search, one level each (``patience`` epochs), in order: a level within is kept, the
  first one that is not is undone (the model goes back to the last kept copy) and ends the ladder;
* the result is the best epoch (highest validation accuracy, the first on ties) of the most
  compressed level that was within; if none was, the best epoch of the initial phase, reported as
  not meeting the budget;
* a device ``budget`` ({"ram": B, "flash": B, "instructions": per sample}, measured on a board:
  the firmware linked for it, QEMU for instructions) turns the search into "the least compression
  that fits": each level that closes within the accuracy budget is measured (its best copy), and
  the first that fits the board and the budget is the result and ends the search (the levels
  before it were less compressed and did not fit). If none fits, the result is as without a
  budget and the summary says which constraint the closest measured level missed, by how much.

Differences from NNCF, for determinism and plain rules: a budget of exactly zero counts as
within (NNCF's sign(0) does not move); the search stops before training a level whose step is
below the minimum (NNCF trains one epoch at it); a move down starts from the best copy kept
(NNCF goes on from the failed level's weights, whose saturations would keep the brake on); reaching max_sparsity stops at the best level
kept (NNCF returns the last one).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

from tinytrain.cost import budget_limits, fits_budget, worst_excess

#: NNCF's accuracy-aware defaults (and tinytrain's brake)
DEFAULTS = {"max_relative_drop": 1.0, "initial_epochs": 5, "patience": 3, "step": 0.1, "step_factor": 0.5,
            "min_step": 0.025, "initial_sparsity": 0.0, "max_sparsity": 0.95, "max_epochs": 100,
            "sparsity": True, "precisions": [], "scope": "layer",
            "max_saturation_growth": 4.0, "max_underflow_growth": 2.0, "budget": {}}
BRAKE_FLOOR = Fraction(1, 100)  # counters per sample below this count as this (no zero reference)


def _fs(x: Fraction) -> str:
    return f"{x.numerator}/{x.denominator}"


def _q(v) -> Fraction:
    """A float of the schedule as the decimal it was written as (0.1 is 1/10, exactly)."""
    return Fraction(repr(float(v)))


@dataclass
class Decision:
    """What to do after an epoch. kind "train": one more epoch at `rate` (and `precision`, None:
    unchanged); "stop": the search is over; "measure": the level just closed is within the
    accuracy budget: measure its best copy on the board and call Controller.measured. snapshot: the epoch just seen is the best of its
    level (keep a copy); promote: the level just closed is the new result (its copy becomes the
    best); restore: train the next level from the best copy, not the current model."""

    kind: str
    rate: Fraction
    precision: object = None
    snapshot: bool = False
    promote: bool = False
    restore: bool = False
    note: str = ""


@dataclass
class Level:
    rate: Fraction
    precision: object
    epochs: list = field(default_factory=list)   # (correct, sat per sample, underflow per sample, braked)
    best: int | None = None                      # index into epochs of the best unbraked one
    within: bool | None = None
    fits: bool | None = None                     # the device budget (measured levels only)
    cost: dict | None = None                     # what was measured: ram_total, flash_total, ...

    def best_correct(self):
        return None if self.best is None else self.epochs[self.best][0]


class Controller:
    """The policy of the module docstring, step by step (no model, no training)."""

    def __init__(self, baseline_correct: int, n_val: int, **params):
        p = {**DEFAULTS, **params}
        unknown = sorted(set(p) - set(DEFAULTS))
        if unknown:
            raise ValueError(f"unknown controller option(s) {', '.join(unknown)}")
        self.p = p
        self.baseline, self.n_val = int(baseline_correct), int(n_val)
        self.tolerable = Fraction(self.baseline) * (1 - _q(p["max_relative_drop"]) / 100)
        self.step = _q(p["step"])
        self.min_step, self.factor = _q(p["min_step"]), _q(p["step_factor"])
        self.lo, self.hi = _q(p["initial_sparsity"]), _q(p["max_sparsity"])
        self.ladder = list(p["precisions"])
        self.ladder_all = list(p["precisions"])
        self.levels: list[Level] = []
        self.ref = None           # (sat, underflow) per sample: the initial phase's last epoch
        self.epochs = 0
        self.direction = None     # +1 / -1 of the last sparsity move
        self.result = None        # index of the level that is the result
        self.phase = "initial"
        self.stop_reason = None
        self.budget = dict(p["budget"] or {})
        self.pending = None       # (sat, und) of a level waiting for its measurement

    # -------------------------------------------------------------- queries
    @property
    def level(self) -> Level:
        return self.levels[-1]

    def within(self, correct) -> bool:
        return correct is not None and correct >= self.tolerable

    def braked(self, sat: Fraction, und: Fraction) -> bool:
        if self.ref is None:
            return False
        rs, ru = (max(r, BRAKE_FLOOR) for r in self.ref)
        return sat > _q(self.p["max_saturation_growth"]) * rs or und > _q(self.p["max_underflow_growth"]) * ru

    @property
    def met(self) -> bool:
        return self.result is not None and bool(self.levels[self.result].within)

    # -------------------------------------------------------------- steps
    def start(self) -> Decision:
        self.levels.append(Level(self.lo, None))
        return Decision("train", self.lo, note="initial phase")

    def observe(self, correct: int, saturations_per_sample, underflows_per_sample) -> Decision:
        """The epoch just trained: its correct validation predictions and counters per sample."""
        lv = self.level
        sat, und = Fraction(saturations_per_sample), Fraction(underflows_per_sample)
        braked = self.braked(sat, und)
        lv.epochs.append((int(correct), sat, und, braked))
        self.epochs += 1
        snapshot = not braked and (lv.best is None or correct > lv.best_correct())
        if snapshot:
            lv.best = len(lv.epochs) - 1
        need = self.p["initial_epochs"] if self.phase == "initial" else self.p["patience"]
        if len(lv.epochs) < need:
            return Decision("train", lv.rate, snapshot=snapshot)
        if self.budget and self.within(lv.best_correct()):
            self.pending = (sat, und)
            return Decision("measure", lv.rate, snapshot=snapshot, note="measure the level on the board")
        return self._close(snapshot, sat, und)

    def measured(self, fits: bool, cost: dict) -> Decision:
        """The board's figures of the level waiting for them (its best copy): fits = within the
        board and the budget. Returns what to do next."""
        if self.pending is None:
            raise RuntimeError("measured() without a measure decision")
        lv = self.level
        lv.fits, lv.cost = bool(fits), dict(cost)
        (sat, und), self.pending = self.pending, None
        return self._close(False, sat, und)

    def _close(self, snapshot, sat, und) -> Decision:
        lv = self.level
        lv.within = self.within(lv.best_correct())
        promote = False
        if self.phase == "initial":
            self.ref = (sat, und)
            self.result, promote = 0, True
            self.phase = "ladder" if self.ladder else "search"
        elif lv.within and self._better(len(self.levels) - 1):
            self.result, promote = len(self.levels) - 1, True
        if self.budget and lv.within and lv.fits:  # the least compression that fits: done
            self.result, promote = len(self.levels) - 1, True
            return self._stop("fits the device budget", snapshot, promote)
        restore = False
        if self.phase == "ladder":
            if lv.precision is not None and not lv.within:  # undo this policy, end the ladder
                self.ladder, restore = [], True
            if self.ladder and (self.levels[self.result].within or lv.precision is None and lv.within):
                nxt = self.ladder.pop(0)
                self.levels.append(Level(self.levels[self.result].rate, nxt))
                return Decision("train", self.level.rate, precision=nxt, snapshot=snapshot, promote=promote,
                                restore=restore, note=f"precision {nxt}")
            self.phase = "search"
            if not self.p["sparsity"]:
                return self._stop("no sparsity search (sparsity = false)", snapshot, promote)
            restore = restore or not lv.within
            base = self.levels[self.result]
            return self._move(base.rate, +1 if base.within else -1, snapshot, promote, restore)
        if not self.p["sparsity"]:
            return self._stop("no sparsity search (sparsity = false)", snapshot, promote)
        return self._move(lv.rate, +1 if lv.within else -1, snapshot, promote, not lv.within)

    def _better(self, i) -> bool:
        """Level i, within, beats the result: more compressed, or as compressed and more accurate."""
        r, c = self.levels[self.result], self.levels[i]
        if not r.within:
            return True
        def key(lv):  # a later rung of the ladder is more compressed than any sparsity before it
            return (self.ladder_all.index(lv.precision) + 1 if lv.precision is not None else 0, lv.rate)
        return key(c) > key(r) or (key(c) == key(r) and c.best_correct() > r.best_correct())

    def _move(self, rate, direction, snapshot, promote, restore) -> Decision:
        if self.direction is not None and direction != self.direction:
            self.step *= self.factor
        if self.step < self.min_step:
            return self._stop(f"step {float(self.step):g} below min_step {float(self.min_step):g}", snapshot, promote)
        self.direction = direction
        new = rate + direction * self.step
        if new > self.hi:
            return self._stop(f"sparsity {float(new):g} above max_sparsity {float(self.hi):g}", snapshot, promote)
        if new < self.lo:
            return self._stop(f"sparsity {float(new):g} below initial_sparsity {float(self.lo):g}: the budget "
                              "is not met at the least compression", snapshot, promote)
        if self.epochs + self.p["patience"] > self.p["max_epochs"]:
            return self._stop(f"max_epochs {self.p['max_epochs']} reached", snapshot, promote)
        self.levels.append(Level(new, self.level.precision if not restore else self.levels[self.result].precision))
        return Decision("train", new, snapshot=snapshot, promote=promote, restore=restore,
                        note=f"sparsity {float(new):g} ({'up' if direction > 0 else 'down'})")

    def _stop(self, why, snapshot, promote) -> Decision:
        self.stop_reason = why
        return Decision("stop", self.levels[self.result].rate, snapshot=snapshot, promote=promote, note=why)

    # -------------------------------------------------------------- saving
    def state(self) -> dict:
        """Everything observe() changes, as JSON (Fractions as "n/d"): from_state() rebuilds it."""
        return {"baseline": self.baseline, "n_val": self.n_val, "p": self.p, "step": _fs(self.step),
                "ladder": self.ladder, "ref": None if self.ref is None else [_fs(r) for r in self.ref],
                "epochs": self.epochs, "direction": self.direction, "result": self.result, "phase": self.phase,
                "stop_reason": self.stop_reason,
                "pending": None if self.pending is None else [_fs(r) for r in self.pending],
                "levels": [{"rate": _fs(lv.rate), "precision": lv.precision, "best": lv.best, "within": lv.within,
                            "fits": lv.fits, "cost": lv.cost,
                            "epochs": [[c, _fs(a), _fs(u), b] for c, a, u, b in lv.epochs]} for lv in self.levels]}

    @classmethod
    def from_state(cls, d: dict) -> "Controller":
        c = cls(d["baseline"], d["n_val"], **d["p"])
        c.step, c.ladder, c.epochs, c.direction = Fraction(d["step"]), list(d["ladder"]), d["epochs"], d["direction"]
        c.ref = None if d["ref"] is None else tuple(Fraction(r) for r in d["ref"])
        c.result, c.phase, c.stop_reason = d["result"], d["phase"], d["stop_reason"]
        c.pending = None if d.get("pending") is None else tuple(Fraction(r) for r in d["pending"])
        c.levels = [Level(Fraction(lv["rate"]), lv["precision"],
                          [(e[0], Fraction(e[1]), Fraction(e[2]), e[3]) for e in lv["epochs"]], lv["best"], lv["within"],
                          lv.get("fits"), lv.get("cost"))
                    for lv in d["levels"]]
        return c

    @property
    def device_met(self) -> bool | None:
        """Whether the result fits the device budget (None: no budget)."""
        if not self.budget:
            return None
        return self.result is not None and bool(self.levels[self.result].fits)

    def closest_miss(self) -> str | None:
        """With a budget no measured level met: the level whose worst excess is smallest, its worst
        constraint and by how much (None if it was met or nothing was measured)."""
        if not self.budget or self.device_met:
            return None
        best = None
        for i, lv in enumerate(self.levels):
            if lv.cost is None:
                continue
            worst = worst_excess(lv.cost, budget_limits(lv.cost, self.budget))
            if worst is None:
                continue
            if best is None or worst[0] < best[0][0]:
                best = (worst, i, lv)
        if best is None:
            return "no level within the accuracy budget was measured"
        (excess, k, have, lim), i, lv = best
        unit = "instructions per sample" if k == "instructions" else "B"
        return (f"no level within the accuracy budget fits: the closest (level {i}, sparsity {float(lv.rate):g}"
                f"{'' if lv.precision is None else ', precision ' + str(lv.precision)}) needs {have} {unit} of {k}, "
                f"{have - lim} over {lim} ({100 * excess:.1f} %)")

    def summary(self) -> dict:
        """The levels tried, as JSON."""
        return {"baseline_correct": self.baseline, "validation_samples": self.n_val,
                "device_budget": self.budget or None, "device_budget_met": self.device_met,
                "device_closest_miss": self.closest_miss(),
                "tolerable_correct": float(self.tolerable), "budget_met": self.met, "stopped": self.stop_reason,
                "result_level": self.result, "epochs": self.epochs,
                "reference": None if self.ref is None else {"saturations_per_sample": float(self.ref[0]),
                                                            "underflows_per_sample": float(self.ref[1])},
                "levels": [{"sparsity": float(lv.rate), "precision": lv.precision, "within": lv.within,
                            "epochs": len(lv.epochs), "best_correct": lv.best_correct(),
                            "braked_epochs": sum(1 for e in lv.epochs if e[3]),
                            "fits": lv.fits, "cost": lv.cost,
                            "correct": [e[0] for e in lv.epochs]} for lv in self.levels]}


# ------------------------------------------------------------------------ the runner

def run(model, train_ds, val_ds, params: dict, seed: int, *, lr=None, log=None, progress=None, checkpoint=None,
        device=None):
    """Run the controller on `model` (not changed): returns (result model, controller). Epoch e
    of the stage visits the training split in the e-th permutation of fit's data PRNG for
    `seed`, as one long fit would. checkpoint: a folder where the search is saved after every
    epoch (the controller, the data PRNG, the current model and the copies it keeps) and from
    which a rerun on the same input model continues, bit-identically. device: model ->
    (fits, cost dict), the board measurement a ``budget`` needs (see board_meter)."""
    from tinytrain import fixedpoint as fp
    from tinytrain.compress.stages import restage
    from tinytrain.sim.simulator import Simulator
    from tinytrain.train import data_prng, prepare_inputs

    p = {**DEFAULTS, **params}
    if p["budget"] and device is None:
        raise ValueError("a device budget needs a board to measure on (run(device=board_meter(...)))")
    X, Y, _, _ = prepare_inputs(model, train_ds)
    _, _, Xv, Yv = prepare_inputs(model, val_ds)
    input_hash = f"{model.state_hash():08x}"
    saved = _load_checkpoint(checkpoint, input_hash) if checkpoint is not None else None
    if saved is not None:
        ctl, state, d, rate_now, cur, cand, best = saved
    else:
        cur = restage(model.copy(), lr=lr) if lr is not None else model.copy()
        base = _correct(Simulator(cur), cur, Xv, Yv)
        ctl = Controller(base, len(Yv), **p)
        state, d = data_prng(seed), ctl.start()
        cand = best = None
        rate_now = None
    sim = None
    if progress is not None and ctl.epochs:
        progress.update(ctl.epochs)
    while True:
        if d.kind == "train":
            if d.restore:
                cur, rate_now, sim = best.copy(), None, None
            if d.precision is not None:
                cur, sim = restage(cur, precision=d.precision), None
            if d.rate != rate_now:
                cur, sim = _with_sparsity(cur, d.rate, p["scope"]), None
                rate_now = d.rate
            if sim is None:
                sim = Simulator(cur)
            state, order = fp.permutation(state, len(X))
            s0 = cur.stats.copy()
            sim.train(X, Y, order)
            ds_ = cur.stats - s0
            correct = _correct(sim, cur, Xv, Yv)
            sat = Fraction(int(ds_[0]) + int(ds_[1]), len(X))
            und = Fraction(int(ds_[2]), len(X))
            if log is not None:
                log(f"  adaptive epoch {ctl.epochs + 1}: sparsity {float(d.rate):.4g}"
                    f"{'' if ctl.level.precision is None else ', precision ' + str(ctl.level.precision)}: "
                    f"validation {correct}/{len(Yv)} (needs {float(ctl.tolerable):.1f}), saturations "
                    f"{float(sat):.3f}/sample, underflows {float(und):.1f}/sample")
            if progress is not None:
                progress.update(1)
            d = ctl.observe(correct, sat, und)
        if d.snapshot:
            cand = cur.copy()
        if d.kind == "measure":  # the level's best copy, on the board
            fits, cost = device(cand)
            if log is not None:
                log(f"  adaptive level {len(ctl.levels) - 1} on the board: " + describe_cost(cost)
                    + (": fits the budget" if fits else ": over the budget"))
            d = ctl.measured(fits, cost)
        if d.promote:
            best = cand
        if d.kind == "stop":
            break
        if checkpoint is not None:
            _save_checkpoint(checkpoint, input_hash, ctl, state, d, rate_now, cur, cand, best)
    return best, ctl


#: a budget key -> the cost figure it limits (tinytrain.cost.device_cost's keys)
def describe_cost(cost: dict) -> str:
    parts = [f"RAM {cost.get('ram_total')} B", f"flash {cost.get('flash_total')} B"]
    if cost.get("instructions_per_sample") is not None:
        parts.append(f"{cost['instructions_per_sample']:,} instructions/sample")
    return ", ".join(parts)


def board_meter(board: str, dataset, budget: dict, steps: int = 20):
    """device= for run(): a model's RAM and flash linked for `board`, and (when the budget limits
    them) its instructions per sample on QEMU over `steps` verified steps."""
    from tinytrain.cost import device_cost

    keep = ("board", "board_ram", "board_flash", "training_ram", "ram_total", "flash_total", "fits", "why",
            "shadow", "instructions_per_sample")

    def measure(model):
        c = device_cost(model, board, dataset, steps, instructions=False)
        if "instructions" in budget and fits_budget(c, {k: v for k, v in budget.items() if k != "instructions"}):
            c = device_cost(model, board, dataset, steps)
        cost = {k: c.get(k) for k in keep}
        return fits_budget(cost, budget), cost
    return measure


_CKPT = "state.json"


def _save_checkpoint(folder, input_hash, ctl, state, d, rate_now, cur, cand, best) -> None:
    """The search after epoch E: E-cur/E-cand/E-best.tt, then state.json naming them (atomic),
    then the files of earlier epochs removed; a crash leaves the previous epoch's set whole."""
    import json
    from pathlib import Path

    from tinytrain.graph import io as tio

    folder = Path(folder)
    e = ctl.epochs
    files = {}
    for name, m in (("cur", cur), ("cand", cand), ("best", best)):
        if m is not None:
            files[name] = f"{e}-{name}.tt"
            tio.save(m, folder / files[name])
    doc = {"input_hash": input_hash, "controller": ctl.state(), "data_prng": int(state), "files": files,
           "rate_now": None if rate_now is None else _fs(rate_now),
           "next": {"kind": d.kind, "rate": _fs(d.rate), "precision": d.precision, "restore": d.restore}}
    text = json.dumps(doc, sort_keys=True).encode()
    tio.atomic_write(folder / _CKPT, lambda f: f.write(text))
    for f in folder.glob("*.tt"):
        if f.name not in files.values():
            f.unlink()


def _load_checkpoint(folder, input_hash):
    """What _save_checkpoint wrote, or None (nothing saved, or saved from another input model)."""
    import json
    from pathlib import Path

    from tinytrain.graph import io as tio

    path = Path(folder) / _CKPT
    if not path.is_file():
        return None
    doc = json.loads(path.read_text())
    if doc.get("input_hash") != input_hash:
        return None
    models = {k: tio.load(Path(folder) / v)[0] for k, v in doc["files"].items()}
    nx = doc["next"]
    d = Decision(nx["kind"], Fraction(nx["rate"]), precision=nx["precision"], restore=nx["restore"])
    rate_now = None if doc["rate_now"] is None else Fraction(doc["rate_now"])
    return (Controller.from_state(doc["controller"]), doc["data_prng"], d, rate_now, models["cur"],
            models.get("cand"), models.get("best"))


def _correct(sim, model, Xv, Yv) -> int:
    """Correct predictions on the validation split; the model's counters are left as training
    made them (validation saturations are not training saturations, as in train.evaluate)."""
    s = model.stats.copy()
    n = int((sim.predict(Xv) == Yv).sum())
    model.stats[...] = s
    return n


def _with_sparsity(model, rate: Fraction, scope: str):
    """`model` pruned to `rate` by a one-shot event at its next update (rate 0 on a model that
    does not prune: unchanged)."""
    from tinytrain.compress.stages import restage

    if rate == 0 and not model.masks:
        return model
    prune = {"schedule": "one_shot", "final_sparsity": float(rate), "begin_step": int(model.meta[1])}
    if scope == "global":
        prune["scope"] = "global"
    return restage(model, prune=prune)
