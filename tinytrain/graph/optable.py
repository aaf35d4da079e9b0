"""The op table: every op described once, rendered for the numba simulator and for C.

A row (:class:`Op`) holds what a layer type computes and what it needs:

- ``forward`` / ``backward``: the numpy reference the model runs (``Sequential.ref_train_step``),
  built on the op's file in ``tinytrain/ops/``;
- ``nb_import``: the numba twin's module in ``tinytrain/kernels/`` and the names it provides;
  ``c_header``: the C twin's header in ``firmware/include/``;
- ``fwd``, ``bwd``, ``grad`` (and ``fwd_eval`` where prediction is another call): one
  :class:`Call` each, the numba and the C spelling of the same call, written with named
  placeholders; ``c_params``: the C kernels' params struct (named fields: dims, tensors,
  exponents), emitted ``static const`` once per layer and passed as ``{params}``;
- ``args``: the named constants of the op (dims and params), computed from the layer at build
  time; ``grad_exp``: the exponent of each parameter gradient; ``buffers``: what the op keeps
  from forward to backward; ``scratch``: the int64 scratch words it needs; ``bounds``: its
  accumulators' worst cases against their widths.

Placeholders in a call: ``{x} {ex} {y} {ey}`` (input, its exponent, output, its exponent),
``{e} {ee} {dx} {edx}`` (output error, its exponent, input error, its exponent), a parameter
by name (``{w}``), its exponent (``{exp_w}``), its gradient (``{g_w}``), a buffer by name
(``{saved}``), every name of ``args``, and ``{scratch}``, ``{stats}``, ``{train}`` (whether the
forward is a training step or a prediction), ``{wv}`` (the C suffix of the weights' width under
the precision policy: "" for int16, "_w8" for int8, "_w4" for int4; also in ``c_params``'
type). A layer with block exponents (graph/wblock.py) has the row ``<kind>:blocked``. A tensor's
format spec gives its shape to the numba spelling (``{x:in}``: the input shape, ``{y:out}``,
``{e:out}``, ``{dx:in}``, ``{x:pc}``: positions x channels); C is flat, the spec is ignored.
``{scratch:N}`` is the first ``args["N"]`` words of the scratch buffer.

A composite row (``composite=True``: Residual) has no calls of its own: :func:`forward_lines` and
:func:`backward_lines` walk its inner layers with the same rows and join the skip path with the
row named by ``join``. The renderers (``tinytrain.sim.simulator``, ``tinytrain.codegen.emit``)
supply the names of the buffers (:class:`Names`) and walk the model; nothing here is
target-specific beyond the two spellings of each call.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class Call:
    """One kernel call, spelled for numba (``nb``) and for C (``c``)."""

    nb: str
    c: str


@dataclass(frozen=True)
class Buffer:
    """A buffer an op keeps from forward to backward (its shape from the layer)."""

    name: str
    shape: Callable
    dtype: type = np.int32
    role: str = "activation"
    c_count: Callable | None = None   # elements in C, where it keeps more (default: the shape's)


@dataclass(frozen=True)
class Op:
    kind: str
    forward: Callable | None = None        # (layer, x, ex, train) -> (y, ey, nsat, saved)
    backward: Callable | None = None       # (layer, e, ee, saved, need_dx) -> (dx, edx, nsat, [grads])
    nb_import: str = ""                    # "tinytrain.kernels.dense: dense_fwd, dense_bwd"
    c_header: str = ""                     # "tt_dense.h"
    c_header_w8: str = ""                  # where the int8-weight kernels are, if not in c_header
    fwd: Call | None = None
    bwd: Call | None = None                # the input error (when it is needed)
    grad: Call | None = None               # the parameter gradients (when the layer learns)
    fwd_eval: Call | None = None           # prediction, where it is another call than training
    #: the gradients right after bwd of the same e and x, where a target has a cheaper call for
    #: that (an empty spelling: that target calls grad)
    grad_after_bwd: Call | None = None
    #: C: the layer's ``static const`` params struct, (tag, C type, {field: template}); the C
    #: calls name it ``{params}`` (its address)
    c_params: tuple | None = None
    args: Callable = lambda l: {}          # named dims and params
    grad_exp: dict = field(default_factory=dict)   # parameter name -> exponent expression
    buffers: tuple = ()
    scratch: Callable | None = None        # int64 words; default max(in_size, out_size)
    #: worst-case accumulators: (layer) -> [(what, bound on |acc|, width in bits)], as the op's
    #: docstring proves them (the fixed-point report shows them against their widths)
    bounds: Callable = lambda l: []
    composite: bool = False
    join: str = ""                         # composite: the row joining the skip path (add)


OPS: dict[str, Op] = {}


def register_op(op: Op) -> Op:
    OPS[op.kind] = op
    return op


def op_for(layer) -> Op:
    pol = getattr(layer, "policy", None)
    if pol is not None and pol.blocked and f"{layer.kind}:blocked" in OPS:
        return OPS[f"{layer.kind}:blocked"]  # block-exponent weights (graph/wblock.py)
    if pol is not None and pol.a16 and f"{layer.kind}:a16" in OPS:
        return OPS[f"{layer.kind}:a16"]  # int16 activations and errors (graph/act16.py)
    try:
        return OPS[layer.kind]
    except KeyError:
        raise KeyError(f"layer type {layer.kind!r} has no row in the op table") from None


def scratch_words(layer) -> int:
    """int64 words of scratch a layer's kernels use, and after them (C) the widened copy of an
    int16 bias (bias16_words)."""
    op = OPS.get(layer.kind)
    if op is not None and op.composite:
        return max([layer.in_size] + [scratch_words(l) for l in layer.inner])
    if op is not None and op.scratch is not None:
        own = int(op.scratch(layer))
    else:
        own = max(layer.in_size, layer.out_size)
    return max(own, layer.out_size + bias16_words(layer)) if bias16(layer) else own


def bias16(layer):
    """(index, Param) of a layer's int16 bias (policy "bias": "int16"), or None."""
    return next(((j, p) for j, p in enumerate(layer.params) if p.role == "bias" and p.data.dtype == np.int16), None)


