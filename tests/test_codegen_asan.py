"""The generated C under AddressSanitizer and UBSan (a standalone binary, since ASan cannot be
loaded into the Python process): state hash after every step equals the simulator's, for an
MLP, a CNN with batch norm and a residual block."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tinytrain.device import cbuild
from tinytrain.codegen.emit import generate
from tinytrain.graph.layers import Dense, Flatten, ReLU
from tinytrain.graph.conv import Conv2d, MaxPool2d
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.residual import Residual
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.sim.simulator import Simulator

HERE = Path(__file__).parent / "c"
EXCLUDE = {"tt_protocol", "tt_cobs", "tt_device_main"}


def _asan_works(tmp_path):
    src = tmp_path / "t.c"
    src.write_text("int main(void){return 0;}\n")
    r = subprocess.run(["gcc", "-fsanitize=address,undefined", str(src), "-o", str(tmp_path / "t")], capture_output=True)
    return r.returncode == 0


MODELS = [
    ((16,), lambda: [Dense(12), ReLU(), Dense(4)], SGD(lr=0.05, stochastic_rounding=True)),
    ((6, 6, 1), lambda: [Conv2d(3, 3, padding="same"), BatchNorm(), ReLU(), MaxPool2d(2), Flatten(), Dense(4)],
     SGD(lr=0.05, batch_size=2, momentum=0.9)),
    ((10,), lambda: [Dense(10), Residual([Dense(10), ReLU()]), Dense(4)], SGD(lr=0.05, master_weights=True)),
]


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
@pytest.mark.parametrize("case", range(len(MODELS)))
def test_generated_model_clean_under_asan_and_ubsan(tmp_path, case):
    if not _asan_works(tmp_path):
        pytest.skip("gcc cannot link -fsanitize=address here")
    shape, layers, opt = MODELS[case]
    model = Sequential(layers(), input_shape=shape, input_exp=-7, optimizer=opt, seed=case)
    em = generate(model, prefix="tt_model")
    em.write(tmp_path)
    srcs = [str(p) for p in sorted(cbuild.FIRMWARE_SRC.glob("tt_*.c")) if p.stem not in EXCLUDE]
    exe = tmp_path / "harness"
    cmd = ["gcc", "-std=c99", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", f"-I{cbuild.FIRMWARE_INCLUDE}", f"-I{tmp_path}",
           str(tmp_path / "tt_model.c"), *srcs, str(HERE / "tt_model_harness.c"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rng = np.random.default_rng(case)
    n = 40
    x = rng.integers(-127, 128, (n, *shape)).astype(np.int8)
    y = rng.integers(0, 4, n).astype(np.int32)
    stdin = b"".join(x[i].tobytes() + y[i:i + 1].astype("<i4").tobytes() for i in range(n))
    r = subprocess.run([str(exe)], input=stdin, capture_output=True, env={"ASAN_OPTIONS": "detect_leaks=0"})
    assert r.returncode == 0, r.stderr.decode()[-2000:]
    lines = r.stdout.decode().split("\n")
    sim = Simulator(model)
    assert int(lines[0], 16) == model.state_hash()
    for i in range(n):
        o = sim.train(x, y, [i])[0]
        h, loss, pred = lines[1 + i].split()
        assert int(h, 16) == model.state_hash(), f"step {i}"
        assert (int(loss), int(pred)) == (int(o[0]), int(o[1]))
    preds = [int(l.split()[1]) for l in lines if l.startswith("p ")]
    assert preds == list(sim.predict(x))
