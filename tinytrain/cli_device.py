"""Device commands of the ``tinytrain`` CLI: codegen, export-library, build, verify, emulate, flash.

    tinytrain codegen --model digits-mlp --out gen/ [--board mps2_an386] [--prefix tt_model]
    tinytrain export-library --model digits-mlp --out lib/tinytrain-tt_model
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
        from tinytrain.device.emulator import EmulatorError
        from tinytrain.device.pio_project import BuildError
        from tinytrain.device.protocol import ProtocolError
        from tinytrain.device.toolchain import ToolchainError
        from tinytrain.verify import VerifyError

        try:
            return run(args)
        except (BuildError, EmulatorError, ProtocolError, ToolchainError, VerifyError, MemoryError) as exc:
            raise DeviceCommandError(str(exc)) from exc
    wrapped.__name__ = run.__name__
    return wrapped


def _model_args(p, steps=False, required=True):
    p.add_argument("--model", required=required, help="digits-mlp (built-in), a .json/.toml model "
                   "description or a saved .tt model" + ("" if required else " (instead of --project)"))
    p.add_argument("--data", default=None, help="dataset (default: the one the built-in model is "
                   "made for, else digits)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and of the sample order")
    from tinytrain.cli import add_precision_arg

    add_precision_arg(p)
    p.add_argument("--keep-masks", action="store_true",
                   help="a model whose structured pruning is over is shrunk for the device (its pruned "
                   "units deleted, as tinytrain shrink); this keeps the full layers and their masks")


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


def add_link_args(p, timeout_default: str, retries_default: str | None = None) -> None:
    """--retries and --timeout of a command that talks to boards over the serial protocol."""
    from tinytrain.device.protocol import DEFAULT_RETRIES

    p.add_argument("--retries", type=_retries, default=None, metavar="N",
                   help="retransmissions of a request after a timeout or a corrupted exchange "
                   f"(default {retries_default or DEFAULT_RETRIES}); the link resyncs and backs off before each")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="SECONDS",
                   help=f"seconds one attempt waits for its reply (default {timeout_default})")


def _load_model(args):
    """(model, dataset) from --model and --data (tinytrain.cli.load_model_args); a model whose
    structured pruning is over comes shrunk (tinytrain.graph.convert.for_device: the device gets
    the smaller layers, not the full ones and their masks) unless --keep-masks."""
    import sys

    from tinytrain.cli import load_model_args
    from tinytrain.graph.convert import for_device

    model, ds = load_model_args(args)
    if getattr(args, "keep_masks", False):
        return model, ds
    model, changed = for_device(model)
    if changed and not getattr(args, "json", False):
        print("shrunk the structured-pruned layers for the device: " +
              ", ".join(f"layer {li} ({kind}) {a} -> {b}" for li, kind, a, b in changed) +
              " (--keep-masks keeps the full layers and their masks)", file=sys.stderr)
    return model, ds


def _out_dir(path) -> None:
    """Refuse an --out folder that cannot be made before anything is generated."""
    from tinytrain.graph import io as tio

    tio.check_writable(path, folder=True)


# ------------------------------------------------------------------------------ codegen

def _codegen_args(p):
    _model_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--board", default=None, help="also write the complete PlatformIO project "
                   "for this board (no build); nothing is written if the model does not fit it")
    p.add_argument("--prefix", default="tt_model", help="C symbol prefix (default tt_model)")
    _plot_arg(p)
    p.epilog = ("examples:\n  tinytrain codegen --model digits-mlp --out gen/\n"
                "  tinytrain codegen --model digits-mlp --out fw/ --board mps2_an386 --plot mem.png")


def _plot_arg(p):
    import argparse

    p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--plot", metavar="FILE", default=None, help="write a PNG of the board's RAM and "
                   "flash as bars split by role (parameters, optimizer state, activations, scratch, "
                   "protocol, shadow, stack) against its limits, and per-layer RAM/flash/MACs "
                   "(needs matplotlib: the plot extra)")


def _write_plot(bd, path, title):
    from tinytrain.codegen.plot import plot_memory

    plot_memory(bd, path, title)
    print(f"memory plot: {path}", file=sys.stderr)


def _codegen_run(args) -> int:
    from tinytrain.codegen.project import choose_shadow, memory_report, write_firmware_project, write_sources
    from tinytrain.graph import io as tio

    _out_dir(args.out)
    if args.plot:
        tio.check_writable(args.plot)
    model, _ = _load_model(args)
    if args.board:
        # decide what fits before writing anything: MemoryError (exit 2) leaves no project
        shadow = choose_shadow(model, args.board, args.prefix)
        bd = memory_report(model, args.board, args.prefix, shadow=shadow)
        proj = write_firmware_project(model, args.board, args.out, args.prefix, shadow=shadow)
        print(f"PlatformIO project for {args.board}: {proj} (build: pio run -d {proj})")
        if not shadow:
            print(f"{args.board}: RAM too small for the load shadow; parameter loads (LOAD_PARAMS) "
                  "answer UNSUPPORTED and the parameters come from the firmware image")
    else:
        bd = memory_report(model, None, args.prefix)
        _, files = write_sources(model, args.out, args.prefix)
        for f in files:
            print(f)
    print(bd.table())
    if args.plot:
        _write_plot(bd, args.plot, f"{model.name} on {bd.board}")
    return 0


COMMANDS["codegen"] = ("generate C (model + device glue, or a whole PlatformIO project)",
                       _codegen_args, _codegen_run)


# ------------------------------------------------------------------------------ export-library

def _export_args(p):
    _model_args(p)
    p.add_argument("--out", required=True, help="library folder to write (PlatformIO lib_deps = "
                   "file://FOLDER, or copy it into the Arduino sketchbook's libraries/)")
    p.add_argument("--prefix", default="tt_model", help="C symbol prefix (default tt_model)")
    p.add_argument("--samples", type=int, default=16, help="training samples embedded in the "
                   "example sketch (examples/train_in_loop; default 16, 0: no example)")


def _export_run(args) -> int:
    from tinytrain.codegen.library import export_library

    if args.samples < 0:
        raise ValueError(f"--samples must be >= 0, got {args.samples}")
    _out_dir(args.out)
    model, ds = _load_model(args)
    n = min(args.samples, len(ds.y_train))
    samples = (ds.x_train[:n], ds.y_train[:n]) if n else None
    try:
        lib = export_library(model, args.out, args.prefix, samples=samples)
    except FileExistsError as exc:
        raise ValueError(str(exc)) from None
    print(f"library: {lib} (PlatformIO: lib_deps = file://{lib}; Arduino: copy into libraries/)")
    print(memory_report_table(model, args.prefix))
    return 0


def memory_report_table(model, prefix) -> str:
    """The model's RAM/flash with the device link (tt_device_begin/poll) in: the arena the
    user's firmware provides (docs/embedding.md)."""
    from tinytrain.codegen.project import memory_report

    return memory_report(model, None, prefix).table()


