"""Running a schedule: stages in order, each saved, resumable, reported.

    r = compress(schedule, "runs/w1-compress", board="mps2_an386")

The output folder holds ``NN-NAME.tt`` per completed stage (a model file with its full training
state, loadable by every command) and ``manifest.json``: per completed stage its digest (a hash
of the stage's table), file, state hash, the file's SHA-256 and its report. A rerun checks the
schedule's header (model, data, seed, validation) and every completed stage's digest against
the manifest, and every stage file against its hashes, then continues after the last completed
stage; a stage killed mid-way resumes from its last epoch, bit-identically: a training stage from
``.NN-NAME.DIGEST.partial.tt`` (fit's checkpoint), an adaptive one from the folder
``.NN-NAME.DIGEST.adaptive/`` (tinytrain.compress.adaptive saves its search after every epoch). A stage's file and then the manifest are
written atomically, so a failure leaves the last good state as it was.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tinytrain.compress import stages as S
from tinytrain.compress.schedule import Schedule, ScheduleError, absolute_prune

MANIFEST = "manifest.json"
FORMAT = "tinytrain-compress"


def _sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def stage_file(stage) -> str:
    return f"{stage.index:02d}-{stage.name}.tt"


def _partial(out: Path, stage) -> Path:
    """A training stage's epoch checkpoint (fit's); an adaptive stage's is a folder."""
    suffix = "adaptive" if stage.kind == "adaptive" else "partial.tt"
    return out / f".{stage.index:02d}-{stage.name}.{stage.digest()}.{suffix}"


def load_inputs(schedule: Schedule):
    """(input model, full dataset, train split, validation split)."""
    from tinytrain import data
    from tinytrain.cli import _resolve_data
    from tinytrain.graph import io as tio
    from tinytrain.graph.models import MODELS, build_model

    name = schedule.data
    if name is None:
        if schedule.model in MODELS:
            name = MODELS[schedule.model][2]
        elif Path(schedule.model).is_file() and tio.is_model_file(schedule.model):
            name = tio.load(schedule.model)[1].get("dataset")
    name = _resolve_data(name or "digits", schedule.model)
    ds = data.load(name)
    model = build_model(schedule.model, ds, seed=schedule.seed)
    train, valid = S.split_validation(ds, schedule.validation)
    return model, ds, train, valid


def plan(schedule: Schedule, model, train, board: str | None = None) -> None:
    """Every check that needs the model and the data, before anything runs or is written."""
    n = len(train.x_train)
    bs = model.optimizer.batch_size
    per_epoch = n // bs
    step = int(model.meta[1])
    trained = step > 0
    cur = model  # each stage's model as built (until an adaptive stage, whose result is not known yet)
    for st in schedule.stages:
        where = f"{schedule.source}: {st.label}"
        if st.kind == "adaptive":
            cur = None
            if "budget" in st.options and st.options.get("board", board) is None:
                raise ScheduleError(f"{where}: budget is measured on a board: add board = \"microbit\" (or another "
                                    "of `tinytrain boards`) to the stage, or pass --board")
            if "board" in st.options:
                from tinytrain.device.boards import BoardError, get_board
                try:
                    get_board(st.options["board"])
                except BoardError as e:
                    raise ScheduleError(f"{where}: board: {e.args[0] if e.args else e}") from None
            if not trained:
                raise ScheduleError(f"{where}: the model has not been trained yet: the accuracy budget is "
                                    "relative to the uncompressed model's validation accuracy; put a train "
                                    "stage before it or give a trained .tt as the model")
            continue
        trained = True
        updates = st.epochs * per_epoch
        if "prune" in st.options:
            pr = absolute_prune(st.options["prune"], step, per_epoch, f"{where}: prune")
            end = int(pr.get("end_step", pr["begin_step"]))
            if end > step + updates - 1:
                raise ScheduleError(f"{where}: prune: the schedule ends at update {end - step} of the stage, after "
                                    f"its last ({updates - 1}: {st.epochs} epochs x {per_epoch} updates); end it "
                                    "earlier or give the stage more epochs")
        if cur is not None:
            cur = _storage_fits(cur, st, step, per_epoch, where)
        step += updates


def _storage_fits(model, st, step, per_epoch, where):
    """The stage's model, built (not trained): a prune "storage" it cannot have on the board is
    refused now rather than by --board or codegen after the stage has trained."""
    from tinytrain.codegen.sparse import check_storage

    o = st.options
    prune = absolute_prune(o["prune"], step, per_epoch, f"{where}: prune") if "prune" in o else None
    m = S.restage(model, lr=o.get("lr"), precision=o.get("precision"), prune=prune)
    check_storage(m, lambda msg: ScheduleError(f"{where}: {msg}"))
    return m


