"""Structured pruning: whole output units of a layer -- the neurons of a dense layer, the
channels (filters) of a convolution -- pruned inside the integer training, then deleted by
:func:`tinytrain.graph.convert.shrink`. The reference (the specification; numba twins
``prune_group_norms`` / ``prune_group_mask_from`` in ``tinytrain/kernels/prune.py``, C twin
``firmware/src/tt_prune_group.c``).

``"structure"`` of a prune object: ``"neurons"`` (dense layers) or ``"channels"`` / ``"filters"``
(the same thing: the output channels of conv1d and conv2d layers). Unit u of a layer is row u
of its weight tensor (dense ``w (N, K)``: output neuron u; conv ``w (F, ..., C)``: filter u) and
its bias ``b[u]``.

**What is pruned with a unit**, so that the unit's output is exactly zero downstream: its weight
row and bias, and the ``gamma[u]``, ``beta[u]`` of every batch norm between the layer and the
next dense or convolution layer (the *consumer*; with gamma = beta = 0 a batch norm outputs 0
whatever its statistics, train or eval). The running statistics are state, not masked: they
are deleted with the channel by ``shrink``. The masks are the element bitmaps of
``graph/prune.py`` (one per tensor, in the state and hashed); every optimizer touch of one of
these tensors is followed by ``apply`` as in the unstructured mode.

**Which layers**: a dense or convolution layer (the structure's kind) whose output reaches a
consumer through layers that keep channels apart (ReLU, LeakyReLU, batch norm, max/average
pooling, global average pooling, Flatten). Refused (a layer's own prune object) or skipped
(the model's): the last such layer (its units are the model's outputs), a layer followed by a
residual block or a depthwise convolution (the add and the depthwise filter couple the
channels: not handled), residual blocks themselves, frozen layers, and a layer whose bias or
batch-norm parameters do not learn (they could not be held at zero).

**Criterion** (integers only): the k units with the smallest (L1, unit index), L1 = sum over
the unit's row of |v|, v the update's store (the int32 master where there is one): with
``"criterion": "l1"`` (the default) the row of the layer's weights; with ``"gamma"`` the
|gamma[u]| of the first batch norm after the layer (Liu et al.'s network slimming: a batch norm
normalizes away the scale of the filter before it, so its gamma, not the filter's norm, is the
channel's output scale; refused on a layer without one). L1, not L2:
the sum of |v| of a row is exact in 64 bits (|v| <= 2^31, rows below 2^31 elements), a sum of
squares of int32 values is not. Scope ``"layer"``: k = round(s * units of the layer), at most
units - 1 (a layer keeps one unit). ``"global"``: all the covered layers ranked together by
their rows' *mean* real magnitude, (L1 * lcm / inner) << (e_t - e_min) (inner the row length,
lcm that of all the rows, e_t the store's exponent; exact, refused when the worst case reaches
2^63), ties by (tensor, unit); k = round(s * their units); a layer may lose every unit (then
``shrink`` refuses it: lower the sparsity or use scope "layer").
"""
from __future__ import annotations

import math

import numpy as np

from tinytrain.graph import prune_base as P

#: layers between a pruned layer and its consumer that keep channels apart
PASS_THROUGH = ("relu", "leaky_relu", "batchnorm", "maxpool1d", "maxpool2d", "avgpool2d", "global_avgpool", "flatten")
#: layers whose input slice of a pruned unit shrink deletes
CONSUMERS = ("dense", "conv1d", "conv2d")


def chain(model, li):
    """(companion keys, consumer layer index) of layer li's units, or (None, why not)."""
    comp = []
    for j in range(li + 1, len(model.layers)):
        kind = model.layers[j].kind
        if kind == "batchnorm":
            comp += [(j, 0), (j, 1)]  # gamma, beta
        elif kind in CONSUMERS:
            return comp, j
        elif kind not in PASS_THROUGH:
            return None, (f"layer {j} ({kind}) after it couples the channels (an add or a depthwise filter), "
                          "which structured pruning does not handle")
    return None, "its units are the model's outputs (no dense or convolution layer after it)"