COMMANDS["export-library"] = ("write the C runtime + the generated model as a PlatformIO/Arduino "
                              "library for your own firmware", _export_args, _export_run)


# ------------------------------------------------------------------------------ build

def _build_args(p):
    _model_args(p)
    p.add_argument("--board", required=True, help="target board (tinytrain boards: mps2_an385, ...)")
    p.add_argument("--out", required=True, help="PlatformIO project folder to write and build "
                   "(nothing is written if the model does not fit the board)")
    p.add_argument("--prefix", default="tt_model")
    p.epilog = ("prints the ELF and the memory breakdown (the figures of info/codegen/verify) with "
                "the linked sizes; example: tinytrain build --model runs/w1.tt --board mps2_an386 --out fw/")


def _build_run(args) -> int:
    from tinytrain.codegen.project import build_firmware, choose_shadow, memory_report
    from tinytrain.progress import progress_bar

    _out_dir(args.out)
    model, _ = _load_model(args)
    with progress_bar(total=3, desc=f"build {args.board}", unit="stage") as bar:
        shadow = choose_shadow(model, args.board, args.prefix)  # MemoryError before writing
        bar.update(1)
        bd = memory_report(model, args.board, args.prefix, shadow=shadow)
        bar.update(1)
        elf = build_firmware(model, args.board, args.out, args.prefix, shadow=shadow)
        bar.update(1)
    bd = memory_report(model, args.board, args.prefix, shadow=shadow, elf=elf)
    print(elf)
    print(bd.table())
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
    p.add_argument("--reference", action="store_true", help="also run the numpy reference (the "
                   "specification) as a third party and compare it with the simulator every step "
                   "(~100x slower than the simulator)")
    p.add_argument("--checker", choices=("simulator", "reference"), default="simulator",
                   help="what the target is compared with every step: the numba simulator (default) or the "
                   "numpy reference alone (no simulator to compile: quicker for a few steps of a new model)")
    p.add_argument("--json", action="store_true", help="print only a JSON object with the result on "
                   "stdout (human lines go to stderr)")
    add_link_args(p, "2 s with --port, 10 s for an emulated board")
    p.epilog = ("exit status: 0 equal every step, 3 a mismatch (the first is located), 2 bad input "
                "or a missing tool, 1 an internal error. Examples: tinytrain verify --board host "
                "--model runs/w1.tt --json; tinytrain verify --board mps2_an386 --model digits-mlp --steps 300; "
                "tinytrain verify --board microbit --model digits-mlp --precision int8 --steps 200")


