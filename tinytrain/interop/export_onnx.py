"""Export a tinytrain model to ONNX: the float graph of its dequantized parameters.

Input scaling (also written into the model's doc string and metadata_props): the graph input
``input`` is float32 (N, *input_shape), channels-last like a tinytrain Dataset, in the units
of the dataset's floats (``Dataset.float_x_*``: what tinytrain quantizes at 2^data_input_exp).
The first node multiplies by 2^(input_exp - data_input_exp), the scale at which the model reads
those values; with ``qdq=True`` the input also goes through QuantizeLinear/DequantizeLinear
int8 at scale 2^data_input_exp, which is tinytrain's input quantization except for ties (ONNX
rounds half to even, tinytrain half away from zero) and the code -128 (tinytrain saturates at
-127).  Channels-first inside: a Transpose after the input, and back before each Flatten, so a
Dense sees tinytrain's (H, W, C) order.

Parameters are q * 2^exp in float32; with ``qdq=True`` they are stored as their integers (int16
weights, int32 biases and batch-norm values) behind DequantizeLinear at scale 2^exp, exactly
the numbers tinytrain holds (opset 21). Activations stay float: tinytrain's int8 activations
carry a per-sample dynamic exponent that no static QDQ scale expresses, so the exported model
agrees with the integer simulator on predictions, not bit for bit (tests: >= 99 % of the test
set on W1 and W3). The output ``logits`` are the real values of the integer model's logits.
"""
from __future__ import annotations

import numpy as np

from tinytrain.interop.ir import InteropError

OPSET = 21


def _deq(p) -> np.ndarray:
    return p.data.astype(np.float64) * 2.0**p.exp


