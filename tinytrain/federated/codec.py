"""Update messages: what a device sends back after a round, compressed or not, checksummed.

Codecs (``delta = local - global`` in integer units of each stored tensor, int64, plus the
device's error-feedback residual ``r``: ``v = delta + r``):

* ``none``  - the device's whole state blob (the LOAD_PARAMS / GET_TENSOR layout: parameter
  store, optimizer buffers, [prng, step, batch]), native dtypes. Nothing is lost; no residual.
* ``int8``  - per tensor a shift ``s = requant_shift(max|v|, 8)`` (= max(0, bitwidth - 7))
  and ``q = clamp(rshift_round(v, s), -127, 127)``; 1 byte per element.
* ``int4``  - the same with 4 bits: ``s = requant_shift(max|v|, 4)``, ``q`` in [-7, 7],
  two's-complement nibbles, element 2k in the low nibble of byte k.
* ``sign``  - one bit per element (1: +, 0: -, v = 0 counts as +) and one scale
  ``2^s`` with ``s = bitwidth(floor(sum|v| / n)) - 1`` (the power of two at or below the
  mean magnitude); a tensor whose mean magnitude floors to 0 is sent as "zero" (s = 255,
  no bits) and all of ``v`` stays in the residual.
* ``signmv`` - sign with majority vote (signSGD with majority vote, Bernstein et al. 2019): the
  device encodes exactly as ``sign`` (same bits, shift, zero tensors, error feedback against its
  own ``q << s``); only the coordinator's aggregation differs (server.MajorityVote: the sign of
  the sample-weighted sum of the devices' signs, at the devices' mean scale).
* ``topk16``, ``topk32`` - the k = ceil(n / 16) (or / 32) elements of largest ``|v|`` (ties: the
  lower index), as int8 with the int8 shift of the tensor, ``s = requant_shift(max|v|, 8)``;
  every other element sends nothing and stays in the residual (top-k sparsification with error
  feedback). Encoded on the host side only (the firmware codec has the four above).
* ``int4b32``, ``int4b64`` - int4 with one shift per block of 32 (64) elements (block-wise
  exponents, the last block shorter): ``s_b = requant_shift(max|v_block|, 4)``; the tensor's
  shift byte is 0, then one u8 shift per block, then the nibbles as for int4. Host side only.

Decoded delta ``d = q << s``; the reconstructed local tensor is ``sat(global + d)`` in the
tensor's dtype (int16: [-32767, 32767], int32: full range). The residual kept by the device is
``r' = v - (reconstructed - global)``: whatever the coordinator will not see is sent later
(error feedback). The device commits r' only when the coordinator acknowledges that the
update was used (``Device.ack``); a dropped update leaves the old residual in place.

Message layout (little-endian)::

    u8 version (1) | u8 codec | u16 0 | u32 device | u32 round | u32 n_samples |
    u32 hash | u32 step | u16 n_tensors | body | u32 crc32(everything before)

``hash``: codec none - the device's state hash (CRC-32 of the state blob, as STATE_HASH
reports it); other codecs - CRC-32 over the reconstructed parameter store tensors (their
little-endian bytes in schema order), which the coordinator recomputes after decoding.
Body: none - the state blob; int8/int4/sign - per stored tensor ``u8 shift`` then its data
(n, ceil(n/2) or ceil(n/8) bytes; nothing for a zero sign tensor); topk - ``u8 shift``, k
strictly increasing indices (u16; u32 when n > 65536), k int8 values.
"""
from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass

import numpy as np

from tinytrain import fixedpoint as fp

CODECS = ("none", "int8", "int4", "sign", "topk16", "topk32", "int4b32", "int4b64", "signmv")
DEVICE_CODECS = CODECS[:4] + ("signmv",)  # the ones the firmware's tt_fedcodec.c encodes on the board
SIGN_CODECS = ("sign", "signmv")  # one bit per element and a scale 2^s per tensor
TOPK = {"topk16": 16, "topk32": 32}
BLOCK = {"int4b32": 32, "int4b64": 64}
VERSION = 1
HEADER = struct.Struct("<BBHIIIIIH")
ZERO_SHIFT = 255

