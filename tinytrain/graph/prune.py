"""Magnitude pruning inside the integer training: schedules, the criterion, masks as state.

The reference (the specification; numba twin ``tinytrain/kernels/prune.py``, C twin
``firmware/src/tt_prune.c``).

**Configuration** (build time, float allowed): a :class:`Prune` -- the ``"prune"`` object of a
model file, global or inside a layer object -- names a schedule with TFMOT's names:

* ``polynomial`` (Zhu & Gupta, TFMOT ``PolynomialDecay``): at the steps
  t = begin_step + j * frequency <= end_step, and at end_step itself (so the final sparsity is
  always reached, even when frequency does not divide end_step - begin_step),
  s_t = s_f + (s_i - s_f) * (1 - (t - begin_step) / (end_step - begin_step)) ** power;
* ``constant`` (TFMOT ``ConstantSparsity``): s_t = target (``final_sparsity`` or
  ``target_sparsity``) at begin_step, begin_step + frequency, ... <= end_step (default:
  begin_step only);
* ``one_shot``: s = final_sparsity once, at begin_step.

:func:`compile` turns the schedules into an integer table the device walks: rows of
(optimizer step, number of zeros per pruned tensor), zeros = round(s * n) (half up, on the
exact value of the float), -1 where a tensor's own schedule has no event at that row's step.

**Which tensors**: the weight tensor ``w`` of every dense and convolution layer (a Residual
block's inner ones too) that the optimizer trains and that a prune object covers (the
model's, or its layer's, which wins). Biases and batch-norm parameters are never pruned.

**Masks are training state**: per pruned tensor a bitmap of ceil(n / 32) uint32 words, bit
(i % 32) of word (i // 32) set when element i (row-major) is pruned; the padding bits are 0.
The masks are hashed with the rest of the state, after the tensor's optimizer slots.

**When** (one training step): every optimizer touch of a pruned tensor (a direct update, a
per-sample accumulation, the end-of-batch update) is followed by :func:`apply`, which sets
every pruned element to zero in the tensor, its int32 master, its accumulator and its
momentum. PRNG draws of stochastic rounding are made for pruned elements too (the order of
draws does not depend on the masks). At the end of a step that makes optimizer update t
(t = the step counter before it is incremented: the first update is t = 0), if the table has a
row for t, :func:`select` recomputes the mask of each tensor with a zeros count in that row
and :func:`apply` zeroes it.

**Criterion** (:func:`select`): the k elements with the smallest (|v|, index), v the values of
the update's store (the int32 master where there is one, else the tensor): ties in magnitude
are broken by the lower flat index. Exactly k elements are pruned.

**Scope**: ``"layer"`` (default) prunes each tensor to the sparsity on its own. ``"global"`` (the
model's prune object only) ranks the elements of all the tensors it covers together, k =
round(s * N) of their N elements, by their real magnitude: |v| << (e_t - e_min), e_t the store's
exponent of tensor t and e_min the smallest of them (an exact integer comparison in 63 bits:
|v| <= 2^31, shifts above 31 are refused), ties by (tensor, flat index), the tensors in state order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph import prune_groups as _pg
from tinytrain.graph.prune_base import BLOCK, STRUCTURES, PruneError, layer_prune, mask_words, pack, unpack  # noqa: F401

__all__ = ["Prune", "PruneError", "PruneTable", "FIELDS", "compile", "select", "apply", "pack", "unpack",
           "mask_words", "PRUNABLE_KINDS"]

SCHEDULES = ("constant", "polynomial", "one_shot")
#: layer kinds whose weight tensor ``w`` can be pruned
PRUNABLE_KINDS = ("dense", "conv1d", "conv2d", "depthwise_conv2d")
#: structured pruning: the layer kinds whose output units each structure removes

_SPARSITY = F.Field("a number in [0, 1)", lambda v: F.is_number(v) and 0 <= v < 1)
_STEP = F.Field("an integer in [0, 2^31) (an optimizer step; the device counts them in 32 bits)",
                lambda v: F.is_int(v) and 0 <= v < 2**31)
#: the keys of a "prune" object
FIELDS = {
    "schedule": F.one_of(*SCHEDULES),
    "initial_sparsity": _SPARSITY, "final_sparsity": _SPARSITY, "target_sparsity": _SPARSITY,
    "begin_step": _STEP, "end_step": _STEP,
    "frequency": F.Field("a positive integer (optimizer steps between two pruning steps)",
                         lambda v: F.is_int(v) and v >= 1),
    "power": F.Field("a number > 0", lambda v: F.is_number(v) and v > 0),
    "structure": F.one_of("weights", "neurons", "channels", "filters", "blocks"),
    "scope": F.one_of("layer", "global"),
    "criterion": F.one_of("l1", "gamma"),
    # how codegen stores the layer once the mask is final (tinytrain/codegen/sparse.py)
    "storage": F.one_of("auto", "dense", "sparse", "blocks", "rows", "bitmap"),
}
#: keys each schedule reads (others are refused: a key that would be ignored is a mistake)
_KEYS = {
    "polynomial": {"initial_sparsity", "final_sparsity", "begin_step", "end_step", "frequency", "power"},
    "constant": {"final_sparsity", "target_sparsity", "begin_step", "end_step", "frequency"},
    "one_shot": {"final_sparsity", "target_sparsity", "begin_step"},
}
_COMMON = {"schedule", "structure", "scope", "criterion", "storage"}


@dataclass
class Prune:
    """A pruning schedule (TFMOT names). ``Prune(final_sparsity=0.8, end_step=20000)`` is the
    polynomial schedule from 0 to 80 % between steps 0 and 20000, pruning every 100 steps."""

    schedule: str = "polynomial"
    final_sparsity: float | None = None
    initial_sparsity: float | None = None
    target_sparsity: float | None = None
    begin_step: int | None = None
    end_step: int | None = None
    frequency: int | None = None
    power: float | None = None
    structure: str = "weights"
    scope: str = "layer"
    criterion: str | None = None  # structured pruning: "l1" (default) or "gamma" (graph/prune_groups.py)
    storage: str | None = None  # codegen: "auto" (None), "dense", "sparse", "blocks", "rows" or "bitmap" (codegen/sparse.py)

    def to_dict(self) -> dict:
        """The keys the user gave (None left out), the model file's ``"prune"`` object."""
        return {k: getattr(self, k) for k in self.__dataclass_fields__ if getattr(self, k) is not None}

    @classmethod
    def from_dict(cls, d, where: str = "prune") -> "Prune":
        if isinstance(d, Prune):
            d.check(where)
            return d
        if not isinstance(d, dict):
            raise PruneError(f"{where}: must be an object such as {{\"schedule\": \"polynomial\", "
                             f"\"final_sparsity\": 0.8, \"end_step\": 20000}}, got {F.show(d)}")
        F.check(d, FIELDS, where, PruneError)
        p = cls(**d)
        p.check(where)
        return p

    def check(self, where: str = "prune") -> None:
        F.check(self.to_dict(), FIELDS, where, PruneError)
        given = set(self.to_dict()) - _COMMON
        extra = sorted(given - _KEYS[self.schedule])
        if extra:
            raise PruneError(f"{where}: {extra[0]} does not apply to schedule {self.schedule!r} (it reads "
                             f"{', '.join(sorted(_KEYS[self.schedule]))})")
        if self.final_sparsity is not None and self.target_sparsity is not None:
            raise PruneError(f"{where}: give final_sparsity or target_sparsity (the same thing), not both")
        if self.target() is None:
            raise PruneError(f"{where}: final_sparsity is missing (a number in [0, 1))")
        if self.schedule == "polynomial" and self.end_step is None:
            raise PruneError(f"{where}: end_step is missing: the polynomial schedule reaches final_sparsity "
                             "at end_step")
        if self.criterion is not None and self.structure == "weights":
            raise PruneError(f"{where}: criterion ranks the units of structured pruning: give structure "
                             "\"neurons\" or \"channels\" with it, or leave it out")
        if self.criterion == "gamma" and self.structure == "blocks":
            raise PruneError(f"{where}: criterion \"gamma\" ranks whole channels; blocks are ranked by their "
                             "weights' L1 norm: use criterion \"l1\" or leave it out")
        if self.scope == "global" and where != "prune":
            raise PruneError(f"{where}: scope = \"global\" ranks several layers together: give it in the "
                             "model's prune object, not a layer's")
        b, e = self.begin(), self.end()
        if e < b or (self.schedule == "polynomial" and e == b):
            raise PruneError(f"{where}: end_step = {e} {'is' if e < b else 'must come after'} begin_step = {b}"
                             f"{': the schedule ends before it begins' if e < b else ''}")

    def target(self):
        return self.final_sparsity if self.final_sparsity is not None else self.target_sparsity

    def begin(self) -> int:
        return int(self.begin_step or 0)

    def end(self) -> int:
        if self.schedule == "one_shot" or self.end_step is None:
            return self.begin()
        return int(self.end_step)

    def events(self) -> list[tuple[int, float]]:
        """(optimizer step, sparsity) of every pruning event (build time, float)."""
        b, e = self.begin(), self.end()
        f = int(self.frequency or 100)
        steps = list(range(b, e + 1, f)) if self.schedule != "one_shot" else [b]
        if steps[-1] != e:
            steps.append(e)
        s_f = float(self.target())
        if self.schedule != "polynomial":
            return [(t, s_f) for t in steps]
        s_i = float(self.initial_sparsity or 0.0)
        power = float(self.power if self.power is not None else 3)
        return [(t, s_f + (s_i - s_f) * (1.0 - min(1.0, (t - b) / (e - b))) ** power) for t in steps]


