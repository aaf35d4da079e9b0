"""The Python API of federated training (the ``tinytrain federate`` command mirrors it).

    from tinytrain.federated import federate
    r = federate("digits-mlp", "digits", simulated=4, rounds=10, partition="dirichlet:0.5",
                 compress="int8", out="runs/fed")
    r = federate("digits-mlp", "digits", board="mps2_an386", devices=4, rounds=5)   # QEMU boards
    r = federate("digits-mlp", "digits", ports=["/dev/ttyACM0", "/dev/ttyACM1"], rounds=5)
    print(r["final_accuracy"], r["bytes_on_wire"], r["dropped_updates"])
"""
from __future__ import annotations

from pathlib import Path

from tinytrain.federated.codec import Schema
from tinytrain.federated.devices import EmulatedBoard, LinkDevice, SimBackend, SimDevice
from tinytrain.federated.engine import FedConfig, Federation, write_plot
from tinytrain.federated.partition import partition as split

__all__ = ["federate", "make_devices", "resolve"]


def resolve(model, dataset, seed: int = 0, precision=None):
    """(Sequential, Dataset) from objects or names (built-in model/dataset names, model files);
    ``precision``: a policy the model is built (or converted) under (docs/precision.md)."""
    from tinytrain import data
    from tinytrain.graph.models import MODELS, build_model

    if isinstance(dataset, str) or dataset is None:
        name = dataset or (MODELS[model][2] if isinstance(model, str) and model in MODELS else "digits")
        dataset = data.load(name)
    if isinstance(model, (str, Path)):
        model = build_model(str(model), dataset, seed=seed, precision=precision)
    elif precision is not None:
        from tinytrain.graph.convert import with_precision
        model = with_precision(model, precision)
    return model, dataset


def make_devices(model, dataset, config: FedConfig, *, simulated: int | None = None,
                 board: str | None = None, devices: int | None = None, ports=None,
                 elf=None, timeout: float = 10.0, retries: int | None = None, workers: int = 1,
                 ids=None, clients: int | None = None):
    """Devices of one kind with their data partitions: `simulated` K in-process devices,
    `board` B x `devices` K emulated boards (firmware built once, cached; a board that misses
    a round is killed and booted again), or `ports` (pyserial URLs of boards already running
    this model's firmware; one that misses a round is reset by DTR/RTS). timeout, retries: of
    each board's serial link (seconds per attempt; retransmissions). retries None: DeviceLink's
    default for ports, none for emulated boards (a local socket loses no bytes: a board silent
    for one timeout is hung, and is restarted before the next round). workers > 1 (simulated
    only): the devices live in that many forked worker processes (pool.SimPool). ids: only
    these devices of the federation (a gateway's share; with ports, ports[j] is device
    ids[j] and `clients` the federation's size, which the partition is cut for)."""
    from tinytrain.device.protocol import DEFAULT_RETRIES

    from tinytrain.train import prepare_inputs

    X, Y, _, _ = prepare_inputs(model, dataset)
    kinds = sum(x is not None for x in (simulated, board, ports))
    if kinds != 1:
        raise ValueError("name exactly one kind of device: simulated=K, board=B with devices=K, or ports=[...]")
    k = simulated if simulated is not None else (len(ports) if ports is not None else devices)
    if ids is not None and ports is not None:
        k = clients
        if len(ids) != len(ports):
            raise ValueError(f"{len(ids)} device ids for {len(ports)} ports")
    if not k or k < 1:
        raise ValueError("the number of devices must be at least 1")
    sel = list(range(k)) if ids is None else [int(i) for i in ids]
    if any(not 0 <= i < k for i in sel):
        raise ValueError(f"device ids {sel}: a federation of {k} devices has ids 0..{k - 1}")
    schema = Schema.of(model)
    parts = split(Y, int(k), config.partition, config.seed)
    prox = config.prox(model)
    kw = dict(codec=config.compress, seed=config.seed, local_epochs=config.local_epochs,
              local_steps=config.local_steps, prox=prox, residual_bits=config.residual_bits)
    if workers != 1 and simulated is None:
        raise ValueError("workers > 1 is for simulated devices; boards already run in parallel")
    if simulated is not None:
        backend = SimBackend(model, X, Y)
        if workers > 1 and len(sel) > 1:
            from tinytrain.federated.pool import SimPool

            # each worker builds its own shard's devices after the fork (pool.py)
            return SimPool.build_in_workers([(i, len(parts[i])) for i in sel],
                                            lambda i: SimDevice(i, schema, parts[i], backend, **kw), workers).proxies
        return [SimDevice(i, schema, parts[i], backend, **kw) for i in sel]
    if board is not None:
        from tinytrain.device.boards import get_board
        from tinytrain.device.emulator import find_qemu
        from tinytrain.verify import build_cached

        b = get_board(board)
        if not b.is_emulated:
            raise ValueError(f"{b.name} is a real board: flash it and pass its serial ports (--ports)")
        find_qemu()  # before the firmware build: without QEMU no board can start
        from tinytrain.codegen.device import FEDCODEC_RESIDUAL_BITS

        flags = () if config.residual_bits == FEDCODEC_RESIDUAL_BITS else \
            (f"-DTT_FED_RESIDUAL_BITS={config.residual_bits}",)
        elf = elf or build_cached(model, b.name, fedcodec="auto", build_flags=flags)  # boards encode their updates
        out = []
        for i in sel:
            eb = EmulatedBoard(b.name, elf, timeout=timeout, retries=0 if retries is None else retries)
            dev = LinkDevice(i, schema, parts[i], X, Y, model, eb.connect, restart=eb.restart, **kw)
            dev.board = eb
            dev.close = (lambda d=dev, e=eb: (LinkDevice.close(d), e.close()))
            out.append(dev)
        return out
    from tinytrain.device.protocol import DeviceLink
    from tinytrain.federated.devices import reset_serial_board

    retries = DEFAULT_RETRIES if retries is None else retries
    return [LinkDevice(i, schema, parts[i], X, Y, model, (lambda p=p: DeviceLink(p, timeout=timeout, retries=retries)),
                       restart=(lambda p=p: reset_serial_board(p)), **kw) for i, p in zip(sel, ports)]


