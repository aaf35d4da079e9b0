"""What `tinytrain sensitivity` and `tinytrain pareto` share: measured device costs of many model
variants in one run, and a process pool over them.

* :func:`config_key` names a variant by what the board would run: its schema, its training state
  and its configuration. Two variants with the same key are the same build and the same QEMU
  run, so a sweep measures each key once (the cache lives for one run: a rerun measures again).
* :class:`Costs` measures a model on a board with :func:`tinytrain.cost.device_cost`, linking
  its firmware in a folder of this run (never the firmware cache shared across runs): every
  variant is linked and run on the board. It links without PlatformIO (``build="direct"``: the
  size link's ELF, the same code as ``pio run`` makes in another order in flash; tests check the
  two measure the same), and the runtime's and the port's objects, which every variant compiles
  alike, come from the link's object cache (tinytrain.codegen.memory.link_firmware), so a new
  variant compiles its generated model and glue and links (W1 on the micro:bit: ~0.3 s instead of
  a ``pio run`` of 1.5 CPU seconds after a first one of 6). QEMU runs every variant each time,
  every step compared with the numpy reference (``checker="reference"``): a variant's own numba
  training simulator would cost ~4 CPU-s to compile (W1) for 20 steps the reference takes in
  well under a second.
* :func:`run_tasks` maps a picklable top-level function over tasks, serially (``jobs=1``) or in
  ``jobs`` processes (forked where the OS can: they inherit the loaded modules; with ``weights``
  the heaviest dispatched first), in task order, and records each task's CPU seconds (its process
  and the compilers and QEMU it started) so a report can state the serial/parallel split of
  the work without timing anything against the shared machine's clock.
"""
from __future__ import annotations

import hashlib
import json
import os
import resource
import time
from pathlib import Path


def config_key(model) -> str:
    """A short hash of what makes a build and a device run: the configuration, schema and state."""
    h = hashlib.sha256(json.dumps(model.config(), sort_keys=True, default=str).encode())
    h.update(f"{model.schema_hash():08x}{model.state_hash():08x}".encode())
    return h.hexdigest()[:16]


class Costs:
    """device_cost(model) on one board, firmware linked under ``root`` (one folder per key) without
    PlatformIO (``build="direct"``: the size link's ELF runs in QEMU), checked against the
    reference."""

    def __init__(self, board: str, dataset, steps: int, root):
        self.board, self.dataset, self.steps, self.root = board, dataset, int(steps), Path(root)

    def prepare(self) -> None:
        """Compile the board's runtime objects once, on every core, before the sweep's links
        (memory.prepare_runtime)."""
        from tinytrain.codegen.memory import prepare_runtime

        prepare_runtime(self.board)

    def __call__(self, model, instructions: bool = True) -> dict:
        from tinytrain.cost import device_cost

        d = self.root / config_key(model)
        return device_cost(model, self.board, self.dataset, self.steps, instructions=instructions, build_dir=d,
                           build="direct", checker="reference")


def cpu_seconds() -> float:
    """CPU seconds of this process and of its finished children (gcc, PlatformIO, QEMU)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _timed(fn, task):
    t0 = cpu_seconds()
    out = fn(task)
    return out, cpu_seconds() - t0


def dispatch_order(weights) -> list[int]:
    """Task indices, heaviest first (ties in task order): the long tasks start at once and the
    short ones fill the processes' ends, instead of one long task running alone at the end."""
    return sorted(range(len(weights)), key=lambda i: -weights[i])


def run_tasks(fn, tasks: list, jobs: int = 1, progress=None, weights=None) -> tuple[list, dict]:
    """[fn(t) for t in tasks] (in order) and the work split: tasks, their CPU seconds (sum and
    largest), jobs, and the wall seconds of the whole map (informative only: the machine may be
    shared). ``progress`` (a tqdm bar) advances once per finished task. ``weights``: a rough
    cost per task; with jobs > 1 the heaviest are dispatched first (:func:`dispatch_order`),
    which changes no result. A sweep of firmware links calls :meth:`Costs.prepare` first, so that
    its processes find the runtime's objects compiled instead of each compiling them."""
    jobs = max(1, min(int(jobs), len(tasks) or 1))
    t0 = time.monotonic()
    if jobs == 1:
        results = []
        for t in tasks:
            results.append(_timed(fn, t))
            if progress is not None:
                progress.update(1)
    else:
        import concurrent.futures as cf
        import multiprocessing as mp

        with cf.ProcessPoolExecutor(jobs, mp_context=mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")) as pool:
            futs = [None] * len(tasks)
            for i in dispatch_order(weights if weights is not None else [0] * len(tasks)):
                futs[i] = pool.submit(_timed, fn, tasks[i])
            for f in cf.as_completed(futs):
                if progress is not None:
                    progress.update(1)
            results = [f.result() for f in futs]
    cpu = [c for _, c in results]
    work = {"tasks": len(tasks), "jobs": jobs, "task_cpu_seconds": round(sum(cpu), 2),
            "largest_task_cpu_seconds": round(max(cpu, default=0.0), 2),
            "wall_seconds": round(time.monotonic() - t0, 2)}
    return [r for r, _ in results], work


def default_jobs() -> int:
    return max(1, min(2, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
