"""Integer batch normalization as a layer (arithmetic in ops/batchnorm.py; numba and C twins).

At batch 1 the statistics of a channel are taken over the sample's positions (H*W or L), as
PyTorch's BatchNorm does in train mode at batch size 1. Eval mode (prediction) uses the
running statistics. gamma/beta learn through the optimizer; the running statistics are state
tensors (part of the state hash) updated by the forward pass in train mode.
"""
from __future__ import annotations

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, Param, register
from tinytrain.ops import batchnorm as r_bn


@register
class BatchNorm(Layer):
    kind = "batchnorm"
    fields = {"eps": F.NUMBER, "momentum": F.NUMBER}  # ranges: ops/batchnorm.config

    def __init__(self, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        try:
            self.cfg = r_bn.config(eps, momentum)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        self.eps, self.momentum = eps, momentum

    def config(self):
        return {"eps": self.eps, "momentum": self.momentum}

    def _out_shape(self, s):
        if len(s) not in (2, 3):
            raise ModelError(f"BatchNorm needs spatial positions at batch 1: input {s} must be (H, W, C) or (L, C)")
        P = int(np.prod(s[:-1]))
        if not 2 <= P <= r_bn.MAX_P:
            raise ModelError(f"BatchNorm needs 2..{r_bn.MAX_P} positions per channel, input {s} has {P}")
        return s

    def _init_params(self, rng):
        st = r_bn.init_state(self.in_shape[-1])
        return [Param("gamma", st["gamma"], st["e_g"], "weight"), Param("beta", st["beta"], st["e_b"], "bias"),
                Param("running_mean", st["running_mean"], st["e_rm"], "state"),
                Param("running_var", st["running_var"], st["e_rv"], "state")]

    @property
    def P(self):
        return int(np.prod(self.in_shape[:-1]))

    @property
    def C(self):
        return self.in_shape[-1]

    def c_scratch_words(self):
        return max(3 * self.C, self.in_size)

    def c_buffers(self, em, li, backward=True):
        """(name, ctype, count, role) of the values backward needs, in the generated C: the
        per-channel {B, inv, sh} and the input exponent (TT_BATCHNORM_SAVED_SIZE)."""
        return [(em.sym(f"l{li}_saved"), "int32_t", 3 * self.C + 1, "activation")]

    def nb_buffers(self):
        return [((3, self.C), np.int32)]

    def ref_forward(self, x, ex, train):
        g, b, rm, rv = self.params
        y, ey, n, saved, rm2, rv2 = r_bn.forward(x, ex, g.data, g.exp, b.data, b.exp, rm.data, rm.exp, rv.data, rv.exp,
                                                 train=train, **self.cfg)
        if train:
            rm.data[...] = rm2
            rv.data[...] = rv2
        return y, ey, n, (x, ex, saved, train)

    def ref_backward(self, e, ee, saved, need_dx):
        x, ex, sv, train = saved
        g = self.params[0]
        return r_bn.backward(e.reshape(self.in_shape), ee, x, ex, sv, g.data, g.exp, train=train, need_dx=need_dx)

    nb_imports = ["from tinytrain.kernels.batchnorm import batchnorm_fwd, batchnorm_bwd, batchnorm_grad"]

    def _pc(self, name):
        return f"{name}.reshape(({self.P}, {self.C}))"

    def _nbf(self, c, train):
        cf = self.cfg
        return [f"{c.ey} = batchnorm_fwd({self._pc(c.x)}, {c.ex}, {c.p(0)}, {c.pe(0)}, {c.p(1)}, {c.pe(1)}, {c.p(2)}, {c.pe(2)}, "
                f"{c.p(3)}, {c.pe(3)}, {cf['eps_m']}, {cf['eps_k']}, {cf['mom_k']}, {train}, {c.buf(0)}, S64[:{3 * self.C}], "
                f"{self._pc(c.y)}, stats)"]

    def nb_forward(self, c):
        return self._nbf(c, True)

    def nb_forward_eval(self, c):
        return self._nbf(c, False)

    def nb_backward(self, c):
        out = []
        if c.dx is not None:
            out.append(f"{c.edx} = batchnorm_bwd({self._pc(c.e)}, {c.ee}, {self._pc(c.x)}, {c.ex}, {c.buf(0)}, {c.p(0)}, {c.pe(0)}, "
                       f"True, S64[:{3 * self.C}], {self._pc(c.dx)}, stats)")
        out.append(f"batchnorm_grad({self._pc(c.e)}, {self._pc(c.x)}, {c.buf(0)}, True, {c.g(0)}, {c.g(1)})")
        out += [f"{c.geo(0)} = {c.ee} - {r_bn.XHAT_FRAC}", f"{c.geo(1)} = {c.ee}"]
        return out

    # C emitters (tinytrain/codegen/emit.py looks these up by kind)
    def _c_params(self, c):
        cf = self.cfg
        return c.decl("bn", "tt_batchnorm_params", P=self.P, C=self.C, gamma=c.p(0), e_g=c.pe(0), beta=c.p(1),
                      e_b=c.pe(1), rmean=c.p(2), e_rm=c.pe(2), rvar=c.p(3), e_rv=c.pe(3), eps_m=cf["eps_m"],
                      eps_k=cf["eps_k"], mom_k=cf["mom_k"], saved=c.saved())

    def c_forward(self, c, train=True):
        f = "tt_batchnorm_fwd_s8" if train else "tt_batchnorm_fwd_eval_s8"
        return [f"{c.ey} = {f}(&CTX, {self._c_params(c)}, {c.x}, {c.ex}, {c.y});"]

    def c_forward_eval(self, c):
        return self.c_forward(c, train=False)

    def c_backward(self, c):
        out = []
        if c.dx:
            out.append(f"{c.edx} = tt_batchnorm_bwd_s8(&CTX, {self._c_params(c)}, {c.e}, {c.ee}, {c.x}, {c.dx});")
        if c.grads:
            out.append(f"tt_batchnorm_grad_s32({self._c_params(c)}, {c.e}, {c.x}, {c.g(0)}, {c.g(1)});")
            out += [f"{c.geo(0)} = {c.ee} - {r_bn.XHAT_FRAC};", f"{c.geo(1)} = {c.ee};"]
        return out
