"""The ``tinytrain`` command line.

Subcommands live in the ``SUBCOMMANDS`` registry. A module adds its own with::

    from tinytrain import cli

    def _args(p):            # p is that subcommand's argparse parser
        p.add_argument("--model", required=True)

    def _run(args) -> int:   # return the exit code; raise a ValueError/OSError for user errors
        ...

    cli.register("codegen", "generate C for a model", _args, _run)

and lists itself in ``PLUGIN_MODULES`` (imported when the parser is built; a module that is
not installed yet is skipped). User errors (any ValueError or OSError: ModelError, DataError,
FileFormatError, ConfigError, TrainError, ...) print one line to stderr and exit 2; set
TINYTRAIN_DEBUG=1 to see the traceback instead.

Exit status: 0 success; 1 an internal error (a bug in tinytrain: please report it) or QEMU
exiting under ``emulate``; 2 bad input or a missing tool, told in one line naming the problem
and the fix, with no partial output left; 3 a verification found a difference (``verify``: the
first differing step, tensor and index are reported); 130 interrupted.

Long work (verify steps, federated rounds, builds, board checks, training) shows a tqdm bar on
stderr only when stderr is a terminal and ``--json`` is not given (tinytrain.progress);
``--json`` means stdout holds the JSON object only.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Callable

PROG = "tinytrain"


@dataclasses.dataclass
class Subcommand:
    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


SUBCOMMANDS: dict[str, Subcommand] = {}

#: modules that register further subcommands; each is part of the package, so one that fails
#: to import is a broken install or a bug, and says so instead of vanishing from --help
PLUGIN_MODULES = [
    "tinytrain.cli_device",  # codegen, build, verify, emulate, flash
    "tinytrain.federated.cli",  # federate
    "tinytrain.lab.cli",  # precision-lab
    "tinytrain.interop.cli",  # import, export
    "tinytrain.compress.cli",  # compress
    "tinytrain.cli_shrink",  # shrink (structured pruning)
]


def register(name: str, help: str, add_arguments, run) -> Subcommand:
    """Add (or replace) a subcommand."""
    sc = Subcommand(name, help, add_arguments, run)
    SUBCOMMANDS[name] = sc
    return sc


class PluginError(ImportError):
    """A command module of the package that does not import (a broken install)."""


def _load_plugins():
    for mod in PLUGIN_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as exc:
            if os.environ.get("TINYTRAIN_DEBUG"):
                raise
            raise PluginError(f"the {mod} commands cannot be loaded ({type(exc).__name__}: {exc}): "
                              "the installation is broken, reinstall tinytrain-mcu "
                              "(TINYTRAIN_DEBUG=1 shows the traceback)") from exc


class _Parser(argparse.ArgumentParser):
    """argparse with its usage errors as one line (exit 2), like every other bad input: the
    usage text is what `--help` is for. Subcommand parsers inherit the class."""

    def error(self, message):
        self.exit(2, f"{PROG}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    _load_plugins()
    p = _Parser(
        prog=PROG, description="Integer-only on-device training for microcontrollers, "
        "bit-exact between laptop and board.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Run `tinytrain COMMAND --help` for the options of a command.\n\n"
        "exit status:\n  0    success\n  1    internal error (a bug: please report it), or QEMU "
        "exiting under emulate\n  2    bad input or a missing tool (one line on stderr naming the "
        "problem and the fix)\n  3    verify found a mismatch (first differing step, tensor, index)\n"
        "  130  interrupted\n\n"
        "examples:\n  tinytrain train --data digits --model digits-mlp --out runs/w1.tt\n"
        "  tinytrain info runs/w1.tt --plot w1-mem.png\n  tinytrain boards --model digits-mlp\n"
        "  tinytrain verify --board host --model runs/w1.tt --json")
    from tinytrain import __version__
    p.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    for sc in SUBCOMMANDS.values():
        sp = sub.add_parser(sc.name, help=sc.help, description=sc.help)
        sc.add_arguments(sp)
        sp.set_defaults(_run=sc.run)
    return p


def _error(msg: str) -> int:
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """Entry point of the console script; returns the exit code."""
    try:
        parser = build_parser()
    except PluginError as exc:
        return _error(str(exc))
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, usage errors (argparse prints them)
        return int(exc.code or 0)
    if not getattr(args, "_run", None):
        parser.print_help(sys.stderr)
        return 2
    debug = bool(os.environ.get("TINYTRAIN_DEBUG"))
    previous = _handle_termination()
    import warnings

    shown = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        return int(args._run(args) or 0)
    except Terminated as exc:
        print(f"{PROG}: terminated by signal {exc.signum}", file=sys.stderr)
        return 128 + exc.signum
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError as exc:
        if _stdout_broken():  # `tinytrain info m.tt | head`: the reader left; stay quiet
            _silence_stdout()
            return 1
        if debug:  # a board's socket or a subprocess's pipe: an ordinary I/O error
            raise
        return _error(_one_line(exc))
    except (ValueError, OSError) as exc:
        if debug:
            raise
        return _error(_one_line(exc))
    except Exception as exc:  # a bug: still one line, with the way to the traceback
        if debug:
            raise
        print(f"{PROG}: internal error: {type(exc).__name__}: {_one_line(exc)} "
              "(set TINYTRAIN_DEBUG=1 for the traceback, and please report it)", file=sys.stderr)
        return 1
    finally:
        warnings.showwarning = shown
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    """Warnings (tinytrain.train.TrainWarning, ...) as one line on stderr, no source line."""
    print(f"{PROG}: warning: {_one_line(message)}", file=sys.stderr, flush=True)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, turned into the same unwinding as Ctrl-C (finally blocks and context
    managers run: files are closed, QEMU boards stopped)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _handle_termination() -> dict:
    """Install the SIGTERM/SIGHUP handler (main thread only); returns the previous handlers.
    The handler first SIGKILLs this process's QEMU boards, so worker threads blocked on a board
    see their link fail at once instead of waiting out a timeout, then raises Terminated."""
    if threading.current_thread() is not threading.main_thread():
        return {}

    def terminate(signum, _frame):
        from tinytrain.device.emulator import kill_all

        kill_all()
        raise Terminated(signum)

    sigs = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s]
    return {sig: signal.signal(sig, terminate) for sig in sigs}


def _stdout_broken() -> bool:
    """Whether stdout is a pipe whose reader has gone (poll reports an error on it). A broken
    pipe elsewhere (a board's socket, a compiler's pipe) must not silence stdout."""
    import select

    try:
        p = select.poll()
        p.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in p.poll(0))
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured, closed)
        return False


def _silence_stdout():
    """Point stdout at devnull so the interpreter's final flush cannot raise again (the
    recipe of Python's signal module documentation, "Note on SIGPIPE")."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # stdout is not a file (captured)
        pass


