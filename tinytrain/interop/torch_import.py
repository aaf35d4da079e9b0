"""PyTorch import: an ``nn.Module`` made of supported layers -> the float graph (ir.FloatOp).

The module is traced with ``torch.fx`` (so an ``nn.Sequential``, nested Sequentials and a
module whose ``forward`` calls its layers in a straight line all work) and must be a chain:
each node reads the previous one's output. PyTorch is channels-first: a sample is (K,),
(C, L) or (C, H, W) and becomes tinytrain's (K,), (L, C) or (H, W, C); conv weights
(F, C, KH, KW) become (F, KH, KW, C), depthwise (C, 1, KH, KW) becomes (KH, KW, C), Conv1d
(F, C, K) becomes (F, K, C); a Linear after a Flatten of a channels-first tensor gets its
columns permuted by the builder (ir.to_model). A zero-pad module right before a convolution is
merged into its padding; PyTorch's symmetric (and 'same') padding is tinytrain's explicit
(top, bottom, left, right). BatchNorm becomes tinytrain's integer BatchNorm layer with the
running statistics, or is folded into the convolution before it (``fold_batchnorm=True``; on a
flat input it is always folded into the Linear before it).
"""
from __future__ import annotations

import numpy as np

from tinytrain.interop.ir import FloatOp, InteropError, to_model, unsupported


def _np(t) -> np.ndarray:
    return t.detach().cpu().double().numpy()


def _pair(v):
    return (int(v), int(v)) if isinstance(v, int) else (int(v[0]), int(v[1]))


def _zero_pad(m, nn, node) -> tuple | None:
    """(top, bottom, left, right) of a zero-padding module, None if m is not one."""
    if isinstance(m, (nn.ZeroPad2d, nn.ConstantPad2d, nn.ZeroPad1d, nn.ConstantPad1d)):
        if float(getattr(m, "value", 0.0)) != 0.0:
            raise unsupported(type(m).__name__, node, f"padding with {m.value}, only zero padding is supported")
        p = tuple(int(v) for v in m.padding)
        return (p[2], p[3], p[0], p[1]) if len(p) == 4 else (0, 0, p[0], p[1])
    return None


