"""Converting a model, trained or not, to another precision policy (integer only).

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


def with_precision(model, precision):
    """A copy of ``model`` under ``precision`` (a preset name, a dict, or a Precision) with its
    training state carried over (see the module docstring). The model itself is unchanged."""
    from tinytrain.graph.model import Sequential

    cfg = model.config()
    cfg["precision"] = precision if isinstance(precision, (str, dict)) else precision.to_dict()
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
