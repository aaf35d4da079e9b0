"""The end-to-end device path: W1 built with PlatformIO for emulated Cortex-M boards, booted in
QEMU, driven over the serial protocol (socket URL) and checked bit for bit against the
simulator after every training step. Skips only when qemu/arm-gcc/PlatformIO are missing."""
import os
import shutil
import socket
import re
import subprocess
import time

import numpy as np
import pytest

from tinytrain import data
from tinytrain.graph.layers import Dense, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.sim.simulator import Simulator
from tinytrain.verify import firmware_sizes, sample_order, state_blob, state_layout, verify


def _missing_tools():
    missing = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        missing.append("platformio")
    return missing


pytestmark = [pytest.mark.qemu,
              pytest.mark.skipif(bool(_missing_tools()), reason=f"missing: {', '.join(_missing_tools())}")]

BOARDS = ["mps2_an385", "mps2_an386", "mps2_an505"]


@pytest.fixture(scope="module")
def ds():
    return data.load("digits")


def w1(ds):
    return Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=ds.input_exp - 4,
                      optimizer=SGD(lr=0.05), seed=0)


@pytest.fixture(scope="module")
def firmware(ds, tmp_path_factory):
    """One PlatformIO build of W1 per board per session: board -> (project dir, ELF)."""
    from tinytrain.codegen.project import build_firmware

    built = {}

    def get(board):
        if board not in built:
            out = tmp_path_factory.mktemp(f"fw_{board}")
            built[board] = (out, build_firmware(w1(ds), board, out))
        return built[board]
    return get


@pytest.mark.parametrize("board", BOARDS)
def test_w1_trains_bit_exact_in_qemu(ds, firmware, board):
    _, elf = firmware(board)
    r = verify(w1(ds), ds, 200, board=board, elf=elf)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None, r["first_mismatch"]
    assert r["steps"] == 200 and r["board"] == board
    # instruction counts are exact under -icount (quantised to the MPS2 timer's 40)
    assert 10_000 < r["instructions_per_step"] < 5_000_000
    assert 0 < r["ram_bytes"] < 64 * 1024 and 0 < r["flash_bytes"] < 64 * 1024
    assert 0 < r["stack_bytes"] < 8 * 1024  # painted-stack high-water mark from the glue
    assert r["ram_peak_bytes"] == r["ram_bytes"] + r["stack_bytes"]


@pytest.mark.parametrize("board", ["mps2_an386", "mps2_an505"])  # hard-float M4F and M33
def test_project_is_self_contained_and_float_free(ds, firmware, board):
    from tinytrain.codegen.memory import vfp_instructions

    proj, elf = firmware(board)
    ini = (proj / "platformio.ini").read_text()
    outside = [ln for ln in ini.splitlines() if re.search(r"(=|\s)(/|symlink://|file://)", ln.split(";")[0])]
    assert not outside, outside  # no path out of the project: it builds wherever it is moved
    assert "platform = qemu-cortexm@" in ini
    assert (proj / "include" / "tt_device.h").is_file()
    assert (proj / "src" / "app" / "tt_model_device.c").is_file()
    nm = subprocess.run(["arm-none-eabi-nm", str(elf)], capture_output=True, text=True, check=True).stdout
    assert "tt_model_device" in nm
    assert not [ln for ln in nm.splitlines() if "__aeabi_f" in ln or "__aeabi_d" in ln]
    disasm = subprocess.run(["arm-none-eabi-objdump", "-d", str(elf)], capture_output=True, text=True,
                            check=True).stdout
    assert "<tt_model_train_step>:" in disasm  # the check sees the training code
    assert vfp_instructions(disasm) == []      # the whole firmware, startup to protocol
    assert firmware_sizes(elf)["ram_bytes"] > len(state_blob(w1(ds)))