def bias16_words(layer) -> int:
    """int64 scratch words holding an int16 bias widened to int32 for the C kernels, whose params
    hold an int32 bias: the forward widens it (tt_widen_s16_s32) just past the out_size words
    the forward kernels of dense and conv layers use (their accumulators; the backward's larger
    use comes after the forward has read the bias), so the kernels are those of an int32 bias
    and the sum is the same."""
    b = bias16(layer)
    return (b[1].data.size + 1) // 2 if b else 0


def buffers(layer, backward=True, target="nb") -> list[tuple[str, tuple, type, str]]:
    """(name, shape, dtype, role) of the buffers a layer's op keeps, composites included:
    the inner outputs, the inner errors (backward only; the last inner layer reads the block's
    own error), f's input error (backward only) and each inner op's buffers (``k_<name>``).
    For ``target="c"`` a buffer's shape is its C element count where the row gives one."""
    op = op_for(layer)
    if not op.composite:
        return [(b.name, (int(b.c_count(layer)),) if target == "c" and b.c_count else tuple(b.shape(layer)),
                 b.dtype, b.role) for b in op.buffers]
    out, n = [], len(layer.inner)
    for k, l in enumerate(layer.inner):
        out.append((f"{k}_out", (l.out_size,), np.int8, "activation"))
        if backward and k < n - 1:
            out.append((f"{k}_err", (l.out_size,), np.int8, "error"))
        out += [(f"{k}_{name}", shape, dt, role) for name, shape, dt, role in buffers(l, backward, target)]
    if backward:
        out.append(("fdx", (layer.in_size,), np.int8, "error"))
    return out


def exp_vars(layer, li, backward=True) -> list[str]:
    """Exponent variables a composite's walk uses (the renderer declares them)."""
    if not op_for(layer).composite:
        return []
    n = len(layer.inner)
    return [f"rx{li}_{k}" for k in range(1, n + 1)] + ([f"rd{li}_{k}" for k in range(n)] if backward else [])


def headers(layer) -> set[str]:
    op = op_for(layer)
    if op.composite:
        return {OPS[op.join].c_header}.union(*(headers(l) for l in layer.inner))
    return {op.c_header} | ({op.c_header_w8} if op.c_header_w8 and weight_variant(layer) == "_w8" else set())


def imports(layer) -> set[str]:
    """numba import lines for a layer's kernels."""
    op = op_for(layer)
    if op.composite:
        return {_import_line(OPS[op.join])}.union(*(imports(l) for l in layer.inner))
    return {_import_line(op)}


def _import_line(op: Op) -> str:
    mod, _, names = op.nb_import.partition(":")
    return f"from {mod.strip()} import {names.strip()}"


