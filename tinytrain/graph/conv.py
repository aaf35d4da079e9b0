"""Convolution and pooling layers (channels-last), with their reference, numba and C glue.
The arithmetic is in ops/conv2d.py, depthwise.py, conv1d.py, maxpool.py, avgpool.py."""
from __future__ import annotations

import math

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.layers import Layer, ModelError, Param, _quantize, _weight_exp, register
from tinytrain.ops import avgpool as r_avg
from tinytrain.ops import conv1d as r_c1
from tinytrain.ops import conv2d as r_c2
from tinytrain.ops import depthwise as r_dw
from tinytrain.ops import maxpool as r_mp


def _pair(v):
    return (int(v), int(v)) if isinstance(v, (int, np.integer)) else (int(v[0]), int(v[1]))


def _shape(c, shape):
    return f"{c}.reshape({tuple(int(s) for s in shape)})"


class _ConvBase(Layer):
    def _params_init(self, rng, fan_in, wshape, n_out):
        bound = math.sqrt(6.0 / fan_in)
        ew = _weight_exp(bound)
        w = _quantize(rng.uniform(-bound, bound, wshape), ew, np.int16)
        return [Param("w", w, ew, "weight"), Param("b", np.zeros(n_out, np.int32), ew - 8, "bias")]


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

    def ref_forward(self, x, ex, train):
        w, b = self.params
        y, ey, n = r_c2.forward(x, ex, w.data, w.exp, b.data, b.exp, self.stride, self.pad)
        return y, ey, n, (x, ex)

    def ref_backward(self, e, ee, saved, need_dx):
        x, ex = saved
        w = self.params[0]
        return r_c2.backward(e.reshape(self.out_shape), ee, x, ex, w.data, w.exp, self.stride, self.pad, need_dx)

    nb_imports = ["from tinytrain.kernels.conv import conv2d_fwd, conv2d_bwd, conv2d_grad"]

    def _nbargs(self):
        return f"{self.stride[0]}, {self.stride[1]}, {self.pad[0]}, {self.pad[2]}"

    def nb_forward(self, c):
        return [f"{c.ey} = conv2d_fwd({_shape(c.x, self.in_shape)}, {c.ex}, {c.p(0)}, {c.pe(0)}, {c.p(1)}, {c.pe(1)}, {self._nbargs()}, S64, {_shape(c.y, self.out_shape)}, stats)"]

    def nb_backward(self, c):
        out = []
        if c.dx is not None:
            out.append(f"{c.edx} = conv2d_bwd({_shape(c.e, self.out_shape)}, {c.ee}, {c.p(0)}, {c.pe(0)}, {self._nbargs()}, S64, {_shape(c.dx, self.in_shape)}, stats)")
        out.append(f"conv2d_grad({_shape(c.e, self.out_shape)}, {_shape(c.x, self.in_shape)}, {self._nbargs()}, {c.g(0)}, {c.g(1)})")
        out += [f"{c.geo(0)} = {c.ee} + {c.ex}", f"{c.geo(1)} = {c.ee}"]
        return out


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

    def ref_forward(self, x, ex, train):
        w, b = self.params
        y, ey, n = r_dw.forward(x, ex, w.data, w.exp, b.data, b.exp, self.stride, self.pad)
        return y, ey, n, (x, ex)

    def ref_backward(self, e, ee, saved, need_dx):
        x, ex = saved
        w = self.params[0]
        return r_dw.backward(e.reshape(self.out_shape), ee, x, ex, w.data, w.exp, self.stride, self.pad, need_dx)

    nb_imports = ["from tinytrain.kernels.conv import depthwise_fwd, depthwise_bwd, depthwise_grad"]

    def nb_forward(self, c):
        return [s.replace("conv2d_fwd", "depthwise_fwd") for s in super().nb_forward(c)]

    def nb_backward(self, c):
        return [s.replace("conv2d_bwd", "depthwise_bwd").replace("conv2d_grad", "depthwise_grad") for s in super().nb_backward(c)]


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

    def ref_forward(self, x, ex, train):
        w, b = self.params
        y, ey, n = r_c1.forward(x, ex, w.data, w.exp, b.data, b.exp, self.stride, self.pad)
        return y, ey, n, (x, ex)

    def ref_backward(self, e, ee, saved, need_dx):
        x, ex = saved
        w = self.params[0]
        return r_c1.backward(e.reshape(self.out_shape), ee, x, ex, w.data, w.exp, self.stride, self.pad, need_dx)

    nb_imports = ["from tinytrain.kernels.conv import conv1d_fwd, conv1d_bwd, conv1d_grad"]

    def nb_forward(self, c):
        return [f"{c.ey} = conv1d_fwd({_shape(c.x, self.in_shape)}, {c.ex}, {c.p(0)}, {c.pe(0)}, {c.p(1)}, {c.pe(1)}, {self.stride}, {self.pad[0]}, S64, {_shape(c.y, self.out_shape)}, stats)"]

    def nb_backward(self, c):
        out = []
        if c.dx is not None:
            out.append(f"{c.edx} = conv1d_bwd({_shape(c.e, self.out_shape)}, {c.ee}, {c.p(0)}, {c.pe(0)}, {self.stride}, {self.pad[0]}, S64, {_shape(c.dx, self.in_shape)}, stats)")
        out.append(f"conv1d_grad({_shape(c.e, self.out_shape)}, {_shape(c.x, self.in_shape)}, {self.stride}, {self.pad[0]}, {c.g(0)}, {c.g(1)})")
        out += [f"{c.geo(0)} = {c.ee} + {c.ex}", f"{c.geo(1)} = {c.ee}"]
        return out


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
    nb_imports = ["from tinytrain.kernels.pool import maxpool2d_fwd, maxpool2d_bwd"]

    def ref_forward(self, x, ex, train):
        y, ey, n = r_mp.forward(x, ex, self.kernel, self.stride)
        return y, ey, n, x

    def ref_backward(self, e, ee, x, need_dx):
        return r_mp.backward(e.reshape(self.out_shape), ee, x, self.kernel, self.stride, need_dx)

    def _k(self):
        return f"{self.kernel[0]}, {self.kernel[1]}, {self.stride[0]}, {self.stride[1]}"

    def nb_forward(self, c):
        return [f"{c.ey} = maxpool2d_fwd({_shape(c.x, self.in_shape)}, {c.ex}, {self._k()}, {_shape(c.y, self.out_shape)}, stats)"]

    def nb_backward(self, c):
        if c.dx is None:
            return []
        return [f"{c.edx} = maxpool2d_bwd({_shape(c.e, self.out_shape)}, {c.ee}, {_shape(c.x, self.in_shape)}, {self._k()}, I32, {_shape(c.dx, self.in_shape)}, stats)"]


