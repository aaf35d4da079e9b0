"""The registry of build targets (``tinytrain/device/boards/targets.json``): emulated MPS2 boards and real boards.

    >>> b = get_board("mps2_an386"); b.cpu, b.ram, b.is_emulated
    ('cortex-m4', 4194304, True)
    >>> default_board().name
    'mps2_an386'
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from tinytrain.resources import PORTS_DIR, QEMU_PLATFORM_DIR, TARGETS_JSON

__all__ = ["Board", "BoardError", "TARGETS_JSON", "QEMU_PLATFORM_DIR", "PORTS_DIR",
           "load_boards", "get_board", "default_board", "board_names"]

CPUS = ("cortex-m0", "cortex-m0plus", "cortex-m3", "cortex-m4", "cortex-m7", "cortex-m33")


class BoardError(KeyError, ValueError):
    """Unknown board name or malformed registry entry."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


def qemu_platform_version() -> str:
    return json.loads((QEMU_PLATFORM_DIR / "platform.json").read_text())["version"]


@dataclass(frozen=True)
class Board:
    name: str
    description: str
    cpu: str                 # one of CPUS
    fpu: str                 # "none", "fpv4-sp-d16", "fpv5-d16", "fpv5-sp-d16"
    ram: int                 # bytes
    flash: int               # bytes
    port: str                # folder under tinytrain/firmware/ports/
    uart: dict               # peripheral, pins / host side, baud
    cycles: dict             # unit ("instructions" / "cpu cycles" / "none"), resolution
    pio_platform: str        # PlatformIO platform name (qemu-cortexm, ststm32, ...)
    pio_board: str           # PlatformIO board id
    pio_framework: str | None = None
    qemu_machine: str | None = None   # set for emulated boards
    raw: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def is_emulated(self) -> bool:
        return self.qemu_machine is not None

    @property
    def port_dir(self) -> Path:
        return PORTS_DIR / self.port

    @property
    def platform_spec(self) -> str:
        """Value of ``platform =`` in platformio.ini, pinned to a version: the offline platform
        for emulated boards (installed into PlatformIO's own folder by ``toolchain setup``, so a
        generated project names no path and can move), the official platform at the version
        tinytrain is written against for real boards, or a platform's git URL when it is not in
        PlatformIO's registry."""
        if self.pio_platform == "qemu-cortexm":
            return f"qemu-cortexm@{qemu_platform_version()}"
        pio = self.raw.get("pio", {})
        if "platform_url" in pio:
            return pio["platform_url"]
        return f"{self.pio_platform}@{pio['platform_version']}" if "platform_version" in pio else self.pio_platform

    @property
    def ldscript(self) -> str:
        """Linker script file name in the port folder: the one the offline platform's board
        manifest names for emulated boards (a port may serve several memory maps), else
        ``<port>.ld``."""
        if self.pio_platform == "qemu-cortexm":
            manifest = QEMU_PLATFORM_DIR / "boards" / f"{self.pio_board}.json"
            return json.loads(manifest.read_text())["build"]["ldscript"]
        return self.port + ".ld"

    @property
    def cycles_resolution(self) -> int:
        return int(self.cycles.get("resolution", 0))


def _parse(entry: dict) -> Board:
    try:
        emulated = entry.get("emulated") or {}
        pio = entry["pio"]
        board = Board(
            name=entry["name"], description=entry.get("description", ""), cpu=entry["cpu"],
            fpu=entry.get("fpu", "none"), ram=int(entry["ram"]), flash=int(entry["flash"]),
            port=entry["port"], uart=dict(entry.get("uart", {})), cycles=dict(entry.get("cycles", {})),
            pio_platform=pio["platform"], pio_board=pio["board"], pio_framework=pio.get("framework"),
            qemu_machine=emulated.get("qemu_machine"), raw=entry,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BoardError(f"{TARGETS_JSON}: bad entry {entry.get('name', entry)!r}: {exc!r}") from exc
    if board.cpu not in CPUS:
        raise BoardError(f"{TARGETS_JSON}: {board.name}: cpu {board.cpu!r} not one of {CPUS}")
    return board


@lru_cache(maxsize=None)
def _load(path: str) -> tuple[dict[str, Board], str]:
    data = json.loads(Path(path).read_text())
    boards = {}
    for entry in data["targets"]:
        b = _parse(entry)
        if b.name in boards:
            raise BoardError(f"{path}: board {b.name!r} listed twice")
        boards[b.name] = b
    default = data.get("default", "")
    if default not in boards:
        raise BoardError(f"{path}: default board {default!r} is not in the registry")
    return boards, default


def load_boards(path: Path | str = TARGETS_JSON) -> dict[str, Board]:
    """All targets by name, in registry order."""
    return dict(_load(str(path))[0])


def board_names() -> list[str]:
    return list(load_boards())


def get_board(name: str | Board) -> Board:
    """The target called `name`; :class:`BoardError` listing the valid names otherwise."""
    if isinstance(name, Board):
        return name
    boards = load_boards()
    try:
        return boards[name]
    except KeyError:
        emu = [n for n, b in boards.items() if b.is_emulated]
        real = [n for n, b in boards.items() if not b.is_emulated]
        raise BoardError(
            f"unknown board {name!r}; emulated: {', '.join(emu)}; real: {', '.join(real)}"
        ) from None


def default_board() -> Board:
    """The target used when no board is named: an emulated one, so nothing needs hardware."""
    boards, default = _load(str(TARGETS_JSON))
    return boards[default]
