"""Convolution and pooling layers (channels-last) and their op table rows. The arithmetic is in
ops/conv2d.py, depthwise.py, conv1d.py, maxpool.py, avgpool.py and their numba and C twins."""
from __future__ import annotations

import math

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, Param, max_product, register
from tinytrain.graph.optable import Call, Op, register_op
from tinytrain.ops import avgpool as r_avg
from tinytrain.ops import conv1d as r_c1
from tinytrain.ops import conv2d as r_c2
from tinytrain.ops import depthwise as r_dw
from tinytrain.ops import maxpool as r_mp


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


class _ConvBase(Layer):
    def _params_init(self, rng, fan_in, wshape, n_out):
        bound = math.sqrt(6.0 / fan_in)
        w, ew = self._weights(rng, bound, wshape)
        return [Param("w", w, ew, "weight"), self._bias(n_out, self._ew16(ew))]


@register
class Conv2d(_ConvBase):
    kind = "conv2d"
    fields = {"filters": F.POS_INT, "kernel": F.POS_INT_OR_PAIR, "stride": F.POS_INT_OR_PAIR,
              "padding": F.padding(4)}

    def __init__(self, filters: int, kernel=3, stride=1, padding="valid"):
        super().__init__()
        if not F.POS_INT.ok(filters):
            raise ModelError(f"Conv2d(filters={filters!r}): filters must be a positive integer")
        self.filters, self.kernel, self.stride, self.padding = filters, _pair(kernel), _pair(stride), padding

    def config(self):
        return {"filters": self.filters, "kernel": list(self.kernel), "stride": list(self.stride),
                "padding": self.padding if isinstance(self.padding, str) else list(self.padding)}

    def _out_shape(self, s):
        if len(s) != 3:
            raise ModelError(f"Conv2d expects (H, W, C) input, got {s}")
        try:
            OH, OW, _, pad = r_c2.geometry(s[0], s[1], *self.kernel, self.stride, self.padding)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        self.pad = pad
        return (OH, OW, self.filters)

    def _init_params(self, rng):
        KH, KW = self.kernel
        C = self.in_shape[2]
        return self._params_init(rng, KH * KW * C, (self.filters, KH, KW, C), self.filters)

    def macs(self):
        return int(np.prod(self.out_shape)) * self.kernel[0] * self.kernel[1] * self.in_shape[2]

@register
class DepthwiseConv2d(Conv2d):
    kind = "depthwise_conv2d"
    fields = {k: v for k, v in Conv2d.fields.items() if k != "filters"}

    def __init__(self, kernel=3, stride=1, padding="valid"):
        Layer.__init__(self)
        self.filters = None
        self.kernel, self.stride, self.padding = _pair(kernel), _pair(stride), padding

    def config(self):
        d = super().config()
        d.pop("filters")
        return d

    def _out_shape(self, s):
        if len(s) != 3:
            raise ModelError(f"DepthwiseConv2d expects (H, W, C) input, got {s}")
        try:
            OH, OW, _, pad = r_c2.geometry(s[0], s[1], *self.kernel, self.stride, self.padding)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        self.pad = pad
        return (OH, OW, s[2])

    def _init_params(self, rng):
        KH, KW = self.kernel
        C = self.in_shape[2]
        return self._params_init(rng, KH * KW, (KH, KW, C), C)

    def macs(self):
        return int(np.prod(self.out_shape)) * self.kernel[0] * self.kernel[1]

@register
class Conv1d(_ConvBase):
    kind = "conv1d"
    fields = {"filters": F.POS_INT, "kernel": F.POS_INT, "stride": F.POS_INT, "padding": F.padding(2)}

    def __init__(self, filters: int, kernel: int = 3, stride: int = 1, padding="valid"):
        super().__init__()
        if not F.POS_INT.ok(filters):
            raise ModelError(f"Conv1d(filters={filters!r}): filters must be a positive integer")
        self.filters, self.kernel, self.stride, self.padding = filters, int(kernel), int(stride), padding

    def config(self):
        return {"filters": self.filters, "kernel": self.kernel, "stride": self.stride,
                "padding": self.padding if isinstance(self.padding, str) else list(self.padding)}

    def _out_shape(self, s):
        if len(s) != 2:
            raise ModelError(f"Conv1d expects (L, C) input, got {s}")
        try:
            OL, _, pad = r_c1.geometry(s[0], self.kernel, self.stride, self.padding)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        self.pad = pad
        return (OL, self.filters)

    def _init_params(self, rng):
        C = self.in_shape[1]
        return self._params_init(rng, self.kernel * C, (self.filters, self.kernel, C), self.filters)

    def macs(self):
        return int(np.prod(self.out_shape)) * self.kernel * self.in_shape[1]

