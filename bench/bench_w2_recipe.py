"""W2 (MNIST-1D) with a better model: mnist1d-cnn-pool against mnist1d-cnn (issue 11: >= 94 %).

    .venv/bin/python bench/bench_w2_recipe.py            # test accuracy, seeds 0/1/2, 40 epochs
    .venv/bin/python bench/bench_w2_recipe.py --screen   # the model choice, on a validation split

Default: each model trained as `tinytrain train --data mnist1d --model NAME --epochs 40 --seed S`
does it (train.fit: numba simulator, bit-exact with the numpy reference; weights, training PRNG
and shuffling from seed S), test accuracy after the last epoch, mean +- sample std (ddof=1) over
seeds 0, 1, 2, and the target: mnist1d-cnn-pool >= 94 %. Writes bench/results/w2_recipe.json and
the BENCHMARKS.md section w2-recipe.

--screen: how the model was chosen, without the test set. The 4000 training signals are split
3500 train / 500 validation (a fixed permutation, VAL_SEED); every candidate below trains on the
3500 and is scored on the 500 (validation accuracy after the last epoch). Writes
bench/results/w2_recipe_screen.json and prints the table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"  # the machine is shared; accuracy does not depend on threads

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

from tinytrain import data  # noqa: E402
from tinytrain.codegen.memory import memory_estimate  # noqa: E402
from tinytrain.graph.models import build_model, from_spec, model_spec  # noqa: E402
from tinytrain.train import fit  # noqa: E402

SEEDS = (0, 1, 2)
EPOCHS = 40
CHOSEN, BASELINE = "mnist1d-cnn-pool", "mnist1d-cnn"
TARGET = 94.0
VAL_SEED, N_VAL = 12345, 500


# ------------------------------------------------------------------ candidates (--screen)
def _conv(f, k, s):
    return {"type": "conv1d", "filters": f, "kernel": k, "stride": s, "padding": "same"}


def strided(f=25, ks=(5, 3, 3), strides=(2, 2, 2), bn=False, act="relu", head="flatten", hidden=0, **opt):
    """mnist1d-cnn's shape: stride-2 convolutions (optionally BatchNorm, LeakyReLU, GAP, hidden dense)."""
    layers = []
    for k, s in zip(ks, strides):
        layers += [_conv(f, k, s)] + ([{"type": "batchnorm"}] if bn else []) + [{"type": act}]
    layers.append({"type": "flatten"} if head == "flatten" else {"type": "global_avgpool"})
    layers += [{"type": "dense", "units": hidden}, {"type": "relu"}] if hidden else []
    layers.append({"type": "dense", "units": 10})
    return {"name": "candidate", "input_scale": "unit", "layers": layers,
            "optimizer": {"lr": 0.03, "schedule": "cosine", **opt}}


def pooled(f=12, ks=(5, 3, 3), **opt):
    """mnist1d-cnn-pool's shape: stride-1 convolutions, each + ReLU + MaxPool1d(2)."""
    layers = []
    for k in ks:
        layers += [_conv(f, k, 1), {"type": "relu"}, {"type": "maxpool1d", "kernel": 2}]
    return {"name": "candidate", "input_scale": "unit", "optimizer": {"lr": 0.03, "schedule": "cosine", **opt},
            "layers": layers + [{"type": "flatten"}, {"type": "dense", "units": 10}]}