def zeros_for(sparsity: float, n: int) -> int:
    """round(sparsity * n), half up, on the float's exact value."""
    return int(math.floor(Fraction(sparsity) * n + Fraction(1, 2)))


def select(store: np.ndarray, k: int) -> np.ndarray:
    """The mask pruning the k elements of `store` with the smallest (|v|, flat index)."""
    return select_group([store], [0], k)[0]


def select_group(stores, shifts, k: int) -> list[np.ndarray]:
    """The masks pruning the k elements of all `stores` together with the smallest
    (|v| << shift of its tensor, tensor position, flat index)."""
    mag = np.concatenate([np.abs(np.asarray(v).reshape(-1).astype(np.int64)) << int(s) for v, s in zip(stores, shifts)])
    order = np.lexsort((np.arange(mag.size), mag))  # by magnitude, ties by position
    pruned = np.zeros(mag.size, bool)
    pruned[order[:int(k)]] = True
    out, off = [], 0
    for v in stores:
        n = np.asarray(v).size
        out.append(pack(pruned[off:off + n]))
        off += n
    return out


def apply(mask: np.ndarray, *slots) -> None:
    """Set the pruned elements of every given array (tensor, master, accumulator, momentum;
    None skipped) to zero, in place."""
    for a in slots:
        if a is not None:
            a.reshape(-1)[unpack(mask, a.size)] = 0


