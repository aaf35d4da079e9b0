"""Board registry, offline PlatformIO build and QEMU boot of the echo firmware.

The qemu-marked tests build tinytrain/firmware/apps/echo through PlatformIO (offline platform
tinytrain/device/boards/platform-qemu-cortexm, system arm-none-eabi-gcc), boot it in qemu-system-arm and talk to it
over pyserial through the socket URL. They skip only when qemu-system-arm, arm-none-eabi-gcc or
PlatformIO is missing.
"""

import json
import re
import shutil

import pytest

from tinytrain.device.boards import (QEMU_PLATFORM_DIR, BoardError, board_names, default_board, get_board,
                              load_boards)

EMULATED = ["mps2_an385", "mps2_an386", "mps2_an500", "mps2_an505", "microbit"]
ECHO_APP = get_board("mps2_an386").port_dir.parent.parent / "apps" / "echo"


def _missing_tools():
    missing = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        missing.append("platformio (pip install -e '.[device]')")
    return missing


needs_qemu = pytest.mark.skipif(bool(_missing_tools()), reason=f"missing: {', '.join(_missing_tools())}")


# --- registry ---------------------------------------------------------------------------------

def test_registry_lists_emulated_and_real_boards():
    boards = load_boards()
    assert [n for n, b in boards.items() if b.is_emulated] == EMULATED
    for name in ("nucleo_f446re", "bluepill_f103c8", "nano33ble", "pico", "disco_f746ng",
                 "nucleo_u575zi_q", "pico2"):
        b = boards[name]
        assert not b.is_emulated and b.pio_framework == "arduino"
        assert b.pio_platform in ("ststm32", "nordicnrf52", "raspberrypi")
    assert get_board("bluepill_f103c8").ram == 20 * 1024
    assert get_board("pico").cpu == "cortex-m0plus" and get_board("pico").cycles_resolution == 0
    assert default_board().name == "mps2_an386" and default_board().is_emulated
    assert get_board("mps2_an505").cpu == get_board("pico2").cpu == "cortex-m33"
    assert get_board("pico2").platform_spec.startswith("https://")  # RP2350: community platform
    # every platform is pinned: official ones to a version, the offline one to its own
    assert get_board("nucleo_f446re").platform_spec == "ststm32@19.6.0"
    assert get_board("nano33ble").platform_spec == "nordicnrf52@10.11.0"
    assert get_board("mps2_an386").platform_spec == "qemu-cortexm@" + json.loads(
        (QEMU_PLATFORM_DIR / "platform.json").read_text())["version"]
    assert all("@" in b.platform_spec or b.platform_spec.startswith("https://") for b in boards.values())


def test_unknown_board_names_the_valid_ones():
    with pytest.raises(BoardError) as exc:
        get_board("arduino_uno")
    msg = str(exc.value)
    assert "arduino_uno" in msg
    for name in board_names():
        assert name in msg


def test_platform_boards_match_registry():
    for name in EMULATED:
        b = get_board(name)
        manifest = json.loads((QEMU_PLATFORM_DIR / "boards" / f"{name}.json").read_text())
        assert manifest["build"]["cpu"] == b.cpu
        assert manifest["build"]["qemu_machine"] == b.qemu_machine
        assert manifest["upload"]["maximum_ram_size"] == b.ram
        assert (b.port_dir / manifest["build"]["ldscript"]).is_file()


def test_real_board_offline_fails_with_clear_message(tmp_path):
    from tinytrain.device.pio_project import BuildError, build, platform_installed, write_project

    if platform_installed("nucleo_f446re"):
        pytest.skip("ststm32 is installed here; the offline error cannot be shown")
    write_project(tmp_path, ["nucleo_f446re"], sources=[ECHO_APP])
    with pytest.raises(BuildError, match=r"platform 'ststm32'.*not installed.*pio pkg install"):
        build(tmp_path, "nucleo_f446re", offline=True)


def test_tool_scons_on_a_fresh_core_dir(tmp_path, monkeypatch):
    from tinytrain.device import toolchain

    monkeypatch.setenv("PLATFORMIO_CORE_DIR", str(tmp_path / "core"))
    dest = toolchain.install_tool_scons(quiet=True)
    meta = json.loads((dest / ".piopm").read_text())
    from platformio.dependencies import get_core_dependencies
    import semantic_version

    assert meta["spec"]["owner"] == "platformio" and meta["name"] == "tool-scons"
    req = semantic_version.SimpleSpec(get_core_dependencies()["tool-scons"])
    assert semantic_version.Version(meta["version"]) in req
    assert (dest / "scons.py").is_file() and (dest / "SCons" / "Script").is_dir()
    assert toolchain.install_tool_scons(quiet=True) == dest  # idempotent



