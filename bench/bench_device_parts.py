"""Per-part device cost of one training step (QEMU instruction trace): forward per layer, loss,
errors per layer, update per layer, beside a stated lower bound.

    .venv/bin/python bench/bench_device_parts.py                  # W1, W3 on mps2_an386 and microbit
    .venv/bin/python bench/bench_device_parts.py --workloads w3 --boards mps2_an386 --steps 4

The firmware is built as for `tinytrain verify` and run under QEMU with one guest instruction per
translation block (-singlestep -d exec,nochain), verified against the simulator after every step
(figures only with zero mismatches). Every executed instruction inside <prefix>_train_step is
charged to the call site in train_step that is running (the last train_step instruction before
it, a BL), and the call site to its line of the generated tt_model.c: the comment above it names
the layer, the callee the part (*_fwd_* forward, softmax loss, *_bwd_* errors, *_grad_* and
tt_sgd_* update). Counts are per training step (mean over the steps).

Bound (a stated cost model, not a measurement): the instructions a hand-scheduled kernel cannot
go below. Cortex-M4 (DSP): 1 per MAC in forward and errors (one SMLAD per 2 MACs and one LDR of a
weight pair per 2 MACs, inputs held in registers), 1 per MAC of the weight gradient plus 2 per
parameter for the update (a load, the saturating subtract and a store per weight pair, the step
formed by SMLAW); element-wise layers (ReLU, pooling, batch norm passes) 1 per element and pass
(batch norm: 3 passes forward, 4 backward with its gradient); the loss 20 per class. Cortex-M0
(no DSP, 1-cycle multiply): 4 per MAC (two loads, MULS, ADDS), 4 + 4 per parameter for gradient
and update, 3 per element and pass, 40 per class. Writes bench/results/device_parts.json and the
`device-parts` section of BENCHMARKS.md.
"""
from __future__ import annotations

import argparse
import bisect
import collections
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from report import machine, machine_line, markdown_table, update_section, write_json  # noqa: E402

WORKLOADS = {"w1": ("digits-mlp", "digits"), "w3": ("digits-cnn", "digits-image")}
BOARDS = ["mps2_an386", "microbit"]
#: cost model of the bound: per MAC (forward, errors, weight gradient), per parameter update,
#: per element and pass, per class of the loss
BOUND = {"cortex-m4": (1.0, 2.0, 1.0, 20.0), "cortex-m0": (4.0, 8.0, 3.0, 40.0)}
BN_PASSES = {"forward": 3, "errors": 4, "update": 0}

# Estimated cycles: every traced instruction weighted by its class (stated assumptions: zero flash
# wait states, as QEMU's SRAM-backed boards; no load pipelining; taken branches refill the pipeline;
# SDIV/UDIV 7 cycles (2-12 on M4); M0+ with the single-cycle multiplier). Taken = the next traced
# PC is not the next instruction.
_ALU = 1
_CYCLES = {
    "cortex-m4": dict(load=2, store=1, ldrd=3, mul=1, div=7, multi=1, branch_taken=3, branch=1),
    "cortex-m0": dict(load=2, store=2, ldrd=3, mul=1, div=7, multi=1, branch_taken=2, branch=1),
}


def _insn_table(elf):
    """{pc: (mnemonic, size, registers moved by LDM/STM/PUSH/POP)} from the ELF's disassembly."""
    dis = subprocess.run(["arm-none-eabi-objdump", "-d", "--no-show-raw-insn", str(elf)], capture_output=True,
                         text=True, check=True).stdout
    raw = subprocess.run(["arm-none-eabi-objdump", "-d", str(elf)], capture_output=True, text=True, check=True).stdout
    sizes = {}
    for line in raw.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\t([0-9a-f]{4})(?: ([0-9a-f]{4}))?\s", line)
        if m:
            sizes[int(m.group(1), 16)] = 4 if m.group(3) else 2
    table = {}
    for line in dis.splitlines():
        m = re.match(r"\s*([0-9a-f]+):\t(\S+)\s*(.*)", line)
        if m and not m.group(2).startswith("."):
            pc = int(m.group(1), 16)
            nregs = m.group(3).count(",") + 1 if "{" in m.group(3) else 0
            table[pc] = (m.group(2), sizes.get(pc, 2), nregs)
    return table


