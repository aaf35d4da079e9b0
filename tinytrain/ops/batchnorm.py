"""Batch normalization in integers (train and eval, full backward), reference implementation.

Shapes: x (H, W, C) or (L, C) int8 at the dynamic exponent ex, seen as (P, C), P positions.
Parameters gamma (C,) int16 at e_g, beta (C,) int32 at e_b; state running_mean / running_var
(C,) int32 at the fixed exponents e_rm / e_rv. Config ints: eps = eps_m * 2^-eps_k, momentum
2^-mom_k (``config(eps, momentum)`` converts floats at build time). The trainer runs batch 1,
so train-mode statistics are over the P positions of the sample (PyTorch BatchNorm2d at batch
size 1): train needs 2 <= P <= MAX_P; eval takes 1 <= P <= MAX_P (also a (C,) vector).

Normalization, per channel. x_hat is taken as (A*x - B) / sigma_A, with
  train: A = P, B = S = sum x; then A*x - B = P*(x - mean) exactly, and
         V = P*sum(x^2) - S^2 + epsV = P^2 * (var + eps)      (exact int64, var biased),
         epsV = scale_cap(eps_m * P^2, -eps_k - 2*ex), e_V = 0;
  eval:  A = 2^EVAL_FRAC, B = align(running_mean, e_rm, ex - EVAL_FRAC) (rounded, clamped
         to +-2^30), V = max(running_var, 0) + scale_cap(eps_m, -eps_k - e_rv), e_V = e_rv.
V = max(V, 1). Inverse square root (``inv_sqrt``): n is the shift with n = e_V (mod 2) and
bitwidth(V * 2^n) in {31, 32}; Vn = V << n, or V >> -n (floor); s = isqrt(Vn) in [2^15, 2^16);
inv = floor((2^INV_BITS + floor(s/2)) / s) in [2^29, 2^30] (2^45/s to nearest, ties up). Then
  x_hat_q = sat_s32(round((A*x - B) * inv * 2^-sh))      (Q XHAT_FRAC, ties toward +inf)
  sh = INV_BITS - XHAT_FRAC + (e_V - n)/2 [+ EVAL_FRAC - ex in eval]
(right shifts by rshift_round with the shift capped at 62; a left shift saturates; saturation
only in eval, where stale statistics can make x_hat huge, and it is counted in nsat).
Per channel, saved = int32 (3, C) rows [B, inv, sh]: backward recomputes x_hat from x.

Forward:  acc = gamma * x_hat_q + align(beta, e_b, e_g - XHAT_FRAC)    (int64)
          y, ey = requant_s8(acc, e_g - XHAT_FRAC)
Running statistics (train only), shift-EMA r += rshift_round(b - r, mom_k) (result between r
and b, so it stays int32), with the batch statistic b = rdiv(N, a, D) = sat_s32(round(N*2^a/D))
(ties toward +inf, exact):
          mean: rdiv(S, ex - e_rm, P);  var (unbiased, as PyTorch): rdiv(M2, 2*ex - e_rv, P*(P-1))
          with M2 = P*sum(x^2) - S^2. a >= 0: div_floor(2*(N << a) + D, 2*D), or saturated when
          bitwidth(N) + a > bitwidth(D) + 32; a < 0: rshift_round(div_floor(N, D), min(-a, 62)).
scale_cap(N >= 0, t) = rshift_round(N, min(-t, 62)) if t < 0, else N << t capped at 2^61.

Backward (pre-update gamma, dx first). With Se = sum e, G = sum e*x_hat_q (exact int64):
  I = ((A*e - Se) << 2*XHAT_FRAC) - x_hat_q*G   (train: the full BN gradient times P*2^(2F))
  I = (A*e) << 2*XHAT_FRAC                       (eval: statistics are constants)
  J = rshift_round(I, XHAT_FRAC)
  k = gamma * inv; E_k = max over k != 0 of (bitwidth(k) - sh) - KM_BITS (0 if every k is 0);
  km = round(k * 2^-(sh + E_k))  (|km| <= 2^24; right shift rshift_round capped at 62, left exact)
  dx, edx = requant_s8(km * J, E_k + e_g + ee - ex - 2*XHAT_FRAC)
Grads: dgamma = sat_s32(G) at ee - XHAT_FRAC, dbeta = Se at ee.

Bounds (P <= 4096 = 2^12): |S| < 2^19, |A*x - B| < 2^20 (train) / < 2^31 (eval), M2 < 2^38,
V < 2^62; |x_hat| <= sqrt(P-1) so |x_hat_q| < 2^18 in train and |G| <= 127 * sum|x_hat_q| <
127 * (2^24 + 3*2^10) < 2^31 (dgamma fits int32; the saturation only acts in eval);
|I| < 2^44 + 2^49, |J| <= 2^38, |km * J| <= 2^62; |acc| <= 2^15 * 2^31 + 2^30.

int16 activations and errors (precision ``"activations": "int16"``): x, e, y, dx int16 (+-32767),
y and dx requantized with 16 bits; everything else as above, with these bounds (P <= 4096):
|S| < 2^27, M2 < 2^54, V < 2^62 (eps_v <= 2^61), |A*x - B| < 2^28 (train) / < 2^31 (eval),
x_hat_q as for int8. G = sum e*x_hat_q: |G| <= 32767 * (P 2^12 + 3P/4) < P 2^27 in train, so
dgamma = sat_s32(rshift_round(G, g)) with the static g = bitwidth(P - 1) (ops/conv2d.py's
grad_shift; |dgamma| <= 2^27 + 1 in train), at ee - XHAT_FRAC + g; dbeta = Se (|Se| < 2^27).
|I| < 2^57 + 2^52, so J = rshift_round(I, A16_J_SHIFT) with A16_J_SHIFT = XHAT_FRAC + 8:
|J| <= 2^38 and |km * J| <= 2^62 as for int8; dx at E_k + e_g + ee - ex - 2*XHAT_FRAC + 8.

Accuracy (tests/test_ops_batchnorm.py checks it against float64 batch norm): y is within half
an output LSB (one where 127 saturates) plus |gamma| * (2^-13 + 2^-14 |x_hat|) from x_hat's
rounding (in eval also |gamma/sigma| * 2^(ex-9) from rounding the running mean to B). dx is
within its int8 rounding plus 2^-12 * sqrt(P) * max|gamma/sigma| * max|dy| (x_hat is Q12; that
term shows only when the exact dx is tiny, e.g. P = 2 where it is of the order of eps).
"""
from __future__ import annotations