def test_corrupted_parameter_on_device_is_located(ds, firmware):
    _, elf = firmware("mps2_an386")
    m = w1(ds)
    s = next(s for s in state_layout(m) if s.layer == 0 and s.param == "b")  # int32 (32,)
    r = verify(m, ds, 60, board="mps2_an386", elf=elf, corrupt=(30, s.offset + 4 * 5 + 2))
    fm = r["first_mismatch"]
    assert r["mismatches"] == 1 and fm["step"] == 30
    assert (fm["layer"], fm["op"], fm["param"], fm["index"]) == (0, "dense", "b", 5)
    assert fm["device"] ^ fm["expected"] == 1 << 16


def test_device_reset_mid_session_is_reported_and_recovered(ds, firmware):
    """A reset (QEMU system_reset: the reset button) between steps: the next request raises
    DeviceReset; hello + load_params of the last agreed state resume bit-exact training."""
    from tinytrain.device.emulator import Emulator, _free_port
    from tinytrain.device.protocol import DeviceLink, DeviceReset

    _, elf = firmware("mps2_an386")
    m = w1(ds)
    sim = Simulator(m)
    order = sample_order(len(ds.x_train), 40, seed=0)
    X, Y = ds.x_train, ds.y_train
    mport = _free_port()
    monitor = ("-monitor", f"tcp:127.0.0.1:{mport},server=on,wait=off")
    with Emulator("mps2_an386", elf, extra_args=monitor) as emu:
        link = DeviceLink(emu.url, timeout=5.0)
        for i in order[:20]:
            sim.train(X, Y, np.array([i]))
            assert link.train(X[i], int(Y[i])).state_hash == m.state_hash()
        checkpoint = state_blob(m)
        with socket.create_connection(("127.0.0.1", mport)) as mon:
            mon.sendall(b"system_reset\n")
            time.sleep(0.2)
        with pytest.raises(DeviceReset) as exc:
            link.train(X[order[20]], int(Y[order[20]]))
        assert exc.value.info.step == 0
        assert "restarted" in str(exc.value)
        link.hello()
        assert link.load_params(checkpoint) == m.state_hash()
        for step, i in enumerate(order[20:], start=21):
            sim.train(X, Y, np.array([i]))
            r = link.train(X[i], int(Y[i]))
            assert (r.step, r.state_hash) == (step, m.state_hash())
        assert link.state_hash() == m.state_hash()
        link.close()


def _qemu_children(pid: int) -> list[int]:
    """PIDs of the qemu-system-arm processes whose parent is `pid` (from /proc)."""
    found = []
    for d in os.listdir("/proc"):
        try:
            with open(f"/proc/{d}/stat") as f:
                stat = f.read()
        except OSError:  # not a process, or gone meanwhile
            continue
        comm, rest = stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2:].split()
        if comm == "qemu-system-arm" and int(rest[1]) == pid:
            found.append(int(d))
    return found


@pytest.mark.parametrize("argv, boards", [
    (["verify", "--board", "mps2_an386", "--model", "digits-mlp", "--steps", "1000000"], 1),
    (["federate", "--board", "mps2_an386", "--devices", "2", "--rounds", "1000", "--model", "digits-mlp",
      "--local-steps", "2000"], 2),
])
def test_sigterm_leaves_no_qemu_behind(argv, boards):
    """SIGTERM to `tinytrain verify/federate --board` while its QEMU boards run: the command
    exits with 128 + SIGTERM and every QEMU it started is gone (killed and reaped)."""
    import signal
    import sys

    proc = subprocess.Popen([sys.executable, "-c", "import sys; from tinytrain.cli import main; "
                             "sys.exit(main(sys.argv[1:]))", *argv],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 600  # the first run may build the firmware
        qemus = []
        while len(qemus) < boards and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
            qemus = _qemu_children(proc.pid)
        assert len(qemus) == boards, proc.stderr.read().decode() if proc.poll() is not None else qemus
        time.sleep(1.0)  # let training get under way (not a timing check)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
        assert b"terminated by signal" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
    left = [p for p in qemus if os.path.exists(f"/proc/{p}")]
    deadline = time.monotonic() + 10  # an orphan would be reaped by init, never killed
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if os.path.exists(f"/proc/{p}")]
    assert left == [], f"QEMU processes left behind: {left}"


