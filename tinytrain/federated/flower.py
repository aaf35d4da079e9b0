"""tinytrain on Flower (optional extra: ``pip install tinytrain-mcu[flower]``): the integer FedAvg
as a Flower ``Strategy`` and the ClientApp / ServerApp bodies of the Flower App in
``examples/flower-app`` (``flwr run``), written for flwr's Message API (flwr 1.42:
``flwr.serverapp.strategy.FedAvg``, ``flwr.app`` records, ``Grid``).

What travels. The messages carry tinytrain's own bytes, so the ServerApp checks every update
exactly as tinytrain's engine does (CRC-32, length, round, schema, state hash:
``codec.decode_update``) and aggregates with the same integer FedAvg (``fedavg.Aggregator``,
round to nearest, ties toward +inf); Flower moves the bytes, samples the nodes, logs records.

* train message (server -> node): ConfigRecord "tt": ``global`` (``codec.encode_global``,
  codec none: broadcasts go uncompressed through Flower), ``round``, and ``used-dev`` /
  ``used-round``: for the devices the node served before, the last round whose update was
  used, so each device commits its error-feedback residual only then (``Device.ack``).
* reply (node -> server): ConfigRecord "tt": ``updates`` (one ``codec.encode_update`` per
  device the node serves), ``faults`` (``"device:kind"`` for those that could not train);
  MetricRecord "metrics": ``num-examples``.

A node serves the devices named by its node_config: ``devices="0,1"`` (deployment: a gateway
host with several devices), else (simulation) the run_config ``devices-per-node`` K devices
from ``partition-id * K`` on (default K = 1: one device per node; K > 1 cuts Flower's
per-message cost for large simulated federations).
Device kinds: simulated (default; one SimBackend per process), or ``gateway="HOST:PORT"``, a
long-lived ``tinytrain federate-gateway`` process on the node's host that owns the boards
(``tinytrain.federated.gateway``; a Flower ClientApp process lives for one message only, a
board's QEMU or serial port must outlive it). The device's residual lives in the node's
``context.state`` for simulated devices, on the gateway for boards.

Rounds without quorum: fewer valid updates than ``quorum`` -> the global model is left
unchanged and nothing is saved for that round (Flower's loop goes on to the next round;
tinytrain's own engine would retry the round).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from tinytrain.federated.codec import HEADER, CorruptUpdate, Schema, decode_update, encode_global
from tinytrain.federated.engine import FedConfig
from tinytrain.federated.fedavg import set_store, store_tensors
from tinytrain.federated.runconfig import RUN_CONFIG, settings
from tinytrain.federated.server import aggregator

__all__ = ["RUN_CONFIG", "settings", "IntegerFedAvg", "client_train", "server_main",
           "make_client_app", "make_server_app", "run"]

_CACHE: dict = {}  # per process: (model, X, Y, schema, partitions), simulated backends


def _setup(s: dict, clients: int):
    key = (s["model"], s["data"], clients, s["partition"], s["seed"])
    if key not in _CACHE:
        from tinytrain.federated.api import resolve
        from tinytrain.federated.partition import partition
        from tinytrain.train import prepare_inputs

        model, ds = resolve(s["model"], s["data"], s["seed"])
        X, Y, _, _ = prepare_inputs(model, ds)
        _CACHE[key] = (model, X, Y, Schema.of(model), partition(Y, clients, s["partition"], s["seed"]))
    return _CACHE[key]


def _served(node_config, per_node: int = 1) -> list[int]:
    """The tinytrain device ids a node serves: node_config devices="0,1", or (simulation) the
    per_node devices from partition-id * per_node on (run_config devices-per-node)."""
    if "devices" in node_config:
        try:
            return [int(v) for v in str(node_config["devices"]).split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"node_config devices={node_config['devices']!r}: give device ids, "
                             "e.g. devices=\"0,1\"") from None
    p = int(node_config["partition-id"])
    return list(range(p * per_node, (p + 1) * per_node))


def _node_clients(s: dict, node_config) -> int:
    k = s["clients"] or int(node_config.get("num-partitions", 0)) * s["devices-per-node"]
    if k < 1:
        raise ValueError("run_config clients=0 needs num-partitions in the node_config (simulation); "
                         "in deployment set clients to the number of devices")
    return k


# --------------------------------------------------------------------------- client side

def _restore(dev, st, used: dict) -> None:
    """Bring a simulated device's error-feedback state back from the node's context.state and
    commit its pending residual if the server used that update."""
    key = f"tt-res-{dev.id}"
    if key not in st:
        return
    rec = st[key]
    if "committed" in rec:  # absent: all zero (not stored)
        dev.set_state(rec["committed"].numpy())
    pending_round = int(st[f"tt-meta-{dev.id}"]["pending-round"])
    if "pending" in rec and used.get(dev.id) == pending_round:
        dev.set_state(rec["pending"].numpy())


def _keep(dev, st) -> None:
    from flwr.app import Array, ArrayRecord, ConfigRecord

    if dev.residual is None:
        return
    # in the residual's own width (its values were saturated to it), an all-zero one not at all:
    # the node's context.state travels with every message of the simulation engine
    dt = {64: np.int64, 32: np.int32, 16: np.int16}[dev.residual_bits]
    recs = {}
    if any(r.any() for r in dev.residual):
        recs["committed"] = np.concatenate(dev.residual).astype(dt)
    if dev._pending is not None:
        recs["pending"] = np.concatenate(dev._pending[1]).astype(dt)
    st[f"tt-res-{dev.id}"] = ArrayRecord({k: Array(np.ascontiguousarray(v)) for k, v in recs.items()})
    st[f"tt-meta-{dev.id}"] = ConfigRecord({"pending-round": dev._pending[0] if dev._pending else -1})


def client_train(msg, context, run_config=None):
    """The ClientApp's train handler: every device this node serves trains one round from the
    global message; the reply carries their update messages. run_config: instead of the
    context's (run_simulation has none)."""
    from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

    from tinytrain.federated.devices import DeviceFault, SimBackend, SimDevice

    s = settings(context.run_config if run_config is None else run_config)
    tt = msg.content["tt"]
    gmsg = bytes(tt["global"])
    used = dict(zip((int(v) for v in tt.get("used-dev", [])), (int(v) for v in tt.get("used-round", []))))
    used.pop(-1, None)
    ids = _served(context.node_config, s["devices-per-node"])
    updates, faults, n = [], [], 0
    if "gateway" in context.node_config:
        from tinytrain.federated.gateway import request

        updates, faults, n = request(str(context.node_config["gateway"]), gmsg, ids, used, s["run"],
                                     timeout=s["round-timeout"])
    else:
        cfg = s["config"]
        k = _node_clients(s, context.node_config)
        model, X, Y, schema, parts = _setup(s, k)
        bk = ("sim", id(model))
        if bk not in _CACHE:
            _CACHE[bk] = SimBackend(model, X, Y)
        for i in ids:
            if not 0 <= i < k:
                raise ValueError(f"node serves device {i}, but the federation has devices 0..{k - 1}")
            dev = SimDevice(i, schema, parts[i], _CACHE[bk], codec=cfg.compress, seed=cfg.seed,
                            local_epochs=cfg.local_epochs, local_steps=cfg.local_steps,
                            prox=cfg.prox(model), residual_bits=cfg.residual_bits)
            _restore(dev, context.state, used)
            try:
                updates.append(dev.run_round(gmsg))
                n += HEADER.unpack_from(updates[-1])[5]  # the update's n_samples
            except DeviceFault as e:
                faults.append(f"{i}:{e.kind}")
            _keep(dev, context.state)
    content = {"tt": ConfigRecord({"updates": updates or [b""], "faults": faults or [""]}),
               "metrics": MetricRecord({"num-examples": int(n)})}
    return Message(RecordDict(content), reply_to=msg)


