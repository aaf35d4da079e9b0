"""Device commands of the ``tinytrain`` CLI: codegen, build, verify, emulate, flash.

    tinytrain codegen --model digits-mlp --out gen/ [--board mps2_an386] [--prefix tt_model]
    tinytrain build   --model digits-mlp --board mps2_an386 --out fw/
    tinytrain verify  --board host|mps2_an386 --model digits-mlp --steps 300 [--json]
    tinytrain verify  --port /dev/ttyACM0 --board nucleo_f446re --model digits-mlp --steps 300
    tinytrain emulate --board mps2_an386 --firmware fw/.pio/build/mps2_an386/firmware.elf
    tinytrain flash   --board nucleo_f446re --port /dev/ttyACM0 --project fw/

Registered in tinytrain.cli's SUBCOMMANDS registry on import; ``add_parsers(subparsers)`` adds
the same commands to any argparse subparsers object.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

COMMANDS = {}


class DeviceCommandError(ValueError):
    """A build, emulator, link or verification failure, reported on one line by the CLI."""


def _user_errors(run):
    """Turn the device path's own errors into DeviceCommandError (exit 2, one line)."""
    def wrapped(args):
        from .emulator import EmulatorError
        from .pio_project import BuildError
        from .protocol import ProtocolError
        from .verify import VerifyError

        try:
            return run(args)
        except (BuildError, EmulatorError, ProtocolError, VerifyError, MemoryError) as exc:
            raise DeviceCommandError(str(exc)) from exc
    wrapped.__name__ = run.__name__
    return wrapped


def _model_args(p, steps=False):
    p.add_argument("--model", required=True, help="digits-mlp (built-in), a .json/.toml model "
                   "description or a saved .tt model")
    p.add_argument("--data", default=None, help="dataset (default: the one the built-in model is "
                   "made for, else digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the sample order")


def _retries(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return n


def _seconds(text: str) -> float:
    try:
        t = float(text)
    except ValueError:
        t = float("nan")
    if not 0 < t < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds > 0, got {text!r}")
    return t


def add_link_args(p, timeout_default: str) -> None:
    """--retries and --timeout of a command that talks to boards over the serial protocol."""
    from .protocol import DEFAULT_RETRIES

    p.add_argument("--retries", type=_retries, default=None, metavar="N",
                   help="retransmissions of a request after a timeout or a corrupted exchange "
                   f"(default {DEFAULT_RETRIES}); the link resyncs and backs off before each")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help=f"seconds one attempt waits for its reply (default {timeout_default})")


def _load_model(args):
    """(model, dataset) from --model (built-in name, model file, or saved .tt) and --data."""
    from . import data
    from .models import MODELS, build_model

    name = args.data
    if name is None and args.model in MODELS:
        name = MODELS[args.model][2]
    if name is None and Path(args.model).is_file():
        from . import io as tio

        if tio.is_model_file(args.model):  # a saved model records the data it was trained on
            extra = tio.load(args.model)[1]
            src = extra.get("data_source")
            name = extra.get("dataset")
            if name not in data.BUILTINS and src and Path(str(src)).exists():
                name = src
    ds = data.load(name or "digits")
    return build_model(args.model, ds, seed=args.seed), ds


# ------------------------------------------------------------------------------ codegen

def _codegen_args(p):
    _model_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--board", default=None, help="also write the complete PlatformIO project "
                   "for this board (no build)")
    p.add_argument("--prefix", default="tt_model", help="C symbol prefix (default tt_model)")


def _codegen_run(args) -> int:
    from .codegen.device import write_firmware_project, write_sources

    model, _ = _load_model(args)
    if args.board:
        proj = write_firmware_project(model, args.board, args.out, args.prefix)
        print(f"PlatformIO project for {args.board}: {proj} (build: pio run -d {proj})")
    else:
        _, files = write_sources(model, args.out, args.prefix)
        for f in files:
            print(f)
    from .codegen.device import memory_report

    print(memory_report(model, args.board, args.prefix).table())
    return 0


COMMANDS["codegen"] = ("generate C (model + device glue, or a whole PlatformIO project)",
                       _codegen_args, _codegen_run)


# ------------------------------------------------------------------------------ build

def _build_args(p):
    _model_args(p)
    p.add_argument("--board", required=True, help="target board (tinytrain/boards: mps2_an385, ...)")
    p.add_argument("--out", required=True, help="PlatformIO project folder to write and build")
    p.add_argument("--prefix", default="tt_model")


def _build_run(args) -> int:
    from .codegen.device import build_firmware
    from .verify import firmware_sizes

    model, _ = _load_model(args)
    elf = build_firmware(model, args.board, args.out, args.prefix)
    sizes = firmware_sizes(elf)
    extra = (f" (flash {sizes['flash_bytes']} B, static RAM {sizes['ram_bytes']} B)" if sizes else "")
    print(f"{elf}{extra}")
    return 0


COMMANDS["build"] = ("write and build the firmware of a model with PlatformIO", _build_args, _build_run)


# ------------------------------------------------------------------------------ verify

def _verify_args(p):
    _model_args(p)
    p.add_argument("--board", default=None, help="host (generated C via cffi), an emulated board "
                   "(built and run in QEMU) or, with --port, the real board's name")
    p.add_argument("--port", default=None, help="serial port or pyserial URL of a device running "
                   "this model's firmware (/dev/ttyACM0, socket://127.0.0.1:4321)")
    p.add_argument("--steps", type=int, default=300, help="training steps to compare (default 300)")
    p.add_argument("--json", action="store_true", help="last line: a JSON object with the result")
    add_link_args(p, "2 s with --port, 10 s for an emulated board")


