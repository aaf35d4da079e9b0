"""Simulated devices spread over worker processes, so a federation of thousands of simulated
clients uses every core.

``SimPool.build_in_workers(specs, build, workers)`` forks `workers` processes; worker w takes a
contiguous shard of the devices, builds each one itself after the fork (``build(id)``) and is
the only holder of their state: error-feedback residuals, pending residuals, the replica of the
last broadcast. The parent keeps one ``PoolDevice`` proxy per device (id, kind, sample count)
for the round engine. Building in the workers is the point: built in the parent, 10,000 W1
devices were a serial part before the fork, and each worker then replaced (ack) or dropped
memory its parent had written, page by page copied on write. ``SimPool(devices, workers)``
serves devices already built in the parent (e.g. wrapped in devices.FaultyDevice).

Per round the engine sends each worker the global message(s), the broadcast they decode to and
an empty aggregation once; each worker trains its devices, checks every update as the
coordinator does in one process (engine.take_update: CRC-32, hash, round, length, device id)
and adds the valid ones to its aggregation, then returns one outcome per device (bytes, step,
or why it was dropped) and its partial sums, which the coordinator merges
(fedavg.Aggregator.merge, server.MajorityVote.merge). The global model is the same, bit for bit:
each device's round depends only on the global message and its own state, and integer FedAvg
(and the vote) is an exact integer sum, which no order of additions changes. Checking in the
workers is the point: in the coordinator, decoding was a sixth to a quarter of a W1
federation's CPU time (10,000 and 400 clients), a serial part beside the workers.

Fork, not spawn: the children inherit the compiled simulator, the training arrays and the
partitions without pickling or recompiling (Linux; elsewhere ``workers=1`` is used).
"""
from __future__ import annotations

import multiprocessing as mp
import os
from multiprocessing.connection import wait

import numpy as np

from tinytrain.federated.devices import DeviceFault

__all__ = ["SimPool", "PoolDevice", "can_fork"]

def can_fork() -> bool:
    return "fork" in mp.get_all_start_methods()


class PoolDevice:
    """The coordinator's handle on a device that lives in a worker process."""

    kind = "simulated"

    def __init__(self, device_id: int, n_samples: int, group: "SimPool"):
        self.id = device_id
        self.n_samples = n_samples
        self.group = group

    def close(self) -> None:
        self.group.close()


class _BuildFailed:
    """A worker's reply when building its devices raised: the coordinator raises it."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def _start(conn, shard, build) -> None:
    """Worker entry: build the shard's devices here (`build` given) or take them built."""
    if build is not None:
        try:
            shard = [build(i) for i in shard]
        except Exception as e:  # reported at the coordinator's first command
            try:
                conn.recv()
                conn.send(_BuildFailed(e))
            except (EOFError, OSError):
                pass
            return
    _serve(conn, shard)


def _serve(conn, devices) -> None:
    """Worker loop: commands from the coordinator, replies on the same pipe."""
    from tinytrain.federated.engine import take_update

    while True:
        cmd, *args = conn.recv()
        if cmd == "round":
            full, delta, synced, check, agg = args
            out = []
            for d in devices:
                msg = delta if (delta is not None and d.id in synced) else full
                try:
                    reply = d.run_round(msg)
                except DeviceFault as e:
                    reply = e
                out.append((d.id, len(msg), *take_update(agg, d.id, reply, *check)))
            conn.send((out, agg))
        elif cmd == "ack":
            rnd, ids = args
            for d in devices:
                d.ack(rnd, d.id in ids)
            conn.send(True)
        elif cmd == "get_state":
            conn.send({d.id: s for d in devices if (s := d.get_state()) is not None})
        elif cmd == "set_state":
            states, held, synced = args
            for d in devices:
                if d.id in states:
                    d.set_state(states[d.id])
                if held is not None and d.id in synced:
                    d.replica = [t.copy() for t in held]
            conn.send(True)
        elif cmd == "close":
            conn.close()
            return
        else:
            raise ValueError(f"unknown command {cmd!r}")


class SimPool:
    """`devices` (simulated, built in this process) served by `workers` forked processes; see
    build_in_workers for devices each worker builds itself."""

    def __init__(self, devices, workers: int, *, build=None):
        devices = list(devices)
        if not can_fork():
            raise ValueError("worker processes need the 'fork' start method (Linux): use workers=1")
        workers = max(1, min(int(workers), len(devices)))
        if build is None:
            specs = [(d.id, d.n_samples) for d in devices]
        else:
            specs, devices = [(int(i), int(n)) for i, n in devices], [int(i) for i, _ in devices]
        ctx = mp.get_context("fork")
        self.conns, self.procs = [], []
        self.pid = os.getpid()
        try:
            for shard in np.array_split(np.arange(len(devices)), workers):
                parent, child = ctx.Pipe()
                p = ctx.Process(target=_start, args=(child, [devices[i] for i in shard], build), daemon=True)
                p.start()
                child.close()
                self.conns.append(parent)
                self.procs.append(p)
        except BaseException:
            self.close()
            raise
        self.proxies = [PoolDevice(i, n, self) for i, n in specs]

    @classmethod
    def build_in_workers(cls, specs, build, workers: int) -> "SimPool":
        """specs: (device id, sample count) per device, in device order; build(id) -> the
        device, called in the worker that serves it, after the fork (`build` is inherited,
        not pickled: a closure over the shared simulator and partitions is fine)."""
        return cls(specs, workers, build=build)

    @staticmethod
    def _recv(c):
        reply = c.recv()
        if isinstance(reply, _BuildFailed):
            raise RuntimeError(f"a worker could not build its devices: {reply.exc!r}") from reply.exc
        return reply

    def run_round(self, full: bytes, delta: bytes | None, synced, check, agg) -> list:
        """Every device's round: [(device id, bytes sent, bytes up, step or None, drop record or
        None)] (engine.take_update's outcome) in device order; the valid updates are merged into
        `agg`. check: (schema, broadcast, round) to check the updates against."""
        for c in self.conns:
            c.send(("round", full, delta, frozenset(synced), check, agg))
        out = []
        for c in self.conns:  # shards are contiguous: worker order is device order
            part, sums = self._recv(c)
            out += part
            agg.merge(sums)
        return out

    def _all(self, *cmd):
        for c in self.conns:
            c.send(cmd)
        return [self._recv(c) for c in self.conns]

    def ack(self, rnd: int, ids) -> None:
        self._all("ack", rnd, frozenset(ids))

    def get_states(self) -> dict:
        out = {}
        for part in self._all("get_state"):
            out.update(part)
        return out

    def set_states(self, states: dict, held=None, synced=()) -> None:
        self._all("set_state", states, held, frozenset(synced))

    def close(self) -> None:
        if not self.conns or os.getpid() != self.pid:
            return
        for c in self.conns:
            try:
                c.send(("close",))
                c.close()
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
        self.conns, self.procs = [], []