_POOL_FIELDS = {d: {"kernel": f, "stride": F.optional(f)}
                for d, f in ((1, F.POS_INT), (2, F.POS_INT_OR_PAIR))}


class _Pool(Layer):
    """Non-overlapping pooling (stride >= kernel): no scratch needed in any implementation."""

    def __init__(self, kernel=2, stride=None):
        super().__init__()
        self.kernel = _pair(kernel) if self.dims == 2 else int(kernel)
        self.stride = self.kernel if stride is None else (_pair(stride) if self.dims == 2 else int(stride))
        ks = self.kernel if self.dims == 2 else (1, self.kernel)
        ss = self.stride if self.dims == 2 else (1, self.stride)
        if ss[0] < ks[0] or ss[1] < ks[1]:
            raise ModelError(f"{type(self).__name__}: overlapping windows (stride < kernel) are not supported yet")

    def config(self):
        return {"kernel": list(self.kernel) if self.dims == 2 else self.kernel,
                "stride": list(self.stride) if self.dims == 2 else self.stride}

    def _out_shape(self, s):
        if len(s) != self.dims + 1:
            raise ModelError(f"{type(self).__name__} expects a {'(H, W, C)' if self.dims == 2 else '(L, C)'} input, got {s}")
        if self.dims == 2:
            OH = (s[0] - self.kernel[0]) // self.stride[0] + 1
            OW = (s[1] - self.kernel[1]) // self.stride[1] + 1
            if OH < 1 or OW < 1:
                raise ModelError(f"{type(self).__name__}: window {self.kernel} larger than input {s}")
            return (OH, OW, s[2])
        OL = (s[0] - self.kernel) // self.stride + 1
        if OL < 1:
            raise ModelError(f"{type(self).__name__}: window {self.kernel} larger than input {s}")
        return (OL, s[1])


@register
class MaxPool2d(_Pool):
    kind = "maxpool2d"
    dims = 2
    fields = _POOL_FIELDS[2]


@register
class MaxPool1d(_Pool):
    kind = "maxpool1d"
    dims = 1
    fields = _POOL_FIELDS[1]


@register
class AvgPool2d(_Pool):
    kind = "avgpool2d"
    dims = 2
    fields = _POOL_FIELDS[2]

    def _mk(self):
        return r_avg.reciprocal(self.kernel[0] * self.kernel[1])


@register
class GlobalAvgPool(Layer):
    kind = "global_avgpool"
    fields = {}

    def _out_shape(self, s):
        if len(s) not in (2, 3):
            raise ModelError(f"GlobalAvgPool expects (H, W, C) or (L, C), got {s}")
        return (s[-1],)

    def _P(self):
        return int(np.prod(self.in_shape[:-1]))


# ------------------------------------------------------------------ op table rows
def _conv_forward(ref):
    def forward(l, x, ex, train):
        w, b = l.params
        y, ey, n = ref.forward(x, ex, w.data, w.exp, b.data, b.exp, l.stride, l.pad)
        return y, ey, n, (x, ex)
    return forward


def _conv_backward(ref):
    def backward(l, e, ee, saved, need_dx):
        x, ex = saved
        w = l.params[0]
        return ref.backward(e.reshape(l.out_shape), ee, x, ex, w.data, w.exp, l.stride, l.pad, need_dx)
    return backward


def _conv2d_args(l):
    (H, W, C), (OH, OW, F) = l.in_shape, l.out_shape
    return {"H": H, "W": W, "Cin": C, "Cout": F, "kh": l.kernel[0], "kw": l.kernel[1], "stride_h": l.stride[0],
            "stride_w": l.stride[1], "pad_top": l.pad[0], "pad_left": l.pad[2], "Ho": OH, "Wo": OW}


_NB_CONV2D = "{stride_h}, {stride_w}, {pad_top}, {pad_left}"
_TENSORS = {"w": "{w}", "ew": "{exp_w}", "b": "{b}", "eb": "{exp_b}"}
#: tt_conv_params (conv2d; depthwise with Cout = Cin), tt_conv1d_params
_C_CONV2D = ("conv", "tt_conv{wv}_params", {
    **{k: "{" + k + "}" for k in ("H", "W", "Cin", "Cout", "kh", "kw", "stride_h", "stride_w")},
    "pad_h": "{pad_top}", "pad_w": "{pad_left}", "Ho": "{Ho}", "Wo": "{Wo}", **_TENSORS})