__all__ = ["CODECS", "Schema", "CorruptUpdate", "Update", "encode_update", "decode_update",
           "compress", "store_hash"]


class CorruptUpdate(ValueError):
    """An update that fails its CRC-32, its state hash, its length or its round."""


@dataclass
class Schema:
    """Tensor layout shared by coordinator and devices (from a template model)."""

    shapes: list
    dtypes: list
    slots: list           # verify.state_layout(model)
    store_slots: list     # indices into slots of the parameter store, schema order
    blob_bytes: int

    @classmethod
    def of(cls, model) -> "Schema":
        from tinytrain.graph.state import state_layout
        from tinytrain.federated.fedavg import store_tensors

        st = store_tensors(model)
        slots = state_layout(model)
        store = [i for i, s in enumerate(slots) if s.role in ("param", "master")]
        assert len(store) == len(st)
        return cls([t.shape for t in st], [t.dtype for t in st], slots, store,
                   sum(s.nbytes for s in slots))

    @property
    def store_bytes(self) -> int:
        return sum(int(np.prod(s)) * np.dtype(d).itemsize for s, d in zip(self.shapes, self.dtypes))

    @property
    def n_params(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes)

    def store_from_blob(self, blob: bytes) -> list[np.ndarray]:
        out = []
        for i in self.store_slots:
            s = self.slots[i]
            dt = s.dtype.newbyteorder("<")
            out.append(np.frombuffer(blob, dt, s.nbytes // dt.itemsize, s.offset).reshape(s.shape)
                       .astype(s.dtype))
        return out


@dataclass
class Update:
    device: int
    round: int
    n_samples: int
    step: int
    codec: str
    store: list           # reconstructed local parameter store
    hash: int
    nbytes: int           # bytes of the serialized message
    signs: list | None = None  # sign codecs: per tensor (shift, int64 array of +-1), or None for a zero tensor


@functools.lru_cache(maxsize=None)
def _bounds(dt):
    dt = np.dtype(dt)
    if dt == np.int16:
        return -fp.INT16_MAX, fp.INT16_MAX
    if dt == np.int8:
        return -fp.INT8_MAX, fp.INT8_MAX
    info = np.iinfo(dt)
    return int(info.min), int(info.max)


def _sat(v: np.ndarray, dt) -> np.ndarray:
    """v (int64) saturated to dt's codec range, as dt (np.clip's result, without its
    per-call overhead, which dominated rounds of thousands of small updates)."""
    lo, hi = _bounds(dt)
    return np.minimum(np.maximum(v, lo), hi).astype(dt)


def store_hash(tensors) -> int:
    return fp.state_hash(tensors)


def topk_count(n: int, codec: str) -> int:
    """Elements a top-k codec sends of a tensor of n: ceil(n / D), D = 16 or 32."""
    return -(-n // TOPK[codec])


def _blocks(n: int, codec: str):
    b = BLOCK[codec]
    return [(i, min(i + b, n)) for i in range(0, n, b)]


def _quantize(v: np.ndarray, codec: str):
    """(shift, q int64 array or None for a zero tensor, decoded delta int64)."""
    if codec in BLOCK:  # int4 with one shift per block: the tensor-level shift is 0
        shifts, q = [], np.empty_like(v)
        for a, b in _blocks(v.size, codec):
            sb = fp.requant_shift(fp.maxabs(v[a:b]), 4)
            shifts.append(sb)
            q[a:b] = np.minimum(np.maximum(fp.rshift_round(v[a:b], sb), -7), 7)
        sh = np.repeat(np.asarray(shifts, np.int64), [b - a for a, b in _blocks(v.size, codec)])
        return 0, (np.asarray(shifts, np.uint8), q), q << sh
    if codec in TOPK:
        k = topk_count(v.size, codec)
        sel = np.sort(np.argsort(-np.abs(v), kind="stable")[:k])  # ties: the lower index
        s = fp.requant_shift(fp.maxabs(v), 8)
        qv = np.minimum(np.maximum(fp.rshift_round(v[sel], s), -127), 127)
        d = np.zeros_like(v)
        d[sel] = qv << s
        return s, (sel, qv, v.size), d
    if codec in ("int8", "int4"):
        bits = 8 if codec == "int8" else 4
        qmax = (1 << (bits - 1)) - 1
        s = fp.requant_shift(fp.maxabs(v), bits)
        q = np.minimum(np.maximum(fp.rshift_round(v, s), -qmax), qmax)
        return s, q, q << s
    # sign, signmv
    mean = int(np.abs(v).sum()) // max(v.size, 1)
    if mean == 0:
        return ZERO_SHIFT, None, np.zeros_like(v)
    s = fp.bitwidth(mean) - 1
    q = np.where(v >= 0, 1, -1).astype(np.int64)
    return s, q, q << s


def _index_dtype(n: int):
    return np.dtype("<u2") if n <= 65536 else np.dtype("<u4")


def _pack(codec: str, q) -> bytes:
    if codec in BLOCK:  # block shifts, then int4 nibbles as for int4
        shifts, qv = q
        return shifts.tobytes() + _pack("int4", qv)
    if codec in TOPK:  # ascending indices (u16, u32 for tensors above 65536), then int8 values
        sel, qv, n = q
        return sel.astype(_index_dtype(n)).tobytes() + qv.astype(np.int8).tobytes()
    if codec == "int8":
        return q.astype(np.int8).tobytes()
    if codec == "int4":
        nib = (q.astype(np.int64) & 0xF).astype(np.uint8)
        if nib.size % 2:
            nib = np.append(nib, np.uint8(0))
        return (nib[0::2] | (nib[1::2] << 4)).astype(np.uint8).tobytes()
    return np.packbits(q > 0, bitorder="little").tobytes()


def _unpack(codec: str, buf: bytes, off: int, n: int):
    """(q int64 array, bytes consumed)."""
    if codec in BLOCK:  # q comes back already shifted by its block's shift
        blocks = _blocks(n, codec)
        shifts = np.frombuffer(buf, np.uint8, len(blocks), off).astype(np.int64)
        if (shifts > 62).any():
            raise CorruptUpdate("block shift out of range")
        q, k = _unpack("int4", buf, off + len(blocks), n)
        return q << np.repeat(shifts, [b - a for a, b in blocks]), len(blocks) + k
    if codec in TOPK:
        k, dt = topk_count(n, codec), _index_dtype(n)
        sel = np.frombuffer(buf, dt, k, off).astype(np.int64)
        qv = np.frombuffer(buf, np.int8, k, off + k * dt.itemsize).astype(np.int64)
        if k and (sel[-1] >= n or (np.diff(sel) <= 0).any()):
            raise CorruptUpdate("top-k indices not strictly increasing below the tensor size")
        q = np.zeros(n, np.int64)
        q[sel] = qv
        return q, k * (dt.itemsize + 1)
    if codec == "int8":
        return np.frombuffer(buf, np.int8, n, off).astype(np.int64), n
    if codec == "int4":
        k = (n + 1) // 2
        b = np.frombuffer(buf, np.uint8, k, off)
        nib = np.empty(2 * k, np.int64)
        nib[0::2], nib[1::2] = b & 0xF, b >> 4
        return ((nib[:n] ^ 8) - 8), k
    k = (n + 7) // 8
    bits = np.unpackbits(np.frombuffer(buf, np.uint8, k, off), bitorder="little")[:n]
    return np.where(bits == 1, 1, -1).astype(np.int64), k


#: widths the error-feedback residual may be kept in (bits); narrower ones saturate
RESIDUAL_BITS = (64, 32, 16)


def residual_bounds(bits: int) -> tuple[int, int]:
    """The two's-complement range of a residual kept in `bits` (64: numpy's int64, unbounded
    in practice: |v| < 2^62 by the codec's range contract)."""
    if bits not in RESIDUAL_BITS:
        raise ValueError(f"--residual-bits {bits}: use one of {', '.join(map(str, RESIDUAL_BITS))}")
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def compress(codec: str, local, glob, residual, residual_bits: int = 64, stats=None):
    """Quantize local - global + residual per tensor. Returns (body bytes, reconstructed
    local tensors, new residual list of int64 arrays). residual_bits < 64: the new residual is
    saturated to that two's-complement range (what the device keeps); `stats` (a dict) then
    counts the saturated elements under "residual_saturated"."""
    lo_r, hi_r = residual_bounds(residual_bits)
    body, recon, new_res = [], [], []
    for i, (lo, gl) in enumerate(zip(local, glob)):
        g64 = np.asarray(gl, np.int64).reshape(-1)
        v = np.asarray(lo, np.int64).reshape(-1) - g64
        if residual is not None:
            v = v + residual[i]
        s, q, d = _quantize(v, codec)
        body.append(bytes([s]))
        if q is not None:
            body.append(_pack(codec, q))
        rt = _sat(g64 + d, np.asarray(gl).dtype)
        recon.append(rt.reshape(np.shape(gl)))
        r = v - (rt.astype(np.int64) - g64)
        if residual_bits < 64:
            if stats is not None:
                stats["residual_saturated"] = stats.get("residual_saturated", 0) + int(
                    np.count_nonzero((r < lo_r) | (r > hi_r)))
            r = np.minimum(np.maximum(r, lo_r), hi_r)
        new_res.append(r)
    return b"".join(body), recon, new_res


def encode_update(codec: str, device: int, rnd: int, n_samples: int, step: int, h: int,
                  n_tensors: int, body: bytes) -> bytes:
    head = HEADER.pack(VERSION, CODECS.index(codec), 0, device, rnd, n_samples, h & 0xFFFFFFFF,
                       step & 0xFFFFFFFF, n_tensors)
    msg = head + body
    return msg + struct.pack("<I", fp.crc32(msg))


def decode_update(msg: bytes, schema: Schema, glob, rnd: int | None = None, *,
                  check_hash: bool = True) -> Update:
    """Check and decode an update against the global store it was computed from.
    Raises CorruptUpdate on any inconsistency (CRC, length, round, hash)."""
    msg = bytes(msg)
    if len(msg) < HEADER.size + 4:
        raise CorruptUpdate(f"update of {len(msg)} bytes is shorter than its header")
    (crc,) = struct.unpack_from("<I", msg, len(msg) - 4)
    if fp.crc32(msg[:-4]) != crc:
        raise CorruptUpdate(f"update CRC-32 0x{crc:08x} != 0x{fp.crc32(msg[:-4]):08x}: corrupted in transit")
    ver, ci, _, dev, r, n, h, step, nt = HEADER.unpack_from(msg)
    if ver != VERSION or ci >= len(CODECS):
        raise CorruptUpdate(f"update version {ver} codec {ci} not understood")
    if rnd is not None and r != rnd:
        raise CorruptUpdate(f"update from device {dev} is for round {r}, expected round {rnd}")
    if n == 0:
        raise CorruptUpdate(f"update from device {dev} counts 0 samples")
    codec = CODECS[ci]
    body = msg[HEADER.size:-4]
    if codec == "none":
        if len(body) != schema.blob_bytes or nt != len(schema.slots):
            raise CorruptUpdate(f"state blob of {len(body)} bytes / {nt} tensors, expected "
                                f"{schema.blob_bytes} / {len(schema.slots)}")
        if fp.crc32(body) != h:
            raise CorruptUpdate(f"device {dev}: state hash 0x{h:08x} != CRC-32 of its state blob "
                                f"0x{fp.crc32(body):08x}: tampered update")
        return Update(dev, r, n, step, codec, schema.store_from_blob(body), h, len(msg))
    if nt != len(schema.shapes):
        raise CorruptUpdate(f"{nt} tensors, expected {len(schema.shapes)}")
    off, recon = 0, []
    signs = [] if codec in SIGN_CODECS else None
    try:
        for shape, gl in zip(schema.shapes, glob):
            size = math.prod(shape)
            s = body[off]
            off += 1
            g64 = np.asarray(gl, np.int64).reshape(-1)
            if codec in SIGN_CODECS and s == ZERO_SHIFT:
                d = np.zeros(size, np.int64)
                signs.append(None)
            else:
                if s > 62 or (codec in BLOCK and s != 0):
                    raise CorruptUpdate(f"shift {s} out of range")
                q, k = _unpack(codec, body, off, size)
                if len(q) != size:
                    raise CorruptUpdate("truncated tensor data")
                off += k
                d = q << s
                if signs is not None:
                    signs.append((s, q))
            recon.append(_sat(g64 + d, np.asarray(gl).dtype).reshape(shape))
    except (IndexError, ValueError) as e:
        if isinstance(e, CorruptUpdate):
            raise
        raise CorruptUpdate(f"malformed {codec} body: {e}") from None
    if off != len(body):
        raise CorruptUpdate(f"{len(body) - off} trailing bytes in a {codec} update")
    if check_hash and store_hash(recon) != h:
        raise CorruptUpdate(f"device {dev}: hash 0x{h:08x} != 0x{store_hash(recon):08x} of the "
                            "reconstructed parameters: tampered update")
    return Update(dev, r, n, step, codec, recon, h, len(msg), signs)


# ------------------------------------------------------------------ the global message

GLOBAL_HEADER = struct.Struct("<BBHIIII")  # version, codec, 0, round, step, n_tensors, hash


def encode_global(rnd: int, step: int, store, codec: str = "none", base=None):
    """The coordinator's broadcast of the model devices train from in round `rnd`.

    codec none: the parameter store itself (native dtypes). Otherwise the store is sent as a
    compressed delta against `base`, the model the receiving devices already hold (the
    previous broadcast); the decoded result, not `store`, is what devices then hold.
    Returns (message bytes, the store the devices will hold). ``hash`` is the CRC-32 of that
    store, checked by the device after decoding."""
    if codec == "none":
        held = [np.asarray(t) for t in store]
        body = b"".join(np.ascontiguousarray(t).astype(t.dtype.newbyteorder("<")).tobytes() for t in held)
    else:
        body, held, _ = compress(codec, store, base, None)
    msg = GLOBAL_HEADER.pack(VERSION, CODECS.index(codec), 0, rnd, step, len(held), store_hash(held)) + body
    return msg + struct.pack("<I", fp.crc32(msg)), held


def global_round(msg: bytes) -> tuple[int, str]:
    """(round, codec) of a broadcast, without decoding it."""
    _, ci, _, rnd, _, _, _ = GLOBAL_HEADER.unpack_from(msg)
    return rnd, CODECS[ci]


def decode_global(msg: bytes, schema: Schema, base=None):
    """(round, step, store) of a broadcast; a delta broadcast is applied to `base` (the model
    the device holds). CorruptUpdate if the CRC or the resulting model's hash is wrong."""
    msg = bytes(msg)
    (crc,) = struct.unpack_from("<I", msg, len(msg) - 4)
    if fp.crc32(msg[:-4]) != crc:
        raise CorruptUpdate("global model message CRC mismatch")
    _, ci, _, rnd, step, nt, h = GLOBAL_HEADER.unpack_from(msg)
    codec = CODECS[ci]
    off, store = GLOBAL_HEADER.size, []
    if codec == "none":
        for shape, dt in zip(schema.shapes, schema.dtypes):
            n = math.prod(shape)
            d = np.dtype(dt).newbyteorder("<")
            store.append(np.frombuffer(msg, d, n, off).astype(dt).reshape(shape))
            off += n * d.itemsize
    else:
        if base is None:
            raise CorruptUpdate("a delta broadcast needs the previous global model")
        fake = encode_update(codec, 0, rnd, 1, step, 0, nt, msg[GLOBAL_HEADER.size:-4])
        try:
            store = decode_update(fake, schema, base, check_hash=False).store
        except CorruptUpdate as e:
            raise CorruptUpdate(f"global delta: {e}") from None
    if store_hash(store) != h:
        raise CorruptUpdate(f"global model hash mismatch after decoding ({codec}): the device's "
                            "copy of the previous global model differs")
    return rnd, step, store