# --------------------------------------------------------------------------- server side

def _store_record(store):
    from flwr.app import Array, ArrayRecord

    return ArrayRecord({f"t{i}": Array(np.ascontiguousarray(t)) for i, t in enumerate(store)})


def _store_of(arrays) -> list[np.ndarray]:
    return [arrays[k].numpy() for k in arrays.keys()]


def _fedavg_base():
    from flwr.serverapp.strategy import FedAvg

    return FedAvg


class IntegerFedAvg(_fedavg_base()):
    """tinytrain's integer FedAvg as a Flower strategy: Flower's FedAvg node sampling
    (fraction_train, min_train_nodes, min_available_nodes), tinytrain's messages, checks and
    rounding. The ArrayRecord Flower passes around is the global parameter store (native
    integer dtypes, schema order); `history` collects one record per round."""

    def __init__(self, model, dataset, config: FedConfig, clients: int, *, out=None, log=None,
                 fraction_train: float = 1.0, min_available_nodes: int = 1):
        super().__init__(fraction_train=fraction_train, fraction_evaluate=0.0,
                         min_train_nodes=1, min_available_nodes=max(1, min_available_nodes))
        from tinytrain.sim.simulator import Simulator
        from tinytrain.train import prepare_inputs

        self.model, self.dataset, self.config, self.clients = model.copy(), dataset, config, clients
        for d in (self.model.accum, self.model.velocity):
            for a in d.values():
                a[...] = 0
        self.schema = Schema.of(self.model)
        from tinytrain.federated.server import ServerMomentum, server_opt

        self.server = ServerMomentum(server_opt(config.server_momentum, config.server_lr),
                                     store_tensors(self.model))  # FedAvgM, as the engine
        config.prox(self.model)  # a pull the model's lr cannot take fails here, not on the nodes
        _, _, self.Xt, self.Yt = prepare_inputs(self.model, dataset)
        self._ev = self.model.copy()
        self._sim = Simulator(self._ev)
        self.step = int(self.model.meta[1])
        self.used: dict[int, int] = {}           # device -> last round its update was used
        self.node_devices: dict[int, list] = {}  # node id -> device ids it answered for
        self.history: list[dict] = []
        self.out = Path(out) if out else None
        self.log = log or (lambda s: None)
        self._glob = None
        self._t0 = 0.0
        self._down = 0
        self._sent: set = set()

    def initial_arrays(self):
        return _store_record(store_tensors(self.model))

    def configure_train(self, server_round, arrays, config, grid):
        from flwr.app import ConfigRecord, Message, RecordDict
        from flwr.serverapp.strategy.strategy_utils import sample_nodes

        self._t0 = time.perf_counter()
        self._glob = _store_of(arrays)
        gmsg, _ = encode_global(server_round, self.step, self._glob)
        # min_available_nodes gathers the federation before round 1; later rounds go on with
        # the nodes still connected, and the quorum of devices decides (tinytrain's rule)
        least = self.min_available_nodes if server_round == 1 else 1
        total = len(list(grid.get_node_ids()))
        want = max(int(total * self.fraction_train), self.min_train_nodes)
        nodes, _ = sample_nodes(grid, least, want)
        self._down = len(gmsg) * len(nodes)
        self._sent = set(nodes)
        msgs = []
        for node in nodes:
            devs = [d for d in self.node_devices.get(node, []) if d in self.used]
            rec = ConfigRecord({"global": gmsg, "round": server_round, "used-dev": devs or [-1],
                                "used-round": [self.used[d] for d in devs] or [-1]})
            msgs.append(Message(RecordDict({"tt": rec}), dst_node_id=node, message_type="train"))
        return msgs

    def aggregate_train(self, server_round, replies):
        from flwr.app import MetricRecord

        agg, accepted, steps = aggregator(self.config.compress, self._glob), [], []
        dropped, up, seen = [], 0, set()
        answered = set()
        for reply in replies:
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                lost = self.node_devices.get(node, [])
                dropped += [{"device": d, "reason": "node", "detail": reply.error.reason} for d in lost] or \
                           [{"device": -1, "reason": "node", "detail": f"node {node}: {reply.error.reason}"}]
                continue
            tt = reply.content["tt"]
            dropped += [{"device": int(f.split(":")[0]), "reason": f.split(":")[1], "detail": f}
                        for f in tt["faults"] if f]
            mine = []
            for b in (bytes(x) for x in tt["updates"] if len(x)):
                up += len(b)
                try:
                    u = decode_update(b, self.schema, self._glob, server_round)
                    if u.device in seen or not 0 <= u.device < self.clients:
                        raise CorruptUpdate(f"update names device {u.device}: a duplicate or not one of "
                                            f"0..{self.clients - 1}")
                except CorruptUpdate as e:
                    dropped.append({"device": -1, "reason": "corrupt", "detail": f"node {node}: {e}"})
                    continue
                seen.add(u.device)
                mine.append(u.device)
                agg.add_update(u)
                accepted.append(u.device)
                steps.append(u.step)
            if mine:
                self.node_devices[node] = mine
        for node in self._sent - answered:  # no reply within round-timeout
            dropped += [{"device": d, "reason": "no-reply", "detail": f"node {node} did not answer"}
                        for d in self.node_devices.get(node, [])]
        need = self.config.need(self.clients)
        rec = {"round": server_round, "accepted": len(accepted), "accepted_devices": sorted(accepted),
               "dropped": sorted(dropped, key=lambda d: d["device"]),
               "samples": agg.N, "bytes_up": up, "bytes_down": self._down}
        metrics = MetricRecord({"accepted": len(accepted), "dropped": len(dropped), "samples": int(agg.N),
                                "bytes-up": up, "bytes-down": self._down})
        if len(accepted) < need:
            self.log(f"round {server_round}: {len(accepted)} valid updates < quorum {need}: global model "
                     "unchanged, nothing saved")
            rec["accuracy"] = None
            self.history.append(rec)
            return None, metrics
        set_store(self.model, self.server.step(self._glob, agg.result()))
        self.step = max(steps)
        self.model.meta[1] = self.step
        for d in accepted:
            self.used[d] = server_round
        rec.update(accuracy=self.accuracy(), seconds=time.perf_counter() - self._t0,
                   state_hash=f"{self.model.state_hash():08x}")
        self.history.append(rec)
        self._save(server_round)
        self.log(f"round {server_round}: accuracy {rec['accuracy']:.4f}, {len(accepted)}/{self.clients} "
                 f"updates, {len(dropped)} dropped")
        return _store_record(store_tensors(self.model)), metrics

    def configure_evaluate(self, server_round, arrays, config, grid):
        return []  # evaluation is centralized (evaluate_fn): the server holds the test split

    def aggregate_evaluate(self, server_round, replies):
        return None

    def accuracy(self) -> float:
        set_store(self._ev, store_tensors(self.model))
        return float(np.mean(self._sim.predict(self.Xt) == self.Yt))

    def evaluate_fn(self, server_round, arrays):
        from flwr.app import MetricRecord

        return MetricRecord({"accuracy": self.accuracy(), "state-hash": int(self.model.state_hash())})

    def _save(self, rnd: int) -> None:
        """global.tt after every round with quorum, atomically (the engine's commit point)."""
        if self.out is None:
            return
        from tinytrain.graph import io as tio

        extra = {"federated": {"round": rnd, "step": self.step, "config": asdict(self.config),
                               "history": self.history, "engine": "flower"},
                 "dataset": self.dataset.name}
        tio.save(self.model, self.out / "global.tt", extra=extra)
        tio.save(self.model, self.out / "rounds" / f"global-r{rnd:04d}.tt", extra=extra)

    def summary_dict(self) -> dict:
        done = [h for h in self.history if h["accuracy"] is not None]
        return {"rounds": len(done), "final_accuracy": done[-1]["accuracy"] if done else self.accuracy(),
                "accuracy_per_round": [h["accuracy"] for h in done], "clients": self.clients,
                "bytes_up": sum(h["bytes_up"] for h in self.history),
                "bytes_down": sum(h["bytes_down"] for h in self.history),
                "dropped_updates": sum(len(h["dropped"]) for h in self.history),
                "state_hash": f"{self.model.state_hash():08x}", "history": self.history}


