"""Host training throughput of tinytrain next to PyTorch, the numpy reference and plain C, one thread.

    .venv/bin/python bench/bench_speed.py [--workload w1] [--repeats 3]

Training samples per second at batch 1 and batch 32 of:
  numba  tinytrain Simulator (the numba-compiled training loop), compile time excluded (warm-up);
  torch  the float32 PyTorch twin (tinytrain/lab/twins.py), CPU, torch.set_num_threads(1), a real batch;
  numpy  tinytrain's numpy reference path (Sequential.ref_train_step), a few hundred samples;
  C      bench/c/mlp_float.c, plain float32 C (W1 only), gcc -O2, timing itself over all epochs.
tinytrain batch 32 is SGD(batch_size=32): gradients accumulated per sample, applied per batch.
Every run trains a fresh model from the same initial state (a repeat never trains an already
trained model, which would skip more zero-error rows); the contenders are interleaved (each
repeat runs every one once) and each figure is the median over --repeats runs with its range,
next to the load average before and after.  Only ratios measured in this one run are comparable.

Threads: OMP/MKL/OPENBLAS/NUMBA_NUM_THREADS=1 are set before numpy is imported.  If
OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE are set (this machine sets them for old OpenBLAS builds;
they slow a current numpy) they are unset inside this process only, and the output says so.
"""
from __future__ import annotations

import os

UNSET_OPENBLAS = [v for v in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if v in os.environ]
for _v in UNSET_OPENBLAS:
    del os.environ[_v]
for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import argparse  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from tinytrain.lab import twins as float_twins  # noqa: E402
import report  # noqa: E402
from tinytrain.lab.workloads import WORKLOADS, epoch_orders, train_macs  # noqa: E402

from tinytrain.sim.simulator import Simulator  # noqa: E402

BATCHES = (1, 32)
SEED = 0
NUMPY_SAMPLES = 300
TORCH_EPOCHS = {1: 2, 32: 20}  # batch 1 is slow in torch: 2 epochs already is ~2900 steps
C_SOURCES = {"w1": Path(__file__).resolve().parent / "c" / "mlp_float.c"}
GOALS = {"numba/torch": (10.0, 20.0), "numba/numpy": (30.0, 30.0)}  # (goal, target)


def _result(samples: int, seconds: float) -> dict:
    return {"samples": samples, "seconds": seconds, "samples_per_s": samples / seconds}


def _summary(runs: list[dict]) -> dict:
    """Median and range over the runs (each on a fresh, untrained model)."""
    rates = sorted(r["samples_per_s"] for r in runs)
    med = float(np.median(rates))
    out = {"samples_per_s": med, "min_samples_per_s": rates[0], "max_samples_per_s": rates[-1],
           "runs_samples_per_s": [round(r["samples_per_s"], 1) for r in runs], "samples": runs[0]["samples"]}
    if "test_acc" in runs[0]:
        out["test_acc"] = runs[0]["test_acc"]
    return out


def run_numba(wl, ds, bs: int) -> dict:
    """One timed training of a fresh model (the compiled loop is shared: numba's cache)."""
    sim = Simulator(wl.model(ds, SEED, bs))
    orders = epoch_orders(SEED, len(ds.x_train), wl.epochs)
    t0 = time.perf_counter()
    for order in orders:
        sim.train(ds.x_train, ds.y_train, order)
    return _result(sum(len(o) for o in orders), time.perf_counter() - t0)


def warm_numba(wl, ds, bs: int):
    Simulator(wl.model(ds, SEED, bs)).train(ds.x_train, ds.y_train, np.arange(64))  # compile or load


def run_torch(wl, ds, bs: int) -> dict:
    xtr, _ = wl.float_inputs(ds)
    orders = epoch_orders(SEED, len(xtr), TORCH_EPOCHS[bs])
    net = float_twins.twin(wl.name, SEED)  # fresh, untrained
    t0 = time.perf_counter()
    n = float_twins.train(net, xtr, ds.y_train, orders, wl.lr, bs, schedule=wl.schedule)
    return _result(n, time.perf_counter() - t0)


def warm_torch(wl, ds, bs: int):
    xtr, _ = wl.float_inputs(ds)
    float_twins.train(float_twins.twin(wl.name, SEED), xtr, ds.y_train, [np.arange(256)], wl.lr, bs)


