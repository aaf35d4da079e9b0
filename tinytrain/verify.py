"""Bit-for-bit verification: train the simulator and a target side by side, compare every step.

    from tinytrain.verify import verify
    r = verify(model, ds, 300, board="host")          # generated C via cffi
    r = verify(model, ds, 300, board="mps2_an386")    # PlatformIO build + QEMU + serial protocol
    r = verify(model, ds, 300, port="/dev/ttyACM0")   # a flashed board (any pyserial URL)
    assert r["mismatches"] == 0, r["first_mismatch"]

Both sides start from the model's state (the device gets it by LOAD_PARAMS unless its hash
already matches) and see the same samples: the first `steps` entries of the data PRNG's
permutation of the training set (``fixedpoint.permutation(prng_seed(seed), n)``, repeated
with the continued PRNG state if `steps` exceeds one epoch). After every step the state hash
(parameters, optimizer state, PRNG, step counter) and the loss must be equal. On the first
difference the device's state blob is fetched, compared tensor by tensor with the simulator's,
and the first differing tensor (layer index, op kind, parameter, role) and flat index are
reported with both values; the activations of that step are compared too (first differing op).
Verification stops there.
"""
from __future__ import annotations

import copy
import time
from pathlib import Path

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.codegen.memory import firmware_sizes  # noqa: F401  (part of verify's API)
from tinytrain.graph.state import Slot, locate, state_blob, state_layout  # noqa: F401  (part of verify's API)

__all__ = ["verify", "state_layout", "locate", "VerifyError", "sample_order", "firmware_sizes"]


class VerifyError(RuntimeError):
    """The target cannot be verified (no such board, build failed, link error...)."""


# ----------------------------------------------------------------------------- samples


def sample_order(n: int, steps: int, seed: int = 0) -> np.ndarray:
    """Indices of the first `steps` samples: data-PRNG permutations of range(n), epoch after
    epoch, the PRNG state carried over."""
    state, out, have = fp.prng_seed(seed), [], 0
    while have < steps:
        state, perm = fp.permutation(state, n)
        out.append(perm[:steps - have])
        have += len(out[-1])
    return np.concatenate(out) if out else np.zeros(0, np.int32)


def _inputs(model, dataset):
    """The dataset's int8 training codes as the model reads them (re-quantized by
    train.prepare_inputs when the model was built for another data exponent)."""
    want = getattr(model, "data_input_exp", None)
    if want is None or want == dataset.input_exp:
        return dataset.x_train
    from tinytrain.train import prepare_inputs

    return prepare_inputs(model, dataset)[0]


# ----------------------------------------------------------------------------- targets


class _HostTarget:
    """The generated C compiled for this machine (cffi)."""

    board = "host"
    cycles_unit = None

    def __init__(self, model, prefix="tt_model"):
        from tinytrain.codegen.host import HostModel

        self.hm = HostModel(model, prefix=prefix)
        self.em = self.hm.em
        # HostModels of identical source share one dlopen()ed library (and its static state)
        # in a process: start from this model's state explicitly
        if self.hm.state_hash() != model.state_hash():
            assert self.hm.write_state(state_blob(model)) == 0
        self.n_state = len(state_layout(model))

    def state_hash(self):
        return self.hm.state_hash()

    def train(self, x, y):
        loss, _pred = self.hm.train_step(x, y)
        return self.hm.state_hash(), loss, None

    def read_state(self):
        return self.hm.read_state()

    def corrupt(self, offset, xor):
        b = self.hm.read_state()[offset] ^ xor
        assert self.hm.write_state(bytes([b]), offset) == 0

    def activation(self, li):
        return np.frombuffer(self.hm.get_tensor(self.n_state + li), np.int8)

    def close(self):
        pass


