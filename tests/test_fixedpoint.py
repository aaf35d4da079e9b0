"""Primitives against exact references (Python ints, fractions), Python and C twins equal."""
from __future__ import annotations

import math
import zlib
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tinytrain import fixedpoint as fp

EDGE = sorted({v for p in range(0, 32) for d in (-2, -1, 0, 1, 2) for v in (2**p + d, -(2**p) - d)}
              | {0, fp.INT32_MAX, fp.INT32_MIN})
EDGE = [v for v in EDGE if fp.INT32_MIN <= v <= fp.INT32_MAX]


def exact_round_half_up(x: int, s: int) -> int:
    return math.floor(Fraction(x, 2**s) + Fraction(1, 2))


@pytest.mark.parametrize("s", [0, 1, 2, 7, 8, 15, 16, 30, 31])
def test_rshift_round_edges(s, clib):
    ffi, lib = clib
    for x in EDGE:
        want = exact_round_half_up(x, s)
        assert fp.rshift_round(x, s) == want
        assert lib.tt_t_rshift_round_s64(x, s) == want
        assert lib.tt_t_rshift_round_s32(x, s) == want
    arr = np.array(EDGE, dtype=np.int64)
    assert list(fp.rshift_round(arr, s)) == [exact_round_half_up(x, s) for x in EDGE]


def test_rshift_round_ties_go_up():
    assert fp.rshift_round(3, 1) == 2 and fp.rshift_round(-3, 1) == -1
    assert fp.rshift_round(-1, 1) == 0 and fp.rshift_round(1, 1) == 1


@given(st.integers(-(2**62), 2**62), st.integers(0, 62))
def test_rshift_round_random(x, s):
    assert fp.rshift_round(x, s) == exact_round_half_up(x, s)


@given(st.integers(-(2**40), 2**40), st.integers(0, 31), st.integers(0, 2**32 - 1))
def test_rshift_stoch_bounds_and_c(x, s, r):
    v = fp.rshift_stoch(x, s, r)
    lo = math.floor(Fraction(x, 2**s))
    assert v in (lo, lo + 1)
    assert v == math.floor(Fraction(x + (r % 2**s), 2**s))


def test_rshift_stoch_c_and_unbiased(clib):
    ffi, lib = clib
    rng = np.random.default_rng(0)
    for _ in range(2000):
        x = int(rng.integers(-(2**40), 2**40))
        s = int(rng.integers(0, 32))
        r = int(rng.integers(0, 2**32))
        assert lib.tt_t_rshift_stoch_s64(x, s, r) == fp.rshift_stoch(x, s, r)
    # mean over all r residues is exact: E = x / 2^s
    x, s = 37, 4
    vals = [fp.rshift_stoch(x, s, r) for r in range(16)]
    assert Fraction(sum(vals), 16) == Fraction(x, 16)


def test_saturation(clib):
    ffi, lib = clib
    for x in EDGE + [2**40, -(2**40), 2**63 - 1, -(2**63)]:
        assert fp.sat_s8(x) == max(-127, min(127, x)) == lib.tt_t_sat_s8(x)
        assert fp.sat_s16(x) == max(-32767, min(32767, x)) == lib.tt_t_sat_s16(x)
        assert fp.sat_s32(x) == max(-(2**31), min(2**31 - 1, x)) == lib.tt_t_sat_s32(x)


def test_bitwidth_powers_of_two(clib):
    ffi, lib = clib
    assert fp.bitwidth(0) == 0 == lib.tt_t_bitwidth_u64(0)
    for p in range(0, 63):
        for d in (-1, 0, 1):
            v = 2**p + d
            if v <= 0:
                continue
            want = len(bin(v)) - 2
            assert fp.bitwidth(v) == want == lib.tt_t_bitwidth_u64(v)
            assert fp.bitwidth(-v) == want
    assert fp.bitwidth(fp.INT32_MIN) == 32
    assert fp.clz32(0) == 32 and fp.clz32(1) == 31 and fp.clz32(2**31) == 0


