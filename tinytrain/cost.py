"""What a model costs on a board, measured: the one figure behind sensitivity, compress and pareto.

    c = device_cost(model, "microbit", dataset, steps=20)

RAM and flash come from the firmware linked for the board (tinytrain.codegen.memory.breakdown);
instructions per training sample from QEMU (``-icount shift=7``), over the first `steps` samples of
the verification order, every step compared with the simulator by state hash. Each step's reading
is the exact instruction count (docs/boards.md), so reruns of one model give the same figure
(tests/test_cost.py).
A model that does not fit the board is reported (``fits: False`` and why) rather than raised, so
sweeps can keep it as an infeasible point. A mismatch between board and simulator is a bug in
tinytrain and raises.

``training_ram`` is what training needs on any firmware (parameters, optimizer state, activations,
scratch); ``ram_total`` adds the protocol, the load shadow (when the board keeps it) and the stack.
"""
from __future__ import annotations

from tinytrain.codegen.memory import breakdown

TRAINING_RAM = ("parameters", "optimizer state", "activations", "scratch")


COST_KEYS = {"ram": "ram_total", "flash": "flash_total", "instructions": "instructions_per_sample"}
BUDGET_KEYS = tuple(COST_KEYS)


def budget_limits(cost: dict, budget: dict) -> dict:
    """The limits a measured cost is held to: the budget's, and the board's RAM and flash when the
    cost names them (``board_ram``, ``board_flash``)."""
    lim = {k: int(v) for k, v in budget.items()}
    for k, board_k in (("ram", "board_ram"), ("flash", "board_flash")):
        if cost.get(board_k) is not None:
            lim[k] = min(lim.get(k, cost[board_k]), int(cost[board_k]))
    return lim


def fits_budget(cost: dict, budget: dict) -> bool:
    """The cost fits the board (``fits``, when given) and every limit; a limit on a figure not
    measured (None) is not met."""
    return bool(cost.get("fits", True)) and all(
        cost.get(COST_KEYS[k]) is not None and cost[COST_KEYS[k]] <= v for k, v in budget_limits(cost, budget).items())


def worst_excess(cost: dict, limits: dict):
    """(relative excess, key, figure, limit) of the limit the cost misses most (negative: the
    margin of the tightest one met); None if no limited figure was measured."""
    over = [((have - lim) / lim, k, have, lim) for k, lim in limits.items()
            if (have := cost.get(COST_KEYS[k])) is not None]
    return max(over) if over else None


class CostError(RuntimeError):
    """The board and the simulator disagree: a bug in tinytrain, never the user's model."""


def training_ram(bd) -> int:
    return sum(bd.ram.get(k, 0) for k in TRAINING_RAM)


def device_cost(model, board: str, dataset=None, steps: int = 20, *, instructions: bool = True,
                build_dir=None, build: str = "platformio", checker: str = "simulator") -> dict:
    """RAM/flash of `model` on `board`, and (instructions=True, needs `dataset` and an emulated
    board) the mean QEMU instructions per training sample over `steps` verified steps.
    build_dir: build the firmware there (default: the firmware cache shared across runs).
    build: "platformio" (``pio run``, as ``tinytrain build``) or "direct": the ELF of the size link
    (:func:`tinytrain.codegen.memory.link_firmware`: the same sources, compiler, flags and linker
    script without PlatformIO's ~1.5 CPU-s per build; its functions lie in another order), which
    sweeps use; tests check both measure the same instructions.
    checker: what each step is compared with (:func:`tinytrain.verify.verify`): the numba
    simulator or the numpy reference, which sweeps use (no simulator to compile per variant).
    The model is not changed (verification trains copies)."""
    if build not in ("platformio", "direct"):
        raise ValueError(f"build={build!r}: use 'platformio' or 'direct'")
    from tinytrain.device.boards import get_board

    b = get_board(board)
    bd = breakdown(model, b.name)
    out = {"board": b.name, "cpu": b.cpu, "board_ram": int(b.ram), "board_flash": int(b.flash),
           "training_ram": training_ram(bd), "ram_total": bd.ram_total, "flash_total": bd.flash_total,
           "ram": dict(bd.ram), "flash": dict(bd.flash), "fits": True, "why": None, "shadow": True,
           "instructions_per_sample": None, "steps": 0}
    if not bd.fits()["ram"]:  # the firmware drops the load shadow first (codegen does the same)
        bare = breakdown(model, b.name, shadow=False)
        out.update(ram_total=bare.ram_total, ram=dict(bare.ram), flash_total=bare.flash_total,
                   flash=dict(bare.flash), shadow=False)
        if not bare.fits()["ram"]:
            need = bare.ram_needed
            out.update(fits=False, why=f"needs {need} B of RAM, {b.name} has {b.ram} B ({need - b.ram} B over"
                                       + (f"; its link script reserves {bare.stack_reserved} B of stack)"
                                          if need > bare.ram_total else ")"))
    if out["fits"] and out["flash_total"] is not None and out["flash_total"] > b.flash:
        out.update(fits=False, why=f"needs {out['flash_total']} B of flash, {b.name} has {b.flash} B "
                                   f"({out['flash_total'] - b.flash} B over)")
    if not (instructions and out["fits"]):
        return out
    if dataset is None:
        raise ValueError("device_cost(instructions=True) needs the dataset to train on")
    from tinytrain.device.pio_project import OVERFLOW, FitError
    from tinytrain.verify import verify

    if build == "direct":
        elf, over = _direct_firmware(model, b, build_dir)
    else:
        elf, over = None, None
    if over is None:
        try:
            res = verify(model, dataset, steps, board=b.name, json=True, build_dir=build_dir, elf=elf,
                         checker=checker)
        except FitError as exc:
            m = OVERFLOW.search(str(exc))
            over = m.group(0) if m else str(exc).splitlines()[0]
    if over is not None:  # the estimate above fitted, the link does not: the link decides
        out.update(fits=False, why=f"the linked firmware does not fit {b.name}: {over}")
        return out
    if res["mismatches"]:
        raise CostError(f"{b.name} disagrees with the simulator: {res['first_mismatch']}")
    out.update(instructions_per_sample=res["instructions_per_step"], steps=res["steps"])
    return out


def _direct_firmware(model, b, build_dir):
    """(ELF path, None) of `model`'s training firmware linked without PlatformIO, as
    ``tinytrain build`` would make it (the same shadow choice, no update codec), or (None, the
    linker's overflow line)."""
    import tempfile
    from pathlib import Path

    from tinytrain.codegen.device import device_source
    from tinytrain.codegen.emit import generate
    from tinytrain.codegen.memory import link_firmware
    from tinytrain.codegen.project import choose_shadow

    d = Path(build_dir) if build_dir is not None else Path(tempfile.mkdtemp(prefix="tt-direct-"))
    d.mkdir(parents=True, exist_ok=True)
    em = generate(model, "tt_model")
    try:
        shadow = choose_shadow(model, b.name)
    except MemoryError as exc:
        return None, str(exc)
    sz = link_firmware(em, device_source(model, em, shadow, False), b, keep=d / "firmware.elf")
    if sz.get("overflow"):
        return None, sz["overflow"]
    return d / "firmware.elf", None