#: name -> (model description, epochs, seeds): the screen as it was run (seed 0 at 20 epochs
#: first, then the few best widths at 40 epochs over seeds 0/1/2)
CANDIDATES = {
    "mnist1d-cnn (25 filters, stride 2)": (strided(), 20, (0,)),
    "strided, 32 filters": (strided(32), 20, (0,)),
    "strided, 48 filters": (strided(48), 20, (0,)),
    "strided, 64 filters": (strided(64), 20, (0,)),
    "strided + BatchNorm, 25 filters": (strided(bn=True), 20, (0,)),
    "strided + BatchNorm, 32 filters": (strided(32, bn=True), 20, (0,)),
    "strided + BatchNorm, 48 filters": (strided(48, bn=True), 20, (0,)),
    "strided + BatchNorm + GAP, 32 filters": (strided(32, bn=True, head="gap"), 20, (0,)),
    "strided, lr 0.01": (strided(lr=0.01), 20, (0,)),
    "strided, lr 0.05": (strided(lr=0.05), 20, (0,)),
    "strided, lr 0.003 momentum 0.9": (strided(lr=0.003, momentum=0.9), 20, (0,)),
    "strided, lr 0.015 momentum 0.5": (strided(lr=0.015, momentum=0.5), 20, (0,)),
    "strided, kernels 5/5/5": (strided(ks=(5, 5, 5)), 20, (0,)),
    "strided, kernels 7/5/5": (strided(ks=(7, 5, 5)), 20, (0,)),
    "strided, weight decay 1e-4": (strided(weight_decay=1e-4), 20, (0,)),
    "strided, LeakyReLU": (strided(act="leaky_relu"), 20, (0,)),
    "strided, 48 filters, GAP": (strided(48, head="gap"), 20, (0,)),
    "strided, 64 filters, GAP": (strided(64, head="gap"), 20, (0,)),
    "strided, 64 filters, lr 0.02": (strided(64, lr=0.02), 20, (0,)),
    "strided, 64 filters, lr 0.05": (strided(64, lr=0.05), 20, (0,)),
    "strided, 64 filters, kernels 5/5/3": (strided(64, ks=(5, 5, 3)), 20, (0,)),
    "strided, 64 filters, weight decay 5e-4": (strided(64, weight_decay=5e-4), 20, (0,)),
    "strided, 48 filters, hidden Dense(32)": (strided(48, hidden=32), 20, (0,)),
    "4 convs (stride 1,2,2,2), 32 filters": (strided(32, ks=(5, 3, 3, 3), strides=(1, 2, 2, 2)), 20, (0,)),
    "4 convs (stride 1,2,2,2), 48 filters": (strided(48, ks=(5, 3, 3, 3), strides=(1, 2, 2, 2)), 20, (0,)),
    "pooled, 48 filters": (pooled(48), 20, (0,)),
    "pooled, 32 filters": (pooled(32), 20, (0,)),
    "pooled, 25 filters": (pooled(25), 20, (0,)),
    "pooled, 20 filters": (pooled(20), 20, (0,)),
    "pooled, 16 filters": (pooled(16), 20, (0, 1, 2)),
    "pooled, 16 filters, kernels 5/5/3": (pooled(16, ks=(5, 5, 3)), 20, (0,)),
    "pooled, 16 filters, lr 0.05": (pooled(16, lr=0.05), 20, (0,)),
    "pooled, 12 filters": (pooled(12), 20, (0, 1, 2)),
    "pooled, 10 filters": (pooled(10), 20, (0,)),
    "pooled, 8 filters": (pooled(8), 20, (0,)),
    "mnist1d-cnn, 40 epochs": (strided(), 40, (0,)),
    "pooled, 25 filters, 40 epochs": (pooled(25), 40, (0,)),
    "pooled, 16 filters, 40 epochs": (pooled(16), 40, (0, 1, 2)),
    "pooled, 12 filters, 40 epochs (= mnist1d-cnn-pool)": (pooled(12), 40, (0, 1, 2)),
    "pooled, 10 filters, 40 epochs": (pooled(10), 40, (0, 1, 2)),
}


def validation_split(ds):
    """3500 train / 500 validation of the training set, as a Dataset whose 'test' split is the
    validation samples (so fit's per-epoch test accuracy is the validation accuracy)."""
    perm = np.random.RandomState(VAL_SEED).permutation(len(ds.x_train))
    tr, va = perm[:-N_VAL], perm[-N_VAL:]
    return dataclasses.replace(ds, name=ds.name + "-val", x_train=ds.x_train[tr], y_train=ds.y_train[tr],
                               float_x_train=ds.float_x_train[tr], x_test=ds.x_train[va],
                               y_test=ds.y_train[va], float_x_test=ds.float_x_train[va])


def _mean_std(accs):
    a = np.array(accs)
    return float(a.mean()), float(a.std(ddof=1)) if len(a) > 1 else 0.0


def screen(names=None) -> dict:
    ds = validation_split(data.load("mnist1d"))
    rows = []
    for name, (spec, epochs, seeds) in CANDIDATES.items():
        if names and not any(n in name for n in names):
            continue
        accs = []
        for s in seeds:
            m = from_spec(spec, ds, seed=s)
            accs.append(100 * fit(m, ds, epochs, seed=s, progress=False).epochs[-1]["test_accuracy"])
        mean, std = _mean_std(accs)
        rows.append({"candidate": name, "epochs": epochs, "seeds": list(seeds), "val_accuracies": accs,
                     "val_mean": mean, "val_std": std, "params": m.param_count(),
                     "ram_total": memory_estimate(m)["ram_total"], "spec": spec})
        print(f"{name:52s} {epochs:3d} ep  seeds {','.join(map(str, seeds)):6s} val {mean:6.2f} %  "
              f"({' / '.join(f'{a:.1f}' for a in accs)})  {rows[-1]['params']} params", flush=True)
    return {"split": f"3500 train / {N_VAL} validation of the training set (RandomState({VAL_SEED}))",
            "rows": rows}


# ------------------------------------------------------------------ test figures (default)
def run_model(name, ds, seeds, epochs) -> dict:
    accs, sats = [], []
    for s in seeds:
        m = build_model(name, ds, seed=s)
        h = fit(m, ds, epochs, seed=s, progress=False)
        accs.append(100 * h.epochs[-1]["test_accuracy"])
        sats.append([sum(e["act_saturations"] for e in h.epochs), sum(e["weight_saturations"] for e in h.epochs)])
        print(f"  {name} seed {s}: {accs[-1]:.2f} %  (state hash {m.state_hash():08x})", flush=True)
    mean, std = _mean_std(accs)
    mem = memory_estimate(m)
    return {"model": name, "epochs": epochs, "seeds": list(seeds), "accuracies": accs, "mean": mean, "std": std,
            "params": m.param_count(), "macs_forward": m.macs(), "ram_total": mem["ram_total"], "memory": mem,
            "saturations": sats, "spec": model_spec(name, ds)}