@pytest.mark.parametrize("bits", [8, 16])
def test_requant_shift_fits(bits, clib):
    ffi, lib = clib
    for m in [0, 1, 2**(bits - 1) - 1, 2**(bits - 1), 2**(bits - 1) + 1] + [2**p + d for p in range(40) for d in (-1, 0, 1)]:
        s = fp.requant_shift(m, bits)
        assert s == lib.tt_t_requant_shift(m, bits)
        assert fp.rshift_round(m, s) <= 2 ** (bits - 1)  # only the round-up can reach it
        assert s == 0 or (m >> (s - 1)) >= 2 ** (bits - 1) - 1 or m >= 2 ** (bits - 1)


def test_requant_s8_from_s64_edges(clib):
    """C requantization == exact rounding (ties up) and clamp to +-127, saturations counted, on
    arrays whose maximum |v| sits at every power of two +-{0,1,2} (both sides of 2^31), with
    every value a tie, a tie +-1 or an extreme of the shift chosen; and at 255 * 2^q +-{0,1,2},
    the edge of the no-clamp fast case (below it no value rounds to +-128)."""
    from .oputil import c_i8, c_i64
    ffi, lib = clib
    rng = np.random.default_rng(7)
    for m0 in [2**p for p in range(0, 40)] + [255 * 2**q for q in range(0, 26)]:
        for d in (-2, -1, 0, 1, 2):
            m = m0 + d
            if m < 0:
                continue
            s = fp.requant_shift(m, 8)
            ties = [k * 2**s + (2 ** (s - 1) if s else 0) + e for k in range(-130, 130) for e in (-1, 0, 1)]
            vals = [m, -m, *(v for v in ties if abs(v) <= m), *rng.integers(-m, m + 1, 64).tolist()]
            for sign in (1, -1):
                acc = np.array([sign * v for v in vals], np.int64)
                y = np.zeros(len(acc), np.int8)
                stc = ffi.new("tt_stats *")
                got = lib.tt_requant_s8_from_s64(c_i64(ffi, acc), len(acc), c_i8(ffi, y), stc)
                r = [exact_round_half_up(int(v), s) for v in acc]
                assert got == s
                assert y.tolist() == [max(-127, min(127, v)) for v in r]
                assert stc.saturated == sum(abs(v) > 127 for v in r)


def test_requant_s8_from_s32_edges(clib):
    """The int32 requantization (the sparse Dense kernels' sums) == exact rounding (ties up) and
    clamp to +-127, saturations counted, with the maximum |v| at every power of two +-{0,1,2} up
    to 2^31 (INT32_MIN: the one value past the int32 fast case), at 255 * 2^q +-{0,1,2} (the edge
    of the no-clamp case), every value a tie, a tie +-1 or drawn."""
    from .oputil import c_i8, c_i32
    ffi, lib = clib
    rng = np.random.default_rng(8)
    for m0 in [2**p for p in range(0, 32)] + [255 * 2**q for q in range(0, 24)]:
        for d in (-2, -1, 0, 1, 2):
            m = m0 + d
            if m < 0 or m > 2**31:
                continue
            s = fp.requant_shift(m, 8)
            ties = [k * 2**s + (2 ** (s - 1) if s else 0) + e for k in range(-130, 130) for e in (-1, 0, 1)]
            vals = [m, *(v for v in ties if abs(v) <= m), *rng.integers(-m, m + 1, 64).tolist()]
            for sign in (1, -1):
                acc = np.array([v for v in (sign * v for v in vals) if -(2**31) <= v < 2**31], np.int32)
                y = np.zeros(len(acc), np.int8)
                stc = ffi.new("tt_stats *")
                got = lib.tt_requant_s8_from_s32(c_i32(ffi, acc), len(acc), c_i8(ffi, y), stc)
                r = [exact_round_half_up(int(v), fp.requant_shift(int(np.abs(acc.astype(np.int64)).max()), 8))
                     for v in acc]
                assert got == fp.requant_shift(int(np.abs(acc.astype(np.int64)).max()), 8)
                assert y.tolist() == [max(-127, min(127, v)) for v in r]
                assert stc.saturated == sum(abs(v) > 127 for v in r)


def test_div_trunc(clib):
    ffi, lib = clib
    rng = np.random.default_rng(1)
    cases = [(7, 2), (-7, 2), (7, -2), (-7, -2), (0, 5), (fp.INT32_MIN + 1, -1), (fp.INT32_MAX, 1)]
    cases += [(int(a), int(b) or 1) for a, b in rng.integers(-(2**31) + 1, 2**31, size=(500, 2))]
    for a, b in cases:
        want = int(Fraction(a, b))  # int() truncates toward zero
        assert fp.div_trunc(a, b) == want == lib.tt_t_div_trunc_s32(a, b)
    a = np.array([a for a, _ in cases], dtype=np.int64)
    b = np.array([b for _, b in cases], dtype=np.int64)
    assert list(fp.div_trunc(a, b)) == [int(Fraction(int(x), int(y))) for x, y in zip(a, b)]


