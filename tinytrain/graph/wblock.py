"""Dense layers with block-exponent weights (precision ``"exponent": "row" | "block32"``, int8 or
int4 weights, int16 master): their parameters and their row in the op table.

The layer's parameters are ``w`` (N, K) int8 holding the block values q (ops/wblock.py), at
the exponent ew of the int16 weights the same layer has under the default policy; ``b``
(N,) int32 at ew - 8, as under the default policy; and ``w_exp`` (N, nb) uint8, the blocks'
shifts, a state tensor (in the state hash, the state blob and .tt files; the optimizer does
not touch it: the narrowing from the master writes it, with q). The reference forward and
backward are ops/dense.py on the decoded weights q << s; numba and C compute on q and s.
"""
from __future__ import annotations

import numpy as np

from tinytrain.graph.optable import Call, Op, register_op
from tinytrain.ops import dense as r_dense
from tinytrain.ops import wblock as r_wblock

#: the op-table row of a layer kind with block-exponent weights
BLOCKED = "{}:blocked"


def dense_params(layer, w16: np.ndarray, ew: int):
    """[w, b, w_exp] of a Dense layer under a block-exponent policy, from its int16 weights."""
    from tinytrain.graph.layers import Param

    pol = layer.policy
    q, s = r_wblock.narrow(w16, pol.block_len(w16.shape[1]), pol.weight_bits)
    return [Param("w", q, ew, "weight"), Param("b", np.zeros(w16.shape[0], np.int32), ew - 8, "bias"),
            Param("w_exp", s, 0, "state")]


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


register_op(Op(
    BLOCKED.format("dense"), _forward, _backward,
    nb_import="tinytrain.kernels.wblock: dense_fwd_blk, dense_bwd_blk, dense_grad",
    c_header="tt_dense_wblk.h",
    args=lambda l: {"K": l.in_shape[0], "N": l.units, "L": l.policy.block_len(l.in_shape[0])},
    c_params=("dense", "tt_dense{wv}blk_params", {"K": "{K}", "N": "{N}", "L": "{L}", "w": "{w}", "ws": "{w_exp}",
                                                  "ew": "{exp_w}", "b": "{b}", "eb": "{exp_b}"}),
    fwd=Call("dense_fwd_blk({x}, {ex}, {w}, {w_exp}, {L}, {exp_w}, {b}, {exp_b}, {scratch:N}, {y}, {stats})",
             "tt_dense_fwd_s8{wv}blk(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call("dense_bwd_blk({e}, {ee}, {w}, {w_exp}, {L}, {exp_w}, {scratch:K}, {dx}, {stats})",
             "tt_dense_bwd_s8{wv}blk(&CTX, {params}, {e}, {ee}, {dx})"),
    grad=Call("dense_grad({e}, {x}, {g_w}, {g_b})", "tt_dense_grad_s32{wv}blk({params}, {e}, {x}, {g_w}, {g_b})"),
    grad_exp={"w": "{ee} + {ex}", "b": "{ee}"},
    # the decoded weights are within +-32767: the int16 bounds of ops/dense.py, the C's int32 limits
    bounds=lambda l: [("forward sum", l.in_shape[0] * _max_product(l) + 2**30,
                       32 if l.in_shape[0] * 127 * 32767 + 2**30 < 2**31 else 64),
                      ("input-error sum", l.units * _max_product(l), 32 if l.units * 127 * 32767 < 2**31 else 64),
                      ("weight gradient", 127 * 127, 32)]))