def _cycles(mn: str, nregs: int, taken: bool, cpu: str) -> int:
    c = _CYCLES["cortex-m4" if cpu in ("cortex-m4", "cortex-m7", "cortex-m33") else "cortex-m0"]
    base = re.sub(r"\.(w|n)$", "", mn)
    if base.startswith(("ldm", "stm", "push", "pop")):
        return 1 + nregs + (c["branch_taken"] - 1 if base.startswith("pop") and taken else 0)
    if base.startswith(("ldrd", "strd")):
        return c["ldrd"]
    if base.startswith("ldr"):
        return c["load"]
    if base.startswith("str"):
        return c["store"]
    if base.startswith(("sdiv", "udiv")):
        return c["div"]
    if base.startswith(("b", "cb")) and not base.startswith(("bic", "bfi", "bfc")):
        return c["branch_taken"] if taken else c["branch"]
    return _ALU


def _symbols(elf):
    out = subprocess.run(["arm-none-eabi-nm", "-S", "--defined-only", str(elf)], capture_output=True,
                         text=True, check=True).stdout
    syms = []
    for line in out.splitlines():
        p = line.split()
        if len(p) == 4 and p[2] in "tTwW":
            syms.append((int(p[0], 16) & ~1, int(p[1], 16), p[3]))
    return sorted(syms)


def _trace_counts(log: Path, syms, step_fn: str, insns=None, cpu="cortex-m4"):
    """({call-site pc in train_step (or 'glue'): instructions}, entries, {site: estimated cycles},
    {site: the function the site called}) over the whole log."""
    starts = [s[0] for s in syms]
    lo, size = next((s[0], s[1]) for s in syms if s[2] == step_fn)
    hi = lo + size

    def fn_of(pc):
        i = bisect.bisect_right(starts, pc) - 1
        return syms[i][2] if i >= 0 and pc < syms[i][0] + max(syms[i][1], 2) else "?"

    pat = re.compile(rb"Trace [^\[]*\[[0-9a-f]+/([0-9a-f]+)/")
    counts, cycles, entries, called = collections.Counter(), collections.Counter(), 0, {}
    in_step, site, caller, prev, prev_site = False, None, None, None, None
    insns = insns or {}

    def charge(p, nxt, where):
        if p is None or where is None:
            return
        mn, size, nregs = insns.get(p, ("?", 2, 0))
        cycles[where] += _cycles(mn, nregs, nxt != p + size, cpu)
    with open(log, "rb") as f:
        for line in f:
            m = pat.search(line)
            if not m:
                continue
            pc = int(m.group(1), 16) & ~1
            charge(prev, pc, prev_site)  # the previous instruction, now that its successor is known
            from_step, prev_site = prev_site == "glue", None
            if lo <= pc < hi:
                if not in_step:
                    in_step, entries = True, entries + 1
                    caller = fn_of(prev) if prev is not None else None
                site = pc
                counts["glue"] += 1
                prev_site = "glue"
            elif in_step:
                if caller is not None and fn_of(pc) == caller:
                    in_step = False
                else:
                    if from_step and site not in called:
                        called[site] = fn_of(pc)  # the first instruction past the call site
                    counts[site] += 1
                    prev_site = site
            prev = pc
    return counts, entries, cycles, called


