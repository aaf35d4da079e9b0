"""How long does `tinytrain sensitivity` take? Wall time of the command, from process start.

    .venv/bin/python bench/bench_sensitivity.py [--rounds 3] [--only w1 w1-board w3 w3-board]

Issue 12's target: the sensitivity sweep of W1 in <= 30 s and of W3 in <= 3 min on this machine,
both cores used. Each case runs the documented command on a model saved by `tinytrain train`
(20 epochs, seed 0; trained once before the timing, not timed), with the default sparsity levels
(0, 0.1, ..., 0.9), the default weight-width policies and ``--jobs 2``:

* ``w1`` / ``w3``: ``tinytrain sensitivity --model M.tt --json`` (accuracy of every variant on the
  test split, numba);
* ``w1-board`` / ``w3-board``: the same with ``--board microbit``: every distinct variant also
  linked (without PlatformIO: sweep.Costs) and run 20 steps on the QEMU micro:bit, each step
  checked against the numpy reference (no simulator compiled per variant).

Every call starts from an empty tinytrain cache (``TINYTRAIN_CACHE``: no built firmware, link
sizes, runtime objects or generated simulators; the datasets are linked in) and an empty
PlatformIO object cache (PLATFORMIO_BUILD_CACHE_DIR), so it does all its work as a first sweep
on a machine does.

The cases alternate within each round (the machine may be shared: the load average before each
call is reported). Each call is a new process, so it pays Python's start-up and numba's cache
load, as a user does. The JSON of every round (but its CPU and wall seconds, ``work``) is checked
to be the first round's: sensitivity is deterministic, the QEMU instruction counts included
(docs/boards.md). Writes bench/results/sensitivity.json and the BENCHMARKS.md section
sensitivity-time.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

TARGETS = {"w1": 30.0, "w3": 180.0}  # seconds (issue 12)
MODELS = {"w1": ("digits", "digits-mlp"), "w3": ("digits-image", "digits-cnn")}
CASES = ("w1", "w1-board", "w3", "w3-board")


def _cli() -> list[str]:
    exe = Path(sys.executable).with_name("tinytrain")
    return [str(exe)] if exe.is_file() else [sys.executable, "-m", "tinytrain"]


def _result(out: dict) -> dict:
    """The run's JSON without its CPU and wall seconds (``work``), which vary."""
    return {k: v for k, v in out.items() if k != "work"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", nargs="+", default=list(CASES), choices=CASES)
    args = ap.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="tt-bench-sens-"))
    env = dict(os.environ)
    models = {}
    for wl in sorted({c.split("-")[0] for c in args.only}):
        data, name = MODELS[wl]
        models[wl] = work / f"{wl}.tt"
        subprocess.run(_cli() + ["train", "--data", data, "--model", name, "--epochs", "20", "--seed", "0",
                                 "--out", str(models[wl]), "--json"], check=True, env=env, stdout=subprocess.DEVNULL)
    times = {c: [] for c in args.only}
    loads = {c: [] for c in args.only}
    first = {}
    for r in range(args.rounds):
        for case in (args.only if r % 2 == 0 else list(reversed(args.only))):
            wl = case.split("-")[0]
            cmd = _cli() + ["sensitivity", "--model", str(models[wl]), "--jobs", "2", "--json"]
            if case.endswith("-board"):
                cmd += ["--board", "microbit"]
            with tempfile.TemporaryDirectory(prefix="tt-cache-", dir=work) as cache:
                objects = Path(cache) / "pio-objects"
                for f in Path(env.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain")).glob("*.npz"):
                    (Path(cache) / f.name).symlink_to(f)  # datasets only: no firmware, link or simulator cache
                loads[case].append(round(os.getloadavg()[0], 2))
                t0 = time.perf_counter()
                res = subprocess.run(cmd, check=True, capture_output=True, text=True,
                                     env={**env, "TINYTRAIN_CACHE": cache, "PLATFORMIO_BUILD_CACHE_DIR": str(objects)})
                times[case].append(time.perf_counter() - t0)
            body = _result(json.loads(res.stdout))
            if case not in first:
                first[case] = body
            elif body != first[case]:
                raise AssertionError(f"{case}: round {r} gave a different result from round 0 at "
                                     f"{report.first_difference(first[case], body)}")
            print(f"round {r} {case:9s} {times[case][-1]:7.1f} s  load {loads[case][-1]:.1f}", flush=True)
    m = report.machine()
    res = {c: {"seconds": times[c], "median_s": float(np.median(times[c])), "target_s": TARGETS[c.split("-")[0]],
               "load_before": loads[c]} for c in args.only}
    report.write_json("sensitivity.json", {"rounds": args.rounds, "cases": res, "machine": m})
    rows = []
    for c in args.only:
        t, tgt = times[c], TARGETS[c.split("-")[0]]
        rows.append([c, f"{np.median(t):.1f} s ({min(t):.1f}–{max(t):.1f})", f"≤ {tgt:.0f} s",
                     "met" if np.median(t) <= tgt else "NOT met",
                     f"{min(loads[c]):.1f}–{max(loads[c]):.1f}"])
    body = ("## Sensitivity sweep time\n\n"
            f"`python bench/bench_sensitivity.py --rounds {args.rounds}`: `tinytrain sensitivity --model M.tt --jobs 2 "
            "--json` (default levels 0..0.9 and weight-width policies) timed from process start, cases alternating, "
            f"{args.rounds} rounds; `-board`: with `--board microbit` (every variant built and verified 20 steps on QEMU); "
            "every call from empty tinytrain and PlatformIO caches (datasets linked in). Every round's result equals the first's, QEMU instruction "
            "counts included. Target (issue 12): W1 ≤ 30 s, "
            f"W3 ≤ 3 min. {report.machine_line(m)}\n\n"
            + report.markdown_table(["case", "wall: median (range)", "target", "", "load average before calls"],
                                    rows))
    report.update_section("sensitivity-time", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
