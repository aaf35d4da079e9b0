"""W1 (and W3): a fixed multi-stage compression schedule next to the accuracy-aware controller.

    .venv/bin/python bench/bench_compress.py [--workload w1|w3|all] [--seeds 0 1 2] [--boards mps2_an386 microbit] [--steps 20]

Both are run as `tinytrain compress` runs them (tinytrain.compress.compress), one output folder
per schedule and seed under a temporary directory:

* W1 fixed: examples/compress-w1.toml (train 10 epochs; polynomial pruning to 80 % over 6 of 8
  epochs; fine-tune 2 epochs at lr 0.02; int8 weights without a master (stochastic rounding), 3 epochs);
* W1 adaptive: examples/compress-w1-adaptive.toml (train 10 epochs; then the controller with
  NNCF's defaults, the precision ladder ["int8"] first, then the sparsity search);
* W3 fixed / adaptive: examples/compress-w3.toml (train 12; prune to 50 %; fine-tune; int8 with an
  int16 master) and examples/compress-w3-adaptive.toml (train 12; the controller, ladder
  ["int8-master16"]).

Per schedule: the final sparsity and precision, validation (144 samples held out of the
training set) and test accuracy per seed, mean ± sample std (ddof=1), the epochs spent; for
seed 0's final model on each board, linked RAM and flash and the QEMU instructions per training
sample over `--steps` verified steps (tinytrain.cost.device_cost), beside the dense model after
the first stage. Writes bench/results/compress_W.json and the BENCHMARKS.md section
compress-W (W = w1, w3). No timing (the machine is shared).
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402
from tinytrain.compress import compress, from_file  # noqa: E402
from tinytrain.compress.pipeline import device, load_inputs  # noqa: E402
from tinytrain.graph import io as tio  # noqa: E402

EX = report.ROOT / "examples"
SCHEDULES = {"w1": {"fixed": EX / "compress-w1.toml", "adaptive": EX / "compress-w1-adaptive.toml"},
             "w3": {"fixed": EX / "compress-w3.toml", "adaptive": EX / "compress-w3-adaptive.toml"}}
TITLES = {"w1": "W1 digits-mlp", "w3": "W3 digits-cnn"}


def _stats(v):
    a = 100.0 * np.asarray(v)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--boards", nargs="*", default=["mps2_an386", "microbit"])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--workload", choices=("w1", "w3", "all"), default="w1")
    args = ap.parse_args(argv)
    for w in (("w1", "w3") if args.workload == "all" else (args.workload,)):
        bench(w, args)
    return 0


def bench(w: str, args) -> None:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-compress-") as tmp:
        for label, path in SCHEDULES[w].items():
            runs = []
            for seed in args.seeds:
                s = from_file(path)
                s.seed = seed
                r = compress(s, Path(tmp) / f"{w}-{label}-{seed}")
                runs.append(r)
                last = r["stages"][-1]
                print(f"{w} {label:8s} seed {seed}: sparsity {last['sparsity']:.3f}, {last['precision']}, validation "
                      f"{100 * last['validation_accuracy']:.2f} %, test {100 * last['test_accuracy']:.2f} %", flush=True)
            lasts = [r["stages"][-1] for r in runs]
            dense = [r["stages"][1] for r in runs]
            row = {"schedule": label, "file": str(path.relative_to(report.ROOT)), "seeds": args.seeds,
                   "sparsity": [x["sparsity"] for x in lasts], "precision": [x["precision"] for x in lasts],
                   "validation": [x["validation_accuracy"] for x in lasts], "test": [x["test_accuracy"] for x in lasts],
                   "dense_test": [x["test_accuracy"] for x in dense],
                   "epochs": [sum(st["epochs"] for st in r["stages"]) for r in runs],
                   "adaptive": [x.get("adaptive") for x in lasts], "device": {}, "dense_device": {}}
            ds_train = load_inputs(from_file(path))[2]
            for board in args.boards:
                final, _ = tio.load(runs[0]["final"])
                first, _ = tio.load(Path(runs[0]["out"]) / runs[0]["stages"][1]["file"])
                row["device"][board] = device(final, board, ds_train, args.steps)
                row["dense_device"][board] = device(first, board, ds_train, args.steps)
                print(f"  {board}: {row['device'][board]}", flush=True)
            rows.append(row)
    payload = {"workload": w, "title": TITLES[w], "seeds": args.seeds, "boards": args.boards,
               "steps": args.steps, "runs": rows, "std": "sample std over seeds (ddof=1)", "machine": report.machine()}
    out = report.write_json(f"compress_{w}.json", payload)

    def acc(v):
        m, s = _stats(v)
        return f"{m:.2f} ± {s:.2f} % ({' / '.join(f'{100 * a:.2f}' for a in v)})"

    table = report.markdown_table(
        ["schedule", "final sparsity per seed", "precision", "validation accuracy", "test accuracy",
         "test, dense after stage 1", "epochs"],
        [[f"{r['schedule']} (`{r['file']}`)", " / ".join(f"{100 * s:.1f} %" for s in r["sparsity"]),
          " / ".join(sorted(set(r["precision"]))), acc(r["validation"]), acc(r["test"]), acc(r["dense_test"]),
          " / ".join(map(str, r["epochs"]))] for r in rows])
    dev_rows = []
    for r in rows:
        for board in args.boards:
            for what, d in (("final", r["device"][board]), ("dense, stage 1", r["dense_device"][board])):
                ins = d["instructions_per_sample"]
                dev_rows.append([r["schedule"], what, board, f"{d['training_ram']:,}", f"{d['ram_total']:,}",
                                 f"{d['flash_total']:,}" if d["flash_total"] is not None else "unknown",
                                 "—" if ins is None else f"{ins:,.0f}", "yes" if d["fits"] else f"no: {d['why']}"])
    dev = report.markdown_table(["schedule", "model (seed 0)", "board", "training RAM B", "RAM total B", "flash B",
                                 f"instructions/sample ({args.steps} verified steps)", "fits"], dev_rows)
    body = (f"## Compression pipelines: {TITLES[w]}, a fixed schedule vs the accuracy-aware controller\n\n"
            "`python bench/bench_compress.py`: each schedule run by `tinytrain compress` for seeds "
            f"{', '.join(map(str, args.seeds))} (validation: 144 training samples held out; test: the 360 test "
            f"samples, never used for a decision). {DESCRIPTION[w]} The controller: NNCF's accuracy-aware defaults "
            "(1 % relative validation drop, 5 initial epochs, patience 3, step 0.1 halved down to 0.025), the "
            "precision ladder before the sparsity search, braked by saturation/underflow counters.\n\n"
            f"{table}\n\nOn the boards (seed 0's models; RAM and flash from the linked firmware, instructions from "
            "QEMU, every step verified bit-exact against the simulator). Storage stays dense (sparse storage is "
            "another part of issue 12), so sparsity adds its masks rather than saving memory:\n\n"
            f"{dev}\n")
    report.update_section(f"compress-{w}", body)
    print(f"wrote {out.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")


DESCRIPTION = {
    "w1": "Fixed: train 10 epochs, polynomial pruning to 80 %, fine-tune, int8 weights without a master "
          "(stochastic rounding). Adaptive: train 10 epochs, then the controller with the ladder [\"int8\"].",
    "w3": "Fixed: train 12 epochs, polynomial pruning to 50 %, fine-tune, int8 weights with an int16 master "
          "(W3 does not train with int8 alone). Adaptive: train 12 epochs, then the controller with the ladder "
          "[\"int8-master16\"].",
}


if __name__ == "__main__":
    sys.exit(main())