def _one_line(exc) -> str:
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return " ".join(str(exc).split()) or type(exc).__name__


def _emit_json(obj):
    print(json.dumps(obj, sort_keys=True))


# --------------------------------------------------------------------------- train

def load_model_args(args):
    """(model, dataset) from --model (built-in name, model file, or saved .tt) and --data."""
    from tinytrain import data
    from tinytrain.graph.models import MODELS, build_model

    name = args.data
    if name is None and args.model in MODELS:
        name = MODELS[args.model][2]
    if name is None and Path(args.model).is_file():
        from tinytrain.graph import io as tio

        if tio.is_model_file(args.model):  # a saved model records the data it was trained on
            extra = tio.load(args.model)[1]
            src = extra.get("data_source")
            name = extra.get("dataset")
            if name not in data.BUILTINS and src and Path(str(src)).exists():
                name = src
    ds = data.load(name or "digits")
    return build_model(args.model, ds, seed=args.seed, precision=precision_arg(getattr(args, "precision", None))), ds


def precision_arg(text):
    """--precision as given (None, a preset name or a JSON object), checked: a ModelError
    (exit 2, one line) names what is wrong."""
    from tinytrain.graph.layers import ModelError
    from tinytrain.graph.precision import PrecisionError, parse_cli

    if text is None:
        return None
    try:
        return parse_cli(text)
    except PrecisionError as exc:
        raise ModelError(str(exc)) from None


def add_precision_arg(p) -> None:
    from tinytrain.graph.precision import PRESETS

    p.add_argument("--precision", default=None, metavar="POLICY",
                   help=f"precision policy: a preset ({', '.join(PRESETS)}) or a JSON object such as "
                   "'{\"weights\": \"int8\", \"master\": \"int16\"}' (replaces the model file's; a saved "
                   ".tt is converted to it: docs/precision.md); keys include \"momentum\" (int32, int16, int8) "
                   "and \"loss_scale\" (dynamic, global, static, e.g. \"global:init_scale=7\")")


def _prune_arg(text):
    """--prune JSON: the object, or None when not given."""
    if text is None:
        return None
    import json
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"--prune: invalid JSON at column {exc.colno}: {exc.msg} (give an object such as "
                         '\'{"schedule": "polynomial", "final_sparsity": 0.8, "end_step": 20000}\')') from None