import math

import numpy as np

from tinytrain.fixedpoint import (INT32_MAX, INT32_MIN, div_floor, isqrt, rshift_round, sat_s32,
                          to_mult_shift)
from tinytrain.ops._common import act_bits, align, requant
from tinytrain.ops.conv2d import grad_shift

XHAT_FRAC = 12
INV_BITS = 45
EVAL_FRAC = 8
KM_BITS = 24
MAX_P = 4096
#: int16 errors: J = I rounded by this shift (8 more than XHAT_FRAC; bounds in the docstring)
A16_J_SHIFT = XHAT_FRAC + 8
EPS_CAP = 1 << 61


# ------------------------------------------------------------------ build time (floats)


def config(eps: float = 1e-5, momentum: float = 0.1) -> dict:
    """Integer config from PyTorch-style floats: eps -> (eps_m, eps_k) 15-bit multiplier and
    shift (eps = 0 allowed), momentum -> mom_k = round(-log2(momentum)) in [0, 31] (0.1 -> 3,
    i.e. 1/8: the nearest power of two)."""
    if not 2.0**-31 <= momentum <= 1:
        raise ValueError(f"BatchNorm momentum {momentum!r} must be in [2^-31, 1]")
    if not eps >= 0:
        raise ValueError(f"BatchNorm eps {eps!r} must be >= 0")
    eps_m, eps_k = (0, 0) if eps == 0 else to_mult_shift(eps, 15)
    return dict(eps_m=eps_m, eps_k=eps_k, mom_k=int(round(-math.log2(momentum))))


