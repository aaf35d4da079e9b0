"""The numba optimizer kernels (tinytrain/kernels/optim.py) == the reference rules
(tinytrain/graph/optim.py), element by element, on drawn tensors.

update_direct and accumulate have a plain path (round to nearest, a right shift of 1..62 bits,
no weight decay for update_direct) that skips runs of CHUNK zero gradients and runs the rest
branch-free; the draws put zero runs on and off the CHUNK grid, sizes that are not multiples of
it, weights at and beyond the saturation range (an old -32768 must still be clamped and counted
inside a zero run), every shift class (left, 0, plain, > 62) and stochastic rounding, so both
paths and the switch between them are compared with the reference."""
from __future__ import annotations

import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.graph.optim import SGD, _shift, accumulate_ref, sat_range, update_direct_ref
from tinytrain.kernels import optim as nb
from tinytrain.kernels.optim import CHUNK

DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32}


@st.composite
def _case(draw):
    n = draw(st.integers(1, 3 * CHUNK + 7))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    gmax = draw(st.sampled_from([1, 127, 16256, 2**22]))
    g = rng.integers(-gmax, gmax + 1, n).astype(np.int32)
    # zero runs: whole CHUNKs, and stretches across and off the CHUNK grid
    for _ in range(draw(st.integers(0, 4))):
        a = draw(st.integers(0, n - 1))
        g[a:a + draw(st.sampled_from([1, CHUNK // 2, CHUNK, 2 * CHUNK]))] = 0
    if draw(st.booleans()):
        g[:] = 0
    return n, rng, g


def _weights(rng, n, dtype, extreme: bool):
    info = np.iinfo(dtype)
    w = rng.integers(info.min // 2, info.max // 2, n, dtype=np.int64)
    if extreme:  # the limits and the one value below the symmetric range
        idx = rng.integers(0, n, max(1, n // 8))
        w[idx] = rng.choice([info.min, -info.max, info.max], idx.size)
    return w.astype(dtype)


def _opt(lr_k, sr, wd):
    opt = SGD(lr=0.05, stochastic_rounding=sr, weight_decay=wd).compile()
    opt.k = lr_k
    return opt


@settings(max_examples=300, deadline=None)
@given(case=_case(), dtype=st.sampled_from(sorted(DTYPES)), extreme=st.booleans(),
       s=st.integers(-4, 70), m_t=st.integers(-40000, 40000), sr=st.booleans(),
       wd=st.sampled_from([0.0, 0.0, 1e-3]), seed=st.integers(1, 2**32 - 1))
def test_update_direct_equals_reference(case, dtype, extreme, s, m_t, sr, wd, seed):
    n, rng, g = case
    w = _weights(rng, n, DTYPES[dtype], extreme)
    opt = _opt(10, sr, wd)
    ew, eg = s - opt.k - 3, -3  # s = ew + k - eg
    lo, hi = sat_range(w.dtype)
    wr, wn = w.copy(), w.copy()
    prng, stats_r = [seed], np.zeros(4, np.int64)
    nsat = update_direct_ref(wr, ew, g, eg, opt, m_t, prng, stats_r)
    meta, stats = np.array([seed, 0, 0, 0], np.int64), np.zeros(4, np.int64)
    nb.update_direct(wn, ew, g, eg, opt.k, m_t, sr, opt.wd_m, opt.wd_k, lo, hi, meta, stats)
    assert np.array_equal(wn, wr)
    assert stats[1] == nsat and stats[2] == stats_r[2]
    assert meta[0] == prng[0]


@settings(max_examples=300, deadline=None)
@given(case=_case(), s=st.integers(-4, 70), m_t=st.integers(-40000, 40000), sr=st.booleans(),
       seed=st.integers(1, 2**32 - 1), near_limit=st.booleans())
def test_accumulate_equals_reference(case, s, m_t, sr, seed, near_limit):
    n, rng, g = case
    A = rng.integers(-(2**31), 2**31, n, dtype=np.int64).astype(np.int32) if near_limit else \
        rng.integers(-1000, 1000, n).astype(np.int32)
    opt = _opt(10, sr, 0.0)
    ew, eg = s + nb.GUARD_BITS - opt.k - 3, -3  # s = ew + k - eg - GUARD_BITS
    Ar, An = A.copy(), A.copy()
    prng, stats_r = [seed], np.zeros(4, np.int64)
    accumulate_ref(Ar, ew, g, eg, opt, m_t, prng, stats_r)
    meta, stats = np.array([seed, 0, 0, 0], np.int64), np.zeros(4, np.int64)
    nb.accumulate(An, ew, g, eg, opt.k, m_t, sr, meta, stats)
    assert np.array_equal(An, Ar)
    assert stats[2] == stats_r[2] and meta[0] == prng[0]


@settings(max_examples=300, deadline=None)
@given(N=st.integers(1, 40), K=st.integers(1, 80), seed=st.integers(0, 2**32 - 1), dtype=st.sampled_from(["int8", "int16"]),
       extreme=st.booleans(), zero_rows=st.floats(0, 1), s=st.integers(-4, 70), m_t=st.integers(-40000, 40000),
       sr=st.booleans(), wd=st.sampled_from([0.0, 0.0, 1e-3]), prng=st.integers(1, 2**32 - 1))
def test_dense_update_direct_equals_the_gradient_then_update(N, K, seed, dtype, extreme, zero_rows, s, m_t, sr, wd, prng):
    """The fused Dense weight update (gradient e[n] x[k] formed on the fly, zero-error rows
    skipped) == update_direct_ref on the gradient buffer dense_grad would have written."""
    rng = np.random.default_rng(seed)
    e = rng.integers(-127, 128, N).astype(np.int8)
    e[rng.random(N) < zero_rows] = 0
    x = rng.integers(-128, 128, K).astype(np.int8)
    x[rng.random(K) < 0.4] = 0
    w = _weights(rng, N * K, DTYPES[dtype], extreme).reshape(N, K)
    opt = _opt(10, sr, wd)
    ew, eg = s - opt.k - 3, -3
    lo, hi = sat_range(w.dtype)
    wr, wn = w.copy(), w.copy()
    g = (e.astype(np.int32)[:, None] * x.astype(np.int32)[None, :])
    p, stats_r = [prng], np.zeros(4, np.int64)
    nsat = update_direct_ref(wr, ew, g, eg, opt, m_t, p, stats_r)
    meta, stats = np.array([prng, 0, 0, 0], np.int64), np.zeros(4, np.int64)
    nb.dense_update_direct(wn, e, x, ew, eg, opt.k, m_t, sr, opt.wd_m, opt.wd_k, lo, hi, meta, stats)
    assert np.array_equal(wn, wr)
    assert stats[1] == nsat and stats[2] == stats_r[2] and meta[0] == p[0]


@settings(max_examples=300, deadline=None)
@given(N=st.integers(1, 40), K=st.integers(1, 80), seed=st.integers(0, 2**32 - 1), zero_rows=st.floats(0, 1),
       near_limit=st.booleans(), s=st.integers(-4, 70), m_t=st.integers(-40000, 40000), sr=st.booleans(),
       prng=st.integers(1, 2**32 - 1))
def test_dense_accumulate_equals_the_gradient_then_accumulate(N, K, seed, zero_rows, near_limit, s, m_t, sr, prng):
    rng = np.random.default_rng(seed)
    e = rng.integers(-127, 128, N).astype(np.int8)
    e[rng.random(N) < zero_rows] = 0
    x = rng.integers(-128, 128, K).astype(np.int8)
    x[rng.random(K) < 0.4] = 0
    A = (rng.integers(-(2**31), 2**31, N * K, dtype=np.int64) if near_limit else
         rng.integers(-1000, 1000, N * K)).astype(np.int32)
    opt = _opt(10, sr, 0.0)
    ew, eg = s + nb.GUARD_BITS - opt.k - 3, -3
    Ar, An = A.copy(), A.copy()
    g = (e.astype(np.int32)[:, None] * x.astype(np.int32)[None, :]).reshape(-1)
    p, stats_r = [prng], np.zeros(4, np.int64)
    accumulate_ref(Ar, ew, g, eg, opt, m_t, p, stats_r)
    meta, stats = np.array([prng, 0, 0, 0], np.int64), np.zeros(4, np.int64)
    nb.dense_accumulate(An, e, x, ew, eg, opt.k, m_t, sr, meta, stats)
    assert np.array_equal(An, Ar)
    assert stats[2] == stats_r[2] and meta[0] == p[0]


def _binomial_tail(n: int, p: float, k: int) -> float:
    """The smaller tail probability of k successes in Binomial(n, p): P(X <= k) or P(X >= k)
    (exact sum; a normal approximation is wrong for the tiny p of these steps)."""
    if p in (0.0, 1.0):
        return 1.0 if k == n * p else 0.0
    lg = math.lgamma
    pmf = [math.exp(lg(n + 1) - lg(i + 1) - lg(n - i + 1) + i * math.log(p) + (n - i) * math.log1p(-p))
           for i in range(n + 1)]
    return min(sum(pmf[:k + 1]), sum(pmf[k:]))


@settings(max_examples=40, deadline=None)
@given(s=st.integers(32, 62), frac=st.integers(-2**20, 2**20).filter(lambda f: f != 0), seed=st.integers(1, 2**32 - 1))
def test_stochastic_shift_past_31_bits_is_unbiased(s, frac, seed):
    """A stochastic step by s > 31 (the draw has 31 usable bits) keeps the step's expected value:
    v = frac 2^(s - 21), a step of frac / 2^21 (|step| <= 1/2, the small updates of int8 weights),
    averages to it over 4,096 draws within 5 standard deviations of a Bernoulli step, in the
    reference and numba alike (same draws). The old order (draw at 31 bits, then floor by
    2^(s - 31)) gave -1 for every negative step and 0 for every positive one."""
    n = 4096
    v = np.full(n, frac * 2**(s - 21), np.int64)
    prng = [seed]
    d = _shift(v, s, True, prng)
    # every draw is the step's floor or the floor + 1; the count of +1s is Binomial(n, p)
    lo = frac * 2**(s - 21) >> s
    assert set(np.unique(d)) <= {lo, lo + 1}
    k, p = int((d == lo + 1).sum()), (frac * 2**(s - 21) - (lo << s)) / 2**s
    assert _binomial_tail(n, p, k) > 1e-9, (k, n * p)
    meta = np.array([seed, 0, 0, 0], np.int64)
    got = np.array([nb._shift1(np.int64(x), s, True, meta) for x in v[:64]])
    assert np.array_equal(got, d[:64])
