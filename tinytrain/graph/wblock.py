"""Dense layers with block-exponent weights (precision ``"exponent": "row" | "block32"``, int8 or
int4 weights, int16 master): their parameters (built by layers.Dense) and their row in the op
table (registered when graph/model.py imports this module).

The layer's parameters are ``w`` (N, K) int8 holding the block values q (ops/wblock.py), at
the exponent ew of the int16 weights the same layer has under the default policy; ``b``
(N,) int32 at ew - 8, as under the default policy; and ``w_exp`` (N, nb) uint8, the blocks'
shifts, a state tensor (in the state hash, the state blob and .tt files; the optimizer does
not touch it: the narrowing from the master writes it, with q). The reference forward and
backward are ops/dense.py on the decoded weights q << s; numba and C compute on q and s.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from tinytrain.graph.optable import OPS, Call, register_op
from tinytrain.ops import dense as r_dense
from tinytrain.ops import wblock as r_wblock

#: the op-table row of a layer kind with block-exponent weights
BLOCKED = "{}:blocked"


def shifts_of(layer, name: str = "w"):
    """The shift tensor (Param) of weight ``name`` of a layer (a composite prefixes it: ``0_w``)."""
    return next(p for p in layer.params if p.name == name + "_exp")


def _decoded(l):
    w, s = l.params[0], l.params[2]
    return r_wblock.expand(w.data, s.data, l.policy.block_len(w.data.shape[1]))


def _forward(l, x, ex, train):
    w, b = l.params[0], l.params[1]
    y, ey, nsat = r_dense.forward(x, ex, _decoded(l), w.exp, b.data, b.exp)
    return y, ey, nsat, (x, ex)


def _backward(l, e, ee, saved, need_dx):
    x, ex = saved
    return r_dense.backward(e, ee, x, ex, _decoded(l), l.params[0].exp, need_dx)


def _max_product(l) -> int:
    qmax, smax = r_wblock.limits(l.policy.weight_bits)
    return 127 * (qmax << smax)


# the dense row (graph/layers.py) with the weights decoded: grad_exp and the grad's numba call as they are
register_op(replace(
    OPS["dense"], kind=BLOCKED.format("dense"), forward=_forward, backward=_backward,
    nb_import="tinytrain.kernels.wblock: dense_fwd_blk, dense_bwd_blk, dense_grad", c_header="tt_dense_wblk.h",
    args=lambda l: {"K": l.in_shape[0], "N": l.units, "L": l.policy.block_len(l.in_shape[0])},
    c_params=("dense", "tt_dense{wv}blk_params", {"K": "{K}", "N": "{N}", "L": "{L}", "w": "{w}", "ws": "{w_exp}",
                                                  "ew": "{exp_w}", "b": "{b}", "eb": "{exp_b}"}),
    fwd=Call("dense_fwd_blk({x}, {ex}, {w}, {w_exp}, {L}, {exp_w}, {b}, {exp_b}, {scratch:N}, {y}, {stats})",
             "tt_dense_fwd_s8{wv}blk(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call("dense_bwd_blk({e}, {ee}, {w}, {w_exp}, {L}, {exp_w}, {scratch:K}, {dx}, {stats})",
             "tt_dense_bwd_s8{wv}blk(&CTX, {params}, {e}, {ee}, {dx})"),
    grad=replace(OPS["dense"].grad, c="tt_dense_grad_s32{wv}blk({params}, {e}, {x}, {g_w}, {g_b})"),
    # the decoded weights are within +-32767: the int16 bounds of ops/dense.py, the C's int32 limits
    bounds=lambda l: [("forward sum", l.in_shape[0] * _max_product(l) + 2**30,
                       32 if l.in_shape[0] * 127 * 32767 + 2**30 < 2**31 else 64),
                      ("input-error sum", l.units * _max_product(l), 32 if l.units * 127 * 32767 < 2**31 else 64),
                      ("weight gradient", 127 * 127, 32)]))