def _resolve_data(data_arg: str, model_arg: str) -> str:
    """A built-in data name may name the family ("digits"); a built-in model picks the layout
    it is made for ("digits-cnn" reads "digits-image")."""
    from tinytrain.data import BUILTINS
    from tinytrain.graph.models import MODELS
    if data_arg in BUILTINS and model_arg in MODELS:
        want = MODELS[model_arg][2]
        if want != data_arg and want.startswith(data_arg):
            return want
    return data_arg


def _train_args(p):
    p.add_argument("--data", required=True, help="digits, mnist1d (built-ins), or a .npz/.csv file or IDX directory")
    p.add_argument("--model", required=True, help="digits-mlp, digits-cnn, mnist1d-cnn, mnist1d-cnn-pool, a .json/.toml model "
                   "description, or a saved .tt model to fine-tune")
    p.add_argument("--epochs", type=int, default=20, help="total number of epochs (default 20)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights, the training PRNG and the shuffling")
    p.add_argument("--out", help="model file (.tt) written after every epoch (checkpoint)")
    p.add_argument("--lr", type=float, help="learning rate (overrides the model's)")
    p.add_argument("--batch-size", type=int, help="batch size (overrides the model's; default 1)")
    add_precision_arg(p)
    p.add_argument("--prune", metavar="JSON", help='prune while training: a "prune" object for the whole model, '
                   'e.g. \'{"schedule": "polynomial", "final_sparsity": 0.8, "end_step": 20000}\'; its "storage" '
                   '(auto, dense, sparse, rows, bitmap) is how codegen stores the pruned tensors (docs/pruning.md)')
    p.add_argument("--plot", help="write a training-curve PNG here")
    p.add_argument("--resume", action="store_true", help="continue from --out if it exists (bit-identical)")
    p.add_argument("--force", action="store_true", help="replace --out even if it holds a different "
                   "model (without it, that is an error)")
    p.add_argument("--reference", action="store_true", help="use the slow numpy reference step instead of numba")
    p.add_argument("--limit", type=int, help="train on the first N training samples only")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                   help="show a progress bar (default: when stderr is a terminal)")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n  tinytrain train --data digits --model digits-mlp --out runs/w1.tt\n"
                "  tinytrain train --data digits --model digits-mlp --precision int8 --out runs/w1-int8.tt\n"
                "  tinytrain train --data digits --model runs/w1.tt --precision int8-master16 --epochs 5 --out runs/w1-ft.tt\n"
                "  tinytrain train --data digits --model digits-mlp --precision '{\"loss_scale\": \"global\"}' --out runs/w1-gs.tt\n"
                "  tinytrain train --data mnist1d --model mnist1d-cnn --epochs 40 --plot runs/w2.png --json")


def _train_run(args) -> int:
    from tinytrain import data
    from tinytrain.graph import io as tio
    from tinytrain.graph.models import build_model
    from tinytrain.train import TrainError, evaluate, fit

    if args.epochs < 0:
        raise TrainError(f"--epochs must be >= 0, got {args.epochs}")
    if args.resume and not args.out:
        raise TrainError("--resume needs --out: the checkpoint to continue from")
    if args.resume and args.force:
        raise TrainError("--resume continues --out and --force replaces it: pass one of them")
    for out in (args.out, args.plot):
        if out:
            tio.check_writable(out)
    ds = data.load(_resolve_data(args.data, args.model))
    model = build_model(args.model, ds, seed=args.seed, lr=args.lr, batch_size=args.batch_size,
                        precision=precision_arg(args.precision), prune=_prune_arg(args.prune))
    _check_storage(model, TrainError)
    if args.out and not (args.resume or args.force):
        _refuse_replacing(args.out, model)
    progress = sys.stderr.isatty() if args.progress is None else args.progress
    logf = sys.stderr if args.json else sys.stdout
    log = lambda line: print(line, file=logf, flush=True)  # noqa: E731
    if not args.json:
        print(model.summary())
        print(f"data: {ds!r}")
    h = fit(model, ds, args.epochs, seed=args.seed, progress=progress, checkpoint=args.out,
            resume=args.resume, plot=args.plot, reference=args.reference, limit=args.limit, log=log)
    last = dict(h.last)
    if not h.epochs:  # --epochs 0: report the untrained model
        last["test_accuracy"] = evaluate(model, ds)["accuracy"]
    n_seen = sum(e["samples"] for e in h.epochs[h.resumed_from:])
    secs = sum(e["seconds"] for e in h.epochs[h.resumed_from:])
    summary = {
        "model": model.name, "data": ds.name, "epochs": len(h.epochs), "seed": args.seed,
        "resumed_from_epoch": h.resumed_from,
        "test_accuracy": last.get("test_accuracy"), "train_accuracy": last.get("train_accuracy"),
        "train_loss": last.get("train_loss"), "train_seconds": secs,
        "samples_per_second": (n_seen / secs) if secs > 0 else None,
        "saturations": {"activations": int(sum(e["act_saturations"] for e in h.epochs)),
                        "weights": int(sum(e["weight_saturations"] for e in h.epochs)),
                        "update_underflows": int(sum(e.get("update_underflows", 0) for e in h.epochs))},
        "state_hash": f"{model.state_hash():08x}", "schema_hash": f"{model.schema_hash():08x}",
        "params": model.param_count(), "out": args.out, "plot": args.plot,
        "engine": "reference" if args.reference else "numba",
    }
    if model.masks:  # pruning: zeros per pruned tensor (docs/pruning.md)
        from tinytrain.graph.prune import sparsity
        summary["pruned"] = {k: {"zeros": z, "of": n} for k, (z, n) in sparsity(model).items()}
    if args.json:
        _emit_json(summary)
    else:
        acc = summary["test_accuracy"]
        print(f"done: {summary['epochs']} epochs, test accuracy "
              f"{acc if acc is None else f'{acc:.4f}'}, {secs:.2f}s training, "
              f"state hash {summary['state_hash']}" + (f", saved to {args.out}" if args.out else ""))
        if "pruned" in summary:
            print("pruned: " + ", ".join(f"{k} {v['zeros']}/{v['of']} ({100 * v['zeros'] / v['of']:.1f} %)"
                                         for k, v in summary["pruned"].items()))
    return 0


