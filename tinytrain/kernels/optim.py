"""numba twins of tinytrain/graph/optim.py update rules (flat arrays; meta[0] is the PRNG state)."""
from __future__ import annotations

import numpy as np
from numba import njit

from tinytrain.kernels._common import rshift_round

GUARD_BITS = 8


@njit(cache=True, inline="always")
def _xorshift(st):
    st ^= (st << 13) & 0xFFFFFFFF
    st ^= st >> 17
    st ^= (st << 5) & 0xFFFFFFFF
    return st


@njit(cache=True, inline="always")
def _shift1(v, s, sr, meta):
    if s <= 0:
        if s < 0:
            t = -s if -s < 40 else 40
            lim = np.int64(1) << 62
            if v > (lim >> t):
                return lim
            if v < -(lim >> t):
                return -lim
            return v << t
        return v
    if not sr:
        return rshift_round(v, s if s < 62 else 62)
    st = _xorshift(meta[0])
    meta[0] = st
    ss = s if s < 31 else 31
    if s > 31:  # floor(v / 2^(s - 31)) first, then the 31-bit draw (graph/optim.py _shift); a
        v >>= s - 31 if s - 31 < 63 else 63  # shift of 64 or more is undefined in LLVM (as in C)
    m = (np.int64(1) << ss) - 1
    return (v >> ss) + (((v & m) + (st & m)) >> ss)


@njit(cache=True, inline="always")
def _sat_store(v, lim_lo, lim_hi):
    return lim_lo if v < lim_lo else lim_hi if v > lim_hi else v


@njit(cache=True, inline="always")
def _plain_shift(s, sr):
    """Whether a step's shift s takes the plain path: round to nearest by a right shift of
    1..62 bits, no stochastic rounding (whose PRNG draws are per element) and no left shift."""
    return not sr and 0 < s <= 62


CHUNK = 64  # the plain paths skip runs of CHUNK elements whose gradient is all zero


@njit(cache=True, inline="always")
def _zero_run(g, a):
    """Whether g[a:a + CHUNK] is all zero (an OR reduction LLVM vectorises)."""
    nz = 0
    for i in range(a, a + CHUNK):
        nz |= g[i]
    return nz == 0


@njit(cache=True, inline="always")
def _plain_steps(w, g, a, b, s, m_t, lo, hi, neg):
    """w[a:b] -= rshift_round(m_t g, s) (neg = -1; neg = 0 adds it: d ^ -1 - -1 is -d), clamped
    to [lo, hi]: (underflows, saturations)."""
    s1, nu, ns = s - 1, np.int64(0), np.int64(0)
    for i in range(a, b):
        gi = np.int64(g[i])
        v = m_t * gi
        d = (v >> s) + ((v >> s1) & 1)
        nu += (d == 0) & (gi != 0)
        v = np.int64(w[i]) + ((d ^ neg) - neg)
        nv = min(max(v, lo), hi)
        ns += nv != v
        w[i] = nv
    return nu, ns


@njit(cache=True)
def _update_plain(w, g, s, m_t, lo, hi, stats):
    """update_direct without weight decay on the plain path, exactly: a run whose gradient is
    zero and whose weights are in range is left as it is (its steps are 0 and nothing counts);
    the rest run branch-free with the counters in registers, which LLVM vectorises."""
    lo64, hi64 = np.int64(lo), np.int64(hi)
    nu, ns = np.int64(0), np.int64(0)
    end = w.size - w.size % CHUNK
    for a in range(0, end, CHUNK):
        if _zero_run(g, a):
            bad = False
            for i in range(a, a + CHUNK):
                bad |= (w[i] < lo64) | (w[i] > hi64)
            if not bad:
                continue
        u, t = _plain_steps(w, g, a, a + CHUNK, s, m_t, lo64, hi64, -1)
        nu += u
        ns += t
    u, t = _plain_steps(w, g, end, w.size, s, m_t, lo64, hi64, -1)
    stats[2] += nu + u
    stats[1] += ns + t


