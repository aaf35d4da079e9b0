"""Converting a model, trained or not: to another precision policy (integer only), or to a
smaller one without its pruned units (``shrink``, structured pruning; see :func:`shrink`).

``with_precision(model, policy)`` rebuilds the model under the policy and carries its state
over: a weight tensor narrowed from int16 to int8 keeps its range (its exponent rises by 8) and
is rounded, ``rshift_round``, the rule of every narrowing in tinytrain; widened, it is shifted
left (exact). Its new master copy is made from the old master where there was one (nothing of
it is lost), else from the weights. Biases, batch-norm parameters and statistics are copied as
they are; the optimizer step and the PRNG state go on; gradient accumulators and momentum start
at zero (a conversion starts a new stage). The result trains on every path bit for bit like
any other model: its exponents are part of its schema and of its .tt file. Block-exponent
weights (graph/wblock.py) convert through their int16 values: from them q << s decoded, into
them at the int16 exponent of the same range, q and the shifts narrowed from the new master.
"""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import rshift_round
from tinytrain.graph.optim import sat_range
from tinytrain.ops import wblock as r_wblock


def _narrow(v: np.ndarray, shift: int, dtype) -> np.ndarray:
    """v * 2^-shift rounded (shift > 0) or v * 2^-shift exactly (shift <= 0), saturated."""
    v = v.astype(np.int64)
    v = rshift_round(v, shift) if shift > 0 else v << (-shift)
    lo, hi = sat_range(dtype)
    return np.clip(v, lo, hi).astype(dtype)


def _decoded(model, li, pi):
    """(values, exponent) of parameter pi of layer li, block-exponent weights decoded to int16."""
    p = model.layers[li].params[pi]
    if model.blocked(li, pi):
        from tinytrain.graph.wblock import shifts_of

        L = model.param_policy(li, pi).block_len(p.data.shape[1])
        return r_wblock.expand(p.data, shifts_of(model.layers[li], p.name).data, L), p.exp
    return p.data, p.exp


def with_precision(model, precision, *, edit=None):
    """A copy of ``model`` under ``precision`` (a preset name, a dict, or a Precision; None: its
    own) with its training state carried over (see the module docstring). ``edit(cfg)``, if
    given, changes the model file's dict before the rebuild (a layer's own "precision", the
    optimizer's "train"); state the new model no longer keeps is dropped. The model itself is
    unchanged."""
    from tinytrain.graph.model import Sequential

    cfg = model.config()
    if precision is not None:
        cfg["precision"] = precision if isinstance(precision, (str, dict)) else precision.to_dict()
    if edit is not None:
        edit(cfg)
    new = Sequential.from_config(cfg)
    for attr in ("data_input_exp", "target_exp"):
        if attr in model.__dict__:
            setattr(new, attr, getattr(model, attr))
    for li, (lo, ln) in enumerate(zip(model.layers, new.layers)):
        for pi, (po, pn) in enumerate(zip(lo.params, ln.params)):
            key = (li, pi)
            if po.role == "state" and pn.role == "state" and po.name.endswith("_exp"):
                continue  # block shifts: narrowed from the master below (graph/wblock.py)
            src_w, src_e = _decoded(model, li, pi)
            if new.blocked(li, pi):  # int16 weights of the same range; q and shifts from them below
                pn.exp = src_e - (16 - 8 * src_w.dtype.itemsize)
            elif src_w.dtype == pn.data.dtype:
                pn.exp, pn.data[...] = src_e, src_w
            else:  # the same range in another width: the exponent moves by the difference in bits
                d = 8 * (src_w.dtype.itemsize - pn.data.dtype.itemsize)
                pn.exp = src_e + d
                pn.data[...] = _narrow(src_w, d, pn.data.dtype)
            if key in new.master:
                # master value at exponent pn.exp - shift, from the finest source the old model has
                src, src_exp = (model.master[key], model.master_exp(key)) if key in model.master else (src_w, src_e)
                new.master[key][...] = _narrow(src, new.master_exp(key) - src_exp, new.master[key].dtype)
                new._refresh(li, pi)
            elif new.blocked(li, pi):  # a frozen weight: its blocks straight from the int16 values
                from tinytrain.graph.wblock import shifts_of

                w16 = _narrow(src_w, pn.exp - src_e, np.int16)
                pol = new.param_policy(li, pi)
                pn.data[...], shifts_of(ln, pn.name).data[...] = r_wblock.narrow(
                    w16, pol.block_len(w16.shape[1]), pol.weight_bits)
    for key, mask in getattr(model, "masks", {}).items():  # pruning masks carry over
        if key in getattr(new, "masks", {}):
            new.masks[key][...] = mask
    new.meta[...] = model.meta
    new.meta[2] = 0  # no batch in progress: the accumulators start empty
    return new


