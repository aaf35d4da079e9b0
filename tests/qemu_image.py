"""Kernel tests on the Cortex-M4 as QEMU runs it: a test's C main (tests/c/*_main.c), the runtime
sources it needs and a generated header of cases are linked with the mps2 port into one image,
run under QEMU mps2-an386, and the UART's lines of decimal integers come back. The tests that use
it compare those integers with the numpy reference (test_sgd_apply_qemu, test_bn_kernel_qemu)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

import tinytrain

FW = Path(tinytrain.__file__).parent / "firmware"
C_DIR = Path(__file__).parent / "c"
FLAGS = ["-mcpu=cortex-m4", "-mthumb", "-mfpu=fpv4-sp-d16", "-mfloat-abi=hard", "-O2", "-std=c99",
         "-ffunction-sections", "-fdata-sections", "-DTT_BOARD_MPS2_AN386=1"]

#: the marks of a test module that needs the image (QEMU and the ARM compiler)
MARKS = [pytest.mark.qemu,
         pytest.mark.skipif(any(shutil.which(t) is None for t in ("qemu-system-arm", "arm-none-eabi-gcc")),
                            reason="QEMU or arm-none-eabi-gcc missing")]


def c_array(name: str, a, ctype: str) -> str:
    """A static const C array of ``a``'s integers (one element 0 when empty: C has no empty arrays)."""
    a = np.asarray(a).reshape(-1)
    return f"static const {ctype} {name}[{max(len(a), 1)}] = {{{', '.join(str(int(v)) for v in a) or '0'}}};\n"


def run_m4(main: str, sources: list[str], header: str, text: str, tmp: Path, flags=()) -> list[list[int]]:
    """Link tests/c/``main`` with firmware/src/``sources`` and the port, ``text`` written to
    ``tmp``/``header`` (the main includes it), run it on QEMU mps2-an386: each UART line before
    the closing END as its integers. ``flags``: more compiler flags (-DTT_HAVE_DSP=0: the
    portable paths on the same board)."""
    (tmp / header).write_text(text)
    port = FW / "ports"
    elf = tmp / "image.elf"
    subprocess.run(["arm-none-eabi-gcc", *FLAGS, *flags, f"-I{FW / 'include'}", f"-I{C_DIR}", f"-I{tmp}", str(C_DIR / main),
                    *(str(FW / "src" / s) for s in sources),
                    str(port / "mps2" / "startup_mps2.c"), str(port / "mps2" / "tt_port_mps2.c"),
                    str(port / "common" / "tt_port_common.c"), "-T", str(port / "mps2" / "mps2.ld"),
                    "-Wl,--gc-sections", "--specs=nano.specs", "--specs=nosys.specs", "-o", str(elf)],
                   check=True, capture_output=True)
    r = subprocess.run(["qemu-system-arm", "-M", "mps2-an386", "-nographic", "-semihosting", "-monitor", "none",
                        "-serial", "stdio", "-kernel", str(elf)], capture_output=True, text=True, timeout=120)
    lines = [ln.split() for ln in r.stdout.splitlines() if ln.strip()]
    assert lines and lines[-1] == ["END"], r.stdout[-500:]
    return [[int(v) for v in ln] for ln in lines[:-1]]
