"""ONNX import: a chain of supported ONNX ops -> the float graph (ir.FloatOp).

ONNX graphs are channels-first (NCHW / NCL) like PyTorch's (``torch.onnx.export``) and are
converted the same way (see torch_import). Supported ops: Gemm (transB 0 or 1, alpha/beta
folded), MatMul followed by Add (a Linear), Conv (group 1 or depthwise; pads, strides,
auto_pad SAME_UPPER/VALID; dilations 1), Relu, MaxPool/AveragePool (no padding),
GlobalAveragePool, Flatten (axis 1), Reshape to (N, -1), BatchNormalization, Pad (zeros,
before a Conv), Identity, Dropout, and a final Softmax/LogSoftmax (dropped: tinytrain's loss
head replaces it). Weights must be initializers (or Constant nodes); the input's sample
dimensions must be fixed numbers (only the batch dimension may be symbolic).
"""
from __future__ import annotations

import numpy as np

from tinytrain.interop.ir import FloatOp, InteropError, to_model, unsupported


def _attrs(node) -> dict:
    from onnx import helper
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


#: ops whose other inputs are weights: one that is not a constant is a missing weight
_WEIGHTED = ("Gemm", "MatMul", "Conv", "BatchNormalization", "Add")


def onnx_graph(model, fold_batchnorm: bool = False):
    """(float ops, tinytrain input shape) of an onnx ModelProto."""
    from onnx import numpy_helper

    from tinytrain.interop import ir

    g = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in g.initializer}
    nodes = _fold_constants(model, consts)
    consts = {k: np.asarray(v).astype(np.float64) for k, v in consts.items()}
    inputs = [i for i in g.input if i.name not in consts]
    if len(inputs) != 1:
        raise InteropError(f"the ONNX graph has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}): "
                           "tinytrain models take one")
    inp = inputs[0]
    dims = inp.type.tensor_type.shape.dim
    sample = []
    for i, d in enumerate(dims[1:], 1):
        if not d.HasField("dim_value") or d.dim_value <= 0:
            raise InteropError(f"input {inp.name!r} has a dynamic dimension {i} ({d.dim_param or '?'}): "
                               "only the batch dimension may be symbolic; export with a fixed sample shape")
        sample.append(int(d.dim_value))
    if not 1 <= len(sample) <= 3:
        raise InteropError(f"input {inp.name!r} has shape {[d.dim_value or d.dim_param for d in dims]}: "
                           "give (N, K), (N, C, L) or (N, C, H, W)")
    sample = tuple(sample)
    input_shape = sample if len(sample) == 1 else sample[1:] + sample[:1]

    def weight(node, idx, what):
        if idx >= len(node.input) or not node.input[idx]:
            return None
        name = node.input[idx]
        if name not in consts:
            raise InteropError(f"node {node.name or node.op_type!r} ({node.op_type}): its {what} {name!r} is "
                               "not an initializer (a missing weight, or computed at run time): "
                               "export with constant weights")
        return consts[name]

    ops: list[FloatOp] = []
    cur, pad, rank, last, matmul_open, at = inp.name, None, len(sample), None, False, {}
    for i, n in enumerate(nodes):
        name = n.name or f"{n.op_type}_{i}"
        at[cur] = len(ops)  # the ops made after cur start here
        data = [x for x in n.input if x and x not in consts]
        if n.op_type == "Add" and len(data) == 2:  # a residual block y = x + f(x)
            skip = data[0] if data[1] == cur else data[1] if data[0] == cur else None
            if skip not in at or skip == cur:
                raise InteropError(f"node {name!r} (Add) adds two tensors that are not a block's input and its "
                                   "output: only chains and residual blocks y = x + f(x) are imported")
            ops, cur, matmul_open = ir.residual(ops, at[skip], name), n.output[0], False
            continue
        extra = [x for x in n.input[1:] if x and x not in consts]
        if not n.input or n.input[0] != cur or (extra and n.op_type not in _WEIGHTED):
            raise InteropError(f"node {name!r} ({n.op_type}) does not read the previous node's output alone: "
                               "only chains of layers (no branches, no skip connections) are imported")
        cur = n.output[0]
        a, t, op = _attrs(n), n.op_type, None
        final = i == len(nodes) - 1
        if t in ("Identity", "Dropout"):
            continue
        if t in ("Softmax", "LogSoftmax") and final:
            continue
        if t == "Pad":
            if a.get("mode", b"constant") not in (b"constant", "constant"):
                raise unsupported("Pad", name, "only constant zero padding")
            p = weight(n, 1, "pads") if len(n.input) > 1 else np.array(a["pads"])
            cval = weight(n, 2, "constant value")
            if cval is not None and float(cval.reshape(-1)[0]) != 0:
                raise unsupported("Pad", name, "only zero padding")
            p = [int(v) for v in p]
            h = len(p) // 2
            begin, end = p[:h], p[h:]
            if begin[:2] != [0, 0] or end[:2] != [0, 0]:
                raise unsupported("Pad", name, "padding of the batch or channel axis")
            pp = [v for b, e in zip(begin[2:], end[2:]) for v in (b, e)]
            pad, last = (pp if pad is None else [x + y for x, y in zip(pad, pp)]), name
            continue
        if t == "Conv":
            op = _conv(n, name, a, weight(n, 1, "weight"), weight(n, 2, "bias"), pad)
            pad = None
        elif t in ("Gemm", "MatMul"):
            w = weight(n, 1, "weight")
            if t == "Gemm":
                if a.get("transA", 0):
                    raise unsupported("Gemm", name, "transA=1")
                w = w if a.get("transB", 0) else w.T
                w = w * a.get("alpha", 1.0)
                b = weight(n, 2, "bias")
                b = np.zeros(w.shape[0]) if b is None else np.broadcast_to(b * a.get("beta", 1.0), (w.shape[0],)).copy()
            else:
                w, b = w.T, np.zeros(w.shape[1])
            op = FloatOp("dense", name, {"units": int(w.shape[0])}, {"w": w, "b": b}, chw_columns=True)
        elif t == "Add" and matmul_open:  # MatMul + Add is a Linear with a bias
            ops[-1].weights["b"] = ops[-1].weights["b"] + weight(n, 1, "bias").reshape(-1)
            matmul_open = False
            continue
        elif t == "Relu":
            op = FloatOp("relu", name)
        elif t == "LeakyRelu":
            op = FloatOp("leaky_relu", name, {"alpha": float(a.get("alpha", 0.01))})
        elif t in ("MaxPool", "AveragePool"):
            if any(a.get("pads", [])) or a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [])):
                raise unsupported(t, name, "padding, ceil_mode or dilations: tinytrain pools have none")
            ks, st = list(a["kernel_shape"]), list(a.get("strides", a["kernel_shape"]))
            if len(ks) == 1:
                if t == "AveragePool":
                    raise unsupported(t, name, "1-D average pooling")
                op = FloatOp("maxpool1d", name, {"kernel": ks[0], "stride": st[0]})
            else:
                op = FloatOp("maxpool2d" if t == "MaxPool" else "avgpool2d", name, {"kernel": ks, "stride": st})
        elif t == "GlobalAveragePool":
            op, rank = FloatOp("global_avgpool", name), 1
        elif t == "Flatten":
            if a.get("axis", 1) != 1:
                raise unsupported("Flatten", name, f"axis={a.get('axis')}: only 1")
            op = FloatOp("flatten", name)
        elif t == "Reshape":
            shp = [int(v) for v in weight(n, 1, "shape")]
            if len(shp) != 2:
                raise unsupported("Reshape", name, f"to {shp}: only flattening to (N, -1)")
            op = FloatOp("flatten", name)
        elif t == "BatchNormalization":
            opts = {"eps": float(a.get("epsilon", 1e-5)), "momentum": 1.0 - float(a.get("momentum", 0.9))}
            if rank == 1:
                opts["_flat"] = True
            op = FloatOp("batchnorm", name, opts, {"gamma": weight(n, 1, "scale"), "beta": weight(n, 2, "bias"),
                                                   "mean": weight(n, 3, "mean"), "var": weight(n, 4, "variance")})
        else:
            raise unsupported(t, name)
        if pad is not None:
            raise unsupported("Pad", last, "only before a Conv")
        if op.kind in ("flatten", "dense"):
            rank = 1
        matmul_open = t == "MatMul"
        ops.append(op)
    if pad is not None:
        raise unsupported("Pad", last, "only before a Conv")
    if not ops:
        raise InteropError("the ONNX graph has no layers to import")
    ops = ir.fold_batchnorm(ops, only_flat=True)
    if fold_batchnorm:
        ops = ir.fold_batchnorm(ops)
    return ops, input_shape


