"""The float graph every importer produces, and its conversion to a tinytrain model.

An importer (torch_import, onnx_import, tflite_import) turns a source model into a list of
``FloatOp``: one tinytrain layer kind, its options, and float64 weights already in tinytrain's
channels-last layout -- except a Dense that follows a Flatten of a channels-first tensor, whose
columns are still in the source's (C, H, W) / (C, L) order (``chw_columns``): only the builder
knows the shape that was flattened, so it permutes them (see ``to_model``).

Quantization (build time, floats allowed). tinytrain stores every parameter at a power-of-two
exponent that the layer fixes when it is built (Dense/Conv: from the fan-in; BatchNorm: the
exponents of ``ops.batchnorm.init_state``), and the ``.tt`` file rebuilds those exponents from
the configuration, so an import must use them. A weight tensor larger than its range is
therefore stored scaled by 2^-k instead (``weight_shift``): the integer forward is exactly
equivariant to a power-of-two scale (activations carry dynamic exponents; ReLU, pooling and
Flatten commute with it; BatchNorm removes it), so the codes of every later activation are the
same as at scale 1 and only the real value each code stands for changes. The builder tracks
that scale ``s`` (tinytrain value = float value * 2^s) from layer to layer: biases are stored
at 2^s', batch-norm statistics at 2^s and 2^2s (eps too), so the model computes the same
function up to a power of two on the logits, which leaves predictions unchanged (k is 0 for
weights within range, the usual case; the report lists every k).
Values are rounded half up (``layers._quantize``, tinytrain's own rule) and saturated.

Calibration: activations have per-sample dynamic exponents in tinytrain, so no activation
range is fixed at import; the calibration samples measure, per layer, the error of the integer
activations against the float graph (relative RMS) and the saturations, and the report gives
the accuracy of the float graph and of the integer model on the test split.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tinytrain.graph.layers import ModelError, layer_from_config
from tinytrain.graph.optim import SGD

#: what the importers accept, by source op (for error messages)
SUPPORTED = ("Linear/Gemm/FullyConnected, Conv1d, Conv2d (groups 1 or depthwise), ReLU, LeakyReLU, "
             "MaxPool (non-overlapping, no padding), AvgPool, global average pooling, Flatten, "
             "BatchNorm (as a layer or folded), zero padding before a convolution, Dropout/Identity, "
             "residual blocks x + f(x) of a chain f")

#: bits of the int16 range kept free at import (0: the layer's whole range, the one its own init
#: leaves 4x headroom in); a tensor beyond it is scaled down (weight_shift)
WEIGHT_HEADROOM_BITS = 0
#: batch-norm running statistics (int32 at 2^-16) stay below 2^14 in value
STAT_LIMIT_LOG2 = 14


class InteropError(ValueError):
    """A source model that cannot be imported (unsupported op, dynamic shape, missing weight,
    shape mismatch) or a model that cannot be exported; one line naming the node and the fix."""


@dataclass
class FloatOp:
    kind: str                       # a tinytrain layer kind: dense, conv2d, batchnorm, relu, ...
    node: str                       # the source node's name, for messages and the report
    options: dict = field(default_factory=dict)   # the tinytrain layer's options
    weights: dict = field(default_factory=dict)   # float64 arrays, tinytrain layout
    chw_columns: bool = False       # dense only: input columns in channels-first flatten order
    inner: list = field(default_factory=list)     # residual only: the block's f, y = x + f(x)


WEIGHTED = ("dense", "conv2d", "depthwise_conv2d", "conv1d")
SCALE_FREE = ("relu", "leaky_relu", "maxpool2d", "maxpool1d", "avgpool2d", "global_avgpool", "flatten")


def unsupported(op: str, node: str, why: str = "") -> InteropError:
    return InteropError(f"unsupported op {op} at node {node!r}{': ' + why if why else ''}; "
                        f"supported: {SUPPORTED}")


def residual(ops: list, start: int, node: str) -> list:
    """ops with ops[start:] (the branch f that read the chain at `start`) made one residual
    block y = x + f(x), as ``tinytrain.graph.residual.Residual``."""
    inner = ops[start:]
    if not inner:
        raise unsupported("Add", node, "of a tensor with itself")
    if any(o.kind == "residual" for o in inner):
        raise unsupported("Add", node, "nested residual blocks")
    return ops[:start] + [FloatOp("residual", node, inner=inner)]


# ------------------------------------------------------------------ graph rewrites

def fold_batchnorm(ops: list[FloatOp], only_flat: bool = False) -> list[FloatOp]:
    """Fold each BatchNorm that directly follows a Dense/Conv into it (eval statistics):
    w' = w * g / sqrt(var + eps) along the output channel, b' = (b - mean) * g / sqrt(var + eps)
    + beta. only_flat: fold only those on a flat input (tinytrain's BatchNorm needs positions)."""
    out: list[FloatOp] = []
    for op in ops:
        if op.kind == "residual":
            op = FloatOp(op.kind, op.node, op.options, op.weights, inner=fold_batchnorm(op.inner, only_flat))
        prev = out[-1] if out else None
        if op.kind == "batchnorm" and (not only_flat or op.options.get("_flat")):
            if prev is None or prev.kind not in WEIGHTED:
                if only_flat:
                    raise unsupported("BatchNorm", op.node, "on a flat input it must follow a Linear layer "
                                      "(it is folded into it)")
                raise unsupported("BatchNorm", op.node, "folding needs a Linear/Conv right before it")
            w = op.weights
            f = w["gamma"] / np.sqrt(w["var"] + w.get("eps", op.options.get("eps", 1e-5)))
            pw = dict(prev.weights)
            axis = -1 if prev.kind == "depthwise_conv2d" else 0
            shape = [1] * pw["w"].ndim
            shape[axis] = -1
            pw["w"] = pw["w"] * f.reshape(shape)
            pw["b"] = (pw["b"] - w["mean"]) * f + w["beta"]
            out[-1] = FloatOp(prev.kind, prev.node, prev.options, pw, prev.chw_columns, prev.inner)
            continue
        out.append(op)
    for op in out:
        op.options.pop("_flat", None)
    return out


# ------------------------------------------------------------------ float forward

def _windows(x, kh, kw, sh, sw):
    """(N, OH, OW, C, kh, kw) windows of x (N, H, W, C) at stride (sh, sw)."""
    v = np.lib.stride_tricks.sliding_window_view(x, (kh, kw), axis=(1, 2))
    return v[:, ::sh, ::sw]


def _pads(kind, options, in_shape, w):
    """((sh, sw), (top, bottom, left, right)) of a convolution, by the ops' own geometry."""
    from tinytrain.ops import conv1d as r_c1
    from tinytrain.ops import conv2d as r_c2
    if kind == "conv1d":
        _, s, (pl, pr) = r_c1.geometry(in_shape[0], w.shape[1], options.get("stride", 1), options.get("padding", "valid"))
        return (1, s), (0, 0, pl, pr)
    kh, kw = (w.shape[1:3] if kind == "conv2d" else w.shape[:2])
    _, _, st, pad = r_c2.geometry(in_shape[0], in_shape[1], kh, kw, options.get("stride", 1), options.get("padding", "valid"))
    return st, pad


def float_forward(ops: list[FloatOp], x: np.ndarray, keep: bool = False):
    """The float graph on a batch x (N, *input_shape) channels-last, float64; returns the
    output, or the list of every op's output with keep=True. Dense columns must already be in
    tinytrain order (``to_model`` does that)."""
    a = np.asarray(x, np.float64)
    outs = []
    for op in ops:
        k, w, o = op.kind, op.weights, op.options
        if k == "dense":
            a = a @ w["w"].T + w["b"]
        elif k in ("conv2d", "depthwise_conv2d", "conv1d"):
            one_d = k == "conv1d"
            a4 = a[:, None] if one_d else a
            ww = w["w"][:, None] if one_d else w["w"]
            (sh, sw), (t, b, l, r) = _pads(k, o, a.shape[1:], w["w"])
            a4 = np.pad(a4, ((0, 0), (t, b), (l, r), (0, 0)))
            kh, kw = (ww.shape[1:3] if k != "depthwise_conv2d" else ww.shape[:2])
            win = _windows(a4, kh, kw, sh, sw)
            if k == "depthwise_conv2d":
                a4 = np.einsum("nhwckl,klc->nhwc", win, ww)
            else:
                a4 = np.einsum("nhwckl,fklc->nhwf", win, ww)
            a = (a4[:, 0] if one_d else a4) + w["b"]
        elif k == "batchnorm":
            eps = w.get("eps", o.get("eps", 1e-5))  # "eps": the float one, when the layer's was scaled
            a = (a - w["mean"]) / np.sqrt(w["var"] + eps) * w["gamma"] + w["beta"]
        elif k == "relu":
            a = np.maximum(a, 0)
        elif k == "leaky_relu":
            a = np.where(a > 0, a, a * o["alpha"])
        elif k in ("maxpool2d", "avgpool2d", "maxpool1d"):
            one_d = k == "maxpool1d"
            kk = o.get("kernel", 2)
            ss = o.get("stride") or kk
            kh, kw = (1, kk) if one_d else ((kk, kk) if isinstance(kk, int) else kk)
            sh, sw = (1, ss) if one_d else ((ss, ss) if isinstance(ss, int) else ss)
            win = _windows(a[:, None] if one_d else a, kh, kw, sh, sw)
            a = win.max(axis=(-2, -1)) if k.startswith("max") else win.mean(axis=(-2, -1))
            a = a[:, 0] if one_d else a
        elif k == "global_avgpool":
            a = a.reshape(len(a), -1, a.shape[-1]).mean(axis=1)
        elif k == "flatten":
            a = a.reshape(len(a), -1)
        elif k == "residual":
            a = a + float_forward(op.inner, a)
        else:  # an importer produced a kind this forward does not know: a bug
            raise AssertionError(f"float_forward: unknown op kind {k}")
        if keep:
            outs.append(a)
    return outs if keep else a


# ------------------------------------------------------------------ quantization

def weight_shift(maxabs: float, exp: int) -> int:
    """k >= 0: the power of two by which a weight tensor with this max |w| is scaled down so
    that it fits int16 at exponent ``exp`` with WEIGHT_HEADROOM_BITS to spare (0 if it fits)."""
    if maxabs <= 0:
        return 0
    return max(0, math.floor(math.log2(maxabs)) + 1 - (exp + 15 - WEIGHT_HEADROOM_BITS))


def quantize(v, exp: int, dtype) -> tuple[np.ndarray, int]:
    """round half up (floor(v / 2^exp + 1/2)) and saturate to the symmetric range of dtype;
    returns (codes, number saturated)."""
    info = np.iinfo(dtype)
    q = np.floor(np.asarray(v, np.float64) / 2.0**exp + 0.5)
    c = np.clip(q, -info.max, info.max)
    return c.astype(dtype), int(np.count_nonzero(c != q))


def _stat_cap(op: FloatOp) -> float:
    """Largest scale s (log2) at which a batch norm's running statistics fit: |mean| 2^s and
    var 2^2s below 2^STAT_LIMIT_LOG2."""
    m = float(np.max(np.abs(op.weights["mean"]))) if op.weights["mean"].size else 0.0
    v = float(np.max(op.weights["var"])) if op.weights["var"].size else 0.0
    caps = [float("inf")]
    if m > 0:
        caps.append(STAT_LIMIT_LOG2 - math.log2(m))
    if v > 0:
        caps.append((STAT_LIMIT_LOG2 - math.log2(v)) / 2)
    return min(caps)


def _chw_to_hwc(w: np.ndarray, shape: tuple) -> np.ndarray:
    """Dense columns from the channels-first flatten of a tinytrain (H, W, C) / (L, C) tensor
    to tinytrain's channels-last flatten."""
    if len(shape) < 2:
        return w
    cf = (shape[-1],) + tuple(shape[:-1])            # (C, H, W) / (C, L)
    perm = list(range(1, len(shape))) + [0]          # -> (H, W, C) / (L, C)
    return w.reshape((w.shape[0],) + cf).transpose([0] + [p + 1 for p in perm]).reshape(w.shape[0], -1)


@dataclass
class Built:
    model: object                 # the tinytrain Sequential
    ops: list                     # the float graph, Dense columns in tinytrain order
    scales: list                  # per op: log2 of (tinytrain value / float value) of its output
    shifts: list                  # per op: the weight scale-down k (0: stored as is)
    saturated: list               # per op: parameter values saturated by the quantization
    input_scale_log2: float       # the float graph's input = dataset float * 2^this


def to_model(ops: list[FloatOp], input_shape, *, dataset=None, input_scale="unit", name="imported",
             optimizer: SGD | None = None, seed: int = 0, n_classes: int | None = None) -> Built:
    """Build the tinytrain model of a float graph and quantize its weights.

    input_scale: what the source model reads, relative to the dataset's floats: "unit"
    (tinytrain's convention: floats / 2^unit_shift, i.e. about [-1, 1]), "data" (the floats
    unchanged), or a number c (the source model reads c * x). A power of two is exact (an
    exponent change); another c is folded into the first layer's weights."""
    from tinytrain.data import unit_shift

    input_shape = tuple(int(d) for d in input_shape)
    if dataset is not None and tuple(dataset.input_shape) != input_shape:
        hint = ""
        if int(np.prod(dataset.input_shape)) == int(np.prod(input_shape)):
            hint = " (same size, other layout: e.g. digits is flat (64,), digits-image is (8, 8, 1))"
        raise InteropError(f"the model's input {input_shape} (channels-last) does not match the data "
                           f"{dataset.name!r}, whose samples are {tuple(dataset.input_shape)}{hint}")
    if input_scale == "unit":
        c_log2 = -float(unit_shift(dataset)) if dataset is not None else 0.0
    elif input_scale == "data":
        c_log2 = 0.0
    else:
        c = float(input_scale)
        if not (c > 0 and math.isfinite(c)):
            raise InteropError(f"input scale {input_scale!r} must be 'unit', 'data' or a positive number")
        c_log2 = math.log2(c)
    data_exp = int(dataset.input_exp) if dataset is not None else 0
    e_c = round(c_log2)
    ops = _copy(ops)
    model = _build(ops, input_shape, data_exp + e_c, dataset, optimizer, seed, name, n_classes)
    scales, shifts, saturated = _quantize_into(model, ops, e_c - c_log2)
    rescaled = False
    for op, s_in in zip(ops, [e_c - c_log2] + scales[:-1]):
        if op.kind == "batchnorm" and s_in != 0:  # eps is configuration: scale it like the statistics
            op.weights.setdefault("eps", op.options.get("eps", 1e-5))
            op.options["eps"] = float(op.weights["eps"]) * 2.0**(2 * s_in)
            rescaled = True
    if rescaled:
        model = _build(ops, input_shape, data_exp + e_c, dataset, optimizer, seed, name, n_classes)
        scales, shifts, saturated = _quantize_into(model, ops, e_c - c_log2)
    if dataset is not None:
        model.data_input_exp = data_exp
    for (li, pi), m in model.master.items():  # the master copies were made from the random init
        m[...] = model.layers[li].params[pi].data.astype(m.dtype) << model.master_shift[(li, pi)]
    return Built(model, ops, scales, shifts, saturated, c_log2)


def _copy(ops):
    return [FloatOp(o.kind, o.node, dict(o.options), dict(o.weights), o.chw_columns, _copy(o.inner)) for o in ops]


def _config(op) -> dict:
    if op.kind == "residual":
        return {"type": "residual", "layers": [_config(o) for o in op.inner]}
    return {"type": op.kind, **op.options}


def _build(ops, input_shape, input_exp, dataset, optimizer, seed, name, n_classes):
    from tinytrain.graph.model import Sequential

    layers = []
    for op in ops:
        try:
            layers.append(layer_from_config(_config(op)))
        except ModelError as exc:
            raise InteropError(f"node {op.node!r} ({op.kind}): {exc}") from None
    if n_classes is None and dataset is not None:
        n_classes = dataset.n_classes or None
    try:
        return Sequential(layers, input_shape=input_shape, input_exp=input_exp, n_classes=n_classes,
                          optimizer=optimizer or SGD(), seed=seed, name=name)
    except ModelError as exc:
        raise InteropError(f"the imported graph does not fit tinytrain: {exc}") from None


def _quantize_into(model, ops, s: float):
    """Quantize the float weights into the built model's parameters, tracking the scale s
    (tinytrain value = float value * 2^s). Permutes channels-first Dense columns in place."""
    return _quantize_layers(model.layers, ops, s)[:3]


def _quantize_layers(layers, ops, s: float, target: float | None = None):
    """(scales, shifts, saturated, s) for these layers and float ops from scale s on. target:
    the scale the last weighted or batch-norm op must end at (a residual branch must end at
    its skip's scale): its k is chosen for that, and must not be smaller than its weights need."""
    scales, shifts, saturated = [], [], []
    last = max((i for i, o in enumerate(ops) if o.kind in WEIGHTED + ("batchnorm",)), default=-1)
    for i, (op, layer) in enumerate(zip(ops, layers)):
        k, nsat = 0, 0
        if op.kind == "dense" and op.chw_columns and i > 0 and ops[i - 1].kind == "flatten":
            op.weights["w"] = _chw_to_hwc(op.weights["w"], layers[i - 1].in_shape)
            op.chw_columns = False
        if op.kind in WEIGHTED:
            wp, bp = layer.params
            w = op.weights["w"]
            k = weight_shift(float(np.max(np.abs(w))) if w.size else 0.0, wp.exp)
            cap = _next_bn_cap(ops, i)
            if s - k > cap:
                k += math.ceil(s - k - cap)
            k = _to_target(k, s - target if target is not None and i == last else None, op)
            wp.data[...], n1 = quantize(w * 2.0**-k, wp.exp, np.int16)
            bp.data[...], n2 = quantize(op.weights["b"] * 2.0**(s - k), bp.exp, np.int32)
            nsat, s = n1 + n2, s - k
        elif op.kind == "batchnorm":
            g, b, rm, rv = layer.params
            k = weight_shift(float(np.max(np.abs(op.weights["gamma"]))), g.exp)
            k = _to_target(k, -target if target is not None and i == last else None, op)
            rm.data[...], n3 = quantize(op.weights["mean"] * 2.0**s, rm.exp, np.int32)
            rv.data[...], n4 = quantize(op.weights["var"] * 2.0**(2 * s), rv.exp, np.int32)
            g.data[...], n1 = quantize(op.weights["gamma"] * 2.0**-k, g.exp, np.int16)
            b.data[...], n2 = quantize(op.weights["beta"] * 2.0**-k, b.exp, np.int32)
            nsat, s = n1 + n2 + n3 + n4, -float(k)
        elif op.kind == "residual":
            _, ks, sats, s_f = _quantize_layers(layer.inner, op.inner, s, target=s)
            if abs(s_f - s) > 1e-9:  # a branch with no weighted op cannot be rescaled
                raise unsupported("Add", op.node, "a residual branch without a Linear/Conv/BatchNorm")
            k, nsat = max(ks), sum(sats)
        elif op.kind not in SCALE_FREE:
            raise AssertionError(f"to_model: unknown op kind {op.kind}")
        scales.append(s)
        shifts.append(k)
        saturated.append(nsat)
    return scales, shifts, saturated, s


def _to_target(k_needed: float, k_target: float | None, op) -> float:
    if k_target is None:
        return k_needed
    if k_target < k_needed - 1e-9:
        raise InteropError(f"node {op.node!r} ends a residual branch but its weights need a scale-down by "
                           f"2^{k_needed:g} that the skip path (2^{k_target:g}) does not have: scale the block "
                           "down before exporting, or fold it")
    return k_target


def _next_bn_cap(ops, i) -> float:
    """The statistics cap of the BatchNorm that reads op i's output through scale-free ops."""
    for op in ops[i + 1:]:
        if op.kind == "batchnorm":
            return _stat_cap(op)
        if op.kind not in SCALE_FREE:
            break
    return float("inf")


# ------------------------------------------------------------------ the report

def report(built: Built, dataset, calibrate: int = 100) -> dict:
    """Per-layer quantization error on the first `calibrate` training samples and the test
    accuracy of the float graph and of the integer model (numba simulator)."""
    from tinytrain.train import evaluate, prepare_inputs

    model, ops = built.model, built.ops
    X, _, _, _ = prepare_inputs(model, dataset)
    n = max(1, min(int(calibrate), len(X)))
    scale_in = 2.0**built.input_scale_log2
    fl = float_forward(ops, dataset.float_x_train[:n].astype(np.float64) * scale_in, keep=True)
    err_num = np.zeros(len(ops))
    err_den = np.zeros(len(ops))
    sats = np.zeros(len(ops), np.int64)
    saved_stats = model.stats.copy()
    for j in range(n):
        a, ea = X[j], model.input_exp
        for li, l in enumerate(model.layers):
            a, ea, nsat, _ = l.ref_forward(a, ea, False)
            sats[li] += nsat
            got = a.astype(np.float64).reshape(-1) * 2.0**ea
            want = fl[li][j].reshape(-1) * 2.0**built.scales[li]
            err_num[li] += float(np.sum((got - want) ** 2))
            err_den[li] += float(np.sum(want ** 2))
    model.stats[...] = saved_stats
    layers = []
    for li, (op, l) in enumerate(zip(ops, model.layers)):
        rel = math.sqrt(err_num[li] / err_den[li]) if err_den[li] > 0 else 0.0
        layers.append({"layer": li, "type": l.kind, "node": op.node, "out_shape": list(l.out_shape),
                       "rel_rms_error": rel, "sqnr_db": (-20 * math.log10(rel)) if rel > 0 else None,
                       "act_saturations": int(sats[li]), "weight_shift": int(built.shifts[li]),
                       "param_saturations": int(built.saturated[li])})
    xt = dataset.float_x_test.astype(np.float64) * scale_in
    float_acc = float(np.mean(np.argmax(float_forward(ops, xt), axis=1) == dataset.y_test))
    int_acc = float(evaluate(model, dataset)["accuracy"])
    return {"float_accuracy": float_acc, "integer_accuracy": int_acc,
            "accuracy_drop_points": 100 * (float_acc - int_acc), "calibration_samples": n,
            "input_exp": model.input_exp, "data_input_exp": getattr(model, "data_input_exp", None),
            "input_scale_log2": built.input_scale_log2, "layers": layers}
