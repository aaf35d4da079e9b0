"""Write a fully int8 .tflite of a Dense/ReLU chain with the flatbuffer schema (``tflite``).

No TFLite converter installs on the project's machines (they need TensorFlow), so the tests
and the benchmark make their int8 model here, the way the converter's post-training
quantization does it: weights int8 symmetric per output channel (scale max|w_c| / 127,
quantized dimension 0), biases int32 at scale s_in * s_w[c], activations int8 asymmetric per
tensor from the calibration data's range (a fused RELU's range starts at 0).
``ai_edge_litert``'s interpreter runs the result.
"""
from __future__ import annotations

import numpy as np


def _qparams_range(lo: float, hi: float) -> tuple[float, int]:
    lo, hi = min(lo, 0.0), max(hi, 0.0)
    s = (hi - lo) / 255.0 or 1.0
    return s, int(np.clip(round(-128 - lo / s), -128, 127))


def int8_dense_chain(layers, x_calib: np.ndarray) -> bytes:
    """layers: [(w (N, K) float, b (N,) float, relu bool)]; x_calib (n, K) float inputs."""
    import flatbuffers
    import tflite
    from tflite.ActivationFunctionType import ActivationFunctionType as Act
    from tflite.BuiltinOperator import BuiltinOperator as B
    from tflite.BuiltinOptions import BuiltinOptions
    from tflite.TensorType import TensorType as T

    b = flatbuffers.Builder(4096)
    buffers, tensors, operators = [], [], []

    def buffer(data: bytes | None) -> int:
        vec = b.CreateNumpyVector(np.frombuffer(data, np.uint8)) if data else None
        tflite.BufferStart(b)
        if vec is not None:
            tflite.BufferAddData(b, vec)
        buffers.append(tflite.BufferEnd(b))
        return len(buffers) - 1

    def tensor(name, shape, ttype, data=None, scale=None, zp=None, qdim=0) -> int:
        buf = buffer(data)
        q = None
        if scale is not None:
            sv = b.CreateNumpyVector(np.asarray(scale, np.float32).reshape(-1))
            zv = b.CreateNumpyVector(np.asarray(zp, np.int64).reshape(-1))
            tflite.QuantizationParametersStart(b)
            tflite.QuantizationParametersAddScale(b, sv)
            tflite.QuantizationParametersAddZeroPoint(b, zv)
            tflite.QuantizationParametersAddQuantizedDimension(b, qdim)
            q = tflite.QuantizationParametersEnd(b)
        nm = b.CreateString(name)
        sh = b.CreateNumpyVector(np.asarray(shape, np.int32))
        tflite.TensorStart(b)
        tflite.TensorAddShape(b, sh)
        tflite.TensorAddType(b, ttype)
        tflite.TensorAddBuffer(b, buf)
        tflite.TensorAddName(b, nm)
        if q is not None:
            tflite.TensorAddQuantization(b, q)
        tensors.append(tflite.TensorEnd(b))
        return len(tensors) - 1

    buffer(None)  # buffer 0: the empty buffer, by convention
    a = np.asarray(x_calib, np.float64)
    s_x, zp_x = _qparams_range(float(a.min()), float(a.max()))
    t_in = tensor("input", [1, a.shape[1]], T.INT8, scale=[s_x], zp=[zp_x])
    cur = t_in
    for li, (w, bias, relu) in enumerate(layers):
        w, bias = np.asarray(w, np.float64), np.asarray(bias, np.float64)
        s_w = np.maximum(np.abs(w).max(axis=1), 1e-12) / 127.0
        wq = np.clip(np.round(w / s_w[:, None]), -127, 127).astype(np.int8)
        bq = np.round(bias / (s_x * s_w)).astype(np.int32)
        a = a @ w.T + bias
        if relu:
            a = np.maximum(a, 0)
        s_y, zp_y = _qparams_range(float(a.min()), float(a.max()))
        t_w = tensor(f"l{li}/weights", list(w.shape), T.INT8, wq.tobytes(), s_w, np.zeros(len(s_w)), 0)
        t_b = tensor(f"l{li}/bias", [len(bias)], T.INT32, bq.tobytes(), s_x * s_w, np.zeros(len(s_w)), 0)
        t_y = tensor(f"l{li}/out", [1, w.shape[0]], T.INT8, scale=[s_y], zp=[zp_y])
        tflite.FullyConnectedOptionsStart(b)
        tflite.FullyConnectedOptionsAddFusedActivationFunction(b, Act.RELU if relu else Act.NONE)
        opt = tflite.FullyConnectedOptionsEnd(b)
        ins = b.CreateNumpyVector(np.array([cur, t_w, t_b], np.int32))
        outs = b.CreateNumpyVector(np.array([t_y], np.int32))
        tflite.OperatorStart(b)
        tflite.OperatorAddOpcodeIndex(b, 0)
        tflite.OperatorAddInputs(b, ins)
        tflite.OperatorAddOutputs(b, outs)
        tflite.OperatorAddBuiltinOptionsType(b, BuiltinOptions.FullyConnectedOptions)
        tflite.OperatorAddBuiltinOptions(b, opt)
        operators.append(tflite.OperatorEnd(b))
        cur, s_x = t_y, s_y

    def vector(items):
        b.StartVector(4, len(items), 4)
        for x in reversed(items):
            b.PrependUOffsetTRelative(x)
        return b.EndVector()

    tflite.OperatorCodeStart(b)
    tflite.OperatorCodeAddDeprecatedBuiltinCode(b, B.FULLY_CONNECTED)
    tflite.OperatorCodeAddBuiltinCode(b, B.FULLY_CONNECTED)
    tflite.OperatorCodeAddVersion(b, 5)
    codes = [tflite.OperatorCodeEnd(b)]
    tv, ov = vector(tensors), vector(operators)
    iv, outv = b.CreateNumpyVector(np.array([t_in], np.int32)), b.CreateNumpyVector(np.array([cur], np.int32))
    name = b.CreateString("main")
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, tv)
    tflite.SubGraphAddInputs(b, iv)
    tflite.SubGraphAddOutputs(b, outv)
    tflite.SubGraphAddOperators(b, ov)
    tflite.SubGraphAddName(b, name)
    sg = tflite.SubGraphEnd(b)
    cv, sv, bv = vector(codes), vector([sg]), vector(buffers)
    desc = b.CreateString("tinytrain int8 writer")
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, cv)
    tflite.ModelAddSubgraphs(b, sv)
    tflite.ModelAddDescription(b, desc)
    tflite.ModelAddBuffers(b, bv)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def run_interpreter(model: bytes, x: np.ndarray) -> np.ndarray:
    """The int8 model's dequantized outputs on float inputs x (n, K), one sample at a time,
    quantizing x with the input tensor's scale and zero point as a TFLite user does."""
    from ai_edge_litert.interpreter import Interpreter

    it = Interpreter(model_content=model)
    it.allocate_tensors()
    di, do = it.get_input_details()[0], it.get_output_details()[0]
    (s_in, zp_in), (s_out, zp_out) = di["quantization"], do["quantization"]
    out = []
    for row in np.asarray(x, np.float64):
        q = np.clip(np.round(row / s_in) + zp_in, -128, 127).astype(np.int8)[None]
        it.set_tensor(di["index"], q)
        it.invoke()
        out.append((it.get_tensor(do["index"])[0].astype(np.float64) - zp_out) * s_out)
    return np.array(out)