def server_main(grid, context, log=print, run_config=None) -> dict:
    """The ServerApp's main: settings from run_config (the context's, or `run_config`),
    IntegerFedAvg over Flower's loop; writes OUT/summary.json (atomically) when out-dir is
    set; returns the summary."""
    from tinytrain.federated.api import resolve

    s = settings(context.run_config if run_config is None else run_config)
    model, ds = resolve(s["model"], s["data"], s["seed"])
    clients, least = s["clients"], max(1, s["min-available-nodes"])
    if not clients:  # devices-per-node devices per node (simulation): wait for the nodes, count them
        from flwr.serverapp.strategy.strategy_utils import sample_nodes

        least = len(sample_nodes(grid, least, 1)[1])
        clients = least * s["devices-per-node"]
    if s["quorum"] >= 1 and s["quorum"] > clients:
        raise ValueError(f"run_config quorum={s['quorum']:g}: a count above the {clients} devices can never "
                         "be met; give a fraction (< 1) or a count up to the number of devices")
    strat = IntegerFedAvg(model, ds, s["config"], clients, out=s["out-dir"] or None, log=log,
                          fraction_train=s["fraction-train"], min_available_nodes=least)
    strat.start(grid, strat.initial_arrays(), num_rounds=s["num-server-rounds"],
                timeout=s["round-timeout"], evaluate_fn=strat.evaluate_fn)
    summary = strat.summary_dict()
    if strat.out is not None:
        from tinytrain.graph import io as tio

        tio.atomic_write(strat.out / "summary.json",
                         lambda f: f.write(json.dumps(summary, sort_keys=True).encode()))
    return summary


