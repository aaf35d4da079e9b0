"""FedProx's proximal term, applied by the federated client as a decoupled pull toward the
round's global model (the reference; C twin: ``tt_fedcodec_prox`` in
``tinytrain/firmware/src/tt_fedcodec.c``, run on a board by the FED_PROX command).

FedProx adds ``mu/2 * ||w - w_global||^2`` to every device's local loss; its gradient
``mu * (w - w_global)`` enters each SGD step as ``w <- w - lr * mu * (w - w_global)``. Here that
term is applied **between** local steps instead of inside them, like decoupled weight decay:
after every ``every`` local samples the device pulls its parameter store toward the global
store it started the round from, with the coefficient the ``every`` skipped steps add up to,
``c = lr * mu * every`` (lr: the model optimizer's base learning rate; a schedule does not
scale it). ``c`` is turned once, at build time, into ``(mult, shift) = to_mult_shift(c)``,
a 15-bit multiplier; per element, integer only::

    d  = w - g                               (int64; w, g in the tensor's integer units)
    w' = w - rshift_round(d * mult, shift)   (round to nearest, ties toward +inf)

``c < 1``, so ``|rshift_round(d * mult, shift)| <= |d|`` and ``w'`` lies between ``g`` and
``w``: it fits the tensor's dtype, no saturation. ``|d| < 2^32`` and ``mult < 2^15`` keep the
product below 2^47. A pull after sample ``j`` (1-based) when ``j % every == 0``; a tail of
fewer than ``every`` samples at the end of the round gets none. Frozen parameters do not move
during training, so their ``d`` is 0 and the pull leaves them alone.

Why between steps and not in the step: the training step is shared by three paths (numpy
reference, numba simulator, generated C) that other work edits; a pull between steps needs
no change to any of them, only the round's global store, which a board already snapshots at
ROUND_BEGIN for its update codec. ``every = 1`` is FedProx's per-step term exactly
(decoupled); larger ``every`` trades fidelity for fewer FED_PROX commands on the serial link.
Master weights: the pull moves the int32 master and refreshes the int16 compute copy
(simulated devices); on boards it is refused (the board's glue cannot reach the compute copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinytrain import fixedpoint as fp

__all__ = ["Prox", "prox_config", "pull_ref", "pull_model"]


@dataclass(frozen=True)
class Prox:
    """A compiled proximal pull: every `every` samples, w -= rshift_round((w - g) * mult, shift)."""

    mu: float
    every: int
    mult: int
    shift: int


def prox_config(mu: float, every: int, lr: float | None) -> Prox | None:
    """The pull for FedProx mu with a model whose base learning rate is lr; None when mu = 0
    (or lr None: mu and every checked only). ValueError (naming the option) for values that
    cannot work."""
    if not (mu >= 0 and mu == mu and mu != float("inf")):
        raise ValueError(f"--prox-mu {mu!r}: must be a finite number >= 0 (0: no proximal term)")
    if int(every) != every or every < 1:
        raise ValueError(f"--prox-every {every!r}: must be an integer >= 1 (samples between pulls)")
    if mu == 0 or lr is None:
        return None
    c = float(lr) * float(mu) * int(every)
    if c >= 1:
        raise ValueError(f"--prox-mu {mu:g}: lr {lr:g} x mu x --prox-every {every} = {c:g} >= 1 would pull "
                         "past the global model: lower --prox-mu or --prox-every")
    m, k = fp.to_mult_shift(c)
    if k > 62:
        raise ValueError(f"--prox-mu {mu:g}: the pull coefficient {c:g} rounds to zero in integer "
                         "arithmetic: raise --prox-mu or --prox-every")
    return Prox(float(mu), int(every), m, k)


def pull_ref(w: np.ndarray, g: np.ndarray, mult: int, shift: int) -> np.ndarray:
    """One pull of tensor w toward g (the rule in the module docstring), as w's dtype."""
    w64 = np.asarray(w, np.int64)
    d = w64 - np.asarray(g, np.int64)
    return (w64 - fp.rshift_round(d * int(mult), int(shift))).astype(np.asarray(w).dtype)


def pull_model(model, glob, prox: Prox) -> None:
    """Pull the model's parameter store toward `glob` in place (compute copies refreshed)."""
    from tinytrain.federated.fedavg import set_store, store_tensors

    set_store(model, [pull_ref(w, g, prox.mult, prox.shift) for w, g in zip(store_tensors(model), glob)])
