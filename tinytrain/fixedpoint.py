"""Integer primitives of tinytrain: each named once here and mirrored 1:1 in C
(``tinytrain/firmware/include/tt_fixedpoint.h``). These definitions *are* the specification.

Conventions
-----------
* A quantized tensor is an integer array ``q`` and a power-of-two exponent ``e``:
  real value = ``q * 2**e``. Exponents are plain ints carried beside the arrays.
* Every function works on Python ints and on numpy integer arrays (vectorized) with
  identical results. Widths are explicit: callers pass int32/int64 arrays; nothing
  relies on numpy's promotion to wrap.
* Right shifts of negative numbers are arithmetic (floor). In C this is guarded by a
  compile-time check (``TT_REQUIRE_ARITH_SHIFT``) since C99 leaves it implementation-defined.

Rounding rules (stated once, used everywhere)
---------------------------------------------
* ``rshift_round(x, s)``: round to nearest, **ties toward +inf** (floor(x/2^s + 1/2)),
  computed as ``(x >> s) + ((x >> (s-1)) & 1)`` so it never overflows the input width.
* ``rshift_stoch(x, s, r)``: floor((x + (r mod 2^s)) / 2^s) with r a uniform random uint32:
  unbiased stochastic rounding, also overflow-free.
* ``div_trunc(a, b)``: integer division truncating toward zero (C99 semantics; numpy's
  ``//`` floors, so it is not used for signed division except through ``div_floor``).
* ``div_floor(a, b)``: integer division rounding toward -inf, divisor b > 0 only.
* ``isqrt(x)``: floor(sqrt(x)) for 0 <= x < 2^32.
* Saturating casts clamp to [-2^(n-1)+1, 2^(n-1)-1] for activations (symmetric: int8 in
  [-127, 127], so negation never overflows) and to the full range for ``sat_s32``.
"""
from __future__ import annotations

import math
import zlib

import numpy as np

INT8_MAX = 127
INT16_MAX = 32767
INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)

# ---------------------------------------------------------------------------- shifts


def rshift_round(x, s: int):
    """Round-to-nearest right shift, ties toward +inf. ``s`` in [0, 62]; s == 0 returns x.

    Overflow-free: (x >> s) + bit (s-1) of x equals floor((x + 2^(s-1)) / 2^s).
    """
    if s < 0:
        raise ValueError(f"rshift_round: negative shift {s}")
    if s == 0:
        return x
    return (x >> s) + ((x >> (s - 1)) & 1)


def rshift_stoch(x, s: int, r):
    """Stochastic rounding right shift: floor((x + (r mod 2^s)) / 2^s), r a uint32 draw.

    Unbiased: E[result] = x / 2^s. ``s`` in [0, 31]. Overflow-free form:
    (x >> s) + (((x & m) + (r & m)) >> s) with m = 2^s - 1.
    """
    if s == 0:
        return x
    m = (1 << s) - 1
    if isinstance(x, np.ndarray):
        r = np.asarray(r).astype(np.int64)
        return (x >> s) + (((x & m) + (r & m)) >> s).astype(x.dtype)
    return (x >> s) + (((x & m) + (int(r) & m)) >> s)


def shift_round(x, s: int):
    """Scale by 2^-s: right shift with ``rshift_round`` if s > 0, left shift if s < 0.

    A left shift may overflow the caller's width; callers saturate afterwards.
    """
    if s >= 0:
        return rshift_round(x, s)
    return x << (-s)


# ---------------------------------------------------------------------- saturation


ALIGN_LIM = 2**30


def align(v, e_from: int, e_to: int):
    """Re-express v (int32, exponent e_from) at exponent e_to as int64 (C: ``tt_align``,
    numba: ``kernels._common.align``): rshift_round (ties toward +inf) by min(e_to - e_from, 62)
    when dropping bits, left shift by min(e_from - e_to, 31) when adding bits, then clamp to
    [-2^30, 2^30] so that one aligned term plus a bounded sum stays inside int32. Used for
    biases, batch-norm offsets and residual adds."""
    v = np.asarray(v, dtype=np.int64)
    if e_to >= e_from:
        r = rshift_round(v, min(e_to - e_from, 62))
    else:
        r = np.clip(v, -(2**31), 2**31) << min(e_from - e_to, 31)
    return np.clip(r, -ALIGN_LIM, ALIGN_LIM)


def _sat(x, lo: int, hi: int):
    if isinstance(x, np.ndarray):
        return np.clip(x, lo, hi)
    return lo if x < lo else hi if x > hi else x


def sat_s8(x):
    """Clamp to the symmetric int8 range [-127, 127]."""
    return _sat(x, -INT8_MAX, INT8_MAX)


