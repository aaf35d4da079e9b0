"""``tinytrain precision-lab``: a workload's float twin in FP32 ... FP8 beside tinytrain's integer
policies (registered in tinytrain.cli's plugin list; needs the ``lab`` extra).

    tinytrain precision-lab --workload w1
    tinytrain precision-lab --workload w3 --seeds 0,1,2 --json > w3-lab.json
    tinytrain precision-lab --workload w2 --recipe fp32 --recipe "bf16 + master" --plot w2-lab.png
    tinytrain precision-lab --workload w2 --schedule cosine --no-integer
    tinytrain precision-lab --workload w2 --recipe fp32 --lr 0.17 --validation 0.2 --no-integer --jobs 2
"""
from __future__ import annotations

import argparse

from tinytrain import cli
from tinytrain.progress import progress_bar


def _seeds(s: str) -> tuple[int, ...]:
    try:
        v = tuple(int(x) for x in s.split(",") if x.strip() != "")
    except ValueError:
        v = ()
    if not v or any(x < 0 for x in v):
        raise argparse.ArgumentTypeError(f"expected comma-separated seeds like 0,1,2, got {s!r}")
    return v


def _positive_float(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = -1.0
    if not v > 0 or v != v or v == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number like 0.085, got {s!r}")
    return v


def _fraction(s: str) -> float:
    try:
        v = float(s)
    except ValueError:
        v = -1.0
    if not 0 < v < 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1 like 0.2, got {s!r}")
    return v


def _args(p):
    p.add_argument("--workload", required=True, metavar="NAME",
                   help="w1 digits-mlp, w2 mnist1d-cnn-pool, w2-strided mnist1d-cnn (W2 before issue 11), "
                        "w3 digits-cnn (DESIGN.md's benchmarks)")
    p.add_argument("--seeds", type=_seeds, default=(0, 1, 2), help="comma-separated seeds (default 0,1,2)")
    p.add_argument("--recipe", action="append", default=None, metavar="NAME",
                   help="only this float recipe (repeatable; default: all, see docs/precision-lab.md)")
    p.add_argument("--epochs", type=cli._positive_int, default=None,
                   help="float-twin epochs (default: the workload's lab epochs, w2 200, else its epochs)")
    p.add_argument("--batch-size", type=cli._positive_int, default=32, help="float-twin batch (default 32)")
    p.add_argument("--schedule", choices=("constant", "cosine"), default=None,
                   help="float-twin lr: constant or tinytrain's cosine to 0 over the run (default: the "
                        "workload's lab schedule, w2 cosine, else constant)")
    p.add_argument("--lr", type=_positive_float, default=None,
                   help="float-twin learning rate (default: the workload's lr * sqrt(batch), or its lab_lr when it has one)")
    p.add_argument("--validation", type=_fraction, default=0.0, metavar="FRACTION",
                   help="hold out this fraction of the training set and report accuracy on it instead of "
                        "the test set (to choose a recipe; e.g. 0.2)")
    p.add_argument("--jobs", type=cli._positive_int, default=1, help="training runs at once (default 1)")
    p.add_argument("--no-integer", action="store_true", help="leave out tinytrain's integer rows")
    p.add_argument("--plot", metavar="FILE", default=None, help="write a PNG of accuracy per recipe")
    p.add_argument("--json", action="store_true", help="print only a JSON object on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = __doc__.split("\n\n", 1)[1].replace("    tinytrain", "  tinytrain").join(["examples:\n", ""])


def _run(args) -> int:
    try:
        from tinytrain.lab import precision as P
        import ml_dtypes  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"precision-lab needs PyTorch and ml_dtypes ({exc.name} is missing): "
                         "pip install 'tinytrain-mcu[lab]'") from None
    from tinytrain.lab.workloads import WORKLOADS
    if args.workload not in WORKLOADS:
        raise ValueError(f"--workload {args.workload!r} is not a workload: use one of {', '.join(WORKLOADS)}")
    if args.recipe:
        for name in args.recipe:
            P.recipe(name)  # unknown names: one line naming the known ones
    if args.plot:
        from tinytrain.graph import io as tio
        tio.check_writable(args.plot)
    total = P.n_runs(args.seeds, args.recipe, not args.no_integer)
    with progress_bar(total=total, desc=f"precision lab {args.workload}", unit="run", json=args.json) as bar:
        res = P.run(args.workload, args.seeds, args.recipe, args.epochs, args.batch_size, not args.no_integer, bar, args.schedule,
                    args.lr, args.validation, args.jobs)
    if args.plot:
        P.plot([res], args.plot)
        res["plot"] = args.plot
    if args.json:
        cli._emit_json(res)
    else:
        print(P.format_table(res))
        if args.plot:
            print(f"plot: {args.plot}")
    return 0


cli.register("precision-lab", "train a workload's float twin in FP32/TF32/FP16/BF16/FP8 per tensor role, "
             "beside tinytrain's integer policies", _args, _run)
