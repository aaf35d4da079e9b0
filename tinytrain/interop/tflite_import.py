"""TFLite import: an int8 or float .tflite chain -> the float graph (ir.FloatOp).

The flatbuffer is read with the ``tflite`` package (the generated schema). TFLite is already
channels-last (NHWC, conv weights OHWI, depthwise 1HWC, a FULLY_CONNECTED on a 4-D tensor
flattens it in H, W, C order), so no permutation is needed. Quantized constants are
dequantized with their per-tensor or per-channel scales (real = scale[c] * (q - zero_point[c])
along the quantized dimension), then quantized again the tinytrain way by ir.to_model: the
int8 activations' static scales of the file are not used (tinytrain's exponents are dynamic),
QUANTIZE/DEQUANTIZE at the boundaries are dropped. Supported ops: FULLY_CONNECTED, CONV_2D,
DEPTHWISE_CONV_2D (multiplier 1), MAX_POOL_2D, AVERAGE_POOL_2D, MEAN over H and W (global
average pooling), RESHAPE (flattening), RELU and the fused RELU, a final SOFTMAX (dropped).
Padding SAME is TF's rule, which is tinytrain's "same".
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from tinytrain.interop.ir import FloatOp, InteropError, to_model, unsupported

_DTYPES = {0: np.float32, 2: np.int32, 9: np.int8, 3: np.uint8, 7: np.int16, 4: np.int64}


def _opname(code: int) -> str:
    import tflite
    names = {v: k for k, v in vars(tflite.BuiltinOperator).items() if not k.startswith("_")}
    return names.get(code, f"builtin {code}")


def tflite_graph(buf: bytes):
    """(float ops, tinytrain input shape) of a .tflite flatbuffer."""
    import tflite
    from tflite.BuiltinOperator import BuiltinOperator as B

    from tinytrain.interop import ir

    try:
        m = tflite.Model.GetRootAsModel(buf, 0)
        sg = m.Subgraphs(0)
    except Exception as exc:
        raise InteropError(f"not a readable TFLite flatbuffer ({type(exc).__name__})") from None
    if m.SubgraphsLength() != 1:
        raise InteropError(f"the TFLite model has {m.SubgraphsLength()} subgraphs: tinytrain imports one")

    def const(i):
        t = sg.Tensors(int(i))
        data = m.Buffers(t.Buffer()).DataAsNumpy()
        if isinstance(data, int) or data.size == 0:
            return None
        a = data.view(_DTYPES[t.Type()]).reshape(t.ShapeAsNumpy()).astype(np.float64)
        q = t.Quantization()
        if q is not None and q.ScaleLength():
            sc, zp = q.ScaleAsNumpy().astype(np.float64), q.ZeroPointAsNumpy().astype(np.float64)
            shape = [1] * a.ndim
            if sc.size > 1:
                shape[q.QuantizedDimension()] = -1
            a = (a - zp.reshape(shape)) * sc.reshape(shape)
        return a

    def weight(op, k, what, node):
        idx = op.InputsAsNumpy()
        if k >= len(idx) or idx[k] < 0:
            return None
        w = const(idx[k])
        if w is None:
            raise InteropError(f"node {node!r}: its {what} (tensor {sg.Tensors(int(idx[k])).Name().decode()!r}) has "
                               "no data: a missing weight")
        return w

    inputs = sg.InputsAsNumpy()
    if len(inputs) != 1:
        raise InteropError(f"the TFLite model has {len(inputs)} inputs: tinytrain models take one")
    t_in = sg.Tensors(int(inputs[0]))
    sig = t_in.ShapeSignatureAsNumpy() if t_in.ShapeSignatureLength() else t_in.ShapeAsNumpy()
    if any(int(d) < 0 for d in sig[1:]):
        raise InteropError(f"input {t_in.Name().decode()!r} has a dynamic shape {list(sig)}: only the batch "
                           "dimension may be dynamic")
    input_shape = tuple(int(d) for d in t_in.ShapeAsNumpy()[1:])
    cur, ops, rank = int(inputs[0]), [], len(input_shape)
    n_ops = sg.OperatorsLength()
    for i in range(n_ops):
        op = sg.Operators(i)
        oc = m.OperatorCodes(op.OpcodeIndex())
        code = max(oc.BuiltinCode(), oc.DeprecatedBuiltinCode())
        name = sg.Tensors(int(op.OutputsAsNumpy()[0])).Name().decode() or f"op{i}"
        data_in = [int(x) for x in op.InputsAsNumpy()[:1]]
        if data_in != [cur]:
            raise InteropError(f"node {name!r} ({_opname(code)}) does not read the previous node's output alone: "
                               "only chains of layers are imported")
        cur = int(op.OutputsAsNumpy()[0])
        opts = op.BuiltinOptions()
        new, act = [], 0
        if code in (B.QUANTIZE, B.DEQUANTIZE):
            continue
        if code in (B.SOFTMAX, B.LOG_SOFTMAX) and i == n_ops - 1:
            continue
        if code == B.FULLY_CONNECTED:
            o = tflite.FullyConnectedOptions()
            o.Init(opts.Bytes, opts.Pos)
            w = weight(op, 1, "weights", name)
            b = weight(op, 2, "bias", name)
            if rank > 1:
                new.append(FloatOp("flatten", name + ":flatten"))
            new.append(FloatOp("dense", name, {"units": int(w.shape[0])},
                               {"w": w, "b": np.zeros(w.shape[0]) if b is None else b}))
            act, rank = o.FusedActivationFunction(), 1
        elif code in (B.CONV_2D, B.DEPTHWISE_CONV_2D):
            o = tflite.Conv2DOptions() if code == B.CONV_2D else tflite.DepthwiseConv2DOptions()
            o.Init(opts.Bytes, opts.Pos)
            if o.DilationHFactor() != 1 or o.DilationWFactor() != 1:
                raise unsupported(_opname(code), name, "dilation")
            w = weight(op, 1, "filter", name)
            b = weight(op, 2, "bias", name)
            b = np.zeros(w.shape[-1] if code != B.CONV_2D else w.shape[0]) if b is None else b
            kw = {"kernel": [int(w.shape[1]), int(w.shape[2])], "stride": [o.StrideH(), o.StrideW()],
                  "padding": "same" if o.Padding() == 0 else "valid"}
            if code == B.CONV_2D:
                new.append(FloatOp("conv2d", name, {"filters": int(w.shape[0]), **kw}, {"w": w, "b": b}))
            else:
                if o.DepthMultiplier() not in (0, 1):
                    raise unsupported("DEPTHWISE_CONV_2D", name, f"depth multiplier {o.DepthMultiplier()}, only 1")
                new.append(FloatOp("depthwise_conv2d", name, kw, {"w": w[0], "b": b}))
            act = o.FusedActivationFunction()
        elif code in (B.MAX_POOL_2D, B.AVERAGE_POOL_2D):
            o = tflite.Pool2DOptions()
            o.Init(opts.Bytes, opts.Pos)
            kind = "maxpool2d" if code == B.MAX_POOL_2D else "avgpool2d"
            new.append(FloatOp(kind, name, {"kernel": [o.FilterHeight(), o.FilterWidth()],
                                            "stride": [o.StrideH(), o.StrideW()]}))
            if o.Padding() == 0:  # SAME: fine only when it adds no padding
                H, W = sg.Tensors(data_in[0]).ShapeAsNumpy()[1:3]
                if H % o.StrideH() or W % o.StrideW() or o.FilterHeight() > o.StrideH() or o.FilterWidth() > o.StrideW():
                    raise unsupported(_opname(code), name, "SAME padding that pads: tinytrain pools have none")
            act = o.FusedActivationFunction()
        elif code == B.MEAN:
            axes = sorted(int(a) for a in weight(op, 1, "axes", name).reshape(-1))
            if axes != [1, 2]:
                raise unsupported("MEAN", name, f"over axes {axes}: only 1, 2 (global average pooling)")
            new.append(FloatOp("global_avgpool", name))
            rank = 1
        elif code == B.RESHAPE:
            out_shape = sg.Tensors(cur).ShapeAsNumpy()
            if len(out_shape) != 2:
                raise unsupported("RESHAPE", name, f"to {list(out_shape)}: only flattening to (N, K)")
            new.append(FloatOp("flatten", name))
            rank = 1
        elif code == B.RELU:
            new.append(FloatOp("relu", name))
        elif code == B.LEAKY_RELU:
            o = tflite.LeakyReluOptions()
            o.Init(opts.Bytes, opts.Pos)
            new.append(FloatOp("leaky_relu", name, {"alpha": float(o.Alpha())}))
        else:
            raise unsupported(_opname(code), name)
        if act == 1:
            new.append(FloatOp("relu", name + ":relu"))
        elif act != 0:
            raise unsupported(f"fused activation {act}", name, "only RELU (or none)")
        ops += new
    if not ops:
        raise InteropError("the TFLite model has no layers to import")
    return ir.fold_batchnorm(ops), input_shape


def from_tflite(path_or_bytes, *, dataset=None, input_scale="unit", optimizer=None, seed: int = 0,
                name: str | None = None, calibrate: int = 100):
    """The tinytrain model of an int8 or float .tflite file (or its bytes); see
    torch_import.from_torch for the options and ``model.import_report``."""
    try:
        import tflite  # noqa: F401
    except ImportError:
        raise InteropError("TFLite import needs the tflite package: pip install 'tinytrain-mcu[interop]'") from None
    from tinytrain.interop import ir

    buf = path_or_bytes
    if not isinstance(buf, (bytes, bytearray)):
        p = Path(buf)
        if not p.is_file():
            raise InteropError(f"{p}: no such TFLite file")
        buf, name = p.read_bytes(), name or p.stem
    if len(buf) < 8 or buf[4:8] != b"TFL3":
        raise InteropError("not a TFLite model (no TFL3 identifier)")
    ops, shape = tflite_graph(bytes(buf))
    built = to_model(ops, shape, dataset=dataset, input_scale=input_scale, optimizer=optimizer, seed=seed,
                     name=name or "tflite")
    if dataset is not None:
        built.model.import_report = ir.report(built, dataset, calibrate)
    return built.model