@needs_qemu
def test_setup_does_not_wait_for_running_builds(tmp_path, monkeypatch):
    """Every build calls setup(); with all installed it must not queue behind the shared lock
    that other processes' running builds hold (it did: parallel sweeps built one at a time)."""
    import fcntl
    import threading

    from tinytrain.device import toolchain

    monkeypatch.setenv("PLATFORMIO_CORE_DIR", str(tmp_path / "core"))
    toolchain.setup(quiet=True)  # installs into the fresh core folder (exclusive lock)
    with open(tmp_path / "core" / ".tinytrain-platform.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)  # a build of another process, running
        t = threading.Thread(target=toolchain.setup, kwargs={"quiet": True}, daemon=True)
        t.start()
        t.join(60)
        waited = t.is_alive()
        fcntl.flock(lock, fcntl.LOCK_UN)
    t.join()
    assert not waited, "setup() waited for a running build's lock"


# --- build and boot -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def echo_project(tmp_path_factory):
    from tinytrain.device.pio_project import write_project

    return write_project(tmp_path_factory.mktemp("echo"), EMULATED, sources=[ECHO_APP])


BANNER = re.compile(rb"cycles res=(\d+) t0=(\d+) t1=(\d+) t2=(\d+) loop=(\d+) known_n=(\d+) known=(\d+)")


def _boot(board, elf, payload=b"hello, board\x00\xff\r\n"):
    from tinytrain.device.emulator import Emulator

    with Emulator(board, elf) as emu:
        ser = emu.open_serial(timeout=30)  # a read returns when its line is there: a loaded CI may be slow to boot
        assert ser.readline() == f"tinytrain echo board={board}\r\n".encode()
        m = BANNER.match(ser.readline())
        assert m, "no cycles line"
        assert ser.readline() == b"ready\r\n"
        ser.write(payload)
        echoed = ser.read(len(payload))
        ser.write(b"\x04")  # EOT: firmware returns 0 from main -> semihosting exit
        rc = emu.wait(10)
    return echoed, rc, [int(x) for x in m.groups()]


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board", EMULATED)
def test_echo_firmware_builds_boots_and_echoes(echo_project, board):
    from tinytrain.device.pio_project import build

    elf = build(echo_project, board)
    payload = bytes(b for b in range(256) if b != 0x04)  # 0x04 ends the firmware
    echoed, rc, _ = _boot(board, elf, payload)
    assert echoed == payload
    assert rc == 0


# Instructions between the two counter reads around known_loop() besides the loop's own 2n + 2:
# the end of the first tt_port_cycles() after its timer load (wrap check, the 64-bit scaling to
# instructions, return), the caller's `n` load and `bl`, the second call's entry up to its timer
# load. A constant of the build; 96 bounds it on every port (the Cortex-M0 multiplies 64 bits in
# a libgcc call) without hiding a wrong scale (which is off by >= 20 %).
READ_OVERHEAD = 96


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board", EMULATED)
def test_instruction_counter_counts_a_known_loop(echo_project, board):
    """tt_port_cycles() - the counter behind verify's instructions_per_step - against a loop of
    exactly 2n + 2 instructions (tinytrain/firmware/apps/echo known_loop, n = 100000): exact to the
    instruction (QEMU at -icount shift=7 and tt_qemu_instructions), so the result is 2n + 2 plus
    the read overhead, which two back-to-back reads measure (t1 - t0) up to the few instructions
    that set up and call the loop; two runs give the same figures; a port whose timer scale is
    wrong fails."""
    from tinytrain.device.pio_project import build

    elf = build(echo_project, board)
    runs = [_boot(board, elf)[2] for _ in range(2)]
    res, t0, t1, t2, loop, n, known = runs[0]
    assert res == get_board(board).cycles_resolution == 1
    assert n == 100_000
    exact = 2 * n + 2
    assert exact < known < exact + READ_OVERHEAD, (known, exact)
    assert t0 <= t1 < t2 and loop == t2 - t1 and 0 < t1 - t0 < READ_OVERHEAD
    assert 0 <= known - exact - (t1 - t0) <= 8, (known, exact, t1 - t0)  # n's load and the bl
    assert runs[0] == runs[1], "instruction counts differ between two identical runs"


@pytest.mark.qemu
@needs_qemu
def test_compile_error_is_reported(tmp_path):
    from tinytrain.device.pio_project import BuildError, build, write_project

    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.c").write_text("int main(void) { return undefined_symbol_xyz; }\n")
    write_project(tmp_path / "proj", ["mps2_an385"], sources=[tmp_path / "app"])
    with pytest.raises(BuildError, match=r"main\.c.*undefined_symbol_xyz"):
        build(tmp_path / "proj", "mps2_an385")
