"""Host side of the tinytrain serial protocol (the specification is docs/protocol.md; the device
side is tinytrain/firmware/src/tt_protocol.c).

Frame before COBS, little-endian; on the wire 0x00, the COBS bytes, 0x00, 0x00 (docs §1)::

    u8 version | u8 type | u16 seq | u8 flags | u8 reserved | u16 len | u32 schema |
    payload[len] | u32 crc32(header + payload)

`DeviceLink` opens any pyserial URL (a tty, /dev/pts/N, socket://host:port, loop://) or takes an
already open serial-like object, and speaks stop-and-wait: one request, one reply with the same
seq. Every command may be retried: the device answers a retransmitted request (same seq, same
bytes) from its replay cache without executing it again. After any failed attempt (timeout,
corrupted reply, "your request was garbled") the host resynchronises before it retransmits: it
reads until the line has been quiet for a while (exponential backoff), dropping everything that
belongs to the failed exchange, so one corrupted byte costs at most one retransmission.
Every reply is validated (length and fields) before use: a reply with a valid CRC but a wrong
payload raises `MalformedReply`, never a foreign exception.
"""
from __future__ import annotations

import enum
import logging
import os
import struct
import time
import zlib
from dataclasses import dataclass
from typing import Callable, NamedTuple

PROTOCOL_VERSION = 1
MAX_PAYLOAD = 256  # the device's TT_MAX_PAYLOAD default; HELLO reports the actual value
HEADER = struct.Struct("<BBHBBHI")
HEADER_LEN = HEADER.size  # 12
CRC_LEN = 4
TENSOR_PARAMS = 0xFFFF  # GET_TENSOR id of the whole parameter/state blob
HELLO_LEN = 28  # HELLO reply payload; also the smallest max_payload the host accepts

log = logging.getLogger("tinytrain.device.protocol")


class Msg(enum.IntEnum):
    HELLO = 0x01
    LOAD_STATUS = 0x02
    LOAD_PARAMS = 0x03
    LOAD_COMMIT = 0x04
    TRAIN = 0x05
    TRAIN_BATCH = 0x06
    PREDICT = 0x07
    STATE_HASH = 0x08
    GET_TENSOR = 0x09
    SET_SEED = 0x0A
    RESET = 0x0B
    ROUND_BEGIN = 0x0C   # optional: federated update codec on the device
    GET_UPDATE = 0x0D
    UPDATE_ACK = 0x0E
    FED_PROX = 0x0F      # optional: FedProx's pull toward the ROUND_BEGIN snapshot
    LOG = 0xC0
    ERROR = 0xFF


REPLY = 0x80


class Flag(enum.IntFlag):
    UNSOLICITED = 0x01
    BOOT = 0x02
    REPLAY = 0x04


class ErrorCode(enum.IntEnum):
    """Mirror of enum tt_err in tinytrain/firmware/include/tt_device.h."""
    CRC = 1
    FRAMING = 2
    LENGTH = 3
    TOO_LONG = 4
    UNKNOWN_CMD = 5
    VERSION = 6
    SCHEMA = 7
    SEQUENCE = 8
    BUSY = 9
    RANGE = 10
    BLOB_CRC = 11
    LOAD_INCOMPLETE = 12
    UNSUPPORTED = 13
    MODEL = 14


# ---------------------------------------------------------------------------------- exceptions

class ProtocolError(Exception):
    """Anything that went wrong on the link or was reported by the device."""


class CrcError(ProtocolError):
    """A frame's CRC-32 does not match its contents (line noise, wrong baud rate)."""


class FramingError(ProtocolError):
    """Bytes that are not a well-formed frame (bad COBS, too short, length field wrong)."""


class VersionMismatch(ProtocolError):
    """Host and device speak different protocol versions."""


class SchemaMismatch(ProtocolError):
    """The device runs a model generated from a different graph schema than the host's."""


class DeviceError(ProtocolError):
    """The device answered with an ERROR frame."""

    def __init__(self, code: int, message: str, detail: int = 0, request: int = 0):
        self.code = code
        self.message = message
        self.detail = detail
        self.request = request
        try:
            name = ErrorCode(code).name
        except ValueError:
            name = f"code {code}"
        req = _msg_name(request)
        super().__init__(f"device error {name} ({code}) on {req}: {message} (detail {detail})")


class MalformedReply(ProtocolError):
    """A reply with a valid CRC whose payload does not have its message's layout or values
    (firmware of another release, a bug on the device)."""


class DeviceTimeout(ProtocolError, TimeoutError):
    """No (valid) reply in time."""