def sat_s16(x):
    """Clamp to the symmetric int16 range [-32767, 32767]."""
    return _sat(x, -INT16_MAX, INT16_MAX)


def sat_s32(x):
    """Clamp to the full int32 range [-2^31, 2^31 - 1]."""
    return _sat(x, INT32_MIN, INT32_MAX)


# ---------------------------------------------------------------------- bit widths


def bitwidth(x: int) -> int:
    """Number of bits of |x| (0 for 0): 1 -> 1, 2 -> 2, 3 -> 2, 4 -> 3, 2^31 -> 32.

    C twin: 32 - clz(|x|) computed on uint32 so that |INT32_MIN| = 2^31 is exact.
    """
    return abs(int(x)).bit_length()


def clz32(x: int) -> int:
    """Count leading zeros of a uint32 (clz32(0) = 32)."""
    x = int(x) & 0xFFFFFFFF
    return 32 - x.bit_length()


def maxabs(a: np.ndarray) -> int:
    """max |a| as a Python int (0 for an empty array); exact for INT32_MIN."""
    if a.size == 0:
        return 0
    return max(abs(int(a.max())), abs(int(a.min())))


def requant_shift(max_abs: int, bits: int = 8) -> int:
    """Right shift that brings values with this max |.| into a signed ``bits``-bit range.

    s = max(0, bitwidth(max_abs) - (bits - 1)). After ``rshift_round`` the result may reach
    2^(bits-1) (round-up), so callers saturate; that single value is the only saturation.
    """
    return max(0, bitwidth(max_abs) - (bits - 1))


# ------------------------------------------------------------------------ division