_C_CONV1D = ("conv", "tt_conv1d{wv}_params", {**{k: "{" + k + "}" for k in ("L", "Cin", "Cout", "k", "stride")},
                                           "pad": "{pad_left}", "Lo": "{Lo}", **_TENSORS})


def _conv_bounds(fan_in, fan_out, positions):
    """The bounds of ops/conv2d.py, depthwise.py, conv1d.py: sums exact in int64, the weight
    gradient in int32 (``geometry`` refuses more than GRAD_MAX_POSITIONS output positions)."""
    return lambda l: [("forward sum", fan_in(l) * max_product(l) + 2**30, 64),
                      ("input-error sum", fan_out(l) * max_product(l), 64),
                      ("weight gradient", 127 * 127 * positions(l), 32)]


def _conv_row(kind, name, ref, args, nb_dims, c_params, bounds):
    """Conv2d, depthwise and Conv1d share one calling convention (their kernels differ)."""
    return Op(
        kind, _conv_forward(ref), _conv_backward(ref),
        nb_import=f"tinytrain.kernels.conv: {name}_fwd, {name}_bwd, {name}_grad", c_header="tt_conv.h",
        c_header_w8="tt_conv_w8.h", args=args,
        c_params=c_params,
        fwd=Call(f"{name}_fwd({{x:in}}, {{ex}}, {{w}}, {{exp_w}}, {{b}}, {{exp_b}}, {nb_dims}, {{scratch}}, {{y:out}}, {{stats}})",
                 f"tt_{name}_fwd_s8{{wv}}(&CTX, {{params}}, {{x}}, {{ex}}, {{y}})"),
        bwd=Call(f"{name}_bwd({{e:out}}, {{ee}}, {{w}}, {{exp_w}}, {nb_dims}, {{scratch}}, {{dx:in}}, {{stats}})",
                 f"tt_{name}_bwd_s8{{wv}}(&CTX, {{params}}, {{e}}, {{ee}}, {{dx}})"),
        grad=Call(f"{name}_grad({{e:out}}, {{x:in}}, {nb_dims}, {{g_w}}, {{g_b}})",
                  f"tt_{name}_grad_s32{{wv}}({{params}}, {{e}}, {{x}}, {{g_w}}, {{g_b}})"),
        grad_exp={"w": "{ee} + {ex}", "b": "{ee}"}, bounds=bounds)


def _hw(l):
    return l.out_shape[0] * l.out_shape[1]


register_op(_conv_row("conv2d", "conv2d", r_c2, _conv2d_args, _NB_CONV2D, _C_CONV2D,
                      _conv_bounds(lambda l: l.kernel[0] * l.kernel[1] * l.in_shape[2],
                                   lambda l: l.filters * l.kernel[0] * l.kernel[1], _hw)))
register_op(_conv_row("depthwise_conv2d", "depthwise", r_dw, _conv2d_args, _NB_CONV2D, _C_CONV2D,
                      _conv_bounds(lambda l: l.kernel[0] * l.kernel[1], lambda l: l.kernel[0] * l.kernel[1], _hw)))
register_op(_conv_row(
    "conv1d", "conv1d", r_c1,
    lambda l: {"L": l.in_shape[0], "Cin": l.in_shape[1], "Cout": l.out_shape[1], "k": l.kernel, "stride": l.stride,
               "pad_left": l.pad[0], "Lo": l.out_shape[0]},
    "{stride}, {pad_left}", _C_CONV1D,
    _conv_bounds(lambda l: l.kernel * l.in_shape[1], lambda l: l.filters * l.kernel, lambda l: l.out_shape[0])))


def _pool2_args(l):
    H, W, C = l.in_shape
    return {"H": H, "W": W, "C": C, "kh": l.kernel[0], "kw": l.kernel[1], "stride_h": l.stride[0], "stride_w": l.stride[1]}


_NB_POOL2 = "{kh}, {kw}, {stride_h}, {stride_w}"
_C_POOL2 = {k: "{" + k + "}" for k in ("H", "W", "C", "kh", "kw", "stride_h", "stride_w")}