@dataclass
class PruneTable:
    """The integer schedule the device walks. ``keys``: the pruned (layer, param), unit by unit;
    ``units``: (start, stop) of each unit in keys -- one tensor (scope "layer") or the tensors
    ranked together (scope "global"); ``shifts``: per key, the left shift of |v| onto its
    unit's common exponent (0 alone); ``groups``: per key, None (single weights) or, in a
    structured unit, (units, elements per unit, index in keys of the ranked tensor whose units
    it follows -- itself for a layer's weights --, multiplier of its rows' L1 norms, row length:
    a tensor's rows of that many elements are cut into units of ``elements per unit``, the
    last of a row shorter when it does not divide -- the row length equals the unit's for
    neurons and channels, it is K for 1 x 4 blocks);
    ``steps``: the optimizer steps with an event (strictly
    increasing); ``zeros`` (rows x units): the zeros count of each unit at each row, -1 where
    it has no event."""

    keys: list
    steps: np.ndarray = field(repr=False)
    zeros: np.ndarray = field(repr=False)
    units: list = None
    shifts: list = None
    groups: list = None

    def __post_init__(self):
        if self.units is None:
            self.units = [(j, j + 1) for j in range(len(self.keys))]
        if self.shifts is None:
            self.shifts = [0] * len(self.keys)
        if self.groups is None:
            self.groups = [None] * len(self.keys)

    def structured(self, u: int) -> bool:
        """True when unit u prunes groups (graph/prune_groups.py), not single weights."""
        return self.groups[self.units[u][0]] is not None

    def row(self, t: int) -> int:
        """The row of optimizer step t, -1 if none (a binary search in C)."""
        i = int(np.searchsorted(self.steps, t))
        return i if i < self.steps.size and int(self.steps[i]) == t else -1


