"""The ``loss_scale`` key of a precision policy: dynamic (today), static or global (GradScaler).

``dynamic`` (the default): every error tensor picks its own exponent each step from its
largest value (requant_s8); nothing saturates and nothing is skipped.

``global`` is torch.cuda.amp.GradScaler in integer form. The scale is a power of two, held as
its exponent E (state, in the state hash): the loss head's error g (dLoss/dz, Q15 for softmax
cross-entropy) is quantized at the fixed exponent -E, e = sat_s8(round(g * 2^E)), instead of at
its own dynamic exponent. Every later error tensor keeps its dynamic exponent (ee + ew), which
in tinytrain plays the part FP16's per-value exponent plays under GradScaler: the global scale
is where the loss's gradient sits, the one tensor whose range it decides. Then, as GradScaler:
- an overflow (some |g * 2^E| rounds beyond 127, i.e. the error saturates) skips the step:
  no backward, no update; weights, master copies, momentum, masks, the PRNG and the optimizer
  step counter are unchanged. E drops by ``backoff_factor`` (not below ``min_scale``), the
  clean-step count restarts, the skipped-step count grows;
- a clean step trains as usual and counts; after ``growth_interval`` clean steps in a row E
  rises by ``growth_factor`` (not above ``max_scale``) and the count restarts.
The keys are GradScaler's, as exponents: ``init_scale`` E0 (torch's init_scale = 2^E0),
``growth_factor`` g (torch's 2^g), ``backoff_factor`` b (torch's 2^-b), ``growth_interval``.

``static``: E stays ``init_scale``; an error beyond the range saturates and the step trains
on the saturated error (no skip); such steps are counted (loss scaling without overflow
checks, the "static" row of the precision lab).

Scaler state: int32 [E, clean steps in a row, overflow steps] (skipped steps under global,
saturated steps under static), after ``meta`` in the state, the state hash, the C state blob
and the ``.tt`` file, only in models with a global or static scale (others are unchanged).

A policy gives it as an object or a compact string::

    "loss_scale": {"mode": "global", "init_scale": 7, "growth_interval": 200}
    "loss_scale": "global:init_scale=7,growth_interval=200"      "loss_scale": "static:init_scale=6"
"""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from tinytrain.fixedpoint import rshift_round

MODES = ("dynamic", "global", "static")
#: the exponent range a scale may take (the Q15 error of softmax CE is in [-1, 1]: beyond
#: 2^-15 resolution nothing is left; 24 bounds the left shift of the MSE head's int64 error)
E_MIN, E_MAX = -24, 24


class LossScaleError(ValueError):
    """A loss_scale value that is malformed."""


