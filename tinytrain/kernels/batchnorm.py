"""numba kernels for BatchNorm, bit-exact with tinytrain.ops.batchnorm (tests/test_ops_batchnorm).

Arrays are (P, C) views of the (H, W, C) / (L, C) tensors. saved is int32 (3, C) rows
[B, inv, sh] written by batchnorm_fwd and read by batchnorm_bwd / batchnorm_grad; scratch is
int64 (3 * C,). Preconditions (checked by the Python layer, not here): 1 <= P <= 4096, and
P >= 2 when train. Saturations (x_hat in eval, int8 outputs) are added to stats[0]. Like the
C kernels, outputs are recomputed in a second pass instead of buffering int64 accumulators.
int16 activations and errors: the same kernels on int16 arrays (the width read from y, dx and
e: requantization with 16 bits, J rounded by A16_J_SHIFT, dgamma by gshift).
"""
from __future__ import annotations

from numba import njit

from tinytrain.ops.batchnorm import A16_J_SHIFT, EPS_CAP, EVAL_FRAC, INV_BITS, KM_BITS, XHAT_FRAC
from tinytrain.kernels._common import align, bitwidth, requant_shift, rshift_round, sat

I32_MAX = 2**31 - 1
I32_MIN = -(2**31)


@njit(cache=True, inline="always")
def _abs(v):
    return -v if v < 0 else v


@njit(cache=True)
def _isqrt(x):
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


@njit(cache=True)
def _scale_cap(n, t):
    if t < 0:
        return rshift_round(n, -t if -t < 62 else 62)
    if n == 0:
        return 0
    if bitwidth(n) + t > 61:
        return EPS_CAP
    return n << t


@njit(cache=True)
def _div_floor(a, b):
    return a // b  # numba follows Python: floor division


@njit(cache=True)
def _rdiv(n, a, d):
    if a < 0:
        return sat(rshift_round(_div_floor(n, d), -a if -a < 62 else 62), I32_MIN, I32_MAX)
    if n == 0:
        return 0
    if bitwidth(_abs(n)) + a > bitwidth(d) + 32:
        return I32_MAX if n > 0 else I32_MIN
    return sat(_div_floor(2 * (n << a) + d, 2 * d), I32_MIN, I32_MAX)


@njit(cache=True, inline="always")
def _ema(r, b, k):
    return r + rshift_round(b - r, k)


@njit(cache=True)
def _inv_sqrt(v, e_v):
    """Returns (inv, n) as in ops.batchnorm.inv_sqrt; v >= 1."""
    n = 32 - bitwidth(v)
    if (n - e_v) % 2 != 0:
        n -= 1
    vn = v << n if n >= 0 else v >> -n
    s = _isqrt(vn)
    return ((1 << INV_BITS) + (s >> 1)) // s, n


@njit(cache=True, inline="always")
def _shift_unsat(v, sh):
    """round(v * 2^-sh) before the int32 saturation (+-2^32 stands for 'too large')."""
    if sh >= 0:
        return rshift_round(v, sh if sh < 62 else 62)
    if v != 0 and bitwidth(_abs(v)) > 32 + sh:
        return (1 << 32) if v > 0 else -(1 << 32)
    return v << -sh


@njit(cache=True, inline="always")
def _xhat_unsat(xv, A, saved, c):
    return _shift_unsat((A * xv - saved[0, c]) * saved[1, c], saved[2, c])