def _prunable(layer):
    """(param index, inner layer kind) of the prunable weights of a top-level layer."""
    if layer.kind in PRUNABLE_KINDS:
        return [i for i, p in enumerate(layer.params) if p.name == "w"]
    inner = getattr(layer, "inner", None)
    if inner is None:
        return []
    out = []
    for k, l in enumerate(inner):
        if l.kind in PRUNABLE_KINDS:
            out += [i for i, p in enumerate(layer.params) if p.name == f"{k}_w"]
    return out


def compile(model) -> PruneTable | None:
    """The integer table of a model's pruning configuration (None: no pruning)."""
    per_key, together = {}, []  # together: the keys of the global unit
    groups, g_units, g_events = {}, [], []  # structured pruning (graph/prune_groups.py)
    for li, l in enumerate(model.layers):
        cfg = layer_prune(l) or model.prune
        if cfg is None:
            continue
        if cfg.structure != "weights":
            unit = _pg.layer_unit(model, li, cfg, layer_prune(l) is not None, groups)
            if unit is not None and cfg.scope == "global":
                together += unit
            elif unit is not None:
                g_units.append(unit)
                n_units = groups[unit[0]][0]  # a layer keeps one neuron or channel at least
                cap = n_units if cfg.structure == "blocks" else n_units - 1
                g_events.append({t: min(zeros_for(s, n_units), cap) for t, s in cfg.events()})
            continue
        if layer_prune(l) is not None and not _prunable(l):
            raise PruneError(f"layer {li} ({l.kind}): prune: this layer has no weights to prune (dense and "
                             "convolution layers have)")
        for pi in _prunable(l):
            if not model.learns(li, pi):
                if layer_prune(l) is not None:
                    raise PruneError(f"layer {li} ({l.kind}): prune: the layer is frozen (train=...): its "
                                     "weights are constants in flash and cannot be pruned while training")
                continue
            n = l.params[pi].data.size
            if cfg.scope == "global":
                together.append((li, pi))
            else:
                per_key[(li, pi)] = {t: zeros_for(s, n) for t, s in cfg.events()}
    units = [[k] for k in sorted(per_key)]
    events = [per_key[k] for k in sorted(per_key)]
    if model.prune is not None and model.prune.structure != "weights":
        _pg.check_covers(model, groups)
    if together and model.prune.structure != "weights":
        g_units.append(together)
        g_events.append({t: zeros_for(s, sum(groups[k][0] for k in together if groups[k][2] == k))
                         for t, s in model.prune.events()})
    elif together:
        total = sum(model.layers[li].params[pi].data.size for li, pi in together)
        units.append(together)
        events.append({t: zeros_for(s, total) for t, s in model.prune.events()})
    if not units and not g_units:
        return None
    # units in state order of their first tensor; structured units after the others (the C
    # walks them with its own schedule, tt_prune_group.h)
    order = sorted(range(len(units)), key=lambda u: units[u][0])
    g_order = sorted(range(len(g_units)), key=lambda u: g_units[u][0])
    units = [units[u] for u in order] + [g_units[u] for u in g_order]
    events = [events[u] for u in order] + [g_events[u] for u in g_order]
    keys, spans, shifts, gr = [], [], [], []
    for u in units:
        spans.append((len(keys), len(keys) + len(u)))
        if u[0] in groups:
            sh, mult = _pg.scales(model, u, groups)
            shifts += sh
            gr += [(groups[k][0], groups[k][1], len(keys) + u.index(groups[k][2]), m, groups[k][4])
                   for k, m in zip(u, mult)]
        else:
            shifts += _shifts(model, u)
            gr += [None] * len(u)
        keys += u
    steps = sorted(set().union(*(set(v) for v in events)))
    zeros = np.array([[ev.get(t, -1) for ev in events] for t in steps], np.int32).reshape(len(steps), len(units))
    return PruneTable(keys, np.array(steps, np.int64), zeros, spans, shifts, gr)


