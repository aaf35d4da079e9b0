"""The round engine: broadcast the global model, let every device train locally, verify and
aggregate the updates with integer FedAvg, evaluate, save, repeat.

A round r (1-based):
 1. the global message (round, global optimizer step, parameter store; codec.encode_global)
    goes to every device that is ready (a device that failed before is reconnected first);
 2. each device trains on its own samples (devices.local_order) and returns an update;
 3. every update is checked (CRC-32, hash, round, length: codec.decode_update); a device that
    raised DeviceFault or sent a bad update is left out of the round ("dropped");
 4. with at least `quorum` accepted updates the new global store is their integer FedAvg
    (fedavg.Aggregator; through FedAvgM's server rule, server.py, when configured), the global step becomes the largest device step, devices are told
    whether their update was used (error-feedback residuals commit only then); without a
    quorum the round is attempted again (up to `max_retries` times), then QuorumError;
 5. the global model is evaluated on the test set and saved (checkpoint), atomically: the
    device-side residuals to ``fleet-rNNNN.npz`` first, then ``global.tt`` (io.atomic_write:
    temp file, fsync, os.replace; temp files a killed run left are removed) which names that
    round. ``global.tt`` is the commit point: resuming loads it, the fleet file of its round
    and continues - bit-identical to never stopping.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from tinytrain.federated.codec import Schema, CorruptUpdate, decode_update, encode_global
from tinytrain.federated.devices import DeviceFault
from tinytrain.federated.fedavg import set_store, store_tensors
from tinytrain.federated.server import ServerMomentum, aggregator, server_opt

__all__ = ["FedConfig", "Federation", "QuorumError", "DevicesUnreachable", "take_update"]


def take_update(agg, device: int, reply, schema, glob, rnd: int):
    """Step 3 for one device: check its reply (bytes, or the DeviceFault it raised) against the
    broadcast `glob` of round `rnd` and add it to `agg`. Returns (bytes up, the device's
    optimizer step or None, None or the drop record {"device", "reason", "detail"})."""
    if isinstance(reply, DeviceFault):
        return 0, None, {"device": device, "reason": reply.kind, "detail": str(reply)}
    try:
        u = decode_update(reply, schema, glob, rnd)
        if u.device != device:
            raise CorruptUpdate(f"update names device {u.device}, came from {device}")
    except CorruptUpdate as e:
        return len(reply), None, {"device": device, "reason": "corrupt", "detail": str(e)}
    agg.add_update(u)
    return len(reply), u.step, None


class QuorumError(RuntimeError):
    """Too few devices delivered a valid update, even after retries."""


class DevicesUnreachable(QuorumError, ValueError):
    """No device could even be connected to before any round ran (a wrong port, no QEMU,
    another model's firmware): the user's to fix, so a ValueError the CLI reports in one line.
    Retrying would not help, so it is raised at the first attempt."""


@dataclass
class FedConfig:
    rounds: int = 10
    local_epochs: int = 1
    local_steps: int | None = None      # cap on samples per device per round
    partition: str = "iid"               # iid | dirichlet:ALPHA
    compress: str = "none"               # uplink: none | int8 | int4 | sign
    compress_down: str | None = None     # broadcast; None: the same as compress
    seed: int = 0
    quorum: float = 0.5                  # < 1: fraction of devices; >= 1: a count
    max_retries: int = 2
    keep_rounds: bool = True             # also save rounds/global-rNNNN.tt
    server_momentum: float = 0.0         # FedAvgM beta (server.py); 0: plain FedAvg
    server_lr: float = 1.0               # FedAvgM eta
    prox_mu: float = 0.0                 # FedProx mu (prox.py); 0: no proximal term
    prox_every: int = 16                 # samples between proximal pulls
    preloaded: bool = False              # devices start holding the initial global model
    residual_bits: int = 32              # width of the devices' error-feedback residual (saturating)

    @property
    def down(self) -> str:
        return self.compress if self.compress_down is None else self.compress_down

    def prox(self, model):
        """The compiled proximal pull for `model` (its base lr), or None (prox.prox_config)."""
        from tinytrain.federated.prox import prox_config

        return prox_config(self.prox_mu, self.prox_every, model.optimizer.lr)

    def need(self, k: int) -> int:
        q = self.quorum
        return max(1, min(k, int(q) if q >= 1 else math.ceil(q * k)))


def _unreachable(faults) -> str:
    """One line: each distinct reason once, with the devices it stopped."""
    by_reason: dict[str, list] = {}
    for dev, e in faults:
        reason = str(e).removeprefix(f"device {dev.id}: ")
        by_reason.setdefault(reason, []).append(str(dev.id))
    return "no device could be reached: " + "; ".join(
        f"device{'s' if len(ids) > 1 else ''} {', '.join(ids)}: {r}" for r, ids in by_reason.items())


class Federation:
    """Coordinator of `devices` (objects with the devices.Device interface) training `model`
    (its current parameters are the initial global model) on `dataset`'s test split for
    evaluation. `out`: directory for checkpoints (None: nothing saved). `log(str)`: progress."""

    def __init__(self, model, dataset, devices, config: FedConfig | None = None, *, out=None,
                 log=None):
        from tinytrain.sim.simulator import Simulator
        from tinytrain.train import prepare_inputs

        self.config = config or FedConfig()
        self.model = model.copy()  # the global model (its store is the global state)
        for d in (self.model.accum, self.model.velocity):
            for a in d.values():
                a[...] = 0
        self.dataset = dataset
        self.devices = list(devices)
        groups = {id(getattr(d, "group", None)) for d in self.devices}
        self.group = getattr(self.devices[0], "group", None) if self.devices else None
        if len(groups) > 1:
            raise ValueError("devices in worker processes (SimPool) cannot be mixed with other devices")
        self.schema = Schema.of(self.model)
        self.server = ServerMomentum(server_opt(self.config.server_momentum, self.config.server_lr),
                                     store_tensors(self.model))
        _, _, self.Xt, self.Yt = prepare_inputs(self.model, dataset)
        self._eval_model = self.model.copy()
        self._eval_sim = Simulator(self._eval_model)
        self.out = Path(out) if out is not None else None
        self.log = log or (lambda s: None)
        self.round = 0
        self.reached = False  # has any device ever been connected to?
        self.step = int(self.model.meta[1])
        self.history: list[dict] = []
        self.bytes_up = self.bytes_down = 0
        self.dropped_total = 0
        self.held = None        # the model in-sync devices hold (last broadcast, decoded)
        self.synced = set()     # ids of devices known to hold `held`
        if self.config.preloaded and self.config.down != "none":
            # the devices were flashed with (or built from the seed of) the initial model: round
            # 1's broadcast is a delta against it like every later one, not the model whole
            self.held, self.synced = self.store, {d.id for d in self.devices}
            if self.group is not None:
                self.group.set_states({}, self.held, self.synced)
            for d in self.devices if self.group is None else ():
                d.replica = [t.copy() for t in self.held]

    # ------------------------------------------------------------------ state
    @property
    def store(self):
        return [t.copy() for t in store_tensors(self.model)]

    def accuracy(self) -> float:
        set_store(self._eval_model, store_tensors(self.model))
        pred = self._eval_sim.predict(self.Xt)
        return float(np.mean(pred == self.Yt)) if len(self.Yt) else float("nan")

    def state_hash(self) -> int:
        return self.model.state_hash()

    # ------------------------------------------------------------------ rounds
    def run_round(self) -> dict:
        cfg, r = self.config, self.round + 1
        need = cfg.need(len(self.devices))
        for attempt in range(cfg.max_retries + 1):
            rec = self._attempt(r, need, attempt)
            if rec is not None:
                return rec
        raise QuorumError(f"round {r}: fewer than {need} of {len(self.devices)} devices delivered a "
                          f"valid update in {cfg.max_retries + 1} attempts")

    def serial_bytes(self) -> int:
        """Serial-link traffic of the boards so far (both ways; simulated devices have none)."""
        return sum(getattr(d, "serial_bytes", 0) for d in self.devices)

    def _attempt(self, r: int, need: int, attempt: int) -> dict | None:
        t0 = time.perf_counter()
        serial0 = self.serial_bytes()
        full, glob = encode_global(r, self.step, self.store)
        delta = None
        if self.config.down != "none" and self.held is not None:
            delta, glob = encode_global(r, self.step, self.store, self.config.down, self.held)
            full, _ = encode_global(r, self.step, glob)  # late joiners get the same model whole
        agg = aggregator(self.config.compress, glob)
        up = down = 0
        accepted, dropped, steps = [], [], []
        def exchange(dev):
            """(bytes sent to dev, its reply or the DeviceFault)."""
            sent = 0
            try:
                dev.ensure_ready()
            except DeviceFault as e:
                e.at_connect = True
                return sent, e
            try:
                msg = delta if (delta is not None and dev.id in self.synced) else full
                sent = len(msg)
                return sent, dev.run_round(msg)
            except DeviceFault as e:
                return sent, e

        check = (self.schema, glob, r)
        replies = {}
        if self.group is not None:
            # simulated devices in worker processes (pool.SimPool): each worker checks and adds
            # up its own devices' updates (take_update, as below) and sends its partial sums
            outcomes = self.group.run_round(full, delta, self.synced, check, agg)
        else:
            if len(self.devices) > 1 and all(getattr(d, "parallel", False) for d in self.devices):
                # boards train at the same time (each one its own link); simulated devices share
                # one simulator and run one after another
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(max_workers=min(32, len(self.devices))) as pool:
                    stream = list(zip(self.devices, pool.map(exchange, self.devices)))
            else:
                stream = ((d, exchange(d)) for d in self.devices)
            outcomes = []
            for dev, (sent, reply) in stream:
                replies[dev.id] = (sent, reply)
                outcomes.append((dev.id, sent, *take_update(agg, dev.id, reply, *check)))
        by_id = {d.id: d for d in self.devices}
        for did, sent, nup, step, drop in outcomes:
            down += sent
            up += nup
            if drop is None:
                accepted.append(by_id[did])
                steps.append(step)
            else:
                dropped.append(drop)
        accepted.sort(key=lambda d: d.id)  # worker shards may answer out of order
        dropped.sort(key=lambda d: d["device"])
        faults = [(dev, replies[dev.id][1]) for dev in self.devices
                  if getattr(replies.get(dev.id, (0, None))[1], "at_connect", False)]
        if not self.reached and len(faults) == len(self.devices):
            raise DevicesUnreachable(_unreachable(faults))
        self.reached = True
        self.bytes_up += up
        self.bytes_down += down
        self.dropped_total += len(dropped)
        ok = len(accepted) >= need
        ids = {d.id for d in accepted} if ok else set()
        if self.group is not None:
            self.group.ack(r, ids)
        for dev in self.devices if self.group is None else ():
            dev.ack(r, dev.id in ids)
        for d in dropped:
            self.log(f"round {r}: device {d['device']} dropped ({d['reason']}): {d['detail']}")
        if not ok:
            self.log(f"round {r} attempt {attempt + 1}: {len(accepted)} valid updates < quorum {need}: retrying")
            return None
        self.held, self.synced = glob, ids
        set_store(self.model, self.server.step(glob, agg.result()))  # FedAvg, or FedAvgM
        self.step = max(steps)
        self.model.meta[1] = self.step
        self.round = r
        acc = self.accuracy()
        rec = {"round": r, "accuracy": acc, "devices": len(self.devices), "accepted": len(accepted),
               "dropped": dropped, "samples": agg.N, "bytes_up": up, "bytes_down": down,
               "bytes_on_wire": up + down, "bytes_on_wire_total": self.bytes_up + self.bytes_down,
               "serial_bytes": self.serial_bytes() - serial0,
               "attempts": attempt + 1, "seconds": time.perf_counter() - t0,
               "state_hash": f"{self.state_hash():08x}"}
        self.history.append(rec)
        self._save()
        self.log(f"round {r:3d}/{self.config.rounds}  accuracy {acc:.4f}  updates {len(accepted)}/"
                 f"{len(self.devices)}  dropped {len(dropped)}  up {up} B  down {down} B  "
                 f"{rec['seconds']:.2f}s")
        return rec

    def run(self, rounds: int | None = None) -> dict:
        target = self.config.rounds if rounds is None else rounds
        while self.round < target:
            self.run_round()
        return self.summary()

    def summary(self) -> dict:
        h = self.history
        return {"rounds": self.round, "final_accuracy": h[-1]["accuracy"] if h else self.accuracy(),
                "accuracy_per_round": [e["accuracy"] for e in h],
                "bytes_on_wire": self.bytes_up + self.bytes_down, "bytes_up": self.bytes_up,
                "bytes_down": self.bytes_down, "dropped_updates": self.dropped_total,
                "serial_bytes": self.serial_bytes(),
                "devices": len(self.devices), "compress": self.config.compress,
                "partition": self.config.partition, "state_hash": f"{self.state_hash():08x}",
                "params": self.schema.n_params,
                "int32_params_bytes_per_update": 4 * self.schema.n_params,
                # error-feedback residual elements saturated to --residual-bits by simulated
                # devices in this process (None with workers or boards: a board counts its own,
                # tt_fedcodec_residual_saturations, and equals its simulated twin)
                "residual_saturated": None if self.group is not None or
                any(getattr(d, "kind", "") == "board" for d in self.devices) else
                sum(getattr(d, "stats", {}).get("residual_saturated", 0) for d in self.devices),
                "out": str(self.out) if self.out else None}

    # ------------------------------------------------------------- checkpoints
    def _save(self) -> None:
        if self.out is None:
            return
        from tinytrain.graph import io as tio

        self.out.mkdir(parents=True, exist_ok=True)
        fleet = f"fleet-r{self.round:04d}.npz"
        if self.group is not None:
            states = {str(i): s for i, s in self.group.get_states().items()}
        else:
            states = {str(d.id): s for d in self.devices if (s := d.get_state()) is not None}
        if self.held is not None and self.config.down != "none":
            states.update({f"held{i}": t for i, t in enumerate(self.held)})
        if not self.server.opt.plain:
            states["server-momentum"] = self.server.get_state()
        if states:
            tio.atomic_write(self.out / fleet, lambda f: np.savez(f, **states))
        extra = {"federated": {"round": self.round, "step": self.step, "config": asdict(self.config),
                               "history": self.history, "bytes_up": self.bytes_up,
                               "bytes_down": self.bytes_down, "dropped_total": self.dropped_total,
                               "fleet": fleet if states else None,
                               "devices": [d.id for d in self.devices],
                               "synced": sorted(self.synced)},
                 "dataset": self.dataset.name}
        tio.save(self.model, self.out / "global.tt", extra=extra)  # the commit point
        if self.config.keep_rounds:
            tio.save(self.model, self.out / "rounds" / f"global-r{self.round:04d}.tt", extra=extra)
        for old in self.out.glob("fleet-r*.npz"):
            if old.name != fleet:
                old.unlink()

    def resume(self) -> bool:
        """Continue from `out`/global.tt if it exists; returns whether it did."""
        from tinytrain.graph import io as tio

        if self.out is None or not (self.out / "global.tt").exists():
            return False
        saved, extra = tio.load(self.out / "global.tt")
        fed = extra.get("federated")
        if fed is None:
            raise ValueError(f"{self.out / 'global.tt'} is not a federated checkpoint")
        if saved.schema_hash() != self.model.schema_hash():
            raise ValueError(f"{self.out / 'global.tt'} holds another model: cannot resume")
        mine, default = asdict(self.config), asdict(FedConfig())
        for k in ("local_epochs", "local_steps", "partition", "compress", "seed", "server_momentum",
                  "server_lr", "prox_mu", "prox_every"):
            saved_k = fed["config"].get(k, default[k])  # checkpoints from before the option
            if saved_k != mine[k]:
                raise ValueError(f"cannot resume: the checkpoint used {k}={saved_k!r}, "
                                 f"this run {k}={mine[k]!r}")
        if fed["devices"] != [d.id for d in self.devices]:
            raise ValueError("cannot resume: the checkpoint was written by another set of devices")
        set_store(self.model, store_tensors(saved))
        self.round, self.step = int(fed["round"]), int(fed["step"])
        self.model.meta[1] = self.step
        self.history = list(fed["history"])
        self.bytes_up, self.bytes_down = int(fed["bytes_up"]), int(fed["bytes_down"])
        self.dropped_total = int(fed["dropped_total"])
        if fed.get("fleet"):
            with np.load(self.out / fed["fleet"]) as z:
                states = {d.id: z[str(d.id)] for d in self.devices if str(d.id) in z.files}
                if "server-momentum" in z.files:
                    self.server.set_state(z["server-momentum"])
                if "held0" in z.files:
                    self.held = [z[f"held{i}"] for i in range(len(self.schema.shapes))]
                    self.synced = set(fed.get("synced", []))
            if self.group is not None:
                self.group.set_states(states, self.held, self.synced)
            for d in self.devices if self.group is None else ():
                if d.id in states:
                    d.set_state(states[d.id])
                if self.held is not None and d.id in self.synced:  # their copy of the last broadcast
                    d.replica = [t.copy() for t in self.held]
        self.log(f"resumed from {self.out / 'global.tt'} after round {self.round}")
        return True

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
        for d in self.devices if self.group is None else ():
            d.close()


def write_plot(history, path, title="federated training") -> Path:
    """PNG: test accuracy per round, and bytes on the wire per round (up, down)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    r = [e["round"] for e in history]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.5))
    a1.plot(r, [e["accuracy"] for e in history], marker="o", ms=3)
    a1.set_xlabel("round")
    a1.set_ylabel("test accuracy (global model)")
    a1.grid(alpha=0.3)
    a2.bar(r, [e["bytes_down"] for e in history], label="down (global model)")
    a2.bar(r, [e["bytes_up"] for e in history], bottom=[e["bytes_down"] for e in history], label="up (updates)")
    a2.set_xlabel("round")
    a2.set_ylabel("bytes on the wire")
    a2.legend()
    a2.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    from tinytrain.graph.io import atomic_write  # a crash leaves the old picture or the new one

    try:
        return atomic_write(path, lambda f: fig.savefig(f, format="png", dpi=100))
    finally:
        plt.close(fig)


def dumps(obj) -> str:
    return json.dumps(obj, sort_keys=True)
