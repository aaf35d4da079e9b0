"""numba kernels for ReLU, Leaky ReLU, Flatten and residual Add, bit-exact with
tinytrain.ops.relu, ops.leaky_relu, ops.flatten and ops.add (tests/test_ops_elementwise.py). Arrays may have any shape but must
be C-contiguous (they are walked through flat views); no scratch."""
from __future__ import annotations

import numpy as np
from numba import njit

from tinytrain.kernels._common import align, requant_shift, rshift_round


@njit(cache=True)
def relu_fwd(x, ex, y, stats):
    """y = max(x, 0); returns ex. y may be x (in place)."""
    xf, yf = x.reshape(x.size), y.reshape(y.size)
    for i in range(xf.size):
        v = xf[i]
        yf[i] = v if v > 0 else 0
    return ex


@njit(cache=True)
def relu_bwd(e, ee, y, dx, stats):
    """dx = e where the saved output y > 0 else 0; returns ee. dx may be e."""
    ef, yf, df = e.reshape(e.size), y.reshape(y.size), dx.reshape(dx.size)
    for i in range(ef.size):
        df[i] = ef[i] if yf[i] > 0 else 0
    return ee


@njit(cache=True)
def flatten_fwd(x, ex, y, stats):
    """y (N,) = x in C order; returns ex."""
    y[:] = x.reshape(x.size)
    return ex


@njit(cache=True)
def flatten_bwd(e, ee, dx, stats):
    """dx (input shape) = e (N,) in C order; returns ee."""
    dx.reshape(dx.size)[:] = e
    return ee


@njit(cache=True)
def add_fwd(a, ea, b, eb, y, stats):
    """y = requant_s8(align(a) + align(b)) at the larger exponent; returns ey.
    Two passes (max |acc|, then round) instead of an accumulator buffer."""
    af, bf, yf = a.reshape(a.size), b.reshape(b.size), y.reshape(y.size)
    e = ea if ea > eb else eb
    m = 0
    for i in range(af.size):
        v = align(af[i], ea, e) + align(bf[i], eb, e)
        if v < 0:
            v = -v
        if v > m:
            m = v
    s = requant_shift(m, 8)
    for i in range(af.size):
        r = rshift_round(align(af[i], ea, e) + align(bf[i], eb, e), s)
        if r > 127:
            r = 127
            stats[0] += 1
        elif r < -127:
            r = -127
            stats[0] += 1
        yf[i] = r
    return e + s


@njit(cache=True)
def add_bwd(e, ee, da, db, stats):
    """da = db = e; returns ee."""
    da[...] = e
    db[...] = e
    return ee


@njit(cache=True)
def leaky_relu_fwd(x, ex, s, y, stats):
    """y = x where x > 0 else (x * s + 128) >> 8 (s: the Q8 slope); returns ex. y may be x."""
    xf, yf = x.reshape(x.size), y.reshape(y.size)
    for i in range(xf.size):
        v = np.int32(xf[i])
        yf[i] = v if v > 0 else (v * s + 128) >> 8
    return ex


@njit(cache=True)
def leaky_relu_bwd(e, ee, y, s, dx, stats):
    """dx = e where the saved output y > 0 else (e * s + 128) >> 8; returns ee. dx may be e."""
    ef, yf, df = e.reshape(e.size), y.reshape(y.size), dx.reshape(dx.size)
    for i in range(ef.size):
        v = np.int32(ef[i])
        df[i] = v if yf[i] > 0 else (v * s + 128) >> 8
    return ee