def init_state(C: int, e_g: int = -14, e_b: int = -20, e_rm: int = -16, e_rv: int = -16) -> dict:
    """gamma = 1, beta = 0, running_mean = 0, running_var = 1 at the given fixed exponents."""
    if not -30 <= e_rv <= 0 or not -14 <= e_g <= 0:
        raise ValueError("need -30 <= e_rv <= 0 and -14 <= e_g <= 0 to represent 1.0")
    return dict(gamma=np.full(C, 1 << -e_g, np.int16), e_g=e_g, beta=np.zeros(C, np.int32), e_b=e_b,
                running_mean=np.zeros(C, np.int32), e_rm=e_rm,
                running_var=np.full(C, 1 << -e_rv, np.int32), e_rv=e_rv)


# ------------------------------------------------------------------ integer helpers


def positions(x: np.ndarray, train: bool) -> np.ndarray:
    """View x as (P, C) int64; checks the number of positions."""
    if x.ndim == 1 and not train:
        x = x.reshape(1, -1)
    if x.ndim < 2:
        raise ValueError("BatchNorm needs spatial positions at batch 1: input (H, W, C) or (L, C),"
                         f" got shape {x.shape} (one value per channel has no batch statistics)")
    x2 = x.reshape(-1, x.shape[-1]).astype(np.int64)
    P = x2.shape[0]
    if P > MAX_P or (train and P < 2):
        raise ValueError(f"BatchNorm: P = {P} positions, need {2 if train else 1} <= P <= {MAX_P}")
    return x2


def scale_cap(n: int, t: int) -> int:
    """n * 2^t for n >= 0: rounded right shift if t < 0, left shift capped at EPS_CAP."""
    if t < 0:
        return int(rshift_round(n, min(-t, 62)))
    return 0 if n == 0 else EPS_CAP if n.bit_length() + t > 61 else n << t


def rdiv(n: int, a: int, d: int) -> int:
    """sat_s32(round(n * 2^a / d)), ties toward +inf, exact; |n| < 2^55, 1 <= d < 2^25."""
    if a < 0:
        return sat_s32(int(rshift_round(div_floor(n, d), min(-a, 62))))
    if n == 0:
        return 0
    if abs(n).bit_length() + a > d.bit_length() + 32:
        return INT32_MAX if n > 0 else INT32_MIN
    return sat_s32(div_floor(2 * (n << a) + d, 2 * d))


def ema(r: int, b: int, k: int) -> int:
    """r + rshift_round(b - r, k)."""
    return int(r) + int(rshift_round(int(b) - int(r), k))


def inv_sqrt(v: int, e_v: int) -> tuple[int, int]:
    """(inv, n): 1/sqrt(v) ~ inv * 2^(n/2 - INV_BITS) with n = e_v mod 2, v >= 1."""
    n = 32 - v.bit_length()
    if (n - e_v) % 2:
        n -= 1
    s = isqrt(v << n if n >= 0 else v >> -n)
    return ((1 << INV_BITS) + (s >> 1)) // s, n


def shift_sat32(v: np.ndarray, sh: int) -> tuple[np.ndarray, int]:
    """round(v * 2^-sh) saturated to the int32 range (int64 array), and the saturation count.
    Right shifts use rshift_round capped at 62; a left shift saturates when |v| >= 2^(32+sh)."""
    if sh >= 0:
        r = rshift_round(v, min(sh, 62))
    else:
        big = np.abs(v) >= (1 << max(0, 32 + sh))
        r = np.where(big, np.sign(v) << 32, np.where(big, 0, v) << min(-sh, 32))
    out = sat_s32(r)
    return out, int(np.count_nonzero(out != r))


def xhat(x2: np.ndarray, A: int, saved: np.ndarray) -> tuple[np.ndarray, int]:
    """x_hat_q (P, C) int64 from x (P, C) and saved rows [B, inv, sh]; saturation count."""
    B, inv, sh = (saved[i].astype(np.int64) for i in range(3))
    v = (A * x2 - B) * inv
    xh = np.empty_like(v)
    nsat = 0
    for c in range(v.shape[1]):
        xh[:, c], n = shift_sat32(v[:, c], int(sh[c]))
        nsat += n
    return xh, nsat


