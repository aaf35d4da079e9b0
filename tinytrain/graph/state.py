"""The training state as one blob: the tensors the state hash covers, in schema order, with a
name for each (what verification reports, what the device's state blob holds, what the
federated codec encodes). A model concept: it imports nothing above the model.

    slots = state_layout(model)          # [Slot(name, layer, kind, param, role, dtype, shape, offset, nbytes)]
    blob = state_blob(model)             # little-endian bytes, the C state blob's layout
    where = locate(model, blob, other)   # first differing tensor and index, or None
    bad = outside_symmetric(model)       # an int8/int16 tensor holding -128/-32768, or None
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Slot", "state_layout", "state_blob", "locate", "outside_symmetric"]


@dataclass(frozen=True)
class Slot:
    """One tensor of the state blob."""

    name: str       # e.g. "layer 2 dense w (param)"
    layer: int      # -1 for meta
    kind: str       # op kind ("dense", ...) or "meta"
    param: str      # parameter name, or "prng,step,batch" for meta
    role: str       # param | master | accum | velocity | mask | meta | scaler
    dtype: np.dtype
    shape: tuple
    offset: int     # byte offset in the blob
    nbytes: int


def state_layout(model) -> list[Slot]:
    """The tensors of the state blob in schema order (mirrors Sequential.state_tensors)."""
    slots, off = [], 0

    def add(li, kind, pname, role, a):
        nonlocal off
        a = np.asarray(a)
        name = (f"layer {li} {kind} {pname} ({role})" if li >= 0 else "meta [prng state, optimizer step, samples]"
                if role == "meta" else "loss scaler [exponent, clean steps, overflow steps]")
        slots.append(Slot(name, li, kind, pname, role, a.dtype, a.shape, off, a.nbytes))
        off += a.nbytes

    for li, l in enumerate(model.layers):
        for pi, p in enumerate(l.params):
            key = (li, pi)
            if key in model.master:
                add(li, l.kind, p.name, "master", model.master[key])
            else:
                add(li, l.kind, p.name, "param", model.stored(li, pi))
            if key in model.accum:
                add(li, l.kind, p.name, "accum", model.accum[key])
            if key in model.velocity:
                add(li, l.kind, p.name, "velocity", model.velocity[key])
            if key in model.masks:
                add(li, l.kind, p.name, "mask", model.masks[key])
    add(-1, "meta", "prng,step,batch", "meta", model.meta.astype(np.uint32))
    if model.loss_scale.enabled:
        add(-1, "meta", "scale,clean,overflows", "scaler", model.scaler.astype(np.int32))
    return slots


def state_blob(model) -> bytes:
    return b"".join(np.ascontiguousarray(a).astype(np.asarray(a).dtype.newbyteorder("<")).tobytes()
                    for a in model.state_tensors())


def locate(model, expected: bytes, got: bytes) -> dict | None:
    """First differing tensor and flat index between two state blobs of `model`'s layout."""
    if len(expected) != len(got):
        return {"tensor": "state blob", "index": None, "expected": len(expected), "device": len(got),
                "note": "blob sizes differ"}
    for s in state_layout(model):
        dt = s.dtype.newbyteorder("<")
        a = np.frombuffer(expected, dt, s.nbytes // dt.itemsize, s.offset)
        b = np.frombuffer(got, dt, s.nbytes // dt.itemsize, s.offset)
        diff = np.flatnonzero(a != b)
        if diff.size:
            i = int(diff[0])
            return {"tensor": s.name, "layer": s.layer, "op": s.kind, "param": s.param, "role": s.role,
                    "index": i, "multi_index": [int(v) for v in np.unravel_index(i, s.shape)] if s.shape else [],
                    "expected": int(a[i]), "device": int(b[i]), "differing": int(diff.size),
                    "byte_offset": s.offset + i * dt.itemsize}
    return None


def outside_symmetric(model) -> tuple[str, list, int] | None:
    """(tensor name, index, value) of the first int8 or int16 tensor of the training state (or a
    compute copy) holding -128 / -32768, else None. The contract keeps those tensors in the
    symmetric range (graph/optim.py sat_range): no update, conversion or import produces the
    minimum, and the C skips updates that round to zero (rows with a zero error) where the
    reference would clamp an old -32768, so a state holding it is refused wherever one enters:
    a .tt file, codegen (the initial state and the frozen weights in flash), the C's write_state
    (LOAD_PARAMS, a federated broadcast)."""
    named = [(s.name, a) for s, a in zip(state_layout(model), model.state_tensors())]
    named += [(f"layer {li} {l.kind} {p.name} (compute copy)", p.data)
              for li, l in enumerate(model.layers) for pi, p in enumerate(l.params) if (li, pi) in model.master]
    for name, a in named:
        a = np.asarray(a)
        if a.dtype in (np.int8, np.int16) and a.size:
            lo = int(np.iinfo(a.dtype).min)
            hit = np.flatnonzero(a.reshape(-1) == lo)
            if hit.size:
                return name, [int(v) for v in np.unravel_index(int(hit[0]), a.shape)], lo
    return None


def symmetric_error(bad) -> str:
    """The message part naming what outside_symmetric found."""
    name, index, lo = bad
    return (f"tensor {name} holds {lo} at {index}, outside the symmetric range [{lo + 1}, {-lo - 1}] "
            "that tinytrain's arithmetic keeps")
