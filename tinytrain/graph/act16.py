"""int16 activations and errors (precision ``"activations": "int16", "errors": "int16"``): the
op table's rows of the layers that have them.

The reference (ops/) and the numba kernels are the int8 ones: they keep the dtype of what they
are given and requantize to its width (ops/_common.requant, kernels/_common.requant_s8 reads the
output's itemsize). So each row here is its int8 row with the C spellings of the int16 kernels
(firmware/include/tt_act16.h) and the accumulator bounds of int16 operands. The model widens its
int8 input to int16 at the same exponent (exact) before the first layer.

Convolutions (conv2d, depthwise_conv2d, conv1d), max and average pooling (maxpool2d, maxpool1d,
avgpool2d, global_avgpool) have their C in firmware/include/tt_act16_conv.h; a convolution's weight gradient, a sum over its
output positions of int16 x int16 products, is rounded by a static shift to the int32 range of a
Dense gradient (ops/conv2d.py, grad_shift).

Batch norm has its C in firmware/include/tt_act16_norm.h; its gamma gradient is rounded by the
static shift grad_shift(P) (ops/batchnorm.py).

A layer type without a row here is refused when the model is built (A16_KINDS): today
residual blocks (the skip path's add and the composite's buffers are not written at 16 bits).
"""
from __future__ import annotations

from dataclasses import replace

from tinytrain.graph.layers import max_product
from tinytrain.graph import conv, norm  # noqa: F401  (the int8 rows this module widens)
from tinytrain.graph.optable import OPS, Call, register_op
from tinytrain.ops import batchnorm as r_bn, conv2d as r_c2

#: the C header of the int16-activation kernels
C_HEADER = "tt_act16.h"


def _row(kind, **c):
    """The int8 row of ``kind`` with the C spellings ``c`` (fwd, bwd, grad)."""
    base = OPS[kind]
    calls = {k: Call(getattr(base, k).nb, v) for k, v in c.items()}
    return register_op(replace(base, kind=f"{kind}:a16", c_header=C_HEADER, **calls))


_row("dense", fwd="tt_dense_fwd_s16(&CTX, {params}, {x}, {ex}, {y})",
     bwd="tt_dense_bwd_s16(&CTX, {params}, {e}, {ee}, {dx})",
     grad="tt_dense_grad_s32_s16({params}, {e}, {x}, {g_w}, {g_b})")
# |x * w| <= 32767 * 32767 < 2^30: every sum of two or more is int64 in C; gw = e * x is int32
OPS["dense:a16"] = replace(OPS["dense:a16"], bounds=lambda l: [
    ("forward sum", l.in_shape[0] * max_product(l) + 2**30, 64),
    ("input-error sum", l.units * max_product(l), 64),
    ("weight gradient", 32767 * 32767, 32)])
_row("relu", fwd="tt_relu_fwd_s16({x}, {ex}, {n}, {y}, {stats})",
     bwd="tt_relu_bwd_s16({e}, {ee}, {y}, {n}, {dx}, {stats})")
_row("flatten", fwd="tt_flatten_fwd_s16({x}, {ex}, {n}, {y}, {stats})",
     bwd="tt_flatten_bwd_s16({e}, {ee}, {n}, {dx}, {stats})")
_row("leaky_relu", fwd="tt_leaky_relu_fwd_s16({x}, {ex}, {n}, {slope_q8}, {y}, {stats})",
     bwd="tt_leaky_relu_bwd_s16({e}, {ee}, {y}, {n}, {slope_q8}, {dx}, {stats})")

#: the C header of the int16-activation convolution and pooling kernels
C_HEADER_CONV = "tt_act16_conv.h"


def _conv_row(kind, name, nb_dims, positions, fan_in, fan_out):
    """Conv2d, depthwise, Conv1d: the int8 row's forward and input error at 16 bits; the weight
    gradient summed in int64 and rounded by the static shift ``gshift`` = grad_shift(positions)
    (ops/conv2d.py), at exponent ee + ex + gshift."""
    base = OPS[kind]
    args = lambda l: {**base.args(l), "gshift": r_c2.grad_shift(positions(l))}  # noqa: E731
    c_fwd = f"tt_{name}_fwd_s16(&CTX, {{params}}, {{x}}, {{ex}}, {{y}})"
    c_bwd = f"tt_{name}_bwd_s16(&CTX, {{params}}, {{e}}, {{ee}}, {{dx}})"
    return register_op(replace(
        base, kind=f"{kind}:a16", c_header=C_HEADER_CONV, c_header_w8="", args=args,
        nb_import=f"tinytrain.kernels.conv: {name}_fwd, {name}_bwd, {name}_grad_a16",
        fwd=Call(base.fwd.nb, c_fwd), bwd=Call(base.bwd.nb, c_bwd),
        grad=Call(f"{name}_grad_a16({{e:out}}, {{x:in}}, {nb_dims}, {{gshift}}, {{g_w}}, {{g_b}})",
                  f"tt_{name}_grad_s32_s16({{params}}, {{e}}, {{x}}, {{gshift}}, {{g_w}}, {{g_b}})"),
        grad_exp={"w": "{ee} + {ex} + {gshift}", "b": "{ee}"},
        bounds=lambda l: [("forward sum", fan_in(l) * max_product(l) + 2**30, 64),
                          ("input-error sum", fan_out(l) * max_product(l), 64),
                          ("weight gradient", 32767 * 32767 * positions(l), 64),
                          ("weight gradient (rounded)", ((32767 * 32767 * positions(l)) >> r_c2.grad_shift(positions(l))) + 1, 32),
                          ("bias gradient", 32767 * positions(l), 32)]))


