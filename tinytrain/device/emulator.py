"""Run firmware on an emulated board (qemu-system-arm) with its UART on a local TCP socket.

    from tinytrain.device.emulator import Emulator
    with Emulator("mps2_an386", elf) as emu:          # QEMU always killed on exit
        ser = emu.open_serial(timeout=2)               # pyserial, socket://127.0.0.1:PORT
        print(ser.readline())
    # or: emu.url -> "socket://127.0.0.1:PORT" for serial.serial_for_url() yourself

UART0 of the board is QEMU's first ``-serial``, a TCP server on 127.0.0.1 with ``wait=on``: the
guest does not start until the host connects, so nothing it prints is lost. The port is a free
one chosen at start (retried if taken in between).

Instruction counting. QEMU runs with ``-icount shift=7``: the virtual clock advances exactly
128 ns per executed instruction, independently of host speed. Every timer of the board therefore
counts instructions, and ticks more often than once per instruction (MPS2's 25 MHz CMSDK timer 0
every 40 ns, the micro:bit's 8 MHz TIMER0 every 125 ns): the firmware's ``tt_port_cycles()``
returns the exact number of instructions executed (tt_qemu_instructions in tt_port.h;
resolution 1). The difference between two readings around a piece of code is the same on every
run as long as that code does not wait for host input (a wait loop spins a host-timing-dependent
number of times). At shift 0 (1 ns per instruction) a reading was exact only to within one tick,
whose phase depended on how long the firmware had polled the UART.
``-semihosting`` lets ``tt_port_exit(code)`` end QEMU with exit status ``code``.

No QEMU outlives its owner: :meth:`Emulator.stop` (context manager exit) ends it, SIGTERM then
SIGKILL after a grace period (a frozen - SIGSTOPped - QEMU only dies of SIGKILL), and
:func:`kill_all` kills every QEMU this process still runs: the CLI calls it on SIGTERM/SIGHUP,
and it runs at interpreter exit. (PR_SET_PDEATHSIG is not used: it fires when the *thread* that
started the child exits, and federated boards are (re)booted from per-round worker threads.)
"""

from __future__ import annotations

import atexit
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from tinytrain.device.boards import Board, get_board

#: -icount shift: 2^7 = 128 virtual ns per instruction, coarser than every emulated board's timer
#: tick (tt_port.h, tt_qemu_instructions; firmware/include/tt_port.h's TT_QEMU_ICOUNT_SHIFT)
ICOUNT_SHIFT = 7

__all__ = ["Emulator", "EmulatorError", "qemu_command", "find_qemu", "kill_all"]

HOST = "127.0.0.1"
STOP_GRACE = 1.0  # seconds QEMU gets to exit on SIGTERM before SIGKILL

_running: set[subprocess.Popen] = set()  # every QEMU started here and not yet reaped
_running_lock = threading.RLock()  # re-entrant: kill_all runs in the SIGTERM handler, which may
                                   # interrupt the main thread inside start()/stop()


def kill_all() -> int:
    """SIGKILL every QEMU process this process started and has not stopped; returns how many.
    Safe from a signal handler (no waiting) and from any thread."""
    with _running_lock:
        procs = list(_running)
    n = 0
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
                n += 1
            except OSError:
                pass
    return n


atexit.register(kill_all)


def open_socket_serial(url: str, timeout: float):
    """pyserial on a socket:// URL that keeps every byte the peer sent from the first: pyserial's
    socket open() ends with reset_input_buffer(), which drops what arrived between the connect
    and that call; a QEMU guest (wait=on) starts at the connect and may print in that window."""
    import serial

    ser = serial.serial_for_url(url, timeout=timeout, do_not_open=True)
    ser.reset_input_buffer = lambda: None
    try:
        ser.open()
    finally:
        del ser.reset_input_buffer
    from tinytrain.device.protocol import close_without_pause

    close_without_pause(ser)
    return ser


class EmulatorError(RuntimeError):
    """QEMU is missing, the board is not emulated, or QEMU failed to start."""


def find_qemu() -> str:
    exe = shutil.which("qemu-system-arm")
    if not exe:
        raise EmulatorError("qemu-system-arm not found: sudo apt-get install -y qemu-system-arm")
    return exe


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def qemu_command(board: str | Board, elf: str | Path, port: int, *, icount: bool = True,
                 extra_args: tuple[str, ...] = ()) -> list[str]:
    """The qemu-system-arm command line that runs `elf` with UART0 on TCP `port` (server, wait)."""
    b = get_board(board)
    if not b.is_emulated:
        raise EmulatorError(f"board {b.name!r} is a real board, not emulated; run it on hardware")
    cmd = [find_qemu(), "-machine", b.qemu_machine, "-display", "none", "-monitor", "none",
           "-chardev", f"socket,id=uart0,host={HOST},port={port},server=on,wait=on,nodelay=on",
           "-serial", "chardev:uart0",
           "-semihosting-config", "enable=on,target=native",
           "-kernel", str(elf)]
    if icount:
        cmd[1:1] = ["-icount", f"shift={ICOUNT_SHIFT}"]
    return cmd + list(extra_args)


