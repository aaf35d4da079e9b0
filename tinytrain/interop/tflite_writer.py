"""Write a .tflite (int8 or float) of a float graph with the flatbuffer schema (``tflite``).

No TFLite converter installs on the project's machines (they need TensorFlow), so the tests
and the benchmark make their .tflite files here. ``write_tflite`` takes the float graph the
importers produce (``ir.FloatOp``, channels-last, which is TFLite's layout; BatchNorm is
folded first, as the converter does) and writes what the converter's post-training
quantization writes: int8 weights symmetric per output channel (scale max|w_c| / 127; conv and
dense on dimension 0, depthwise on dimension 3), int32 biases at scale s_in * s_w[c], int8
activations asymmetric per tensor from the calibration data's range (a fused RELU's range starts
at 0; pooling and reshape keep their input's parameters, as TFLite requires). ``int8=False``
writes the float32 model. ``run_interpreter`` runs either with ``ai_edge_litert``.
"""
from __future__ import annotations

import numpy as np

from tinytrain.interop.ir import InteropError


def _qparams_range(lo: float, hi: float) -> tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    s = (hi - lo) / 255.0 or 1.0
    return s, int(np.clip(round(-128 - lo / s), -128, 127))


def _per_tensor(a: np.ndarray) -> tuple:
    s, zp = _qparams_range(float(a.min()), float(a.max()))
    return [s], [zp], 0


class _Writer:
    def __init__(self, int8: bool):
        import flatbuffers
        import tflite
        self.tfl, self.b, self.int8 = tflite, flatbuffers.Builder(1 << 16), int8
        self.buffers, self.tensors, self.operators, self.codes = [], [], [], []
        self.buffer(None)  # buffer 0: the empty buffer, by convention

    def buffer(self, data: bytes | None) -> int:
        t, b = self.tfl, self.b
        vec = b.CreateNumpyVector(np.frombuffer(data, np.uint8)) if data else None
        t.BufferStart(b)
        if vec is not None:
            t.BufferAddData(b, vec)
        self.buffers.append(t.BufferEnd(b))
        return len(self.buffers) - 1

    def tensor(self, name, shape, array=None, q=None, ttype=None) -> int:
        """A tensor: constant `array` (its dtype picks the type) or an activation; q =
        (scales, zero points, quantized dimension) or None."""
        from tflite.TensorType import TensorType as T
        t, b = self.tfl, self.b
        types = {np.dtype(np.int8): T.INT8, np.dtype(np.int32): T.INT32, np.dtype(np.float32): T.FLOAT32}
        if ttype is None:
            ttype = types[array.dtype] if array is not None else (T.INT8 if self.int8 else T.FLOAT32)
        buf = self.buffer(array.tobytes() if array is not None else None)
        qp = None
        if q is not None:
            sv = b.CreateNumpyVector(np.asarray(q[0], np.float32).reshape(-1))
            zv = b.CreateNumpyVector(np.asarray(q[1], np.int64).reshape(-1))
            t.QuantizationParametersStart(b)
            t.QuantizationParametersAddScale(b, sv)
            t.QuantizationParametersAddZeroPoint(b, zv)
            t.QuantizationParametersAddQuantizedDimension(b, q[2])
            qp = t.QuantizationParametersEnd(b)
        nm, sh = b.CreateString(name), b.CreateNumpyVector(np.asarray(shape, np.int32))
        t.TensorStart(b)
        t.TensorAddShape(b, sh)
        t.TensorAddType(b, ttype)
        t.TensorAddBuffer(b, buf)
        t.TensorAddName(b, nm)
        if qp is not None:
            t.TensorAddQuantization(b, qp)
        self.tensors.append(t.TensorEnd(b))
        return len(self.tensors) - 1

    def opcode(self, code: int) -> int:
        if code not in self.codes:
            self.codes.append(code)
        return self.codes.index(code)

    def operator(self, code, inputs, outputs, opt_type=0, opt=None):
        t, b = self.tfl, self.b
        ins = b.CreateNumpyVector(np.array(inputs, np.int32))
        outs = b.CreateNumpyVector(np.array(outputs, np.int32))
        t.OperatorStart(b)
        t.OperatorAddOpcodeIndex(b, self.opcode(code))
        t.OperatorAddInputs(b, ins)
        t.OperatorAddOutputs(b, outs)
        if opt is not None:
            t.OperatorAddBuiltinOptionsType(b, opt_type)
            t.OperatorAddBuiltinOptions(b, opt)
        self.operators.append(t.OperatorEnd(b))

    def options(self, kind: str, **fields):
        """A builtin options table: kind is the schema's name (Conv2DOptions, ...)."""
        b, start = self.b, getattr(self.tfl, f"{kind}Start")
        start(b)
        for k, v in fields.items():
            getattr(self.tfl, f"{kind}Add{k}")(b, v)
        return getattr(self.tfl, f"{kind}End")(b)

    def vector(self, items):
        self.b.StartVector(4, len(items), 4)
        for x in reversed(items):
            self.b.PrependUOffsetTRelative(x)
        return self.b.EndVector()

    def finish(self, t_in, t_out) -> bytes:
        t, b = self.tfl, self.b
        codes = []
        for c in self.codes:
            t.OperatorCodeStart(b)
            t.OperatorCodeAddDeprecatedBuiltinCode(b, min(c, 127))
            t.OperatorCodeAddBuiltinCode(b, c)
            t.OperatorCodeAddVersion(b, 1)
            codes.append(t.OperatorCodeEnd(b))
        tv, ov = self.vector(self.tensors), self.vector(self.operators)
        iv, outv = b.CreateNumpyVector(np.array([t_in], np.int32)), b.CreateNumpyVector(np.array([t_out], np.int32))
        name = b.CreateString("main")
        t.SubGraphStart(b)
        t.SubGraphAddTensors(b, tv)
        t.SubGraphAddInputs(b, iv)
        t.SubGraphAddOutputs(b, outv)
        t.SubGraphAddOperators(b, ov)
        t.SubGraphAddName(b, name)
        sg = t.SubGraphEnd(b)
        cv, sv, bv = self.vector(codes), self.vector([sg]), self.vector(self.buffers)
        desc = b.CreateString("tinytrain tflite writer")
        t.ModelStart(b)
        t.ModelAddVersion(b, 3)
        t.ModelAddOperatorCodes(b, cv)
        t.ModelAddSubgraphs(b, sv)
        t.ModelAddDescription(b, desc)
        t.ModelAddBuffers(b, bv)
        b.Finish(t.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())


