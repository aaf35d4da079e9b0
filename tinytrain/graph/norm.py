"""Integer batch normalization as a layer and its op table row (arithmetic in ops/batchnorm.py;
numba and C twins).

At batch 1 the statistics of a channel are taken over the sample's positions (H*W or L), as
PyTorch's BatchNorm does in train mode at batch size 1. Eval mode (prediction) uses the
running statistics. gamma/beta learn through the optimizer; the running statistics are state
tensors (part of the state hash) updated by the forward pass in train mode.
"""
from __future__ import annotations

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, Param, register
from tinytrain.graph.optable import Buffer, Call, Op, register_op
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


# ------------------------------------------------------------------ op table row
def _bn_forward(l, x, ex, train):
    g, b, rm, rv = l.params
    y, ey, n, saved, rm2, rv2 = r_bn.forward(x, ex, g.data, g.exp, b.data, b.exp, rm.data, rm.exp, rv.data, rv.exp,
                                             train=train, **l.cfg)
    if train:  # the running statistics are state: the forward pass updates them
        rm.data[...] = rm2
        rv.data[...] = rv2
    return y, ey, n, (x, ex, saved, train)


def _bn_backward(l, e, ee, saved, need_dx):
    x, ex, sv, train = saved
    g = l.params[0]
    return r_bn.backward(e.reshape(l.in_shape), ee, x, ex, sv, g.data, g.exp, train=train, need_dx=need_dx)


_BN_PARAMS = "{gamma}, {exp_gamma}, {beta}, {exp_beta}, {running_mean}, {exp_running_mean}, {running_var}, {exp_running_var}"

register_op(Op(
    "batchnorm", _bn_forward, _bn_backward,
    nb_import="tinytrain.kernels.batchnorm: batchnorm_fwd, batchnorm_bwd, batchnorm_grad", c_header="tt_batchnorm.h",
    args=lambda l: {"P": l.P, "C": l.C, "C3": 3 * l.C, **{k: l.cfg[k] for k in ("eps_m", "eps_k", "mom_k")}},
    # saved: per channel, the values backward needs (ops/batchnorm.py); the C keeps the input
    # exponent after them, then the backward's sums for the gradients (TT_BATCHNORM_SAVED_SIZE). Backward always follows a training forward,
    # so its train flag is 1 (the C has no flag: prediction is tt_batchnorm_fwd_eval_s8)
    buffers=(Buffer("saved", lambda l: (3, l.C), c_count=lambda l: 5 * l.C + 1),),
    scratch=lambda l: max(3 * l.C, l.in_size),
    c_params=("bn", "tt_batchnorm_params", {
        "P": "{P}", "C": "{C}", "gamma": "{gamma}", "e_g": "{exp_gamma}", "beta": "{beta}", "e_b": "{exp_beta}",
        "rmean": "{running_mean}", "e_rm": "{exp_running_mean}", "rvar": "{running_var}", "e_rv": "{exp_running_var}",
        "eps_m": "{eps_m}", "eps_k": "{eps_k}", "mom_k": "{mom_k}", "saved": "{saved}"}),
    fwd=Call(f"batchnorm_fwd({{x:pc}}, {{ex}}, {_BN_PARAMS}, {{eps_m}}, {{eps_k}}, {{mom_k}}, {{train}}, {{saved}}, "
             "{scratch:C3}, {y:pc}, {stats})",
             "tt_batchnorm_fwd_s8(&CTX, {params}, {x}, {ex}, {y})"),
    fwd_eval=Call("", "tt_batchnorm_fwd_eval_s8(&CTX, {params}, {x}, {ex}, {y})"),  # numba: fwd, train False
    bwd=Call("batchnorm_bwd({e:pc}, {ee}, {x:pc}, {ex}, {saved}, {gamma}, {exp_gamma}, True, {scratch:C3}, {dx:pc}, {stats})",
             "tt_batchnorm_bwd_s8(&CTX, {params}, {e}, {ee}, {x}, {dx})"),
    grad=Call("batchnorm_grad({e:pc}, {x:pc}, {saved}, True, {g_gamma}, {g_beta})",
              "tt_batchnorm_grad_s32({params}, {e}, {x}, {g_gamma}, {g_beta})"),
    # C: the gradients are the sums the train backward's first pass forms (kept in saved)
    grad_after_bwd=Call("", "tt_batchnorm_grad_saved_s32({params}, {g_gamma}, {g_beta})"),
    grad_exp={"gamma": f"{{ee}} - {r_bn.XHAT_FRAC}", "beta": "{ee}"}))