def _shifts(model, unit) -> list[int]:
    """|v| << shift puts every store of a unit on its smallest exponent (exact: |v| <= 2^31 and
    shift <= 31 keep the magnitude below 2^63)."""
    if len(unit) == 1:
        return [0]
    exps = [(model.master_exp((li, pi)) if (li, pi) in model.master else model.layers[li].params[pi].exp)
            for li, pi in unit]
    out = [e - min(exps) for e in exps]
    if max(out) > 31:
        raise PruneError(f'prune: scope = "global": the weight exponents differ by {max(out)} bits (more than 31): '
                         'the layers cannot be ranked exactly together; use scope "layer"')
    return out


def attach(model, prune) -> None:
    """Give a trained model that does not prune yet a pruning schedule (a model file's "prune"
    object): fine-tuning with pruning. Its events must lie at or after the model's optimizer
    step (steps count from the start of its training)."""
    if model.masks or model.prune is not None or any(layer_prune(l) for l in model.layers):
        raise PruneError("prune: this saved model already prunes: its schedule is part of its training state")
    cfg = Prune.from_dict(prune, "prune")
    t = int(model.meta[1])
    if cfg.begin() < t:
        raise PruneError(f"prune: begin_step = {cfg.begin()} is before the model's optimizer step {t}: the "
                         f"steps count from the start of its training; use begin_step >= {t}")
    model.prune = cfg
    model.prune_table = compile(model)
    model.masks = init_masks(model)


def init_masks(model) -> dict:
    """An all-kept mask for every pruned tensor."""
    t = model.prune_table
    if t is None:
        return {}
    return {key: np.zeros(mask_words(model.layers[key[0]].params[key[1]].data.size), np.uint32) for key in t.keys}


def scheduled(model, t: int) -> None:
    """The pruning event of optimizer step t, if any (end of the step making update t)."""
    tab = model.prune_table
    if tab is None:
        return
    r = tab.row(t)
    if r < 0:
        return
    for u, (a, b) in enumerate(tab.units):
        k = int(tab.zeros[r, u])
        if k >= 0 and tab.structured(u):
            for key, mask in zip(tab.keys[a:b], _pg.select_unit(model, tab, u, k)):
                model.masks[key][...] = mask
                apply_key(model, key)
        elif k >= 0:
            keys = tab.keys[a:b]
            for key, mask in zip(keys, select_group([model._store(*key)[0] for key in keys], tab.shifts[a:b], k)):
                model.masks[key][...] = mask
                apply_key(model, key)


def apply_key(model, key) -> None:
    """:func:`apply` on every slot of one pruned parameter (no-op for an unpruned one)."""
    if key in model.masks:
        li, pi = key
        apply(model.masks[key], model.layers[li].params[pi].data, model.master.get(key),
              model.accum.get(key), model.velocity.get(key))


def sparsity(model) -> dict:
    """Per pruned tensor ``"L{li}.{name}"``: (zeros in the mask, elements)."""
    out = {}
    for (li, pi), m in model.masks.items():
        p = model.layers[li].params[pi]
        out[f"L{li}.{p.name}"] = (int(unpack(m, p.data.size).sum()), int(p.data.size))
    return out