@dataclass(frozen=True)
class LossScale:
    mode: str = "dynamic"
    init_scale: int = 7
    growth_factor: int = 1
    backoff_factor: int = 1
    growth_interval: int = 200
    min_scale: int = 0
    max_scale: int = 15

    KEYS = ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "min_scale", "max_scale")

    @classmethod
    def parse(cls, spec, where: str = "loss_scale") -> "LossScale":
        if isinstance(spec, LossScale):
            return spec
        if isinstance(spec, str):
            mode, _, rest = spec.partition(":")
            d = {"mode": mode.strip()}
            for part in filter(None, (p.strip() for p in rest.split(","))):
                k, eq, v = part.partition("=")
                try:
                    if not eq:
                        raise ValueError
                    value = int(v)
                except ValueError:
                    raise LossScaleError(f"{where}: {part!r} is not KEY=INTEGER: write e.g. "
                                         "\"global:init_scale=7,growth_interval=200\"") from None
                if k.strip() in d:
                    raise LossScaleError(f"{where}: {k.strip()} is given twice in {spec!r}: keep one")
                d[k.strip()] = value
        elif isinstance(spec, dict):
            d = dict(spec)
        else:
            raise LossScaleError(f"{where} must be \"dynamic\", \"global\", \"static\" or an object with \"mode\", "
                                 f"got {spec!r}")
        if "mode" not in d:
            raise LossScaleError(f"{where}: the object has no \"mode\": add \"mode\": \"global\" (or \"static\", "
                                 "\"dynamic\")")
        mode = d.pop("mode")
        if mode not in MODES:
            raise LossScaleError(f"{where}: mode = {mode!r} must be one of dynamic, global, static")
        unknown = sorted(k for k in d if k not in cls.KEYS)
        if unknown:
            raise LossScaleError(f"{where}: unknown key(s) {', '.join(unknown)}: known keys are "
                                 f"mode, {', '.join(cls.KEYS)} (GradScaler's names, as exponents)")
        if mode == "dynamic" and d:
            raise LossScaleError(f"{where}: mode \"dynamic\" takes no keys: drop {', '.join(sorted(d))} "
                                 "or use mode \"global\"")
        if mode == "static":
            extra = sorted(set(d) - {"init_scale"})
            if extra:
                raise LossScaleError(f"{where}: mode \"static\" has a fixed exponent and takes only init_scale: "
                                     f"drop {', '.join(extra)} or use mode \"global\"")
        for k, v in d.items():
            if not (isinstance(v, int) and not isinstance(v, bool)):
                what = "a count of steps" if k == "growth_interval" else "an exponent of two"
                raise LossScaleError(f"{where}: {k} = {json.dumps(v, default=str)} must be an integer ({what})")
        ls = cls(mode=mode, **d)
        ls.check(where)
        return ls

    def check(self, where: str) -> None:
        if not E_MIN <= self.min_scale <= self.max_scale <= E_MAX:
            raise LossScaleError(f"{where}: min_scale {self.min_scale} .. max_scale {self.max_scale} must be a range "
                                 f"within {E_MIN} .. {E_MAX}")
        if not self.min_scale <= self.init_scale <= self.max_scale:
            raise LossScaleError(f"{where}: init_scale = {self.init_scale} must lie in min_scale .. max_scale "
                                 f"({self.min_scale} .. {self.max_scale})")
        if self.growth_factor < 0 or self.backoff_factor < 1:
            raise LossScaleError(f"{where}: growth_factor must be >= 0 and backoff_factor >= 1 (exponents: "
                                 "torch's growth_factor 2.0 is 1, backoff_factor 0.5 is 1)")
        if self.growth_interval < 1:
            raise LossScaleError(f"{where}: growth_interval = {self.growth_interval} must be a positive integer")

    def __str__(self) -> str:
        """The canonical compact form (what the policy stores and the schema shows)."""
        if self.mode == "dynamic":
            return "dynamic"
        keys = ("init_scale",) if self.mode == "static" else self.KEYS
        return self.mode + ":" + ",".join(f"{k}={getattr(self, k)}" for k in keys)

    def to_dict(self) -> dict:
        keys = ("mode",) + (() if self.mode == "dynamic" else ("init_scale",) if self.mode == "static" else self.KEYS)
        return {k: getattr(self, k) for k in keys}

    @property
    def enabled(self) -> bool:
        return self.mode != "dynamic"

    def initial_state(self) -> np.ndarray:
        """[E, clean steps in a row, overflow steps]."""
        return np.array([self.init_scale, 0, 0], np.int64)


def canonical(spec, where: str = "loss_scale") -> str:
    return str(LossScale.parse(spec, where))


# ----------------------------------------------------------------- reference semantics
def quantize(g: np.ndarray, eg: int, E: int):
    """The loss error g (int64, at exponent eg) at the fixed exponent -E.

    s = -E - eg; s >= 0: r = rshift_round(g, min(s, 62)) (ties toward +inf, fixedpoint.rshift_round);
    s < 0: r = g * 2^-s, exact (|g| > 127 saturates either way, so only |g| <= 127 is shifted:
    -s <= 48 keeps it in int64). e = sat_s8(r). Returns (e int8, -E, n_saturated)."""
    g = np.asarray(g, np.int64)
    s = -E - eg
    if s >= 0:
        r = rshift_round(g, min(s, 62))
    else:
        r = np.where(np.abs(g) > 127, np.sign(g) * 128, np.clip(g, -127, 127) << -s)
    y = np.clip(r, -127, 127).astype(np.int8)  # symmetric, as requant_s8 (sat_s8)
    return y, -E, int(np.count_nonzero(r != y))


def step(ls: LossScale, state: np.ndarray, nsat: int) -> bool:
    """Advance the scaler state after a head quantized with nsat saturations; True: skip."""
    if ls.mode == "static":
        if nsat:
            state[2] += 1
        return False
    if nsat:
        state[0] = max(ls.min_scale, int(state[0]) - ls.backoff_factor)
        state[1] = 0
        state[2] += 1
        return True
    state[1] += 1
    if state[1] >= ls.growth_interval:
        state[0] = min(ls.max_scale, int(state[0]) + ls.growth_factor)
        state[1] = 0
    return False


