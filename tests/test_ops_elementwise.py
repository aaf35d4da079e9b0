"""ReLU, Leaky ReLU, Flatten, residual Add: reference == numba == C on hypothesis-drawn shapes, values
and exponents, plus exact checks of the references."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.kernels import elementwise as ke
from tinytrain.ops import add as radd
from tinytrain.ops import flatten as rflat
from tinytrain.ops import leaky_relu as rleaky
from tinytrain.ops import relu as rrelu

from .oputil import c_i8, draw_array

shapes = st.lists(st.integers(1, 7), min_size=1, max_size=3).map(tuple)


@st.composite
def unary_case(draw):
    shape = draw(shapes)
    x = draw_array(draw, shape, np.int8, -127, 127)
    e = draw_array(draw, shape, np.int8, -127, 127)
    return x, e, draw(st.integers(-30, 10)), draw(st.integers(-30, 10))


@settings(max_examples=60, deadline=None)
@given(unary_case())
def test_relu_equal(clib, case):
    ffi, lib = clib
    x, e, ex, ee = case
    y_ref, ey_ref, nsat = rrelu.forward(x, ex)
    dx_ref, edx_ref, _, grads = rrelu.backward(e, ee, y_ref)
    assert y_ref.dtype == np.int8 and dx_ref.dtype == np.int8 and grads == []
    assert np.array_equal(y_ref, np.maximum(x, 0)) and ey_ref == ex and nsat == 0

    stats = np.zeros(4, np.int64)
    y, dx = np.zeros_like(x), np.zeros_like(x)
    assert ke.relu_fwd(x, ex, y, stats) == ex and np.array_equal(y, y_ref)
    assert ke.relu_bwd(e, ee, y_ref, dx, stats) == ee and np.array_equal(dx, dx_ref)
    assert stats[0] == 0

    st_c = ffi.new("tt_stats *")
    yc, dxc = np.zeros_like(x), np.zeros_like(x)
    assert lib.tt_relu_fwd_s8(c_i8(ffi, x), ex, x.size, c_i8(ffi, yc), st_c) == ex
    assert lib.tt_relu_bwd_s8(c_i8(ffi, e), ee, c_i8(ffi, y_ref), x.size, c_i8(ffi, dxc), st_c) == ee
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref) and st_c.saturated == 0


def test_relu_backward_is_adjoint():
    rng = np.random.default_rng(1)
    x = rng.integers(-127, 128, (5, 4, 3)).astype(np.int8)
    e = rng.integers(-127, 128, (5, 4, 3)).astype(np.int8)
    y, _, _ = rrelu.forward(x, 0)
    dx, _, _, _ = rrelu.backward(e, 0, y)
    assert int((dx.astype(np.int64) * x).sum()) == int((e.astype(np.int64) * y).sum())


@settings(max_examples=30, deadline=None)
@given(unary_case())
def test_flatten_equal(clib, case):
    ffi, lib = clib
    x, _, ex, _ = case
    y_ref, ey, _ = rflat.forward(x, ex)
    dx_ref, edx, _, grads = rflat.backward(y_ref, ex - 1, x.shape)
    assert y_ref.dtype == np.int8 and y_ref.shape == (x.size,) and ey == ex and grads == []
    assert np.array_equal(dx_ref, x) and edx == ex - 1
    stats = np.zeros(4, np.int64)
    y, dx = np.zeros(x.size, np.int8), np.zeros_like(x)
    assert ke.flatten_fwd(x, ex, y, stats) == ex and np.array_equal(y, y_ref)
    assert ke.flatten_bwd(y, ex - 1, dx, stats) == ex - 1 and np.array_equal(dx, x)
    st_c = ffi.new("tt_stats *")
    yc, dxc = np.zeros(x.size, np.int8), np.zeros_like(x)
    assert lib.tt_flatten_fwd_s8(c_i8(ffi, x), ex, x.size, c_i8(ffi, yc), st_c) == ex
    assert lib.tt_flatten_bwd_s8(c_i8(ffi, yc), ee := ex - 1, x.size, c_i8(ffi, dxc), st_c) == ee
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, x)


@st.composite
def add_case(draw):
    shape = draw(shapes)
    a = draw_array(draw, shape, np.int8, -127, 127)
    b = draw_array(draw, shape, np.int8, -127, 127)
    e = draw_array(draw, shape, np.int8, -127, 127)
    ea = draw(st.integers(-30, 10))
    eb = ea + draw(st.sampled_from([0, 1, -1, 2, -3, 7, -8, 9, 40, -70]))
    return a, b, e, ea, eb, draw(st.integers(-30, 10))


def _add_all(lib, ffi, a, ea, b, eb, e, ee):
    y_ref, ey_ref, nsat_ref = radd.forward(a, ea, b, eb)
    (da, db), edx, _, grads = radd.backward(e, ee)
    assert y_ref.dtype == np.int8 and da.dtype == np.int8 and grads == []
    assert np.array_equal(da, e) and np.array_equal(db, e) and edx == ee

    stats = np.zeros(4, np.int64)
    y = np.zeros_like(a)
    assert ke.add_fwd(a, ea, b, eb, y, stats) == ey_ref
    assert np.array_equal(y, y_ref) and stats[0] == nsat_ref
    da_n, db_n = np.zeros_like(e), np.zeros_like(e)
    assert ke.add_bwd(e, ee, da_n, db_n, stats) == ee
    assert np.array_equal(da_n, e) and np.array_equal(db_n, e)

    st_c = ffi.new("tt_stats *")
    yc = np.zeros_like(a)
    assert lib.tt_add_fwd_s8(c_i8(ffi, a), ea, c_i8(ffi, b), eb, a.size, c_i8(ffi, yc), st_c) == ey_ref
    assert np.array_equal(yc, y_ref) and st_c.saturated == nsat_ref
    dac, dbc = np.zeros_like(e), np.zeros_like(e)
    assert lib.tt_add_bwd_s8(c_i8(ffi, e), ee, e.size, c_i8(ffi, dac), c_i8(ffi, dbc), st_c) == ee
    assert np.array_equal(dac, e) and np.array_equal(dbc, e)
    return y_ref, ey_ref, nsat_ref


@settings(max_examples=120, deadline=None)
@given(add_case())
def test_add_equal(clib, case):
    ffi, lib = clib
    a, b, e, ea, eb, ee = case
    _add_all(lib, ffi, a, ea, b, eb, e, ee)


def test_add_edges_ubsan(clib_ubsan):
    ffi, lib = clib_ubsan
    full = np.full(6, 127, np.int8)
    for a, b, ea, eb in [(full, full, 0, 0), (-full, -full, -3, -3), (full, -full, 5, 5),
                         (full, full, 0, 62), (full, -full, -100, 100), (full, full, 3, 4)]:
        y, ey, nsat = _add_all(lib, ffi, a, ea, b, eb, full, -9)
        if ea == eb and (a == b).all():
            # 254 -> shift 1 -> 127 exactly, no saturation
            assert (y == np.sign(a.astype(int)) * 127).all() and ey == ea + 1 and nsat == 0
    # the finer input is rounded to nearest with ties toward +inf: 0.5 -> 1, -0.5 -> 0, -1.5 -> -1
    y, ey, _ = radd.forward(np.array([1, -1, 3], np.int8), 0, np.array([1, -1, -3], np.int8), -1)
    assert y.tolist() == [2, -1, 2] and ey == 0


@pytest.mark.parametrize("seed", range(5))
def test_add_against_python_ints(seed):
    rng = np.random.default_rng(seed)
    a = rng.integers(-127, 128, 20).astype(np.int8)
    b = rng.integers(-127, 128, 20).astype(np.int8)
    ea, eb = int(rng.integers(-10, 5)), int(rng.integers(-10, 5))
    y, ey, _ = radd.forward(a, ea, b, eb)
    e = max(ea, eb)

    def align(v, d):  # round half up (toward +inf) of v / 2^d
        return (2 * v + 2**d) // 2 ** (d + 1) if d else v

    acc = [align(int(p), e - ea) + align(int(q), e - eb) for p, q in zip(a, b)]
    s = max(0, max(abs(v) for v in acc).bit_length() - 7)
    want = [max(-127, min(127, align(v, s))) for v in acc]
    assert y.tolist() == want and ey == e + s


def test_relu_flatten_edges_ubsan(clib_ubsan):
    ffi, lib = clib_ubsan
    x = np.array([-127, -1, 0, 1, 127, 5], np.int8)
    e = np.array([127, -127, 127, -127, 127, 0], np.int8)
    st_c = ffi.new("tt_stats *")
    assert lib.tt_relu_fwd_s8(c_i8(ffi, x), -3, x.size, c_i8(ffi, x), st_c) == -3  # in place
    assert x.tolist() == [0, 0, 0, 1, 127, 5]
    dx = np.zeros_like(e)
    assert lib.tt_relu_bwd_s8(c_i8(ffi, e), 2, c_i8(ffi, x), e.size, c_i8(ffi, dx), st_c) == 2
    assert dx.tolist() == [0, 0, 0, -127, 127, 0]
    y = np.zeros_like(e)
    assert lib.tt_flatten_fwd_s8(c_i8(ffi, e), 1, e.size, c_i8(ffi, y), st_c) == 1
    assert lib.tt_flatten_bwd_s8(c_i8(ffi, y), 1, 0, c_i8(ffi, y), st_c) == 1
    assert np.array_equal(y, e) and st_c.saturated == 0


# ----------------------------------------------------------------------------- Leaky ReLU
LEAKY_CDEF = """
int32_t t_leaky_fwd(const int8_t *x, int32_t ex, int32_t n, int32_t s, int8_t *y);
int32_t t_leaky_bwd(const int8_t *e, int32_t ee, const int8_t *y, int32_t n, int32_t s, int8_t *dx);
"""
LEAKY_WRAP = """#include "tt_leaky_relu.h"
int32_t t_leaky_fwd(const int8_t *x, int32_t ex, int32_t n, int32_t s, int8_t *y)
{ tt_stats st = {0}; return tt_leaky_relu_fwd_s8(x, ex, n, s, y, &st); }
int32_t t_leaky_bwd(const int8_t *e, int32_t ee, const int8_t *y, int32_t n, int32_t s, int8_t *dx)
{ tt_stats st = {0}; return tt_leaky_relu_bwd_s8(e, ee, y, n, s, dx, &st); }
"""


@pytest.fixture(scope="module")
def leaky_c():
    """The header-only C kernels, called through two wrappers (UBSan build)."""
    from tinytrain.device import cbuild
    return cbuild.compile_shared([("leaky_wrap.c", LEAKY_WRAP)], LEAKY_CDEF, include_dirs=[cbuild.FIRMWARE_INCLUDE],
                                 sanitize=True, name="leaky")


def _leaky_exact(v, s):
    """Python-int model of the rule: v * s / 256 rounded to nearest, ties toward +inf."""
    return [int(a) if a > 0 else (int(a) * s + 128) // 256 for a in np.asarray(v).reshape(-1)]


@settings(max_examples=60, deadline=None)
@given(unary_case(), st.integers(1, 255))
def test_leaky_relu_equal(leaky_c, case, s):
    ffi, lib = leaky_c
    x, e, ex, ee = case
    y_ref, ey, nsat = rleaky.forward(x, ex, s)
    dx_ref, edx, _, grads = rleaky.backward(e, ee, y_ref, s)
    assert y_ref.dtype == np.int8 and ey == ex and nsat == 0 and grads == [] and edx == ee
    assert list(y_ref.reshape(-1)) == _leaky_exact(x, s)
    assert [int(d) for d in dx_ref.reshape(-1)] == [int(a) if b > 0 else (int(a) * s + 128) // 256
                                                    for a, b in zip(e.reshape(-1), y_ref.reshape(-1))]
    stats = np.zeros(4, np.int64)
    y, dx = np.zeros_like(x), np.zeros_like(x)
    assert ke.leaky_relu_fwd(x, ex, s, y, stats) == ex and np.array_equal(y, y_ref)
    assert ke.leaky_relu_bwd(e, ee, y_ref, s, dx, stats) == ee and np.array_equal(dx, dx_ref)
    yc, dxc = np.zeros_like(x), np.zeros_like(x)
    assert lib.t_leaky_fwd(c_i8(ffi, x), ex, x.size, s, c_i8(ffi, yc)) == ex
    assert lib.t_leaky_bwd(c_i8(ffi, e), ee, c_i8(ffi, y_ref), x.size, s, c_i8(ffi, dxc)) == ee
    assert np.array_equal(yc, y_ref) and np.array_equal(dxc, dx_ref)


def test_leaky_relu_edges_and_bad_alpha():
    x = np.array([-128, -127, -2, -1, 0, 1, 127], np.int8)
    assert list(rleaky.forward(x, 0, 255)[0]) == [-127, -127, -2, -1, 0, 1, 127]  # -127 * 255/256 = -126.50..: -127
    assert list(rleaky.forward(x, 0, 1)[0]) == [0, 0, 0, 0, 0, 1, 127]  # -128/256 = -0.5 -> 0 (tie up)
    assert rleaky.slope_q8(0.125) == 32 and rleaky.slope_q8(0.1) == 26
    for bad in (0, 1, -0.1, 1.5, True, "0.1", 0.001):
        with pytest.raises(ValueError, match="alpha"):
            rleaky.slope_q8(bad)


def _leaky_models():
    from tinytrain.graph.conv import Conv2d, MaxPool2d
    from tinytrain.graph.layers import Dense, Flatten, LeakyReLU
    from tinytrain.graph.residual import Residual
    yield (12,), [Dense(9), LeakyReLU(0.1), Dense(3)], "all"
    yield (6, 6, 2), [Conv2d(3, 3, padding="same"), LeakyReLU(0.25), Residual([Conv2d(3, 3, padding="same"), LeakyReLU()]),
                      MaxPool2d(2), Flatten(), Dense(3)], "all"
    yield (12,), [Dense(9), LeakyReLU(0.3), Dense(3)], "last:1"


@pytest.mark.parametrize("k", range(3))
def test_leaky_relu_in_models_reference_sim_c_equal(k):
    """The layer end to end: reference = numba = C (UBSan) after every step, alone, inside a
    residual block, after a conv, and frozen before the learning layers."""
    from tinytrain.graph.model import Sequential
    from tinytrain.graph.optim import SGD

    from .test_exactness import _data, three_way

    shape, layers, train = list(_leaky_models())[k]
    m = Sequential(layers, input_shape=shape, input_exp=-7, n_classes=3,
                   optimizer=SGD(lr=0.05, momentum=0.9, train=train), seed=k)
    x, y = _data(10, shape, 3, k)
    three_way(m, x, y, epochs=2)


@pytest.mark.qemu
def test_leaky_relu_trains_bit_exact_in_qemu(tmp_path):
    """...and on a board: a Dense-LeakyReLU-Dense digits model, 100 verified steps on the M4."""
    from tinytrain import data
    from tinytrain.codegen.project import build_firmware
    from tinytrain.graph.layers import Dense, LeakyReLU
    from tinytrain.graph.model import Sequential
    from tinytrain.graph.optim import SGD
    from tinytrain.verify import verify

    ds = data.load("digits")
    model = lambda: Sequential([Dense(16), LeakyReLU(0.125), Dense(10)], input_shape=(64,),  # noqa: E731
                               input_exp=ds.input_exp - 4, optimizer=SGD(lr=0.05), seed=0)
    elf = build_firmware(model(), "mps2_an386", tmp_path)
    r = verify(model(), ds, 100, board="mps2_an386", elf=elf)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 100