@njit(cache=True, inline="always")
def _step1(w, i, gi, s, m_t, sr, wd_m, wd_k, lo, hi, meta, stats):
    """One element of update_direct, any shift and option: w[i] -= shift(m_t g) (+ decay)."""
    d = _shift1(m_t * gi, s, sr, meta)
    if d == 0 and gi != 0:
        stats[2] += 1
    wi = np.int64(w[i])
    if wd_m != 0:
        d += rshift_round(wi * wd_m, wd_k)
    v = wi - d
    nv = _sat_store(v, lo, hi)
    if nv != v:
        stats[1] += 1
    w[i] = nv


@njit(cache=True)
def update_direct(w, ew_store, g, eg, k, m_t, sr, wd_m, wd_k, lo, hi, meta, stats):
    s = ew_store + k - eg
    if wd_m == 0 and _plain_shift(s, sr):
        _update_plain(w, g, s, m_t, lo, hi, stats)
        return
    for i in range(w.size):
        _step1(w, i, np.int64(g[i]), s, m_t, sr, wd_m, wd_k, lo, hi, meta, stats)


@njit(cache=True, inline="always")
def _row_steps(w, me, nz, x, s, lo, hi, neg):
    """_plain_steps of a row w whose gradient is e x[j] (me = m_t e, nz: e != 0), formed on the fly."""
    s1, nu, ns = s - 1, np.int64(0), np.int64(0)
    for j in range(x.size):
        xj = np.int64(x[j])
        v = me * xj
        d = (v >> s) + ((v >> s1) & 1)
        nu += (d == 0) & (xj != 0) & nz
        v = np.int64(w[j]) + ((d ^ neg) - neg)
        nv = min(max(v, lo), hi)
        ns += nv != v
        w[j] = nv
    return nu, ns


@njit(cache=True)
def dense_update_direct(w, e, x, ew_store, eg, k, m_t, sr, wd_m, wd_k, lo, hi, meta, stats):
    """update_direct of a Dense weight (N, K) with its gradient e[n] x[k] formed on the fly (no
    gradient buffer), in the same element order, so the same bits and PRNG draws. On the plain
    path a row whose error is 0 and whose weights are in range is skipped (its steps are 0), and
    m_t e[n] x[k] is (m_t e[n]) x[k]: the same int64 product."""
    N, K = w.shape
    s = ew_store + k - eg
    if not (wd_m == 0 and _plain_shift(s, sr)):
        wf = w.reshape(-1)
        for n in range(N):
            en = np.int64(e[n])
            for j in range(K):
                _step1(wf, n * K + j, en * np.int64(x[j]), s, m_t, sr, wd_m, wd_k, lo, hi, meta, stats)
        return
    nu, ns = np.int64(0), np.int64(0)
    lo64, hi64 = np.int64(lo), np.int64(hi)
    for n in range(N):
        en = np.int64(e[n])
        if en == 0:
            bad = False
            for j in range(K):
                bad |= (w[n, j] < lo64) | (w[n, j] > hi64)
            if not bad:
                continue
        u, t = _row_steps(w[n], m_t * en, en != 0, x, s, lo64, hi64, -1)
        nu += u
        ns += t
    stats[2] += nu
    stats[1] += ns


@njit(cache=True, inline="always")
def _acc1(A, i, gi, s, m_t, sr, meta, stats):
    """One element of accumulate, any shift: A[i] += shift(m_t g), saturated to int32."""
    d = _shift1(m_t * gi, s, sr, meta)
    if d == 0 and gi != 0:
        stats[2] += 1
    A[i] = _sat_store(np.int64(A[i]) + d, -(np.int64(1) << 31), (np.int64(1) << 31) - 1)


@njit(cache=True)
def accumulate(A, ew_store, g, eg, k, m_t, sr, meta, stats):
    s = ew_store + k - eg - GUARD_BITS
    lo32, hi32 = -(np.int64(1) << 31), (np.int64(1) << 31) - 1
    if _plain_shift(s, sr):  # A is int32: a zero run leaves it as it is
        nu = np.int64(0)
        end = A.size - A.size % CHUNK
        for a in range(0, end, CHUNK):
            if not _zero_run(g, a):
                nu += _plain_steps(A, g, a, a + CHUNK, s, m_t, lo32, hi32, 0)[0]
        nu += _plain_steps(A, g, end, A.size, s, m_t, lo32, hi32, 0)[0]
        stats[2] += nu
        return
    for i in range(A.size):  # _acc1 written out: inlined here it slowed the plain path above by ~40 %
        d = _shift1(m_t * np.int64(g[i]), s, sr, meta)
        if d == 0 and g[i] != 0:
            stats[2] += 1
        A[i] = _sat_store(np.int64(A[i]) + d, lo32, hi32)