def _report(model, train, valid, extra: dict) -> dict:
    from tinytrain.train import evaluate

    sp = S.sparsity_of(model)
    return {"validation_accuracy": evaluate(model, valid)["accuracy"], "test_accuracy": evaluate(model, train)["accuracy"],
            "sparsity": sp["sparsity"], "zeros": sp["zeros"], "weights": sp["weights"], "per_tensor": sp["per_tensor"],
            "precision": S.precision_name(model), "params": model.param_count(),
            "optimizer_step": int(model.meta[1]), "state_hash": f"{model.state_hash():08x}", **extra}


def device(model, board: str, dataset, steps: int) -> dict:
    """RAM, flash and instructions per sample on `board` (tinytrain.cost.device_cost)."""
    from tinytrain.cost import device_cost

    c = device_cost(model, board, dataset, steps)
    return {k: c[k] for k in ("board", "training_ram", "ram_total", "flash_total", "fits", "why", "shadow",
                              "instructions_per_sample", "steps")}


def _check_done(schedule, man, out: Path, input_hash: str) -> int:
    """How many stages the manifest holds that this schedule may skip (ScheduleError otherwise)."""
    fix = "pass --force to start over, or choose another --out"
    if man.get("format") != FORMAT:
        raise ScheduleError(f"{out / MANIFEST}: not a tinytrain compress manifest: {fix}")
    if man.get("header") != schedule.header_digest():
        raise ScheduleError(f"{out}: was made with another model, data, seed or validation ({man.get('inputs')}): {fix}")
    if man.get("input_hash") != input_hash:
        raise ScheduleError(f"{out}: the input model has changed since (state hash {man.get('input_hash')}, now "
                            f"{input_hash}): {fix}")
    done = man.get("stages", [])
    if len(done) > len(schedule.stages):
        raise ScheduleError(f"{out}: holds {len(done)} completed stages, the schedule has {len(schedule.stages)}: {fix}")
    for rec, st in zip(done, schedule.stages):
        if rec["digest"] != st.digest() or rec["name"] != st.name:
            raise ScheduleError(f"{schedule.source}: {st.label} has changed since it was run into {out}: {fix}")
        f = out / rec["file"]
        if not f.is_file() or _sha(f) != rec["sha256"]:
            raise ScheduleError(f"{f}: missing or changed since its stage completed (SHA-256 differs from the "
                                f"manifest): {fix}")
    return len(done)


