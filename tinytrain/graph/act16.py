"""int16 activations and errors (precision ``"activations": "int16", "errors": "int16"``): the
op table's rows of the layers that have them.

The reference (ops/) and the numba kernels are the int8 ones: they keep the dtype of what they
are given and requantize to its width (ops/_common.requant, kernels/_common.requant_s8 reads the
output's itemsize). So each row here is its int8 row with the C spellings of the int16 kernels
(firmware/include/tt_act16.h) and the accumulator bounds of int16 operands. The model widens its
int8 input to int16 at the same exponent (exact) before the first layer.

A layer type without a row here is refused when the model is built (A16_KINDS).
"""
from __future__ import annotations

from dataclasses import replace

from tinytrain.graph.layers import max_product
from tinytrain.graph.optable import OPS, Call, register_op

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

#: layer types that take int16 activations and errors
A16_KINDS = frozenset(k[:-4] for k in OPS if k.endswith(":a16"))


def check(model) -> str | None:
    """Why ``model`` cannot take int16 activations and errors (None: it can)."""
    for i, l in enumerate(model.layers):
        if l.kind not in A16_KINDS:
            return (f"layer {i} ({l.kind}): precision activations = \"int16\" is implemented for "
                    f"{', '.join(sorted(A16_KINDS))} layers only: use \"activations\": \"int8\", \"errors\": \"int8\" "
                    "(the default) for this model")
    if model.loss != "softmax_ce":
        return (f"loss {model.loss!r}: precision activations = \"int16\" is implemented with the softmax_ce head "
                "only: use loss \"softmax_ce\" or int8 activations")
    if model.prune is not None or any(getattr(l, "prune", None) for l in model.layers):
        return ("prune: pruning is not implemented with int16 activations: drop prune or use "
                "\"activations\": \"int8\", \"errors\": \"int8\"")
    return None