def layer_unit(model, li, cfg, own: bool, groups: dict):
    """The keys layer li prunes as units ([w, b, gamma, beta, ...]) and their entries in
    ``groups`` (key -> (units, elements per unit, ranked key, 1)); None when the model's prune
    object skips the layer. ``own``: the layer's own prune object (refuse instead of skip)."""
    l = model.layers[li]
    where = f"layer {li} ({l.kind}): prune"

    def refuse(msg):
        if own:
            raise P.PruneError(f"{where}: {msg}")
        return None

    if cfg.structure == "blocks" and l.kind == "dense":
        if not model.learns(li, 0):
            return refuse("the layer is frozen (train=...): its weights are constants in flash and cannot be pruned "
                          "while training")
        n_out, k_in = l.params[0].data.shape
        groups[(li, 0)] = (n_out * -(-k_in // P.BLOCK), P.BLOCK, (li, 0), 1, k_in)
        return [(li, 0)]

    if l.kind not in P.STRUCTURES[cfg.structure]:
        if l.kind == "residual":
            return refuse(f'structure "{cfg.structure}" does not prune inside residual blocks (the add couples '
                          'the channels of its input and output); use structure "weights"')
        kinds = " and ".join(P.STRUCTURES[cfg.structure])
        fit = {"dense": "neurons", "conv1d": "channels", "conv2d": "channels"}.get(l.kind, "weights")
        return refuse(f'structure "{cfg.structure}" prunes {kinds} layers; for this layer use "{fit}"')
    comp, why = chain(model, li)
    if comp is None:
        return refuse(f'structure "{cfg.structure}": this layer cannot shrink: {why}')
    keys = [(li, 0), (li, 1)] + comp
    if not model.learns(li, 0):
        return refuse("the layer is frozen (train=...): its weights are constants in flash and cannot be pruned "
                      "while training")
    frozen = [k for k in keys if not model.learns(*k)]
    if frozen:
        j, pi = frozen[0]
        return refuse(f"layer {j} ({model.layers[j].kind}) {model.layers[j].params[pi].name} does not learn: a pruned "
                      "unit is zeroed there too; train it as well (train=...) or use structure \"weights\"")
    w = l.params[0].data
    n_units = w.shape[0]
    lead = (li, 0)
    if cfg.criterion == "gamma":
        if not comp:
            return refuse('criterion "gamma" ranks the channels by the batch norm after the layer, and this layer '
                          'has none before its consumer; use criterion "l1"')
        lead = comp[0]
    for k in keys:
        inner = w.size // n_units if k == (li, 0) else 1
        groups[k] = (n_units, inner, lead, 1, inner)
    return keys


def check_covers(model, groups) -> None:
    """A model's structured prune object that prunes no layer is a mistake: refuse it with the
    reason of its first candidate layer (or say there is none)."""
    cfg = model.prune
    mine = [li for li, l in enumerate(model.layers) if P.layer_prune(l) is None]
    if any(k[0] in mine for k in groups):
        return
    for li in mine:
        if model.layers[li].kind in P.STRUCTURES[cfg.structure]:
            layer_unit(model, li, cfg, True, {})  # raises its reason
    raise P.PruneError(f'prune: structure "{cfg.structure}" prunes {" and ".join(P.STRUCTURES[cfg.structure])} '
                       "layers, and this model has none it covers")


def scales(model, unit, groups) -> tuple[list[int], list[int]]:
    """Per key of a structured unit: (left shift, multiplier) of its rows' L1 norms. Ranked
    together (scope "global"), the layers' norms are put on one scale: the shift onto the
    smallest exponent of the ranked stores, and the multiplier lcm(inner) / inner so that rows
    of different lengths compare by their mean magnitude (exact: no division); alone, (0, 1).
    The tensors that follow a layer's units get (0, 1). The worst case stays below 2^63."""
    ranked = [k for k in unit if groups[k][2] == k]
    exps = {k: (model.master_exp(k) if k in model.master else model.layers[k[0]].params[k[1]].exp) for k in ranked}
    e_min = min(exps.values())
    lcm = math.lcm(*(groups[k][1] for k in ranked))
    shifts, mults = [], []
    for k in unit:
        if groups[k][2] != k:
            shifts.append(0)
            mults.append(1)
            continue
        sh, mult = exps[k] - e_min, lcm // groups[k][1]
        store = model.master.get(k, model.layers[k[0]].params[k[1]].data)
        worst = lcm * (1 << (8 * store.dtype.itemsize - 1))  # inner * mult * max|v|
        if worst.bit_length() + sh > 63:
            raise P.PruneError(f'prune: scope = "global": the units of these layers cannot be ranked exactly together '
                               f'in 64 bits (exponents {sh} bits apart, rows of {lcm} elements in common); use '
                               'scope "layer"')
        shifts.append(sh)
        mults.append(mult)
    return shifts, mults


def unit_of(n: int, inner: int, row: int) -> np.ndarray:
    """The unit of each of n elements: rows of `row` elements, each cut into units of `inner`
    (the last of a row shorter when inner does not divide row)."""
    i = np.arange(int(n))
    return (i // row) * -(-row // inner) + (i % row) // inner


def norms(store, n_units: int, shift: int = 0, mult: int = 1, inner: int | None = None,
          row: int | None = None) -> np.ndarray:
    """int64 (L1 norm * mult) << shift of each unit of a store (exact: see :func:`scales`); the
    units are its rows, or (inner, row given) :func:`unit_of`'s."""
    v = np.abs(np.asarray(store).astype(np.int64)).reshape(-1)
    if row is None:
        return (v.reshape(n_units, -1).sum(axis=1) * int(mult)) << int(shift)
    bpr = -(-row // inner)
    pad = np.zeros((v.size // row, bpr * inner), np.int64)
    pad[:, :row] = v.reshape(-1, row)
    return (pad.reshape(-1, inner).sum(axis=1) * int(mult)) << int(shift)


def select_units(stores, n_units, shifts, mults, k: int, cuts=None) -> list[np.ndarray]:
    """Bool (units,) per ranked store: the k units of all of them with the smallest
    ((L1 * mult) << shift, store position, unit index); cuts: per store (inner, row) of
    :func:`norms` (None: its units are its rows)."""
    cuts = cuts or [(None, None)] * len(stores)
    all_norms = np.concatenate([norms(v, g, s, m, *c) for v, g, s, m, c in zip(stores, n_units, shifts, mults, cuts)])
    order = np.lexsort((np.arange(all_norms.size), all_norms))
    pruned = np.zeros(all_norms.size, bool)
    pruned[order[:int(k)]] = True
    out, off = [], 0
    for g in n_units:
        out.append(pruned[off:off + g])
        off += g
    return out


def select_unit(model, tab, u: int, k: int) -> list[np.ndarray]:
    """The masks (bitmaps) of every tensor of structured unit u of the table, pruning k units."""
    a, b = tab.units[u]
    ranked = [j for j in range(a, b) if tab.groups[j][2] == j]
    sel = select_units([model._store(*tab.keys[j])[0] for j in ranked], [tab.groups[j][0] for j in ranked],
                       [tab.shifts[j] for j in ranked], [tab.groups[j][3] for j in ranked], k,
                       [(tab.groups[j][1], tab.groups[j][4]) for j in ranked])
    by_lead = dict(zip(ranked, sel))
    out = []
    for j in range(a, b):
        li, pi = tab.keys[j]
        _, inner, lead, _, row = tab.groups[j]
        out.append(P.pack(by_lead[lead][unit_of(model.layers[li].params[pi].data.size, inner, row)]))
    return out


def pruned_by_blocks(model, li) -> bool:
    """Whether layer li is pruned by 1 x 4 blocks (structure "blocks"): its groups are blocks,
    not units. Its table entry cannot tell: a row of K = 4 inputs is one block, the same
    (units, elements per unit, row length) as a neuron of 4 inputs."""
    cfg = P.layer_prune(model.layers[li]) or model.prune
    return cfg is not None and cfg.structure == "blocks"


def pruned_units(model) -> dict:
    """Per layer index with pruned units (neurons, channels): the bool (units,) of its pruned
    ones (from the mask of its weights). Layers pruned by blocks have none: a block removes no
    output, even when it is a whole row (K <= 4) -- the row's output is then its bias."""
    tab = model.prune_table
    out = {}
    if tab is None:
        return out
    for j, (li, pi) in enumerate(tab.keys):
        g = tab.groups[j]
        if g is not None and pi == 0 and not pruned_by_blocks(model, li) \
                and model.layers[li].kind in P.STRUCTURES["neurons"] + P.STRUCTURES["channels"]:
            n_units, inner = g[:2]
            out[li] = P.unpack(model.masks[(li, pi)], n_units * inner).reshape(n_units, inner)[:, 0].copy()
    return out