def verdict(mean: float) -> str:
    return f"≥ {TARGET:g} %: {'met' if mean >= TARGET else 'NOT met'}"


def write_section(res):
    ch, base = res["chosen"], res["baseline"]
    per = lambda r: " / ".join(f"{a:.2f}" for a in r["accuracies"])  # noqa: E731
    body = ["## W2 recipe: mnist1d-cnn-pool (issue 11)", "",
            f"`python bench/bench_w2_recipe.py`: each model trained as `tinytrain train --data mnist1d --model NAME "
            f"--epochs {ch['epochs']} --seed S` (numba simulator; integer SGD lr 0.03, cosine over the run, batch 1), "
            "test accuracy after the last epoch over seeds 0, 1, 2 (mean ± sample std). The model was chosen on a "
            "3500/500 validation split of the training set (`--screen`), never on the test set. Training RAM: "
            "`tinytrain info`'s total for the default board (parameters, optimizer state, activations and errors, "
            "scratch incl. gradients, protocol buffers, the 3.2 KB load shadow, stack estimate).",
            "",
            report.markdown_table(
                ["model", "test accuracy", "per seed", "params", "training RAM"],
                [[r["model"], f"{r['mean']:.2f} ± {r['std']:.2f} %", per(r), f"{r['params']:,}",
                  f"{r['ram_total']:,} B"] for r in (ch, base)]),
            "",
            f"Target (mnist1d-cnn-pool {verdict(ch['mean'])}): {ch['mean']:.2f} %; "
            f"{ch['mean'] - base['mean']:+.2f} points over mnist1d-cnn with {ch['params'] / base['params']:.2f}× its "
            f"parameters and {ch['ram_total'] / base['ram_total']:.2f}× its training RAM (worst seed "
            f"{min(ch['accuracies']):.2f} %; one test sample of 1000 is 0.1 point). The W2 accuracy section "
            "above trains mnist1d-cnn with the workload's own shuffle stream (92.93 %); the same model here, "
            "with `tinytrain train`'s, is the baseline row."]
    scr = report.RESULTS / "w2_recipe_screen.json"
    if scr.exists():
        rows = json.loads(scr.read_text())["rows"]
        body += ["", "The screen (`python bench/bench_w2_recipe.py --screen`: trained on 3500 of the training signals, "
                 "accuracy on the other 500 after the last epoch; seed 0 at 20 epochs first, then the smallest "
                 "pooled widths at 40 epochs over seeds 0/1/2; the smallest width above 94 % there was chosen):", "",
                 report.markdown_table(["candidate", "epochs", "seeds", "validation accuracy", "params"],
                                       [[r["candidate"], r["epochs"], ",".join(map(str, r["seeds"])),
                                         f"{r['val_mean']:.1f} %" + (f" ({' / '.join(f'{a:.1f}' for a in r['val_accuracies'])})"
                                                                     if len(r["seeds"]) > 1 else ""),
                                         f"{r['params']:,}"] for r in rows])]
    body += ["", f"Machine: {report.machine_line(report.machine())}."]
    report.update_section("w2-recipe", "\n".join(body))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--screen", action="store_true", help="the validation-split screen instead of the test figures")
    ap.add_argument("--only", nargs="*", help="--screen: candidates whose name contains one of these")
    ap.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    ap.add_argument("--epochs", type=int, default=EPOCHS)
    a = ap.parse_args(argv)
    if a.screen:
        res = screen(a.only)
        report.write_json("w2_recipe_screen.json", res)
        res_path = report.RESULTS / "w2_recipe.json"
        if res_path.exists():  # refresh the BENCHMARKS.md section with the screen table
            write_section(json.loads(res_path.read_text()))
        return 0
    ds = data.load("mnist1d")
    ch = run_model(CHOSEN, ds, a.seeds, a.epochs)
    base = run_model(BASELINE, ds, a.seeds, a.epochs)
    res = {"chosen": ch, "baseline": base, "target_pct": TARGET, "met": ch["mean"] >= TARGET,
           "command": "python bench/bench_w2_recipe.py", "machine": report.machine()}
    for r in (ch, base):
        print(f"{r['model']}: {r['mean']:.2f} +- {r['std']:.2f} % ({' / '.join(f'{x:.2f}' for x in r['accuracies'])}), "
              f"{r['params']} params, training RAM {r['ram_total']} B")
    print(f"target mnist1d-cnn-pool {verdict(ch['mean'])}")
    report.write_json("w2_recipe.json", res)
    if a.seeds == list(SEEDS) and a.epochs == EPOCHS:
        write_section(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