def run_numpy(wl, ds, bs: int) -> dict:
    m = wl.model(ds, SEED, bs)
    order = epoch_orders(SEED, len(ds.x_train), 1)[0]
    for i in order[:10]:  # warm-up: first-call imports and caches
        m.ref_train_step(ds.x_train[i], ds.y_train[i])
    sel = order[10:10 + NUMPY_SAMPLES]
    t0 = time.perf_counter()
    for i in sel:
        m.ref_train_step(ds.x_train[i], ds.y_train[i])
    return _result(len(sel), time.perf_counter() - t0)


def build_c(wl, tmp: Path) -> Path | None:
    src = C_SOURCES.get(wl.name)
    if src is None:
        return None
    exe = tmp / src.stem
    subprocess.run(["gcc", "-O2", "-std=c99", "-D_POSIX_C_SOURCE=199309L", "-o", str(exe), str(src), "-lm"],
                   check=True)
    return exe


def write_c_data(wl, ds, path: Path):
    xtr, xte = wl.float_inputs(ds)
    hdr = np.array([len(xtr), len(xte), int(np.prod(ds.input_shape)), ds.n_classes], np.int32)
    with open(path, "wb") as f:
        for a in (hdr, xtr.astype(np.float32), ds.y_train.astype(np.int32), xte.astype(np.float32),
                  ds.y_test.astype(np.int32)):
            f.write(np.ascontiguousarray(a).tobytes())


def run_c(exe: Path, data: Path, wl, bs: int) -> dict:
    """The C program trains a fresh model and times itself over all epochs."""
    out = subprocess.run([str(exe), str(data), str(wl.epochs), str(bs), repr(wl.lr), str(SEED)],
                         capture_output=True, text=True, check=True).stdout
    kv = dict(re.findall(r"(\w+)=([0-9.]+)", out))
    r = _result(int(kv["samples"]), float(kv["seconds"]))
    r["test_acc"] = float(kv["test_acc"])
    return r


def _blas() -> list[dict]:
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return []
    keep = ("user_api", "internal_api", "version", "architecture", "num_threads")
    return [{k: i.get(k) for k in keep} for i in threadpool_info()]


def _fmt_rate(r: dict | None) -> str:
    return "n/a" if r is None else f"{r['samples_per_s']:,.0f}"


def _fmt_range(r: dict | None) -> str:
    return "n/a" if r is None else f"{r['min_samples_per_s']:,.0f}–{r['max_samples_per_s']:,.0f}"


