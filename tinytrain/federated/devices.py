"""Federated devices behind one interface: in-process simulated devices, emulated boards
(QEMU) and real boards on serial ports (both through the serial protocol).

Per round the coordinator calls ``update = dev.run_round(global_msg)`` (bytes in, bytes out),
then ``dev.ack(round, accepted)``; ``dev.ensure_ready()`` before a round reconnects a device
that failed earlier. A device that cannot deliver raises ``DeviceFault``.

A board whose link failed (timeout, lost connection) missed the round and is never trusted as
it is: it may be frozen rather than dead. Before its next round ``ensure_ready`` restarts it -
an emulated board is killed and booted afresh, a real one is reset by a DTR/RTS pulse - and the
round loads the global model into it whole, as for any board that rebooted. A board that still
does not answer after a restart is left out of the federation, with one logged message. (The
protocol's RESET command cannot help: a hung board does not read it.)

What runs where. Every device holds its own data partition and trains on it with the same
integer step: a simulated device in the host simulator, a board in its firmware. The local
sample order comes from the device's data PRNG for the round (``local_order``), the training
PRNG from ``client_seed``, so a simulated device and a board started from the same global
model end the round in the same state, bit for bit. Update compression and error feedback
run on the device: ``codec.compress`` in process for a simulated device; for a board whose
firmware has the update codec (HELLO flag, ``tinytrain/firmware/src/tt_fedcodec.c``), in the firmware:
ROUND_BEGIN snapshots the global model it just loaded, GET_UPDATE returns the compressed
update message the board encoded itself (the same bytes as ``codec.compress``), UPDATE_ACK
commits the board's residual when the coordinator used the update. Firmware without the
codec (or ``device_codec=False``) falls back to the agent on the host side of the serial
link: the board sends its full state blob (GET_TENSOR), the agent checks it against
STATE_HASH, compresses it and keeps the residual (logged once per device). The bytes counted
"on the wire" are those of the federated messages (global model down, update up); a board's
serial traffic is counted apart (``serial_bytes``).
"""
from __future__ import annotations

import functools
import logging
import math

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.federated.codec import CODECS, DEVICE_CODECS, Schema, compress, decode_global, encode_update
from tinytrain.federated.fedavg import client_seed, start_state

__all__ = ["DeviceFault", "Device", "SimBackend", "SimDevice", "LinkDevice", "EmulatedBoard",
           "reset_serial_board", "FaultyDevice", "local_order"]

DATA_SEED_XOR = 0x5EED
log = logging.getLogger("tinytrain.federated")


class DeviceFault(RuntimeError):
    """A device did not deliver its update this round (timeout, disconnect, reset...)."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


def local_order(seed: int, rnd: int, device: int, indices, epochs: int = 1,
                steps: int | None = None) -> np.ndarray:
    """The samples (indices into the training set) device `device` trains on in round `rnd`:
    `epochs` data-PRNG permutations of its partition, the PRNG state carried over, starting
    at prng_seed(client_seed ^ 0x5EED); with `steps`, the first `steps` of that sequence
    (continuing into further permutations if `steps` exceeds the epochs)."""
    indices = np.asarray(indices, np.int64)
    n = len(indices)
    want = n * epochs if steps is None else int(steps)
    state = fp.prng_seed(client_seed(seed, rnd, device) ^ DATA_SEED_XOR)
    out, have = [], 0
    while have < want and n:
        state, perm = fp.permutation(state, n)
        out.append(indices[perm[:want - have]])
        have += len(out[-1])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@functools.lru_cache(maxsize=8)
def _zero_residual(shapes, dtype) -> tuple:
    """The all-zero residual of a schema's tensors (flat), read-only and shared."""
    out = tuple(np.zeros(math.prod(s), dtype) for s in shapes)
    for a in out:
        a.setflags(write=False)
    return out


_LAST_BROADCAST: list = [None]  # (message, schema, base, decoded) of _decode_shared


