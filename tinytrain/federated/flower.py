"""Flower apps around tinytrain devices (optional extra: ``pip install tinytrain-mcu[flower]``,
and ``flwr[simulation]`` for Flower's Ray simulation engine). Written for flwr's Message API
(flwr >= 1.21, the first whose flwr.app exports Message and the records: ``flwr.clientapp.ClientApp``, ``flwr.serverapp.ServerApp``, ``Grid``).

    from tinytrain.federated.flower import make_apps, run
    summary = run("digits-mlp", "digits", clients=100, rounds=2)      # run_simulation inside

The messages carry tinytrain's own bytes: the ServerApp sends the global model message
(``codec.encode_global``, in a ConfigRecord "tt" under "global", with the previous round's
accepted device ids under "accepted"); a ClientApp answers with its update message
(``codec.encode_update`` under "update"). So the server verifies every update (CRC-32, hash)
and aggregates with tinytrain's integer FedAvg (``fedavg.Aggregator``) - Flower only moves
bytes. A ClientApp node with partition-id i is tinytrain device i: a simulated device (one
SimBackend per worker process), or, with ``ports``, the board on ports[i], its serial port
opened once per process and kept for the app's lifetime. The device's error-feedback
residual lives in the node's ``context.state`` (Flower keeps it between rounds).
"""
from __future__ import annotations

import numpy as np

from tinytrain.federated.codec import Schema, CorruptUpdate, decode_update, encode_global
from tinytrain.federated.engine import FedConfig
from tinytrain.federated.fedavg import Aggregator, set_store, store_tensors

_CACHE: dict = {}  # per worker process: backends, partitions, open links


def _setup(model_name, data_name, clients, cfg: FedConfig):
    key = (model_name, data_name, clients, cfg.partition, cfg.seed)
    if key not in _CACHE:
        from tinytrain.train import prepare_inputs
        from tinytrain.federated.api import resolve
        from tinytrain.federated.partition import partition

        model, ds = resolve(model_name, data_name, cfg.seed)
        X, Y, _, _ = prepare_inputs(model, ds)
        _CACHE[key] = (model, X, Y, Schema.of(model), partition(Y, clients, cfg.partition, cfg.seed))
    return _CACHE[key]


def _device(pid, model_name, data_name, clients, cfg, ports):
    from tinytrain.federated.devices import LinkDevice, SimBackend, SimDevice

    model, X, Y, schema, parts = _setup(model_name, data_name, clients, cfg)
    kw = dict(codec=cfg.compress, seed=cfg.seed, local_epochs=cfg.local_epochs, local_steps=cfg.local_steps)
    if ports:
        k = ("link", ports[pid])
        if k not in _CACHE:  # the serial port: opened once for this process's lifetime
            from tinytrain.device.protocol import DeviceLink

            _CACHE[k] = LinkDevice(pid, schema, parts[pid], X, Y, model,
                                   lambda p=ports[pid]: DeviceLink(p), **kw)
        return _CACHE[k]
    if ("sim", id(model)) not in _CACHE:
        _CACHE[("sim", id(model))] = SimBackend(model, X, Y)
    return SimDevice(pid, schema, parts[pid], _CACHE[("sim", id(model))], **kw)


def make_client_app(model_name="digits-mlp", data_name="digits", clients=100,
                    config: FedConfig | None = None, ports=None):
    from flwr.app import ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp

    cfg = config or FedConfig()
    app = ClientApp()

    @app.train()
    def train(msg, context):
        pid = int(context.node_config["partition-id"])
        dev = _device(pid, model_name, data_name, clients, cfg, ports)
        tt = msg.content["tt"]
        st = context.state
        if "tt_residual" in st:  # restore this device's error-feedback state
            res = st["tt_residual"]
            dev.set_state(res["committed"].numpy())
            committed = dev.residual
            if "pending" in res:
                dev.set_state(res["pending"].numpy())
                dev._pending = (int(st["tt_meta"]["pending_round"]), dev.residual)
            dev.residual = committed
        accepted = set(int(v) for v in tt.get("accepted", []))
        prev = int(tt["round"]) - 1
        dev.ack(prev, pid in accepted)
        from tinytrain.federated.devices import DeviceFault

        try:
            update = dev.run_round(bytes(tt["global"]))
        except DeviceFault as e:
            return Message(RecordDict({"tt": ConfigRecord({"fault": e.kind})}), reply_to=msg)
        if dev.residual is not None:
            recs = {"committed": np.concatenate(dev.residual)}
            if dev._pending is not None:
                recs["pending"] = np.concatenate(dev._pending[1])
            st["tt_residual"] = ArrayRecord({k: _arr(v) for k, v in recs.items()})
            st["tt_meta"] = ConfigRecord({"pending_round": dev._pending[0] if dev._pending else -1})
        return Message(RecordDict({"tt": ConfigRecord({"update": update})}), reply_to=msg)

    return app