def write_tflite(ops, x_calib: np.ndarray, int8: bool = True) -> bytes:
    """A .tflite of the float graph `ops` (Dense columns in tinytrain order, as ir.to_model
    leaves them), calibrated on x_calib (n, *input_shape) channels-last floats."""
    from tflite.ActivationFunctionType import ActivationFunctionType as Act
    from tflite.BuiltinOperator import BuiltinOperator as B
    from tflite.BuiltinOptions import BuiltinOptions as O
    from tflite.Padding import Padding

    from tinytrain.interop import ir

    ops = ir.fold_batchnorm(list(ops))
    acts = ir.float_forward(ops, np.asarray(x_calib, np.float64), keep=True)
    w = _Writer(int8)
    x = np.asarray(x_calib, np.float64)
    q_cur = _per_tensor(x) if int8 else None
    shape = [1, *x.shape[1:]]
    cur = t_in = w.tensor("input", shape, q=q_cur)
    i = 0
    while i < len(ops):
        op = ops[i]
        relu = i + 1 < len(ops) and ops[i + 1].kind == "relu" and op.kind in ("dense", "conv2d", "depthwise_conv2d")
        a = acts[i + 1 if relu else i]
        out_shape = [1, *a.shape[1:]]
        q_out = _per_tensor(a) if int8 else None
        act = Act.RELU if relu else Act.NONE
        if op.kind in ("dense", "conv2d", "depthwise_conv2d"):
            wt, bias = op.weights["w"], op.weights["b"]
            if op.kind == "depthwise_conv2d":
                wt = wt[None]                          # (1, KH, KW, C)
            qdim = 3 if op.kind == "depthwise_conv2d" else 0
            if int8:
                axes = tuple(d for d in range(wt.ndim) if d != qdim)
                s_w = np.maximum(np.abs(wt).max(axis=axes), 1e-12) / 127.0
                shp = [1] * wt.ndim
                shp[qdim] = -1
                wq = np.clip(np.round(wt / s_w.reshape(shp)), -127, 127).astype(np.int8)
                s_b = q_cur[0][0] * s_w
                t_w = w.tensor(f"{op.node}/w", wt.shape, wq, (s_w, np.zeros(len(s_w)), qdim))
                t_b = w.tensor(f"{op.node}/b", bias.shape, np.round(bias / s_b).astype(np.int32),
                               (s_b, np.zeros(len(s_b)), 0))
            else:
                t_w = w.tensor(f"{op.node}/w", wt.shape, wt.astype(np.float32))
                t_b = w.tensor(f"{op.node}/b", bias.shape, bias.astype(np.float32))
            t_y = w.tensor(f"{op.node}/out", out_shape, q=q_out)
            if op.kind == "dense":
                w.operator(B.FULLY_CONNECTED, [cur, t_w, t_b], [t_y], O.FullyConnectedOptions,
                           w.options("FullyConnectedOptions", FusedActivationFunction=act))
            else:
                pad = _tf_padding(op, Padding)
                st = op.options.get("stride", [1, 1])
                kind, code, ot = (("Conv2DOptions", B.CONV_2D, O.Conv2DOptions) if op.kind == "conv2d" else
                                  ("DepthwiseConv2DOptions", B.DEPTHWISE_CONV_2D, O.DepthwiseConv2DOptions))
                extra = {"DepthMultiplier": 1} if op.kind == "depthwise_conv2d" else {}
                w.operator(code, [cur, t_w, t_b], [t_y], ot,
                           w.options(kind, Padding=pad, StrideW=st[1], StrideH=st[0], FusedActivationFunction=act,
                                     DilationWFactor=1, DilationHFactor=1, **extra))
            i += 2 if relu else 1
        elif op.kind in ("maxpool2d", "avgpool2d", "flatten", "relu"):
            t_y = w.tensor(f"{op.node}/out", out_shape, q=q_cur if op.kind != "relu" else q_out)
            if op.kind == "flatten":
                t_s = w.tensor(f"{op.node}/shape", [2], np.array([1, -1], np.int32))
                w.operator(B.RESHAPE, [cur, t_s], [t_y], O.ReshapeOptions,
                           w.options("ReshapeOptions", NewShape=w.b.CreateNumpyVector(np.array([1, -1], np.int32))))
            elif op.kind == "relu":
                w.operator(B.RELU, [cur], [t_y])
            else:
                k, s = op.options["kernel"], op.options.get("stride") or op.options["kernel"]
                w.operator(B.MAX_POOL_2D if op.kind == "maxpool2d" else B.AVERAGE_POOL_2D, [cur], [t_y], O.Pool2DOptions,
                           w.options("Pool2DOptions", Padding=Padding.VALID, StrideW=s[1], StrideH=s[0],
                                     FilterWidth=k[1], FilterHeight=k[0], FusedActivationFunction=Act.NONE))
            q_out = q_out if op.kind == "relu" else q_cur
            i += 1
        elif op.kind == "global_avgpool":
            t_y = w.tensor(f"{op.node}/out", out_shape, q=q_out)
            t_a = w.tensor(f"{op.node}/axes", [2], np.array([1, 2], np.int32))
            w.operator(B.MEAN, [cur, t_a], [t_y], O.ReducerOptions, w.options("ReducerOptions", KeepDims=False))
            i += 1
        else:
            raise InteropError(f"write_tflite: no TFLite op for {op.kind} (node {op.node!r})")
        cur, q_cur = t_y, q_out
    return w.finish(t_in, cur)


