"""numba twins of tinytrain/graph/prune.py (flat arrays of any integer dtype; masks are uint32
bitmaps, bit i % 32 of word i // 32 set: element i pruned).

The criterion is computed without sorting: a binary search over magnitudes finds T, the
smallest magnitude with count(m <= T) >= k; every element below T is pruned, and of those equal
to T the first k - count(m < T) in position order. That is the first k of the order
(m, position), the reference's lexsort. A unit of several tensors (scope "global") is ranked on
one array of magnitudes m = |v| << shift, the tensors one after the other (the C walks the
tensors instead and needs no buffer).
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
def prune_mags(v, shift, mags, off):
    """mags[off + i] = |v[i]| << shift (|v| <= 2^31, shift <= 31: below 2^63)."""
    for i in range(v.size):
        mags[off + i] = _mag(v[i]) << shift


@njit(cache=True)
def _count_le(m, t):
    c = 0
    for i in range(m.size):
        if m[i] <= t:
            c += 1
    return c


@njit(cache=True)
def prune_select_mags(mags, k, sel):
    """sel[i] = 1 for the k positions with the smallest (mags[i], i), else 0."""
    n = mags.size
    for i in range(n):
        sel[i] = 0
    if k <= 0:
        return
    hi = np.int64(0)
    for i in range(n):
        if mags[i] > hi:
            hi = mags[i]
    lo = np.int64(0)
    if k < n:
        while lo < hi:  # smallest T with count(m <= T) >= k (count(m <= max) = n >= k)
            mid = lo + (hi - lo) // 2
            if _count_le(mags, mid) >= k:
                hi = mid
            else:
                lo = mid + 1
    else:
        lo = hi
    need = k - (_count_le(mags, lo - 1) if lo > 0 else 0)
    for i in range(n):
        m = mags[i]
        if m < lo or (m == lo and need > 0):
            if m == lo:
                need -= 1
            sel[i] = 1


@njit(cache=True)
def prune_mask_from(sel, off, n, mask):
    """The bitmap of elements sel[off:off + n]."""
    for wi in range(mask.size):
        mask[wi] = 0
    for i in range(n):
        if sel[off + i]:
            mask[i >> 5] = mask[i >> 5] | (np.uint32(1) << np.uint32(i & 31))


@njit(cache=True)
def prune_select(mask, v, k):
    """mask = the k elements of one tensor v (flat) with the smallest (|v|, index)."""
    mags = np.empty(v.size, np.int64)
    prune_mags(v, 0, mags, 0)
    sel = np.zeros(v.size, np.uint8)
    prune_select_mags(mags, k, sel)
    prune_mask_from(sel, 0, v.size, mask)


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


# ---------------------------------------------------------------- structured (graph/prune_groups.py)
@njit(cache=True)
def prune_group_norms(v, inner, row, mult, shift, norms, off):
    """norms[off + g] = ((sum of |v| over unit g's elements) * mult) << shift (exact below
    2^63, checked at build time); rows of `row` elements cut into units of `inner`, the last of
    a row shorter when inner does not divide row (graph/prune_groups.unit_of)."""
    bpr = (row + inner - 1) // inner
    for r in range(v.size // row):
        for j in range(bpr):
            s = np.int64(0)
            for i in range(r * row + j * inner, r * row + min((j + 1) * inner, row)):
                s += _mag(v[i])
            norms[off + r * bpr + j] = (s * mult) << shift


@njit(cache=True)
def prune_group_mask_from(sel, off, n, inner, row, mask):
    """The bitmap of a tensor of n elements whose element i is in unit
    (i // row) * ceil(row / inner) + (i % row) // inner: pruned when sel[off + unit]."""
    for wi in range(mask.size):
        mask[wi] = 0
    bpr = (row + inner - 1) // inner
    for i in range(n):
        if sel[off + (i // row) * bpr + (i % row) // inner]:
            mask[i >> 5] = mask[i >> 5] | (np.uint32(1) << np.uint32(i & 31))
