"""The tinytrain model file (``.tt``): a model with its full training state, checksummed.

Layout (all integers little-endian)::

    offset  size  field
    0       8     magic  b"\\x89TTM\\r\\n\\x1a\\n"  (PNG-style: catches text-mode and 7-bit damage)
    8       2     format version (uint16), currently 1
    10      2     flags (uint16), 0
    12      4     header length H (uint32)
    16      8     total file length (uint64), trailer included: detects truncation first
    24      H     header: UTF-8 JSON (see below)
    24+H    D     tensor data: each tensor's raw little-endian bytes at its "offset" (relative
                  to the start of this section), every tensor aligned to 8 bytes, zero padding
    end-4   4     CRC-32 (IEEE, zlib) of every byte before it

Header JSON: {"format": "tinytrain-model", "version": 1, "writer": "tinytrain X.Y.Z",
"config": Sequential.config(), "schema": Sequential.schema(), "state_hash": int,
"data_input_exp": int | null, "extra": {...}, "data_nbytes": D,
"tensors": [{"name", "dtype", "shape", "offset", "nbytes"}, ...]}.
Tensors, in state order: per layer and parameter ``L{li}.{name}`` (the compute copy), then
``L{li}.{name}.master`` / ``.accum`` / ``.velocity`` / ``.mask`` (uint32 bitmap of the pruned
elements, graph/prune.py; only in models that prune, so older files read unchanged) where present, then ``meta`` (int64:
PRNG state, optimizer step, samples in batch), ``scaler`` (int64: loss-scale exponent, clean steps,
overflow steps; graph/loss_scale.py; only with a global or static loss scale) and ``stats``
(int64 saturation counters).
A reader of version v accepts files of version <= v; a new field that old readers may skip
goes in the header without a version bump.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np

from tinytrain import __version__
from tinytrain import fixedpoint as fp
from tinytrain.graph.state import outside_symmetric, symmetric_error

MAGIC = b"\x89TTM\r\n\x1a\n"
FORMAT_VERSION = 1
_FIXED = struct.Struct("<8sHHIQ")  # magic, version, flags, header length, total length
_ALIGN = 8
SUFFIX = ".tt"


class FileFormatError(ValueError):
    """A model file that cannot be read (or written); the message names the problem and the fix."""


def _state_items(model):
    """(name, array) in state order; arrays are the model's own (loaded in place)."""
    items = []
    for li, l in enumerate(model.layers):
        for pi, p in enumerate(l.params):
            key, base = (li, pi), f"L{li}.{p.name}"
            items.append((base, p.data))
            for suffix, store in (("master", model.master), ("accum", model.accum), ("velocity", model.velocity),
                                  ("mask", model.masks)):
                if key in store:
                    items.append((f"{base}.{suffix}", store[key]))
    items.append(("meta", model.meta))
    if model.loss_scale.enabled:
        items.append(("scaler", model.scaler))
    items.append(("stats", model.stats))
    return items


def _jsonable(v):
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    if isinstance(v, np.ndarray):
        return v.tolist()
    return v