# ------------------------------------------------------------------- the walk
class Names:
    """A renderer's spelling of the model's buffers and statements. Subclassed by the numba
    and the C renderer; ``li`` is the layer's index in the model, ``pi`` a parameter's index in
    the layer (a composite's inner parameters are numbered through the block)."""

    target = ""            # "nb" or "c"

    def param(self, li, pi) -> str: ...
    def grad(self, li, pi) -> str: ...
    def grad_exp(self, li, pi) -> str: ...
    def buf(self, li, name) -> str: ...
    def learns(self, li, pis) -> bool: ...
    def stmt(self, s) -> str: ...
    def scratch(self, words) -> str: ...
    def decl(self, li, tag, ctype, fields) -> str: ...  # C: declare a params struct, its address
    stats = ""

    def unused(self, names) -> list[str]:
        return []


class _T:
    """A tensor expression with its shape, formatted per target (numba reshapes, C is flat)."""

    def __init__(self, expr, shapes, target):
        self.expr, self.shapes, self.target = expr, shapes, target

    def __format__(self, spec):
        if not spec or self.target != "nb":
            return self.expr
        return f"{self.expr}.reshape({tuple(int(s) for s in self.shapes[spec])})"


class _Scratch:
    def __init__(self, names, args):
        self.names, self.args = names, args

    def __format__(self, spec):
        return self.names.scratch(int(self.args[spec]) if spec else None)


class _Bool:
    def __init__(self, v, target):
        self.v, self.target = bool(v), target

    def __format__(self, spec):
        return str(self.v) if self.target == "nb" else str(int(self.v))


def fill(layer, names: Names, li, tensors, offset=0, train=True) -> dict:
    """The mapping a row's templates are formatted with (for a renderer that spells a call of
    its own for the layer: its ``{params}``, ``{wv}``, tensors and args)."""
    return _fill(layer, names, li, offset, tensors, train)


def _fill(layer, names: Names, li, offset, tensors, train=True) -> dict:
    """The mapping a row's templates are formatted with."""
    t = names.target
    shapes = {"in": layer.in_shape, "out": layer.out_shape}
    if len(layer.in_shape) >= 2:
        shapes["pc"] = (int(np.prod(layer.in_shape[:-1])), layer.in_shape[-1])
    op = op_for(layer)
    args = dict(op.args(layer))
    m = dict(args)
    for k, v in tensors.items():
        m[k] = _T(v, shapes, t) if k in ("x", "y", "e", "dx") else v
    prefix = tensors.get("_bufprefix", "")
    for j, p in enumerate(layer.params):
        name = _base(p.name, prefix)
        m[name] = _T(names.param(li, offset + j), shapes, t)
        m[f"exp_{name}"] = str(p.exp)
        m[f"g_{name}"] = names.grad(li, offset + j)
        m[f"ge_{name}"] = names.grad_exp(li, offset + j)
    for b in op.buffers:
        m[b.name] = names.buf(li, f"{prefix}{b.name}")
    b16 = bias16(layer) if t == "c" else None
    if b16:  # the C kernels read the widened copy (bias16_words)
        m[_base(b16[1].name, prefix)] = f"((int32_t *)({names.scratch(None)} + {layer.out_size}))"
        m["_widen"] = f"tt_widen_s16_s32({names.param(li, offset + b16[0])}, {b16[1].data.size}, {m[_base(b16[1].name, prefix)]})"
    m["wv"] = weight_variant(layer)
    m["scratch"] = _Scratch(names, args)
    m["stats"] = names.stats
    m["train"] = _Bool(train, t)
    if t == "c" and op.c_params is not None:
        tag, ctype, fields = op.c_params
        m["params"] = names.decl(li, f"{prefix}{tag}", ctype.format_map(m), {k: v.format_map(m) for k, v in fields.items()})
    return m


#: C suffix of the kernels and params struct of a layer's weight width (precision policy)
WEIGHT_VARIANTS = {np.dtype(np.int16): "", np.dtype(np.int8): "_w8"}


def weight_variant(layer) -> str:
    """``{wv}``: "" for int16 weights (and layers without weights), "_w8" for int8 weights."""
    w = next((p for p in layer.params if p.role == "weight"), None)
    if w is not None and layer.policy.weights == "int4":
        return "_w4"  # packed two per byte in C (only with block exponents: graph/wblock.py)
    return WEIGHT_VARIANTS.get(w.data.dtype, "") if w is not None else ""


def _base(name, prefix):
    """A parameter's name in its row: a composite prefixes its inner parameters (``0_w``)."""
    return name[len(prefix):] if prefix and name.startswith(prefix) else name


def _call(call: Call, names: Names, mapping) -> str:
    return (call.nb if names.target == "nb" else call.c).format_map(mapping)


