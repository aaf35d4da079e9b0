"""Memory report of a generated model, and the cross-compilation checks that back it:
exact static RAM by role, a stack estimate from gcc's -fstack-usage, flash from the object
sizes, and the proof that the training code is integer only (no soft-float helper calls on
Cortex-M0, no VFP instruction on Cortex-M4/M33 with hard float)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .. import cbuild
from .emit import Emitted

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


ROLE_NAMES = {"frozen": "frozen params (flash)", "param": "parameters", "master": "master weights", "accum": "grad accumulators",
              "velocity": "momentum", "meta": "prng/step", "activation": "saved activations",
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
    symbols, the disassembly and a stack estimate."""
    if shutil.which(ARM_CC) is None:
        raise ToolchainMissing(f"{ARM_CC} not found: apt-get install gcc-arm-none-eabi libnewlib-arm-none-eabi")
    d = Path(keep or tempfile.mkdtemp(prefix="tt-arm-"))
    d.mkdir(parents=True, exist_ok=True)
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
    stack = DEFAULT_STACK
    if stack_usage:
        frames = {}
        for su in d.glob("*.su"):
            for ln in su.read_text().splitlines():
                m = re.match(r".*:(\w+)\s+(\d+)\s+(\w+)", ln)
                if m:
                    frames[m.group(1)] = int(m.group(2))
        step = frames.get(f"{em.prefix}_train_step", 0)
        deepest_kernel = max((v for k, v in frames.items() if k.startswith("tt_")), default=0)
        stack = step + 2 * deepest_kernel + 64  # step frame + kernel + its leaf helpers + ISR margin
    return {"undefined": und, "disasm": dis, "text": text, "data": data, "bss": bss,
            "model_ram": model_bss + model_data, "stack": stack, "dir": d}


def float_symbols(undefined) -> list[str]:
    return sorted(s for s in undefined if FLOAT_HELPER.fullmatch(s) or FLOAT_HELPER.match(s))


def vfp_instructions(disasm: str) -> list[str]:
    return sorted({m.group(1) for m in VFP_INSN.finditer(disasm)})


def check_fits(rep: MemoryReport, board) -> None:
    """Raise a clear error if the model's training RAM does not fit the board."""
    if rep.ram_total <= board.ram:
        return
    biggest = sorted(rep.by_role.items(), key=lambda kv: -kv[1])[:3]
    hint = ", ".join(f"{k} {v} B" for k, v in biggest)
    raise MemoryError(
        f"the model needs {rep.ram_total} bytes of RAM to train but {board.name} has {board.ram}: "
        f"the largest parts are {hint}. Shrink the model (fewer units/filters), train only the last "
        f"layers (SGD(train='last:1')) or drop momentum/batch accumulation, or pick a larger board."
    )