_hw = lambda l: l.out_shape[0] * l.out_shape[1]  # noqa: E731
_conv_row("conv2d", "conv2d", "{stride_h}, {stride_w}, {pad_top}, {pad_left}", _hw,
          lambda l: l.kernel[0] * l.kernel[1] * l.in_shape[2], lambda l: l.filters * l.kernel[0] * l.kernel[1])
_conv_row("depthwise_conv2d", "depthwise", "{stride_h}, {stride_w}, {pad_top}, {pad_left}", _hw,
          lambda l: l.kernel[0] * l.kernel[1], lambda l: l.kernel[0] * l.kernel[1])
_conv_row("conv1d", "conv1d", "{stride}, {pad_left}", lambda l: l.out_shape[0],
          lambda l: l.kernel * l.in_shape[1], lambda l: l.filters * l.kernel)
for _k in ("maxpool2d", "maxpool1d"):  # the int8 rows' numba calls (dtype-generic), the s16 C
    register_op(replace(OPS[_k], kind=f"{_k}:a16", c_header=C_HEADER_CONV, fwd=Call(
        OPS[_k].fwd.nb, f"tt_{_k}_fwd_s16(&CTX, {{params}}, {{x}}, {{ex}}, {{y}})"), bwd=Call(
        OPS[_k].bwd.nb, f"tt_{_k}_bwd_s16(&CTX, {{params}}, {{e}}, {{ee}}, {{x}}, {{dx}})")))

for _k in ("avgpool2d", "global_avgpool"):  # the int8 rows' numba calls (the width read from y, dx), the s16 C
    register_op(replace(OPS[_k], kind=f"{_k}:a16", c_header=C_HEADER_CONV, fwd=Call(
        OPS[_k].fwd.nb, f"tt_{_k}_fwd_s16(&CTX, {{params}}, {{x}}, {{ex}}, {{y}})"), bwd=Call(
        OPS[_k].bwd.nb, f"tt_{_k}_bwd_s16(&CTX, {{params}}, {{e}}, {{ee}}, {{dx}})")))
# (their C sums go through the scratch the int8 rows already have: max(in_size, out_size) int64)

#: the C header of the int16-activation batch norm
C_HEADER_NORM = "tt_act16_norm.h"
_bn = OPS["batchnorm"]
# the int8 row's numba calls (the width read from the arrays; the gamma gradient rounded by gshift)
register_op(replace(
    _bn, kind="batchnorm:a16", c_header=C_HEADER_NORM,
    args=lambda l: {**_bn.args(l), "gshift": r_c2.grad_shift(l.P)},
    fwd=Call(_bn.fwd.nb, "tt_batchnorm_fwd_s16(&CTX, {params}, {x}, {ex}, {y})"),
    fwd_eval=Call("", "tt_batchnorm_fwd_eval_s16(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call(_bn.bwd.nb, "tt_batchnorm_bwd_s16(&CTX, {params}, {e}, {ee}, {x}, {dx})"),
    grad=Call("batchnorm_grad({e:pc}, {x:pc}, {saved}, True, {g_gamma}, {g_beta}, {gshift})",
              "tt_batchnorm_grad_s32_s16({params}, {e}, {x}, {g_gamma}, {g_beta})"),
    grad_exp={"gamma": f"{{ee}} - {r_bn.XHAT_FRAC} + {{gshift}}", "beta": "{ee}"},
    bounds=lambda l: [("statistics sum P x^2 - S^2", l.P * l.P * 32767**2, 64),
                      ("gamma gradient", 32767 * (l.P * 4096 + l.P), 64),
                      ("gamma gradient (rounded)", ((32767 * (l.P * 4096 + l.P)) >> r_c2.grad_shift(l.P)) + 1, 32),
                      ("backward I", 2**57 + 2**52, 64)]))

#: layer types that take int16 activations and errors
A16_KINDS = frozenset(k[:-4] for k in OPS if k.endswith(":a16"))


_CONV_POSITIONS = {"conv2d": _hw, "depthwise_conv2d": _hw, "conv1d": lambda l: l.out_shape[0]}


def check(model) -> str | None:
    """Why ``model`` cannot take int16 activations and errors (None: it can)."""
    for i, l in enumerate(model.layers):
        if l.kind not in A16_KINDS:
            return (f"layer {i} ({l.kind}): precision activations = \"int16\" is implemented for "
                    f"{', '.join(sorted(A16_KINDS))} layers only: use \"activations\": \"int8\", \"errors\": \"int8\" "
                    "(the default) for this model")
        if l.kind in _CONV_POSITIONS and _CONV_POSITIONS[l.kind](l) > r_c2.A16_MAX_POSITIONS:
            return (f"layer {i} ({l.kind}): {_CONV_POSITIONS[l.kind](l)} output positions; with int16 errors the bias "
                    f"gradient (a sum of one error per position) fits int32 up to {r_c2.A16_MAX_POSITIONS}: use a "
                    "larger stride or int8 activations")
    if model.loss != "softmax_ce":
        return (f"loss {model.loss!r}: precision activations = \"int16\" is implemented with the softmax_ce head "
                "only: use loss \"softmax_ce\" or int8 activations")
    if model.prune is not None or any(getattr(l, "prune", None) for l in model.layers):
        return ("prune: pruning is not implemented with int16 activations: drop prune or use "
                "\"activations\": \"int8\", \"errors\": \"int8\"")
    return None