def _site_lines(elf, src: Path, sites, called=None):
    """({call-site pc: its 0-based line in tt_model.c, or -1 elsewhere}, the lines of tt_model.c).
    addr2line may give a call instruction the line of a neighbour the compiler interleaved it
    with, or none; where `called` (site -> the function it entered) names a function that line
    does not call, or a line before the previous site's, the site takes the first line calling it
    after the previous site's line and up to the next placed site's (the code keeps the source's
    order of calls)."""
    pcs = [p for p in sites if p != "glue"]
    out = subprocess.run(["arm-none-eabi-addr2line", "-e", str(elf), *[hex(p) for p in pcs]],
                         capture_output=True, text=True, check=True).stdout.split()
    lines = src.read_text().splitlines()
    res = {}
    for pc, where in zip(pcs, out):
        file, _, ln = where.rpartition(":")
        n = int(ln.split()[0]) - 1 if ln.split() and ln.split()[0].isdigit() else -1
        res[pc] = n if file.endswith("tt_model.c") and 0 <= n < len(lines) else -1
    fn = lambda pc: (called or {}).get(pc, "")  # noqa: E731
    ok = lambda pc: res[pc] >= 0 and (not fn(pc).startswith("tt_") or f"{fn(pc)}(" in lines[res[pc]])  # noqa: E731
    good = [pc for pc in sorted(res) if ok(pc)]
    last = 0
    for pc in sorted(res):
        if ok(pc) and res[pc] >= last:
            last = res[pc]
            continue
        if not fn(pc).startswith("tt_"):
            continue
        i = bisect.bisect_right(good, pc)
        hi = next((res[g] for g in good[i:] if res[g] > last), len(lines) - 1)
        calls = [k for k in range(len(lines)) if f"{fn(pc)}(" in lines[k]]
        pick = ([k for k in calls if last < k <= hi] or [k for k in calls if last < k <= last + 12]
                or [k for k in calls if res[pc] >= 0 and abs(k - res[pc]) <= 12])
        if pick:
            res[pc] = last = pick[0]
    return res, lines


def _labels(elf, src: Path, sites, called=None):
    """call-site pc -> (part, layer) from the generated C line of the call."""
    at, lines = _site_lines(elf, src, sites, called)
    res = {}
    for pc, n in at.items():
        if n < 0:
            res[pc] = ("other", "")
            continue
        text, layer, section = lines[n], "", "other"
        for k in range(n, -1, -1):
            mm = re.match(r"\s*/\* (layer|backward) (\d+): (\w+)", lines[k])
            if mm:
                section, layer = ("forward" if mm.group(1) == "layer" else "backward"), f"{mm.group(2)} {mm.group(3)}"
                break
        call = re.search(r"(tt_\w+)\(", text)
        name = call.group(1) if call else ""
        if "softmax" in name or "loss" in name:
            res[pc] = ("loss", "")
        elif section == "forward":
            res[pc] = ("forward", layer)
        elif "_bwd_" in name:
            res[pc] = ("errors", layer)
        elif section == "backward":
            res[pc] = ("update", layer)
        else:
            res[pc] = ("update", "end of step") if "sgd" in name else ("other", "")
    return res


def _layer_work(model):
    """(layer label -> dict(kind, macs, params, elements)) for the bound."""
    out = {}
    for i, l in enumerate(model.layers):
        params = sum(int(np.prod(p.data.shape)) for p in getattr(l, "params", []) or [])
        out[i] = dict(kind=type(l).__name__, macs=int(l.macs()), params=params,
                      elements=int(np.prod(l.in_shape)) if hasattr(l, "in_shape") else 0)
    return out


def _bound(part, work, cpu, first_with_params, n_classes):
    per_mac, per_param, per_elem, per_class = BOUND["cortex-m4" if cpu in ("cortex-m4", "cortex-m7", "cortex-m33") else "cortex-m0"]
    if part == "loss":
        return per_class * n_classes
    if work is None:
        return None
    if work["macs"]:
        if part == "forward":
            return per_mac * work["macs"]
        if part == "errors":
            return per_mac * work["macs"]
        return per_mac * work["macs"] + per_param * work["params"]
    passes = BN_PASSES[part] if work["kind"] == "BatchNorm" else (1 if part != "update" else 0)
    extra = per_param * work["params"] if part == "update" else 0
    return per_elem * work["elements"] * passes + extra