def to_bytes(model, extra: dict | None = None) -> bytes:
    tensors, chunks, off = [], [], 0
    for name, a in _state_items(model):
        a = np.ascontiguousarray(a)
        le = a.astype(a.dtype.newbyteorder("<"), copy=False)
        raw = le.tobytes()
        pad = (-off) % _ALIGN
        chunks.append(b"\0" * pad)
        off += pad
        tensors.append({"name": name, "dtype": a.dtype.newbyteorder("<").str, "shape": list(a.shape),
                        "offset": off, "nbytes": len(raw)})
        chunks.append(raw)
        off += len(raw)
    header = {
        "format": "tinytrain-model", "version": FORMAT_VERSION, "writer": f"tinytrain {__version__}",
        "config": model.config(), "schema": model.schema(), "state_hash": model.state_hash(),
        "data_input_exp": getattr(model, "data_input_exp", None), "extra": _jsonable(extra or {}),
        "data_nbytes": off, "tensors": tensors,
    }
    try:
        hb = json.dumps(_jsonable(header), sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as exc:
        raise FileFormatError(f"cannot save: extra data is not JSON-serialisable ({exc})") from None
    total = _FIXED.size + len(hb) + off + 4
    body = _FIXED.pack(MAGIC, FORMAT_VERSION, 0, len(hb), total) + hb + b"".join(chunks)
    return body + struct.pack("<I", fp.crc32(body))


_TMP_NAME = re.compile(r"^\.(.+)\.(\d{1,9})\.tmp$")  # .NAME.PID.tmp, made by atomic_write (Linux PIDs < 2^22)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def remove_stale_tmp(directory) -> list[Path]:
    """Delete the temporary files ``.NAME.PID.tmp`` in `directory` that a killed writer left
    (atomic_write's, between create and rename), i.e. those whose PID is not a running
    process; a live PID's file may be a write in progress and stays. Returns what was removed."""
    removed = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return removed
    for e in entries:
        m = _TMP_NAME.match(e.name)
        if m and e.is_file(follow_symlinks=False) and not _pid_alive(int(m.group(2))):
            try:
                os.unlink(e.path)
                removed.append(Path(e.path))
            except FileNotFoundError:  # another process cleaned it first
                pass
    return removed


def atomic_write(path, write) -> Path:
    """Write ``path`` atomically: `write(f)` fills a temporary file ``.NAME.PID.tmp`` in the
    same directory, fsync, then os.replace, so a crash leaves the old file or the new one; the
    temporary files of earlier writers that were killed are removed first."""
    path = Path(path)
    check_writable(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:  # disk full, quota, read-only: name the file (f.write does not)
        raise FileFormatError(f"cannot write {path}: {exc.strerror or exc}: free space or choose "
                              "another path; the previous file, if any, is unchanged") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return path


def save(model, path, extra: dict | None = None) -> Path:
    """Write ``model`` (weights, optimizer state, PRNG, counters) and ``extra`` (JSON data
    such as the data PRNG state and epoch) to ``path`` with :func:`atomic_write`."""
    data = to_bytes(model, extra)
    return atomic_write(path, lambda f: f.write(data))


def check_writable(path, folder: bool = False) -> None:
    """Refuse an output path that can never be written (a directory where a file goes, a file
    where a folder goes, or anything under a file) before any work is done, naming the fix."""
    p = Path(path)
    if p.exists() and p.is_dir() != folder:
        raise FileFormatError(f"{p} is a file: give a folder (it is created if missing)" if folder else
                              f"{p} is a directory: give a file name for the output, e.g. {p / 'model.tt'}")
    for parent in p.parents:
        if parent.exists():
            if not parent.is_dir():
                raise FileFormatError(f"cannot write {p}: {parent} is a file, not a directory: "
                                      "choose another path")
            return


def is_model_file(path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _foreign(head: bytes) -> str:
    if head.startswith(b"PK"):
        return "a zip/.npz archive"
    if head.startswith(b"\x93NUMPY"):
        return "a numpy .npy array"
    if head.lstrip()[:1] in (b"{", b"["):
        return "a JSON file (a model description? pass it to --model for training)"
    if head.startswith(b"\x7fELF"):
        return "an ELF binary (firmware?)"
    if head[:4] == MAGIC[:4]:
        return "a damaged tinytrain model (the magic bytes were altered, e.g. by a text-mode copy)"
    return ""


def from_bytes(buf: bytes, where: str = "<bytes>"):
    """Parse a model file image; returns (model, extra). Raises FileFormatError."""
    from tinytrain.graph.model import Sequential
    from tinytrain.graph.layers import ModelError

    if not buf:
        raise FileFormatError(f"{where}: empty file (0 bytes), not a tinytrain model: the write was "
                              "interrupted or never happened; use an earlier checkpoint or train again")
    if len(buf) < len(MAGIC) or buf[:len(MAGIC)] != MAGIC:
        if len(buf) < len(MAGIC) and MAGIC.startswith(buf):
            raise FileFormatError(f"{where}: truncated ({len(buf)} bytes): the write was interrupted; "
                                  "use an earlier checkpoint or train again")
        what = _foreign(buf[:16])
        raise FileFormatError(f"{where}: {what + ', ' if what else ''}not a tinytrain model file (wrong "
                              "magic bytes): pass a file written by `tinytrain train --out` or tinytrain.save")
    if len(buf) < _FIXED.size:
        raise FileFormatError(f"{where}: truncated ({len(buf)} bytes, the fixed header alone is "
                              f"{_FIXED.size}): use an earlier checkpoint or train again")
    _, version, flags, hlen, total = _FIXED.unpack_from(buf)
    if version > FORMAT_VERSION:
        raise FileFormatError(f"{where}: written with model format version {version}, this tinytrain "
                              f"{__version__} reads up to version {FORMAT_VERSION}: upgrade tinytrain")
    if version == 0:
        raise FileFormatError(f"{where}: format version 0 is invalid: the file is damaged")
    if len(buf) < total:
        raise FileFormatError(f"{where}: truncated: {len(buf)} of {total} bytes present; the copy or "
                              "write was interrupted: use an earlier checkpoint or train again")
    if len(buf) > total:
        raise FileFormatError(f"{where}: {len(buf) - total} unexpected bytes after the end of the model "
                              f"({total} bytes): the file was appended to or is damaged")
    body, (crc,) = buf[:-4], struct.unpack("<I", buf[-4:])
    if fp.crc32(body) != crc:
        raise FileFormatError(f"{where}: corrupt: checksum mismatch (stored {crc:08x}, computed "
                              f"{fp.crc32(body):08x}); the file was damaged after it was written: "
                              "use another copy or an earlier checkpoint")
    try:
        header = json.loads(buf[_FIXED.size:_FIXED.size + hlen].decode())
        tensors = header["tensors"]
        cfg = header["config"]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as exc:
        raise FileFormatError(f"{where}: unreadable header ({exc}) although the checksum matches: "
                              "the file was written by a broken writer") from None
    if header.get("format") != "tinytrain-model":
        raise FileFormatError(f"{where}: header says format {header.get('format')!r}, not a tinytrain model")
    try:
        model = Sequential.from_config(cfg)
    except (ModelError, ValueError, KeyError, TypeError) as exc:
        raise FileFormatError(f"{where}: the stored model cannot be rebuilt by this tinytrain ({exc}); "
                              "it may need layer types from a newer version") from None
    _apply_exponents(model, header.get("schema"), where)
    items = _state_items(model)
    names = [n for n, _ in items]
    if [t.get("name") for t in tensors] != names:
        raise FileFormatError(f"{where}: stored tensors {[t.get('name') for t in tensors][:6]}... do not "
                              f"match the model's state {names[:6]}...: the file is inconsistent")
    data0 = _FIXED.size + hlen
    for (name, dst), t in zip(items, tensors):
        dt = np.dtype(t["dtype"])
        if dt.newbyteorder("=") != dst.dtype.newbyteorder("=") or tuple(t["shape"]) != dst.shape:
            raise FileFormatError(f"{where}: tensor {name} is {dt} {tuple(t['shape'])}, the model expects "
                                  f"{dst.dtype} {dst.shape}: the file is inconsistent")
        start = data0 + int(t["offset"])
        if start + int(t["nbytes"]) > len(body) or int(t["nbytes"]) != dst.nbytes:
            raise FileFormatError(f"{where}: tensor {name} lies outside the data section: the file is inconsistent")
        dst[...] = np.frombuffer(buf, dtype=dt, count=dst.size, offset=start).reshape(dst.shape)
    bad = outside_symmetric(model)  # the contract keeps int8/int16 tensors symmetric
    if bad is not None:
        raise FileFormatError(f"{where}: {symmetric_error(bad)}; the file was not written by tinytrain or "
                              "was edited: clamp the values and save again")
    if header.get("data_input_exp") is not None:
        model.data_input_exp = int(header["data_input_exp"])
    if model.state_hash() != header.get("state_hash"):
        raise FileFormatError(f"{where}: the loaded state hashes to {model.state_hash():08x}, the file "
                              f"recorded {header.get('state_hash')}: the writer and this reader disagree")
    return model, header.get("extra", {})


def _apply_exponents(model, schema, where):
    """Set the parameters' exponents to the stored ones: they are part of the training state
    (a model converted to another precision, or imported, has others than a fresh build)."""
    stored = (schema or {}).get("params")
    if stored is None:
        return
    params = [p for l in model.layers for p in l.params]
    if len(stored) != len(params):
        raise FileFormatError(f"{where}: the schema lists {len(stored)} parameters, the model has {len(params)}: "
                              "the file is inconsistent")
    for p, row in zip(params, stored):
        name, dtype, shape, exp = row[0], row[1], row[2], row[3]
        if name != p.name or dtype != str(p.data.dtype) or list(shape) != list(p.data.shape):
            raise FileFormatError(f"{where}: parameter {name} is {dtype} {shape} in the schema, the model has "
                                  f"{p.name} {p.data.dtype} {list(p.data.shape)}: the file is inconsistent")
        if not isinstance(exp, int) or not -200 <= exp <= 200:
            raise FileFormatError(f"{where}: parameter {name} has exponent {exp!r}: the file is inconsistent")
        p.exp = exp


def load(path):
    """Read a model file; returns (model, extra) with the exact saved training state."""
    p = Path(path)
    try:
        buf = p.read_bytes()
    except FileNotFoundError:
        raise FileFormatError(f"{p}: no such model file: train one with `tinytrain train --out {p}`") from None
    except IsADirectoryError:
        raise FileFormatError(f"{p} is a directory, not a model file") from None
    return from_bytes(buf, str(p))


def read_header(path) -> dict:
    """The verified JSON header of a model file (for ``tinytrain info``)."""
    p = Path(path)
    buf = p.read_bytes()
    from_bytes(buf, str(p))  # full verification
    _, _, _, hlen, _ = _FIXED.unpack_from(buf)
    return json.loads(buf[_FIXED.size:_FIXED.size + hlen].decode())