def _conv(m, nn, node, pad) -> FloatOp:
    name = type(m).__name__
    if m.padding_mode != "zeros":
        raise unsupported(name, node, f"padding_mode={m.padding_mode!r}, only 'zeros'")
    if any(d != 1 for d in m.dilation):
        raise unsupported(name, node, f"dilation {tuple(m.dilation)}, only 1")
    w = _np(m.weight)
    b = _np(m.bias) if m.bias is not None else np.zeros(w.shape[0])
    one_d = isinstance(m, nn.Conv1d)
    k = w.shape[2:]
    if m.padding == "valid":
        p = [0, 0] * len(k)
    elif m.padding == "same":  # PyTorch: the odd pixel after, as tinytrain's 'same' at stride 1
        p = [v for kk in k for v in ((kk - 1) // 2, kk - 1 - (kk - 1) // 2)]
    else:
        p = [v for pp in m.padding for v in (int(pp), int(pp))]
    if pad is not None:  # merge the zero-pad module before it
        p = [a + b for a, b in zip(p, pad[-len(p):] if one_d else pad)]
    stride = [int(s) for s in m.stride]
    if one_d:
        if m.groups != 1:
            raise unsupported(name, node, f"groups={m.groups}, Conv1d needs groups 1")
        return FloatOp("conv1d", node, {"filters": w.shape[0], "kernel": k[0], "stride": stride[0], "padding": p},
                       {"w": w.transpose(0, 2, 1), "b": b})
    opts = {"kernel": list(k), "stride": stride, "padding": p}
    if m.groups == 1:
        return FloatOp("conv2d", node, {"filters": w.shape[0], **opts}, {"w": w.transpose(0, 2, 3, 1), "b": b})
    if m.groups == m.in_channels == m.out_channels:
        return FloatOp("depthwise_conv2d", node, opts, {"w": w[:, 0].transpose(1, 2, 0), "b": b})
    raise unsupported(name, node, f"groups={m.groups} with {m.in_channels} -> {m.out_channels} channels: "
                      "only groups 1 or depthwise (groups = in = out channels)")


def _pool(m, nn, node) -> FloatOp:
    name = type(m).__name__
    pad = m.padding if isinstance(m.padding, tuple) else (m.padding,)
    if any(int(p) for p in pad) or m.ceil_mode:
        raise unsupported(name, node, "padding or ceil_mode: tinytrain pools have no padding and floor the size")
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        dil = m.dilation if isinstance(m.dilation, tuple) else (m.dilation,)
        if any(int(d) != 1 for d in dil) or m.return_indices:
            raise unsupported(name, node, "dilation or return_indices")
    if isinstance(m, nn.AvgPool2d) and m.divisor_override is not None:
        raise unsupported(name, node, "divisor_override")
    one_d = isinstance(m, (nn.MaxPool1d, nn.AvgPool1d))
    if isinstance(m, nn.AvgPool1d):
        raise unsupported(name, node, "1-D average pooling (use AvgPool2d or global average pooling)")
    k = m.kernel_size if not isinstance(m.kernel_size, (tuple, list)) else tuple(m.kernel_size)
    s = m.stride if m.stride is not None else k
    s = s if not isinstance(s, (tuple, list)) else tuple(s)
    if one_d:
        k, s = int(k[0] if isinstance(k, tuple) else k), int(s[0] if isinstance(s, tuple) else s)
        return FloatOp("maxpool1d", node, {"kernel": k, "stride": s})
    kind = "maxpool2d" if isinstance(m, nn.MaxPool2d) else "avgpool2d"
    return FloatOp(kind, node, {"kernel": list(_pair(k)), "stride": list(_pair(s))})


def _batchnorm(m, node, rank) -> FloatOp:
    if m.running_mean is None:
        raise unsupported(type(m).__name__, node, "track_running_stats=False: no running statistics to import")
    C = m.num_features
    g = _np(m.weight) if m.weight is not None else np.ones(C)
    b = _np(m.bias) if m.bias is not None else np.zeros(C)
    opts = {"eps": float(m.eps), "momentum": float(m.momentum if m.momentum is not None else 0.1)}
    if rank == 1:
        opts["_flat"] = True
    return FloatOp("batchnorm", node, opts, {"gamma": g, "beta": b, "mean": _np(m.running_mean),
                                             "var": _np(m.running_var)})


def _is_flatten_call(node, prev) -> bool:
    """torch.flatten(x, 1), x.flatten(1), x.view(x.size(0), -1), x.reshape(N, -1)."""
    import torch

    if node.op == "call_function" and node.target is torch.flatten:
        return (node.args[1:2] or [node.kwargs.get("start_dim", 0)])[0] == 1
    if node.op == "call_method" and node.target == "flatten":
        return (node.args[1:2] or [node.kwargs.get("start_dim", 0)])[0] == 1
    if node.op == "call_method" and node.target in ("view", "reshape"):
        rest = node.args[1:]
        if len(rest) == 1 and isinstance(rest[0], (tuple, list)):
            rest = tuple(rest[0])
        return len(rest) == 2 and rest[1] == -1
    return False


def torch_graph(module, example_input, fold_batchnorm: bool = False):
    """(float ops, tinytrain input shape) of a PyTorch module, checked on example_input
    (a batch: (N, K), (N, C, L) or (N, C, H, W))."""
    import torch
    import torch.fx as fx
    import torch.nn.functional as F
    from torch import nn

    from tinytrain.interop import ir

    if not isinstance(module, nn.Module):
        raise InteropError(f"from_torch needs an nn.Module, got {type(module).__name__}"
                           + (": a state_dict holds weights but not the layers; save the module itself "
                              "(torch.save(model, path)) or export it to ONNX" if isinstance(module, dict) else ""))
    x = torch.as_tensor(example_input, dtype=torch.float32)
    if x.ndim not in (2, 3, 4):
        raise InteropError(f"example input of shape {tuple(x.shape)}: give a batch (N, K), (N, C, L) or (N, C, H, W)")
    was_training = module.training
    module.eval()  # the import reads eval-mode behaviour (running statistics, no dropout)
    try:
        with torch.no_grad():
            module(x)
    except Exception as exc:
        msg = " ".join(str(exc).split())[:300]
        raise InteropError(f"the PyTorch model does not accept an input of shape {tuple(x.shape)} "
                           f"(from the data): {type(exc).__name__}: {msg}") from None
    finally:
        module.train(was_training)
    try:
        gm = fx.symbolic_trace(module)
    except Exception as exc:
        raise InteropError(f"cannot trace {type(module).__name__} with torch.fx ({type(exc).__name__}: "
                           f"{' '.join(str(exc).split())[:200]}): use an nn.Sequential of supported layers") from None
    sample = tuple(int(d) for d in x.shape[1:])
    input_shape = sample if len(sample) == 1 else sample[1:] + sample[:1]
    ops: list[FloatOp] = []
    prev, pad, rank, at = None, None, len(sample), {}
    last_pad_node = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            if prev is not None:
                raise InteropError(f"node {node.name!r}: the model takes several inputs; tinytrain models take one")
            prev = node
            continue
        if node.op == "get_attr":
            raise unsupported("a parameter used directly", node.name, "weights must belong to layers")
        if node.op == "call_method" and node.target == "size":
            continue
        at[prev] = len(ops)  # the ops made after prev's output start here
        if _is_add(node, torch):
            a, b = node.args[:2]
            skip = a if b is prev else b if a is prev else None
            if skip not in at or skip is prev:
                raise InteropError(f"node {node.name!r} adds two tensors that are not a block's input and its "
                                   "output: only chains and residual blocks y = x + f(x) are imported")
            ops, prev = ir.residual(ops, at[skip], node.name), node
            continue
        if node.op == "output":
            if node.args[0] is not prev:
                raise InteropError(f"the output is not the last layer's result: {type(module).__name__} is not a chain of layers")
            break
        args = [a for a in node.args if isinstance(a, fx.Node) and not (a.op == "call_method" and a.target == "size")]
        if not args or args[0] is not prev or len(args) > 1:
            raise InteropError(f"node {node.name!r} ({node.target}) does not read the previous layer's output "
                               "alone: only chains of layers (no branches, no skip connections) are imported")
        prev = node
        op = None
        if node.op == "call_module":
            m = gm.get_submodule(node.target)
            name = type(m).__name__
            p = _zero_pad(m, nn, node.name)
            if p is not None:
                pad, last_pad_node = (p if pad is None else tuple(a + b for a, b in zip(pad, p))), node.name
                continue
            if getattr(m, "_tinytrain_passthrough", False) or isinstance(m, (nn.Identity, nn.Dropout)):
                continue
            if isinstance(m, (nn.Conv1d, nn.Conv2d)):
                op, pad = _conv(m, nn, node.name, pad), None
            elif isinstance(m, nn.Linear):
                op = FloatOp("dense", node.name, {"units": m.out_features},
                             {"w": _np(m.weight), "b": _np(m.bias) if m.bias is not None else np.zeros(m.out_features)},
                             chw_columns=True)
            elif isinstance(m, nn.ReLU):
                op = FloatOp("relu", node.name)
            elif isinstance(m, nn.LeakyReLU):
                op = FloatOp("leaky_relu", node.name, {"alpha": float(m.negative_slope)})
            elif isinstance(m, (nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d)):
                op = _pool(m, nn, node.name)
            elif isinstance(m, (nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d)):
                size = m.output_size if isinstance(m.output_size, tuple) else (m.output_size,)
                if any(s != 1 for s in size):
                    raise unsupported(name, node.name, f"output size {m.output_size}: only 1 (global average pooling)")
                op = FloatOp("global_avgpool", node.name)
                rank = 1
            elif isinstance(m, nn.Flatten):
                if m.start_dim != 1 or m.end_dim != -1:
                    raise unsupported(name, node.name, f"start_dim={m.start_dim}, end_dim={m.end_dim}: only 1, -1")
                op = FloatOp("flatten", node.name)
            elif isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                op = _batchnorm(m, node.name, rank)
            elif isinstance(m, (nn.Softmax, nn.LogSoftmax)) and _is_last(node):
                continue  # tinytrain's softmax cross-entropy head takes its place
            else:
                raise unsupported(name, node.name)
        elif node.op in ("call_function", "call_method"):
            tgt = node.target
            if tgt in (F.relu, torch.relu, "relu", "relu_"):
                op = FloatOp("relu", node.name)
            elif tgt is F.leaky_relu:
                alpha = node.args[1] if len(node.args) > 1 else node.kwargs.get("negative_slope", 0.01)
                op = FloatOp("leaky_relu", node.name, {"alpha": float(alpha)})
            elif _is_flatten_call(node, prev):
                op = FloatOp("flatten", node.name)
            elif tgt in (F.softmax, F.log_softmax, torch.softmax, "softmax", "log_softmax") and _is_last(node):
                continue
            elif tgt in (F.dropout, "contiguous"):
                continue
            else:
                raise unsupported(getattr(tgt, "__name__", str(tgt)), node.name)
        if pad is not None and op is not None:
            raise unsupported("zero padding", last_pad_node, "only before a convolution")
        if op.kind in ("flatten", "dense"):
            rank = 1
        ops.append(op)
    if not ops:
        raise InteropError(f"{type(module).__name__} has no layers to import")
    if pad is not None:
        raise unsupported("zero padding", last_pad_node, "only before a convolution")
    ops = ir.fold_batchnorm(ops, only_flat=True)
    if fold_batchnorm:
        ops = ir.fold_batchnorm(ops)
    return ops, input_shape


def _is_add(node, torch) -> bool:
    """x + y, torch.add(x, y), x.add(y): both operands tensors (nodes)."""
    import operator

    import torch.fx as fx
    if node.op == "call_function" and node.target in (operator.add, torch.add) or \
            node.op == "call_method" and node.target == "add":
        return len(node.args) >= 2 and all(isinstance(a, fx.Node) for a in node.args[:2]) and not node.kwargs
    return False


def _is_last(node) -> bool:
    return all(u.op == "output" for u in node.users)


def from_torch(module, example_input, *, dataset=None, input_scale="unit", fold_batchnorm: bool = False,
               optimizer=None, seed: int = 0, name: str | None = None, calibrate: int = 100):
    """The tinytrain model of a PyTorch module (post-training quantization).

    example_input: a batch in PyTorch's layout ((N, K), (N, C, L) or (N, C, H, W)); with
    ``dataset`` it may be None (one training sample is used) and the model gets the data's
    input exponent and, as ``model.import_report``, the per-layer quantization error on
    `calibrate` training samples and the float and integer test accuracy (ir.report).
    input_scale: what the module reads relative to the data's floats ("unit": floats /
    2^unit_shift, tinytrain's own convention; "data"; or a number)."""
    from tinytrain.interop import ir

    if example_input is None:
        if dataset is None:
            raise InteropError("from_torch needs example_input or dataset")
        example_input = channels_first(dataset.float_x_train[:1])
    ops, shape = torch_graph(module, example_input, fold_batchnorm)
    built = to_model(ops, shape, dataset=dataset, input_scale=input_scale, optimizer=optimizer, seed=seed,
                     name=name or type(module).__name__.lower())
    if dataset is not None:
        built.model.import_report = ir.report(built, dataset, calibrate)
    return built.model


def channels_first(x: np.ndarray) -> np.ndarray:
    """A channels-last batch (N, K) / (N, L, C) / (N, H, W, C) in PyTorch's layout."""
    x = np.asarray(x, np.float32)
    return np.ascontiguousarray(np.moveaxis(x, -1, 1)) if x.ndim > 2 else x