def _maxpool_forward(ref):
    def forward(l, x, ex, train):
        y, ey, n = ref(x, ex, l.kernel, l.stride)
        return y, ey, n, x  # backward routes the error to each window's first maximum
    return forward


def _maxpool_backward(ref):
    return lambda l, e, ee, x, need_dx: ref(e.reshape(l.out_shape), ee, x, l.kernel, l.stride, need_dx)


def _maxpool_row(kind, name, fwd_ref, bwd_ref, args, nb_dims, c_params):
    return Op(
        kind, _maxpool_forward(fwd_ref), _maxpool_backward(bwd_ref),
        nb_import=f"tinytrain.kernels.pool: {name}_fwd, {name}_bwd", c_header="tt_pool.h", args=args,
        c_params=c_params,
        fwd=Call(f"{name}_fwd({{x:in}}, {{ex}}, {nb_dims}, {{y:out}}, {{stats}})",
                 f"tt_{name}_fwd_s8{{wv}}(&CTX, {{params}}, {{x}}, {{ex}}, {{y}})"),
        bwd=Call(f"{name}_bwd({{e:out}}, {{ee}}, {{x:in}}, {nb_dims}, I32, {{dx:in}}, {{stats}})",
                 f"tt_{name}_bwd_s8(&CTX, {{params}}, {{e}}, {{ee}}, {{x}}, {{dx}})"))


register_op(_maxpool_row("maxpool2d", "maxpool2d", r_mp.forward, r_mp.backward, _pool2_args, _NB_POOL2,
                         ("pool", "tt_pool_params", _C_POOL2)))
register_op(_maxpool_row("maxpool1d", "maxpool1d", r_mp.forward1d, r_mp.backward1d,
                         lambda l: {"L": l.in_shape[0], "C": l.in_shape[1], "k": l.kernel, "stride": l.stride},
                         "{k}, {stride}", ("pool", "tt_pool1d_params", {k: "{" + k + "}" for k in ("L", "C", "k", "stride")})))


def _avgpool_args(l):
    m, k = l._mk()
    return {**_pool2_args(l), "mult": m, "shift": k}


def _avgpool_forward(l, x, ex, train):
    y, ey, n = r_avg.forward(x, ex, l.kernel, l.stride)
    return y, ey, n, None


register_op(Op(
    "avgpool2d", _avgpool_forward,
    lambda l, e, ee, saved, need_dx: r_avg.backward(e.reshape(l.out_shape), ee, l.in_shape, l.kernel, l.stride, need_dx),
    nb_import="tinytrain.kernels.pool: avgpool2d_fwd, avgpool2d_bwd", c_header="tt_pool.h", args=_avgpool_args,
    c_params=("pool", "tt_pool_params", {**_C_POOL2, "mult": "{mult}", "shift": "{shift}"}),
    fwd=Call(f"avgpool2d_fwd({{x:in}}, {{ex}}, {_NB_POOL2}, {{mult}}, {{shift}}, {{y:out}}, {{stats}})",
             "tt_avgpool2d_fwd_s8(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call(f"avgpool2d_bwd({{e:out}}, {{ee}}, {_NB_POOL2}, {{mult}}, {{shift}}, {{dx:in}}, {{stats}})",
             "tt_avgpool2d_bwd_s8(&CTX, {params}, {e}, {ee}, {dx})")))


def _gap_args(l):
    m, k = r_avg.reciprocal(l._P())
    return {"P": l._P(), "C": l.in_shape[-1], "mult": m, "shift": k}


def _gap_forward(l, x, ex, train):
    y, ey, n = r_avg.global_forward(x, ex)
    return y, ey, n, None


register_op(Op(
    "global_avgpool", _gap_forward,
    lambda l, e, ee, saved, need_dx: r_avg.global_backward(e, ee, l.in_shape, need_dx),
    nb_import="tinytrain.kernels.pool: global_avgpool_fwd, global_avgpool_bwd", c_header="tt_pool.h", args=_gap_args,
    c_params=("pool", "tt_global_pool_params", {k: "{" + k + "}" for k in ("P", "C", "mult", "shift")}),
    fwd=Call("global_avgpool_fwd({x:pc}, {ex}, {mult}, {shift}, {y}, {stats})",
             "tt_global_avgpool_fwd_s8(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call("global_avgpool_bwd({e}, {ee}, {mult}, {shift}, {dx:pc}, {stats})",
             "tt_global_avgpool_bwd_s8(&CTX, {params}, {e}, {ee}, {dx})")))