def make_client_app(run_config=None):
    """A ClientApp (run_config: fixed settings instead of the context's, for run_simulation)."""
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(msg, context):
        return client_train(msg, context, run_config)

    return app


def make_server_app(result: dict | None = None, log=print, run_config=None):
    """A ServerApp; its summary goes into `result` (run_config as for make_client_app)."""
    from flwr.serverapp import ServerApp

    app = ServerApp()

    @app.main()
    def main(grid, context):
        out = server_main(grid, context, log, run_config)
        if result is not None:
            result.update(out)

    return app


def run(model_name="digits-mlp", data_name="digits", *, clients=100, rounds=2, partition="iid",
        local_epochs=1, local_steps=None, compress="none", seed=0, quorum=0.5, backend="ray",
        backend_config=None, log=print, run_config=None, nodes: int | None = None) -> dict:
    """The tinytrain Flower apps in Flower's simulation engine, in this process (for tests and
    notebooks; `flwr run examples/flower-app` is the way users run it); returns the summary.
    run_config: further run_config keys (e.g. {"server-momentum": 0.5}); nodes: SuperNodes
    (default `clients`; fewer with run_config devices-per-node)."""
    import warnings

    from flwr.simulation import run_simulation

    run_config = {"model": str(model_name), "data": str(data_name), "clients": int(clients),
                  "num-server-rounds": int(rounds), "partition": partition, "local-epochs": int(local_epochs),
                  "local-steps": int(local_steps or 0), "compress": compress, "seed": int(seed),
                  "quorum": float(quorum), **(run_config or {})}
    settings(run_config)
    result: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # run_simulation: flwr run is the way
        run_simulation(server_app=make_server_app(result, log, run_config),
                       client_app=make_client_app(run_config),
                       num_supernodes=nodes or clients, backend_name=backend,
                       backend_config=backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return result