def forward_lines(layer, names: Names, li, x, ex, y, ey, train=True, offset=0, prefix="") -> list[str]:
    """Statements computing ``y`` (exponent variable ``ey``) from ``x`` (``ex``)."""
    op = op_for(layer)
    if op.composite:
        return _composite_forward(layer, op, names, li, x, ex, y, ey, train)
    m = _fill(layer, names, li, offset, {"x": x, "ex": ex, "y": y, "ey": ey, "_bufprefix": prefix}, train)
    call = op.fwd
    if not train and op.fwd_eval is not None and (op.fwd_eval.nb if names.target == "nb" else op.fwd_eval.c):
        call = op.fwd_eval  # an empty spelling: that target predicts with the training call
    return ([names.stmt(m["_widen"])] if "_widen" in m else []) + [names.stmt(f"{ey} = {_call(call, names, m)}")]


def backward_lines(layer, names: Names, li, x, ex, y, e, ee, dx=None, edx=None, offset=0, prefix="",
                   grads=True) -> list[str]:
    """Statements computing the input error ``dx`` (when given) and, when the layer learns
    (and ``grads``: a renderer may fuse the gradient into the update), its parameter gradients
    and their exponents."""
    op = op_for(layer)
    if op.composite:
        return _composite_backward(layer, op, names, li, x, ex, y, e, ee, dx, edx)
    m = _fill(layer, names, li, offset, {"x": x, "ex": ex, "y": y, "ey": "", "e": e, "ee": ee,
                                         "dx": dx or "", "edx": edx or "", "_bufprefix": prefix})
    out = []
    pis = [offset + j for j, p in enumerate(layer.params) if p.trainable]
    if dx and op.bwd is not None:
        out.append(names.stmt(f"{edx} = {_call(op.bwd, names, m)}"))
    if grads and op.grad is not None and pis and names.learns(li, pis):
        call = op.grad
        after = op.grad_after_bwd
        if dx and op.bwd is not None and after is not None and (after.nb if names.target == "nb" else after.c):
            call = after
        out.append(names.stmt(_call(call, names, m)))
        for j, p in enumerate(layer.params):
            name = _base(p.name, prefix)
            if name in op.grad_exp:
                out.append(names.stmt(f"{m[f'ge_{name}']} = {op.grad_exp[name].format_map(m)}"))
    return out


def _composite_forward(layer, op, names, li, x, ex, y, ey, train):
    n, lines = len(layer.inner), []
    for k, l in enumerate(layer.inner):
        xk, exk = (x, ex) if k == 0 else (names.buf(li, f"{k - 1}_out"), f"rx{li}_{k}")
        lines += forward_lines(l, names, li, xk, exk, names.buf(li, f"{k}_out"), f"rx{li}_{k + 1}", train,
                               layer.offsets[k], f"{k}_")
    join = OPS[op.join]
    m = _fill(layer, names, li, 0, {"a": x, "ea": ex, "b": names.buf(li, f"{n - 1}_out"), "eb": f"rx{li}_{n}",
                                    "y": y, "ey": ey})
    return lines + [names.stmt(f"{ey} = {_call(join.fwd, names, m)}")]


def _composite_backward(layer, op, names, li, x, ex, y, e, ee, dx, edx):
    """Backward through f (inner layers, last to first), then the skip Add; the first inner
    layer computes an input error only when the block's input error is needed."""
    n, lines = len(layer.inner), []
    d, ed = e, ee
    for k in range(n - 1, -1, -1):
        l = layer.inner[k]
        xk, exk = (x, ex) if k == 0 else (names.buf(li, f"{k - 1}_out"), f"rx{li}_{k}")
        dk = edk = None
        if k > 0 or dx:
            dk, edk = (names.buf(li, f"{k - 1}_err") if k > 0 else names.buf(li, "fdx")), f"rd{li}_{k}"
        lines += backward_lines(l, names, li, xk, exk, names.buf(li, f"{k}_out"), d, ed, dk, edk,
                                layer.offsets[k], f"{k}_")
        d, ed = dk, edk
    if not dx:
        # no input error: the inner input-error exponents and f's input error stay unread
        return lines + names.unused([f"rd{li}_{k}" for k in range(n)] + [names.buf(li, "fdx")])
    join = OPS[op.join]
    m = _fill(layer, names, li, 0, {"a": e, "ea": ee, "b": names.buf(li, "fdx"), "eb": ed, "y": dx, "ey": edx})
    return lines + [names.stmt(f"{edx} = {_call(join.fwd, names, m)}")]