def _verify_run(args) -> int:
    from .verify import verify

    if args.board is None and args.port is None:
        raise ValueError("give --board host|BOARD or --port PORT")
    model, ds = _load_model(args)
    last = [0.0]

    def progress(k, n):
        if time.monotonic() - last[0] > 1.0 or k == n:
            last[0] = time.monotonic()
            print(f"\r  step {k}/{n}: hashes equal", end="", file=sys.stderr, flush=True)

    r = verify(model, ds, args.steps, board=args.board or ("host" if args.port is None else None),
               port=args.port, json=args.json, seed=args.seed, progress=progress,
               retries=args.retries, timeout=args.timeout)
    if not args.json:
        print(file=sys.stderr)
    fm = r["first_mismatch"]
    if fm is None:
        print(f"{r['board']}: {r['steps']} steps, state hash equal to the simulator after every step")
    else:
        print(f"{r['board']}: MISMATCH at step {fm['step']} (sample {fm['sample']}): {fm.get('tensor')} "
              f"index {fm.get('index')}: simulator {fm.get('expected')}, device {fm.get('device')}"
              + (f"; first differing op: layer {fm['first_op']['layer']} {fm['first_op']['op']}"
                 if "first_op" in fm else ""))
    if r["instructions_per_step"] is not None:
        print(f"  {r['instructions_per_step']:.0f} instructions per training step (QEMU -icount)")
    if r["cycles_per_step"] is not None:
        print(f"  {r['cycles_per_step']:.0f} cycles per training step")
    if r["retransmissions"]:
        print(f"  {r['retransmissions']} requests sent again (timeouts or corrupted exchanges)")
    if r["ram_bytes"] is not None:
        print(f"  static RAM {r['ram_bytes']} B"
              + (f", peak stack {r['stack_bytes']} B" if r.get("stack_bytes") else "")
              + (f", flash {r['flash_bytes']} B" if r["flash_bytes"] else ""))
    if args.json:
        print(json.dumps(r, sort_keys=True))
    return 1 if r["mismatches"] else 0


COMMANDS["verify"] = ("train simulator and target side by side, compare state hashes every step",
                      _verify_args, _verify_run)


# ------------------------------------------------------------------------------ emulate

def _emulate_args(p):
    p.add_argument("--board", required=True, help="emulated board (mps2_an385, mps2_an386, mps2_an500, microbit)")
    p.add_argument("--firmware", required=True, help="ELF to run (e.g. from tinytrain build)")


def _emulate_run(args) -> int:
    import signal

    from .emulator import Emulator

    def stop(_sig, _frame):  # SIGTERM/SIGHUP: leave through the context manager, QEMU killed
        raise KeyboardInterrupt

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, stop)
    with Emulator(args.board, args.firmware) as emu:
        print(f"{args.board} running {args.firmware}: UART at {emu.url} "
              "(the guest starts when a client connects; Ctrl-C stops)", flush=True)
        try:
            while emu.proc is not None and emu.proc.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt:
            return 0
        print(f"QEMU exited: {emu.output().strip()}", file=sys.stderr)
        return 1


COMMANDS["emulate"] = ("boot firmware in QEMU and print its serial URL", _emulate_args, _emulate_run)


# ------------------------------------------------------------------------------ flash

def _flash_args(p):
    p.add_argument("--board", required=True, help="real board name")
    p.add_argument("--port", required=True, help="upload port (e.g. /dev/ttyACM0)")
    p.add_argument("--project", default=None, help="PlatformIO project written by tinytrain build "
                   "(default: build one from --model into a temporary folder)")
    p.add_argument("--model", default=None)
    p.add_argument("--data", default=None)
    p.add_argument("--seed", type=int, default=0)


def _flash_run(args) -> int:
    import subprocess

    from .boards import get_board
    from .pio_project import _missing_platform, platform_installed
    from .toolchain import find_pio, pio_env

    b = get_board(args.board)
    if b.is_emulated:
        raise ValueError(f"{b.name} is emulated: nothing to flash; run it with "
                         f"tinytrain emulate --board {b.name} --firmware ELF")
    if not platform_installed(b):
        raise DeviceCommandError(_missing_platform(b, f"cannot flash {b.name}", "this machine is offline or "
                                           "it was never installed"))
    if args.project is None:
        if args.model is None:
            raise ValueError("give --project DIR (from tinytrain build) or --model")
        import tempfile

        from .codegen.device import write_firmware_project

        model, _ = _load_model(args)
        args.project = write_firmware_project(model, b.name, tempfile.mkdtemp(prefix="tt-flash-"))
    proj = Path(args.project)
    if not (proj / "platformio.ini").is_file():
        raise ValueError(f"{proj} has no platformio.ini: run tinytrain build first")
    cmd = [str(find_pio()), "run", "-d", str(proj), "-e", b.name, "-t", "upload", "--upload-port", args.port]
    r = subprocess.run(cmd, env=pio_env(), stdin=subprocess.DEVNULL)
    return r.returncode


COMMANDS["flash"] = ("build and upload the firmware to a real board (pio run -t upload)",
                     _flash_args, _flash_run)


# ------------------------------------------------------------------------------ wiring

def add_parsers(subparsers) -> None:
    """Add codegen, build, verify, emulate and flash to an argparse subparsers object."""
    for name, (help, args_fn, run) in COMMANDS.items():
        sp = subparsers.add_parser(name, help=help, description=help)
        args_fn(sp)
        sp.set_defaults(_run=_user_errors(run))


def register_all() -> None:
    """Register the commands in tinytrain.cli's SUBCOMMANDS registry."""
    from . import cli

    for name, (help, args_fn, run) in COMMANDS.items():
        cli.register(name, help, args_fn, _user_errors(run))


register_all()
