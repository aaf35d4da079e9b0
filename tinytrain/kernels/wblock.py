"""numba kernels for block-exponent dense weights, bit-exact with tinytrain.ops.wblock and
tinytrain.ops.dense on the decoded weights q << s (tests/test_wblock.py)."""
from __future__ import annotations

import numpy as np
from numba import njit

from tinytrain.kernels._common import align, requant_s8, rshift_round
from tinytrain.kernels.dense import dense_grad  # noqa: F401  (the gradients do not read w)


@njit(cache=True)
def wblock_refresh(master, q, s, L, qmax, smax):
    """q (N, K) int8, s (N, nb) uint8 from the int16 master (N, K): ops/wblock.narrow."""
    N, K = master.shape
    nb = s.shape[1]
    for n in range(N):
        for j in range(nb):
            lo, hi = j * L, min((j + 1) * L, K)
            M = np.int64(0)
            for k in range(lo, hi):
                v = np.int64(master[n, k])
                if v < 0:
                    v = -v
                if v > M:
                    M = v
            sh = 0
            while sh < smax and rshift_round(M, sh) > qmax:
                sh += 1
            s[n, j] = sh
            for k in range(lo, hi):
                r = rshift_round(np.int64(master[n, k]), sh)
                q[n, k] = qmax if r > qmax else -qmax if r < -qmax else r


@njit(cache=True)
def dense_fwd_blk(x, ex, q, s, L, ew, b, eb, acc, y, stats):
    """ops/dense.forward on the weights q << s: per block the exact int64 sum, shifted."""
    N, K = q.shape
    nb = s.shape[1]
    ea = ex + ew
    for n in range(N):
        a = align(b[n], eb, ea)
        for j in range(nb):
            t = np.int64(0)
            for k in range(j * L, min((j + 1) * L, K)):
                t += np.int64(x[k]) * np.int64(q[n, k])
            a += t << np.int64(s[n, j])
        acc[n] = a
    return ea + requant_s8(acc, y, stats)


@njit(cache=True)
def dense_bwd_blk(e, ee, q, s, L, ew, acc, dx, stats):
    """ops/dense.backward's dx on the weights q << s (rows with a zero error add nothing)."""
    N, K = q.shape
    for k in range(K):
        acc[k] = 0
    for n in range(N):
        en = np.int64(e[n])
        if en == 0:
            continue
        for k in range(K):
            acc[k] += en * (np.int64(q[n, k]) << np.int64(s[n, k // L]))
    return ee + ew + requant_s8(acc, dx, stats)
