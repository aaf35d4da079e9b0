"""numba twins of tinytrain/graph/prune.py (flat arrays of any integer dtype; masks are uint32
bitmaps, bit i % 32 of word i // 32 set: element i pruned).

The criterion is computed without sorting (as the C does, with no buffer): a binary search over
magnitudes finds T, the smallest magnitude with count(|v| <= T) >= k; every element below T
is pruned, and of those equal to T the first k - count(|v| < T) in index order. That is the
first k of the order (|v|, index), the reference's lexsort.
"""
from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, inline="always")
def _mag(v):
    x = np.int64(v)
    return -x if x < 0 else x


@njit(cache=True)
def prune_zero(mask, a):
    """a[i] = 0 for every pruned i (a flat, any integer dtype)."""
    n = a.size
    for wi in range(mask.size):
        word = np.int64(mask[wi])
        if word == 0:
            continue
        base = wi * 32
        for b in range(32):
            if (word >> b) & 1 and base + b < n:
                a[base + b] = 0


@njit(cache=True)
def _count_le(v, t):
    c = 0
    for i in range(v.size):
        if _mag(v[i]) <= t:
            c += 1
    return c


@njit(cache=True)
def prune_select(mask, v, k):
    """mask = the k elements of v (flat) with the smallest (|v|, index)."""
    n = v.size
    for wi in range(mask.size):
        mask[wi] = 0
    if k <= 0:
        return
    hi = np.int64(0)
    for i in range(n):
        m = _mag(v[i])
        if m > hi:
            hi = m
    lo = np.int64(0)
    if k < n:
        while lo < hi:  # smallest T with count(|v| <= T) >= k (count(|v| <= max) = n >= k)
            mid = lo + (hi - lo) // 2
            if _count_le(v, mid) >= k:
                hi = mid
            else:
                lo = mid + 1
    else:
        lo = hi
    T = lo
    need = k - (_count_le(v, T - 1) if T > 0 else 0)
    for i in range(n):
        m = _mag(v[i])
        if m < T or (m == T and need > 0):
            if m == T:
                need -= 1
            mask[i >> 5] = mask[i >> 5] | (np.uint32(1) << np.uint32(i & 31))


@njit(cache=True)
def prune_row(steps, t):
    """Index of t in the strictly increasing steps, -1 if absent (binary search)."""
    lo, hi = 0, steps.size
    while lo < hi:
        mid = (lo + hi) // 2
        if steps[mid] < t:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < steps.size and steps[lo] == t else -1