@njit(cache=True)
def dense_accumulate(A, e, x, ew_store, eg, k, m_t, sr, meta, stats):
    """accumulate of a Dense weight (A flat, N = e.size rows of K = x.size) with its gradient
    e[n] x[k] formed on the fly, in the same element order; on the plain path a row whose error
    is 0 is skipped (its steps are 0 and A is int32, so nothing saturates)."""
    N, K = e.size, x.size
    s = ew_store + k - eg - GUARD_BITS
    lo32, hi32 = -(np.int64(1) << 31), (np.int64(1) << 31) - 1
    if not _plain_shift(s, sr):
        for n in range(N):
            en = np.int64(e[n])
            for j in range(K):
                _acc1(A, n * K + j, en * np.int64(x[j]), s, m_t, sr, meta, stats)
        return
    # the row loop written out: through _row_steps (its saturation count unused) batch-32 W1
    # training ran ~35 % slower (LLVM vectorised it worse)
    s1, nu = s - 1, np.int64(0)
    for n in range(N):
        en = np.int64(e[n])
        if en == 0:
            continue
        me = m_t * en
        for j in range(K):
            xj = np.int64(x[j])
            v = me * xj
            d = (v >> s) + ((v >> s1) & 1)
            nu += (d == 0) & (xj != 0)
            A[n * K + j] = min(max(np.int64(A[n * K + j]) + d, lo32), hi32)
    stats[2] += nu


@njit(cache=True)
def apply_accumulated(w, A, V, bs, ib_m, ib_k, mu_m, mu_k, wd_m, wd_k, sr, lo, hi, meta, stats, vlo, vhi, vshift):
    """vlo, vhi: the velocity's range (its width: int32, or int16 under a precision policy);
    vshift > 0: an int8 slot vshift bits above the int32 velocity's units, stored with one PRNG
    draw per element before the update's (graph/optim.py _apply_v8_ref), the update using the
    wide velocity."""
    i32lo = -(np.int64(1) << 31)
    i32hi = (np.int64(1) << 31) - 1
    for i in range(w.size):
        u = np.int64(A[i])
        if bs > 1:
            u = rshift_round(u * ib_m, ib_k)
        A[i] = 0
        if mu_m != 0 and vshift > 0:
            vv = _sat_store(rshift_round((np.int64(V[i]) << vshift) * mu_m, mu_k) + u, i32lo, i32hi)
            V[i] = _sat_store(_shift1(vv, vshift, True, meta), vlo, vhi)
            u = vv
        elif mu_m != 0:
            vv = _sat_store(rshift_round(np.int64(V[i]) * mu_m, mu_k) + u, vlo, vhi)
            V[i] = vv
            u = vv
        wi = np.int64(w[i])
        if wd_m != 0:
            s = wd_k - GUARD_BITS
            wd = wi * wd_m
            u += rshift_round(wd, s) if s >= 0 else wd << (-s)
        v = wi - _shift1(u, GUARD_BITS, sr, meta)
        nv = _sat_store(v, lo, hi)
        if nv != v:
            stats[1] += 1
        w[i] = nv


@njit(cache=True)
def refresh_copy(master, w, shift, lo, hi):
    """w = sat(rshift_round(master, shift)) in [lo, hi]: the compute copy of a master."""
    for i in range(master.size):
        v = rshift_round(np.int64(master[i]), shift)
        w[i] = lo if v < lo else hi if v > hi else v


@njit(cache=True)
def lr_mult(m, schedule, gamma_q15, step_size, total_steps, cos, t):
    """IntSGD.lr_mult: the schedule's Q15 factor at optimizer step t applied to the multiplier m
    (0 constant, 1 step, 2 cosine table)."""
    if schedule == 0:
        return m
    if schedule == 1:
        f = 32768
        for _ in range(t // step_size):
            f = rshift_round(f * gamma_q15, 15)
    else:
        T = total_steps if total_steps > 1 else 1
        j = (64 * t) // T
        f = cos[64 if j > 64 else j]
    return rshift_round(m * f, 15)
