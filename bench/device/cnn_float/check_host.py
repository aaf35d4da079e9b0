"""Check the W3 float32 C app (main.c) on the host against the PyTorch twin: same init, samples, order.

    .venv/bin/python bench/device/cnn_float/check_host.py [--n 100] [--epochs 2]

Writes float_data.h (bench_device.cnn_float_data_header), compiles main.c + host_port.c with the
host gcc (-O2 -DTT_FLOAT_TRACE, which prints every step's loss), trains the twin
(float_twins.w3_twin(0)) on the same first n training digits in the same order, and prints the
per-pass mean losses of both, the largest per-step loss difference and both test counts (eval
mode). The two are the same float32 training up to summation order and libm: their losses agree
to ~1e-5 over 200 steps (seen: 2.4e-6), while a wrong layer (padding, batch statistics,
backward) shows at once. Exit 1 if a step's losses differ by 1e-3 or more.
Needs torch (bench extra).
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import bench_device  # noqa: E402


def c_losses(n: int, epochs: int) -> tuple[np.ndarray, str]:
    with tempfile.TemporaryDirectory(prefix="tt-cnn-float-") as tmp:
        t = Path(tmp)
        (t / "float_data.h").write_text(bench_device.cnn_float_data_header(n))
        exe = t / "cnn_float"
        subprocess.run(["gcc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-DTT_FLOAT_TRACE",
                        f"-DTT_FLOAT_EPOCHS={epochs}", f"-I{t}", f"-I{ROOT / 'firmware' / 'include'}",
                        str(HERE / "main.c"), str(HERE / "host_port.c"), "-lm", "-o", str(exe)], check=True)
        out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    losses = np.array([int(v) for v in re.findall(r"loss_uQ=(\d+)", out)], np.float64) / 1e6
    return losses, out.strip().splitlines()[-1]


def twin_losses(n: int, epochs: int) -> tuple[np.ndarray, int]:
    import torch
    import torch.nn.functional as F

    from tinytrain.lab.twins import w3_twin
    from tinytrain import data

    torch.set_num_threads(1)
    net = w3_twin(0)
    ref = [m.weight.detach().numpy() for m in net.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    mine = bench_device.cnn_init_weights(0)
    for r, m in zip(ref, mine):  # the header's weights are the twin's, exactly
        m = m.transpose(0, 3, 1, 2) if m.ndim == 4 else m
        assert np.array_equal(r, m), "cnn_init_weights differs from float_twins.w3_twin"
    ds = data.load("digits-image")
    x = torch.from_numpy(np.ascontiguousarray(ds.float_x_train[:n] / 16.0, np.float32))
    y = torch.from_numpy(ds.y_train[:n].astype(np.int64))
    opt = torch.optim.SGD(net.parameters(), lr=0.03)
    net.train()
    out = []
    for _ in range(epochs):
        for i in range(n):
            loss = F.cross_entropy(net(x[i:i + 1]), y[i:i + 1])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            out.append(loss.item())
    net.eval()
    with torch.no_grad():
        xt = torch.from_numpy(np.ascontiguousarray(ds.float_x_test[:bench_device.CNN_FLOAT_TEST] / 16.0, np.float32))
        test_correct = int((net(xt).argmax(1).numpy() == ds.y_test[:len(xt)]).sum())
    return np.array(out), test_correct


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=bench_device.FLOAT_SAMPLES)
    ap.add_argument("--epochs", type=int, default=bench_device.FLOAT_EPOCHS)
    a = ap.parse_args(argv)
    c, line = c_losses(a.n, a.epochs)
    t, test_correct = twin_losses(a.n, a.epochs)
    print(line)
    print(f"PyTorch twin: test_correct={test_correct} (eval mode, running statistics)")
    for e in range(a.epochs):
        s = slice(e * a.n, (e + 1) * a.n)
        print(f"pass {e}: mean loss C {c[s].mean():.4f}  PyTorch twin {t[s].mean():.4f}")
    d = np.abs(c - t)
    print(f"per-step |loss C - loss twin|: max {d.max():.2e} (step {int(d.argmax())}), mean {d.mean():.2e}")
    return 0 if d.max() < 1e-3 else 1


if __name__ == "__main__":
    sys.exit(main())