def _decode_shared(msg, schema, base):
    """decode_global for simulated devices: the devices of one process that receive the same
    message on the same base object (every in-sync device in a round, the replica being the
    previous round's shared result) share one decode and one read-only store. Each device
    decoded and kept a copy of its own: for 10,000 W1 devices 10,000 decodes and 65 MB per
    round, which each worker process touched page by page."""
    c = _LAST_BROADCAST[0]
    if c is not None and c[1] is schema and c[2] is base and (c[0] is msg or c[0] == msg):
        return c[3]
    out = decode_global(msg, schema, base)
    for t in out[2]:
        t.setflags(write=False)  # shared: nothing may write into it
    _LAST_BROADCAST[0] = (msg, schema, base, out)
    return out


class Device:
    """Base: the agent logic shared by all kinds (data, order, codec, error feedback)."""

    kind = "device"
    shares_broadcast = False  # see _decode_shared

    def __init__(self, device_id: int, schema: Schema, indices, X, Y, *, codec: str = "none",
                 seed: int = 0, local_epochs: int = 1, local_steps: int | None = None, prox=None,
                 residual_bits: int = 32):
        if codec not in CODECS:
            raise ValueError(f"compression {codec!r}: use one of {', '.join(CODECS)}")
        self.id = int(device_id)
        self.schema = schema
        self.indices = np.asarray(indices, np.int64)
        self.X, self.Y = X, Y
        self.codec = codec
        self.seed = int(seed)
        self.local_epochs = int(local_epochs)
        self.local_steps = local_steps
        self.prox = prox      # prox.Prox: FedProx's pull toward the global model, or None
        self.residual_bits = int(residual_bits)  # width the residual is kept in (saturating)
        self.stats = {"residual_saturated": 0}     # saturated residual elements committed so far
        # every device starts from the same read-only zeros (nothing writes a residual in place:
        # compress returns a new one, ack and set_state replace it), instead of 10,000 x 4 fresh
        # arrays; kept in its own width (its values are saturated to it: exact; int64 at 64
        # bits): 10,000 W1 devices' pending residuals were 131 MB of fresh pages a round
        self._res_dtype = np.dtype({16: np.int16, 32: np.int32}.get(self.residual_bits, np.int64))
        self.residual = None if codec == "none" else list(_zero_residual(tuple(schema.shapes), self._res_dtype))
        self._pending = None  # (round, residual, saturated elements) waiting for the coordinator's ack
        self.replica = None   # the last global model received (base of delta broadcasts)

    @property
    def n_samples(self) -> int:
        return len(self.indices)

    def ensure_ready(self) -> None:
        pass

    def close(self) -> None:
        pass

    def _train(self, store, rnd: int, step: int, order) -> tuple[bytes, int]:
        """Train from `store` on X[order]; return (state blob, device-reported state hash)."""
        raise NotImplementedError

    def run_round(self, global_msg: bytes) -> bytes:
        from tinytrain.federated.codec import CorruptUpdate

        try:
            decode = _decode_shared if self.shares_broadcast else decode_global
            rnd, step, store = decode(global_msg, self.schema, self.replica)
        except CorruptUpdate as e:
            self.replica = None
            raise DeviceFault("desync", f"device {self.id}: {e}") from None
        self.replica = store
        order = local_order(self.seed, rnd, self.id, self.indices, self.local_epochs, self.local_steps)
        if len(order) == 0:
            raise DeviceFault("empty", f"device {self.id} has no samples")
        msg = self._device_update(store, rnd, step, order)
        if msg is not None:  # the device encoded its update itself (on-device codec)
            return msg
        blob, h = self._train(store, rnd, step, order)
        if fp.crc32(blob) != h and self.codec != "none":  # none: the coordinator checks it
            raise DeviceFault("corrupt", f"device {self.id}: state read back does not match its hash")
        new_step = int(np.frombuffer(blob, "<u4", 3, len(blob) - 12)[1])
        if self.codec == "none":
            return encode_update("none", self.id, rnd, len(order), new_step, h, len(self.schema.slots), blob)
        local = self.schema.store_from_blob(blob)
        st = {}
        body, recon, res = compress(self.codec, local, store, self.residual, self.residual_bits, st)
        self._pending = (rnd, [r.astype(self._res_dtype, copy=False) for r in res], st.get("residual_saturated", 0))
        from tinytrain.federated.codec import store_hash
        return encode_update(self.codec, self.id, rnd, len(order), new_step, store_hash(recon),
                             len(self.schema.shapes), body)

    def _device_update(self, store, rnd: int, step: int, order) -> bytes | None:
        """Train and return the update message encoded by the device itself, or None where
        the agent compresses (the default)."""
        return None

    def ack(self, rnd: int, accepted: bool) -> None:
        """The coordinator's verdict on this round's update: commit the error-feedback
        residual only if the update was used."""
        if self._pending is not None and self._pending[0] == rnd and accepted:
            self.residual = self._pending[1]
            self.stats["residual_saturated"] += self._pending[2]
        self._pending = None

    # device-side state that must survive a coordinator restart (the residual)
    def get_state(self):
        return None if self.residual is None else np.concatenate(self.residual).astype(np.int64, copy=False)

    def set_state(self, flat) -> None:
        if self.residual is None or flat is None:
            return
        sizes = np.cumsum([r.size for r in self.residual])[:-1]
        self.residual = [a.astype(self._res_dtype) for a in np.split(np.asarray(flat), sizes)]