def _tf_padding(op, Padding) -> int:
    """SAME or VALID for the op's explicit padding (TFLite has nothing else)."""
    from tinytrain.ops import conv2d as r_c2
    p = op.options.get("padding", "valid")
    if isinstance(p, str):
        return Padding.SAME if p == "same" else Padding.VALID
    if not any(p):
        return Padding.VALID
    k, st = op.options["kernel"], op.options.get("stride", [1, 1])
    if all(s == 1 for s in st) and tuple(p) == r_c2.geometry(k[0], k[1], k[0], k[1], 1, "same")[3]:
        return Padding.SAME  # at stride 1 'same' pads by the kernel alone, whatever the input size
    raise InteropError(f"write_tflite: padding {p} of node {op.node!r} is neither SAME nor VALID")


def run_interpreter(model: bytes, x: np.ndarray) -> np.ndarray:
    """The model's (dequantized) outputs on float inputs x (n, *input_shape) channels-last, one
    sample at a time; an int8 input is quantized with its scale and zero point."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    it.allocate_tensors()
    di, do = it.get_input_details()[0], it.get_output_details()[0]
    (s_in, zp_in), (s_out, zp_out) = di["quantization"], do["quantization"]
    out = []
    for row in np.asarray(x, np.float64):
        v = row[None]
        if di["dtype"] == np.int8:
            v = np.clip(np.round(v / s_in) + zp_in, -128, 127).astype(np.int8)
        it.set_tensor(di["index"], v.astype(di["dtype"]))
        it.invoke()
        y = it.get_tensor(do["index"])[0].astype(np.float64)
        out.append((y - zp_out) * s_out if do["dtype"] == np.int8 else y)
    return np.array(out)