def _check_storage(model, error):
    """A "storage" the model cannot have on the board is refused before training, not after it."""
    from tinytrain.codegen.sparse import check_storage
    check_storage(model, error)


def _refuse_replacing(out, model):
    """--out may replace a checkpoint of this same model (a rerun), not anything else."""
    from tinytrain.graph import io as tio
    from tinytrain.train import TrainError, _first_difference

    if not os.path.exists(out):
        return
    try:
        saved, _ = tio.load(out)
    except tio.FileFormatError:
        raise TrainError(f"{out} exists and is not a readable tinytrain model: pass --force to replace it "
                         "or choose another --out") from None
    diff = _first_difference(saved.config(), model.config())
    if diff:
        raise TrainError(f"{out} holds a different model ({diff}): pass --force to replace it, "
                         "--resume with the model it holds to continue it, or another --out")


# ---------------------------------------------------------------------------- eval

def _eval_args(p):
    p.add_argument("--model", required=True, help="a saved model file (.tt)")
    p.add_argument("--data", help="dataset (default: the one the model was trained on)")
    p.add_argument("--split", choices=("test", "train"), default="test")
    p.add_argument("--reference", action="store_true", help="use the numpy reference instead of numba")
    p.add_argument("--json", action="store_true", help="print a JSON summary as the last line")


def _eval_run(args) -> int:
    from tinytrain import data
    from tinytrain.graph import io as tio
    from tinytrain.train import TrainError, evaluate

    model, extra = tio.load(args.model)
    name = args.data or extra.get("dataset")
    if not args.data and name not in data.BUILTINS and os.path.exists(str(extra.get("data_source"))):
        name = extra["data_source"]  # trained on a file: its path
    if not name:
        raise TrainError(f"{args.model} does not record its dataset: pass --data")
    ds = data.load(name)
    r = evaluate(model, ds, split=args.split, reference=args.reference)
    out = {"model": args.model, "data": ds.name, "split": r["split"], "accuracy": r["accuracy"],
           f"{r['split']}_accuracy": r["accuracy"], "samples": r["samples"], "correct": r["correct"],
           "act_saturations": r["act_saturations"], "per_class_accuracy": r["per_class_accuracy"],
           "state_hash": f"{model.state_hash():08x}", "epoch": extra.get("epoch")}
    if args.json:
        _emit_json(out)
    else:
        print(f"{args.model} on {ds.name} ({r['split']}): accuracy {r['accuracy']:.4f} "
              f"({r['correct']}/{r['samples']}), activation saturations {r['act_saturations']}, "
              f"state hash {out['state_hash']}")
        print("per class: " + " ".join(f"{c}:{a:.2f}" if a is not None else f"{c}:-"
                                       for c, a in enumerate(r["per_class_accuracy"])))
    return 0


# --------------------------------------------------------------------- sensitivity