@register
class MaxPool1d(_Pool):
    kind = "maxpool1d"
    dims = 1
    fields = _POOL_FIELDS[1]
    nb_imports = ["from tinytrain.kernels.pool import maxpool1d_fwd, maxpool1d_bwd"]

    def ref_forward(self, x, ex, train):
        y, ey, n = r_mp.forward1d(x, ex, self.kernel, self.stride)
        return y, ey, n, x

    def ref_backward(self, e, ee, x, need_dx):
        return r_mp.backward1d(e.reshape(self.out_shape), ee, x, self.kernel, self.stride, need_dx)

    def nb_forward(self, c):
        return [f"{c.ey} = maxpool1d_fwd({_shape(c.x, self.in_shape)}, {c.ex}, {self.kernel}, {self.stride}, {_shape(c.y, self.out_shape)}, stats)"]

    def nb_backward(self, c):
        if c.dx is None:
            return []
        return [f"{c.edx} = maxpool1d_bwd({_shape(c.e, self.out_shape)}, {c.ee}, {_shape(c.x, self.in_shape)}, {self.kernel}, {self.stride}, I32, {_shape(c.dx, self.in_shape)}, stats)"]


@register
class AvgPool2d(_Pool):
    kind = "avgpool2d"
    dims = 2
    fields = _POOL_FIELDS[2]
    nb_imports = ["from tinytrain.kernels.pool import avgpool2d_fwd, avgpool2d_bwd"]

    def _mk(self):
        return r_avg.reciprocal(self.kernel[0] * self.kernel[1])

    def ref_forward(self, x, ex, train):
        y, ey, n = r_avg.forward(x, ex, self.kernel, self.stride)
        return y, ey, n, None

    def ref_backward(self, e, ee, saved, need_dx):
        return r_avg.backward(e.reshape(self.out_shape), ee, self.in_shape, self.kernel, self.stride, need_dx)

    def _k(self):
        m, k = self._mk()
        return f"{self.kernel[0]}, {self.kernel[1]}, {self.stride[0]}, {self.stride[1]}, {m}, {k}"

    def nb_forward(self, c):
        return [f"{c.ey} = avgpool2d_fwd({_shape(c.x, self.in_shape)}, {c.ex}, {self._k()}, {_shape(c.y, self.out_shape)}, stats)"]

    def nb_backward(self, c):
        if c.dx is None:
            return []
        return [f"{c.edx} = avgpool2d_bwd({_shape(c.e, self.out_shape)}, {c.ee}, {self._k()}, {_shape(c.dx, self.in_shape)}, stats)"]


@register
class GlobalAvgPool(Layer):
    kind = "global_avgpool"
    fields = {}
    nb_imports = ["from tinytrain.kernels.pool import global_avgpool_fwd, global_avgpool_bwd"]

    def _out_shape(self, s):
        if len(s) not in (2, 3):
            raise ModelError(f"GlobalAvgPool expects (H, W, C) or (L, C), got {s}")
        return (s[-1],)

    def _P(self):
        return int(np.prod(self.in_shape[:-1]))

    def ref_forward(self, x, ex, train):
        y, ey, n = r_avg.global_forward(x, ex)
        return y, ey, n, None

    def ref_backward(self, e, ee, saved, need_dx):
        return r_avg.global_backward(e, ee, self.in_shape, need_dx)

    def _k(self):
        m, k = r_avg.reciprocal(self._P())
        return f"{m}, {k}"

    def nb_forward(self, c):
        return [f"{c.ey} = global_avgpool_fwd({_shape(c.x, (self._P(), self.in_shape[-1]))}, {c.ex}, {self._k()}, {c.y}, stats)"]

    def nb_backward(self, c):
        if c.dx is None:
            return []
        return [f"{c.edx} = global_avgpool_bwd({c.e}, {c.ee}, {self._k()}, {_shape(c.dx, (self._P(), self.in_shape[-1]))}, stats)"]
