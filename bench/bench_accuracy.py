"""Test accuracy of tinytrain integer training next to its float32 PyTorch twin.

    .venv/bin/python bench/bench_accuracy.py [--workload w1] [--seeds 0 1 2]

For each seed: the integer model trained by the numba Simulator (bit-exact with the numpy
reference) and the float twin (float_twins.py), same init draws, same per-epoch orders, same
lr/batch/epochs; test accuracy of each.  Prints mean +- sample std (ddof=1) over seeds and the
difference of the means (goal: |tinytrain - float| <= 1.0 point).  Writes
bench/results/accuracy_<workload>.json and the BENCHMARKS.md section accuracy-<workload>.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"  # the machine is shared; accuracy does not depend on threads

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import float_twins  # noqa: E402
import report  # noqa: E402
from workloads import SEEDS, WORKLOADS, epoch_orders  # noqa: E402

from tinytrain.sim import Simulator  # noqa: E402

GOAL_POINTS = 1.0


def run_tinytrain(wl, ds, seed: int) -> float:
    sim = Simulator(wl.model(ds, seed))
    for order in epoch_orders(seed, len(ds.x_train), wl.epochs):
        sim.train(ds.x_train, ds.y_train, order)
    return float((sim.predict(ds.x_test) == ds.y_test).mean())


def run_twin(wl, ds, seed: int) -> float:
    torch.manual_seed(seed)  # nothing random is drawn from torch; set for any future twin
    net = float_twins.twin(wl.name, seed)
    xtr, xte = wl.float_inputs(ds)
    float_twins.train(net, xtr, ds.y_train, epoch_orders(seed, len(xtr), wl.epochs), wl.lr)
    return float_twins.accuracy(net, xte, ds.y_test)


def _stats(v: list[float]) -> tuple[float, float]:
    a = 100.0 * np.asarray(v)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="w1", choices=sorted(WORKLOADS))
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    wl = WORKLOADS[args.workload]
    ds = wl.load()
    print(f"{wl.name} {wl.title}: {len(ds.x_train)} train / {len(ds.x_test)} test, {wl.epochs} epochs, "
          f"batch 1, SGD lr {wl.lr}, seeds {args.seeds}")
    t0 = time.perf_counter()
    rows = []
    for seed in args.seeds:
        acc_tt, acc_fl = run_tinytrain(wl, ds, seed), run_twin(wl, ds, seed)
        rows.append({"seed": seed, "tinytrain": acc_tt, "torch_float32": acc_fl})
        print(f"  seed {seed}: tinytrain {100 * acc_tt:6.2f}%   float32 torch {100 * acc_fl:6.2f}%")
    m_tt, s_tt = _stats([r["tinytrain"] for r in rows])
    m_fl, s_fl = _stats([r["torch_float32"] for r in rows])
    diff = m_tt - m_fl
    ok = abs(diff) <= GOAL_POINTS
    print(f"tinytrain (int8/int16, numba Simulator): {m_tt:.2f} +- {s_tt:.2f} %")
    print(f"float32 PyTorch twin:                    {m_fl:.2f} +- {s_fl:.2f} %")
    print(f"difference tinytrain - float32: {diff:+.2f} points "
          f"({'within' if ok else 'OUTSIDE'} the {GOAL_POINTS:.1f}-point goal)  [{time.perf_counter() - t0:.1f} s]")

    mach = report.machine()
    payload = {"workload": wl.name, "title": wl.title, "epochs": wl.epochs, "batch_size": 1, "lr": wl.lr,
               "seeds": args.seeds, "per_seed": rows,
               "tinytrain_mean_pct": m_tt, "tinytrain_std_pct": s_tt,
               "torch_float32_mean_pct": m_fl, "torch_float32_std_pct": s_fl,
               "difference_points": diff, "goal_points": GOAL_POINTS, "within_goal": ok,
               "std": "sample std over seeds (ddof=1)", "machine": mach}
    path = report.write_json(f"accuracy_{wl.name}.json", payload)
    seeds = ", ".join(str(s) for s in args.seeds)
    table = report.markdown_table(
        ["run", f"test accuracy, mean ± std over seeds {seeds}", "per seed"],
        [["tinytrain integer (numba Simulator)", f"{m_tt:.2f} ± {s_tt:.2f} %",
          " / ".join(f"{100 * r['tinytrain']:.2f}" for r in rows)],
         ["float32 PyTorch twin", f"{m_fl:.2f} ± {s_fl:.2f} %",
          " / ".join(f"{100 * r['torch_float32']:.2f}" for r in rows)],
         ["difference (tinytrain − float32)", f"{diff:+.2f} points (goal: within {GOAL_POINTS:.1f})", ""]])
    body = (f"## Accuracy: {wl.name.upper()} {wl.title}\n\n"
            f"`python bench/bench_accuracy.py --workload {wl.name}`: {len(ds.x_train)} train / "
            f"{len(ds.x_test)} test, {wl.epochs} epochs, batch 1, SGD lr {wl.lr}; twin and integer model "
            f"share the init draws and the per-epoch orders.\n\n{table}\n")
    report.update_section(f"accuracy-{wl.name}", body)
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
