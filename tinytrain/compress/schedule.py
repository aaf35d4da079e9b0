"""The compression schedule: a TOML file of integer training stages, every key type-checked.

    model = "digits-mlp"          # built-in, model file or saved .tt (--model replaces it)
    data = "digits"               # (--data replaces it)
    seed = 0
    validation = 0.1              # fraction of the training set held out for validation

    [[stage]]
    kind = "train"
    epochs = 10

    [[stage]]
    kind = "prune"
    epochs = 6
    prune = {schedule = "polynomial", final_sparsity = 0.8, begin_epoch = 0, end_epoch = 4}

Stage kinds (docs/compress.md): ``train`` (any of lr, precision, prune), ``prune`` (a prune object,
required), ``quantize`` (a precision policy, required), ``finetune`` (lr only), ``adaptive``
(the accuracy-aware controller, tinytrain/compress/adaptive.py). A stage's prune object has the
keys of docs/pruning.md with its steps counted from the stage's first update; ``begin_epoch`` /
``end_epoch`` may stand for ``begin_step`` / ``end_step`` (epoch e = its first update).

Errors are :class:`ScheduleError` (a ValueError: exit 2 from the CLI) naming the field, e.g.
``stage 2 (prune): prune: final_sparsity = 1.5 must be a number in [0, 1)``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

from tinytrain.graph import fields as F

KINDS = ("train", "prune", "quantize", "finetune", "adaptive")


class ScheduleError(ValueError):
    """A schedule that cannot run; the message names the field and the fix."""


_FRACTION = F.Field("a number in (0, 1) (the fraction of the training set held out)",
                    lambda v: F.is_number(v) and 0 < v < 1)
_EPOCHS = F.Field("an integer >= 1", lambda v: F.is_int(v) and v >= 1)
_LR = F.Field("a number in (0, 1]", lambda v: F.is_number(v) and 0 < v <= 1)
_PRECISION = F.Field("a preset name (int16, int8, int8-master16, ...) or a table such as "
                     "{weights = \"int8\", master = \"int16\"}", lambda v: isinstance(v, (str, dict)))
_PRUNE = F.Field("a table of pruning options such as {schedule = \"polynomial\", final_sparsity = 0.8, "
                 "begin_epoch = 0, end_epoch = 4} (docs/pruning.md)", lambda v: isinstance(v, dict))
_NAME = F.Field("a string of letters, digits, '-' or '_' (it names the stage's file)",
                lambda v: isinstance(v, str) and bool(v) and all(c.isalnum() or c in "-_" for c in v))
_SPARSITY = F.Field("a number in [0, 1)", lambda v: F.is_number(v) and 0 <= v < 1)
_POSITIVE = F.Field("a number > 0", lambda v: F.is_number(v) and v > 0)

#: top-level keys of a schedule file
TOP_FIELDS = {
    "model": F.STR, "data": F.STR,
    "seed": F.Field("an integer >= 0", lambda v: F.is_int(v) and v >= 0),
    "validation": _FRACTION,
    "stage": F.Field("a list of [[stage]] tables", lambda v: isinstance(v, list)),
}
_COMMON = {"kind": F.one_of(*KINDS), "name": _NAME, "epochs": _EPOCHS, "lr": _LR}
#: the keys of each stage kind
STAGE_FIELDS = {
    "train": {**_COMMON, "precision": _PRECISION, "prune": _PRUNE},
    "prune": {**_COMMON, "prune": _PRUNE},
    "quantize": {**_COMMON, "precision": _PRECISION},
    "finetune": dict(_COMMON),
    "adaptive": {  # no epochs: the search decides (max_epochs bounds it)
        **{k: v for k, v in _COMMON.items() if k != "epochs"},
        "max_relative_drop": F.Field("a number in [0, 100) (percent of the uncompressed validation accuracy)",
                                     lambda v: F.is_number(v) and 0 <= v < 100),
        "initial_epochs": _EPOCHS,
        "patience": _EPOCHS, "step": F.Field("a number in (0, 1)", lambda v: F.is_number(v) and 0 < v < 1),
        "step_factor": F.Field("a number in (0, 1)", lambda v: F.is_number(v) and 0 < v < 1),
        "min_step": F.Field("a number in (0, 1)", lambda v: F.is_number(v) and 0 < v < 1),
        "initial_sparsity": _SPARSITY, "max_sparsity": _SPARSITY,
        "max_epochs": _EPOCHS, "sparsity": F.BOOL,
        "precisions": F.Field("a list of precision presets or tables, tried in order",
                              lambda v: isinstance(v, list) and all(isinstance(p, (str, dict)) for p in v)),
        "scope": F.one_of("layer", "global"),
        "max_saturation_growth": _POSITIVE, "max_underflow_growth": _POSITIVE,
        "budget": F.Field("a table of device limits, any of ram / flash (bytes) and instructions (per sample), "
                          "positive integers, e.g. {ram = 16384}",
                          lambda v: isinstance(v, dict) and bool(v) and all(
                              k in ("ram", "flash", "instructions") and F.is_int(x) and x >= 1 for k, x in v.items())),
        "board": F.Field("a board name (tinytrain boards), where the budget is measured", F.STR.ok),
    },
}
_REQUIRED = {"prune": ("prune",), "quantize": ("precision",)}
#: the stage keys of docs/compress.md that replace the prune object's steps
_EPOCH_KEYS = {"begin_epoch": "begin_step", "end_epoch": "end_step"}


@dataclass
class Stage:
    index: int            # 1-based, as the messages and files name it
    kind: str
    name: str
    epochs: int | None
    options: dict         # every key given (the stage's table as written)

    @property
    def label(self) -> str:
        return f"stage {self.index} ({self.name})"

    def digest(self) -> str:
        """A hash of what the stage does: a rerun may skip it only if this is unchanged."""
        return hashlib.sha256(json.dumps(self.options, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Schedule:
    stages: list
    model: str | None = None
    data: str | None = None
    seed: int = 0
    validation: float = 0.1
    source: str = "<schedule>"
    text_digest: str = field(default="")

    def header_digest(self) -> str:
        """What every stage depends on: model, data, seed, validation split."""
        d = {"model": self.model, "data": self.data, "seed": self.seed, "validation": self.validation}
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def load_schedule(path) -> dict:
    """The TOML table of a schedule file (ScheduleError if it is not readable TOML)."""
    import tomllib

    p = Path(path)
    if not p.is_file():
        raise ScheduleError(f"{p}: no such schedule file (a .toml file of [[stage]] tables: docs/compress.md)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ScheduleError(f"{p}: not UTF-8 text: a schedule is a TOML file") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ScheduleError(f"{p}: invalid TOML: {exc}") from None


def parse(table: dict, source: str = "<schedule>", *, model: str | None = None, data: str | None = None) -> Schedule:
    """A checked Schedule from the TOML table; `model`/`data` (the CLI's) replace the file's."""
    F.check(table, TOP_FIELDS, source, ScheduleError)
    raw = table.get("stage")
    if not raw:
        raise ScheduleError(f"{source}: no [[stage]] tables: a schedule needs at least one stage such as "
                            "[[stage]] kind = \"train\" epochs = 10")
    stages, names = [], set()
    for i, st in enumerate(raw, start=1):
        if not isinstance(st, dict):
            raise ScheduleError(f"{source}: stage {i} must be a [[stage]] table, got {F.show(st)}")
        kind = st.get("kind")
        if kind not in KINDS:
            raise ScheduleError(f"{source}: stage {i}: kind = {F.show(kind)} must be one of "
                                f"{', '.join(json.dumps(k) for k in KINDS)}")
        name = st.get("name", kind)
        where = f"{source}: stage {i} ({name})"
        F.check(st, STAGE_FIELDS[kind], where, ScheduleError)
        if name in names:
            raise ScheduleError(f"{where}: name = {F.show(name)} is used by an earlier stage: give each a name of its own")
        names.add(name)
        for key in _REQUIRED.get(kind, ()):
            if key not in st:
                raise ScheduleError(f"{where}: {key} is missing: a {kind!r} stage needs one (docs/compress.md)")
        if kind != "adaptive" and "epochs" not in st:
            raise ScheduleError(f"{where}: epochs is missing (an integer >= 1)")
        if "precision" in st:
            _check_precision(st["precision"], f"{where}: precision")
        for j, p in enumerate(st.get("precisions", [])):
            _check_precision(p, f"{where}: precisions[{j}]")
        if "prune" in st:
            _check_prune(st["prune"], f"{where}: prune")
        if kind == "adaptive":
            _check_adaptive(st, where)
        stages.append(Stage(i, kind, name, st.get("epochs"), dict(st)))
    sched = Schedule(stages, model=model or table.get("model"), data=data or table.get("data"),
                     seed=int(table.get("seed", 0)), validation=float(table.get("validation", 0.1)), source=source)
    if sched.model is None:
        raise ScheduleError(f"{source}: no model: give model = \"digits-mlp\" (a built-in, model file or .tt) "
                            "in the schedule or --model")
    return sched


def from_file(path, *, model=None, data=None) -> Schedule:
    table = load_schedule(path)
    s = parse(table, str(path), model=model, data=data)
    s.text_digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    return s


def _check_precision(spec, where):
    from tinytrain.graph.precision import Precision, PrecisionError

    try:
        Precision.parse(spec, where)
    except PrecisionError as exc:
        raise ScheduleError(str(exc)) from None


def _check_prune(spec, where):
    """The prune object with its steps given as they would be at a stage starting at step 0."""
    from tinytrain.graph.prune import Prune, PruneError

    try:
        Prune.from_dict(absolute_prune(spec, 0, 1, where), where.rsplit(": ", 1)[-1])
    except PruneError as exc:
        raise ScheduleError(f"{where.rsplit(': prune', 1)[0]}: {exc}") from None


def absolute_prune(spec: dict, start_step: int, updates_per_epoch: int, where: str = "prune") -> dict:
    """A stage's prune object as the model takes it: epochs turned into steps, and every step
    moved on by the optimizer step the stage starts at."""
    d = dict(spec)
    b, e = d.get("begin_epoch", 0), d.get("end_epoch")
    if F.is_int(b) and F.is_int(e) and e < b:
        raise ScheduleError(f"{where}: end_epoch = {e} is before begin_epoch = {b}: the schedule ends before it begins")
    for ek, sk in _EPOCH_KEYS.items():
        if ek in d:
            if sk in d:
                raise ScheduleError(f"{where}: give {ek} or {sk}, not both")
            v = d.pop(ek)
            if not (F.is_int(v) and v >= 0):
                raise ScheduleError(f"{where}: {ek} = {F.show(v)} must be an integer >= 0 (an epoch of the stage)")
            d[sk] = v * updates_per_epoch
    for sk in ("begin_step", "end_step"):
        if sk in d and F.is_int(d[sk]) and d[sk] >= 0:
            d[sk] = d[sk] + start_step
    d.setdefault("begin_step", start_step)
    return d


def _check_adaptive(st, where):
    if not st.get("sparsity", True) and not st.get("precisions"):
        raise ScheduleError(f"{where}: nothing to adapt: sparsity = false and no precisions; "
                            "drop sparsity = false or list precisions")
    step, lo = st.get("step", 0.1), st.get("min_step", 0.025)
    if lo > step:
        raise ScheduleError(f"{where}: min_step = {F.show(lo)} is larger than step = {F.show(step)}: "
                            "the step is halved down to min_step")
    s0, s1 = st.get("initial_sparsity", 0.0), st.get("max_sparsity", 0.95)
    if s1 < s0:
        raise ScheduleError(f"{where}: max_sparsity = {F.show(s1)} is below initial_sparsity = {F.show(s0)}: "
                            "the search ends before it begins")