def _verify_run(args) -> int:
    from tinytrain.verify import verify

    if args.board is None and args.port is None:
        raise ValueError("give --board host|BOARD or --port PORT")
    if args.steps < 1:
        raise ValueError(f"--steps must be >= 1 (training steps to compare), got {args.steps}")
    from tinytrain.progress import progress_bar

    model, ds = _load_model(args)
    with progress_bar(total=args.steps, desc="verify", unit="step", json=args.json) as bar:
        r = verify(model, ds, args.steps, board=args.board or ("host" if args.port is None else None),
                   port=args.port, seed=args.seed, progress=lambda k, n: bar.update(k - bar.n),
                   reference=args.reference, retries=args.retries, timeout=args.timeout, checker=args.checker)
    # --json: stdout is the JSON object only; the human lines go to stderr
    out = sys.stderr if args.json else sys.stdout
    fm = r["first_mismatch"]
    if fm is None:
        print(f"{r['board']}: {r['steps']} steps, state hash equal to the {args.checker} after every step"
              + (" (and the simulator's to the numpy reference)" if r["reference"] else ""), file=out)
    else:
        want, got = fm["parties"]
        print(f"{r['board']}: MISMATCH at step {fm['step']} (sample {fm['sample']}) between {want} and {got}: "
              f"{fm.get('tensor')} index {fm.get('index')}: {want} {fm.get('expected')}, {got} {fm.get('device')}"
              + (f"; first differing op: layer {fm['first_op']['layer']} {fm['first_op']['op']}"
                 if "first_op" in fm else ""), file=out)
    if r["instructions_per_step"] is not None:
        print(f"  {r['instructions_per_step']:.0f} instructions per training step (QEMU -icount)", file=out)
    if r["cycles_per_step"] is not None:
        print(f"  {r['cycles_per_step']:.0f} cycles per training step", file=out)
    if r["retransmissions"]:
        print(f"  {r['retransmissions']} requests sent again (timeouts or corrupted exchanges)", file=out)
    if r.get("memory"):
        from tinytrain.codegen.memory import Breakdown

        print(Breakdown(**{k: r["memory"][k] for k in _BD_FIELDS}).table(), file=out)
    if args.json:
        print(json.dumps(r, sort_keys=True))
    return MISMATCH_EXIT if r["mismatches"] else 0


#: exit status of a verification that found a difference (1 stays an internal error)
MISMATCH_EXIT = 3
_BD_FIELDS = ("board", "ram", "flash", "ram_limit", "flash_limit", "stack_source", "flash_source",
              "layers", "stack_measured", "linked", "stack_reserved")


COMMANDS["verify"] = ("train simulator and target side by side, compare state hashes every step",
                      _verify_args, _verify_run)


# ------------------------------------------------------------------------------ emulate

def _emulate_args(p):
    p.add_argument("--board", required=True, help="emulated board (mps2_an385, mps2_an386, mps2_an500, mps2_an505, microbit)")
    p.add_argument("--firmware", required=True, help="ELF to run (e.g. from tinytrain build)")


def _emulate_run(args) -> int:
    from tinytrain.device.emulator import Emulator

    # SIGTERM/SIGHUP arrive as KeyboardInterrupt (tinytrain.cli): the context manager stops QEMU
    with Emulator(args.board, args.firmware) as emu:
        print(f"{args.board} running {args.firmware}: UART at {emu.url} "
              "(the guest starts when a client connects; Ctrl-C stops)", flush=True)
        try:
            while emu.proc is not None and emu.proc.poll() is None:
                time.sleep(0.2)
        except KeyboardInterrupt as exc:
            from tinytrain.cli import Terminated

            if isinstance(exc, Terminated):  # SIGTERM/SIGHUP: exit 128 + signal like the other commands
                raise
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
    _model_args(p, required=False)


def _flash_run(args) -> int:
    import subprocess

    from tinytrain.device.boards import get_board
    from tinytrain.device.pio_project import _missing_platform, platform_installed
    from tinytrain.device.toolchain import find_pio, pio_env

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

        from tinytrain.codegen.project import write_firmware_project

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
    from tinytrain import cli

    for name, (help, args_fn, run) in COMMANDS.items():
        cli.register(name, help, args_fn, _user_errors(run))


register_all()