def _sweep_args(p, each: str, picture: str, examples: list[str]) -> None:
    """The options sensitivity and pareto share (QEMU steps, processes, plot, JSON) and the
    examples of --help."""
    from tinytrain.sweep import default_jobs

    p.add_argument("--steps", type=_positive_int, default=20, help=f"verified QEMU steps per {each} (default 20)")
    p.add_argument("--jobs", type=_positive_int, default=default_jobs(), help="processes sharing the work "
                   f"(default {default_jobs()})")
    p.add_argument("--plot", metavar="FILE", help=f"write a PNG of {picture}")
    p.add_argument("--json", action="store_true", help="print only a JSON object on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = "examples:\n" + "\n".join(f"  tinytrain {e}" for e in examples)


def _sensitivity_args(p):
    from tinytrain.sensitivity import DEFAULT_POLICIES

    p.add_argument("--model", required=True, help="a saved model (.tt), or a built-in name / model file trained "
                   "first for --epochs")
    p.add_argument("--data", help="dataset (default: the one the model was trained on, or the built-in's)")
    p.add_argument("--levels", default=",".join(f"{v:g}" for v in (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)),
                   help="sparsity levels, comma-separated, each in [0, 1) (default 0,0.1,...,0.9)")
    p.add_argument("--policies", default=",".join(DEFAULT_POLICIES), help="weight-bit levels: precision presets "
                   f"applied to one layer at a time, comma-separated (default {','.join(DEFAULT_POLICIES)})")
    p.add_argument("--board", default=None, help="also measure each variant on this emulated board: change in RAM "
                   "and flash (linked firmware) and instructions per sample (QEMU, every step verified)")
    p.add_argument("--layers", default=None, help="only these layer indices, comma-separated (default: every "
                   "dense and convolution layer that learns)")
    p.add_argument("--split", choices=("test", "train"), default="test")
    p.add_argument("--epochs", type=int, default=20, help="epochs of training when --model is not a saved model")
    p.add_argument("--seed", type=int, default=0, help="seed of that training")
    _sweep_args(p, "variant", "the accuracy drop against sparsity and weight bits", [
        "sensitivity --model runs/w1.tt --plot runs/w1-sens.png",
        "sensitivity --model digits-mlp --board microbit --json",
        "sensitivity --model runs/w3.tt --levels 0,0.5,0.9 --policies int16,int8-master16 --board mps2_an386 --jobs 2"])


def _sensitivity_run(args) -> int:
    from tinytrain import sensitivity as sens
    from tinytrain.graph import io as tio
    from tinytrain.train import TrainError, fit

    try:
        levels = [float(v) for v in args.levels.split(",") if v.strip()]
    except ValueError:
        raise TrainError(f"--levels {args.levels!r}: give numbers in [0, 1) separated by commas") from None
    sens._levels(levels)
    policies = sens._policies([v.strip() for v in args.policies.split(",") if v.strip()])
    try:
        layers = None if args.layers is None else [int(v) for v in args.layers.split(",") if v.strip()]
    except ValueError:
        raise TrainError(f"--layers {args.layers!r}: give layer indices separated by commas") from None
    if args.board is not None:
        sens.emulated(args.board)
    if args.plot:
        tio.check_writable(args.plot)
    if args.epochs < 0:
        raise TrainError(f"--epochs must be >= 0, got {args.epochs}")
    model, ds = load_model_args(args)
    if not tio.is_model_file(args.model) and args.epochs:
        fit(model, ds, args.epochs, seed=args.seed, progress=False, log=lambda line: None)
    from tinytrain.progress import progress_bar

    work = {}
    with progress_bar(desc="sensitivity", unit="task", json=args.json) as bar:
        r = sens.sensitivity(model, ds, levels, split=args.split, policies=policies, board=args.board,
                             steps=args.steps, jobs=args.jobs, layers=layers, progress=bar, work=work)
    r.update(model=args.model, data=ds.name, work=work)
    if args.plot:
        sens.plot(r, args.plot)
    if args.json:
        _emit_json(r)
    else:
        print(sens.table(r))
        print(r["note"])
    return 0


# -------------------------------------------------------------------------- pareto

def _floats(text: str, what: str) -> tuple:
    try:
        return tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise ValueError(f"--{what} {text!r}: give numbers separated by commas") from None


def _pareto_args(p):
    from tinytrain import pareto as P

    p.add_argument("--model", required=True, help="a built-in name or a .json/.toml model description (each "
                   "configuration is trained from scratch)")
    p.add_argument("--data", help="dataset (default: the built-in model's)")
    p.add_argument("--board", required=True, help="emulated board: RAM/flash from its linked firmware, instructions "
                   "per sample from QEMU (every fitting point verified step by step)")
    p.add_argument("--budget", default=None, help="limits beside the board's: ram=BYTES (the firmware's whole RAM), "
                   "flash=BYTES, instructions=PER_SAMPLE, comma-separated")
    p.add_argument("--widths", default=",".join(f"{v:g}" for v in P.DEFAULT_WIDTHS),
                   help="width factors of the layers (default %(default)s)")
    p.add_argument("--policies", default=",".join(P.DEFAULT_POLICIES), help="precision presets (default %(default)s)")
    p.add_argument("--sparsities", default=",".join(f"{v:g}" for v in P.DEFAULT_SPARSITIES),
                   help="final sparsities of gradual pruning (default %(default)s)")
    p.add_argument("--train", default=",".join(P.DEFAULT_TRAINS), help="what the device trains: all, bias, "
                   "last:K (default %(default)s; partial points start from the 'all' point's weights)")
    p.add_argument("--epochs", type=_positive_int, default=20, help="host training epochs per point (default 20)")
    p.add_argument("--device-epochs", type=_positive_int, default=2, help="epochs of a partial training "
                   "after the host pre-training (default 2)")
    p.add_argument("--val-fraction", type=float, default=P.VAL_FRACTION,
                   help="share of the training set carved out for choosing (default %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and shuffles")
    p.add_argument("--out", metavar="FILE", help="write the chosen configuration: .tt (trained, with its state: "
                   "codegen/build/verify take it) or .json (its model description)")
    _sweep_args(p, "point", "accuracy vs training RAM and vs instructions per sample", [
        "pareto --model digits-cnn --board microbit --out runs/best.tt --plot runs/pareto.png",
        "pareto --model digits-mlp --board mps2_an386 --budget ram=8192,instructions=40000 --json",
        "pareto --model digits-mlp --board microbit --widths 0.5,1 --policies int16,int8 --sparsities 0 "
        "--train all,bias --epochs 5"])


def _pareto_run(args) -> int:
    from tinytrain import data
    from tinytrain import pareto as P
    from tinytrain.graph import io as tio
    from tinytrain.graph.models import MODELS
    from tinytrain.progress import progress_bar
    from tinytrain.sensitivity import emulated

    budget = P.parse_budget(args.budget)
    grid = P.Grid(_floats(args.widths, "widths"), tuple(v.strip() for v in args.policies.split(",") if v.strip()),
                  _floats(args.sparsities, "sparsities"), tuple(v.strip() for v in args.train.split(",") if v.strip()))
    emulated(args.board)
    if args.out:
        P.check_out(args.out)
    if args.plot:
        tio.check_writable(args.plot)
    if args.seed < 0:
        raise ValueError(f"--seed must be >= 0, got {args.seed}")
    name = args.data or (MODELS[args.model][2] if args.model in MODELS else "digits")
    ds = data.load(_resolve_data(name, args.model))
    with progress_bar(desc="pareto", unit="task", json=args.json) as bar:
        r = P.pareto(args.model, ds, args.board, budget=budget, grid=grid, epochs=args.epochs,
                     device_epochs=args.device_epochs, seed=args.seed, val_fraction=args.val_fraction,
                     steps=args.steps, jobs=args.jobs, progress=bar)
    if args.out:
        P.write_chosen(r, args.out)
    if args.plot:
        P.plot(r, args.plot)
    out = P.public(r)
    out.update(out=args.out, plot=args.plot)
    if args.json:
        _emit_json(out)
    else:
        print(P.table(out))
        if args.out:
            print(f"chosen configuration: {args.out}")
    return 0


# ---------------------------------------------------------------------------- info

def _positive_int(s: str) -> int:
    try:
        v = int(s)
    except ValueError:
        v = 0
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return v


def _info_args(p):
    p.add_argument("file", nargs="?", default=None, help="a saved model file (.tt)")
    p.add_argument("--model", dest="model_file", default=None, metavar="FILE", help="the same, as an option")
    p.add_argument("--board", default=None, help="board of the device-memory breakdown (default: "
                   "the default board, mps2_an386); the figures are those codegen, build and verify show")
    p.add_argument("--plot", metavar="FILE", default=None, help="write a PNG of the board's RAM and "
                   "flash as bars split by role against its limits, and per-layer RAM/flash/MACs")
    p.add_argument("--fixed-point", action="store_true", help="also replay one epoch of training "
                   "(reference, on a copy) and report every tensor's Q-format, the range it uses, "
                   "headroom, saturations and update underflows per layer, and the accumulator bounds; with a "
                   "global or static loss_scale, the steps the replay skipped (or saturated) and its final exponent")
    p.add_argument("--data", default=None, help="dataset of the --fixed-point replay (default: the one "
                   "the model was trained on)")
    p.add_argument("--samples", type=_positive_int, default=None, metavar="N",
                   help="replay only the first N training samples (default: the whole split)")
    p.add_argument("--json", action="store_true", help="print only a JSON object on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n  tinytrain info runs/w1.tt\n"
                "  tinytrain info runs/w1.tt --board nucleo_f446re --plot w1-mem.png --json\n"
                "  tinytrain info runs/w1.tt --fixed-point\n"
                "  tinytrain info --model runs/w3.tt --fixed-point --samples 200 --json")


def _info_run(args) -> int:
    from pathlib import Path

    from tinytrain.graph import io as tio
    from tinytrain.codegen.memory import memory_estimate

    if (args.file is None) == (args.model_file is None):
        raise ValueError("give the saved model once: tinytrain info FILE.tt (or --model FILE.tt)")
    args.file = args.file or args.model_file
    if args.plot:
        tio.check_writable(args.plot)
    model, extra = tio.load(args.file)
    hdr = tio.read_header(args.file)
    mem = memory_estimate(model, args.board)
    info = {"file": args.file, "bytes": Path(args.file).stat().st_size, "format_version": hdr["version"],
            "writer": hdr["writer"], "state_hash": f"{model.state_hash():08x}",
            "schema_hash": f"{model.schema_hash():08x}", "config": model.config(),
            "params": model.param_count(), "macs": model.macs(), "memory": mem,
            "optimizer_step": int(model.meta[1]), "epoch": extra.get("epoch"),
            "dataset": extra.get("dataset"), "data_input_exp": getattr(model, "data_input_exp", None)}
    hist = (extra.get("history") or {}).get("epochs") or []
    if hist:
        info["test_accuracy"] = hist[-1].get("test_accuracy")
    if model.masks:  # pruning (docs/pruning.md): zeros per pruned tensor, the events left
        from tinytrain.graph.prune import sparsity
        tab = model.prune_table
        info["pruned"] = {k: {"zeros": z, "of": n} for k, (z, n) in sparsity(model).items()}
        info["prune_events_left"] = int((tab.steps >= int(model.meta[1])).sum())
    if model.loss_scale.enabled:  # the scaler's state (docs/precision.md, "Loss scale")
        info["loss_scale"] = {"policy": str(model.loss_scale), "exponent": int(model.scaler[0]),
                              "clean_steps": int(model.scaler[1]), "overflow_steps": int(model.scaler[2])}
    bd = _breakdown_of(mem)
    if args.plot:
        from tinytrain.codegen.plot import plot_memory

        plot_memory(bd, args.plot, f"{model.name} on {bd.board}")
        info["plot"] = args.plot
    if args.fixed_point:
        info["fixed_point"] = _fixed_point(model, extra, args)
    if args.json:
        _emit_json(info)
        return 0
    print(model.summary())
    print(f"file: {args.file}, {info['bytes']} bytes, format v{info['format_version']} ({info['writer']})")
    print(f"state hash {info['state_hash']}, schema hash {info['schema_hash']}, optimizer step "
          f"{info['optimizer_step']}, epoch {info['epoch']}, dataset {info['dataset']}"
          + (f", test accuracy {info['test_accuracy']:.4f}" if hist else ""))
    print(f"optimizer: {model.optimizer}")
    if "loss_scale" in info:
        ls = info["loss_scale"]
        print(f"loss scale: exponent {ls['exponent']} (2^{ls['exponent']}), {ls['clean_steps']} clean steps in a row, "
              f"{ls['overflow_steps']} steps {'skipped' if model.loss_scale.mode == 'global' else 'saturated'}")
    if "pruned" in info:
        print("pruned: " + ", ".join(f"{k} {v['zeros']}/{v['of']} ({100 * v['zeros'] / v['of']:.1f} %)"
                                     for k, v in info["pruned"].items())
              + f"; {info['prune_events_left']} pruning events left in the schedule")
    print(bd.table())
    if args.plot:
        print(f"memory plot: {args.plot}")
    if args.fixed_point:
        from tinytrain.fixedpoint_report import format_report

        print(format_report(info["fixed_point"]))
    return 0


def _fixed_point(model, extra, args) -> dict:
    from tinytrain import data
    from tinytrain.fixedpoint_report import fixed_point_report
    from tinytrain.progress import progress_bar

    name = args.data or extra.get("dataset")
    if not name:
        raise ValueError(f"{args.file} does not record its dataset: give --data (e.g. --data digits)")
    ds = data.load(name)
    if tuple(ds.input_shape) != tuple(model.input_shape):
        raise ValueError(f"--data {name} has inputs of shape {tuple(ds.input_shape)}, the model takes "
                       f"{tuple(model.input_shape)}: give the dataset it was trained on")
    n = len(ds.x_train) if args.samples is None else min(args.samples, len(ds.x_train))
    with progress_bar(total=n, desc="fixed-point replay", unit="sample", json=args.json) as bar:
        return fixed_point_report(model, ds, n, progress=bar)


def _breakdown_of(mem: dict):
    from tinytrain.codegen.memory import Breakdown

    d = mem["breakdown"]
    return Breakdown(d["board"], d["ram"], d["flash"], d["ram_limit"], d["flash_limit"], d["stack_source"],
                     d["flash_source"], d["layers"], d["stack_measured"], d["linked"], d.get("stack_reserved"))


# -------------------------------------------------------------------------- boards

def _boards_args(p):
    p.add_argument("--model", default=None, help="also say for each board whether this model's "
                   "training firmware fits (RAM and flash): a built-in name, model file or .tt")
    p.add_argument("--data", default=None, help="dataset the model is shaped for (default: its own)")
    add_precision_arg(p)
    p.add_argument("--json", action="store_true", help="print only a JSON list on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n  tinytrain boards\n  tinytrain boards --model digits-cnn --json\n"
                "  tinytrain boards --model digits-cnn --precision int8   # what fits with int8 weights")


def _boards_run(args) -> int:
    from tinytrain.device.boards import load_boards
    from tinytrain.progress import progress_bar

    boards = sorted(load_boards().values(), key=lambda b: (not b.is_emulated, b.name))
    rows = [{"name": b.name, "cpu": b.cpu, "fpu": b.fpu, "ram": b.ram, "flash": b.flash,
             "emulated": b.is_emulated, "description": b.description} for b in boards]
    if args.model:
        from tinytrain.codegen.memory import breakdown

        args.seed = 0
        model, _ = load_model_args(args)
        with progress_bar(total=len(boards), desc="boards", unit="board", json=args.json) as bar:
            for b, row in zip(boards, rows):
                bd = breakdown(model, b.name)
                fits = bd.fits()
                if not fits["ram"]:  # the firmware leaves the load shadow out when RAM is short
                    bd = breakdown(model, b.name, shadow=False)
                    fits = bd.fits()
                row["fits"] = {"ram": fits["ram"], "flash": fits["flash"], "shadow": bd.ram["shadow"] > 0,
                               "ram_total": bd.ram_total, "flash_total": bd.flash_total,
                               "flash_source": bd.flash_source}
                bar.update(1)
    if args.json:
        _emit_json(rows)
        return 0
    head = f"{'board':16s} {'cpu':13s} {'RAM':>8s} {'flash':>8s}  {'kind':8s}"
    print(head + (f"  {args.model}: RAM / flash needed" if args.model else ""))
    for r in rows:
        line = (f"{r['name']:16s} {r['cpu']:13s} {_kib(r['ram']):>8s} {_kib(r['flash']):>8s}  "
                f"{'emulated' if r['emulated'] else 'real':8s}")
        if "fits" in r:
            f = r["fits"]
            ok = f["ram"] and f["flash"] is not False
            line += (f"  {'fits' if ok else 'does not fit'}: {f['ram_total']} B RAM"
                     f"{'' if f['ram'] else ' (too much)'}, "
                     + (f"{f['flash_total']} B flash{'' if f['flash'] else ' (too much)'}"
                        + (" (without the Arduino core)" if "Arduino" in f["flash_source"] else "")
                        if f["flash_total"] is not None else "flash unknown (no cross compiler)")
                     + ("" if f["shadow"] or not ok else ", without the load shadow"))
        print(line)
    return 0


def _kib(n: int) -> str:
    return f"{n // 1024} KiB" if n < 1 << 20 else f"{n / (1 << 20):g} MiB"


register("train", "train a model on a dataset (host simulator) and save it", _train_args, _train_run)
register("eval", "evaluate a saved model on a dataset", _eval_args, _eval_run)
register("info", "describe a saved model: layers, training state, device memory", _info_args, _info_run)
register("sensitivity", "accuracy drop of each layer pruned alone to each sparsity level and converted alone to "
         "each weight width (no fine-tuning), with --board the change in RAM, flash and instructions/sample",
         _sensitivity_args, _sensitivity_run)
register("pareto", "sweep width, precision, sparsity and what trains; measure each point on the host and "
         "the board; print the accuracy / RAM / instructions frontier and write the chosen model",
         _pareto_args, _pareto_run)
register("boards", "list the boards (CPU, RAM, flash, emulated or real; with --model what fits)",
         _boards_args, _boards_run)


if __name__ == "__main__":  # python -m tinytrain.cli: run the package's module, where the
    from tinytrain.cli import main as _main  # plugins register their commands (not __main__'s)

    sys.exit(_main())
