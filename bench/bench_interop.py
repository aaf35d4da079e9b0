"""Import, QAT and export accuracy figures (issue 14).

    .venv/bin/python bench/bench_interop.py [--seeds 0 1 2] [--epochs 20]

Per seed (torch.manual_seed(seed) for the init, torch.Generator(seed) for the sample order):
* PTQ: W1 (64-32-10) and W3 (digits-cnn shape) trained in PyTorch float (minibatch 32, SGD
  lr 0.05 momentum 0.9, --epochs epochs), imported (tt.from_torch): float vs integer accuracy;
* QAT: the same shapes through tinytrain.torch.qat (epochs/2 float warm-up, epochs/2 fake-quant,
  BN frozen half way), converted: the QAT model's accuracy vs the integer model's;
* TFLite: the float W1 written as an int8 .tflite (per-channel weights), run by LiteRT's
  interpreter, imported: share of test predictions on which the two agree;
* ONNX export: the PTQ W3 and a tinytrain-trained W1 (20 epochs, seed) exported and run in
  onnxruntime: share of test predictions equal to the integer simulator's.
Writes bench/results/interop.json and the BENCHMARKS.md section interop.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

for _v in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_v] = "1"

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import report  # noqa: E402

import tinytrain as tt  # noqa: E402
import tinytrain.torch as ttt  # noqa: E402
from tinytrain.sim.simulator import Simulator  # noqa: E402

torch.set_num_threads(1)


def onnx_agreement(model, ds) -> float:
    import onnxruntime as ort
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.onnx")
        tt.to_onnx(model, path)
        logits = ort.InferenceSession(path).run(None, {"input": ds.float_x_test})[0]
    return float(np.mean(logits.argmax(1) == Simulator(model).predict(ds.x_test)))


def run_seed(seed: int, epochs: int, data: dict) -> dict:
    from tinytrain.interop import ir
    from tinytrain.interop.torch_import import torch_graph
    from tinytrain.interop.tflite_writer import run_interpreter, write_tflite

    out = {"seed": seed}
    for wl, make in (("w1", ttt.digits_mlp), ("w3", ttt.digits_cnn)):
        ds = data[wl]
        x = ttt.dataset_inputs(ds, quantized=False)
        torch.manual_seed(seed)
        net = ttt.train(make(), x, ds.y_train, epochs, seed=seed)
        m = tt.from_torch(net, None, dataset=ds)
        r = m.import_report
        out[f"{wl}_ptq_float"], out[f"{wl}_ptq_int"] = r["float_accuracy"], r["integer_accuracy"]
        torch.manual_seed(seed)
        q = ttt.qat(make(), ds, float_epochs=epochs // 2, qat_epochs=epochs - epochs // 2, seed=seed)
        out[f"{wl}_qat"] = ttt.accuracy(q, ttt.dataset_inputs(ds, "test"), ds.y_test)
        out[f"{wl}_qat_int"] = tt.evaluate(ttt.convert(q, ds), ds)["accuracy"]
        if wl == "w1":
            buf = write_tflite(ir.to_model(*torch_graph(net, x[:1])).ops, x)
            lite = run_interpreter(buf, ttt.dataset_inputs(ds, "test", quantized=False)).argmax(1)
            mt = tt.from_tflite(buf, dataset=ds)
            out["w1_tflite_acc"] = float(np.mean(lite == ds.y_test))
            out["w1_tflite_agree"] = float(np.mean(Simulator(mt).predict(ds.x_test) == lite))
            native = tt.build_model("digits-mlp", ds, seed=seed)
            tt.fit(native, ds, epochs=20, seed=seed)
            out["w1_onnx_agree"] = onnx_agreement(native, ds)
        else:
            out["w3_onnx_agree"] = onnx_agreement(m, ds)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--epochs", type=int, default=20)
    args = ap.parse_args(argv)
    data = {"w1": tt.load_dataset("digits"), "w3": tt.load_dataset("digits-image")}
    runs = []
    for s in args.seeds:
        runs.append(run_seed(s, args.epochs, data))
        print({k: round(v, 4) if isinstance(v, float) else v for k, v in runs[-1].items()}, flush=True)

    def col(k):
        v = 100 * np.array([r[k] for r in runs])
        return f"{v.mean():.2f} ± {v.std(ddof=1) if len(v) > 1 else 0:.2f}"

    def diff(a, b):
        d = 100 * (np.array([r[a] for r in runs]) - np.array([r[b] for r in runs]))
        return f"{d.mean():+.2f} (worst {d[np.argmax(np.abs(d))]:+.2f})"

    rows = [["W1 PTQ (PyTorch float -> integer)", col("w1_ptq_float"), col("w1_ptq_int"), diff("w1_ptq_int", "w1_ptq_float"), "within 1.0"],
            ["W3 PTQ (PyTorch float -> integer)", col("w3_ptq_float"), col("w3_ptq_int"), diff("w3_ptq_int", "w3_ptq_float"), "within 1.0"],
            ["W1 QAT -> integer", col("w1_qat"), col("w1_qat_int"), diff("w1_qat_int", "w1_qat"), "within 0.3"],
            ["W3 QAT -> integer", col("w3_qat"), col("w3_qat_int"), diff("w3_qat_int", "w3_qat"), "within 0.3"]]
    agree = [["W1 int8 .tflite: LiteRT interpreter vs imported model", col("w1_tflite_agree"), ">= 99"],
             ["W1 (tinytrain-trained) ONNX export: onnxruntime vs simulator", col("w1_onnx_agree"), ">= 99"],
             ["W3 (PTQ import) ONNX export: onnxruntime vs simulator", col("w3_onnx_agree"), ">= 99"]]
    body = ("## Import, QAT and export (issue 14)\n\n"
            f"Seeds {args.seeds}, {args.epochs} PyTorch epochs (minibatch 32, SGD lr 0.05, momentum 0.9); "
            f"QAT {args.epochs // 2} float + {args.epochs - args.epochs // 2} fake-quant epochs. "
            f"Test accuracy in %, mean ± std over seeds; `python bench/bench_interop.py`.\n\n"
            + report.markdown_table(["", "source model", "tinytrain integer", "integer - source, points", "goal"], rows)
            + "\n\nPrediction agreement on the 360 test samples, %:\n\n"
            + report.markdown_table(["", "agreement", "goal"], agree)
            + f"\n\nMachine: {report.machine_line(report.machine())}")
    print(body)
    report.write_json("interop.json", {"runs": runs, "machine": report.machine()})
    report.update_section("interop", body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
