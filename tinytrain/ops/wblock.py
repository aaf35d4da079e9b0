"""Block-exponent weights (precision ``"exponent": "row" | "block32"``), reference.

A weight tensor w of N rows of K weights (dense: one row per output, K inputs: the reduction)
is cut into blocks of L consecutive weights along each row: ``row`` L = K, ``block32`` L = 32
(L = K when K < 32; the last block of a row may be shorter). Row n has nb = ceil(K / L)
blocks; block (n, j) holds w[n, j*L : (j+1)*L]. A block stores values q (int8 storage) in the
symmetric range [-qmax, qmax], qmax = 2^(bits-1) - 1 (int4: 7, int8: 127), and one shift s
(uint8) in [0, smax], smax = 16 - bits (int4: 12, int8: 8). The weight it stands for is

    w[n, k] = q[n, k] << s[n, k // L]        at the exponent ew of the int16 master,

so |w| <= qmax << smax <= 32767 (int4: 28672, int8: 32512): the decoded weights are int16
weights, and every accumulator bound of the int16 kernels (ops/dense.py) holds unchanged.

Narrowing (``narrow``), after every update of the int16 master m (at exponent ew), per block:

    M = max |m| over the block
    s = the smallest s in [0, smax] with rshift_round(M, s) <= qmax   (smax when there is none)
    q = clamp(rshift_round(m, s), -qmax, qmax)

rshift_round rounds ties toward +infinity (fixedpoint.rshift_round), whatever the policy's
update rounding: the narrowing is deterministic and draws no random number. Since
rshift_round(-M, s) >= -rshift_round(M, s), the chosen s holds every value of the block, so
q saturates only when s = smax, i.e. when M >= (qmax + 1/2) * 2^smax (int4: M >= 30720, int8:
M >= 32640), to +-qmax. An all-zero block has s = 0 and q = 0.
"""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import rshift_round


def limits(bits: int) -> tuple[int, int]:
    """(qmax, smax) of a ``bits``-wide block format."""
    return (1 << (bits - 1)) - 1, 16 - bits


def n_blocks(K: int, L: int) -> int:
    return -(-K // L)


def block_index(K: int, L: int) -> np.ndarray:
    """The block of each column k of a row: k // L."""
    return np.arange(K) // L


def narrow(master: np.ndarray, L: int, bits: int):
    """(q int8 (N, K), s uint8 (N, nb)) of an int16 master (N, K): the rule of the module docstring."""
    qmax, smax = limits(bits)
    m = master.astype(np.int64)
    N, K = m.shape
    nb = n_blocks(K, L)
    s = np.zeros((N, nb), np.int64)
    for j in range(nb):
        M = np.abs(m[:, j * L:(j + 1) * L]).max(axis=1)
        for n in range(N):
            while s[n, j] < smax and int(rshift_round(np.int64(M[n]), int(s[n, j]))) > qmax:
                s[n, j] += 1
    sk = s[:, block_index(K, L)]
    r = np.where(sk > 0, (m >> sk) + ((m >> np.maximum(sk - 1, 0)) & 1), m)  # rshift_round per element
    q = np.clip(r, -qmax, qmax)
    return q.astype(np.int8), s.astype(np.uint8)


def expand(q: np.ndarray, s: np.ndarray, L: int) -> np.ndarray:
    """The int16 weights q << s that a block format stands for (exact)."""
    K = q.shape[1]
    return (q.astype(np.int64) << s.astype(np.int64)[:, block_index(K, L)]).astype(np.int16)


def pack_int4(q: np.ndarray) -> np.ndarray:
    """int4 values in [-8, 7] packed two per byte, flat order, low nibble first (the last high
    nibble 0 for an odd count: the C never writes it): the C layout (tt_dense_wblk.h), and the bytes a frozen int4
    tensor has in the state hash and blob (a learning one is in the state as its master)."""
    v = (np.asarray(q).reshape(-1).astype(np.int64) & 15).astype(np.uint8)
    if v.size % 2:
        v = np.append(v, np.uint8(0))
    return (v[0::2] | (v[1::2] << 4)).astype(np.uint8)
