"""Integer SGD: learning rate, momentum and weight decay as multipliers and shifts, schedules
in integer steps, optional stochastic rounding, gradient accumulation, partial updates.

Float appears only in ``SGD.compile`` (build time), which turns the user's hyper-parameters
into integer constants. The update itself (``update_ref`` here, its numba and C twins) is
integer only.

Update of one parameter tensor (storage ``w`` with exponent ``ew``; int8/int16 storage, or a
wider "master" storage (precision.py) at exponent ew - shift with the compute copy refreshed after
each update; int32 masters of int16 weights: shift 16)
from an int32 gradient ``g`` at exponent ``eg``; lr_t = m_t * 2^-k:

* m_t = rshift_round(m * f_t, 15) with f_t the Q15 schedule factor at optimizer step t
  (constant: 32768; step: f = f * gamma_q15 >> 15 rounded, once per completed stage;
  cosine: a 65-entry Q15 table indexed by (64 * t) // total_steps, clamped).
* direct mode (batch 1, no momentum):
    s = ew_store + k - eg;  d = shift(m_t * g, s)     (int64; shift = rshift_round, or
    rshift_stoch with one PRNG draw per element in row-major order when stochastic rounding is
    on; a negative s is a saturating left shift). The draw holds 31 usable bits, so a stochastic
    shift by s > 31 is rshift_stoch(v >> (s - 31), 31, r): the floor by 2^(s - 31) comes first
    and costs a bias below 2^-31 of a step. (The other order, the draw first and the floor
    after, rounds every negative step to -1 and every positive one to 0: int8 weights without
    a master drifted by it, docs/precision.md "Stochastic rounding of small steps".)
    if weight decay: d += rshift_round(w * wd_m, wd_k)       (int64)
    w = sat(w - d)
* accumulate mode (batch > 1 or momentum), with G = 8 guard bits, A int32 per element:
    per sample: A = sat32(A + shift(m_t * g, s - G))
    at the end of a batch: u = rshift_round(A * ib_m, ib_k) (ib = 1/batch) ; A = 0
      momentum: V = sat32(rshift_round(V * mu_m, mu_k) + u); u = V   (an int16 V saturates to
      +-32767; an int8 V is a slot 8 bits higher, rounded stochastically: _apply_v8_ref)
      weight decay: u += shift_round(w * wd_m, wd_k - G)
      w = sat(w - shift(u, G))
  The optimizer step counter t counts updates (batches), not samples.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.fixedpoint import prng_next, rshift_round, rshift_stoch, sat_s32, to_mult_shift

GUARD_BITS = 8
#: bits an int8 velocity slot sits above the int32 velocity's units: one unit = one store step
V8_SHIFT = GUARD_BITS
MASTER_EXTRA_BITS = 16
COSINE_TABLE_LEN = 64
#: largest learning rate accepted. lr > 1 makes every update larger than the gradient that
#: asks for it: integer SGD then saturates the int16 weights within an epoch (lr 1e12 on
#: digits-mlp: 86,668 weight saturations in one epoch, 10% accuracy), and no model tinytrain
#: ships trains above 0.2. The representation itself (m * 2^-k, m 15 bits) needs k >= 0,
#: i.e. lr < 32768, so the bound is one of sense, not of arithmetic.
MAX_LR = 1.0


def _train_spec_ok(v) -> bool:
    if isinstance(v, str):
        return v in ("all", "bias") or (v.startswith("last:") and v[5:].isdigit())
    return isinstance(v, (list, tuple)) and all(F.is_int(i) and i >= 0 for i in v)


#: the options of SGD as a model file writes them ("optimizer": {...})
FIELDS = {
    "lr": F.NUMBER, "momentum": F.NUMBER, "weight_decay": F.NUMBER, "batch_size": F.POS_INT,
    "schedule": F.one_of("constant", "step", "cosine"), "gamma": F.NUMBER,
    "step_size": F.Field("a positive integer (updates between two learning-rate drops)",
                         lambda v: F.is_int(v) and v >= 1),
    "total_steps": F.Field("an integer >= 1 (updates the cosine schedule spans), or 0 for the "
                           "whole run", lambda v: F.is_int(v) and v >= 0),
    "stochastic_rounding": F.BOOL, "master_weights": F.BOOL,
    "train": F.Field('"all", "bias", "last:K" or a list of layer indices', _train_spec_ok),
}


class ConfigError(ValueError):
    """A hyper-parameter that cannot be represented in integer arithmetic."""


@dataclass
class SGD:
    """Integer SGD. ``lr`` is converted once to a 15-bit multiplier and a shift.

    schedule: "constant", "step" (multiply by ``gamma`` every ``step_size`` updates) or
    "cosine" (to 0 over ``total_steps`` updates, filled in by the trainer when 0).
    train: which parameters learn: "all", "bias" (bias-only), "last:K" (the last K layers with
    parameters), or a list of layer indices; other layers are frozen.
    """

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    batch_size: int = 1
    schedule: str = "constant"
    gamma: float = 0.1
    step_size: int = 1000
    total_steps: int = 0
    stochastic_rounding: bool = False
    master_weights: bool = False
    train: object = "all"

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_dict(cls, d: dict) -> "SGD":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})

    def compile(self) -> "IntSGD":
        F.check(self.to_dict(), FIELDS, "optimizer", ConfigError)
        if not self.lr > 0:
            raise ConfigError(f"learning rate {self.lr!r} must be a positive finite number")
        if self.lr > MAX_LR:
            raise ConfigError(f"learning rate {self.lr:g} is too large to train: above {MAX_LR:g} every "
                              "update overshoots and the int16 weights saturate; use 0.001..0.1")
        m, k = to_mult_shift(float(self.lr))
        if k > 60:
            raise ConfigError(
                f"learning rate {self.lr!r} rounds to zero in integer arithmetic (needs a shift of "
                f"{k} > 60 bits): use a learning rate above 1e-18 or rescale the weights"
            )
        mu = (0, 0)
        if self.momentum:
            if not 0 < self.momentum < 1:
                raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
            mu = to_mult_shift(self.momentum)
        wd = (0, 0)
        if self.weight_decay:
            if self.weight_decay < 0:
                raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
            wd = to_mult_shift(self.lr * self.weight_decay)
        ib = (1, 0) if self.batch_size == 1 else to_mult_shift(1.0 / self.batch_size)
        if self.schedule not in ("constant", "step", "cosine"):
            raise ConfigError(f"unknown schedule {self.schedule!r}: use constant, step or cosine")
        gamma_q15 = int(round(self.gamma * 32768)) if self.schedule == "step" else 32768
        if self.schedule == "step" and not 0 < gamma_q15 <= 32768:
            raise ConfigError(f"step schedule gamma must be in (0, 1], got {self.gamma}")
        cos = [int(round(32768 * 0.5 * (1 + math.cos(math.pi * i / COSINE_TABLE_LEN))))
               for i in range(COSINE_TABLE_LEN + 1)]
        return IntSGD(
            m=m, k=k, mu_m=mu[0], mu_k=mu[1], wd_m=wd[0], wd_k=wd[1], ib_m=ib[0], ib_k=ib[1],
            batch_size=self.batch_size, schedule={"constant": 0, "step": 1, "cosine": 2}[self.schedule],
            gamma_q15=gamma_q15, step_size=int(self.step_size),
            total_steps=int(self.total_steps), cosine=np.array(cos, dtype=np.int32),
            sr=bool(self.stochastic_rounding), master=bool(self.master_weights),
        )


@dataclass
class IntSGD:
    """The integer constants of an SGD configuration (what the device and numba receive)."""

    m: int
    k: int
    mu_m: int
    mu_k: int
    wd_m: int
    wd_k: int
    ib_m: int
    ib_k: int
    batch_size: int
    schedule: int
    gamma_q15: int
    step_size: int
    total_steps: int
    cosine: np.ndarray = field(repr=False)
    sr: bool
    master: bool

    @property
    def accumulate(self) -> bool:
        return self.batch_size > 1 or self.mu_m != 0

    def lr_mult(self, t: int) -> int:
        """m_t for optimizer step t (integer only)."""
        if self.schedule == 0:
            return self.m
        if self.schedule == 1:
            f = 32768
            for _ in range(t // self.step_size):
                f = rshift_round(f * self.gamma_q15, 15)
        else:
            T = max(1, self.total_steps)
            f = int(self.cosine[min(COSINE_TABLE_LEN, (COSINE_TABLE_LEN * t) // T)])
        return rshift_round(self.m * f, 15)


def _shift(v: np.ndarray, s: int, sr: bool, prng: list):
    """shift(v, s) on int64 arrays with rounding or stochastic rounding (draws in order)."""
    if s <= 0:
        if s == 0:
            return v
        t, lim = min(-s, 40), 2**62  # saturating left shift
        return np.where(v > (lim >> t), lim, np.where(v < -(lim >> t), -lim, v << t))
    if not sr:
        return rshift_round(v, min(s, 62))
    flat = v.reshape(-1)
    out = np.empty_like(flat)
    st = prng[0]
    ss, xs = min(s, 31), min(max(s - 31, 0), 63)
    for i in range(flat.size):
        st = prng_next(st)
        out[i] = rshift_stoch(int(flat[i]) >> xs, ss, st)
    prng[0] = st
    return out.reshape(v.shape)


def sat_range(dtype) -> tuple[int, int]:
    """The range an update saturates a tensor of ``dtype`` to: symmetric for int8 and int16
    (-128 and -32768 never occur, so every product bound of the kernels holds), full for int32."""
    dt = np.dtype(dtype)
    if dt == np.int32:
        return -(2**31), 2**31 - 1
    hi = int(np.iinfo(dt).max)
    return -hi, hi


def _sat_store(w: np.ndarray, v: np.ndarray) -> np.ndarray:
    lo, hi = sat_range(w.dtype)
    return np.clip(v, lo, hi).astype(w.dtype)


def update_direct_ref(w, ew_store, g, eg, opt: IntSGD, m_t: int, prng: list, stats=None):
    """Direct-mode update in place (see module docstring). Returns number of saturations;
    stats[2] (if given) counts update underflows: nonzero gradients whose step rounds to 0."""
    d = _shift(m_t * g.astype(np.int64), ew_store + opt.k - eg, opt.sr, prng)
    if stats is not None:
        stats[2] += int(np.count_nonzero((g != 0) & (d == 0)))
    if opt.wd_m:
        d = d + rshift_round(w.astype(np.int64) * opt.wd_m, opt.wd_k)
    v = w.astype(np.int64) - d
    new = _sat_store(w, v)
    nsat = int(np.count_nonzero(new != v))
    w[...] = new
    return nsat


def accumulate_ref(A, ew_store, g, eg, opt: IntSGD, m_t: int, prng: list, stats=None):
    s = ew_store + opt.k - eg - GUARD_BITS
    d = _shift(m_t * g.astype(np.int64), s, opt.sr, prng)
    if stats is not None:
        stats[2] += int(np.count_nonzero((g != 0) & (d == 0)))
    A[...] = sat_s32(A.astype(np.int64) + d).astype(np.int32)


def apply_accumulated_ref(w, A, V, opt: IntSGD, prng: list):
    u = A.astype(np.int64)
    if opt.batch_size > 1:
        u = rshift_round(u * opt.ib_m, opt.ib_k)
    A[...] = 0
    if opt.mu_m and V.dtype == np.int8:
        return _apply_v8_ref(w, u, V, opt, prng)
    if opt.mu_m:  # the velocity saturates to its own width (int32, or int16 under a policy)
        V[...] = np.clip(rshift_round(V.astype(np.int64) * opt.mu_m, opt.mu_k) + u, *sat_range(V.dtype)).astype(V.dtype)
        u = V.astype(np.int64)
    if opt.wd_m:
        s = opt.wd_k - GUARD_BITS
        wd = w.astype(np.int64) * opt.wd_m
        u = u + (rshift_round(wd, s) if s >= 0 else wd << (-s))
    v = w.astype(np.int64) - _shift(u, GUARD_BITS, opt.sr, prng)
    new = _sat_store(w, v)
    nsat = int(np.count_nonzero(new != v))
    w[...] = new
    return nsat


def _apply_v8_ref(w, u, V, opt: IntSGD, prng: list) -> int:
    """apply_accumulated_ref with an int8 velocity (policy "momentum": "int8"), element by
    element, after the batch average u. The slot holds V8 at V8_SHIFT bits above the units of
    the int32 velocity (whole store steps, +-127):
        vv = sat32(rshift_round((V8 << V8_SHIFT) * mu_m, mu_k) + u)    (the wide velocity)
        V8 = clamp(rshift_stoch(vv, V8_SHIFT, r), -127, 127)             (one PRNG draw r)
    and the update goes on with u = vv, the wide value, as with an int32 velocity. Per element
    the slot's draw comes before the update's (when stochastic rounding is on)."""
    fw, fu, fv = w.reshape(-1), u.reshape(-1), V.reshape(-1)
    lo, hi = sat_range(w.dtype)
    st, nsat = prng[0], 0
    for i in range(fw.size):
        vv = int(sat_s32(int(rshift_round(int(fv[i]) * (1 << V8_SHIFT) * opt.mu_m, opt.mu_k)) + int(fu[i])))
        st = prng_next(st)
        fv[i] = min(max(rshift_stoch(vv, V8_SHIFT, st), -127), 127)
        a, wi = vv, int(fw[i])
        if opt.wd_m:
            s = opt.wd_k - GUARD_BITS
            a += int(rshift_round(wi * opt.wd_m, s)) if s >= 0 else (wi * opt.wd_m) << (-s)
        if opt.sr:
            st = prng_next(st)
        v = wi - (rshift_stoch(a, GUARD_BITS, st) if opt.sr else rshift_round(a, GUARD_BITS))
        nv = min(max(v, lo), hi)
        nsat += nv != v
        fw[i] = nv
    prng[0] = st
    w[...], V[...] = fw.reshape(w.shape), fv.reshape(V.shape)  # (views already, unless w was strided)
    return nsat


def refresh_compute_copy(master: np.ndarray, w: np.ndarray, shift: int = MASTER_EXTRA_BITS) -> None:
    """The compute copy of a master, ``shift`` bits narrower: sat(rshift_round(master, shift))
    in w's symmetric range (int32 -> int16: 16 bits, int32 -> int8: 24, int16 -> int8: 8)."""
    w[...] = _sat_store(w, rshift_round(master.astype(np.int64), shift))
