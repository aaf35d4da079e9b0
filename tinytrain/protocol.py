"""Host side of the tinytrain serial protocol (the specification is docs/protocol.md; the device
side is tinytrain/firmware/src/tt_protocol.c).

Frame before COBS, little-endian, followed on the wire by one 0x00 delimiter::

    u8 version | u8 type | u16 seq | u8 flags | u8 reserved | u16 len | u32 schema |
    payload[len] | u32 crc32(header + payload)

`DeviceLink` opens any pyserial URL (a tty, /dev/pts/N, socket://host:port, loop://) or takes an
already open serial-like object, and speaks stop-and-wait: one request, one reply with the same
seq. Every command may be retried: the device answers a retransmitted request (same seq, same
bytes) from its replay cache without executing it again.
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

log = logging.getLogger("tinytrain.protocol")


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

    @classmethod
    def from_payload(cls, p: bytes) -> "DeviceInfo":
        if len(p) < 28:
            raise FramingError(f"HELLO reply of {len(p)} bytes, expected at least 28")
        v, fl, mp, fw, sch, ram, pb, il, nc, st = struct.unpack_from("<BBHIIIIHHI", p)
        return cls(v, bool(fl & 1), mp, fw, sch, ram, pb, il, nc, st, bool(fl & 2))

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


class DeviceLink:
    """A conversation with one device.

    `port` is a pyserial URL (opened with serial.serial_for_url) or an object with pyserial's
    `read(n)`, `write(b)`, `timeout`, `in_waiting` and `close()`. `schema_hash`: the schema the
    host expects (None: adopt the device's from HELLO). `on_log(text)` receives LOG lines
    (default: the "tinytrain.protocol" logger). The link is not thread-safe.
    """

    def __init__(self, port, *, baudrate: int = 115200, timeout: float = 2.0, retries: int = 3,
                 schema_hash: int | None = None, on_log: Callable[[str], None] | None = None,
                 hello: bool = True):
        if isinstance(port, str):
            import serial  # pyserial, imported late so frame helpers work without it

            self.url = port
            try:
                self._ser = serial.serial_for_url(port, baudrate=baudrate, timeout=0.05)
            except (serial.SerialException, ValueError) as e:
                raise ProtocolError(f"cannot open {port!r}: {e}: check the device path or URL "
                                    "(e.g. /dev/ttyACM0, /dev/pts/3, socket://127.0.0.1:4321)")
        else:
            self.url = getattr(port, "name", None) or getattr(port, "port", None) or repr(port)
            self._ser = port
        self.baudrate = baudrate
        self.timeout = timeout
        self.retries = retries
        self.expected_schema = schema_hash
        self.on_log = on_log or (lambda text: log.info("device: %s", text))
        self.info: DeviceInfo | None = None
        self.boots_seen = 0
        self.replays_seen = 0
        self.last_load_start = 0  # offset the last load_params resumed from
        self.bytes_sent = self.bytes_received = 0  # serial traffic, COBS and delimiters included
        self._split = FrameSplitter()
        self._seq = int.from_bytes(os.urandom(2), "little") or 1
        self._last_step: int | None = None
        self._synced = False
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

    def _read_frames(self, deadline: float) -> list[bytes]:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return []
        t = min(remaining, 0.05)
        if self._ser.timeout != t:  # reconfiguring a real tty costs a syscall: only when needed
            self._ser.timeout = t
        n = getattr(self._ser, "in_waiting", 0) or 1
        data = self._ser.read(n)
        self.bytes_received += len(data) if data else 0
        return self._split.feed(data) if data else []

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

    def _await(self, seq: int, req: int, deadline: float) -> Frame:
        while time.monotonic() < deadline:
            for wire in self._read_frames(deadline):
                try:
                    f = decode_frame(wire, schema=self.expected_schema)
                except (CrcError, FramingError) as e:
                    # a corrupted reply: the caller retries, the device replays its cached answer
                    raise _Garbled(f"corrupted reply: {e}") from e
                if f.flags & Flag.UNSOLICITED:
                    self._handle_unsolicited(f)
                    continue
                if f.type == Msg.ERROR:
                    err = _device_error(f)
                    if f.seq == 0 and err.code in (ErrorCode.CRC, ErrorCode.FRAMING,
                                                   ErrorCode.TOO_LONG):
                        raise _Garbled(f"device received a corrupted request: {err}")
                    if f.seq != seq:
                        log.debug("stale ERROR seq %d (waiting for %d)", f.seq, seq)
                        continue
                    raise self._translate(err)
                if f.seq != seq or f.type != (req | REPLY):
                    log.debug("stale frame type 0x%02x seq %d (waiting for %d)", f.type, f.seq, seq)
                    continue
                if f.flags & Flag.REPLAY:
                    self.replays_seen += 1
                return f
        raise DeviceTimeout("")

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
        """Send one request and return its reply frame, retrying on timeouts and corruption."""
        seq = self._next_seq()
        wire = encode_frame(req, seq, payload, schema=self._schema_out())
        timeout = self.timeout if timeout is None else timeout
        # time for the bytes themselves at 10 bits per byte, both ways
        timeout += 2 * 10 * len(wire) / max(self.baudrate, 1)
        last: Exception | None = None
        if not self._synced:  # end any partial frame in the device's decoder (ignored if none)
            self._ser.write(b"\x00")
            self.bytes_sent += 1
            self._synced = True
        for _attempt in range(1 + self.retries):
            self._ser.write(wire)
            self.bytes_sent += len(wire)
            try:
                return self._await(seq, req, time.monotonic() + timeout)
            except DeviceTimeout as e:
                last = e
            except _Garbled as e:
                last = e
                log.debug("retrying %s seq %d: %s", _msg_name(req), seq, e)
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
        return struct.unpack("<III", self.request(Msg.LOAD_STATUS).payload[:12])

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
                f = self.request(Msg.LOAD_PARAMS, struct.pack("<I", off) + piece)
            except DeviceError as e:
                if e.code == ErrorCode.SEQUENCE and sequence_errors < 3 and e.detail <= off:
                    sequence_errors += 1
                    off = e.detail  # the device lost part of the blob: continue where it is
                    continue
                raise
            (off,) = struct.unpack("<I", f.payload[:4])
            if progress is not None:
                progress(off, len(blob))
        f = self.request(Msg.LOAD_COMMIT, struct.pack("<II", len(blob), crc32(blob)))
        step, h = struct.unpack("<II", f.payload[:8])
        self._last_step = step
        return h

    def train(self, x, label: int) -> TrainResult:
        """One training step; returns (step, state_hash, loss, cycles spent in train_step)."""
        payload = struct.pack("<H", self._check_label(label)) + self._sample(x)
        r = TrainResult(*struct.unpack("<IIiI", self.request(Msg.TRAIN, payload).payload[:16]))
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
        r = TrainResult(*struct.unpack("<IIiI",
                                       self.request(Msg.TRAIN_BATCH, payload).payload[:16]))
        self._check_step(r.step, True)
        return r

    def predict(self, x) -> int:
        """Predicted class of sample x."""
        return struct.unpack("<i", self.request(Msg.PREDICT, self._sample(x)).payload[:4])[0]

    def state_hash(self) -> int:
        """Hash over parameters, optimizer state, PRNG and step counter."""
        step, h = struct.unpack("<II", self.request(Msg.STATE_HASH).payload[:8])
        self._check_step(step, True)
        return h

    def get_tensor(self, tensor_id: int) -> bytes:
        """All bytes of a tensor (TENSOR_PARAMS: the whole parameter blob), fetched in chunks."""
        room = self._need_info().max_payload - 8
        out = bytearray()
        total = None
        while total is None or len(out) < total:
            f = self.request(Msg.GET_TENSOR, struct.pack("<HHI", tensor_id, room, len(out)))
            total, off = struct.unpack_from("<II", f.payload)
            data = f.payload[8:]
            if off != len(out) or (not data and len(out) < total):
                raise FramingError(f"GET_TENSOR reply at offset {off} with {len(data)} bytes, "
                                   f"asked for offset {len(out)} of {total}")
            out += data
        return bytes(out)

    def read_params(self) -> bytes:
        """The live parameter/state blob (the layout load_params takes)."""
        return self.get_tensor(TENSOR_PARAMS)

    # -------------------------------------------- federated update codec (optional)

    def round_begin(self, rnd: int, device: int, codec: int) -> RoundBegin:
        """Start federated round `rnd` on the device: it snapshots the parameter store it holds
        (load the global model first) and selects the codec (1 int8, 2 int4, 3 sign)."""
        p = self.request(Msg.ROUND_BEGIN, struct.pack("<IIB3x", rnd & 0xFFFFFFFF,
                                                      device & 0xFFFFFFFF, codec)).payload
        r = RoundBegin(*struct.unpack_from("<IIII", p))
        self._last_step = r.step
        return r

    def get_update(self, n_samples: int) -> bytes:
        """The device's compressed update message for the open round (encoded on the device from
        its live state, n_samples in its header), fetched in chunks; its CRC is checked."""
        room = self._need_info().max_payload - 12
        out = bytearray()
        total = crc = None
        while total is None or len(out) < total:
            f = self.request(Msg.GET_UPDATE, struct.pack("<IIHH", n_samples, len(out), room, 0))
            t, c, off = struct.unpack_from("<III", f.payload)
            data = f.payload[12:]
            if (total is not None and (t, c) != (total, crc)) or off != len(out) or \
                    (not data and len(out) < t):
                raise FramingError(f"GET_UPDATE reply at offset {off} ({len(data)} bytes, message "
                                   f"{t} bytes crc 0x{c:08x}) does not continue offset {len(out)}")
            total, crc = t, c
            out += data
        if len(out) < 4 or crc32(bytes(out[:-4])) != crc or out[-4:] != struct.pack("<I", crc):
            raise CrcError(f"update message of {len(out)} bytes from {self.url} fails its CRC "
                           f"0x{crc:08x}: did the device state change while it was read?")
        return bytes(out)

    def update_ack(self, rnd: int, crc: int, accepted: bool) -> UpdateAck:
        """The coordinator's verdict on the update whose message CRC is `crc`: the device
        commits its error-feedback residual only if accepted."""
        p = self.request(Msg.UPDATE_ACK, struct.pack("<IIB3x", rnd & 0xFFFFFFFF, crc & 0xFFFFFFFF,
                                                     1 if accepted else 0)).payload
        return UpdateAck(*struct.unpack_from("<II", p))

    def set_seed(self, seed: int) -> None:
        self.request(Msg.SET_SEED, struct.pack("<I", seed & 0xFFFFFFFF))

    def reset(self) -> int:
        """Back to initial parameters, step 0; aborts a pending load. Returns the state hash."""
        step, h = struct.unpack("<II", self.request(Msg.RESET).payload[:8])
        self._last_step = step
        return h


def _msg_name(t: int) -> str:
    try:
        return Msg(t).name
    except ValueError:
        return f"message 0x{t:02x}"


def _device_error(f: Frame) -> DeviceError:
    p = f.payload
    if len(p) < 8:
        return DeviceError(-1, f"short ERROR frame ({len(p)} bytes)")
    code, req, _, detail = struct.unpack_from("<HBBI", p)
    return DeviceError(code, p[8:].decode("utf-8", "replace"), detail, req)


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