@njit(cache=True)
def batchnorm_fwd(x, ex, gamma, e_g, beta, e_b, rmean, e_rm, rvar, e_rv,
                  eps_m, eps_k, mom_k, train, saved, scratch, y, stats):
    """x, y (P, C) int8; gamma int16, beta int32, rmean / rvar int32 (C,) updated in place
    when train; saved int32 (3, C) out; scratch int64 (3C,). Returns ey."""
    P, C = x.shape
    ea = e_g - XHAT_FRAC
    if train:
        A = P
        for c in range(C):
            scratch[c] = 0
            scratch[C + c] = 0
        for p in range(P):
            for c in range(C):
                v = x[p, c]
                scratch[c] += v
                scratch[C + c] += v * v
        eps_v = _scale_cap(eps_m * P * P, -eps_k - 2 * ex)
        for c in range(C):
            S = scratch[c]
            m2 = P * scratch[C + c] - S * S
            v = m2 + eps_v
            inv, n = _inv_sqrt(v if v > 1 else 1, 0)
            saved[0, c] = S
            saved[1, c] = inv
            saved[2, c] = INV_BITS - XHAT_FRAC - n // 2
            rmean[c] = _ema(rmean[c], _rdiv(S, ex - e_rm, P), mom_k)
            rvar[c] = _ema(rvar[c], _rdiv(m2, 2 * ex - e_rv, P * (P - 1)), mom_k)
    else:
        A = 1 << EVAL_FRAC
        eps_r = _scale_cap(eps_m, -eps_k - e_rv)
        for c in range(C):
            saved[0, c] = align(rmean[c], e_rm, ex - EVAL_FRAC)
            rv = rvar[c] if rvar[c] > 0 else 0
            v = rv + eps_r
            inv, n = _inv_sqrt(v if v > 1 else 1, e_rv)
            saved[1, c] = inv
            saved[2, c] = INV_BITS - XHAT_FRAC + (e_rv - n) // 2 + EVAL_FRAC - ex
    for c in range(C):
        scratch[c] = align(beta[c], e_b, ea)
    m = 0
    for p in range(P):
        for c in range(C):
            r = _xhat_unsat(x[p, c], A, saved, c)
            xh = sat(r, I32_MIN, I32_MAX)
            if xh != r:
                stats[0] += 1
            a = _abs(gamma[c] * xh + scratch[c])
            if a > m:
                m = a
    bits = y.itemsize * 8
    q = (1 << (bits - 1)) - 1
    s = requant_shift(m, bits)
    for p in range(P):
        for c in range(C):
            xh = sat(_xhat_unsat(x[p, c], A, saved, c), I32_MIN, I32_MAX)
            r = rshift_round(gamma[c] * xh + scratch[c], s)
            if r > q or r < -q:
                stats[0] += 1
            y[p, c] = sat(r, -q, q)
    return ea + s


@njit(cache=True, inline="always")
def _j(ev, xh, A, se, g, train, js):
    if train:
        i = ((A * ev - se) << (2 * XHAT_FRAC)) - xh * g
    else:
        i = (A * ev) << (2 * XHAT_FRAC)
    return rshift_round(i, js)


@njit(cache=True)
def batchnorm_bwd(e, ee, x, ex, saved, gamma, e_g, train, scratch, dx, stats):
    """e, x, dx (P, C) int8 (or int16); scratch int64 (3C,) = [sum e, sum e*x_hat, km]. Returns edx."""
    P, C = x.shape
    bits = dx.itemsize * 8
    q = (1 << (bits - 1)) - 1
    js = XHAT_FRAC if bits == 8 else A16_J_SHIFT
    A = P if train else 1 << EVAL_FRAC
    for c in range(C):
        scratch[c] = 0
        scratch[C + c] = 0
    if train:
        for p in range(P):
            for c in range(C):
                xh = sat(_xhat_unsat(x[p, c], A, saved, c), I32_MIN, I32_MAX)
                scratch[c] += e[p, c]
                scratch[C + c] += e[p, c] * xh
    have = False
    top = 0
    for c in range(C):
        k = gamma[c] * saved[1, c]
        if k != 0:
            t = bitwidth(_abs(k)) - saved[2, c]
            if not have or t > top:
                top = t
            have = True
    e_k = top - KM_BITS if have else 0
    for c in range(C):
        k = gamma[c] * saved[1, c]
        s = saved[2, c] + e_k
        scratch[2 * C + c] = rshift_round(k, s if s < 62 else 62) if s >= 0 else k << -s
    m = 0
    for p in range(P):
        for c in range(C):
            xh = sat(_xhat_unsat(x[p, c], A, saved, c), I32_MIN, I32_MAX) if train else 0
            a = _abs(scratch[2 * C + c] * _j(e[p, c], xh, A, scratch[c], scratch[C + c], train, js))
            if a > m:
                m = a
    s = requant_shift(m, bits)
    for p in range(P):
        for c in range(C):
            xh = sat(_xhat_unsat(x[p, c], A, saved, c), I32_MIN, I32_MAX) if train else 0
            j = _j(e[p, c], xh, A, scratch[c], scratch[C + c], train, js)
            r = rshift_round(scratch[2 * C + c] * j, s)
            if r > q or r < -q:
                stats[0] += 1
            dx[p, c] = sat(r, -q, q)
    return e_k + e_g + ee - ex - 3 * XHAT_FRAC + js + s


@njit(cache=True)
def batchnorm_grad(e, x, saved, train, ggamma, gbeta, gshift=0):
    """ggamma = sat_s32(rshift_round(sum e*x_hat, gshift)) (exponent ee - XHAT_FRAC + gshift;
    gshift 0 for int8 errors), gbeta = sum e (exponent ee)."""
    P, C = x.shape
    A = P if train else 1 << EVAL_FRAC
    for c in range(C):
        se = 0
        g = 0
        for p in range(P):
            xh = sat(_xhat_unsat(x[p, c], A, saved, c), I32_MIN, I32_MAX)
            se += e[p, c]
            g += e[p, c] * xh
        ggamma[c] = sat(rshift_round(g, gshift), I32_MIN, I32_MAX)
        gbeta[c] = se
