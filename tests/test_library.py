"""The C runtime as a library in the user's own firmware (docs/embedding.md).

- the manifests: tinytrain/firmware/library.json and an exported library's library.json /
  library.properties carry the package version and compile only the runtime;
- the exported Arduino sketch (examples/train_in_loop) compiled as C++ against a stub Arduino.h
  (tests/c/arduino_stub) and run on the host: its "step N hash H" LOG frames equal the simulator;
- a user PlatformIO project written here by hand (not by tinytrain's project writer): its own
  main() trains fixed samples, the runtime comes through lib_deps, QEMU prints the state hash,
  which must equal the simulator's after the same steps.
"""
import json
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tinytrain
from tinytrain import data
from tinytrain.codegen.emit import generate
from tinytrain.codegen.library import export_library, samples_header
from tinytrain.graph.layers import Dense, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.device.protocol import REPLY, Flag, FrameSplitter, Msg, decode_frame, encode_frame
from tinytrain.resources import FIRMWARE, PORTS_DIR
from tinytrain.sim.simulator import Simulator

STUB = Path(__file__).parent / "c" / "arduino_stub"


@pytest.fixture(scope="module")
def ds():
    return data.load("digits")


def w1(ds):
    return Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=ds.input_exp - 4,
                      optimizer=SGD(lr=0.05), seed=0)


def host_hashes(m, X, Y, steps):
    """State hash of `m` after each of `steps` steps cycling through X, Y (index 0 = untrained)."""
    sim = Simulator(m)
    out = [m.state_hash()]
    for s in range(steps):
        sim.train(X, Y, np.array([s % len(Y)]))
        out.append(m.state_hash())
    return out


def test_runtime_manifest_is_the_package_runtime():
    man = json.loads((FIRMWARE / "library.json").read_text())
    assert man["version"] == tinytrain.__version__
    b = man["build"]
    assert (FIRMWARE / b["srcDir"] / "tt_dense.c").is_file()
    assert (FIRMWARE / b["includeDir"] / "tt_device.h").is_file()
    assert b["srcFilter"] == ["+<tt_*.c>"]  # src/ only: neither ports/ nor apps/
    assert man["frameworks"] == man["platforms"] == "*"


def test_export_has_both_manifests_and_guarded_headers(ds, tmp_path):
    lib = export_library(w1(ds), tmp_path / "lib", samples=(ds.x_train[:4], ds.y_train[:4]))
    props = dict(ln.split("=", 1) for ln in (lib / "library.properties").read_text().splitlines())
    assert props["version"] == json.loads((lib / "library.json").read_text())["version"] == tinytrain.__version__
    for key in ("name", "author", "maintainer", "sentence", "paragraph", "category", "url"):
        assert props[key]
    assert props["architectures"] == "*" and props["includes"] == "tinytrain.h"
    assert (lib / "src" / "tinytrain.h").is_file() and (lib / "examples" / "train_in_loop" / "train_in_loop.ino").is_file()
    for h in (lib / "src").glob("*.h"):  # every header, generated ones too: Arduino is C++
        assert 'extern "C"' in h.read_text() or h.name == "tinytrain.h", h.name
    assert "int main(" not in (lib / "src" / "tt_model_device.c").read_text()
    with pytest.raises(FileExistsError):  # never deletes a folder it did not write
        export_library(w1(ds), tmp_path)


def test_cli_export_library(tmp_path, capsys):
    from tinytrain import cli

    out = tmp_path / "lib"
    assert cli.main(["export-library", "--model", "digits-mlp", "--out", str(out), "--samples", "3"]) == 0
    said = capsys.readouterr().out
    assert f"lib_deps = file://{out}" in said and "RAM total" in said  # the memory to provide
    assert "#define TT_MODEL_N_SAMPLES 3u" in (out / "examples" / "train_in_loop" / "samples.h").read_text()
    assert cli.main(["export-library", "--model", "digits-mlp", "--out", str(tmp_path)]) == 2  # not ours