def _arr(a):
    from flwr.app import Array

    return Array(np.ascontiguousarray(a))


def make_server_app(model_name="digits-mlp", data_name="digits", config: FedConfig | None = None,
                    result: dict | None = None, log=print):
    """A ServerApp running `config.rounds` rounds of integer FedAvg over all connected nodes;
    the summary (accuracy per round, bytes, dropped updates, state hash) goes into `result`."""
    from flwr.app import ConfigRecord, Message, RecordDict
    from flwr.serverapp import ServerApp

    cfg = config or FedConfig()
    app = ServerApp()
    out = result if result is not None else {}

    @app.main()
    def main(grid, context):
        from tinytrain.sim.simulator import Simulator
        from tinytrain.train import prepare_inputs
        from tinytrain.federated.api import resolve

        model, ds = resolve(model_name, data_name, cfg.seed)
        schema = Schema.of(model)
        _, _, Xt, Yt = prepare_inputs(model, ds)
        ev = model.copy()
        sim = Simulator(ev)
        step, accepted, hist = int(model.meta[1]), [], []
        up = down = dropped_total = 0
        for r in range(1, cfg.rounds + 1):
            glob = [t.copy() for t in store_tensors(model)]
            gmsg, _ = encode_global(r, step, glob)
            nodes = list(grid.get_node_ids())
            msgs = [Message(RecordDict({"tt": ConfigRecord(
                        {"global": gmsg, "round": r, "accepted": accepted or [-1]})}),
                        dst_node_id=n, message_type="train", group_id=str(r)) for n in nodes]
            down += len(gmsg) * len(nodes)
            agg, accepted, steps, dropped = Aggregator(glob), [], [], 0
            for reply in grid.send_and_receive(msgs):
                try:
                    if reply.has_error() or "update" not in reply.content["tt"]:
                        raise CorruptUpdate("no update")
                    b = bytes(reply.content["tt"]["update"])
                    up += len(b)
                    u = decode_update(b, schema, glob, r)
                    agg.add(u.store, u.n_samples)
                    accepted.append(u.device)
                    steps.append(u.step)
                except CorruptUpdate:
                    dropped += 1
            dropped_total += dropped
            if len(accepted) < cfg.need(len(nodes)):
                raise RuntimeError(f"round {r}: only {len(accepted)} of {len(nodes)} updates")
            set_store(model, agg.result())
            step = max(steps)
            set_store(ev, store_tensors(model))
            acc = float(np.mean(sim.predict(Xt) == Yt))
            hist.append(acc)
            log(f"flower round {r}: accuracy {acc:.4f}, {len(accepted)}/{len(nodes)} updates")
        model.meta[1] = step
        out.update({"rounds": cfg.rounds, "final_accuracy": hist[-1], "accuracy_per_round": hist,
                    "clients": len(nodes), "bytes_on_wire": up + down, "bytes_up": up,
                    "bytes_down": down, "dropped_updates": dropped_total,
                    "state_hash": f"{model.state_hash():08x}"})

    return app


def run(model_name="digits-mlp", data_name="digits", *, clients=100, rounds=2, partition="iid",
        local_epochs=1, local_steps=None, compress="none", seed=0, quorum=0.5, backend="ray",
        backend_config=None, log=print) -> dict:
    """Run the tinytrain Flower apps in Flower's simulation engine; returns the summary."""
    from flwr.simulation import run_simulation

    cfg = FedConfig(rounds=rounds, local_epochs=local_epochs, local_steps=local_steps,
                    partition=partition, compress=compress, seed=seed, quorum=quorum)
    result: dict = {}
    run_simulation(server_app=make_server_app(model_name, data_name, cfg, result, log),
                   client_app=make_client_app(model_name, data_name, clients, cfg),
                   num_supernodes=clients, backend_name=backend,
                   backend_config=backend_config or {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    return result