def _fmt_us(r: dict | None) -> str:
    return "n/a" if r is None else f"{1e6 / r['samples_per_s']:.2f}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="w1", choices=sorted(WORKLOADS))
    ap.add_argument("--repeats", type=int, default=7, help="interleaved rounds (default 7); the median is reported")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    wl = WORKLOADS[args.workload]
    ds = wl.load()
    mach = report.machine()
    blas = _blas()
    m0 = wl.model(ds, SEED)
    fwd, trn = m0.macs(), train_macs(m0)
    print(f"machine: {report.machine_line(mach)}")
    print(f"threads: torch {torch.get_num_threads()}, NUMBA_NUM_THREADS={os.environ['NUMBA_NUM_THREADS']}, "
          f"OMP/MKL/OPENBLAS_NUM_THREADS=1")
    print("BLAS: " + ("; ".join(f"{b['internal_api']} {b['version']} ({b['architecture']}, {b['num_threads']} thr)"
                                for b in blas) or "threadpoolctl not installed"))
    print("OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE: " + (f"were set ({', '.join(UNSET_OPENBLAS)}), unset in this "
                                                    "process only" if UNSET_OPENBLAS else "not set"))
    print(f"{wl.name} {wl.title}: MACs/sample forward {fwd:,}, training step {trn:,} "
          "(forward + weight gradients + dx of all parameterised layers but the first)")

    res: dict[str, dict[int, dict | None]] = {"numba": {}, "torch": {}, "numpy": {}, "c": {}}
    load = {"before": os.getloadavg()}
    with tempfile.TemporaryDirectory(prefix="tt-bench-") as tmp:
        exe = build_c(wl, Path(tmp))
        if exe is not None:
            write_c_data(wl, ds, Path(tmp) / "data.bin")
        contenders = {"numba": lambda bs: run_numba(wl, ds, bs), "torch": lambda bs: run_torch(wl, ds, bs),
                      "numpy": lambda bs: run_numpy(wl, ds, bs)}
        if exe is not None:
            contenders["c"] = lambda bs: run_c(exe, Path(tmp) / "data.bin", wl, bs)
        for bs in BATCHES:
            warm_numba(wl, ds, bs)
            warm_torch(wl, ds, bs)
        runs = {(k, bs): [] for k in contenders for bs in BATCHES}
        # interleaved: every repeat runs every contender once, so a burst of load from another
        # job hits them alike; each run trains a fresh model from the same initial state
        for rep in range(args.repeats):
            print(f"repeat {rep + 1}/{args.repeats}:", end="", flush=True)
            for bs in BATCHES:
                for k, fn in contenders.items():
                    print(f" {k}@{bs}", end="", flush=True)
                    runs[(k, bs)].append(fn(bs))
            print(flush=True)
        for (k, bs), rs in runs.items():
            res[k][bs] = _summary(rs)
        for k in res:
            for bs in BATCHES:
                res[k].setdefault(bs, None)
    load["after"] = os.getloadavg()

    ratios = {}
    for bs in BATCHES:
        nb = res["numba"][bs]["samples_per_s"]
        ratios[bs] = {f"numba/{k}": (nb / res[k][bs]["samples_per_s"] if res[k][bs] else None)
                      for k in ("torch", "numpy", "c")}

    names = {"numba": "tinytrain numba Simulator (int)", "torch": "PyTorch float32 CPU",
             "numpy": f"tinytrain numpy reference (int, {NUMPY_SAMPLES} samples)", "c": "plain C float32 (gcc -O2)"}
    header = ["implementation"] + [h for bs in BATCHES for h in (f"batch {bs}: samples/s (median)", "range", "µs/sample")]
    rows = [[names[k]] + [c for bs in BATCHES for c in (_fmt_rate(res[k][bs]), _fmt_range(res[k][bs]), _fmt_us(res[k][bs]))]
            for k in names]
    for key in ("numba/torch", "numba/numpy", "numba/c"):
        goal = GOALS.get(key)
        note = f" (goal ≥ {goal[0]:g}×, target {goal[1]:g}×)" if goal else ""
        rows.append([f"ratio {key}{note}"] + [c for bs in BATCHES for c in
                    ((f"{ratios[bs][key]:.2f}×" if ratios[bs][key] else "n/a"), "", "")])
    table = report.markdown_table(header, rows)
    print()
    print(table)
    for key, (goal, target) in GOALS.items():
        for bs in BATCHES:
            r = ratios[bs][key]
            verdict = "meets target" if r >= target else "meets goal" if r >= goal else "BELOW GOAL"
            print(f"batch {bs}: {key} = {r:.1f}x ({verdict}: goal {goal:g}x, target {target:g}x)")
    if res["c"][1]:
        print(f"(C float32 twin test accuracy after {wl.epochs} epochs, batch 1: {100 * res['c'][1]['test_acc']:.2f}%)")

    payload = {"workload": wl.name, "title": wl.title, "seed": SEED, "repeats": args.repeats,
               "macs_per_sample": {"forward": fwd, "training_step": trn},
               "results": {k: {str(bs): v for bs, v in d.items()} for k, d in res.items()},
               "ratios": {str(bs): r for bs, r in ratios.items()},
               "threads": 1, "unset_env": UNSET_OPENBLAS, "blas": blas, "machine": mach, "loadavg": load}
    path = report.write_json(f"speed_{wl.name}.json", payload)
    body = (f"## Host training speed: {wl.name.upper()} {wl.title}\n\n"
            f"`python bench/bench_speed.py --workload {wl.name}`, one thread, median (and range) of "
            f"{args.repeats} interleaved runs, each training a fresh model (numpy: {NUMPY_SAMPLES} samples "
            f"per run). Load average before/after: {load['before'][0]:.2f}/{load['after'][0]:.2f}. "
            f"Machine: {report.machine_line(mach)}. "
            f"OPENBLAS_CORETYPE/L2_SIZE: {'unset for the run' if UNSET_OPENBLAS else 'not set'}. "
            f"MACs per sample: forward {fwd:,}, training step {trn:,}. Ratios are of samples/s measured "
            f"in the same run; the machine is shared with other jobs, so absolute figures vary between "
            f"runs more than the ratios do.\n\n{table}\n")
    report.update_section(f"speed-{wl.name}", body)
    print(f"wrote {path.relative_to(report.ROOT)} and {report.BENCHMARKS_MD.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