def div_trunc(a, b):
    """Integer division truncating toward zero (C99). b != 0."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a = np.asarray(a, dtype=np.int64)
        b = np.asarray(b, dtype=np.int64)
        q = np.abs(a) // np.abs(b)
        return np.where((a < 0) ^ (b < 0), -q, q)
    if b == 0:
        raise ZeroDivisionError("div_trunc by zero")
    q = abs(a) // abs(b)
    return -q if (a < 0) ^ (b < 0) else q


def div_floor(a, b):
    """Integer division rounding toward -inf (Python's ``//``) for a divisor b > 0.

    C twin: the truncating quotient, minus one when the remainder is negative.
    """
    if isinstance(b, np.ndarray) or isinstance(a, np.ndarray):
        return np.asarray(a, dtype=np.int64) // np.asarray(b, dtype=np.int64)
    if b <= 0:
        raise ValueError(f"div_floor: divisor {b} must be positive")
    return int(a) // int(b)


def isqrt(x: int) -> int:
    """floor(sqrt(x)) for 0 <= x < 2^32, by the bit-by-bit (digit) method used in C."""
    x = int(x)
    if x < 0 or x >= 1 << 32:
        raise ValueError(f"isqrt: {x} outside [0, 2^32)")
    res = 0
    bit = 1 << 30
    while bit > x:
        bit >>= 2
    while bit:
        if x >= res + bit:
            x -= res + bit
            res = (res >> 1) + bit
        else:
            res >>= 1
        bit >>= 2
    return res


# ------------------------------------------------------------------- exp2 and log2

EXP2_FRAC_BITS = 8
#: EXP2_NEG_Q15[f] = round(2^(-f/256) * 2^15), f = 0..255. Built once (float at build time).
EXP2_NEG_Q15 = np.array(
    [int(math.floor(2.0 ** (-f / 256.0) * 32768.0 + 0.5)) for f in range(256)], dtype=np.int32
)
#: LOG2_Q16[f] = round(log2(1 + f/256) * 2^16), f = 0..256.
LOG2_Q16 = np.array(
    [int(math.floor(math.log2(1.0 + f / 256.0) * 65536.0 + 0.5)) for f in range(257)],
    dtype=np.int32,
)
#: round(log2(e) * 2^15): converts natural-log units to log2 units in softmax.
LOG2E_Q15 = 47274


def exp2_neg_q15(t_q8: int) -> int:
    """2^(t / 256) in Q15 for t <= 0 (t in Q8): EXP2_NEG_Q15[frac] >> int, rounded.

    -t = n*256 + f  ->  2^(-n - f/256) = EXP2_NEG_Q15[f] / 2^n. Results below 2^-15 are 0.
    """
    if t_q8 > 0:
        raise ValueError("exp2_neg_q15 takes t <= 0")
    u = -int(t_q8)
    n, f = u >> EXP2_FRAC_BITS, u & 0xFF
    if n > 15:
        return 0
    return rshift_round(int(EXP2_NEG_Q15[f]), n)


def log2_q16(x: int) -> int:
    """log2(x) in Q16 for x >= 1 (uint32): integer part from the bit width, fraction from
    LOG2_Q16 indexed by the 8 bits below the leading one (truncated), no interpolation."""
    x = int(x)
    if x <= 0:
        raise ValueError("log2_q16 takes x >= 1")
    n = x.bit_length() - 1
    if n >= 8:
        f = (x >> (n - 8)) & 0xFF
    else:
        f = (x << (8 - n)) & 0xFF
    return (n << 16) + int(LOG2_Q16[f])


# ------------------------------------------------------------------------- the PRNG


def prng_seed(seed: int) -> int:
    """Map any integer seed to a non-zero xorshift32 state (splitmix-like integer mix)."""
    z = (int(seed) + 0x9E3779B9) & 0xFFFFFFFF
    z = ((z ^ (z >> 16)) * 0x85EBCA6B) & 0xFFFFFFFF
    z = ((z ^ (z >> 13)) * 0xC2B2AE35) & 0xFFFFFFFF
    z ^= z >> 16
    return z if z != 0 else 0x6D2B79F5


def prng_next(state: int) -> int:
    """xorshift32 (Marsaglia 13, 17, 5): returns the new state, which is also the draw."""
    x = state & 0xFFFFFFFF
    x ^= (x << 13) & 0xFFFFFFFF
    x ^= x >> 17
    x ^= (x << 5) & 0xFFFFFFFF
    return x


def prng_jump_table(k: int) -> np.ndarray:
    """The (8, 16) uint32 table of k xorshift32 steps at once (build time): xorshift32 is linear
    over GF(2), so k steps from x are the XOR of k steps from each of x's bits; entry [j][v] is that
    XOR for the bits v << 4 j. ``prng_jump(table, x) == prng_next`` applied k times (k >= 0)."""
    col = []
    for b in range(32):
        x = 1 << b
        for _ in range(k):
            x = prng_next(x)
        col.append(x)
    tab = np.zeros((8, 16), np.uint32)
    for j in range(8):
        for v in range(16):
            acc = 0
            for i in range(4):
                if v >> i & 1:
                    acc ^= col[4 * j + i]
            tab[j, v] = acc
    return tab


def prng_jump(table: np.ndarray, state: int) -> int:
    """``state`` advanced by the steps of ``prng_jump_table``'s table: eight lookups (C:
    tt_prng_jump)."""
    out = 0
    for j in range(8):
        out ^= int(table[j, (state >> (4 * j)) & 15])
    return out


def prng_below(state: int, n: int) -> tuple[int, int]:
    """Draw an integer in [0, n) as (draw * n) >> 32 (multiply-shift, no division)."""
    state = prng_next(state)
    return state, (state * n) >> 32


def permutation(state: int, n: int) -> tuple[int, np.ndarray]:
    """Fisher-Yates shuffle of range(n) from the end, each swap index from ``prng_below``."""
    idx = np.arange(n, dtype=np.int32)
    for i in range(n - 1, 0, -1):
        state, j = prng_below(state, i + 1)
        idx[i], idx[j] = idx[j], idx[i]
    return state, idx


# ---------------------------------------------------------------------- state hash


def crc32(data: bytes, crc: int = 0) -> int:
    """CRC-32 (IEEE 802.3, reflected 0xEDB88320), identical to zlib.crc32 and tt_crc32."""
    return zlib.crc32(data, crc) & 0xFFFFFFFF


def state_hash(arrays) -> int:
    """Hash of the training state: CRC-32 over each array's little-endian bytes in order.

    ``arrays`` is the ordered list of state tensors of a model (parameters, master weights,
    optimizer buffers, running statistics) followed by a uint32 array of scalars (PRNG state,
    step counter, ...). The order is the model schema's and is the same in C.
    """
    crc = 0
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype.byteorder == ">":
            a = a.byteswap().view(a.dtype.newbyteorder("<"))
        crc = zlib.crc32(a.tobytes(), crc)
    return crc & 0xFFFFFFFF


# ---------------------------------------------------------- build-time conversions


def to_mult_shift(value: float, bits: int = 15) -> tuple[int, int]:
    """Represent a positive float as m * 2^-k with m in [2^(bits-1), 2^bits). Build time only.

    Raises ValueError if value is not positive and finite.
    """
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"{value!r} cannot be written as multiplier and shift (must be > 0)")
    mant, exp = math.frexp(value)  # value = mant * 2^exp, mant in [0.5, 1)
    m = int(math.floor(mant * (1 << bits) + 0.5))
    k = bits - exp
    if m == 1 << bits:
        m >>= 1
        k -= 1
    return m, k
