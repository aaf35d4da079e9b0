"""A fault-injecting TCP proxy on the loopback interface, for testing the serial link.

    from tinytrain.device.faultproxy import FaultProxy
    with Emulator("mps2_an386", elf) as emu, \\
            FaultProxy("127.0.0.1", emu.port, flip=1e-3, seed=1) as px:
        link = DeviceLink(px.url)          # socket://127.0.0.1:PORT, through the proxy
        ...
        print(px.counts)                   # what was injected, per direction and kind

Both directions, "up" (client to upstream: host to device) and "down" (back), pass every byte
through the same fault model, independently: the byte is dropped (probability `drop`), replaced
by itself XOR a random non-zero byte (`flip`, so any value can become any other, 0x00
included), or sent twice (`dup`); independently of that the stream first pauses `stall_s`
seconds (`stall`). A direction draws its decisions from its own `random.Random`, seeded by
`seed` and the direction, in byte order: the same byte stream gets the same faults.
`inject(direction, offset, kind, arg)` schedules one fault at an exact byte offset of a
direction's stream (counted from the first byte of the current connection), for deterministic
tests.

One client at a time; each gets a fresh connection to the upstream (QEMU's chardev server
starts the guest on the first one). Listens on 127.0.0.1 only and connects to loopback
upstreams only. Threads: one accepting, two pumping per connection; each pump handles at most
4 KiB at a time.
"""
from __future__ import annotations

import ipaddress
import random
import socket
import threading
import time

__all__ = ["FaultProxy", "KINDS"]

KINDS = ("flip", "drop", "dup", "stall", "set")
DIRECTIONS = ("up", "down")


class FaultProxy:
    """See the module docstring. `counts[direction]` has the bytes seen and the faults
    injected by kind; `url` is the pyserial URL of the proxy."""

    def __init__(self, upstream_host: str, upstream_port: int, *, flip: float = 0.0,
                 drop: float = 0.0, dup: float = 0.0, stall: float = 0.0, stall_s: float = 0.05,
                 seed: int = 0, directions=DIRECTIONS):
        addr = ipaddress.ip_address(socket.gethostbyname(upstream_host))
        if not addr.is_loopback:
            raise ValueError(f"upstream {upstream_host} is not a loopback address: the fault "
                             "proxy only relays local connections")
        rates = {"flip": flip, "drop": drop, "dup": dup, "stall": stall}
        if any(not 0.0 <= r <= 1.0 for r in rates.values()) or flip + drop + dup > 1.0:
            raise ValueError(f"fault rates must be probabilities (flip + drop + dup <= 1): {rates}")
        if not 0.0 <= stall_s <= 10.0:
            raise ValueError(f"stall_s must be 0..10 seconds, got {stall_s}")
        if not set(directions) <= set(DIRECTIONS):
            raise ValueError(f"directions must be among {DIRECTIONS}, got {directions}")
        self.upstream = (str(addr), int(upstream_port))
        self.rates, self.stall_s, self.directions = rates, stall_s, tuple(directions)
        self.counts = {d: dict.fromkeys(("bytes",) + KINDS, 0) for d in DIRECTIONS}
        self._rng = {d: random.Random(2 * int(seed) + i) for i, d in enumerate(DIRECTIONS)}
        self._script: dict[str, dict[int, tuple[str, int | float | None]]] = {d: {} for d in DIRECTIONS}
        self._offset = dict.fromkeys(DIRECTIONS, 0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._server: socket.socket | None = None
        self._conns: list[socket.socket] = []
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ life cycle

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("fault proxy not started")
        return self._server.getsockname()[1]

    @property
    def url(self) -> str:
        return f"socket://127.0.0.1:{self.port}"

    def start(self) -> "FaultProxy":
        if self._server is None:
            self._server = socket.create_server(("127.0.0.1", 0))
            self._spawn(self._serve)
        return self

    def stop(self) -> None:
        """Close the listener and any connection; wait (briefly) for the threads."""
        self._stop.set()
        socks = [self._server, *self._conns] if self._server is not None else self._conns
        for s in socks:
            _close(s)
        for t in self._threads:
            t.join(2.0)

    def __enter__(self) -> "FaultProxy":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def inject(self, direction: str, offset: int, kind: str, arg=None) -> None:
        """Fault `kind` on byte `offset` of `direction` (this connection's count): flip XORs
        `arg` (1..255), set replaces the byte by `arg`, stall pauses `arg` seconds before it,
        drop and dup take no arg. Overrides the random model for that byte."""
        if direction not in DIRECTIONS or kind not in KINDS:
            raise ValueError(f"direction {direction!r} / kind {kind!r}: use {DIRECTIONS} / {KINDS}")
        if kind == "flip" and not (isinstance(arg, int) and 1 <= arg <= 255):
            raise ValueError(f"flip needs a mask 1..255, got {arg!r}")
        if kind == "set" and not (isinstance(arg, int) and 0 <= arg <= 255):
            raise ValueError(f"set needs a byte 0..255, got {arg!r}")
        with self._lock:
            self._script[direction][int(offset)] = (kind, arg)

    def offset(self, direction: str) -> int:
        """Bytes of `direction` read so far on this connection (the next byte's offset)."""
        with self._lock:
            return self._offset[direction]

    # ------------------------------------------------------------------ relaying

    def _spawn(self, fn, *args) -> threading.Thread:
        t = threading.Thread(target=fn, args=args, daemon=True)
        self._threads.append(t)
        t.start()
        return t

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.upstream, timeout=5.0)
            except OSError:
                _close(client)
                continue
            for s in (client, upstream):
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._offset = dict.fromkeys(DIRECTIONS, 0)
                self._conns = [client, upstream]
            pumps = [self._spawn(self._pump, client, upstream, "up"),
                     self._spawn(self._pump, upstream, client, "down")]
            for t in pumps:
                t.join()
            self._threads = [t for t in self._threads if t.is_alive()]

    def _decide(self, direction: str) -> tuple[str | None, object]:
        """The fault for the next byte of `direction` (lock held)."""
        off = self._offset[direction]
        self._offset[direction] = off + 1
        scripted = self._script[direction].pop(off, None)
        if scripted is not None:
            return scripted
        if direction not in self.directions:
            return None, None
        rng, r = self._rng[direction], self.rates
        if r["stall"] and rng.random() < r["stall"]:
            return "stall", self.stall_s
        u = rng.random()
        if u < r["drop"]:
            return "drop", None
        if u < r["drop"] + r["flip"]:
            return "flip", rng.randrange(1, 256)
        if u < r["drop"] + r["flip"] + r["dup"]:
            return "dup", None
        return None, None

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        try:
            while not self._stop.is_set():
                data = src.recv(4096)
                if not data:
                    break
                out = bytearray()
                for b in data:
                    with self._lock:
                        kind, arg = self._decide(direction)
                        c = self.counts[direction]
                        c["bytes"] += 1
                        if kind is not None:
                            c[kind] += 1
                    if kind == "stall":
                        dst.sendall(out)  # what came before the pause goes out before it
                        out.clear()
                        time.sleep(arg)
                        out.append(b)
                    elif kind == "flip":
                        out.append(b ^ arg)
                    elif kind == "set":
                        out.append(arg)
                    elif kind == "dup":
                        out += bytes((b, b))
                    elif kind != "drop":
                        out.append(b)
                dst.sendall(out)
        except OSError:
            pass
        finally:  # one side gone: end the other pump too
            _close(src)
            _close(dst)


def _close(s: socket.socket) -> None:
    try:
        s.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        s.close()
    except OSError:
        pass