def test_project_builds_after_moving(ds, firmware, tmp_path):
    """A generated project copied elsewhere (the original deleted from view) builds the same ELF
    text: it names no path into the package or a checkout."""
    import shutil

    from tinytrain.device.pio_project import build

    proj, elf = firmware("mps2_an386")
    moved = tmp_path / "elsewhere" / "fw"
    shutil.copytree(proj, moved, ignore=shutil.ignore_patterns(".pio"))
    elf2 = build(moved, "mps2_an386")
    assert elf2.is_relative_to(moved) and elf2.is_file()
    def text(e):
        out = tmp_path / (e.parent.parent.parent.parent.name + ".text")
        subprocess.run(["arm-none-eabi-objcopy", "-O", "binary", "-j", ".text", str(e), str(out)], check=True)
        return out.read_bytes()
    assert text(elf2) == text(elf)


def test_w1_bit_exact_through_a_noisy_link(ds, firmware):
    """QEMU behind the fault proxy: a request and a reply each split by one byte turned into
    0x00 cost one retransmission apiece; then 100 verify steps with random flips and drops
    (2e-3 + 1e-3 per byte both ways, fixed seed) stay bit-exact."""
    from tinytrain.device.emulator import Emulator
    from tinytrain.device.faultproxy import FaultProxy
    from tinytrain.device.protocol import DeviceLink

    _, elf = firmware("mps2_an386")
    with Emulator("mps2_an386", elf) as emu, FaultProxy("127.0.0.1", emu.port, seed=5) as px:
        with DeviceLink(px.url, timeout=5.0, retries=20, quiet=0.05) as lk:
            h = lk.state_hash()
            for direction in ("up", "down"):
                px.inject(direction, px.offset(direction) + 8, "set", 0x00)  # idle link: exact
                assert lk.state_hash() == h
            assert lk.retransmissions == 2 and lk.worst_retries == 1
            px.rates.update(flip=2e-3, drop=1e-3)
            r = verify(w1(ds), ds, 100, board="mps2_an386", link=lk)
    assert r["mismatches"] == 0 and r["steps"] == 100, r["first_mismatch"]
    injected = sum(px.counts[d][k] for d in ("up", "down") for k in ("flip", "drop"))
    assert injected > 0 and r["retransmissions"] > 2


def test_a_blob_holding_int16_minimum_is_refused_by_the_board(ds, firmware):
    """LOAD_PARAMS of a blob with one int16 weight at -32768 (outside the symmetric range): the
    commit's write_state refuses it (RANGE), the old state stays live and trains on bit-exact;
    the same blob with -32767 there loads."""
    from tinytrain.device.emulator import Emulator
    from tinytrain.device.protocol import DeviceError, DeviceLink, ErrorCode

    _, elf = firmware("mps2_an386")
    m = w1(ds)
    s = next(s for s in state_layout(m) if s.layer == 2 and s.param == "w")  # int16 (10, 32)
    bad = bytearray(state_blob(m))
    bad[s.offset + 2 * 37:s.offset + 2 * 38] = b"\x00\x80"
    with Emulator("mps2_an386", elf) as emu:
        link = DeviceLink(emu.url, timeout=5.0)
        h0 = link.state_hash()
        assert h0 == m.state_hash()
        with pytest.raises(DeviceError) as exc:
            link.load_params(bytes(bad))
        assert exc.value.code == ErrorCode.RANGE
        assert link.state_hash() == h0 and link.read_params() == state_blob(m)
        sim = Simulator(m)
        for i in range(5):
            sim.train(ds.x_train, ds.y_train, np.array([i]))
            assert link.train(ds.x_train[i], int(ds.y_train[i])).state_hash == m.state_hash()
        bad[s.offset + 2 * 37:s.offset + 2 * 38] = b"\x01\x80"  # -32767: a valid state
        assert link.load_params(bytes(bad)) == link.state_hash()
        link.close()
