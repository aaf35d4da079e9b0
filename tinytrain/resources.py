"""Where the files that ship inside the package are: the C runtime, the board registry and the
offline PlatformIO platform. Found through importlib.resources, so an installed wheel and a
source checkout look the same.

    tinytrain/firmware/include, src    the C runtime (also a PlatformIO / Arduino library)
    tinytrain/firmware/ports/<port>    board ports (startup, UART, cycle counter)
    tinytrain/firmware/apps/           small firmware apps (echo: link and counter checks)
    tinytrain/device/boards/targets.json      the board registry
    tinytrain/device/boards/platform-qemu-cortexm   the offline PlatformIO platform for QEMU boards

The compilers need real paths, so the package must be installed as files (a wheel, an sdist
or a checkout; not a zip import): ``PACKAGE`` is checked to be a folder.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

PACKAGE = Path(str(files("tinytrain")))
if not (PACKAGE / "firmware" / "include").is_dir():  # pragma: no cover - a broken install
    raise ImportError(f"tinytrain's C runtime is missing from {PACKAGE}: reinstall the package "
                      "(pip install --force-reinstall tinytrain-mcu)")

FIRMWARE = PACKAGE / "firmware"
FIRMWARE_INCLUDE = FIRMWARE / "include"
FIRMWARE_SRC = FIRMWARE / "src"
PORTS_DIR = FIRMWARE / "ports"
APPS_DIR = FIRMWARE / "apps"
BOARDS_DIR = PACKAGE / "device" / "boards"
TARGETS_JSON = BOARDS_DIR / "targets.json"
QEMU_PLATFORM_DIR = BOARDS_DIR / "platform-qemu-cortexm"
