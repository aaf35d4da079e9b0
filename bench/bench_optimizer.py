"""Device cost of every optimizer option (QEMU instruction trace, Cortex-M4): instructions per
trained parameter per step spent in the optimizer's calls, against the goal of 15.

    .venv/bin/python bench/bench_optimizer.py                     # every option, mps2_an386
    .venv/bin/python bench/bench_optimizer.py --options momentum all --steps 10 --no-write

The model is an MLP 64-17-13-10 (ReLU, softmax cross-entropy) on the digits split, trained with
one option at a time on top of plain SGD (lr 0.05), and with momentum + weight decay + stochastic
rounding + int32 master weights together ("all", goal: <= 40,000 instructions per step). Each
firmware is built as for `tinytrain verify`, run under QEMU with an instruction trace
(bench_device_parts.trace: every instruction of train_step charged to the call in it that runs),
and verified against the simulator after every step (figures only with zero mismatches).

Reported per step (mean over the traced steps): the whole step; "optimizer": the instructions
in calls to tt_sgd_* (learning-rate schedule, per-sample accumulate, end-of-batch apply, master
refresh, direct updates; for plain SGD's fused Dense update this includes forming the gradient,
one MAC per weight), divided by the trained parameters; "update": the optimizer plus the
gradient kernels (tt_*_grad_*), per trained parameter. Writes bench/results/optimizer.json and
the `optimizer` section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_device_parts import trace  # noqa: E402
from report import machine, machine_line, markdown_table, update_section, write_json  # noqa: E402

GOAL_PER_PARAM, GOAL_ALL_STEP = 15.0, 40_000
LAYERS = [{"type": "dense", "units": 17}, {"type": "relu"}, {"type": "dense", "units": 13}, {"type": "relu"},
          {"type": "dense", "units": 10}]
#: option name -> optimizer options on top of {"lr": 0.05}
OPTIONS = {
    "plain": {},
    "momentum": {"momentum": 0.9},
    "weight_decay": {"weight_decay": 1e-3},
    "stochastic_rounding": {"stochastic_rounding": True},
    "master_weights": {"master_weights": True},
    "batch_size": {"batch_size": 4},
    "schedule_step": {"schedule": "step", "gamma": 0.5, "step_size": 4},
    "schedule_cosine": {"schedule": "cosine", "total_steps": 64},
    "partial_last1": {"train": "last:1"},
    "partial_bias": {"train": "bias"},
    "all": {"momentum": 0.9, "weight_decay": 1e-3, "stochastic_rounding": True, "master_weights": True},
}


def build(option: str, ds):
    from tinytrain.graph import models
    spec = {"name": f"mlp-17-13-{option}", "input_scale": "unit", "layers": LAYERS,
            "optimizer": dict({"lr": 0.05}, **OPTIONS[option])}
    return models.from_spec(spec, ds, where=spec["name"])


def trained_params(model) -> int:
    return sum(int(p.data.size) for li, l in enumerate(model.layers) for pi, p in enumerate(l.params)
               if model.learns(li, pi))


def measure(option: str, board: str, steps: int) -> dict:
    from tinytrain import data
    ds = data.load("digits")
    model = build(option, ds)
    t = trace(model, ds, board, steps)
    n = max(t["entries"], 1)
    opt = sum(c for s, c in t["counts"].items() if t["callees"].get(s, "").startswith("tt_sgd_")) / n
    grad = sum(c for s, c in t["counts"].items() if "_grad_" in t["callees"].get(s, "")) / n
    p = trained_params(model)
    by = {}
    for site, c in t["counts"].items():
        name = t["callees"].get(site, "") or "glue"
        by[name] = by.get(name, 0) + c / n
    return {"option": option, "optimizer": OPTIONS[option], "board": board, "cpu": t["cpu"],
            "steps": t["r"]["steps"], "mismatches": t["r"]["mismatches"], "trained_params": p,
            "instructions_per_step": round(sum(t["counts"].values()) / n),
            "optimizer_instructions_per_step": round(opt), "optimizer_per_param": round(opt / p, 2),
            "update_per_param": round((opt + grad) / p, 2),
            "per_callee": {k: round(v) for k, v in sorted(by.items(), key=lambda kv: -kv[1])}}


def goals(results) -> str:
    """The two goals, met or NOT met, from the rows measured (options left out are not judged)."""
    ok = [r for r in results if r["mismatches"] == 0 and r["option"] != "all"]
    out = []
    if ok:
        worst = max(ok, key=lambda r: r["optimizer_per_param"])
        met = worst["optimizer_per_param"] <= GOAL_PER_PARAM and len(ok) == len([r for r in results if r["option"] != "all"])
        out.append(f"Single options <= {GOAL_PER_PARAM:.0f} instructions per parameter: {'met' if met else 'NOT met'} "
                   f"(highest: {worst['option']}, {worst['optimizer_per_param']:.1f}).")
    for r in results:
        if r["option"] == "all":
            if r["mismatches"]:
                out.append(f"\"all\" <= {GOAL_ALL_STEP:,} instructions per step: NOT measured ({r['mismatches']} mismatches).")
            else:
                met = r["instructions_per_step"] <= GOAL_ALL_STEP
                out.append(f"\"all\" <= {GOAL_ALL_STEP:,} instructions per step: {'met' if met else 'NOT met'} "
                           f"({r['instructions_per_step']:,}, {r['instructions_per_step'] / GOAL_ALL_STEP:.2f}× the goal).")
    return " ".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--options", nargs="+", default=list(OPTIONS), choices=list(OPTIONS))
    ap.add_argument("--board", default="mps2_an386")
    ap.add_argument("--steps", type=int, default=16, help="verified steps traced per option (default 16)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    results, rows = [], []
    for o in a.options:
        r = measure(o, a.board, a.steps)
        results.append(r)
        ok = r["mismatches"] == 0
        goal = f"{r['optimizer_per_param'] / GOAL_PER_PARAM:.2f}×" if ok else "—"
        step = f"{r['instructions_per_step']:,}" if ok else f"{r['mismatches']} mismatches"
        if o == "all" and ok:
            step += f" ({r['instructions_per_step'] / GOAL_ALL_STEP:.2f}× the {GOAL_ALL_STEP:,} goal)"
        rows.append([o, ", ".join(f"{k}={v}" for k, v in r["optimizer"].items()) or "lr=0.05", step,
                     f"{r['optimizer_per_param']:.1f}" if ok else "—", goal,
                     f"{r['update_per_param']:.1f}" if ok else "—"])
        print(" | ".join(map(str, rows[-1])), "\n   ", r["per_callee"], flush=True)
    t = markdown_table(["option", "optimizer (on lr=0.05)", "instructions / step", "optimizer / param",
                        f"× goal {GOAL_PER_PARAM:.0f}", "gradient + optimizer / param"], rows)
    print(t)
    verdict = goals(results)
    print(verdict)
    if a.no_write:
        return 0
    mach = machine()
    write_json("optimizer.json", {"benchmark": "optimizer", "command": "python bench/bench_optimizer.py " +
                                  " ".join(argv or sys.argv[1:]), "machine": mach, "results": results,
                                  "seconds": round(time.monotonic() - t0, 1)})
    body = ("## Optimizer options on the device (QEMU instruction trace)\n\n"
            f"`python bench/bench_optimizer.py`: MLP 64-17-13-10 on digits, {a.steps} verified steps per option on "
            f"{a.board}; \"optimizer / param\" counts the instructions in tt_sgd_* calls (schedule, accumulate, apply, "
            "master refresh, direct update; plain SGD's fused Dense update includes forming its gradient) per trained "
            f"parameter and step, goal {GOAL_PER_PARAM:.0f}; \"all\" is momentum + weight decay + stochastic rounding + "
            f"int32 masters (goal {GOAL_ALL_STEP:,} instructions per step). Host: " + machine_line(mach) + ".\n\n" + t + "\n\n" +
            verdict + "\n")
    update_section("optimizer", body)
    print(f"wrote bench/results/optimizer.json and BENCHMARKS.md (optimizer) in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