class DeviceReset(ProtocolError):
    """The device restarted (it sent its boot HELLO): its training state is gone."""

    def __init__(self, message: str, info: "DeviceInfo | None" = None):
        super().__init__(message)
        self.info = info


# -------------------------------------------------------------------------------- COBS, CRC

def crc32(data: bytes, crc: int = 0) -> int:
    """CRC-32/IEEE, the same as zlib.crc32 and tt_crc32_update."""
    return zlib.crc32(data, crc) & 0xFFFFFFFF


def cobs_encode(data: bytes) -> bytes:
    """COBS-encode (no delimiter). A final full 254-byte block gets no extra 0x01 code."""
    out = bytearray()
    i, n = 0, len(data)
    while True:
        j = i
        while j < n and data[j] != 0 and j - i < 254:
            j += 1
        out.append(j - i + 1)
        out += data[i:j]
        if j >= n:
            return bytes(out)
        i = j if j - i == 254 else j + 1


def cobs_decode(data: bytes) -> bytes:
    """Decode one COBS frame (without its delimiter). Raises FramingError on malformed input."""
    out = bytearray()
    i, n = 0, len(data)
    if n == 0:
        raise FramingError("empty COBS frame")
    while i < n:
        code = data[i]
        if code == 0:
            raise FramingError(f"0x00 inside a COBS frame at byte {i}")
        end = i + code
        if end > n:
            raise FramingError(f"COBS block at byte {i} needs {code - 1} bytes, {n - i - 1} left")
        block = data[i + 1:end]
        if 0 in block:
            raise FramingError(f"0x00 inside a COBS frame at byte {i + 1 + block.index(0)}")
        out += block
        i = end
        if code != 0xFF and i < n:
            out.append(0)
    return bytes(out)


# ------------------------------------------------------------------------------------ frames

@dataclass(frozen=True)
class Frame:
    type: int
    seq: int
    payload: bytes = b""
    flags: int = 0
    schema: int = 0
    version: int = PROTOCOL_VERSION


def build_frame(type: int, seq: int, payload: bytes = b"", *, schema: int = 0, flags: int = 0,
                version: int = PROTOCOL_VERSION) -> bytes:
    """The raw frame (header + payload + CRC), before COBS."""
    if len(payload) > 0xFFFF:
        raise ValueError(f"payload of {len(payload)} bytes does not fit the u16 length field")
    body = HEADER.pack(version, type, seq & 0xFFFF, flags, 0, len(payload), schema) + bytes(payload)
    return body + struct.pack("<I", crc32(body))


def encode_frame(type: int, seq: int, payload: bytes = b"", **kw) -> bytes:
    """A frame as sent on the wire: COBS + 0x00."""
    return cobs_encode(build_frame(type, seq, payload, **kw)) + b"\x00"


def parse_frame(raw: bytes, *, version: int = PROTOCOL_VERSION,
                schema: int | None = None) -> Frame:
    """Check and split a raw (COBS-decoded) frame. Order: length, CRC, version, length field,
    schema (when `schema` is given and the frame carries one)."""
    if len(raw) < HEADER_LEN + CRC_LEN:
        raise FramingError(f"frame of {len(raw)} bytes is shorter than header + CRC "
                           f"({HEADER_LEN + CRC_LEN}): truncated on the wire?")
    (crc,) = struct.unpack_from("<I", raw, len(raw) - CRC_LEN)
    calc = crc32(raw[:-CRC_LEN])
    if crc != calc:
        raise CrcError(f"frame CRC-32 0x{crc:08x} != computed 0x{calc:08x}: corrupted on the "
                       "wire (noise, or mismatched baud rate / framing settings)")
    ver, type_, seq, flags, _, plen, sch = HEADER.unpack_from(raw)
    if ver != version:
        raise VersionMismatch(f"frame has protocol version {ver}, host speaks {version}: "
                              "flash firmware and install a host package of the same release")
    if plen != len(raw) - HEADER_LEN - CRC_LEN:
        raise FramingError(f"length field says {plen} payload bytes, frame has "
                           f"{len(raw) - HEADER_LEN - CRC_LEN}")
    if schema is not None and schema != 0 and sch != 0 and sch != schema:
        raise SchemaMismatch(_schema_msg(sch, schema))
    return Frame(type_, seq, bytes(raw[HEADER_LEN:-CRC_LEN]), flags, sch, ver)


def decode_frame(wire: bytes, **kw) -> Frame:
    """COBS-decode one frame (a trailing 0x00 is allowed) and parse it."""
    if wire.endswith(b"\x00"):
        wire = wire[:-1]
    return parse_frame(cobs_decode(wire), **kw)