def test_isqrt(clib):
    ffi, lib = clib
    vals = [0, 1, 2, 3, 4, 2**32 - 1] + [p * p + d for p in (1, 2, 255, 256, 46340, 65535) for d in (-1, 0, 1)]
    vals += [int(v) for v in np.random.default_rng(2).integers(0, 2**32, 2000)]
    for v in vals:
        if 0 <= v < 2**32:
            assert fp.isqrt(v) == math.isqrt(v) == lib.tt_isqrt_u32(v)
    with pytest.raises(ValueError):
        fp.isqrt(-1)


def test_exp2_and_log2_tables(clib):
    ffi, lib = clib
    for t in list(range(-16 * 256 - 10, 1)):
        v = fp.exp2_neg_q15(t)
        assert v == lib.tt_exp2_neg_q15(t)
        assert abs(v - 2.0 ** (t / 256) * 32768) <= 1.0
    for x in [1, 2, 3, 255, 256, 257, 1000, 2**31, 2**32 - 1]:
        v = fp.log2_q16(x)
        assert v == lib.tt_log2_q16(x)
        assert abs(v / 65536 - math.log2(x)) < 2 / 256  # 8-bit table, truncated index


def test_prng_sequence_matches_c(clib):
    ffi, lib = clib
    for seed in [0, 1, 2**32 - 1, 12345]:
        s = fp.prng_seed(seed)
        assert s != 0 and s == lib.tt_prng_seed(seed)
        for _ in range(1000):
            n = fp.prng_next(s)
            assert n == lib.tt_t_prng_next(s)
            s = n
    # known first values for seed 1 pin the algorithm across releases
    s = fp.prng_seed(1)
    assert s == fp.prng_seed(1)
    assert fp.prng_next(1) == 270369  # xorshift32(13,17,5) from state 1


def test_permutation_is_permutation():
    st_, p = fp.permutation(fp.prng_seed(3), 100)
    assert sorted(p.tolist()) == list(range(100))
    st2, p2 = fp.permutation(fp.prng_seed(3), 100)
    assert st_ == st2 and (p == p2).all()


def test_state_hash_is_crc32_of_le_bytes():
    a = np.arange(10, dtype=np.int16)
    b = np.array([1, 2], dtype=np.uint32)
    assert fp.state_hash([a, b]) == zlib.crc32(a.tobytes() + b.tobytes())
    assert fp.state_hash([a.astype(">i2"), b]) == fp.state_hash([a, b])


@pytest.mark.parametrize("v", [1e-9, 0.01, 0.1, 0.5, 1.0, 3.0, 1234.5])
def test_to_mult_shift(v):
    m, k = fp.to_mult_shift(v)
    assert 2**14 <= m < 2**15
    assert abs(m / 2**k - v) / v < 2**-14
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError):
            fp.to_mult_shift(bad)


def exact_align(v: int, e_from: int, e_to: int) -> int:
    """v * 2^(e_from - e_to) rounded half up (shift capped at 62 down / 31 up), clamped to 2^30."""
    d = e_to - e_from
    r = exact_round_half_up(v, min(d, 62)) if d >= 0 else v * 2 ** min(-d, 31)
    return max(-(2**30), min(2**30, r))


@pytest.mark.parametrize("d", [-40, -31, -30, -17, -1, 0, 1, 2, 15, 31, 32, 62, 63, 80])
def test_align_edges_exact_numba_and_c(d, clib):
    """The one alignment primitive, three places: fixedpoint.align (reference), the numba
    kernels' align and C's tt_align, on every edge value at shifts around the caps."""
    from tinytrain.kernels._common import align as nb_align

    ffi, lib = clib
    got = fp.align(np.array(EDGE, dtype=np.int64), 3, 3 + d)
    for v, g in zip(EDGE, got):
        want = exact_align(v, 3, 3 + d)
        assert int(g) == want == nb_align(v, 3, 3 + d) == lib.tt_t_align(v, 3, 3 + d), (v, d)
