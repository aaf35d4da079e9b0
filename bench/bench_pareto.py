"""`tinytrain pareto` on the micro:bit (16 KB RAM, Cortex-M0): W3 digits-cnn (the issue 12 target)
and W1 digits-mlp.

    .venv/bin/python bench/bench_pareto.py [--workload w3 w1] [--jobs 2]

For each workload the sweep of tinytrain.pareto on the grid GRID (widths 0.5 / 1, policies
int16 / int8-master16, sparsity 0 / 0.5, training all / bias / last:1: 24 points; the command's
default adds width 0.75, which this shared machine had no time for; --widths changes it; 20 host
epochs, 2 device epochs for partial points, 15 % of the training set carved out for validation), every
point that fits measured from its linked firmware and verified for 20 steps on the QEMU
micro:bit. Beside it, in the same run, the unconstrained model: the workload trained on the
whole training set (20 epochs, seeds 0/1/2), test accuracy. Target (issue 12): the chosen
configuration fits 16 KB and its test accuracy is within 1.0 point of unconstrained W3 (the mean
of the three seeds), every frontier point verified on the QEMU micro:bit.

Writes bench/results/pareto_<workload>.json and .png and the BENCHMARKS.md section
pareto-<workload>; the chosen model is written as a .tt to a temporary folder and that file is
verified on the QEMU micro:bit as codegen/build/verify take it. CPU seconds per task are
reported (the serial/parallel split), not wall-clock speed: the machine is shared.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from tinytrain import pareto as P  # noqa: E402
from tinytrain.lab.precision import train_integer  # noqa: E402
from tinytrain.lab.workloads import SEEDS, WORKLOADS  # noqa: E402

BOARD = "microbit"
TARGET_POINTS = 1.0
GRID = P.Grid(widths=(0.5, 1.0))


def unconstrained(wl, ds) -> list[float]:
    """Test accuracy of the workload itself (whole training set, its epochs), per seed."""
    return [train_integer(wl, ds, s, {})["accuracy"] for s in SEEDS]


def run(workload: str, jobs: int, grid: P.Grid) -> dict:
    from tinytrain.verify import verify

    wl = WORKLOADS[workload]
    ds = wl.load()
    ref = unconstrained(wl, ds)
    r = P.pareto(wl.title, ds, BOARD, grid=grid, epochs=wl.epochs, jobs=jobs)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "best.tt")
        P.write_chosen(r, path)
        from tinytrain.graph import io as tio
        best, _ = tio.load(path)
        v = verify(best, ds, 20, board=BOARD, json=True)  # the written file as codegen/build/verify take it
    P.plot(r, report.RESULTS / f"pareto_{workload}.png")
    out = P.public(r)
    c = out["points"][out["chosen"]]
    fr = [p for p in out["points"] if p["frontier"]]
    out.update(unconstrained_test_accuracy=ref, unconstrained_mean=float(np.mean(ref)),
               chosen_minus_unconstrained_points=100 * (c["test_accuracy"] - float(np.mean(ref))),
               chosen_file_verified_steps=v["steps"], chosen_file_mismatches=v["mismatches"],
               frontier_verified=all(p["verified_steps"] > 0 for p in fr),
               target_met=bool(c["ram_total"] <= out["board_ram"] and c["verified_steps"] > 0
                               and 100 * (float(np.mean(ref)) - c["test_accuracy"]) <= TARGET_POINTS
                               and all(p["verified_steps"] > 0 for p in fr) and v["mismatches"] == 0),
               machine=report.machine())
    report.write_json(f"pareto_{workload}.json", out)
    return out


def section(workload: str, r: dict) -> str:
    c = r["points"][r["chosen"]]
    rows = []
    for p in r["points"]:
        if not p["frontier"] and p["id"] != r["chosen"]:
            continue
        rows.append([p["id"], f"{p['width']:g}", p["policy"], f"{p['sparsity']:g}", p["train"],
                     f"{100 * p['val_accuracy']:.2f}", f"{100 * p['test_accuracy']:.2f}", p["training_ram"],
                     p["ram_total"], p["flash_total"], f"{p['instructions_per_sample']:.0f}", p["verified_steps"],
                     ("chosen" if p["id"] == r["chosen"] else "")
                     + (" RAM" if p["id"] in r["frontier_training_ram"] else "")
                     + (" instr" if p["id"] in r["frontier_instructions"] else "")])
    fits = sum(p["fits"] for p in r["points"])
    wt, wd = r["work"]["training"], r["work"]["device"]
    ref = ", ".join(f"{100 * a:.2f}" for a in r["unconstrained_test_accuracy"])
    return "\n".join([
        f"## Pareto frontier: {workload} {r['model']} on the micro:bit ({r['board_ram']} B RAM)",
        "",
        f"`python bench/bench_pareto.py --workload {workload}`: {len(r['points'])} points (widths "
        f"{', '.join(f'{v:g}' for v in r['grid']['widths'])}; policies {', '.join(r['grid']['policies'])}; sparsity "
        f"{', '.join(f'{v:g}' for v in r['grid']['sparsities'])}; training {', '.join(r['grid']['trains'])}), "
        f"{fits} fit the board, each of those measured from its linked firmware and verified for {r['steps']} steps "
        f"on the QEMU micro:bit (instructions per sample: their mean). Chosen on validation ({r['val_samples']} "
        f"samples carved from the training set, trained on the other {r['train_samples']}); test accuracy beside it. "
        "Frontier points (RAM: accuracy vs training RAM; instr: vs instructions per sample) and the chosen one:",
        "",
        report.markdown_table(["id", "width", "policy", "sparsity", "train", "val %", "test %", "training RAM B",
                               "RAM B", "flash B", "instr/sample", "verified steps", ""], rows),
        "",
        f"Chosen: {P.label(c)}, test **{100 * c['test_accuracy']:.2f} %**, {c['ram_total']} B RAM on the board "
        f"({'fits' if c['fits'] else 'does not fit'}); unconstrained {r['model']} on the whole training set, seeds "
        f"0/1/2: {ref} % (mean {100 * r['unconstrained_mean']:.2f}); difference "
        f"**{r['chosen_minus_unconstrained_points']:+.2f} points** (target: within {TARGET_POINTS} point). The chosen "
        f"model file verified on the QEMU micro:bit as written: {r['chosen_file_verified_steps']} steps, "
        f"{r['chosen_file_mismatches']} mismatches. Target {'met' if r['target_met'] else 'NOT met'}.",
        "",
        f"Work on {wt['jobs']} processes: training, {wt['tasks']} tasks (one per width × policy × sparsity), "
        f"{wt['task_cpu_seconds']:.0f} CPU s (largest task {wt['largest_task_cpu_seconds']:.0f}), {wt['wall_seconds']:.0f} s "
        f"wall; device, {wd['tasks']} tasks (one per point: link, build, QEMU), {wd['task_cpu_seconds']:.0f} CPU s "
        f"(largest {wd['largest_task_cpu_seconds']:.0f}), {wd['wall_seconds']:.0f} s wall; the machine was shared "
        "with other jobs, so wall times are not speed figures. "
        f"Plot: bench/results/pareto_{workload}.png. Machine: {report.machine_line(r['machine'])}.",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", nargs="+", default=["w3"], choices=["w1", "w3"])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--widths", type=float, nargs="+", default=list(GRID.widths))
    args = ap.parse_args()
    grid = P.Grid(widths=tuple(args.widths))
    for w in args.workload:
        r = run(w, args.jobs, grid)
        report.update_section(f"pareto-{w}", section(w, r))
        print(section(w, r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
