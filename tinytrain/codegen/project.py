"""The firmware project of a model: decide what fits the board (the same RAM/flash breakdown
the reports show), write the PlatformIO project (generated model + device glue + runtime +
port), build it. Above codegen.device (the glue) and codegen.memory (the breakdown).

    elf = build_firmware(model, "mps2_an386", "fw/")
"""
from __future__ import annotations

import re
import shutil
from pathlib import Path

from tinytrain.resources import FIRMWARE_INCLUDE, FIRMWARE_SRC
from tinytrain.codegen.device import device_source
from tinytrain.codegen.emit import Emitted, generate  # noqa: F401
from tinytrain.codegen.memory import breakdown, check_breakdown_fits

def memory_report(model, board=None, prefix: str = "tt_model", measure_stack: bool = True,
                  shadow: bool = True, fedcodec: bool = False, elf=None, stack_measured=None):
    """The RAM/flash breakdown of the model's firmware (tinytrain.codegen.memory.breakdown:
    the same figures in info, codegen, build and verify), with what the firmware adds on a
    device (load shadow, protocol buffers, with fedcodec the update codec). board=None: the
    default board, no fit check. With a board the total is checked against its RAM and flash
    (MemoryError). measure_stack=False skips the cross compilation (quick fit checks)."""

    bd = breakdown(model, board, prefix, shadow=shadow, fedcodec=fedcodec, link=measure_stack,
                   elf=elf, stack_measured=stack_measured)
    if board is not None:
        check_breakdown_fits(bd)
    return bd


def choose_shadow(model, board, prefix="tt_model") -> bool:
    """True if the board has RAM for the atomic-load shadow; False if only the model fits
    (MemoryError if not even that). Decided on the same breakdown the reports show (linked
    for the board when a cross compiler is there)."""
    try:
        memory_report(model, board, prefix, shadow=True)
        return True
    except MemoryError:
        memory_report(model, board, prefix, shadow=False)
        return False


def choose_fedcodec(model, board, prefix="tt_model", shadow: bool = True, residual_bits=True) -> bool:
    """True if the board has RAM for the on-device update codec beside the model (and shadow);
    residual_bits: its residual's width (True: the default, 32)."""
    try:
        memory_report(model, board, prefix, measure_stack=False, shadow=shadow, fedcodec=residual_bits)
        return True
    except MemoryError:
        return False


def write_sources(model, out_dir, prefix: str = "tt_model", shadow: bool = True,
                  fedcodec: bool = False) -> tuple[Emitted, list[Path]]:
    """Write the generated model and its device glue into `out_dir` (created)."""
    em = generate(model, prefix)
    out = Path(out_dir)
    files = em.write(out)
    glue = out / f"{prefix}_device.c"
    glue.write_text(device_source(model, em, shadow, fedcodec))
    return em, [*files, glue]


def _localize_ini(project: Path) -> None:
    """Point platformio.ini at the copies inside the project instead of the repository: the
    firmware headers live in include/ (on PlatformIO's path by default) and the linker script
    next to the copied port."""
    ini = project / "platformio.ini"
    text = ini.read_text()
    text = re.sub(r"^\s*-I'?" + re.escape(str(FIRMWARE_INCLUDE)) + r"'?\n", "", text, flags=re.M)

    def ldscript(m):
        p = Path(m.group(1))
        local = sorted((project / "src").glob(f"port_*/**/{p.name}"))
        return f"board_build.ldscript = {local[0].relative_to(project)}" if local else m.group(0)

    text = re.sub(r"^board_build\.ldscript = (.+)$", ldscript, text, flags=re.M)
    ini.write_text(text)


def write_firmware_project(model, board, out_dir, prefix: str = "tt_model",
                           build_flags=(), shadow: bool | str = "auto",
                           fedcodec: bool | str = False) -> Path:
    """Write the complete PlatformIO project (no build). Returns the project folder.
    shadow: "auto" keeps the atomic-load shadow when the board's RAM allows it; fedcodec
    (federation builds): True, or "auto" to include the on-device update codec if it fits too."""
    from tinytrain.device.pio_project import write_project

    out = Path(out_dir).resolve()
    gen = out / "generated"
    if gen.exists():
        shutil.rmtree(gen)
    if shadow == "auto":
        shadow = choose_shadow(model, board, prefix)
    if fedcodec == "auto":
        fedcodec = choose_fedcodec(model, board, prefix, bool(shadow))
    em, files = write_sources(model, gen, prefix, bool(shadow), bool(fedcodec))
    project = write_project(out, [board], sources=[*files, FIRMWARE_SRC], build_flags=build_flags)
    shutil.rmtree(gen)
    inc = project / "include"
    if inc.exists():
        shutil.rmtree(inc)
    shutil.copytree(FIRMWARE_INCLUDE, inc)
    _localize_ini(project)
    return project


def build_firmware(model, board, out_dir, prefix: str = "tt_model", *, build_flags=(),
                   verbose: bool = False, shadow: bool | str = "auto",
                   fedcodec: bool | str = False) -> Path:
    """Write and build the firmware of `model` for `board`; returns the ELF path.
    Raises tinytrain.device.pio_project.BuildError (with the compiler's errors) on failure."""
    from tinytrain.device.pio_project import build

    # fails early, with a clear message (MemoryError), if RAM is short
    project = write_firmware_project(model, board, out_dir, prefix, build_flags, shadow, fedcodec)
    return build(project, board, verbose=verbose)