class _LinkTarget:
    """A device behind the serial protocol (QEMU socket or a real port)."""

    cycles_unit = "cycles"

    def __init__(self, link, model, board):
        self.link, self.board = link, board
        self.n_state = len(state_layout(model))
        info = link.info or link.hello()
        if info.schema_hash != model.schema_hash():
            from tinytrain.device.protocol import SchemaMismatch

            raise SchemaMismatch(f"device runs schema 0x{info.schema_hash:08x}, the model is "
                                 f"0x{model.schema_hash():08x}: build and flash the firmware of this model")
        h = link.reset()
        if h != model.state_hash():  # firmware built from other weights: load the model's
            link.load_params(state_blob(model))

    def state_hash(self):
        return self.link.state_hash()

    def train(self, x, y):
        r = self.link.train(x, y)
        return r.state_hash, r.loss, r.cycles

    def read_state(self):
        return self.link.read_params()

    def corrupt(self, offset, xor):
        blob = bytearray(self.link.read_params())
        blob[offset] ^= xor
        self.link.load_params(bytes(blob), resume=False)

    def activation(self, li):
        return np.frombuffer(self.link.get_tensor(self.n_state + li), np.int8)

    def stack_bytes(self):
        """Peak stack use reported by the glue (None if the firmware does not report it)."""
        from tinytrain.codegen.device import TENSOR_STACK
        from tinytrain.device.protocol import DeviceError

        try:
            v = int.from_bytes(self.link.get_tensor(TENSOR_STACK)[:4], "little")
        except DeviceError:
            return None
        return v or None

    def close(self):
        self.link.close()


# ----------------------------------------------------------------------------- sizes


