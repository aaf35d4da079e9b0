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

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, layer_from_config, register
from tinytrain.ops import add as r_add


class _Inner:
    """Names of an inner layer's buffers, derived from the block's context (numba or C)."""

    def __init__(self, outer, layer, k, offset, bufs, names):
        self.outer, self.layer, self.k, self.offset = outer, layer, k, offset
        self._bufs = bufs
        self.x, self.ex, self.y, self.ey = names["x"], names["ex"], names["y"], names["ey"]
        self.e = self.ee = self.dx = self.edx = None
        self.train = getattr(outer, "train", True)

    def p(self, j):
        return self.outer.p(self.offset + j)

    def pe(self, j):
        return str(self.layer.params[j].exp)

    def g(self, j):
        return self.outer.g(self.offset + j)

    @property
    def grads(self) -> bool:  # C: whether this inner layer learns (see codegen.emit._C.grads)
        m, li = self.outer.em.model, self.outer.li
        return any(m.learns(li, self.offset + j) for j in range(len(self.layer.params)))

    def geo(self, j):
        return self.outer.geo(self.offset + j)

    def buf(self, j):
        return self._bufs[j]

    def saved(self):  # C: per-layer saved buffer (batch norm)
        return self._bufs[0]

    def decl(self, tag, ctype, **fields):  # C: this inner layer's params struct (codegen.emit._C.decl)
        return self.outer.decl(f"{self.k}_{tag}", ctype, **fields)


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
        return {"layers": [{"type": l.kind, **l.config()} for l in self.inner]}

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

    # ------------------------------------------------------------ reference
    def ref_forward(self, x, ex, train):
        a, ea, saved, nsat = x, ex, [], 0
        for l in self.inner:
            a, ea, n, s = l.ref_forward(a, ea, train)
            nsat += n
            saved.append(s)
        y, ey, n = r_add.forward(x.reshape(-1), ex, a.reshape(-1), ea)
        return y.reshape(self.out_shape), ey, nsat + n, saved

    def ref_grads(self, e, ee, saved, need_dx):
        """Backward through f then the skip Add; the gradients of every inner layer, keyed by
        the block's parameter names (``k_<name>``, unique in the block)."""
        grads, nsat = {}, 0
        d, ed = e.reshape(self.out_shape), ee
        for k in range(len(self.inner) - 1, -1, -1):
            # the first inner layer's input error is only needed for the block's own input error
            dx, edx, n, g = self.inner[k].ref_grads(d, ed, saved[k], k > 0 or need_dx)
            nsat += n
            grads.update(g)
            d, ed = dx, edx
        if not need_dx:
            return None, 0, nsat, grads
        dx, edx, n = r_add.forward(e.reshape(-1), ee, d.reshape(-1), ed)
        return dx.reshape(self.in_shape), edx, nsat + n, grads

    # ------------------------------------------------- numba (sim.py) emitters
    @property
    def nb_imports(self):
        out = ["from tinytrain.kernels.elementwise import add_fwd"]
        for l in self.inner:
            out += l.nb_imports
        return out

    def nb_buffers(self):
        out = [((l.out_size,), np.int8) for l in self.inner]          # inner outputs
        out += [((l.out_size,), np.int8) for l in self.inner]         # inner output errors
        out += [((self.in_size,), np.int8)]                            # f's input error
        for l in self.inner:
            out += list(getattr(l, "nb_buffers", lambda: [])())
        return out

    def _layout(self, c, numba):
        n = len(self.inner)
        if numba:
            outs = [c.buf(k) for k in range(n)]
            errs = [c.buf(n + k) for k in range(n)]
            fdx = c.buf(2 * n)
            extra, j = [], 2 * n + 1
            for l in self.inner:
                m = len(getattr(l, "nb_buffers", lambda: [])())
                extra.append([c.buf(j + i) for i in range(m)])
                j += m
        else:
            outs = [c.em.sym(f"l{c.li}_{k}_out") for k in range(n)]
            errs = [c.em.sym(f"l{c.li}_{k}_err") for k in range(n)]
            fdx = c.em.sym(f"l{c.li}_fdx")
            extra = [[c.em.sym(f"l{c.li}_{k}_saved")] for k in range(n)]
        return outs, errs, fdx, extra

    def _inners(self, c, numba):
        outs, errs, fdx, extra = self._layout(c, numba)
        tag = f"{c.li}".replace("-", "m")
        res = []
        for k, l in enumerate(self.inner):
            names = {"x": c.x if k == 0 else outs[k - 1], "ex": c.ex if k == 0 else f"rx{tag}_{k}",
                     "y": outs[k], "ey": f"rx{tag}_{k + 1}"}
            ic = _Inner(c, l, k, self.offsets[k], extra[k], names)
            res.append(ic)
        return res, outs, errs, fdx, tag

    def _fwd(self, c, numba, train):
        inn, outs, errs, fdx, tag = self._inners(c, numba)
        n = len(self.inner)
        lines = []
        for k, (l, ic) in enumerate(zip(self.inner, inn)):
            if numba:
                f = l.nb_forward if train or not hasattr(l, "nb_forward_eval") else l.nb_forward_eval
            else:
                from tinytrain.codegen.emit import EMITTERS
                f = (lambda ic, l=l: EMITTERS[l.kind][1](l, ic)) if train or not hasattr(l, "c_forward_eval") else l.c_forward_eval
            lines += f(ic)
        last, elast = outs[n - 1], f"rx{tag}_{n}"
        if numba:
            lines.append(f"{c.ey} = add_fwd({c.x}, {c.ex}, {last}, {elast}, {c.y}, stats)")
        else:
            lines.append(f"{c.ey} = tt_add_fwd_s8({c.x}, {c.ex}, {last}, {elast}, {self.out_size}, {c.y}, &STATS);")
        return lines

    def _bwd(self, c, numba):
        inn, outs, errs, fdx, tag = self._inners(c, numba)
        n = len(self.inner)
        lines = []
        d, ed = c.e, c.ee
        need = c.dx is not None and bool(c.dx)
        for k in range(n - 1, -1, -1):
            l, ic = self.inner[k], inn[k]
            ic.e, ic.ee = d, ed
            if k > 0 or need:
                ic.dx, ic.edx = (errs[k - 1] if k > 0 else fdx), f"rd{tag}_{k}"
            if numba:
                lines += l.nb_backward(ic)
            else:
                from tinytrain.codegen.emit import EMITTERS
                lines += EMITTERS[l.kind][2](l, ic)
            d, ed = ic.dx, ic.edx
        if not need and not numba:
            # first trainable layer: no input error; inner exponents set for layers that then
            # emit no backward (ReLU, pools) stay unread
            lines.append(" ".join(f"(void)rd{tag}_{k};" for k in range(n)) + f" (void){fdx};")
        if need:
            if numba:
                lines.append(f"{c.edx} = add_fwd({c.e}, {c.ee}, {fdx}, {ed}, {c.dx}, stats)")
            else:
                lines.append(f"{c.edx} = tt_add_fwd_s8({c.e}, {c.ee}, {fdx}, {ed}, {self.in_size}, {c.dx}, &STATS);")
        return lines

    def nb_forward(self, c):
        return self._fwd(c, True, True)

    def nb_forward_eval(self, c):
        return self._fwd(c, True, False)

    def nb_backward(self, c):
        return self._bwd(c, True)

    # ------------------------------------------------------- C (codegen) emitters
    def c_forward(self, c):
        return self._fwd(c, False, True)

    def c_forward_eval(self, c):
        return self._fwd(c, False, False)

    def c_backward(self, c):
        return self._bwd(c, False)

    def c_locals(self, li, backward=True):
        """Exponent variables the C step (backward=True) or predict function declares."""
        tag = f"{li}"
        n = len(self.inner)
        return [f"rx{tag}_{k}" for k in range(1, n + 1)] + ([f"rd{tag}_{k}" for k in range(n)] if backward else [])

    def c_buffers(self, em, li, backward=True):
        """(name, ctype, count, role) of the block's own buffers in the generated C; the error
        buffers only when the block's backward is emitted (backward)."""
        out = []
        for k, l in enumerate(self.inner):
            out.append((em.sym(f"l{li}_{k}_out"), "int8_t", l.out_size, "activation"))
            if backward and k < len(self.inner) - 1:  # the last inner layer reads the block's own error
                out.append((em.sym(f"l{li}_{k}_err"), "int8_t", l.out_size, "error"))
            if l.kind == "batchnorm":
                out.extend(l.c_buffers(em, f"{li}_{k}", backward))
        if backward:
            out.append((em.sym(f"l{li}_fdx"), "int8_t", self.in_size, "error"))
        return out

    def c_scratch_words(self):
        from tinytrain.codegen.emit import scratch_words
        return max([self.in_size] + [scratch_words(l) for l in self.inner])
