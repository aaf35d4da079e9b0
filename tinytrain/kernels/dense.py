"""numba kernels for Dense, bit-exact with tinytrain.ops.dense (tests/test_ops_dense.py)."""
from __future__ import annotations

from numba import njit

from tinytrain.kernels._common import align, requant_s8


@njit(cache=True)
def dense_fwd(x, ex, w, ew, b, eb, acc, y, stats):
    """x (K,) int8, w (N, K) int16, b (N,) int32, acc (N,) int64 scratch, y (N,) int8."""
    N, K = w.shape
    ea = ex + ew
    for n in range(N):
        a = align(b[n], eb, ea)
        for k in range(K):
            a += x[k] * w[n, k]
        acc[n] = a
    return ea + requant_s8(acc, y, stats)


@njit(cache=True)
def dense_bwd(e, ee, w, ew, acc, dx, stats):
    """dx (K,) = requant(w^T e); acc (K,) int64 scratch."""
    N, K = w.shape
    for k in range(K):
        acc[k] = 0
    for n in range(N):
        en = e[n]
        if en == 0:
            continue
        for k in range(K):
            acc[k] += en * w[n, k]
    return ee + ew + requant_s8(acc, dx, stats)


@njit(cache=True)
def dense_grad(e, x, gw, gb):
    N, K = gw.shape
    for n in range(N):
        en = e[n]
        for k in range(K):
            gw[n, k] = en * x[k]
        gb[n] = en
