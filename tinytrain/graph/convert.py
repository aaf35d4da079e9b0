"""Converting a model, trained or not, to another precision policy (integer only).

``with_precision(model, policy)`` rebuilds the model under the policy and carries its state
over: a weight tensor narrowed from int16 to int8 keeps its range (its exponent rises by 8) and
is rounded, ``rshift_round``, the rule of every narrowing in tinytrain; widened, it is shifted
left (exact). Its new master copy is made from the old master where there was one (nothing of
it is lost), else from the weights. Biases, batch-norm parameters and statistics are copied as
they are; the optimizer step and the PRNG state go on; gradient accumulators and momentum start
at zero (a conversion starts a new stage). The result trains on every path bit for bit like
any other model: its exponents are part of its schema and of its .tt file.
"""
from __future__ import annotations

import numpy as np

from tinytrain.fixedpoint import rshift_round
from tinytrain.graph.optim import sat_range


def _narrow(v: np.ndarray, shift: int, dtype) -> np.ndarray:
    """v * 2^-shift rounded (shift > 0) or v * 2^-shift exactly (shift <= 0), saturated."""
    v = v.astype(np.int64)
    v = rshift_round(v, shift) if shift > 0 else v << (-shift)
    lo, hi = sat_range(dtype)
    return np.clip(v, lo, hi).astype(dtype)


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
            if po.data.dtype == pn.data.dtype:
                pn.exp, pn.data[...] = po.exp, po.data
            else:  # the same range in another width: the exponent moves by the difference in bits
                d = 8 * (po.data.dtype.itemsize - pn.data.dtype.itemsize)
                pn.exp = po.exp + d
                pn.data[...] = _narrow(po.data, d, pn.data.dtype)
            key = (li, pi)
            if key in new.master:
                # master value at exponent pn.exp - shift, from the finest source the old model has
                src, src_exp = (model.master[key], model.master_exp(key)) if key in model.master else (po.data, po.exp)
                new.master[key][...] = _narrow(src, new.master_exp(key) - src_exp, new.master[key].dtype)
                new._refresh(li, pi)
    for key, mask in getattr(model, "masks", {}).items():  # pruning masks carry over
        if key in getattr(new, "masks", {}):
            new.masks[key][...] = mask
    new.meta[...] = model.meta
    new.meta[2] = 0  # no batch in progress: the accumulators start empty
    return new