def _schema_msg(device: int, host: int) -> str:
    return (f"device runs model schema 0x{device:08x} but the host expects 0x{host:08x}: "
            "flash the firmware generated from this graph (or open the link with that schema)")


def _fields(fmt: str, payload: bytes, what: str, *, exact: bool = True) -> tuple:
    """The little-endian fields `fmt` at the start of `payload` (of `what`, e.g. "TRAIN
    reply"). The payload must be exactly that long (or at least, with exact=False), else
    MalformedReply names the message and both lengths."""
    size = struct.calcsize("<" + fmt)
    if len(payload) != size and (exact or len(payload) < size):
        raise MalformedReply(f"{what} of {len(payload)} bytes, expected "
                             f"{'' if exact else 'at least '}{size}: host and firmware of "
                             "different releases, or a firmware bug")
    return struct.unpack_from("<" + fmt, payload)


class FrameSplitter:
    """Accumulates wire bytes and yields complete COBS-encoded frames (without delimiters)."""

    def __init__(self, max_frame: int = 4 * (HEADER_LEN + 65535 + CRC_LEN)):
        self._buf = bytearray()
        self._max = max_frame

    def feed(self, data: bytes) -> list[bytes]:
        self._buf += data
        frames = []
        while True:
            k = self._buf.find(0)
            if k < 0:
                break
            if k:
                frames.append(bytes(self._buf[:k]))
            del self._buf[:k + 1]
        if len(self._buf) > self._max:  # garbage without delimiters: drop it
            self._buf.clear()
        return frames

    def clear(self) -> None:
        self._buf.clear()


# ----------------------------------------------------------------------------- device link

@dataclass(frozen=True)
class DeviceInfo:
    protocol_version: int
    atomic_load: bool
    max_payload: int
    fw_version: int
    schema_hash: int
    ram_bytes: int
    param_bytes: int
    input_len: int
    n_classes: int
    step: int
    fedcodec: bool = False  # HELLO flag bit 1: ROUND_BEGIN / GET_UPDATE / UPDATE_ACK supported
    fedprox: bool = False   # HELLO flag bit 2: FED_PROX (and ROUND_BEGIN codec 0) supported
    residual_bits: int = 64  # HELLO flag bits 3-4: on-device residual width (0: 64, 1: 32, 2: 16)

    @classmethod
    def from_payload(cls, p: bytes) -> "DeviceInfo":
        """Parse and check a HELLO payload: 28 bytes (longer is accepted and the rest ignored, for
        fields a later release may append); max_payload must hold at least a HELLO reply."""
        v, fl, mp, fw, sch, ram, pb, il, nc, st = _fields("BBHIIIIHHI", p, "HELLO reply", exact=False)
        if mp < HELLO_LEN:
            raise MalformedReply(f"HELLO advertises max_payload {mp}, the host needs at least "
                                 f"{HELLO_LEN} (a HELLO reply): rebuild the firmware with a "
                                 "larger TT_MAX_PAYLOAD")
        return cls(v, bool(fl & 1), mp, fw, sch, ram, pb, il, nc, st, bool(fl & 2), bool(fl & 4),
                   {1: 32, 2: 16}.get((fl >> 3) & 3, 64))

    @property
    def fw_version_str(self) -> str:
        v = self.fw_version
        return f"{v >> 16}.{(v >> 8) & 0xFF}.{v & 0xFF}"


class RoundBegin(NamedTuple):
    step: int
    state_hash: int
    global_hash: int    # CRC-32 of the parameter store the device snapshotted
    residual_crc: int   # CRC-32 of its error-feedback residual (int64 LE)


class UpdateAck(NamedTuple):
    status: int         # 0 residual kept, 1 committed, 2 round already closed
    residual_crc: int


class TrainResult(NamedTuple):
    step: int
    state_hash: int
    loss: int
    cycles: int


class _Garbled(ProtocolError):
    """The device says our request arrived corrupted: send it again."""


# ERROR codes the device sends with seq 0 about bytes it could not read as a frame
_GARBLED_CODES = (ErrorCode.CRC, ErrorCode.FRAMING, ErrorCode.TOO_LONG)
DEFAULT_TIMEOUT = 2.0  # seconds per attempt
DEFAULT_RETRIES = 10   # retransmissions per request
DEFAULT_QUIET = 0.005  # seconds of silence that end a resync (doubled per retry, at most 8x)