def trace(model, ds, board: str, steps: int) -> dict:
    """Build `model` for `board`, verify `steps` steps under QEMU with an instruction trace:
    dict(r=verify's result, counts={call site: instructions}, entries, cycles, labels={site:
    (part, layer)}, callees={site: the tt_* function the site's line calls}, cpu)."""
    from tinytrain.device.boards import get_board
    from tinytrain.device.emulator import Emulator
    from tinytrain.verify import build_cached, verify

    cpu = get_board(board).cpu
    elf = build_cached(model, board)
    src = next(elf.parents[3].rglob("tt_model.c"))
    syms = _symbols(elf)
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "exec.log"
        emu = Emulator(get_board(board), elf, extra_args=("-singlestep", "-d", "exec,nochain", "-D", str(log)))
        try:
            r = verify(model, ds, steps, board=board, elf=elf, emulator=emu, json=True)
        finally:
            emu.stop()
        counts, entries, cyc, called = _trace_counts(log, syms, "tt_model_train_step", _insn_table(elf), cpu)
    return dict(r=r, counts=counts, entries=entries, cycles=cyc, labels=_labels(elf, src, counts, called),
                callees=_callees(elf, src, counts, called), cpu=cpu)


def _callees(elf, src: Path, sites, called=None) -> dict:
    """call-site pc -> name of the tt_* function called on its line of tt_model.c ('' if none)."""
    at, lines = _site_lines(elf, src, sites, called)
    calls = {pc: re.search(r"(tt_\w+)\(", lines[n]) if n >= 0 else None for pc, n in at.items()}
    return {pc: c.group(1) if c else "" for pc, c in calls.items()}


def measure(wl: str, board: str, steps: int) -> dict:
    from tinytrain import data
    from tinytrain.graph import models

    name, dsname = WORKLOADS[wl]
    ds = data.load(dsname)
    model = models.build_model(name, ds)
    try:
        t = trace(model, ds, board, steps)
    except Exception as e:  # noqa: BLE001 - a model that does not fit the board is a row, not a crash
        from tinytrain.device.boards import get_board
        return {"workload": wl, "board": board, "cpu": get_board(board).cpu, "error": str(e).splitlines()[0][:160]}
    r, counts, entries, cyc, labels, cpu = t["r"], t["counts"], t["entries"], t["cycles"], t["labels"], t["cpu"]
    work = _layer_work(model)
    with_params = [i for i, l in enumerate(model.layers) if l.macs()]
    parts, pcyc = collections.defaultdict(float), collections.defaultdict(float)
    for site, n in counts.items():
        key = ("step glue", "") if site == "glue" else labels.get(site, ("other", ""))
        parts[key] += n / max(entries, 1)
        pcyc[key] += cyc.get(site, 0) / max(entries, 1)
    rows = []
    for (part, layer), n in sorted(parts.items(), key=lambda kv: _order(kv[0])):
        idx = int(layer.split()[0]) if layer and layer[0].isdigit() else None
        b = _bound(part, work.get(idx) if idx is not None else None, cpu, with_params[0] if with_params else None,
                   ds.n_classes) if part in ("forward", "errors", "update", "loss") else None
        if part == "update" and idx is None:
            b = None
        rows.append({"part": part, "layer": layer, "instructions": round(n), "bound": b,
                     "cycles_estimated": round(pcyc[(part, layer)])})
    return {"workload": wl, "model": name, "board": board, "cpu": cpu, "steps": r["steps"],
            "mismatches": r["mismatches"], "instructions_per_step_timer": r["instructions_per_step"],
            "instructions_per_step_traced": round(sum(parts.values())),
            "cycles_per_step_estimated": round(sum(pcyc.values())), "parts": rows}


def _order(key):
    part, layer = key
    idx = int(layer.split()[0]) if layer and layer[0].isdigit() else 10**6
    rank = {"forward": 0, "loss": 1, "errors": 2, "update": 2, "step glue": 4, "other": 5}[part]
    if part == "update" and idx == 10**6:
        return (3, 0, 0)
    if part in ("errors", "update"):
        return (rank, -idx, part != "errors")
    return (rank, idx if part == "forward" else 0, 0)