# ------------------------------------------------------------------------- the op


def forward(x, ex, gamma, e_g, beta, e_b, running_mean, e_rm, running_var, e_rv, *,
            train: bool, eps_m: int, eps_k: int, mom_k: int):
    """Returns (y, ey, nsat, saved, running_mean', running_var'): y shaped like x, saved
    int32 (3, C) for backward, the running statistics updated in train mode (new arrays)."""
    x2 = positions(x, train)
    P, C = x2.shape
    rm, rv = running_mean.astype(np.int32), running_var.astype(np.int32)
    saved = np.zeros((3, C), np.int32)
    if train:
        A = P
        S, T = x2.sum(axis=0), (x2 * x2).sum(axis=0)
        eps_v = scale_cap(eps_m * P * P, -eps_k - 2 * ex)
        for c in range(C):
            m2 = P * int(T[c]) - int(S[c]) ** 2
            inv, n = inv_sqrt(max(m2 + eps_v, 1), 0)
            saved[:, c] = int(S[c]), inv, INV_BITS - XHAT_FRAC - n // 2
            rm[c] = ema(rm[c], rdiv(int(S[c]), ex - e_rm, P), mom_k)
            rv[c] = ema(rv[c], rdiv(m2, 2 * ex - e_rv, P * (P - 1)), mom_k)
    else:
        A = 1 << EVAL_FRAC
        saved[0] = align(running_mean, e_rm, ex - EVAL_FRAC)
        eps_r = scale_cap(eps_m, -eps_k - e_rv)
        for c in range(C):
            inv, n = inv_sqrt(max(max(int(running_var[c]), 0) + eps_r, 1), e_rv)
            saved[1:, c] = inv, INV_BITS - XHAT_FRAC + (e_rv - n) // 2 + EVAL_FRAC - ex
    xh, nsat_x = xhat(x2, A, saved)
    acc = gamma.astype(np.int64) * xh + align(beta, e_b, e_g - XHAT_FRAC)
    y, ey, nsat = requant(acc, e_g - XHAT_FRAC, act_bits(x))
    return y.reshape(x.shape), ey, nsat + nsat_x, saved, rm, rv


def backward(e, ee, x, ex, saved, gamma, e_g, *, train: bool, need_dx=True):
    """Returns (dx, edx, nsat, grads), grads = [(dgamma, ee - XHAT_FRAC + g), (dbeta, ee)], g = 0 for
    int8 errors (grad_shift(P) for int16)."""
    x2 = positions(x, train)
    e2 = e.reshape(x2.shape).astype(np.int64)
    P, C = x2.shape
    A = P if train else 1 << EVAL_FRAC
    xh, _ = xhat(x2, A, saved)
    Se, G = e2.sum(axis=0), (e2 * xh).sum(axis=0)
    bits = act_bits(e)
    g = grad_shift(P, bits)
    grads = [(sat_s32(rshift_round(G, g)).astype(np.int32), ee - XHAT_FRAC + g), (Se.astype(np.int32), ee)]
    if not need_dx:
        return None, 0, 0, grads
    k = [int(gamma[c]) * int(saved[1, c]) for c in range(C)]
    sh = [int(saved[2, c]) for c in range(C)]
    tops = [abs(k[c]).bit_length() - sh[c] for c in range(C) if k[c] != 0]
    e_k = max(tops) - KM_BITS if tops else 0
    km = np.array([int(rshift_round(k[c], min(sh[c] + e_k, 62))) if sh[c] + e_k >= 0
                   else k[c] << -(sh[c] + e_k) for c in range(C)], dtype=np.int64)
    if train:
        i_acc = ((A * e2 - Se) << 2 * XHAT_FRAC) - xh * G
    else:
        i_acc = (A * e2) << 2 * XHAT_FRAC
    js = XHAT_FRAC if bits == 8 else A16_J_SHIFT
    acc = rshift_round(i_acc, js) * km
    dx, edx, nsat = requant(acc, e_k + e_g + ee - ex - 3 * XHAT_FRAC + js, bits)
    return dx.reshape(e.shape), edx, nsat, grads