# ------------------------------------------------------------------------- simulated

class SimBackend:
    """One compiled Simulator shared by any number of simulated devices: a device's round
    writes the global state into the shared model's arrays in place, trains, reads back."""

    def __init__(self, model, X, Y):
        from tinytrain.sim.simulator import Simulator

        self.model = model.copy()
        self.sim = Simulator(self.model)
        self.X, self.Y = X, Y

    def train(self, store, seed, rnd, device, step, order, prox=None) -> tuple[bytes, int]:
        """The device's round; with `prox` (prox.Prox) a pull toward `store` after every
        prox.every samples (prox.py)."""
        from tinytrain.graph.state import state_blob

        m = self.model
        start_state(m, store, seed, rnd, device, step)
        if prox is None:
            self.sim.train(self.X, self.Y, order)
        else:
            from tinytrain.federated.prox import pull_model

            for a in range(0, len(order), prox.every):
                self.sim.train(self.X, self.Y, order[a:a + prox.every])
                if a + prox.every <= len(order):
                    pull_model(m, store, prox)
        blob = state_blob(m)
        return blob, fp.crc32(blob)


class SimDevice(Device):
    kind = "simulated"
    shares_broadcast = True

    def __init__(self, device_id, schema, indices, backend: SimBackend, **kw):
        super().__init__(device_id, schema, indices, backend.X, backend.Y, **kw)
        self.backend = backend

    def _train(self, store, rnd, step, order):
        return self.backend.train(store, self.seed, rnd, self.id, step, order, self.prox)


# ---------------------------------------------------------------------------- boards

class EmulatedBoard:
    """A restartable QEMU board: connect() boots it if needed and opens a DeviceLink;
    restart() kills it (frozen or not) and boots a fresh one."""

    def __init__(self, board: str, elf, timeout: float = 10.0, retries: int = 0):
        from tinytrain.device.emulator import Emulator

        self.emu = Emulator(board, elf)
        self.timeout = timeout
        self.restarts = 0
        self.retries = retries

    def connect(self):
        """A link to the board. By default no retries on timeout: a TCP socket does not lose
        bytes, so a board silent for one request timeout is hung, and waiting out more is wasted
        (``retries`` > 0 for links through a fault proxy)."""
        from tinytrain.device.protocol import DeviceLink

        if self.emu.proc is not None and self.emu.proc.poll() is not None:
            self.emu.stop()  # it died: boot a fresh one
        self.emu.start()
        return DeviceLink(self.emu.url, timeout=self.timeout, retries=self.retries)

    def restart(self) -> None:
        self.emu.restart()
        self.restarts += 1

    @property
    def pid(self) -> int | None:
        return self.emu.proc.pid if self.emu.proc is not None else None

    def kill(self) -> None:
        """Kill the QEMU process (fault injection: the board dies mid-round)."""
        if self.emu.proc is not None:
            self.emu.proc.kill()

    def freeze(self) -> None:
        """SIGSTOP the QEMU process (fault injection: the board hangs, its socket stays open)."""
        import os
        import signal

        if self.emu.proc is not None:
            os.kill(self.emu.proc.pid, signal.SIGSTOP)

    def close(self) -> None:
        self.emu.stop()


