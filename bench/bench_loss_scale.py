"""Loss scaling (issue 11): dynamic error exponents vs a global GradScaler scale vs a static one.

    .venv/bin/python bench/bench_loss_scale.py                       # W1 and W3, seeds 0/1/2
    .venv/bin/python bench/bench_loss_scale.py --workloads w1 --seeds 0 --steps 50

For each workload and each loss_scale setting (graph/loss_scale.py) the workload's integer
model is trained by the numba simulator with its recipe (tinytrain.lab.workloads: its epochs,
learning rate, batch 1, sample orders) for every seed and evaluated on the test split: test
accuracy (mean and std), points against dynamic, the steps skipped (global) or trained on a
saturated error (static) out of all steps, and the final exponent. Then, for dynamic and for the
default global scale, the firmware is built and verified on the QEMU Cortex-M4 (mps2_an386) for
`--steps` samples, every step compared with the simulator (figures only with zero mismatches):
instructions per training sample (a mean over those steps, skipped ones included: a skipped
step runs forward and the loss only), RAM and flash from the breakdown the firmware links.
Writes bench/results/loss_scale.json and the `loss-scale` section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine, machine_line, markdown_table, update_section, write_json  # noqa: E402

from tinytrain.codegen.memory import breakdown  # noqa: E402
from tinytrain.lab.precision import integer_model, train_integer  # noqa: E402
from tinytrain.lab.workloads import WORKLOADS  # noqa: E402
from tinytrain.verify import verify  # noqa: E402

SCALES = ["dynamic", "global", "global:init_scale=7,growth_interval=50", "global:init_scale=7,growth_interval=2000",
          "global:init_scale=10,growth_interval=200", "static:init_scale=6", "static:init_scale=7"]
ON_DEVICE = ["dynamic", "global"]
BOARD = "mps2_an386"


def _over(scale):
    return {} if scale == "dynamic" else {"precision": {"loss_scale": scale}}


def train(wl, ds, seed, scale) -> dict:
    r = train_integer(wl, ds, seed, _over(scale))
    sc = r["scaler"] or [None, 0, 0]
    return {"accuracy": r["accuracy"], "steps": r["steps"], "overflow_steps": sc[2], "final_exponent": sc[0]}


def measure(workload, scale, seeds, steps) -> dict:
    wl = WORKLOADS[workload]
    ds = wl.load()
    runs = [train(wl, ds, s, scale) for s in seeds]
    acc = 100 * np.array([r["accuracy"] for r in runs])
    row = {"loss_scale": scale, "accuracies": acc.tolist(), "accuracy_mean": float(acc.mean()),
           "accuracy_std": float(acc.std(ddof=1)) if len(acc) > 1 else 0.0,
           "overflow_steps": [r["overflow_steps"] for r in runs], "steps_per_run": runs[0]["steps"],
           "final_exponents": [r["final_exponent"] for r in runs],
           "overflow_means": {"global": "skipped", "static": "saturated"}.get(scale.split(":")[0], "-")}
    if scale in ON_DEVICE and steps:
        m = integer_model(wl, ds, 0, _over(scale))
        bd = breakdown(m, BOARD)
        res = verify(m, ds, steps, board=BOARD, json=True)
        if res["mismatches"]:
            raise SystemExit(f"{workload} {scale} on {BOARD}: {res['mismatches']} mismatches: {res['first_mismatch']}")
        row["device"] = {"board": BOARD, "steps": steps, "instructions_per_sample": res["instructions_per_step"],
                         "ram_total": bd.ram_total, "flash_total": bd.flash_total,
                         "skipped_in_verified_steps": int(m.scaler[2]) if m.loss_scale.enabled else 0}
    return row


def table(rows) -> str:
    base = next(r for r in rows if r["loss_scale"] == "dynamic")
    head = ["loss_scale", "accuracy % (mean ± std)", "vs dynamic", "overflow steps per run (of all)", "final E",
            f"{BOARD} instr/sample", "RAM B", "flash B"]
    out = []
    for r in rows:
        d = r.get("device")
        ov = ("-" if r["overflow_means"] == "-" else
              f"{', '.join(str(v) for v in r['overflow_steps'])} of {r['steps_per_run']:,} {r['overflow_means']}")
        fe = ", ".join("-" if e is None else str(e) for e in r["final_exponents"])
        out.append([f"`{r['loss_scale']}`", f"{r['accuracy_mean']:.2f} ± {r['accuracy_std']:.2f}",
                    f"{r['accuracy_mean'] - base['accuracy_mean']:+.2f}", ov, fe,
                    f"{d['instructions_per_sample']:,.0f} ({d['skipped_in_verified_steps']} of {d['steps']} skipped)"
                    if d else "-", f"{d['ram_total']:,}" if d else "-", f"{d['flash_total']:,}" if d else "-"])
    return markdown_table(head, out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", default="w1,w3")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=200, help="verified QEMU steps per setting on the device")
    ap.add_argument("--scales", default=";".join(SCALES), help="loss_scale settings separated by ';'")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    t0 = time.time()
    res = {"seeds": seeds, "steps": a.steps, "workloads": {}, "machine": machine()}
    body = ["## Loss scaling: dynamic vs global (GradScaler) vs static (issue 11)", "",
            f"`python bench/bench_loss_scale.py` (seeds {a.seeds}; {a.steps} verified QEMU steps per device row, zero "
            "mismatches): test accuracy of the numba training with each workload's recipe under each `loss_scale` "
            "(docs/precision.md); overflow steps are the steps a global scale skipped, or a static one trained on a "
            "saturated error, per seed; final E is the scale's exponent at the end per seed. Instructions per "
            f"training sample on QEMU {BOARD} (Cortex-M4, `-icount`) are the mean over the verified steps from the "
            "initial state, skipped ones included. RAM/flash: the linked firmware's breakdown.", ""]
    for w in a.workloads.split(","):
        rows = []
        for s in a.scales.split(";"):
            rows.append(measure(w, s, seeds, a.steps))
            print(f"{w} {s}: {rows[-1]['accuracy_mean']:.2f} % overflow {rows[-1]['overflow_steps']}", flush=True)
        res["workloads"][w] = rows
        body += [f"### {w.upper()} ({WORKLOADS[w].title})", "", table(rows), ""]
    res["seconds"] = time.time() - t0
    write_json("loss_scale.json", res)
    body.append(f"Machine: {machine_line(res['machine'])}; {res['seconds']:.0f} s.")
    print("\n".join(body))
    update_section("loss-scale", "\n".join(body))


if __name__ == "__main__":
    main()