def compress(schedule: Schedule, out, *, board: str | None = None, steps: int = 20, force: bool = False,
             log=None, progress=None) -> dict:
    """Run `schedule` into the folder `out` (see the module docstring); returns the report:
    {"stages": [per-stage report], "final": file, ...}. force: start over (the manifest and the
    partial stages of an earlier run are ignored and replaced)."""
    from tinytrain.graph import io as tio

    out = Path(out)
    tio.check_writable(out, folder=True)
    if board is not None:
        from tinytrain.device.boards import get_board
        get_board(board)
    model, ds, train, valid = load_inputs(schedule)
    plan(schedule, model, train, board)
    input_hash = f"{model.state_hash():08x}"
    man_path = out / MANIFEST
    man = None
    if man_path.exists() and not force:
        try:
            man = json.loads(man_path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise ScheduleError(f"{man_path}: not readable JSON: pass --force to start over, or choose another --out") from None
    done = _check_done(schedule, man, out, input_hash) if man else 0
    if man is None or force:
        man = {"format": FORMAT, "version": 1, "schedule": schedule.source, "header": schedule.header_digest(),
               "inputs": {"model": schedule.model, "data": ds.name, "seed": schedule.seed,
                          "validation": schedule.validation, "train_samples": len(train.x_train),
                          "validation_samples": len(valid.x_test)},
               "input_hash": input_hash, "stages": []}
        done = 0
    say = log or (lambda line: None)
    out.mkdir(parents=True, exist_ok=True)
    for f in [*out.glob(".*.partial.tt"), *out.glob(".*.adaptive")]:  # other schedule versions', or all with --force
        if force or not any(f == _partial(out, st) for st in schedule.stages[done:]):
            _remove(f)
    if "input_report" not in man:
        man["input_report"] = _report(model, train, valid, {"stage": 0, "name": "input", "kind": "input",
                                                            "epochs": 0, "file": None})
    base = man["input_report"]
    if done:
        model, _ = tio.load(out / man["stages"][done - 1]["file"])
        say(f"resuming after {schedule.stages[done - 1].label}: {done} of {len(schedule.stages)} stages done")
    for st in schedule.stages[done:]:
        say(f"{st.label}: {st.kind}" + (f", {st.epochs} epochs" if st.epochs else ""))
        model, extra = run_stage(model, st, schedule, train, valid, out, log=log, progress=progress, board=board,
                                 steps=steps)
        rep = _report(model, train, valid, {"stage": st.index, "name": st.name, "kind": st.kind,
                                           "file": stage_file(st), **extra})
        path = tio.save(model, out / stage_file(st), extra={"dataset": ds.name, "data_source": ds.source,
                                                            "compress": {"stage": st.index, "name": st.name,
                                                                         "digest": st.digest()},
                                                            "history": extra.get("history", {})})
        rep.pop("history", None)
        man["stages"].append({"index": st.index, "name": st.name, "kind": st.kind, "digest": st.digest(),
                              "file": path.name, "sha256": _sha(path), "state_hash": rep["state_hash"],
                              "report": rep})
        _write_manifest(man_path, man)
        _remove(_partial(out, st))
        say(f"{st.label}: validation {rep['validation_accuracy']:.4f}, test {rep['test_accuracy']:.4f}, "
            f"sparsity {rep['sparsity']:.3f}, precision {rep['precision']}, saved {path}")
    reports = [base] + [rec["report"] for rec in man["stages"]]
    if board is not None:
        changed = False
        for i, rep in enumerate(reports):
            dev = rep.setdefault("device", {})
            if board not in dev:
                m = (load_inputs(schedule)[0] if i == 0 else tio.load(out / rep["file"])[0])
                say(f"device cost of {'the input' if i == 0 else schedule.stages[i - 1].label} on {board}")
                dev[board] = device(m, board, train, steps)
                changed = True
        if changed:
            _write_manifest(man_path, man)
    return {"schedule": schedule.source, "out": str(out), "board": board, "inputs": man["inputs"],
            "resumed_after": done, "stages": reports, "final": str(out / man["stages"][-1]["file"]),
            "final_state_hash": man["stages"][-1]["state_hash"]}


def _remove(path: Path) -> None:
    import shutil

    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()


def _write_manifest(path: Path, man: dict) -> None:
    from tinytrain.graph.io import atomic_write

    text = json.dumps(man, indent=1, sort_keys=True).encode()
    atomic_write(path, lambda f: f.write(text))


def run_stage(model, st, schedule, train, valid, out: Path, *, log=None, progress=None, board=None, steps=20):
    """(model after the stage, report extra) of one stage on the model before it. board: the
    pipeline's --board, where an adaptive stage's budget is measured unless it names its own."""
    from tinytrain.compress import adaptive
    from tinytrain.train import fit

    seed = S.stage_seed(schedule.seed, st.index)
    o = st.options
    if st.kind == "adaptive":
        params = {k: o[k] for k in adaptive.DEFAULTS if k in o}
        from tinytrain.progress import progress_bar

        total = params.get("max_epochs", adaptive.DEFAULTS["max_epochs"])
        meter = (adaptive.board_meter(o.get("board", board), train, params["budget"], steps)
                 if params.get("budget") else None)
        with progress_bar(total=total, desc=f"{st.label} (at most)", unit="epoch", force=progress) as bar:
            m, ctl = adaptive.run(model, train, valid, params, seed, lr=o.get("lr"), log=log, progress=bar,
                                  checkpoint=_partial(out, st), device=meter)
        if log is not None and ctl.closest_miss():
            log(f"  warning: {st.label}: {ctl.closest_miss()}; the result is the most compressed level within "
                "the accuracy budget")
        return m, {"epochs": ctl.epochs, "adaptive": ctl.summary()}
    per_epoch = len(train.x_train) // model.optimizer.batch_size
    prune = (absolute_prune(o["prune"], int(model.meta[1]), per_epoch, f"{st.label}: prune")
             if "prune" in o else None)
    m = S.restage(model, lr=o.get("lr"), precision=o.get("precision"), prune=prune)
    if m is model:
        m = model.copy()
    h = fit(m, train, st.epochs, seed=seed, checkpoint=_partial(out, st), resume=True, progress=progress,
            log=(lambda line: log("  " + line)) if log else None)
    sums = {k: int(sum(e[k] for e in h.epochs)) for k in ("act_saturations", "weight_saturations", "update_underflows")}
    return m, {"epochs": st.epochs, "resumed_from_epoch": h.resumed_from, "counters": sums, "history": h.to_dict()}
