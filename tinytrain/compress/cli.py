"""``tinytrain compress``: a multi-stage compression schedule (TOML), resumable, reported per stage."""
from __future__ import annotations

import argparse
import sys

from tinytrain import cli


def _args(p):
    p.add_argument("--schedule", required=True, metavar="FILE.toml", help="the stages (docs/compress.md)")
    p.add_argument("--model", help="replaces the schedule's model: a built-in name, model file or saved .tt")
    p.add_argument("--data", help="replaces the schedule's data (default: the model's own)")
    p.add_argument("--out", help="folder of the stage files and manifest.json (default runs/SCHEDULE-NAME); "
                   "a rerun continues after the last completed stage")
    p.add_argument("--board", help="also measure each stage on this board: linked RAM/flash and QEMU "
                   "instructions per sample (tinytrain.cost)")
    p.add_argument("--steps", type=int, default=20, help="verified QEMU steps per instruction count (default 20)")
    p.add_argument("--force", action="store_true", help="start over, replacing what --out holds")
    p.add_argument("--plot", metavar="FILE", help="write a PNG of accuracy, sparsity (and RAM/flash) per stage")
    p.add_argument("--json", action="store_true", help="print only a JSON object on stdout")
    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.epilog = ("examples:\n  tinytrain compress --schedule examples/compress-w1.toml --out runs/w1-compress\n"
                "  tinytrain compress --schedule examples/compress-w1-adaptive.toml --board mps2_an386 --json\n"
                "  tinytrain compress --schedule s.toml --model runs/w1.tt --out runs/w1-c --plot runs/w1-c.png\n"
                "  # killed or interrupted? run the same command again: it continues where it stopped")


def _run(args) -> int:
    from pathlib import Path

    from tinytrain.compress import report as R
    from tinytrain.compress.pipeline import compress
    from tinytrain.compress.schedule import ScheduleError, from_file
    from tinytrain.graph import io as tio
    from tinytrain.progress import enabled

    if args.steps < 1:
        raise ScheduleError(f"--steps must be >= 1, got {args.steps}")
    sched = from_file(args.schedule, model=args.model, data=args.data)
    out = Path(args.out) if args.out else Path("runs") / Path(args.schedule).stem
    if args.plot:
        tio.check_writable(args.plot)
    logf = sys.stderr if args.json else sys.stdout
    log = (lambda line: print(line, file=logf, flush=True)) if not args.json else None  # noqa: E731
    r = compress(sched, out, board=args.board, steps=args.steps, force=args.force, log=log,
                 progress=enabled(json=args.json))
    if args.plot:
        R.plot(r, args.plot)
        r["plot"] = args.plot
    if args.json:
        cli._emit_json(r)
    else:
        print(R.table(r))
        print(f"final model: {r['final']} (state hash {r['final_state_hash']})")
    return 0


cli.register("compress", "run a multi-stage compression schedule (prune, quantize, fine-tune, adaptive), "
             "resumable, with a report per stage", _args, _run)