def reset_serial_board(port: str, pulse: float = 0.1) -> None:
    """Reset a real board through its USB-serial adapter's control lines: DTR and RTS low for
    `pulse` seconds, then high (the auto-reset circuit of Arduino-style boards; boards without
    one ignore it). Never opens the port at 1200 baud, which sends some boards to their
    bootloader. On URLs without control lines (socket://) pyserial ignores the pulse."""
    import time

    import serial

    try:
        ser = serial.serial_for_url(port, baudrate=115200, do_not_open=True)
        ser.open()
    except (serial.SerialException, OSError, ValueError) as e:
        log.warning("cannot open %s to reset the board: %s", port, e)
        return
    try:
        ser.dtr = ser.rts = False
        time.sleep(pulse)
        ser.dtr = ser.rts = True
        time.sleep(pulse)
    except (serial.SerialException, OSError, NotImplementedError, ValueError) as e:
        log.warning("cannot pulse DTR/RTS on %s: %s", port, e)
    finally:
        ser.close()


class LinkDevice(Device):
    """A board (emulated or real) behind the serial protocol. `connect()` returns an open
    DeviceLink; it is called once and again only after a fault broke the link, so a real
    board's port stays open across rounds. `restart()` (optional) brings a board that missed
    a round back to its boot state before it is connected again (module docstring)."""

    kind = "board"
    parallel = True  # its own link: may run in a thread beside other boards

    def __init__(self, device_id, schema, indices, X, Y, model, connect, *, on_step=None,
                 batch: bool = True, device_codec: bool | None = None, restart=None, **kw):
        super().__init__(device_id, schema, indices, X, Y, **kw)
        # None: compress on the board when its firmware can, else on the host side of the link
        self.device_codec = device_codec
        self._device_pending = None  # (round, update CRC) awaiting UPDATE_ACK
        self._noted = False
        self.serial_bytes = 0        # serial traffic of this device's rounds (both ways)
        self.last_begin = self.last_ack = None  # the board's ROUND_BEGIN / UPDATE_ACK replies
        self.twin = model.copy()
        self.schema_hash = model.schema_hash()
        self._connect = connect
        self._restart = restart
        self.missed = False     # the link failed: restart before the next round
        self.left_out = None    # why the board is out of the federation for good, or None
        self.link = None
        self.batch = batch
        self.on_step = on_step  # test hook: on_step(device, round, k) after k samples

    def ensure_ready(self) -> None:
        from tinytrain.device.protocol import ProtocolError

        if self.link is not None:
            return
        if self.left_out:
            raise DeviceFault("left-out", self.left_out)
        restarted = self.missed and self._restart is not None
        try:
            if restarted:
                log.info("device %d missed a round: restarting it", self.id)
                self._restart()
            self.link = self._connect()
        except (ProtocolError, OSError, RuntimeError) as e:
            self.missed = True
            if restarted:
                self.left_out = (f"device {self.id} does not answer after a restart ({e}): left out "
                                 "of the federation; power-cycle it and run again with --resume")
                log.warning("%s", self.left_out)
                raise DeviceFault("left-out", self.left_out) from e
            raise DeviceFault("disconnect", f"device {self.id}: cannot connect: {e}") from e
        self.missed = False
        if self.prox is not None and not self.link.info.fedprox:
            self._drop(missed=False)
            self.left_out = (f"device {self.id}: its firmware has no FED_PROX command (--prox-mu): "
                             "rebuild it with the update codec (fedcodec=True)")
            raise DeviceFault("left-out", self.left_out)
        info = self.link.info
        if (self.codec in DEVICE_CODECS[1:] and info.fedcodec and self.device_codec is not False
                and info.residual_bits != self.residual_bits):
            self._drop(missed=False)
            self.left_out = (f"device {self.id}: its firmware keeps the residual in int{info.residual_bits}, "
                             f"this run in int{self.residual_bits}: pass --residual-bits {info.residual_bits} "
                             f"or rebuild it with -DTT_FED_RESIDUAL_BITS={self.residual_bits}")
            raise DeviceFault("left-out", self.left_out)
        got = self.link.info.schema_hash
        if got != self.schema_hash:
            self._drop(missed=False)
            raise DeviceFault("schema", f"device {self.id} runs schema 0x{got:08x}, not "
                                        f"0x{self.schema_hash:08x}: flash this model's firmware")

    def _drop(self, missed: bool = True):
        """Close the link; `missed`: it broke in a round, so restart the board before the next."""
        self.missed = self.missed or missed
        if self.link is not None:
            try:
                self.link.close()
            except Exception:  # noqa: BLE001 - the link is already broken
                pass
        self.link = None

    def on_device(self) -> bool:
        """True if this round's update is encoded by the board (codec != none and the
        firmware has the update codec, unless device_codec=False)."""
        if self.codec not in DEVICE_CODECS[1:] or self.device_codec is False or self.link is None:
            return False  # none, or a codec only the host side encodes (topk)
        if self.link.info is not None and self.link.info.fedcodec:
            return True
        if self.device_codec:
            raise DeviceFault("unsupported", f"device {self.id}: firmware has no update codec "
                                             "(device_codec=True)")
        if not self._noted:
            log.info("device %d: firmware has no update codec: compressing its updates on the host "
                     "side of its serial link", self.id)
            self._noted = True
        return False

    def _device_update(self, store, rnd, step, order):
        if not self.on_device():
            return None
        self._device_pending = None
        begin = lambda lk: self._begin(lk, rnd, CODECS.index(self.codec), store)  # noqa: E731
        msg = self._on_link(store, rnd, step, order, begin, lambda lk: lk.get_update(len(order)))
        self._device_pending = (rnd, fp.crc32(msg[:-4]))
        return msg

    def ack(self, rnd: int, accepted: bool) -> None:
        from tinytrain.device.protocol import ProtocolError

        if self._device_pending is None:
            return super().ack(rnd, accepted)
        pending, self._device_pending = self._device_pending, None
        if pending[0] != rnd or self.link is None:
            return
        try:
            n0 = self.link.bytes_sent + self.link.bytes_received
            self.last_ack = self.link.update_ack(rnd, pending[1], accepted)
            self.serial_bytes += self.link.bytes_sent + self.link.bytes_received - n0
        except (ProtocolError, OSError) as e:
            # the board keeps its old residual (the round stays open until the next ROUND_BEGIN)
            log.warning("device %d: UPDATE_ACK for round %d failed: %s", self.id, rnd, e)
            self._drop()

    def get_state(self):
        # an on-device residual lives on the board, not in the coordinator's fleet file
        return None if self.link is not None and self.link.info is not None and \
            self.link.info.fedcodec and self.codec != "none" and self.device_codec is not False \
            else super().get_state()

    def _train(self, store, rnd, step, order):
        begin = None
        if self.prox is not None:  # FED_PROX pulls toward the board's ROUND_BEGIN snapshot
            begin = lambda lk: self._begin(lk, rnd, 0, store)  # noqa: E731 - codec 0: snapshot only
        return self._on_link(store, rnd, step, order, begin,
                             lambda lk: (lk.read_params(), lk.state_hash()))

    def _begin(self, lk, rnd, codec, store):
        from tinytrain.federated.codec import store_hash

        self.last_begin = b = lk.round_begin(rnd, self.id, codec)
        if b.global_hash != store_hash(store):
            raise DeviceFault("corrupt", f"device {self.id}: global model snapshot hash "
                                         f"0x{b.global_hash:08x} != 0x{store_hash(store):08x}")

    def _on_link(self, store, rnd, step, order, begin, finish):
        """Load the round's start state, run begin(link), train on `order`, return finish(link);
        link failures become DeviceFault."""
        from tinytrain.device.protocol import DeviceError, DeviceReset, DeviceTimeout, ProtocolError
        from tinytrain.graph.state import state_blob

        if self.link is None:
            raise DeviceFault("disconnect", f"device {self.id} is not connected")
        start_state(self.twin, store, self.seed, rnd, self.id, step)
        blob = state_blob(self.twin)
        lk = self.link
        n0 = lk.bytes_sent + lk.bytes_received
        try:
            h0 = lk.load_params(blob, resume=False)
            if h0 != fp.crc32(blob):
                raise DeviceFault("corrupt", f"device {self.id}: state hash after load 0x{h0:08x} "
                                             f"!= 0x{fp.crc32(blob):08x}")
            if begin is not None:
                begin(lk)
            per = max(1, (lk.info.max_payload - 2) // (2 + lk.info.input_len)) if self.batch else 1
            prox = self.prox
            k, pull_at = 0, prox.every if prox is not None else len(order) + 1
            while k < len(order):
                idx = order[k:min(k + per, pull_at)]
                if len(idx) > 1:
                    try:
                        lk.train_batch([self.X[i] for i in idx], [int(self.Y[i]) for i in idx])
                    except DeviceError as e:
                        if e.code != 13:  # UNSUPPORTED: fall back to single steps
                            raise
                        self.batch, per = False, 1
                        continue
                else:
                    lk.train(self.X[idx[0]], int(self.Y[idx[0]]))
                k += len(idx)
                if k == pull_at:  # FedProx: after every prox.every samples, as SimBackend.train
                    lk.fed_prox(prox.mult, prox.shift)
                    pull_at += prox.every
                if self.on_step is not None:
                    self.on_step(self, rnd, k)
            out = finish(lk)
        except DeviceFault:
            raise
        except DeviceReset as e:
            raise DeviceFault("reset", f"device {self.id} restarted during round {rnd}: {e}") from e
        except DeviceTimeout as e:
            self._drop()
            raise DeviceFault("timeout", f"device {self.id} timed out in round {rnd}: {e}") from e
        except (ProtocolError, OSError) as e:
            self._drop()
            raise DeviceFault("disconnect", f"device {self.id} link failed in round {rnd}: {e}") from e
        except Exception as e:  # pyserial's SerialException is an IOError; anything else: a lost link
            self._drop()
            raise DeviceFault("disconnect", f"device {self.id} link failed in round {rnd}: "
                                            f"{type(e).__name__}: {e}") from e
        finally:
            self.serial_bytes += lk.bytes_sent + lk.bytes_received - n0
        return out

    def close(self) -> None:
        self._drop(missed=False)


# ------------------------------------------------------------------------ fault injection

class FaultyDevice:
    """Wraps a device and injects faults: plan = {(round, device_id): kind} with kind in
    timeout, disconnect, reset (the device raises DeviceFault), corrupt (one byte of the
    update flipped: CRC mismatch) or tamper (a byte flipped and the CRC recomputed: only the
    hash catches it)."""

    def __init__(self, dev, plan: dict):
        self.dev, self.plan = dev, plan

    def __getattr__(self, name):
        return getattr(self.dev, name)

    @property
    def parallel(self):
        return getattr(self.dev, "parallel", False)

    def run_round(self, global_msg: bytes) -> bytes:
        import struct

        rnd = struct.unpack_from("<I", global_msg, 4)[0]
        kind = self.plan.get((rnd, self.dev.id))
        if kind in ("timeout", "disconnect", "reset"):
            raise DeviceFault(kind, f"device {self.dev.id}: injected {kind} in round {rnd}")
        msg = bytearray(self.dev.run_round(global_msg))
        if kind in ("corrupt", "tamper"):
            msg[len(msg) // 2] ^= 0x5A
            if kind == "tamper":
                msg[-4:] = struct.pack("<I", fp.crc32(bytes(msg[:-4])))
        return bytes(msg)
