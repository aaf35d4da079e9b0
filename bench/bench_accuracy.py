"""Test accuracy of tinytrain integer training next to its float32 PyTorch twin.

    .venv/bin/python bench/bench_accuracy.py [--workload w1|w2|w3|all] [--seeds 0 1 2]

For each seed: the integer model trained by the numba Simulator (bit-exact with the numpy
reference) and the float twin (float_twins.py), same init draws (checked: every twin weight
within half an int16 LSB of tinytrain's), same per-epoch orders, same lr/schedule/batch/epochs;
test accuracy of each.  Prints mean +- sample std (ddof=1) over seeds and the difference of the
means, against the workload's goals (workloads.py: W1 within 1.0 point of the twin, W3 within
1.5, W2 at least 90 %).  Writes bench/results/accuracy_<workload>.json and the BENCHMARKS.md
section accuracy-<workload>.
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
from tinytrain.lab import twins as float_twins  # noqa: E402
import report  # noqa: E402
from tinytrain.lab.workloads import SEEDS, WORKLOADS, epoch_orders  # noqa: E402

from tinytrain.sim.simulator import Simulator  # noqa: E402

def run_tinytrain(wl, ds, seed: int) -> tuple[float, list[int]]:
    """Test accuracy, and the simulator's saturation counts after training
    [activations/errors, weight updates] (how often int8/int16 ranges clipped)."""
    sim = Simulator(wl.model(ds, seed))
    for order in epoch_orders(seed, len(ds.x_train), wl.epochs):
        sim.train(ds.x_train, ds.y_train, order)
    sat = [int(v) for v in sim.model.stats[:2]]
    return float((sim.predict(ds.x_test) == ds.y_test).mean()), sat


def run_twin(wl, ds, seed: int) -> float:
    torch.manual_seed(seed)  # nothing random is drawn from torch; set for any future twin
    net = float_twins.twin(wl.name, seed)
    lsb = float_twins.init_weights_match(net, wl.model(ds, seed))
    if lsb > 0.5 + 1e-3:
        raise AssertionError(f"{wl.name} seed {seed}: twin init differs from tinytrain's by {lsb:.3f} LSB")
    xtr, xte = wl.float_inputs(ds)
    float_twins.train(net, xtr, ds.y_train, epoch_orders(seed, len(xtr), wl.epochs), wl.lr,
                      schedule=wl.schedule, total_steps=wl.total_steps(len(xtr)))
    return float_twins.accuracy(net, xte, ds.y_test)


def _stats(v: list[float]) -> tuple[float, float]:
    a = 100.0 * np.asarray(v)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def _goals(wl, m_tt: float, diff: float) -> tuple[list[str], bool]:
    """Human-readable goal verdicts and whether all are met."""
    out, ok = [], True
    if wl.goal_diff_points is not None:
        hit = abs(diff) <= wl.goal_diff_points
        ok &= hit
        out.append(f"|tinytrain − float32| ≤ {wl.goal_diff_points:.1f} points: {'met' if hit else 'MISSED'}")
    if wl.goal_min_pct is not None:
        hit = m_tt >= wl.goal_min_pct
        ok &= hit
        out.append(f"tinytrain ≥ {wl.goal_min_pct:.0f} %: {'met' if hit else 'MISSED'}")
    return out, ok


def run_workload(wl, seeds: list[int]) -> dict:
    ds = wl.load()
    sched = "" if wl.schedule == "constant" else f" ({wl.schedule} over the run)"
    setup = (f"{len(ds.x_train)} train / {len(ds.x_test)} test, {wl.epochs} epochs, batch 1, "
             f"SGD lr {wl.lr}{sched}")
    print(f"{wl.name} {wl.title}: {setup}, seeds {seeds}")
    t0 = time.perf_counter()
    rows = []
    for seed in seeds:
        (acc_tt, sat), acc_fl = run_tinytrain(wl, ds, seed), run_twin(wl, ds, seed)
        rows.append({"seed": seed, "tinytrain": acc_tt, "torch_float32": acc_fl,
                     "tinytrain_saturations": {"activations_errors": sat[0], "weight_updates": sat[1]}})
        print(f"  seed {seed}: tinytrain {100 * acc_tt:6.2f}%   float32 torch {100 * acc_fl:6.2f}%   "
              f"(saturations: act/err {sat[0]}, weights {sat[1]})")
    m_tt, s_tt = _stats([r["tinytrain"] for r in rows])
    m_fl, s_fl = _stats([r["torch_float32"] for r in rows])
    diff = m_tt - m_fl
    verdicts, ok = _goals(wl, m_tt, diff)
    secs = time.perf_counter() - t0
    print(f"tinytrain (int8/int16, numba Simulator): {m_tt:.2f} +- {s_tt:.2f} %")
    print(f"float32 PyTorch twin:                    {m_fl:.2f} +- {s_fl:.2f} %")
    print(f"difference tinytrain - float32: {diff:+.2f} points; goals: {'; '.join(verdicts)}  [{secs:.1f} s]")

    payload = {"workload": wl.name, "title": wl.title, "builtin": wl.builtin, "epochs": wl.epochs,
               "batch_size": 1, "lr": wl.lr, "schedule": wl.schedule,
               "seeds": seeds, "per_seed": rows,
               "tinytrain_mean_pct": m_tt, "tinytrain_std_pct": s_tt,
               "torch_float32_mean_pct": m_fl, "torch_float32_std_pct": s_fl,
               "difference_points": diff, "goal_points": wl.goal_diff_points, "goal_min_pct": wl.goal_min_pct,
               "goals": verdicts, "within_goal": ok, "seconds": round(secs, 1),
               "std": "sample std over seeds (ddof=1)", "machine": report.machine()}
    path = report.write_json(f"accuracy_{wl.name}.json", payload)
    seed_list = ", ".join(str(s) for s in seeds)
    diff_goal = f" (goal: within {wl.goal_diff_points:.1f})" if wl.goal_diff_points is not None else ""
    tt_goal = f" (goal: ≥ {wl.goal_min_pct:.0f} %)" if wl.goal_min_pct is not None else ""
    table = report.markdown_table(
        ["run", f"test accuracy, mean ± std over seeds {seed_list}", "per seed"],
        [["tinytrain integer (numba Simulator)", f"{m_tt:.2f} ± {s_tt:.2f} %{tt_goal}",
          " / ".join(f"{100 * r['tinytrain']:.2f}" for r in rows)],
         ["float32 PyTorch twin", f"{m_fl:.2f} ± {s_fl:.2f} %",
          " / ".join(f"{100 * r['torch_float32']:.2f}" for r in rows)],
         ["difference (tinytrain − float32)", f"{diff:+.2f} points{diff_goal}", ""]])
    twin_note = (f" The twin mirrors models.py's `{wl.builtin}` layer for layer (bench/README.md, "
                 "What is compared)." if wl.builtin else "")
    body = (f"## Accuracy: {wl.name.upper()} {wl.title}\n\n"
            f"`python bench/bench_accuracy.py --workload {wl.name}`: {setup}; twin and integer model "
            f"share the init draws and the per-epoch orders.{twin_note} Goals: {'; '.join(verdicts)}.\n\n"
            f"{table}\n")
    report.update_section(f"accuracy-{wl.name}", body)
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return payload


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="w1", choices=sorted(WORKLOADS) + ["all"])
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    names = sorted(WORKLOADS) if args.workload == "all" else [args.workload]
    for name in names:
        run_workload(WORKLOADS[name], args.seeds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
