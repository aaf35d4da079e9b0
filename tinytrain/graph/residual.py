"""Residual block: y = x + f(x), with f a short stack of layers whose output shape equals its
input shape. The sum is the residual Add op (ops/add.py: both terms aligned to the larger
exponent, rounded, requantized to int8).

Backward: the block's output error e goes unchanged to the skip path and into f's backward;
the input error is the sum of the two, dx = add(e, ee, dx_f, edx_f) with the same Add rule.
The parameters of all inner layers belong to the block (in inner-layer order); their
gradients are all formed with the pre-update weights and applied after the block's backward,
in the reference, the simulator and the generated C alike.
"""
from __future__ import annotations

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, layer_config, layer_from_config, register
from tinytrain.graph.optable import Call, Op, register_op
from tinytrain.ops import add as r_add


@register
class Residual(Layer):
    kind = "residual"
    fields = {"layers": F.Field("a non-empty list of layers", lambda v: isinstance(v, list) and bool(v))}

    def __init__(self, layers):
        super().__init__()
        inner = [layer_from_config(l) if isinstance(l, dict) else l for l in layers]
        if not inner:
            raise ModelError("Residual needs at least one inner layer")
        for l in inner:
            if not isinstance(l, Layer) or isinstance(l, Residual):
                raise ModelError(f"Residual: {l!r} cannot be an inner layer")
        self.inner = inner

    def config(self):
        return {"layers": [layer_config(l) for l in self.inner]}

    def build(self, in_shape, rng):
        self.in_shape = tuple(in_shape)
        shape = self.in_shape
        for k, l in enumerate(self.inner):
            try:
                shape = l.build(shape, rng)
            except ModelError as exc:
                raise ModelError(f"inner layer {k} ({l.kind}): {exc}") from None
        if shape != self.in_shape:
            raise ModelError(f"the inner layers map {self.in_shape} to {shape}: a residual block must keep the shape")
        self.out_shape = shape
        self.params, self.offsets = [], []
        for k, l in enumerate(self.inner):
            self.offsets.append(len(self.params))
            for p in l.params:
                if not p.name.startswith(f"{k}_"):
                    p.name = f"{k}_{p.name}"
                self.params.append(p)
        return self.out_shape

    def macs(self):
        return sum(l.macs() for l in self.inner)


# ------------------------------------------------------------------ op table rows
def _res_forward(l, x, ex, train):
    a, ea, saved, nsat = x, ex, [], 0
    for inner in l.inner:
        a, ea, n, s = inner.ref_forward(a, ea, train)
        nsat += n
        saved.append(s)
    y, ey, n = r_add.forward(x.reshape(-1), ex, a.reshape(-1), ea)
    return y.reshape(l.out_shape), ey, nsat + n, saved


def _res_backward(l, e, ee, saved, need_dx):
    """Backward through f then the skip Add; the gradients of every inner layer in the block's
    parameter order. The first inner layer's input error is only needed for the block's own."""
    grads, nsat = {}, 0
    d, ed = e.reshape(l.out_shape), ee
    for k in range(len(l.inner) - 1, -1, -1):
        dx, edx, n, g = l.inner[k].ref_grads(d, ed, saved[k], k > 0 or need_dx)
        nsat += n
        grads.update(g)
        d, ed = dx, edx
    ordered = [grads[p.name] for p in l.params if p.trainable]
    if not need_dx:
        return None, 0, nsat, ordered
    dx, edx, n = r_add.forward(e.reshape(-1), ee, d.reshape(-1), ed)
    return dx.reshape(l.in_shape), edx, nsat + n, ordered


register_op(Op("add", nb_import="tinytrain.kernels.elementwise: add_fwd", c_header="tt_add.h",
               fwd=Call("add_fwd({a}, {ea}, {b}, {eb}, {y}, {stats})", "tt_add_fwd_s8({a}, {ea}, {b}, {eb}, {n}, {y}, {stats})")))
register_op(Op("residual", _res_forward, _res_backward, composite=True, join="add", args=lambda l: {"n": l.in_size}))