def federate(model, dataset=None, *, simulated: int | None = None, board: str | None = None,
             devices: int | None = None, ports=None, rounds: int = 10, partition: str = "iid",
             local_epochs: int = 1, local_steps: int | None = None, compress: str = "none",
             compress_down: str | None = None, seed: int = 0, quorum: float = 0.5, out=None, resume: bool = False, plot=None,
             log=None, timeout: float = 10.0, retries: int | None = None,
             device_list=None, workers: int = 1, server_momentum: float = 0.0,
             server_lr: float = 1.0, prox_mu: float = 0.0, prox_every: int = 16,
             preloaded: bool = False, residual_bits: int = 32, precision=None) -> dict:
    """Run a federation and return its summary (rounds, final_accuracy, bytes_on_wire,
    dropped_updates, accuracy_per_round, history, ...). `device_list`: prebuilt devices
    (e.g. wrapped in devices.FaultyDevice) instead of simulated/board/ports. timeout,
    retries: of each board's serial link; workers: processes for simulated devices (see
    make_devices); server_momentum, server_lr: FedAvgM (server.py); prox_mu, prox_every:
    FedProx's proximal pull on the devices (prox.py); preloaded: the devices already hold the
    initial model (round 1's broadcast is a delta against it); residual_bits: 32 or 16 keep the
    devices' error-feedback residual in that width, saturating (64: unbounded int64);
    precision: the policy of the global model (a preset name or a dict, docs/precision.md)."""
    model, dataset = resolve(model, dataset, seed, precision)
    cfg = FedConfig(rounds=rounds, local_epochs=local_epochs, local_steps=local_steps,
                    partition=partition, compress=compress, compress_down=compress_down, seed=seed,
                    quorum=quorum, server_momentum=server_momentum, server_lr=server_lr,
                    prox_mu=prox_mu, prox_every=prox_every, preloaded=preloaded,
                    residual_bits=residual_bits)
    from tinytrain.federated.codec import residual_bounds

    residual_bounds(residual_bits)
    from tinytrain.federated.server import server_opt

    server_opt(server_momentum, server_lr)  # bad values fail before any device starts
    if preloaded and cfg.down == "none":
        raise ValueError("--preloaded with an uncompressed broadcast changes nothing (the model goes whole "
                         "every round): give --compress / --compress-down a codec, or leave --preloaded out")
    cfg.prox(model)
    devs = device_list if device_list is not None else make_devices(
        model, dataset, cfg, simulated=simulated, board=board, devices=devices, ports=ports,
        timeout=timeout, retries=retries, workers=workers)
    try:
        fed = Federation(model, dataset, devs, cfg, out=out, log=log)
    except BaseException:
        for d in devs:
            d.close()
        raise
    try:
        if resume:
            fed.resume()
        summary = fed.run()
    finally:
        fed.close()
    summary["history"] = fed.history
    summary["global_model"] = str(Path(out) / "global.tt") if out else None
    if plot is None and out is not None:
        plot = Path(out) / "federated.png"
    if plot and fed.history:
        write_plot(fed.history, plot, title=f"{model.name}: {len(devs)} devices, {partition}, "
                                              f"compress {compress}")
        summary["plot"] = str(plot)
    return summary