def _listening(port: int) -> bool:
    """True once something listens on 127.0.0.1:`port` (read from /proc; no connection made,
    since connecting would start the guest)."""
    want = f"0100007F:{port:04X}"
    for table in ("/proc/net/tcp",):
        try:
            with open(table) as f:
                for line in f.readlines()[1:]:
                    cols = line.split()
                    if cols[1] == want and cols[3] == "0A":  # 0A = TCP_LISTEN
                        return True
        except OSError:
            return True  # no /proc: let the caller's connect retries handle it
    return False


def _check_arm_elf(path: Path) -> None:
    """QEMU given anything but an ARM ELF waits forever for a guest that never runs: refuse it."""
    with open(path, "rb") as f:
        head = f.read(20)
    if head[:4] != b"\x7fELF":
        raise EmulatorError(f"firmware {path} is not an ELF file: pass the firmware.elf that "
                            "`tinytrain build` prints (.pio/build/BOARD/firmware.elf)")
    machine = int.from_bytes(head[18:20], "little" if head[5:6] == b"\x01" else "big")
    if machine != 40:  # EM_ARM
        raise EmulatorError(f"firmware {path} is an ELF for machine {machine}, not ARM (40): pass "
                            "the firmware.elf built for the board by `tinytrain build`")


class Emulator:
    """One QEMU process for `board` running `elf`. A context manager; :meth:`stop` always kills it."""

    def __init__(self, board: str | Board | None, elf: str | Path, *, icount: bool = True,
                 extra_args: tuple[str, ...] = (), start_timeout: float = 10.0):
        from tinytrain.device.boards import default_board

        self.board = get_board(board) if board is not None else default_board()
        self.elf = Path(elf)
        if not self.elf.is_file():
            raise EmulatorError(f"firmware {self.elf} does not exist")
        _check_arm_elf(self.elf)
        self.icount = icount
        self.extra_args = tuple(extra_args)
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._log = None
        self._serial = None

    # -- life cycle ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        if self.port is None:
            raise EmulatorError("emulator not started")
        return f"socket://{HOST}:{self.port}"

    def start(self) -> str:
        """Start QEMU; returns the UART URL once QEMU listens (the guest starts on connect)."""
        if self.proc is not None:
            return self.url
        last = ""
        for _attempt in range(5):
            port = _free_port()
            if self._log is not None:  # the previous attempt's or boot's log (retries, restarts)
                self._log.close()
            self._log = tempfile.TemporaryFile()
            cmd = qemu_command(self.board, self.elf, port, icount=self.icount, extra_args=self.extra_args)
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=self._log,
                                         stderr=subprocess.STDOUT)
            with _running_lock:
                _running.add(self.proc)
            self.port = port
            deadline = time.monotonic() + self.start_timeout
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                if _listening(port):
                    return self.url
                time.sleep(0.01)
            last = self.output()
            self.stop()
            if "in use" not in last:  # anything but a port race is fatal
                break
        raise EmulatorError(f"QEMU did not start for {self.board.name}: {last.strip() or 'timeout'}")

    def open_serial(self, timeout: float = 5.0, retries: int = 50):
        """Connect pyserial to the UART (starts the guest). Kept and closed by :meth:`stop`."""
        import serial

        url = self.start()
        err = None
        for _ in range(retries):
            try:
                self._serial = open_socket_serial(url, timeout)
                return self._serial
            except serial.SerialException as exc:  # not listening yet (no /proc)
                err = exc
                time.sleep(0.05)
        raise EmulatorError(f"cannot connect to {url}: {err}")

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the guest to call tt_port_exit(); returns its exit code."""
        if self.proc is None:
            raise EmulatorError("emulator not started")
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise EmulatorError(f"QEMU ({self.board.name}) still running after {timeout} s") from None

    def output(self) -> str:
        """What QEMU itself printed (errors, warnings), not the guest's UART."""
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode(errors="replace")

    def stop(self, grace: float = STOP_GRACE) -> int | None:
        """Close the serial link and end QEMU if still running (SIGTERM, SIGKILL after `grace`
        seconds); returns its exit code."""
        if self._serial is not None:
            try:
                self._serial.close()
            except Exception:  # noqa: BLE001 - closing a dead socket must not mask the real error
                pass
            self._serial = None
        rc = None
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(grace)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            rc = self.proc.wait()
            with _running_lock:
                _running.discard(self.proc)
            self.proc = None
        return rc

    def restart(self) -> str:
        """Stop QEMU (whatever its state: running, frozen, dead) and boot the firmware afresh;
        returns the new UART URL."""
        self.stop()
        return self.start()

    def __enter__(self) -> "Emulator":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __del__(self):  # last resort; the context manager is the contract
        proc = getattr(self, "proc", None)
        if proc is not None and proc.poll() is None:
            proc.kill()
