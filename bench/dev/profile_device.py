"""Instruction profile of one model's training step on an emulated board, per function.

    .venv/bin/python bench/dev/profile_device.py --model digits-mlp --board mps2_an386 --steps 20

QEMU runs one guest instruction per translation block (-singlestep) and logs every block it
executes (-d exec,nochain), so each log line is one executed instruction; its PC is mapped to the
ELF's function symbols (arm-none-eabi-nm). Counts are per training step (total / steps) for the
functions reached from <prefix>_train_step; the serial protocol's own functions are listed apart.
Slow (tens of seconds for 20 steps): a development tool, not a benchmark.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import re
import subprocess
import tempfile
from pathlib import Path


def symbols(elf):
    out = subprocess.run(["arm-none-eabi-nm", "-S", "--defined-only", "-C", str(elf)],
                         capture_output=True, text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            syms.append((int(p[0], 16) & ~1, int(p[1], 16), p[3]))
    syms.sort()
    return syms


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="digits-mlp")
    ap.add_argument("--data", default=None)
    ap.add_argument("--board", default="mps2_an386")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--precision", default=None, help="a precision preset or JSON object (docs/precision.md)")
    ap.add_argument("--annotate", metavar="FUNC", help="also print FUNC's disassembly with counts per instruction")
    a = ap.parse_args(argv)
    from tinytrain import data
    from tinytrain.graph import models
    from tinytrain.device.boards import get_board
    from tinytrain.device.emulator import Emulator
    from tinytrain.verify import build_cached, verify

    ds = data.load(a.data or {"digits-cnn": "digits-image"}.get(a.model, "digits"))
    model = models.build_model(a.model, ds, precision=a.precision)
    elf = build_cached(model, a.board)
    syms = symbols(elf)
    starts = [s[0] for s in syms]
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "exec.log"
        emu = Emulator(get_board(a.board), elf, extra_args=("-singlestep", "-d", "exec,nochain", "-D", str(log)))
        r = verify(model, ds, a.steps, board=a.board, elf=elf, emulator=emu, json=True)
        emu.stop()
        counts = collections.Counter()
        pat = re.compile(r"Trace [^\[]*\[[0-9a-f]+/([0-9a-f]+)/")
        with open(log) as f:
            for line in f:
                m = pat.search(line)
                if m:
                    counts[int(m.group(1), 16)] += 1
    per = collections.Counter()
    for pc, n in counts.items():
        i = bisect.bisect_right(starts, pc & ~1) - 1
        name = syms[i][2] if i >= 0 and pc < syms[i][0] + max(syms[i][1], 2) else "?"
        per[name] += n
    print(f"{a.model} on {a.board}: {r['steps']} steps, mismatches {r['mismatches']}, "
          f"instructions/step (timer) {r['instructions_per_step']}")
    # the kernels' static helpers (bn_*, conv2d_*, sgd_*) count as kernels; the serial protocol,
    # the port, the state hash and I/O, and the device glue are listed apart
    serial = ("proto", "port", "cobs", "crc", "device", "frame", "cmd", "state_", "_dev_", "memset", "memcpy")
    kern = {k: v for k, v in per.items() if k != "?" and not any(t in k for t in serial)}
    tot = sum(kern.values())
    print(f"kernels: {tot / a.steps:,.0f} instructions/step")
    for k, v in sorted(kern.items(), key=lambda kv: -kv[1])[:a.top]:
        print(f"  {v / a.steps:10,.0f}  {k}")
    rest = {k: v for k, v in per.items() if k not in kern}
    if a.annotate:
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", "--no-show-raw-insn", str(elf)],
                             capture_output=True, text=True, check=True).stdout
        inside = False
        for line in dis.splitlines():
            if line.endswith(f"<{a.annotate}>:"):
                inside = True
            elif inside and line.strip() == "":
                break
            elif inside and ":" in line:
                try:
                    pc = int(line.split(":")[0], 16)
                except ValueError:
                    continue
                n = counts.get(pc, 0) / a.steps
                print(f"{n:8.1f} {line}")
    print("other (protocol, port, hash):", ", ".join(f"{k} {v / a.steps:,.0f}" for k, v in
                                                     sorted(rest.items(), key=lambda kv: -kv[1])[:8]))


if __name__ == "__main__":
    main()
