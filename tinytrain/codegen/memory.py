"""Memory of a generated model's firmware, and the cross-compilation checks that back it.

``breakdown(model, board)`` is the one RAM/flash figure every command shows (info, codegen,
build, verify, boards, the --plot pictures): RAM by role (RAM_ROLES) and flash (FLASH_ROLES),
with the firmware compiled and linked for the board as the PlatformIO build does
(``link_firmware``), so static RAM and flash are the linked sizes and the stack reserve comes
from gcc's -fstack-usage. ``report``/``compile_arm`` are the generated model's own buffers and
objects (no glue, protocol or port), and the proof that the training code is integer only (no
soft-float helper calls on Cortex-M0, no VFP instruction on Cortex-M4/M33 with hard float)."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tinytrain.device import cbuild
from tinytrain.codegen.emit import Emitted, generate

ARM_CC = "arm-none-eabi-gcc"
CPU_FLAGS = {
    "cortex-m0": ["-mcpu=cortex-m0", "-mthumb", "-mfloat-abi=soft"],
    "cortex-m0plus": ["-mcpu=cortex-m0plus", "-mthumb", "-mfloat-abi=soft"],
    "cortex-m3": ["-mcpu=cortex-m3", "-mthumb", "-mfloat-abi=soft"],
    "cortex-m4": ["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard"],
    "cortex-m7": ["-mcpu=cortex-m7", "-mthumb", "-mfpu=fpv5-d16", "-mfloat-abi=hard"],
    "cortex-m33": ["-mcpu=cortex-m33", "-mthumb", "-mfpu=fpv5-sp-d16", "-mfloat-abi=hard"],
}
FLOAT_HELPER = re.compile(r"__aeabi_(f|d)\w+|__(add|sub|mul|div)(s|d)f3|__float\w+|__fix\w+|__extend\w+|__trunc\w+")
VFP_INSN = re.compile(r"^\s*[0-9a-f]+:\s+(?:[0-9a-f]{4}\s?){1,2}\s+(v[a-z0-9.]+)", re.M)
RUNTIME_EXCLUDE = {"tt_protocol", "tt_cobs", "tt_device_main"}


class ToolchainMissing(RuntimeError):
    pass


@dataclass
class MemoryReport:
    by_role: dict
    ram_static: int
    stack_estimate: int
    flash_params: int
    flash_code: int | None = None
    details: list = field(default_factory=list)

    @property
    def ram_total(self) -> int:
        return self.ram_static + self.stack_estimate

    def as_dict(self) -> dict:
        return {"ram_total": self.ram_total, "ram_static": self.ram_static, "stack_estimate": self.stack_estimate,
                "flash_params": self.flash_params, "flash_code": self.flash_code, "by_role": self.by_role}

    def table(self) -> str:
        lines = [f"{'buffer role':18s} {'bytes':>8s}"]
        for role, b in self.by_role.items():
            lines.append(f"{role:18s} {b:8d}")
        lines.append(f"{'stack (estimate)':18s} {self.stack_estimate:8d}")
        lines.append(f"{'RAM total':18s} {self.ram_total:8d}")
        lines.append(f"{'flash: init data':18s} {self.flash_params:8d}")
        if self.flash_code is not None:
            lines.append(f"{'flash: code+const':18s} {self.flash_code:8d}")
        return "\n".join(lines)


ROLE_NAMES = {"frozen": "frozen params (flash)", "param": "parameters", "master": "master weights", "accum": "grad accumulators", "zero": "grad accumulators",
              "velocity": "momentum", "mask": "pruning masks", "meta": "prng/step", "activation": "saved activations",
              "error": "error buffers", "grad": "gradient scratch", "scratch": "kernel scratch"}

#: stack used by a train step when no cross compiler is available to measure it (bytes)
DEFAULT_STACK = 256


def report(em: Emitted, cpu: str | None = "cortex-m4") -> MemoryReport:
    by = {}
    for t in em.tensors:
        if t.role == "frozen":
            continue
        by[ROLE_NAMES[t.role]] = by.get(ROLE_NAMES[t.role], 0) + t.bytes
    ram = sum(by.values()) + 4  # + tt_stats
    stack, code = DEFAULT_STACK, None
    if cpu and shutil.which(ARM_CC):
        objs = compile_arm(em, cpu, stack_usage=True)
        stack = objs["stack"]
        code = objs["text"]
    return MemoryReport(by, ram, stack, em.flash_const_bytes, code, em.tensors)


def _sources(em: Emitted, d: Path):
    (d / f"{em.prefix}.c").write_text(em.source)
    (d / f"{em.prefix}.h").write_text(em.header)
    srcs = [p for p in sorted(cbuild.FIRMWARE_SRC.glob("tt_*.c")) if p.stem not in RUNTIME_EXCLUDE]
    return [d / f"{em.prefix}.c", *srcs]


def compile_arm(em: Emitted, cpu: str, stack_usage=False, keep: Path | None = None) -> dict:
    """Compile the model and runtime for ``cpu`` to objects. Returns sizes, undefined
    symbols, the disassembly and a stack estimate. The objects stay in `keep` if given; else
    they are built in a temporary folder that is removed."""
    if shutil.which(ARM_CC) is None:
        raise ToolchainMissing(f"{ARM_CC} not found: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi")
    if keep is not None:
        Path(keep).mkdir(parents=True, exist_ok=True)
        return _compile_arm_in(em, cpu, stack_usage, Path(keep))
    with tempfile.TemporaryDirectory(prefix="tt-arm-") as d:
        return _compile_arm_in(em, cpu, stack_usage, Path(d))


def _compile_arm_in(em: Emitted, cpu: str, stack_usage: bool, d: Path) -> dict:
    srcs = _sources(em, d)
    flags = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-ffunction-sections", "-fdata-sections",
             *CPU_FLAGS[cpu], f"-I{cbuild.FIRMWARE_INCLUDE}", f"-I{d}"]
    if stack_usage:
        flags.append("-fstack-usage")
    objs = []
    for s in srcs:
        o = d / (Path(s).stem + ".o")
        r = subprocess.run([ARM_CC, *flags, "-c", str(s), "-o", str(o)], capture_output=True, text=True, cwd=d)
        if r.returncode:
            raise cbuild.BuildError(f"{ARM_CC} failed on {s}:\n{r.stderr}")
        objs.append(o)
    und = set()
    for o in objs:
        r = subprocess.run(["arm-none-eabi-nm", "-u", str(o)], capture_output=True, text=True)
        und |= {ln.split()[-1] for ln in r.stdout.splitlines() if ln.strip()}
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", *map(str, objs)], capture_output=True, text=True).stdout
    text = data = bss = 0
    model_bss = model_data = 0
    for o in objs:
        r = subprocess.run(["arm-none-eabi-size", "-A", str(o)], capture_output=True, text=True).stdout
        for ln in r.splitlines():
            parts = ln.split()
            if len(parts) >= 2 and parts[1].isdigit():
                sec, size = parts[0], int(parts[1])
                if sec.startswith((".text", ".rodata")):
                    text += size
                elif sec.startswith(".data"):
                    data += size
                    if o.stem == em.prefix:
                        model_data += size
                elif sec.startswith(".bss"):
                    bss += size
                    if o.stem == em.prefix:
                        model_bss += size
    stack = stack_estimate(d, em.prefix) if stack_usage else DEFAULT_STACK
    return {"undefined": und, "disasm": dis, "text": text, "data": data, "bss": bss,
            "model_ram": model_bss + model_data, "stack": stack}


def stack_estimate(d: Path, prefix: str) -> int:
    """Stack bound from gcc -fstack-usage files (*.su) in `d`: the train step's frame, twice the
    deepest runtime kernel frame (a kernel and its leaf helpers) and a 64 B interrupt margin."""
    frames = {}
    for su in d.glob("*.su"):
        for ln in su.read_text().splitlines():
            m = re.match(r".*:(\w+)\s+(\d+)\s+(\w+)", ln)
            if m:
                frames[m.group(1)] = int(m.group(2))
    step = frames.get(f"{prefix}_train_step", 0)
    deepest_kernel = max((v for k, v in frames.items() if k.startswith("tt_")), default=0)
    return step + 2 * deepest_kernel + 64


def float_symbols(undefined) -> list[str]:
    return sorted(s for s in undefined if FLOAT_HELPER.fullmatch(s) or FLOAT_HELPER.match(s))


def vfp_instructions(disasm: str) -> list[str]:
    return sorted({m.group(1) for m in VFP_INSN.finditer(disasm)})


def _too_big(need: str, ram_by_role: dict) -> str:
    """The one message for a model that does not fit: what it needs, its three largest RAM
    parts, and the ways to shrink it."""
    biggest = sorted(ram_by_role.items(), key=lambda kv: -kv[1])[:3]
    hint = ", ".join(f"{k} {v} B" for k, v in biggest)
    return (f"the model needs {need}: the largest RAM parts are {hint}. Shrink the model (fewer "
            f"units/filters), train only the last layers (SGD(train='last:1')) or drop momentum/batch "
            f"accumulation, or pick a larger board (tinytrain boards --model M).")


# ------------------------------------------------------------------ the one RAM/flash breakdown

#: RAM roles, in the order every report and plot shows them
RAM_ROLES = ("parameters", "optimizer state", "activations", "scratch", "protocol", "update codec",
             "shadow", "stack")
#: flash roles: initial values of parameters (.data load image) and frozen (const) weights;
#: code = machine code, tables and constants of model, runtime, protocol and board port
FLASH_ROLES = ("parameters", "code")
#: emitted tensor role -> breakdown role
TENSOR_ROLE = {"param": "parameters", "master": "parameters", "accum": "optimizer state", "zero": "optimizer state",
               "velocity": "optimizer state", "mask": "optimizer state", "meta": "optimizer state", "activation": "activations",
               "error": "activations", "grad": "scratch", "scratch": "scratch"}
#: the generated model's saturation counters (tt_stats), counted as scratch
STATS_BYTES = 4


@dataclass
class Breakdown:
    """Device RAM and flash of a model's training firmware by role: the one figure behind
    ``info``, ``codegen``, ``build``, ``verify`` and the plots (tinytrain.codegen.memory.breakdown).

    ram: RAM_ROLES -> bytes. Static roles come from the generated buffers; with a cross compiler
    the firmware is compiled and linked for the board (same flags and linker script as the
    PlatformIO build) and "protocol" is the rest of the linked .data + .bss (protocol state,
    device loop, port, libc), so ram_static equals the linked ELF's. "stack" is the reserve from
    gcc -fstack-usage (or DEFAULT_STACK without a cross compiler); a device's measured peak is
    kept apart in stack_measured so every command shows the same totals.
    flash: FLASH_ROLES -> bytes; code is None without a cross compiler."""

    board: str
    ram: dict
    flash: dict
    ram_limit: int
    flash_limit: int
    stack_source: str
    flash_source: str
    layers: list = field(default_factory=list)
    stack_measured: int | None = None
    linked: dict | None = None
    stack_reserved: int | None = None

    @property
    def ram_static(self) -> int:
        return sum(v for k, v in self.ram.items() if k != "stack")

    @property
    def ram_needed(self) -> int:
        """What the link takes from the board's RAM: the static RAM and the stack the port's link
        script reserves when that is more than the estimate (the micro:bit's 2 KiB); what fits()
        and the fit checks compare with the board, so they agree with the linker."""
        return self.ram_static + max(self.ram["stack"], self.stack_reserved or 0)

    @property
    def ram_total(self) -> int:
        return sum(self.ram.values())

    @property
    def flash_total(self) -> int | None:
        return None if self.flash["code"] is None else sum(self.flash.values())

    def fits(self) -> dict:
        return {"ram": self.ram_needed <= self.ram_limit,
                "flash": None if self.flash_total is None else self.flash_total <= self.flash_limit}

    def as_dict(self) -> dict:
        return {"board": self.board, "ram": dict(self.ram), "ram_static": self.ram_static,
                "ram_total": self.ram_total, "ram_limit": self.ram_limit, "flash": dict(self.flash),
                "flash_total": self.flash_total, "flash_limit": self.flash_limit,
                "stack_source": self.stack_source, "stack_measured": self.stack_measured,
                "flash_source": self.flash_source, "fits": self.fits(), "layers": self.layers,
                "linked": self.linked, "stack_reserved": self.stack_reserved, "ram_needed": self.ram_needed}

    def table(self) -> str:
        def pct(v, lim):
            return f"{100 * v / lim:5.1f} %" if lim else ""

        lines = [f"memory on {self.board} (one breakdown: info, codegen, build and verify agree)",
                 f"  {'RAM role':18s} {'bytes':>8s}"]
        for role in RAM_ROLES:
            if self.ram.get(role):
                note = f"  ({self.stack_source})" if role == "stack" else ""
                lines.append(f"  {role:18s} {self.ram[role]:8d}{note}")
        lines.append(f"  {'RAM total':18s} {self.ram_total:8d}  {pct(self.ram_total, self.ram_limit)} of "
                     f"{self.ram_limit} B (static {self.ram_static} B + stack)")
        if self.ram_total < self.ram_needed > self.ram_limit:  # only where the reserve decides the fit
            lines.append(f"  {'RAM linked':18s} {self.ram_needed:8d}  {pct(self.ram_needed, self.ram_limit)} of "
                         f"{self.ram_limit} B: the link script reserves {self.stack_reserved} B of stack, more "
                         "than the estimate; the fit is judged on this")
        if self.stack_measured is not None:
            lines.append(f"  {'stack measured':18s} {self.stack_measured:8d}  (peak on the device; "
                         f"reserve {self.ram['stack']} B)")
        lines.append(f"  {'flash: parameters':18s} {self.flash['parameters']:8d}")
        if self.flash["code"] is not None:
            lines.append(f"  {'flash: code':18s} {self.flash['code']:8d}")
            lines.append(f"  {'flash total':18s} {self.flash_total:8d}  "
                         f"{pct(self.flash_total, self.flash_limit)} of {self.flash_limit} B ({self.flash_source})")
        else:
            lines.append(f"  flash code: unknown ({self.flash_source})")
        stored = [t for r in self.layers for t in r.get("tensors", ())]
        if stored:
            lines.append("  stored tensors: " + ", ".join(f"{t['name']} {t['bytes']} B ({t['count']} x {t['ctype']})"
                                                         for t in stored))
        if self.linked:
            lines.append(f"  linked ELF: flash {self.linked['flash_bytes']} B, static RAM "
                         f"{self.linked['ram_bytes']} B")
        return "\n".join(lines)


def _layer_rows(model, em: Emitted) -> list[dict]:
    rows = []
    for li, l in enumerate(model.layers):
        ts = [t for t in em.tensors if t.layer == li]
        ram = sum(t.bytes for t in ts if t.role != "frozen")
        flash = sum(t.bytes for t in ts if t.role == "frozen" or (t.init is not None and t.init.any()))
        rows.append({"layer": li, "kind": l.kind, "ram": int(ram), "flash": int(flash), "macs": int(l.macs()),
                     "tensors": _tensor_rows(model, li, ts)})
    return rows


#: the stored tensors of a layer whose width a precision policy chooses
_STORED = ("param", "frozen", "master", "velocity")


def _tensor_rows(model, li, ts) -> list[dict]:
    """What each stored tensor of layer li costs under its policy: C type, elements, bytes (an
    int4 weight tensor: packed bytes; its block exponents: one uint8 per block)."""
    out = []
    for t in ts:
        if t.role in _STORED:
            out.append({"name": t.name, "role": t.role, "ctype": t.ctype, "count": int(t.count), "bytes": int(t.bytes)})
    return out


def flash_parameters(em: Emitted) -> int:
    """Flash taken by parameter values: frozen (const) tensors and the load image of the
    initialised (.data) ones; zero-initialised buffers (biases, accumulators) are .bss."""
    return int(sum(t.bytes for t in em.tensors
                   if t.role == "frozen" or (t.init is not None and np.asarray(t.init).any())))


_LINK_CACHE: dict = {}
_LINK_VERSION = "2\0"  # bumped when the cached link figures change meaning (2: ``overflow``)
_ELVES: list = []


def _elves() -> Path:
    """This process's folder of linked ELFs (removed at exit)."""
    if not _ELVES:
        _ELVES.append(tempfile.TemporaryDirectory(prefix="tt-elves-"))
    return Path(_ELVES[0].name)


def _object_dir(root: Path, flags, runtime_sources, board) -> Path:
    """Where link_firmware keeps the runtime's and the port's objects (and their -fstack-usage
    files) between links: they do not depend on the model, only on the runtime and port files, the
    flags and the compiler, so a sweep over many variants compiles them once per board, not once
    per variant (the generated model and its glue are compiled every time)."""
    import hashlib

    h = hashlib.sha256(("\0".join([ARM_CC, _cc_version(), *flags])).encode())
    for f in [*runtime_sources, *sorted(cbuild.FIRMWARE_INCLUDE.glob("*.h")), *sorted(board.port_dir.glob("*")),
              *sorted((board.port_dir.parent / "common").glob("*"))]:
        h.update(str(Path(f).name).encode() + b"\0" + Path(f).read_bytes())
    return root / "objects" / f"{board.cpu}-{h.hexdigest()[:20]}"


_CC_VERSION: list = []


def _cc_version() -> str:
    if not _CC_VERSION:
        r = subprocess.run([ARM_CC, "--version"], capture_output=True, text=True)
        _CC_VERSION.append(r.stdout.splitlines()[0] if r.stdout else "")
    return _CC_VERSION[0]


def _keep(src: Path, dst: Path) -> None:
    """Copy src to dst atomically (another process may be writing the same object); a cache,
    so an unwritable one is skipped."""
    try:
        dst.parent.mkdir(parents=True, exist_ok=True)
        tmp = dst.with_name(f"{dst.name}.{os.getpid()}.{id(src)}.tmp")
        shutil.copyfile(src, tmp)
        os.replace(tmp, dst)
    except OSError:
        pass


def _link_flags(board) -> list[str]:
    """The code flags of link_firmware's compiles (without the -I of the link's own folder)."""
    return ["-std=c99", "-O2", "-ffunction-sections", "-fdata-sections", "-fstack-usage",
            *CPU_FLAGS[board.cpu], f"-DTT_BOARD_{board.pio_board.upper()}=1",
            f'-DTT_BOARD_NAME="{board.name}"', f"-I{cbuild.FIRMWARE_INCLUDE}"]


def _runtime_sources(board, root: Path) -> tuple[Path, list[Path]]:
    """(the object cache folder, the runtime's and the bare-metal port's sources) of board."""
    from tinytrain.resources import FIRMWARE_SRC as SRC

    srcs = sorted(SRC.glob("tt_*.c"))
    if board.port != "arduino":
        srcs += sorted(board.port_dir.glob("*.c")) + sorted((board.port_dir.parent / "common").glob("*.c"))
    return _object_dir(root, _link_flags(board), srcs, board), srcs


def _compile_all(srcs: list, d: Path, flags: list, runtime: Path, fresh: set) -> list[str]:
    """The objects of srcs, in their order, compiled in d on every core (largest source first, so
    the long compiles do not end the pool alone); a source not in ``fresh`` is taken from, or kept
    in, the object cache ``runtime``."""
    from concurrent.futures import ThreadPoolExecutor

    def cc(s):
        o = d / (Path(s).stem + ".o")
        kept = runtime / o.name if s not in fresh else None
        if kept is not None and kept.is_file() and kept.with_suffix(".su").is_file():
            shutil.copyfile(kept.with_suffix(".su"), o.with_suffix(".su"))  # for stack_estimate
            return str(kept)
        r = subprocess.run([ARM_CC, *flags, "-c", str(s), "-o", str(o)], capture_output=True, text=True, cwd=d)
        if r.returncode:
            raise cbuild.BuildError(f"{ARM_CC} failed on {s}:\n{r.stderr}")
        if kept is not None:
            _keep(o.with_suffix(".su"), kept.with_suffix(".su"))
            _keep(o, kept)  # last: an object is only used beside its .su
        return str(o)

    order = sorted(range(len(srcs)), key=lambda i: -Path(srcs[i]).stat().st_size)
    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        done = dict(zip(order, pool.map(cc, [srcs[i] for i in order])))
    return [done[i] for i in range(len(srcs))]


def prepare_runtime(board) -> None:
    """Compile `board`'s runtime and port objects into the object cache of link_firmware (every
    core), so that the links that follow (a sweep's, in several processes) all find them instead
    of each compiling them or waiting for one that does. Arduino ports: nothing to prepare."""
    from tinytrain.device.boards import get_board

    board = get_board(board) if isinstance(board, str) else board
    root = Path(os.environ.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain"))
    runtime, srcs = _runtime_sources(board, root)
    if all((runtime / (s.stem + ".o")).is_file() and (runtime / (s.stem + ".su")).is_file() for s in srcs):
        return
    d = Path(tempfile.mkdtemp(prefix="tt-objects-"))
    try:
        _compile_all(srcs, d, _link_flags(board), runtime, set())
    finally:
        shutil.rmtree(d, ignore_errors=True)


def link_firmware(em: Emitted, glue: str, board, keep=None) -> dict:
    """Compile and link the firmware as the PlatformIO build does (same sources, compiler, code
    flags -O2 -ffunction-sections -fdata-sections, --gc-sections, newlib-nano, the port's linker
    script), without PlatformIO. Returns firmware_sizes-style figures plus the -fstack-usage stack
    estimate and ``overflow``: the linker's "region ... overflowed by N bytes" line, or None.
    Cached per (sources, board) in the process and in TINYTRAIN_CACHE. Arduino ports: linked
    without the Arduino core (its code is not counted).
    keep: a path to write the linked ELF to (bare-metal ports), a firmware that runs: it differs
    from PlatformIO's only by the order of the functions in flash and the debug sections
    (device_cost(build="direct"), which sweeps use, runs it in QEMU)."""
    import hashlib

    from tinytrain.resources import FIRMWARE_SRC as SRC

    import json

    h = hashlib.sha256((_LINK_VERSION + em.header + em.source + glue + board.name + " ".join(CPU_FLAGS[board.cpu])).encode())
    for f in [*sorted(SRC.glob("tt_*.c")), *sorted(cbuild.FIRMWARE_INCLUDE.glob("*.h")),
              *sorted(board.port_dir.glob("*")), *sorted((board.port_dir.parent / "common").glob("*"))]:
        h.update(f.read_bytes())  # everything compiled into the link below
    key = h.hexdigest()[:20]
    cache = Path(os.environ.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain")) / "link" / f"{key}.json"
    if keep is not None and board.port == "arduino":
        raise ValueError(f"link_firmware(keep=...): {board.name}'s link leaves out the Arduino core; build it with PlatformIO")
    linked = _elves().joinpath(f"{key}.elf")
    if key in _LINK_CACHE and (keep is None or linked.is_file()):
        if keep is not None:
            shutil.copyfile(linked, keep)
        return _LINK_CACHE[key]
    if keep is None and cache.is_file() and not os.environ.get("TINYTRAIN_KEEP_LINK"):
        _LINK_CACHE[key] = json.loads(cache.read_text())
        return _LINK_CACHE[key]
    d = Path(tempfile.mkdtemp(prefix="tt-link-"))
    try:
        (d / f"{em.prefix}.c").write_text(em.source)
        (d / f"{em.prefix}.h").write_text(em.header)
        (d / f"{em.prefix}_device.c").write_text(glue)
        srcs = [d / f"{em.prefix}.c", d / f"{em.prefix}_device.c"]
        flags = [*_link_flags(board), f"-I{d}"]
        runtime, rsrcs = _runtime_sources(board, cache.parent.parent)
        objs = _compile_all([*srcs, *rsrcs], d, flags, runtime, set(srcs))
        elf = d / "firmware.elf"
        bare = board.port != "arduino"
        link = [ARM_CC, *CPU_FLAGS[board.cpu], "-Wl,--gc-sections", "--specs=nano.specs", "--specs=nosys.specs"]
        if bare:
            link += [f"-L{board.port_dir}", f"-T{board.port_dir / board.ldscript}",
                     "-Wl,--noinhibit-exec"]  # an overflowing RAM is reported by the breakdown
        else:
            link += ["-Wl,--unresolved-symbols=ignore-all", "-Wl,-e,main"]
        r = subprocess.run([*link, *objs, "-o", str(elf), "-lc", "-lgcc", "-lnosys"], capture_output=True,
                           text=True, cwd=d)
        if r.returncode:
            raise cbuild.BuildError(f"linking the firmware failed:\n{r.stderr}")

        out = dict(firmware_sizes(elf))
        from tinytrain.device.pio_project import OVERFLOW

        over = OVERFLOW.search(r.stderr)
        out["overflow"] = over.group(0) if over else None
        if os.environ.get("TINYTRAIN_KEEP_LINK"):
            shutil.copy(elf, os.environ["TINYTRAIN_KEEP_LINK"])
        if bare:  # this process's links, for keep= (a sweep asks for its variant's ELF right after)
            shutil.copyfile(elf, linked)
            if keep is not None:
                shutil.copyfile(elf, keep)
        out["stack"] = stack_estimate(d, em.prefix)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    _LINK_CACHE[key] = out
    try:  # a cache: a read-only home only costs the next run its link
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(out))
        os.replace(tmp, cache)
    except OSError:
        pass
    return out


def breakdown(model, board=None, prefix: str = "tt_model", *, shadow: bool = True,
              fedcodec: bool = False, link: bool = True, elf=None, stack_measured=None) -> Breakdown:
    """The RAM/flash breakdown of `model`'s training firmware on `board` (default: the default
    board). link=False skips the cross compilation (quick fit checks: stack DEFAULT_STACK,
    protocol PROTOCOL_RAM, flash code unknown). elf: a built firmware whose linked sizes are
    recorded beside the figures (``linked``); stack_measured: a device's peak stack reading."""
    from tinytrain.device.boards import default_board, get_board
    from tinytrain.codegen.device import PROTOCOL_RAM, device_source, fedcodec_bytes, state_bytes
    b = get_board(board) if board is not None else default_board()
    em = generate(model, prefix)
    ram = dict.fromkeys(RAM_ROLES, 0)
    for t in em.tensors:
        if t.role != "frozen":
            ram[TENSOR_ROLE[t.role]] += t.bytes
    ram["scratch"] += STATS_BYTES
    ram["protocol"] = PROTOCOL_RAM
    # fedcodec True: the default residual width; an int: that width (64, 32 or 16 bits)
    ram["update codec"] = (fedcodec_bytes(model) if fedcodec is True else fedcodec_bytes(model, int(fedcodec))) \
        if fedcodec else 0
    ram["shadow"] = state_bytes(model) if shadow else 0
    ram["stack"] = DEFAULT_STACK
    flash = {"parameters": flash_parameters(em), "code": None}
    stack_source, flash_source = "reserved default, no cross compiler", "no cross compiler"
    if link and shutil.which(ARM_CC) and b.cpu in CPU_FLAGS:
        sz = link_firmware(em, device_source(model, em, shadow, fedcodec), b)
        rest = sz["ram_bytes"] - sum(v for k, v in ram.items() if k not in ("protocol", "stack"))
        if rest >= 0:
            ram["protocol"] = rest
        ram["stack"] = sz["stack"]
        flash["code"] = max(0, sz["flash_bytes"] - flash["parameters"])
        stack_source = "estimate from gcc -fstack-usage"
        flash_source = ("linked for the board" if b.port != "arduino"
                        else "linked without the Arduino core")
    linked = None
    if elf is not None:

        linked = firmware_sizes(elf) or None
    return Breakdown(b.name, ram, flash, int(b.ram), int(b.flash), stack_source, flash_source,
                     _layer_rows(model, em), stack_measured, linked, stack_reserve(b))


def stack_reserve(board) -> int | None:
    """The stack the board's link script sets aside (``__stack_size``; the link fails when static
    RAM and it do not fit), or None (an Arduino core's link, no such reserve)."""
    if board.port == "arduino":
        return None
    try:
        text = (board.port_dir / board.ldscript).read_text()
    except (OSError, KeyError, ValueError):
        return None
    m = re.search(r"__stack_size\s*=\s*(0x[0-9a-fA-F]+|\d+)\s*;", text)
    return int(m.group(1), 0) if m else None


def check_breakdown_fits(bd: Breakdown) -> None:
    """MemoryError naming the largest parts if the firmware does not fit its board."""
    parts = []
    if bd.ram_needed > bd.ram_limit:
        parts.append(f"{bd.ram_needed} bytes of RAM to train but {bd.board} has {bd.ram_limit}"
                     + (f" (static {bd.ram_static} B and the {bd.stack_reserved} B of stack its link script reserves)"
                        if bd.ram_needed > bd.ram_total else ""))
    if bd.flash_total is not None and bd.flash_total > bd.flash_limit:
        parts.append(f"{bd.flash_total} bytes of flash but {bd.board} has {bd.flash_limit}")
    if not parts:
        return
    raise MemoryError(_too_big(" and ".join(parts), bd.ram))


def firmware_sizes(elf) -> dict:
    """flash = .isr_vector + .text + .ARM.exidx + .data (load image); ram = .data + .bss
    (static; the reserved .stack is reported apart) from ``arm-none-eabi-size -A``."""
    import shutil
    import subprocess

    exe = shutil.which("arm-none-eabi-size")
    if exe is None:
        return {}
    out = subprocess.run([exe, "-A", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    sec = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(".") and parts[1].isdigit():
            sec[parts[0]] = int(parts[1])
    flash = sum(sec.get(k, 0) for k in (".isr_vector", ".text", ".rodata", ".ARM.exidx", ".data"))
    return {"flash_bytes": flash, "ram_bytes": sec.get(".data", 0) + sec.get(".bss", 0),
            "stack_reserved_bytes": sec.get(".stack", 0)}


def memory_estimate(model, board=None) -> dict:
    """Bytes a device needs to train this model on `board` (default: the default board):
    the model's own buffers (ram_* keys, from the code generator's memory plan; frozen
    parameters are const data in flash) and, under "breakdown", the whole firmware's RAM and
    flash by role (tinytrain.codegen.memory.breakdown, as codegen, build and verify report it);
    ram_total is that breakdown's total."""
    em = generate(model)
    bd = breakdown(model, board)
    by_role = {}
    for t in em.tensors:
        by_role[t.role] = by_role.get(t.role, 0) + t.bytes
    return {"flash_frozen_params": by_role.get("frozen", 0), "ram_trainable_params": by_role.get("param", 0),
            "ram_master_weights": by_role.get("master", 0),
            "ram_optimizer_buffers": by_role.get("accum", 0) + by_role.get("velocity", 0),
            "ram_gradients": by_role.get("grad", 0), "ram_activations_kept": by_role.get("activation", 0),
            "ram_error_buffers": by_role.get("error", 0), "ram_scratch": by_role.get("scratch", 0),
            "ram_meta": by_role.get("meta", 0), "ram_stack_estimate": bd.ram["stack"],
            "ram_total": bd.ram_total, "flash_total": bd.flash_total, "breakdown": bd.as_dict()}
