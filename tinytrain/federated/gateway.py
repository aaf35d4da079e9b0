"""A gateway host's boards behind one local socket, for the Flower SuperNode on that host.

A Flower SuperNode runs its ClientApp in a fresh process for every message, but a board's
QEMU process or serial port (and the error-feedback residual in its RAM) must live across
rounds. So one long-lived ``tinytrain federate-gateway`` process per host owns the boards;
the ClientApp (``flower.client_train`` with node_config ``gateway="HOST:PORT"``) hands it the
round's global message and gets the boards' update messages back, unchanged: the ServerApp
verifies them as any update.

    tinytrain federate-gateway --board mps2_an386 --listen 127.0.0.1:7801     # QEMU boards
    tinytrain federate-gateway --ports /dev/ttyACM0 /dev/ttyACM1 --listen 127.0.0.1:7801

Devices are made when a run first asks for them, from the run's settings (model, data,
partition, codec, seed, local epochs/steps: the ClientApp forwards its run_config): device id
``ids[j]`` is the j-th board (``--ports[j]``, or the j-th QEMU instance of ``--board``, its
firmware built for the model once and cached). Boards train in parallel threads.

Wire format (one request per connection, all integers little-endian u32): request = frame
(JSON ``{"run_config", "devices", "used"}``) + frame (global message); reply = frame (JSON
``{"faults", "n", "count", "error"}``) + ``count`` frames (update messages); a frame is
``u32 length | bytes``. It carries tinytrain's bytes, nothing executable; it listens on
127.0.0.1 by default: the SuperNode on the same host is its only client.
"""
from __future__ import annotations

import json
import logging
import socket
import socketserver
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["Gateway", "request", "serve"]

log = logging.getLogger("tinytrain.federated")
MAX_FRAME = 64 << 20


def _send(sock, data: bytes) -> None:
    sock.sendall(struct.pack("<I", len(data)) + data)


def _recv_exact(sock, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("gateway connection closed mid-frame")
        buf += chunk
    return bytes(buf)


def _recv(sock) -> bytes:
    (n,) = struct.unpack("<I", _recv_exact(sock, 4))
    if n > MAX_FRAME:
        raise ConnectionError(f"frame of {n} bytes exceeds {MAX_FRAME}")
    return _recv_exact(sock, n)


def _pending_round(dev):
    p = getattr(dev, "_device_pending", None) or dev._pending
    return None if p is None else p[0]


class Gateway:
    """The boards of one host: `board` (emulated, one QEMU per device) or `ports`."""

    def __init__(self, board: str | None = None, ports=None, timeout: float = 10.0,
                 retries: int | None = None):
        if (board is None) == (ports is None):
            raise ValueError("give the gateway's boards: --board B (emulated) or --ports P [P ...]")
        self.board, self.ports, self.timeout, self.retries = board, ports, timeout, retries
        self.runs: dict = {}  # settings key -> {device id: device}
        self.lock = threading.Lock()

    def _devices(self, run_config, ids):
        from tinytrain.federated.api import make_devices, resolve
        from tinytrain.federated.flower import settings

        s = settings(run_config)
        cfg = s["config"]
        if not s["clients"]:
            raise ValueError("a gateway serves part of a federation: set run_config clients to the "
                             "number of devices in it")
        key = (s["model"], s["data"], s["clients"], cfg.partition, cfg.seed, cfg.compress,
               cfg.local_epochs, cfg.local_steps, tuple(ids))
        if key not in self.runs:
            for old in self.runs.values():  # one run at a time holds the boards
                for d in old.values():
                    d.close()
            self.runs.clear()
            if self.ports is not None and len(ids) > len(self.ports):
                raise ValueError(f"node serves {len(ids)} devices but the gateway has {len(self.ports)} ports")
            model, ds = resolve(s["model"], s["data"], cfg.seed)
            if self.ports is not None:
                devs = make_devices(model, ds, cfg, ports=self.ports[:len(ids)], timeout=self.timeout,
                                    retries=self.retries, ids=ids, clients=s["clients"])
            else:
                devs = make_devices(model, ds, cfg, board=self.board, devices=s["clients"], ids=ids,
                                    timeout=self.timeout, retries=self.retries)
            self.runs[key] = {d.id: d for d in devs}
        return self.runs[key]

    def round(self, run_config, ids, used: dict, gmsg: bytes):
        """(update messages, faults "id:kind", samples) of this host's devices `ids`."""
        from tinytrain.federated.codec import HEADER
        from tinytrain.federated.devices import DeviceFault

        with self.lock:
            devs = self._devices(run_config, ids)

            def one(dev):
                r = _pending_round(dev)
                if r is not None:  # the server's verdict on its last update (error feedback)
                    dev.ack(r, used.get(dev.id) == r)
                try:
                    dev.ensure_ready()
                    return dev.run_round(gmsg)
                except DeviceFault as e:
                    log.warning("%s", e)
                    return e

            with ThreadPoolExecutor(max_workers=max(1, len(devs))) as pool:
                out = list(pool.map(one, [devs[i] for i in ids]))
        updates = [u for u in out if isinstance(u, bytes)]
        faults = [f"{i}:{u.kind}" for i, u in zip(ids, out) if not isinstance(u, bytes)]
        return updates, faults, sum(HEADER.unpack_from(u)[5] for u in updates)

    def close(self) -> None:
        for run in self.runs.values():
            for d in run.values():
                d.close()
        self.runs.clear()


def serve(gw: Gateway, host: str, port: int, ready=None) -> None:
    """Serve `gw` on host:port until interrupted. ready(server): called once listening."""

    class Handler(socketserver.BaseRequestHandler):
        def handle(self):
            try:
                head = json.loads(_recv(self.request))
                gmsg = _recv(self.request)
                used = {int(k): int(v) for k, v in head["used"].items()}
                ups, faults, n = gw.round(head["run_config"], [int(i) for i in head["devices"]], used, gmsg)
                reply = {"faults": faults, "n": n, "count": len(ups), "error": None}
            except Exception as e:  # noqa: BLE001 - reported to the ClientApp, the gateway stays up
                log.exception("gateway request failed")
                ups, reply = [], {"faults": [], "n": 0, "count": 0, "error": f"{type(e).__name__}: {e}"}
            try:
                _send(self.request, json.dumps(reply).encode())
                for u in ups:
                    _send(self.request, u)
            except OSError:
                log.warning("the ClientApp went away before the reply")

    socketserver.TCPServer.allow_reuse_address = True
    with socketserver.TCPServer((host, port), Handler) as srv:
        if ready is not None:
            ready(srv)
        try:
            srv.serve_forever()
        finally:
            gw.close()


def request(addr: str, gmsg: bytes, ids, used: dict, run_config, timeout: float = 3600.0):
    """From the ClientApp: one round on the gateway at HOST:PORT; (updates, faults, samples)."""
    host, _, port = addr.rpartition(":")
    with socket.create_connection((host or "127.0.0.1", int(port)), timeout=timeout) as s:
        _send(s, json.dumps({"run_config": dict(run_config), "devices": list(ids),
                             "used": {str(k): v for k, v in used.items()}}).encode())
        _send(s, bytes(gmsg))
        head = json.loads(_recv(s))
        if head["error"]:
            raise RuntimeError(f"gateway {addr}: {head['error']}")
        return [_recv(s) for _ in range(head["count"])], head["faults"], head["n"]