def for_device(model):
    """(the model the device should train, what changed): `model` shrunk (:func:`shrink`) when all
    its pruning is structured and its schedule is over, so the generated C has the smaller layers
    and no masks; else `model` itself. What changed: one (layer, kind, units before, units after)
    per shrunk layer (empty if nothing was shrunk). The shrunk model computes the masked model's
    logits bit for bit and trains from the same state (see shrink)."""
    tab = model.prune_table
    if tab is None or not any(tab.structured(u) for u in range(len(tab.units))):
        return model, []
    try:
        small = shrink(model)
    except ShrinkError:  # a schedule still running, single weights or blocks: the masks stay
        return model, []
    changed = [(li, lo.kind, *(int(x.params[0].data.shape[0]) for x in (lo, ln)))
               for li, (lo, ln) in enumerate(zip(model.layers, small.layers))
               if lo.params and lo.kind in ("dense", "conv2d", "conv1d") and lo.params[0].data.shape[0] != ln.params[0].data.shape[0]]
    return small, changed


class ShrinkError(ValueError):
    """A model shrink cannot convert (the message says why and what to do)."""


def shrink(model):
    """A copy of a model trained with structured pruning (graph/prune_groups.py) without its
    pruned units: each pruned layer keeps only its kept rows (weights, bias, and every slot:
    master, accumulator, momentum), the batch norms between it and its consumer only the kept
    channels (gamma, beta, running statistics), and the consumer only the matching input slice
    (a dense layer after Flatten: the positions of the kept channels, channels-last). Exponents,
    the optimizer step, the PRNG state and the batch in progress carry over; the result has no
    pruning schedule. Its logits equal the masked model's bit for bit: a pruned unit's output
    is exactly zero, so every deleted product was a zero and no requantization sees a change
    (tests/test_prune_structured.py). The model itself is unchanged.

    Refused: a model without structured pruning, one that also prunes single weights
    (structure "weights"), one whose schedule still has events at or after its optimizer
    step, and a layer with every unit pruned."""
    from tinytrain.graph import prune_groups as pg
    from tinytrain.graph.model import Sequential

    tab = model.prune_table
    if tab is None or not any(tab.structured(u) for u in range(len(tab.units))):
        raise ShrinkError("shrink: the model has no structured pruning (a prune object with structure "
                          "\"neurons\" or \"channels\") to shrink")
    if any(pg.pruned_by_blocks(model, li) for li, _ in tab.keys):
        raise ShrinkError("shrink: the model prunes 1 x 4 blocks (structure \"blocks\"): they remove no whole unit, "
                          "so there is nothing to delete; codegen stores such layers sparse (storage \"blocks\")")
    if not all(tab.structured(u) for u in range(len(tab.units))):
        raise ShrinkError("shrink: the model also prunes single weights (structure \"weights\"): those stay in the "
                          "layers as masks; shrink a model whose prune objects are all structured")
    left = tab.steps[tab.steps >= int(model.meta[1])]
    if left.size:
        raise ShrinkError(f"shrink: the pruning schedule has {left.size} event(s) left (the last at optimizer step "
                          f"{int(left[-1])}, the model is at step {int(model.meta[1])}): train on past it, then shrink")
    units = pg.pruned_units(model)
    for li, pruned in units.items():
        if pruned.all():
            raise ShrinkError(f"shrink: every unit of layer {li} ({model.layers[li].kind}) is pruned: lower "
                              "final_sparsity, or use scope \"layer\" (it keeps one unit per layer)")
    # per parameter: (axis, kept indices) slices
    cuts: dict = {}
    cfg = model.config()
    cfg.pop("prune", None)
    for ld in cfg["layers"]:
        ld.pop("prune", None)
    for li, pruned in units.items():
        keep = np.flatnonzero(~pruned)
        cuts.setdefault((li, 0), []).append((0, keep))
        cuts.setdefault((li, 1), []).append((0, keep))
        cfg["layers"][li]["units" if model.layers[li].kind == "dense" else "filters"] = int(keep.size)
        comp, j = pg.chain(model, li)
        for bl in sorted({k[0] for k in comp}):
            for pi in range(len(model.layers[bl].params)):  # gamma, beta, running mean and variance
                cuts.setdefault((bl, pi), []).append((0, keep))
        cons = model.layers[j]
        if cons.kind == "dense":  # after Flatten / GlobalAvgPool: channel of input k is k % C (channels-last)
            ch = np.arange(cons.in_shape[0]) % pruned.size
            cuts.setdefault((j, 0), []).append((1, np.flatnonzero(~pruned[ch])))
        else:  # conv w (F, ..., C): the input channel is the last axis
            cuts.setdefault((j, 0), []).append((cons.params[0].data.ndim - 1, keep))
    new = Sequential.from_config(cfg)
    for attr in ("data_input_exp", "target_exp"):
        if attr in model.__dict__:
            setattr(new, attr, getattr(model, attr))

    def cut(key, a):
        for axis, keep in cuts.get(key, ()):
            a = np.take(a, keep, axis=axis)
        return a

    for li, (lo, ln) in enumerate(zip(model.layers, new.layers)):
        for pi, (po, pn) in enumerate(zip(lo.params, ln.params)):
            key = (li, pi)
            pn.exp = po.exp
            pn.data[...] = cut(key, po.data)
            for slots_old, slots_new in ((model.master, new.master), (model.accum, new.accum),
                                         (model.velocity, new.velocity)):
                if key in slots_old:
                    slots_new[key][...] = cut(key, slots_old[key])
            if key in model.master_shift:
                new.master_shift[key] = model.master_shift[key]
    new.meta[...] = model.meta
    return new