def _compile(cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("cxx", ["g++", "arm-none-eabi-g++"])
def test_runtime_headers_compile_as_cpp(tmp_path, cxx):
    """Every runtime header in one C++ translation unit (arm: Cortex-M4, so the DSP paths of
    tt_dsp.h are in it too): the extern "C" guards and the inline functions are valid C++."""
    if shutil.which(cxx) is None:
        pytest.skip(f"no {cxx}")
    tu = tmp_path / "all.cpp"
    tu.write_text("".join(f'#include "{h.name}"\n' for h in sorted((FIRMWARE / "include").glob("*.h"))))
    arch = ["-mcpu=cortex-m4", "-mthumb"] if cxx.startswith("arm") else []
    _compile([cxx, *arch, "-O2", "-Wall", "-Wextra", "-Werror", f"-I{FIRMWARE / 'include'}", "-c",
              str(tu), "-o", str(tmp_path / "all.o")])


@pytest.mark.skipif(shutil.which("gcc") is None or shutil.which("g++") is None, reason="no host gcc/g++")
def test_arduino_sketch_trains_in_loop_bit_exact_on_host(ds, tmp_path):
    """The sketch, the runtime and the Arduino port compiled with the host gcc/g++ against the
    stub Arduino.h, run for 60 loop() calls. Serial: stdout, and stdin holding three STATE_HASH
    requests sent at once: loop() k answers only the k-th (poll: at most one request) before
    its training step, so the replies are the hashes after 0, 1 and 2 steps; after that every
    poll finds nothing and returns at once."""
    m = w1(ds)
    X, Y = ds.x_train[:16], ds.y_train[:16]
    lib = export_library(m, tmp_path / "lib", samples=(X, Y), steps=50, report=10)
    src, ex, obj = lib / "src", lib / "examples" / "train_in_loop", tmp_path / "obj"
    obj.mkdir()
    common = ["-O1", "-Wall", "-Wextra", "-Werror", "-DARDUINO=100", f"-I{STUB}", f"-I{src}"]
    objs = []
    for f in sorted(src.glob("*.c")):
        objs.append(obj / (f.name + ".o"))
        _compile(["gcc", "-std=c99", *common, "-c", str(f), "-o", str(objs[-1])])
    for f in [src / "tt_port_arduino.cpp", STUB / "main.cpp"]:
        objs.append(obj / (f.name + ".o"))
        _compile(["g++", *common, "-DTT_LOOPS=60", "-c", str(f), "-o", str(objs[-1])])
    objs.append(obj / "sketch.o")
    _compile(["g++", "-x", "c++", *common, "-include", "Arduino.h", f"-I{ex}", "-c",
              str(ex / "train_in_loop.ino"), "-o", str(objs[-1])])
    exe = tmp_path / "sketch"
    _compile(["g++", *map(str, objs), "-o", str(exe)])
    asks = b"".join(encode_frame(Msg.STATE_HASH, seq) for seq in (1, 2, 3))
    wire = subprocess.run([str(exe)], input=asks, capture_output=True, check=True, timeout=60).stdout
    frames = [decode_frame(f) for f in FrameSplitter().feed(wire)]
    assert frames[0].type == Msg.HELLO | REPLY and frames[0].flags & Flag.BOOT  # tt_device_begin
    replies = [(f.seq, *struct.unpack("<II", f.payload[:8])) for f in frames if f.type == Msg.STATE_HASH | REPLY]
    logs = [f.payload.decode(errors="replace") for f in frames if f.type == Msg.LOG]
    want = host_hashes(m, X, Y, 50)
    assert logs and all(" hash " in t for t in logs), logs
    got = {int(t.split()[1]): int(t.split()[3], 16) for t in (s[s.index("step"):] for s in logs)}
    assert sorted(got) == [10, 20, 30, 40, 50]  # stops training after STEPS; loop() goes on
    assert got == {s: want[s] for s in got}
    assert replies == [(1, 0, want[0]), (2, 1, want[1]), (3, 2, want[2])]
    assert want[50] != want[0]


@pytest.mark.skipif(shutil.which("arm-none-eabi-g++") is None, reason="no arm-none-eabi-g++")
def test_arduino_sketch_compiles_for_cortex_m(ds, tmp_path):
    """The same sketch and port as Cortex-M4 Thumb C++ (32-bit int, the real boards' ABI), and
    the setup()/loop() runner of tinytrain's own Arduino projects."""
    lib = export_library(w1(ds), tmp_path / "lib", samples=(ds.x_train[:4], ds.y_train[:4]))
    ex = lib / "examples" / "train_in_loop"
    flags = ["-mcpu=cortex-m4", "-mthumb", "-O2", "-Wall", "-Wextra", "-Werror", "-DARDUINO=100",
             f"-I{STUB}", f"-I{lib / 'src'}", f"-I{ex}", "-c"]
    _compile(["arm-none-eabi-g++", "-x", "c++", *flags, "-include", "Arduino.h",
              str(ex / "train_in_loop.ino"), "-o", str(tmp_path / "s.o")])
    _compile(["arm-none-eabi-g++", *flags, str(lib / "src" / "tt_port_arduino.cpp"), "-o", str(tmp_path / "p.o")])
    _compile(["arm-none-eabi-g++", *flags, str(PORTS_DIR / "arduino" / "tt_arduino_main.cpp"), "-o",
              str(tmp_path / "m.o")])  # setup()/loop() of tinytrain's own Arduino projects


# ---------------------------------------------------------------- a user project in QEMU

def _missing_tools():
    missing = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        missing.append("platformio")
    return missing


USER_MAIN = r"""/* The user's application: trains N_STEPS steps on fixed samples, prints the state hash,
 * then saves the state blob, resets the model and restores it (as from flash). */
#include <stdint.h>

#include "tt_model.h"
#include "tt_model_samples.h"
#include "tt_crc32.h"
#include "tt_port.h"

#define N_STEPS 60u

static uint8_t saved[8192]; /* >= tt_model_state_size() (4916 B for this model) */

static void line(const char *key, uint32_t v)
{
    tt_port_puts(key);
    tt_port_putu32(v);
    tt_port_puts("\r\n");
}

int main(void)
{
    uint32_t s, n = tt_model_state_size();
    int32_t loss;
    tt_port_init();
    line("hash0=", tt_model_state_hash());
    for (s = 0; s < N_STEPS; s++) {
        (void)tt_model_train_step(tt_model_samples_x[s % TT_MODEL_N_SAMPLES],
                                  tt_model_samples_y[s % TT_MODEL_N_SAMPLES], &loss);
    }
    line("hash=", tt_model_state_hash());
    if (n > sizeof saved || tt_model_read_state(0, saved, n) != 0) {
        return 4;
    }
    line("blobcrc=", tt_crc32_update(0u, saved, n)); /* the hash is the blob's CRC-32 */
    tt_model_reset();
    line("reset=", tt_model_state_hash());
    if (tt_model_write_state(0, saved, n) != 0) {
        return 5;
    }
    line("restored=", tt_model_state_hash());
    return 0;
}
"""


@pytest.mark.qemu
@pytest.mark.skipif(bool(_missing_tools()), reason=f"missing: {', '.join(_missing_tools())}")
@pytest.mark.parametrize("how", ["runtime", "export"])
def test_user_project_trains_bit_exact_in_qemu(ds, tmp_path, how):
    """how=runtime: lib_deps = symlink:// to the package's tinytrain/firmware (library.json), the
    generated model in the user's src/. how=export: lib_deps = file:// to an exported library
    (runtime + model). Either way the user copies the mps2 port (startup, UART, linker script)
    into src/port/, as they would a board support package."""
    from tinytrain.device.boards import get_board
    from tinytrain.device.emulator import Emulator
    from tinytrain.device.pio_project import build

    board = get_board("mps2_an386")
    m = w1(ds)
    X, Y = ds.x_train[:25], ds.y_train[:25]
    proj = tmp_path / "user"
    src = proj / "src"
    for d in ("mps2", "common"):
        shutil.copytree(PORTS_DIR / d, src / "port", dirs_exist_ok=True)
    if how == "runtime":
        generate(m).write(src)
        dep = f"symlink://{FIRMWARE}"
    else:
        dep = f"file://{export_library(m, tmp_path / 'tinytrain-tt_model')}"
    (src / "tt_model_samples.h").write_text(samples_header("tt_model", X, Y))
    (src / "main.c").write_text(USER_MAIN)
    (proj / "platformio.ini").write_text(f"""[env:{board.name}]
platform = {board.platform_spec}
board = {board.pio_board}
board_build.ldscript = src/port/{board.ldscript}
lib_deps = {dep}
build_src_flags = -Wall -Wextra -Werror
""")
    elf = build(proj, board)
    want = host_hashes(m, X, Y, 60)
    with Emulator(board, elf) as emu:
        ser = emu.open_serial(timeout=20)
        out = {}
        while "restored" not in out:
            ln = ser.readline().decode(errors="replace").strip()
            assert ln, f"no output from QEMU after {out}"
            k, v = ln.split("=")
            out[k] = int(v)
        assert emu.wait(20) == 0
    assert out["hash0"] == want[0]
    assert out["hash"] == out["blobcrc"] == want[60] != want[0]
    assert out["reset"] == want[0]
    assert out["restored"] == want[60]