def _fw_dir(board: str, em_source: str) -> Path:
    import hashlib
    import os

    from tinytrain.resources import FIRMWARE_INCLUDE, FIRMWARE_SRC

    h = hashlib.sha256(em_source.encode())
    for d in (FIRMWARE_SRC, FIRMWARE_INCLUDE):
        for f in sorted(d.glob("tt_*.[ch]")):
            h.update(f.read_bytes())
    root = Path(os.environ.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain")) / "firmware"
    return root / f"{board}-{h.hexdigest()[:16]}"


def build_cached(model, board: str, out_dir=None, prefix="tt_model", fedcodec: bool | str = False,
                 build_flags=()) -> Path:
    """Build the firmware of `model` for `board` (once per generated source and build flags:
    cached by hash). fedcodec: include the on-device federated update codec (True, or "auto":
    if RAM allows); off by default so training-RAM figures are the model's own. build_flags:
    extra compiler flags (e.g. -DTT_FED_RESIDUAL_BITS=16)."""
    from tinytrain.codegen.device import device_source
    from tinytrain.codegen.project import build_firmware, choose_fedcodec, choose_shadow
    from tinytrain.codegen.emit import generate
    from tinytrain.device.pio_project import elf_path

    if fedcodec == "auto":
        fedcodec = choose_fedcodec(model, board, prefix, choose_shadow(model, board, prefix))
    if out_dir is None:
        em = generate(model, prefix)
        out_dir = _fw_dir(board, em.header + em.source + device_source(model, em, fedcodec=bool(fedcodec))
                          + "\n".join(build_flags))
        elf = elf_path(out_dir, board)
        if elf.is_file():
            return elf
    return build_firmware(model, board, out_dir, prefix, fedcodec=bool(fedcodec), build_flags=tuple(build_flags))


# ----------------------------------------------------------------------------- verify


def verify(model, dataset, steps: int, *, board: str | None = "host", port=None, json: bool = False,
           seed: int = 0, corrupt=None, elf=None, build_dir=None, emulator=None, link=None,
           progress=None, reference: bool = False, retries: int | None = None,
           timeout: float | None = None, checker: str = "simulator") -> dict:
    """Train the simulator and the target on the same `steps` samples; compare after each step.

    board: "host" (generated C via cffi), an emulated board name (built and booted in QEMU), or
    a real board name together with `port`. port: a pyserial URL of a device already running
    this model's firmware. link: an open DeviceLink to use instead (not closed here).
    retries, timeout: the serial link's retransmissions per request and seconds per attempt
    (default: DeviceLink's, 10 and 2.0 s; 10 s for an emulated board, whose first reply waits
    for QEMU to boot).
    json: the result holds only JSON-serialisable values (always true) and nothing is printed;
    without it `progress(step, steps)` (if given) is called every step.
    corrupt: (step, byte_offset[, xor]) - test hook: after training step `step` the device's
    state byte at `byte_offset` is XORed with `xor` (default 0x01) through write_state /
    LOAD_PARAMS, as a bit flip in RAM would; verification must catch and locate it.
    Result: steps, mismatches, board, retransmissions (serial targets: requests sent again
    after a timeout or corruption; None on host), instructions_per_step (emulated boards: mean cycles of
    the TRAIN replies; None on host), cycles_per_step (real boards), ram_bytes (static: .data +
    .bss of the ELF; on host the generated model's buffers), stack_bytes and ram_peak_bytes
    (devices whose firmware reports its stack high-water mark), flash_bytes,
    seconds, first_mismatch (None or a dict naming step, tensor, layer, op, param, index and both
    values), plus hash_initial.
    reference: also run the numpy reference (``Sequential.ref_train_step``, the specification) as
    a third party; after every step its state hash and loss must equal the simulator's. A
    difference stops verification with first_mismatch naming the tensor and index, "parties":
    ["reference", "simulator"] ("expected" is the reference's value); otherwise the parties are
    ["simulator", board] and "expected" is the simulator's. The reference is ~100x slower than
    the simulator: a few hundred steps of W1 take seconds.
    checker: the host party the target is compared with: "simulator" (the numba simulator,
    default) or "reference" (the numpy reference alone, the specification: no simulator is
    compiled, which is what a short check of a model nobody trained before spends its time on:
    ~4 CPU-s for W1's training kernels, against ~10 ms a W1 step for the reference; sweeps
    measure each variant this way). With "reference" the parties are ["reference", board] and a
    mismatch names the tensor and index but not the first differing operation.
    """
    from tinytrain.device.boards import get_board
    from tinytrain.sim.simulator import Simulator

    if checker not in ("simulator", "reference"):
        raise ValueError(f"checker={checker!r}: use 'simulator' or 'reference'")
    if checker == "reference" and reference:
        raise ValueError("--reference adds the numpy reference beside the simulator; with --checker reference "
                         "it is already what the target is compared with: drop --reference")
    t0 = time.monotonic()
    sim_model = copy.deepcopy(model)
    dev_model = copy.deepcopy(model)
    ref_model = copy.deepcopy(model) if reference else None
    X, Y = _inputs(model, dataset), dataset.y_train
    order = sample_order(len(X), int(steps), seed)
    result = {"steps": 0, "mismatches": 0, "board": None, "instructions_per_step": None,
              "cycles_per_step": None, "ram_bytes": None, "flash_bytes": None, "seconds": None,
              "first_mismatch": None, "hash_initial": f"0x{model.state_hash():08x}",
              "reference": bool(reference), "retransmissions": None}
    from tinytrain.device.protocol import DEFAULT_RETRIES, DEFAULT_TIMEOUT

    link_kw = {"retries": DEFAULT_RETRIES if retries is None else retries,
               "timeout": DEFAULT_TIMEOUT if timeout is None else timeout}
    emu = None
    b = None
    if link is not None or port is not None:
        from tinytrain.device.protocol import DeviceLink

        b = get_board(board) if board not in (None, "host") else None
        result["board"] = b.name if b else "device"
        lk = link if link is not None else DeviceLink(port, **link_kw)
        target = _LinkTarget(lk, dev_model, result["board"])
        if link is not None:
            target.close = lambda: None
    elif board in (None, "host"):
        target = _HostTarget(dev_model)
        result["board"] = "host"
        from tinytrain.codegen.device import static_ram_bytes

        result["ram_bytes"] = static_ram_bytes(target.em, model) - len(state_blob(model))
        result["flash_bytes"] = None
    else:
        from tinytrain.device.emulator import Emulator
        from tinytrain.device.protocol import DeviceLink

        b = get_board(board)
        if not b.is_emulated:
            raise VerifyError(f"{b.name} is a real board: flash it (tinytrain flash --board {b.name} "
                              "--port P) and verify with port=")
        elf = Path(elf) if elf is not None else build_cached(dev_model, b.name, build_dir)
        result["board"] = b.name
        result.update(firmware_sizes(elf))
        emu = emulator or Emulator(b, elf)
        emu.start()
        try:
            link_kw["timeout"] = 10.0 if timeout is None else timeout
            target = _LinkTarget(DeviceLink(emu.url, **link_kw), dev_model, b.name)
        except BaseException:
            emu.stop()
            raise
    sim = Simulator(sim_model) if checker == "simulator" else None
    host = "simulator" if sim is not None else "reference"
    cycles = []
    corrupt = tuple(corrupt) if corrupt is not None else None
    try:
        h0 = target.state_hash()
        if h0 != sim_model.state_hash():
            result["first_mismatch"] = _mismatch(sim_model, target, -1, None, None, sim, party=host)
            result["mismatches"] = 1
            order = order[:0]
        for k, i in enumerate(order):
            if sim is not None:
                loss_host = int(sim.train(X, Y, np.array([i], dtype=np.int64))[0][0])
            else:
                loss_host = int(sim_model.ref_train_step(X[i], int(Y[i]))[0])
            if ref_model is not None:
                loss_ref, _ = ref_model.ref_train_step(X[i], int(Y[i]))
                h_ref, loss_sim = ref_model.state_hash(), loss_host
                if h_ref != sim_model.state_hash() or int(loss_ref) != loss_sim:
                    result["steps"], result["mismatches"] = k, 1
                    result["first_mismatch"] = _ref_mismatch(ref_model, sim_model, k, int(i),
                                                             (int(loss_ref), loss_sim))
                    break
            h_dev, loss_dev, cyc = target.train(X[i], int(Y[i]))
            if cyc is not None:
                cycles.append(cyc)
            if corrupt is not None and corrupt[0] == k:
                target.corrupt(int(corrupt[1]), int(corrupt[2]) if len(corrupt) > 2 else 0x01)
                h_dev = target.state_hash()
            result["steps"] = k + 1
            h_sim, loss_sim = sim_model.state_hash(), loss_host
            if h_dev != h_sim or loss_dev != loss_sim:
                result["mismatches"] = 1
                result["first_mismatch"] = _mismatch(sim_model, target, k, int(i), (loss_sim, loss_dev), sim,
                                                     h_sim, h_dev, party=host)
                break
            if progress is not None and not json:
                progress(k + 1, len(order))
        stack = getattr(target, "stack_bytes", lambda: None)()
        if stack is not None:
            result["stack_bytes"] = stack
            if result["ram_bytes"] is not None:
                result["ram_peak_bytes"] = result["ram_bytes"] + stack
    finally:
        if isinstance(target, _LinkTarget):
            result["retransmissions"] = target.link.retransmissions
        target.close()
        if emu is not None and emulator is None:
            emu.stop()
    if cycles:
        mean = float(np.mean(cycles))
        if b is not None and b.is_emulated:
            result["instructions_per_step"] = mean
        else:
            result["cycles_per_step"] = mean
    result["memory"] = _memory(model, b, elf, result.get("stack_bytes"))
    result["seconds"] = round(time.monotonic() - t0, 3)
    return result


def _memory(model, board, elf, stack) -> dict | None:
    """The firmware's RAM/flash breakdown (tinytrain.codegen.memory.breakdown, the figures of
    info/codegen/build) on `board` (the default board for host runs), with the ELF's linked
    sizes and the device's measured peak stack beside it."""
    from tinytrain.codegen.project import choose_shadow
    from tinytrain.codegen.memory import breakdown

    name = board.name if board is not None else None
    try:
        shadow = choose_shadow(model, name) if name else True
    except MemoryError:
        return None
    return breakdown(model, name, shadow=shadow, elf=elf, stack_measured=stack).as_dict()


def _ref_mismatch(ref_model, sim_model, step, sample, losses) -> dict:
    """Where the simulator left the reference (the specification) at this step."""
    where = locate(ref_model, state_blob(ref_model), state_blob(sim_model)) or {
        "tensor": None, "note": "state blobs equal (loss differs)"}
    return {"step": step, "sample": sample, **where, "parties": ["reference", "simulator"],
            "hash_expected": f"0x{ref_model.state_hash():08x}", "hash_device": f"0x{sim_model.state_hash():08x}",
            "loss_expected": losses[0], "loss_device": losses[1]}


def _mismatch(model, target, step, sample, losses, sim, h_sim=None, h_dev=None, party="simulator") -> dict:
    got = target.read_state()
    where = locate(model, state_blob(model), got) or {"tensor": None, "note": "state blobs equal (hash or loss differs)"}
    where = {"step": step, "sample": sample, **where, "parties": [party, getattr(target, "board", None) or "device"]}
    if h_sim is not None:
        where["hash_expected"], where["hash_device"] = f"0x{h_sim:08x}", f"0x{h_dev:08x}"
    if losses is not None:
        where["loss_expected"], where["loss_device"] = losses
    if sim is None:  # the reference keeps no activations between calls
        return where
    # the activations of this step (kept for backward on both sides): first differing op
    try:
        for li, l in enumerate(model.layers):
            a_sim = np.asarray(sim.A[li]).reshape(-1)
            a_dev = target.activation(li)
            d = np.flatnonzero(a_sim != a_dev[:a_sim.size])
            if d.size:
                where["first_op"] = {"layer": li, "op": l.kind, "index": int(d[0]),
                                     "expected": int(a_sim[d[0]]), "device": int(a_dev[d[0]])}
                break
    except Exception as e:  # noqa: BLE001 - the tensor location above is the main answer
        where["first_op_error"] = str(e)
    return where