class _Graph:
    def __init__(self, qdq: bool):
        from onnx import helper, numpy_helper
        self.h, self.nh, self.qdq = helper, numpy_helper, qdq
        self.nodes, self.inits, self.n = [], [], 0

    def name(self, base):
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base, value, dtype=np.float32):
        nm = self.name(base)
        self.inits.append(self.nh.from_array(np.asarray(value, dtype), nm))
        return nm

    def param(self, base, p, transpose=None):
        """The parameter p (tinytrain Param) as a float tensor, optionally transposed."""
        if not self.qdq:
            v = _deq(p)
            return self.const(base, v.transpose(transpose) if transpose else v)
        q = p.data.transpose(transpose) if transpose else p.data
        qn = self.const(base + "_q", q, q.dtype)
        out = self.name(base)
        self.node("DequantizeLinear", [qn, self.const(base + "_scale", 2.0**p.exp), self.const(base + "_zp", 0, q.dtype)],
                  out=out)
        return out

    def node(self, op, inputs, out=None, **attrs):
        out = out or self.name(op.lower())
        self.nodes.append(self.h.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out


def to_onnx(model, path=None, *, qdq: bool = False):
    """The ONNX ModelProto of `model` (written to `path` when given)."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        raise InteropError("export to ONNX needs the onnx package: pip install 'tinytrain-mcu[interop]'") from None
    g = _Graph(qdq)
    data_exp = getattr(model, "data_input_exp", None)
    data_exp = model.input_exp if data_exp is None else int(data_exp)
    shape = tuple(model.input_shape)
    x = "input"
    if qdq:
        sc, zp = g.const("in_scale", 2.0**data_exp), g.const("in_zp", 0, np.int8)
        x = g.node("DequantizeLinear", [g.node("QuantizeLinear", [x, sc, zp]), sc, zp])
    x = g.node("Mul", [x, g.const("input_scale", 2.0**(model.input_exp - data_exp))])
    rank = len(shape)
    if rank > 1:
        x = g.node("Transpose", [x], perm=[0, rank] + list(range(1, rank)))
    def emit(layers, x, tag):
        for li, l in enumerate(layers):
            li = f"{tag}{li}"
            k = l.kind
            if k in ("conv2d", "depthwise_conv2d", "conv1d"):
                w, b = l.params
                if k == "conv1d":
                    wt, pads, strides, ks = (0, 2, 1), [l.pad[0], l.pad[1]], [l.stride], [l.kernel]
                    group = 1
                else:
                    t, bt, le, r = l.pad
                    pads, strides, ks = [t, le, bt, r], list(l.stride), list(l.kernel)
                    wt, group = ((0, 3, 1, 2), 1) if k == "conv2d" else ((2, 0, 1), l.in_shape[-1])
                wn = g.param(f"l{li}_w", w, wt)
                if k == "depthwise_conv2d":
                    wn = g.node("Unsqueeze", [wn, g.const("axis", [1], np.int64)])
                x = g.node("Conv", [x, wn, g.param(f"l{li}_b", b)], kernel_shape=ks, pads=pads, strides=strides, group=group)
            elif k == "dense":
                w, b = l.params
                x = g.node("Gemm", [x, g.param(f"l{li}_w", w), g.param(f"l{li}_b", b)], transB=1)
            elif k == "batchnorm":
                gm, bt, rm, rv = l.params
                x = g.node("BatchNormalization", [x] + [g.param(f"l{li}_{p.name}", p) for p in (gm, bt, rm, rv)],
                           epsilon=float(l.eps))
            elif k == "relu":
                x = g.node("Relu", [x])
            elif k == "leaky_relu":  # the slope the integer model uses: slope_q8 / 256
                x = g.node("LeakyRelu", [x], alpha=l.slope_q8 / 256.0)
            elif k in ("maxpool2d", "avgpool2d", "maxpool1d"):
                kk = [l.kernel] if k == "maxpool1d" else list(l.kernel)
                ss = [l.stride] if k == "maxpool1d" else list(l.stride)
                x = g.node("MaxPool" if k.startswith("max") else "AveragePool", [x], kernel_shape=kk, strides=ss)
            elif k == "global_avgpool":
                x = g.node("Flatten", [g.node("GlobalAveragePool", [x])], axis=1)
            elif k == "flatten":
                r = len(l.in_shape)
                if r > 1:
                    x = g.node("Flatten", [g.node("Transpose", [x], perm=[0] + list(range(2, r + 1)) + [1])], axis=1)
            elif k == "residual":
                x = g.node("Add", [x, emit(l.inner, x, f"{li}_")])
            else:
                raise InteropError(f"layer {li} ({k}) has no ONNX export yet: exportable layers are conv2d, "
                                   "depthwise_conv2d, conv1d, dense, batchnorm, relu, leaky_relu, maxpool, avgpool, "
                                   "global_avgpool, flatten, residual")
        return x

    emit(model.layers, x, "")
    g.nodes[-1].output[0] = "logits"
    scaling = (f"input: float32 (N, {', '.join(map(str, shape))}) channels-last, in the dataset's float units "
               f"(tinytrain quantizes them to int8 at 2^{data_exp}); the graph multiplies by "
               f"2^{model.input_exp - data_exp}, the scale the model reads them at (input_exp {model.input_exp})"
               + ("; QuantizeLinear/DequantizeLinear int8 at 2^%d first, as tinytrain's input quantization" % data_exp
                  if qdq else ""))
    graph = helper.make_graph(
        g.nodes, model.name, [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", *shape])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", *model.output_shape])], g.inits)
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="tinytrain",
                          doc_string=scaling)
    m.ir_version = 10
    for key, v in (("input_scaling", scaling), ("data_input_exp", data_exp), ("input_exp", model.input_exp),
                   ("layout", "channels-last input (N, H, W, C) / (N, L, C) / (N, K)"),
                   ("weights", "qdq int16/int32 at 2^exp" if qdq else "float32 dequantized")):
        helper.set_model_props(m, {**{p.key: p.value for p in m.metadata_props}, f"tinytrain.{key}": str(v)})
    onnx.checker.check_model(m)
    if path is not None:
        from tinytrain.graph.io import atomic_write
        data = m.SerializeToString()
        atomic_write(path, lambda f: f.write(data))
    return m