def _section(r: dict, earlier: bool = False) -> str:
    """One (workload, board) result as its markdown head and table."""
    mark = " (an earlier run: this run did not repeat it)" if earlier else ""
    if "error" in r:
        return f"**{r['workload']} on {r['board']}** ({r['cpu']}){mark}: not built: {r['error']}\n"
    ok = r["mismatches"] == 0
    rows = [[p["part"], p["layer"] or "—", f"{p['instructions']:,}" if ok else "—",
             f"{p['bound']:,.0f}" if p["bound"] else "—",
             f"{p['instructions'] / p['bound']:.1f}×" if p["bound"] and ok else "—",
             f"{p['cycles_estimated']:,}" if ok else "—"] for p in r["parts"]]
    tot_b = sum(p["bound"] or 0 for p in r["parts"])
    rows.append(["**total**", "", f"**{r['instructions_per_step_traced']:,}**", f"{tot_b:,.0f}",
                 f"{r['instructions_per_step_traced'] / tot_b:.1f}×" if tot_b else "—",
                 f"{r['cycles_per_step_estimated']:,}"])
    t = markdown_table(["part", "layer", "instructions / step", "bound", "× bound",
                        f"cycles / step (est., {'M4' if r['cpu'] != 'cortex-m0' else 'M0+'} table)"], rows)
    head = (f"**{r['workload']} {r['model']} on {r['board']}** ({r['cpu']}){mark}: {r['steps']} steps traced, "
            f"{r['mismatches']} mismatches; timer {r['instructions_per_step_timer']:,.0f} instructions/step")
    return head + "\n\n" + t + "\n"


def _earlier_results(done) -> list:
    """A partial rerun (--workloads / --boards) keeps the earlier run's results of the pairs it
    did not measure, marked in the section, instead of dropping them."""
    path = Path(__file__).resolve().parent / "results" / "device_parts.json"
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [dict(r, earlier_run=True) for r in old.get("results", [])
            if (r.get("workload"), r.get("board")) not in done]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    ap.add_argument("--boards", nargs="+", default=BOARDS)
    ap.add_argument("--steps", type=int, default=0, help="verified steps traced (default: W1 50, W3 4)")
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args(argv)
    t0 = time.monotonic()
    results = []
    for wl in a.workloads:
        for b in a.boards:
            steps = a.steps or {"w1": 50, "w3": 4}[wl]
            r = measure(wl, b, steps)
            results.append(r)
            print(_section(r), flush=True)
    if a.no_write:
        return 0
    results += _earlier_results({(r["workload"], r["board"]) for r in results})
    order = {(wl, b): i for i, (wl, b) in enumerate((w, b) for w in WORKLOADS for b in BOARDS)}
    results.sort(key=lambda r: order.get((r["workload"], r["board"]), len(order)))
    sections = [_section(r, r.get("earlier_run", False)) for r in results]
    mach = machine()
    write_json("device_parts.json", {"benchmark": "device_parts", "command": "python bench/bench_device_parts.py " +
                                     " ".join(argv or sys.argv[1:]), "machine": mach, "results": results,
                                     "bound_model": BOUND, "seconds": round(time.monotonic() - t0, 1)})
    body = ("## Device cost per part of the training step (QEMU instruction trace)\n\n"
            "`python bench/bench_device_parts.py`: every instruction of `train_step` charged to the kernel call "
            "running it (forward per layer, loss, errors per layer, gradient + update per layer); the bound is "
            "the cost model in the script's docstring (M4: 1 instruction per MAC, 2 per parameter update, 1 per "
            "element and pass; M0: 4, 8, 3), not a measurement. The traced total differs from the timer figure by "
            "the timer read itself. Estimated cycles: each traced instruction weighted by its class with the "
            "Cortex-M4 or M0+ timings (ALU and multiplies 1, loads 2, stores 1 (M0+: 2), LDRD/STRD 3, LDM/STM/PUSH/POP "
            "1 + registers, branches 3 taken (M0+: 2) / 1 not taken, divides 7); assumptions: zero flash wait "
            "states, no load pipelining, the M0+ single-cycle multiplier (the micro:bit's nRF51 is an M0, whose "
            "instructions are the same). Host: " + machine_line(mach) + ".\n\n" + "\n".join(sections))
    update_section("device-parts", body)
    print(f"wrote bench/results/device_parts.json and BENCHMARKS.md (device-parts) in {time.monotonic() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