def close_without_pause(ser) -> None:
    """Make `ser` (pyserial on a socket:// URL) close without pyserial's 0.3 s sleep "in case of
    quick reconnects": nothing reconnects to the UART of a QEMU that is about to stop, and a sweep
    closes one per variant."""
    import socket

    def close():
        if not ser.is_open:
            return
        sock, ser._socket = ser._socket, None  # pyserial's socket:// handler (urlhandler.protocol_socket)
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        ser.is_open = False
    ser.close = close


class DeviceLink:
    """A conversation with one device.

    `port` is a pyserial URL (opened with serial.serial_for_url) or an object with pyserial's
    `read(n)`, `write(b)`, `timeout`, `in_waiting` and `close()`. `timeout`: seconds one attempt
    waits for its reply (plus the frame's wire time); `retries`: retransmissions of a request
    after a timeout or corruption; `quiet`: seconds of silence that end the resync before a
    retransmission (doubled per retransmission, at most 8x; see request). `schema_hash`: the
    schema the host expects (None: adopt the device's from HELLO). `on_log(text)` receives LOG
    lines (default: the "tinytrain.device.protocol" logger). `clock`: the time source (tests pass a
    virtual one). The link is not thread-safe.

    Counters: `retransmissions` (all requests), `worst_retries` (the most one request needed),
    `timeouts` (attempts that got no valid reply in time),
    `stale_frames` (valid frames that answered nothing outstanding: late replies of earlier
    attempts, errors about garbled fragments), `replays_seen`, `boots_seen`, `bytes_sent`,
    `bytes_received`.
    """

    def __init__(self, port, *, baudrate: int = 115200, timeout: float = DEFAULT_TIMEOUT,
                 retries: int = DEFAULT_RETRIES, quiet: float = DEFAULT_QUIET,
                 schema_hash: int | None = None, on_log: Callable[[str], None] | None = None,
                 hello: bool = True, clock: Callable[[], float] = time.monotonic):
        if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
            raise ValueError(f"retries must be an integer >= 0, got {retries!r}")
        if not timeout > 0 or not quiet >= 0:
            raise ValueError(f"timeout must be > 0 and quiet >= 0 seconds, got {timeout!r}, "
                             f"{quiet!r}")
        if isinstance(port, str):
            import serial  # pyserial, imported late so frame helpers work without it

            self.url = port
            try:
                self._ser = serial.serial_for_url(port, baudrate=baudrate, timeout=0.05)
                if port.startswith("socket://"):
                    close_without_pause(self._ser)
            except (serial.SerialException, ValueError) as e:
                raise ProtocolError(f"cannot open {port!r}: {e}: check the device path or URL "
                                    "(e.g. /dev/ttyACM0, /dev/pts/3, socket://127.0.0.1:4321)")
        else:
            self.url = getattr(port, "name", None) or getattr(port, "port", None) or repr(port)
            self._ser = port
        self.baudrate = baudrate
        self.timeout = float(timeout)
        self.retries = retries
        self.quiet = float(quiet)
        self._clock = clock
        self.expected_schema = schema_hash
        self.on_log = on_log or (lambda text: log.info("device: %s", text))
        self.info: DeviceInfo | None = None
        self.boots_seen = 0
        self.replays_seen = 0
        self.retransmissions = 0
        self.worst_retries = 0
        self.timeouts = 0
        self.stale_frames = 0
        self.last_load_start = 0  # offset the last load_params resumed from
        self.bytes_sent = self.bytes_received = 0  # serial traffic, COBS and delimiters included
        self._split = FrameSplitter()
        self._frames: list[bytes] = []  # split off the wire, not looked at yet
        self._seq = int.from_bytes(os.urandom(2), "little") or 1
        self._last_step: int | None = None
        if hello:
            try:
                self.hello()
            except BaseException:
                self.close()
                raise

    # ------------------------------------------------------------------ plumbing

    def close(self) -> None:
        self._ser.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _next_seq(self) -> int:
        self._seq = self._seq % 0xFFFF + 1  # 1..65535; 0 is for unsolicited device frames
        return self._seq

    def _schema_out(self) -> int:
        return self.expected_schema or 0

    def _write(self, data: bytes) -> None:
        self._ser.write(data)
        self.bytes_sent += len(data)

    def _read(self, deadline: float) -> bool:
        """Read what arrives before `deadline` (at most 50 ms); its complete frames join
        self._frames. True if any byte arrived."""
        remaining = deadline - self._clock()
        if remaining <= 0:
            return False
        t = min(remaining, 0.05)
        if self._ser.timeout != t:  # reconfiguring a real tty costs a syscall: only when needed
            self._ser.timeout = t
        n = getattr(self._ser, "in_waiting", 0) or 1
        data = self._ser.read(n)
        if not data:
            return False
        self.bytes_received += len(data)
        self._frames += self._split.feed(data)
        return True

    def _handle_unsolicited(self, f: Frame) -> None:
        if f.type == Msg.LOG:
            self.on_log(f.payload.decode("utf-8", "replace"))
        elif f.type == (Msg.HELLO | REPLY) and f.flags & Flag.BOOT:
            self.boots_seen += 1
            info = DeviceInfo.from_payload(f.payload)
            if self.info is not None:
                self.info = info
                self._last_step = None
                raise DeviceReset(
                    f"device on {self.url} restarted (boot HELLO received): its parameters and "
                    "training state are back to the firmware's defaults; reload parameters "
                    "(load_params) and replay from the last checkpoint", info)
        else:
            log.debug("ignoring unsolicited frame type 0x%02x", f.type)

    def _accept(self, wire: bytes, seq: int, req: int, resync: bool) -> Frame | None:
        """The reply to (seq, req) if `wire` is it; None for frames that answer nothing
        outstanding. Raises _Garbled for a corrupted frame or a "your request was garbled" error
        (unless resyncing: then they belong to the failed attempt and are dropped), and the
        device's error for this request."""
        try:
            f = decode_frame(wire, schema=self.expected_schema)
        except (CrcError, FramingError) as e:
            if resync:
                return None
            raise _Garbled(f"corrupted reply: {e}") from e
        if f.flags & Flag.UNSOLICITED:
            self._handle_unsolicited(f)
            return None
        if f.seq != seq:  # a late reply to an earlier attempt or request, or an error about
            self.stale_frames += 1  # garbled bytes (seq 0): nothing in it is ours
            if f.seq == 0 and f.type == Msg.ERROR and not resync and len(f.payload) >= 2 and \
                    struct.unpack_from("<H", f.payload)[0] in _GARBLED_CODES:
                raise _Garbled(f"device received a corrupted request: {_device_error(f)}")
            return None
        if f.type == Msg.ERROR:
            raise self._translate(_device_error(f))
        if f.type != (req | REPLY):
            self.stale_frames += 1
            return None
        if f.flags & Flag.REPLAY:
            self.replays_seen += 1
        return f

    def _await(self, seq: int, req: int, deadline: float) -> Frame:
        while True:
            while self._frames:
                f = self._accept(self._frames.pop(0), seq, req, resync=False)
                if f is not None:
                    return f
            if self._clock() >= deadline:
                raise DeviceTimeout("")
            self._read(deadline)

    def _resync(self, seq: int, req: int, k: int, limit: float) -> Frame | None:
        """After failed attempt k (0-based): read until the line has been quiet for
        quiet * 2**min(k, 3) seconds (at most `limit` seconds in all), dropping what belongs to
        the failed exchange (garbled frames, errors about them, stale replies), then drop any
        partial frame. A valid reply to (seq, req) that turns up meanwhile was late, not lost:
        it is returned."""
        quiet = self.quiet * (1 << min(k, 3))
        now = self._clock()
        end, last = now + limit, now
        while True:
            while self._frames:
                f = self._accept(self._frames.pop(0), seq, req, resync=True)
                if f is not None:
                    return f
            now = self._clock()
            if now >= min(end, last + quiet):  # the same sum _read is given: no rounding gap
                break
            if self._read(min(end, last + quiet)):
                last = self._clock()
        self._split.clear()
        return None

    def _translate(self, err: DeviceError) -> ProtocolError:
        if err.code == ErrorCode.VERSION:
            return VersionMismatch(
                f"device on {self.url} speaks protocol version {err.detail}, host speaks "
                f"{PROTOCOL_VERSION}: flash firmware and install a host package of the same "
                "release")
        if err.code == ErrorCode.SCHEMA:
            return SchemaMismatch(_schema_msg(err.detail, self._schema_out()))
        return err

    def request(self, req: int, payload: bytes = b"", *, timeout: float | None = None) -> Frame:
        """Send one request and return its reply frame.

        A frame goes out as 0x00, COBS, 0x00, 0x00: the lead ends whatever noise left in the
        device's decoder (so it cannot prefix this frame), the spare ends the frame even if
        noise ate the first delimiter (empty frames are ignored). After a timeout, a corrupted
        reply or a "your request was garbled" error the host resyncs (_resync: drains the
        failed exchange, backing off exponentially; a valid reply that turns up meanwhile is
        taken) and retransmits the same bytes, same seq, up to `retries` times."""
        seq = self._next_seq()
        wire = b"\x00" + encode_frame(req, seq, payload, schema=self._schema_out()) + b"\x00"
        timeout = self.timeout if timeout is None else timeout
        # time for the bytes themselves at 10 bits per byte, both ways
        timeout += 2 * 10 * len(wire) / max(self.baudrate, 1)
        last: Exception | None = None
        for attempt in range(1 + self.retries):
            if attempt:
                self.retransmissions += 1
            self._write(wire)
            try:
                f = self._await(seq, req, self._clock() + timeout)
            except (DeviceTimeout, _Garbled) as e:
                last = e
                self.timeouts += isinstance(e, DeviceTimeout)
                log.debug("%s seq %d attempt %d failed: %s", _msg_name(req), seq, attempt + 1, e)
                f = self._resync(seq, req, attempt, timeout)
            if f is not None:
                self.worst_retries = max(self.worst_retries, attempt)
                return f
        self.worst_retries = max(self.worst_retries, self.retries)
        name = _msg_name(req)
        if isinstance(last, _Garbled):
            raise CrcError(f"{name} to device on {self.url} failed {1 + self.retries} times: "
                           f"{last}: check the cable, the baud rate ({self.baudrate}) and "
                           "that nothing else writes to the port")
        raise DeviceTimeout(
            f"no reply from device on {self.url} within {timeout:.1f} s "
            f"({name} seq {seq}, {1 + self.retries} attempts): is the firmware running and the "
            f"baud rate {self.baudrate}?")

    def _need_info(self) -> DeviceInfo:
        return self.info if self.info is not None else self.hello()

    def _sample(self, x) -> bytes:
        info = self._need_info()
        b = _as_int8_bytes(x)
        if len(b) != info.input_len:
            raise ValueError(f"sample has {len(b)} values, the device model takes "
                             f"{info.input_len} int8 values")
        if 2 + len(b) > info.max_payload:  # TRAIN sends a uint16 label, then the sample
            raise ValueError(f"a sample of {len(b)} bytes (+2 for the label) does not fit the device's "
                             f"max payload of {info.max_payload} bytes: rebuild the firmware with "
                             f"-DTT_MAX_PAYLOAD={2 + len(b)} or more, or use a model with fewer inputs")
        return b

    def _check_label(self, label: int) -> int:
        info = self._need_info()
        label = int(label)
        if not 0 <= label < info.n_classes:
            raise ValueError(f"label {label} outside 0..{info.n_classes - 1}")
        return label

    def _check_step(self, step: int, expect_next: bool) -> None:
        if expect_next and self._last_step is not None and step < self._last_step:
            prev, self._last_step = self._last_step, None
            raise DeviceReset(f"device on {self.url} step counter went back from {prev} to "
                              f"{step} without a reset or load: it restarted; reload parameters")
        self._last_step = step

    def _call(self, req: int, payload: bytes, fmt: str) -> tuple:
        """request() and the reply's fixed fields (exactly `fmt`)."""
        return _fields(fmt, self.request(req, payload).payload, f"{_msg_name(req)} reply")

    # ------------------------------------------------------------------ commands

    def hello(self) -> DeviceInfo:
        """Identify the device; adopts its schema hash if the host did not name one."""
        f = self.request(Msg.HELLO)
        info = DeviceInfo.from_payload(f.payload)
        if info.protocol_version != PROTOCOL_VERSION:
            raise VersionMismatch(f"device speaks protocol {info.protocol_version}, host "
                                  f"{PROTOCOL_VERSION}: use matching firmware and host releases")
        if self.expected_schema and info.schema_hash != self.expected_schema:
            raise SchemaMismatch(_schema_msg(info.schema_hash, self.expected_schema))
        if not self.expected_schema:
            self.expected_schema = info.schema_hash
        self.info = info
        self._last_step = info.step
        return info

    def load_status(self) -> tuple[int, int, int]:
        """(bytes staged, CRC-32 of them, blob size) of the device's pending parameter load."""
        staged, crc, size = self._call(Msg.LOAD_STATUS, b"", "III")
        if staged > size:
            raise MalformedReply(f"LOAD_STATUS reply says {staged} bytes staged of {size}")
        return staged, crc, size

    def load_params(self, blob: bytes, chunk: int | None = None, resume: bool = True,
                    progress: Callable[[int, int], None] | None = None) -> int:
        """Send the flat parameter/state blob in acked chunks, then commit it with its CRC-32.
        The device switches to it only once all of it arrived intact; on any failure the old
        parameters stay live. With resume, a load interrupted earlier continues from the bytes
        already staged (verified by their CRC). Returns the state hash after the commit."""
        info = self._need_info()
        blob = bytes(blob)
        if len(blob) != info.param_bytes:
            raise ValueError(f"parameter blob is {len(blob)} bytes, the device model expects "
                             f"{info.param_bytes}: was it exported for schema "
                             f"0x{info.schema_hash:08x}?")
        if not info.atomic_load:
            raise DeviceError(ErrorCode.UNSUPPORTED, "firmware has no parameter staging")
        room = info.max_payload - 4
        chunk = room if chunk is None else max(1, min(int(chunk), room))
        off = 0
        if resume:
            staged, staged_crc, _ = self.load_status()
            if 0 < staged <= len(blob) and crc32(blob[:staged]) == staged_crc:
                off = staged
        self.last_load_start = off
        sequence_errors = 0
        while off < len(blob):
            piece = blob[off:off + chunk]
            try:
                (acked,) = self._call(Msg.LOAD_PARAMS, struct.pack("<I", off) + piece, "I")
            except DeviceError as e:
                if e.code == ErrorCode.SEQUENCE and sequence_errors < 3 and e.detail <= off:
                    sequence_errors += 1
                    off = e.detail  # the device lost part of the blob: continue where it is
                    continue
                raise
            # the device acks the bytes it holds: at least this chunk's end (more if it had them)
            if not off + len(piece) <= acked <= len(blob):
                raise MalformedReply(f"LOAD_PARAMS ack of offset {acked} for a chunk at {off} of "
                                     f"{len(piece)} bytes (blob {len(blob)} bytes)")
            off = acked
            if progress is not None:
                progress(off, len(blob))
        step, h = self._call(Msg.LOAD_COMMIT, struct.pack("<II", len(blob), crc32(blob)), "II")
        self._last_step = step
        return h

    def train(self, x, label: int) -> TrainResult:
        """One training step; returns (step, state_hash, loss, cycles spent in train_step)."""
        payload = struct.pack("<H", self._check_label(label)) + self._sample(x)
        r = TrainResult(*self._call(Msg.TRAIN, payload, "IIiI"))
        self._check_step(r.step, True)
        return r

    def train_batch(self, xs, labels) -> TrainResult:
        """Several steps of batch 1 in one frame (must fit max_payload); loss is their sum."""
        labels = [self._check_label(y) for y in labels]
        samples = [self._sample(x) for x in xs]
        if len(samples) != len(labels) or not samples:
            raise ValueError(f"{len(samples)} samples for {len(labels)} labels")
        payload = (struct.pack(f"<H{len(labels)}H", len(labels), *labels) + b"".join(samples))
        if len(payload) > self._need_info().max_payload:
            raise ValueError(f"batch payload of {len(payload)} bytes exceeds the device's "
                             f"{self.info.max_payload}: send fewer samples per batch")
        r = TrainResult(*self._call(Msg.TRAIN_BATCH, payload, "IIiI"))
        self._check_step(r.step, True)
        return r

    def predict(self, x) -> int:
        """Predicted class of sample x."""
        x = self._sample(x)
        (c,) = self._call(Msg.PREDICT, x, "i")
        if not 0 <= c < self.info.n_classes:
            raise MalformedReply(f"PREDICT reply names class {c}, the model has "
                                 f"{self.info.n_classes}")
        return c

    def state_hash(self) -> int:
        """Hash over parameters, optimizer state, PRNG and step counter."""
        step, h = self._call(Msg.STATE_HASH, b"", "II")
        self._check_step(step, True)
        return h

    def _chunks(self, req: int, ask: Callable[[int, int], bytes], fmt: str, room: int) -> tuple:
        """Reassemble a message read in chunks: ask(offset, room) is the request payload, each
        reply is the fields `fmt` (total length first, offset last) then data. Returns (bytes,
        fields of the last reply). The total and every field but the offset must stay the
        same, each reply must continue at the offset asked and stay within room and total."""
        out = bytearray()
        first = None
        while first is None or len(out) < first[0]:
            p = self.request(req, ask(len(out), room)).payload
            fields = _fields(fmt, p, f"{_msg_name(req)} reply", exact=False)
            data = p[struct.calcsize("<" + fmt):]
            total, off = fields[0], fields[-1]
            if (first is not None and fields[:-1] != first[:-1]) or off != len(out) or \
                    len(data) > room or off + len(data) > total or (not data and off < total):
                raise MalformedReply(f"{_msg_name(req)} reply at offset {off} with {len(data)} "
                                     f"bytes (fields {fields}) does not continue offset "
                                     f"{len(out)} of {first[0] if first else total} bytes")
            first = first or fields
            out += data
        return bytes(out), first

    def get_tensor(self, tensor_id: int) -> bytes:
        """All bytes of a tensor (TENSOR_PARAMS: the whole parameter blob), fetched in chunks."""
        info = self._need_info()
        data, (total, _) = self._chunks(
            Msg.GET_TENSOR, lambda off, room: struct.pack("<HHI", tensor_id, room, off), "II",
            info.max_payload - 8)
        if tensor_id == TENSOR_PARAMS and total != info.param_bytes:
            raise MalformedReply(f"parameter blob of {total} bytes, HELLO said "
                                 f"{info.param_bytes}")
        return data

    def read_params(self) -> bytes:
        """The live parameter/state blob (the layout load_params takes)."""
        return self.get_tensor(TENSOR_PARAMS)

    # -------------------------------------------- federated update codec (optional)

    def round_begin(self, rnd: int, device: int, codec: int) -> RoundBegin:
        """Start federated round `rnd` on the device: it snapshots the parameter store it holds
        (load the global model first) and selects the codec (1 int8, 2 int4, 3 sign; 0: the
        snapshot only, for FED_PROX when the host encodes the update)."""
        r = RoundBegin(*self._call(Msg.ROUND_BEGIN, struct.pack(
            "<IIB3x", rnd & 0xFFFFFFFF, device & 0xFFFFFFFF, codec), "IIII"))
        self._last_step = r.step
        return r

    def get_update(self, n_samples: int) -> bytes:
        """The device's compressed update message for the open round (encoded on the device from
        its live state, n_samples in its header), fetched in chunks; its CRC is checked."""
        out, (_, crc, _) = self._chunks(
            Msg.GET_UPDATE, lambda off, room: struct.pack("<IIHH", n_samples, off, room, 0),
            "III", self._need_info().max_payload - 12)
        if len(out) < 4 or crc32(out[:-4]) != crc or out[-4:] != struct.pack("<I", crc):
            raise CrcError(f"update message of {len(out)} bytes from {self.url} fails its CRC "
                           f"0x{crc:08x}: did the device state change while it was read?")
        return out

    def update_ack(self, rnd: int, crc: int, accepted: bool) -> UpdateAck:
        """The coordinator's verdict on the update whose message CRC is `crc`: the device
        commits its error-feedback residual only if accepted."""
        r = UpdateAck(*self._call(Msg.UPDATE_ACK, struct.pack(
            "<IIB3x", rnd & 0xFFFFFFFF, crc & 0xFFFFFFFF, 1 if accepted else 0), "II"))
        if r.status > 2:
            raise MalformedReply(f"UPDATE_ACK reply with status {r.status} (0, 1 or 2)")
        return r

    def fed_prox(self, mult: int, shift: int) -> int:
        """FedProx's pull of the device's parameter store toward its ROUND_BEGIN snapshot,
        w -= rshift_round((w - g) * mult, shift) (tinytrain/federated/prox.py). Returns the state
        hash after the pull."""
        step, h = self._call(Msg.FED_PROX, struct.pack("<IB3x", mult, shift), "II")
        self._last_step = step
        return h

    def set_seed(self, seed: int) -> None:
        self._call(Msg.SET_SEED, struct.pack("<I", seed & 0xFFFFFFFF), "")

    def reset(self) -> int:
        """Back to initial parameters, step 0; aborts a pending load. Returns the state hash."""
        step, h = self._call(Msg.RESET, b"", "II")
        self._last_step = step
        return h


def _msg_name(t: int) -> str:
    try:
        return Msg(t).name
    except ValueError:
        return f"message 0x{t:02x}"


def _device_error(f: Frame) -> DeviceError:
    code, req, _, detail = _fields("HBBI", f.payload, "ERROR frame", exact=False)
    return DeviceError(code, f.payload[8:].decode("utf-8", "replace"), detail, req)


def _as_int8_bytes(x) -> bytes:
    if isinstance(x, (bytes, bytearray, memoryview)):
        return bytes(x)
    import numpy as np

    a = np.asarray(x)
    if a.dtype != np.int8:
        if a.size and (a.min() < -128 or a.max() > 127):
            raise ValueError("sample values outside int8 range: quantize the input first")
        a = a.astype(np.int8)
    return a.tobytes()