def _fold_constants(model, consts: dict) -> list:
    """Evaluate every node whose inputs are constants (Constant nodes, the shape arithmetic
    exporters emit around Pad and Reshape, Shape of a tensor whose shape is static) into
    `consts`; returns the nodes left, in order."""
    from onnx import helper, numpy_helper, shape_inference
    from onnx.reference import ReferenceEvaluator

    try:
        shapes = {v.name: v for v in shape_inference.infer_shapes(model).graph.value_info}
    except Exception:  # a graph onnx cannot infer: fold what needs no shapes
        shapes = {}
    shapes.update({v.name: v for v in model.graph.input})
    left = []
    for n in model.graph.node:
        if n.op_type == "Constant":
            consts[n.output[0]] = numpy_helper.to_array(_attrs(n)["value"])
            continue
        if n.op_type == "Shape" and n.input[0] in shapes:
            dims = shapes[n.input[0]].type.tensor_type.shape.dim
            if dims and all(d.HasField("dim_value") for d in dims):
                a = _attrs(n)
                full = np.array([d.dim_value for d in dims], np.int64)
                consts[n.output[0]] = full[a.get("start", 0):a.get("end", len(full))]
                continue
        if n.input and all(not x or x in consts for x in n.input):
            ins = [x for x in n.input if x]
            sub = helper.make_model(helper.make_graph(
                [n], "fold", [helper.make_tensor_value_info(x, helper.np_dtype_to_tensor_dtype(consts[x].dtype), None)
                              for x in ins], [helper.make_empty_tensor_value_info(o) for o in n.output]),
                opset_imports=model.opset_import)
            outs = ReferenceEvaluator(sub).run(None, {x: consts[x] for x in ins})
            consts.update(zip(n.output, outs))
            continue
        left.append(n)
    return left


