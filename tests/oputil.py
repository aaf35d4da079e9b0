"""Helpers for op tests: drawing integer arrays and passing numpy buffers to cffi."""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st


def draw_array(draw, shape, dtype, lo, hi):
    """Seeded random array with edge values mixed in (0, lo, hi), drawn through hypothesis."""
    seed = draw(st.integers(0, 2**32 - 1))
    mode = draw(st.sampled_from(["full", "small", "edge", "sparse"]))
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if mode == "full":
        a = rng.integers(lo, hi, n, endpoint=True)
    elif mode == "small":
        a = rng.integers(-3, 4, n)
    elif mode == "edge":
        a = rng.choice(np.array([lo, hi, 0, -1, 1], dtype=np.int64), n)
    else:
        a = rng.integers(lo, hi, n, endpoint=True) * (rng.random(n) < 0.2)
    return np.clip(a, lo, hi).astype(dtype).reshape(shape)


def _ptr(ffi, ctype, a):
    assert a.flags["C_CONTIGUOUS"]
    return ffi.cast(ctype, ffi.from_buffer(a))


def c_i8(ffi, a):
    assert a.dtype == np.int8
    return _ptr(ffi, "int8_t *", a)


def c_i16(ffi, a):
    assert a.dtype == np.int16
    return _ptr(ffi, "int16_t *", a)


def c_i32(ffi, a):
    assert a.dtype == np.int32
    return _ptr(ffi, "int32_t *", a)


def c_i64(ffi, a):
    assert a.dtype == np.int64
    return _ptr(ffi, "int64_t *", a)


def c_ctx(ffi, scratch=None):
    """(tt_ctx *, tt_stats *) over a numpy int64 scratch (or none). The ctx does not own the
    scratch: the caller keeps the array (and both results) alive while the ctx is used."""
    st = ffi.new("tt_stats *")
    scr = ffi.NULL if scratch is None else c_i64(ffi, scratch)
    return ffi.new("tt_ctx *", {"scratch": scr, "stats": st}), st