def _conv(n, name, a, w, b, pad) -> FloatOp:
    if w is None:
        raise InteropError(f"node {name!r} (Conv) has no weight input")
    if any(d != 1 for d in a.get("dilations", [])):
        raise unsupported("Conv", name, f"dilations {a['dilations']}, only 1")
    nd = w.ndim - 2
    k = list(w.shape[2:])
    st = list(a.get("strides", [1] * nd))
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("NOTSET", "VALID"):
        p = list(a.get("pads", [0] * 2 * nd)) if auto == "NOTSET" else [0] * 2 * nd
        p = [v for i in range(nd) for v in (p[i], p[i + nd])]   # ONNX: begins then ends
    elif auto == "SAME_UPPER" and all(s == 1 for s in st):
        p = [v for kk in k for v in ((kk - 1) // 2, kk - 1 - (kk - 1) // 2)]
    else:
        raise unsupported("Conv", name, f"auto_pad={auto} with strides {st}")
    if pad is not None:
        p = [x + y for x, y in zip(p, pad)]
    b = np.zeros(w.shape[0]) if b is None else b
    group = int(a.get("group", 1))
    if nd == 1:
        if group != 1:
            raise unsupported("Conv", name, f"1-D with group={group}")
        return FloatOp("conv1d", name, {"filters": int(w.shape[0]), "kernel": k[0], "stride": st[0], "padding": p},
                       {"w": w.transpose(0, 2, 1), "b": b})
    opts = {"kernel": k, "stride": st, "padding": p}
    if group == 1:
        return FloatOp("conv2d", name, {"filters": int(w.shape[0]), **opts}, {"w": w.transpose(0, 2, 3, 1), "b": b})
    if w.shape[1] == 1 and group == w.shape[0]:
        return FloatOp("depthwise_conv2d", name, opts, {"w": w[:, 0].transpose(1, 2, 0), "b": b})
    raise unsupported("Conv", name, f"group={group}: only 1 or depthwise (group = channels, one filter each)")


def from_onnx(path_or_model, *, dataset=None, input_scale="unit", fold_batchnorm: bool = False,
              optimizer=None, seed: int = 0, name: str | None = None, calibrate: int = 100):
    """The tinytrain model of an ONNX file or ModelProto (post-training quantization); see
    torch_import.from_torch for the options and ``model.import_report``."""
    try:
        import onnx
    except ImportError:
        raise InteropError("ONNX import needs the onnx package: pip install 'tinytrain-mcu[interop]'") from None
    from pathlib import Path

    from tinytrain.interop import ir

    m = path_or_model
    if not isinstance(m, onnx.ModelProto):
        p = Path(m)
        if not p.is_file():
            raise InteropError(f"{p}: no such ONNX file")
        try:
            m = onnx.load(str(p))
        except Exception as exc:
            raise InteropError(f"{p}: not a readable ONNX model ({type(exc).__name__}: "
                               f"{' '.join(str(exc).split())[:150]})") from None
        name = name or p.stem
    ops, shape = onnx_graph(m, fold_batchnorm)
    built = to_model(ops, shape, dataset=dataset, input_scale=input_scale, optimizer=optimizer, seed=seed,
                     name=name or m.graph.name or "onnx")
    if dataset is not None:
        built.model.import_report = ir.report(built, dataset, calibrate)
    return built.model
