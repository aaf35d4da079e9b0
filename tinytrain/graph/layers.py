"""Layers: configuration, shape inference and parameter initialisation (build time, float
allowed). One class per layer type; what each computes is its row in the op table
(graph/optable.py), registered next to the class; the arithmetic lives in ops/ (reference),
kernels/ (numba) and firmware/ (C)."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.graph.precision import DEFAULT as DEFAULT_PRECISION, Precision, PrecisionError

from tinytrain.graph import prune as r_prune
from tinytrain.graph.optable import Call, Op, op_for, register_op
from tinytrain.ops import dense as r_dense
from tinytrain.ops import flatten as r_flatten
from tinytrain.ops import leaky_relu as r_leaky
from tinytrain.ops import relu as r_relu
from tinytrain.ops import wblock as r_wblock


class ModelError(ValueError):
    """A model definition that cannot be built (unknown layer, bad shape, bad option)."""


@dataclass
class Param:
    name: str
    data: np.ndarray  # int16 weights, int32 biases / state
    exp: int
    role: str = "weight"  # weight | bias | state (state: updated by the layer, not the optimizer)

    @property
    def trainable(self) -> bool:
        return self.role in ("weight", "bias")


#: bits an int16 bias sits above the exponent of the layer's int16 weights
BIAS16_ABOVE = 0


def _weight_exp(bound: float, bits: int = 16) -> int:
    """Fixed exponent of a ``bits``-wide weight tensor leaving 4x headroom above the init bound
    (range >= 4 * bound)."""
    return math.ceil(math.log2(4.0 * bound)) - (bits - 1)


#: largest |int8 activation or error * int16 weight| (both symmetric: -128 and -32768 never occur)
MAX_PRODUCT = 127 * 32767


def max_product(layer) -> int:
    """Largest |activation or error * weight| of a layer under its precision policy (int8 or
    int16 activations and errors)."""
    return int(np.iinfo(layer.policy.act_dtype).max) * int(np.iinfo(layer.policy.weight_dtype).max)


def _quantize(v: np.ndarray, exp: int, dtype) -> np.ndarray:
    info = np.iinfo(dtype)
    q = np.floor(v / 2.0**exp + 0.5)
    return np.clip(q, -info.max, info.max).astype(dtype)


class Layer:
    kind = "layer"
    params: list
    #: option name -> fields.Field, checked when a layer is built from a dict (model files);
    #: None: not declared (a user's layer type), its constructor checks its own options
    fields: dict | None = None
    #: this layer's "precision" object (overrides the model's policy), as given
    precision = None
    #: the policy the layer is built with (the model's, with this layer's override)
    policy: Precision = DEFAULT_PRECISION

    def __init__(self):
        self.params = []
        self.in_shape = self.out_shape = None

    def config(self) -> dict:
        return {}

    def set_policy(self, base: Precision, where: str = "precision") -> None:
        """Resolve this layer's policy over the model's ``base`` (before ``build``)."""
        try:
            self.policy = Precision.parse(self.precision, where, base)
        except PrecisionError as exc:
            raise ModelError(str(exc)) from None
        for k, l in enumerate(getattr(self, "inner", ())):
            l.set_policy(self.policy, f"{where} of inner layer {k}")

    def _weights(self, rng, bound, shape):
        """Initial weights uniform in [-bound, bound] in the policy's width, and their exponent."""
        if self.policy.blocked:
            raise ModelError(f"exponent = {self.policy.exponent!r} is implemented for dense layers only: give this "
                             "layer \"precision\": {\"weights\": \"int8\", \"exponent\": \"tensor\"}")
        ew = _weight_exp(bound, self.policy.weight_bits)
        return _quantize(rng.uniform(-bound, bound, shape), ew, self.policy.weight_dtype), ew

    def _bias(self, n: int, ew16: int) -> Param:
        """The zero bias of ``n`` outputs, given the exponent ``ew16`` the layer's weights have
        as int16 (whatever their width). An int32 bias sits 8 bits below it. An int16 bias
        (policy ``"bias": "int16"``) sits at it: the rule of the weights (4x headroom above the
        initialisation bound), so its range is the int16 weights' range and its step their step."""
        if self.policy.bias == "int16":
            return Param("b", np.zeros(n, np.int16), ew16 + BIAS16_ABOVE, "bias")
        return Param("b", np.zeros(n, np.int32), ew16 - 8, "bias")

    def _ew16(self, ew: int) -> int:
        """The int16 exponent of weights at ``ew`` in the policy's width."""
        return ew - (16 - self.policy.weight_bits)

    def build(self, in_shape, rng: np.random.Generator):
        self.in_shape = tuple(in_shape)
        self.out_shape = tuple(self._out_shape(self.in_shape))
        self.params = self._init_params(rng)
        return self.out_shape

    def _out_shape(self, in_shape):
        return in_shape

    def _init_params(self, rng):
        return []

    @property
    def in_size(self):
        return int(np.prod(self.in_shape))

    @property
    def out_size(self):
        return int(np.prod(self.out_shape))

    def macs(self) -> int:
        return 0

    def ref_forward(self, x, ex, train):
        """The reference forward (the op table's row): (y, ey, nsat, saved)."""
        return op_for(self).forward(self, x, ex, train)

    def ref_backward(self, e, ee, saved, need_dx):
        """The reference backward: (dx, edx, nsat, [gradient, exponent per trainable param])."""
        return op_for(self).backward(self, e, ee, saved, need_dx)

    def ref_grads(self, e, ee, saved, need_dx):
        """``ref_backward`` with its gradients keyed by parameter name.

        Returns (dx, edx, nsat, {param name: (grad, grad exponent)}) holding exactly one entry
        per trainable parameter (role weight or bias). The step pairs gradients with parameters
        by these names, never by position: a layer whose params mix trainable parameters and
        state (batch norm's running statistics) cannot shift the pairing."""
        dx, edx, nsat, grads = self.ref_backward(e, ee, saved, need_dx)
        names = [p.name for p in self.params if p.trainable]
        if len(grads) != len(names):
            raise AssertionError(f"{self.kind}.ref_backward returned {len(grads)} gradients for "
                                 f"{len(names)} trainable parameters {names}")
        return dx, edx, nsat, dict(zip(names, grads))

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items())
        return f"{type(self).__name__}({args})"


class Dense(Layer):
    kind = "dense"
    fields = {"units": F.POS_INT}

    def __init__(self, units: int):
        super().__init__()
        if not F.POS_INT.ok(units):
            raise ModelError(f"Dense(units={units!r}): units must be a positive integer")
        self.units = units

    def config(self):
        return {"units": self.units}

    def _out_shape(self, in_shape):
        if len(in_shape) != 1:
            raise ModelError(
                f"Dense expects a flat input, got shape {in_shape}: put a Flatten() before it"
            )
        return (self.units,)

    def _init_params(self, rng):
        K = self.in_shape[0]
        bound = math.sqrt(6.0 / K)  # He-uniform, as for ReLU networks
        if self.policy.blocked:  # int16 weights narrowed into blocks q, shifts s (graph/wblock.py)
            ew = _weight_exp(bound)
            w16 = _quantize(rng.uniform(-bound, bound, (self.units, K)), ew, np.int16)
            q, s = r_wblock.narrow(w16, self.policy.block_len(K), self.policy.weight_bits)
            return [Param("w", q, ew, "weight"), self._bias(self.units, ew), Param("w_exp", s, 0, "state")]
        w, ew = self._weights(rng, bound, (self.units, K))
        return [Param("w", w, ew, "weight"), self._bias(self.units, self._ew16(ew))]

    def macs(self):
        return self.units * self.in_shape[0]


class ReLU(Layer):
    kind = "relu"
    fields = {}


class Flatten(Layer):
    kind = "flatten"
    fields = {}

    def _out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)


LAYER_TYPES = {cls.kind: cls for cls in (Dense, ReLU, Flatten)}


def register(cls):
    LAYER_TYPES[cls.kind] = cls
    return cls


def layer_config(l: Layer) -> dict:
    """A layer as a model file writes it: its type, options, its "precision" override and its
    "prune" object."""
    pr = r_prune.layer_prune(l)
    return {"type": l.kind, **l.config(), **({"precision": l.precision} if l.precision is not None else {}),
            **({"prune": pr.to_dict()} if pr else {})}


def layer_from_config(d: dict) -> Layer:
    d = dict(d)
    kind = d.pop("type", None)
    precision = d.pop("precision", None)
    if not isinstance(kind, str) or kind not in LAYER_TYPES:
        raise ModelError(
            f"unknown layer type {kind!r}: known types are {', '.join(sorted(LAYER_TYPES))}"
        )
    cls = LAYER_TYPES[kind]
    prune = d.pop("prune", None)  # any layer object may carry a "prune" object (graph/prune.py)
    if cls.fields is not None:
        F.check(d, cls.fields, kind, ModelError)
        sig = inspect.signature(cls.__init__).parameters.values()
        missing = [p.name for p in sig if p.default is p.empty and p.name != "self" and p.name not in d]
        if missing:
            raise ModelError(f"{kind} needs {', '.join(f'{m} ({cls.fields[m].desc})' for m in missing)}")
    try:
        layer = cls(**d)
    except TypeError as exc:
        raise ModelError(f"bad options for layer {kind!r}: {exc}") from None
    if precision is not None:
        try:
            Precision.check_keys(precision, f"{kind} precision")
        except PrecisionError as exc:
            raise ModelError(str(exc)) from None
        layer.precision = precision

    if prune is not None:
        try:
            layer.prune = r_prune.Prune.from_dict(prune, f"{kind}: prune")
        except r_prune.PruneError as exc:
            raise ModelError(str(exc)) from None
    return layer


# ------------------------------------------------------------------ op table rows
def _dense_forward(l, x, ex, train):
    w, b = l.params
    y, ey, nsat = r_dense.forward(x, ex, w.data, w.exp, b.data, b.exp)
    return y, ey, nsat, (x, ex)


def _dense_backward(l, e, ee, saved, need_dx):
    x, ex = saved
    w = l.params[0]
    return r_dense.backward(e, ee, x, ex, w.data, w.exp, need_dx)


register_op(Op(
    "dense", _dense_forward, _dense_backward,
    nb_import="tinytrain.kernels.dense: dense_fwd, dense_bwd, dense_grad", c_header="tt_dense.h",
    args=lambda l: {"K": l.in_shape[0], "N": l.units},
    c_params=("dense", "tt_dense{wv}_params", {"K": "{K}", "N": "{N}", "w": "{w}", "ew": "{exp_w}", "b": "{b}", "eb": "{exp_b}"}),
    fwd=Call("dense_fwd({x}, {ex}, {w}, {exp_w}, {b}, {exp_b}, {scratch:N}, {y}, {stats})",
             "tt_dense_fwd_s8{wv}(&CTX, {params}, {x}, {ex}, {y})"),
    bwd=Call("dense_bwd({e}, {ee}, {w}, {exp_w}, {scratch:K}, {dx}, {stats})",
             "tt_dense_bwd_s8{wv}(&CTX, {params}, {e}, {ee}, {dx})"),
    grad=Call("dense_grad({e}, {x}, {g_w}, {g_b})", "tt_dense_grad_s32{wv}({params}, {e}, {x}, {g_w}, {g_b})"),
    grad_exp={"w": "{ee} + {ex}", "b": "{ee}"},
    # ops/dense.py; the C picks int32 below TT_DENSE_S32_MAX_K / _MAX_N (tt_dense.h)
    bounds=lambda l: [("forward sum", l.in_shape[0] * max_product(l) + 2**30, 32 if l.in_shape[0] * max_product(l) + 2**30 < 2**31 else 64),
                      ("input-error sum", l.units * max_product(l), 32 if l.units * max_product(l) < 2**31 else 64),
                      ("weight gradient", 127 * 127, 32)]))


def _relu_forward(l, x, ex, train):
    y, ey, nsat = r_relu.forward(x, ex)
    return y, ey, nsat, y  # backward masks with the saved output


register_op(Op(
    "relu", _relu_forward, lambda l, e, ee, y, need_dx: r_relu.backward(e, ee, y, need_dx),
    nb_import="tinytrain.kernels.elementwise: relu_fwd, relu_bwd", c_header="tt_relu.h",
    args=lambda l: {"n": l.in_size},
    fwd=Call("relu_fwd({x}, {ex}, {y}, {stats})", "tt_relu_fwd_s8({x}, {ex}, {n}, {y}, {stats})"),
    bwd=Call("relu_bwd({e}, {ee}, {y}, {dx}, {stats})", "tt_relu_bwd_s8({e}, {ee}, {y}, {n}, {dx}, {stats})")))


def _flatten_forward(l, x, ex, train):
    y, ey, nsat = r_flatten.forward(x, ex)
    return y, ey, nsat, None


register_op(Op(
    "flatten", _flatten_forward, lambda l, e, ee, saved, need_dx: r_flatten.backward(e, ee, l.in_shape, need_dx),
    nb_import="tinytrain.kernels.elementwise: flatten_fwd, flatten_bwd", c_header="tt_flatten.h",
    args=lambda l: {"n": l.in_size},
    fwd=Call("flatten_fwd({x}, {ex}, {y}, {stats})", "tt_flatten_fwd_s8({x}, {ex}, {n}, {y}, {stats})"),
    bwd=Call("flatten_bwd({e}, {ee}, {dx}, {stats})", "tt_flatten_bwd_s8({e}, {ee}, {n}, {dx}, {stats})")))


# --------------------------------------------- LeakyReLU: the worked example of docs/adding-an-op.md
@register
class LeakyReLU(Layer):
    kind = "leaky_relu"
    fields = {"alpha": F.Field("a number in (0, 1)", lambda v: F.is_number(v) and 0 < v < 1)}

    def __init__(self, alpha: float = 0.125):
        super().__init__()
        try:
            self.slope_q8 = r_leaky.slope_q8(alpha)
        except ValueError as exc:
            raise ModelError(str(exc)) from None
        self.alpha = alpha

    def config(self):
        return {"alpha": self.alpha}


def _leaky_forward(l, x, ex, train):
    y, ey, nsat = r_leaky.forward(x, ex, l.slope_q8)
    return y, ey, nsat, y  # backward masks with the saved output, as ReLU does


register_op(Op(
    "leaky_relu", _leaky_forward, lambda l, e, ee, y, need_dx: r_leaky.backward(e, ee, y, l.slope_q8, need_dx),
    nb_import="tinytrain.kernels.elementwise: leaky_relu_fwd, leaky_relu_bwd", c_header="tt_leaky_relu.h",
    args=lambda l: {"n": l.in_size, "slope_q8": l.slope_q8},
    fwd=Call("leaky_relu_fwd({x}, {ex}, {slope_q8}, {y}, {stats})",
             "tt_leaky_relu_fwd_s8({x}, {ex}, {n}, {slope_q8}, {y}, {stats})"),
    bwd=Call("leaky_relu_bwd({e}, {ee}, {y}, {slope_q8}, {dx}, {stats})",
             "tt_leaky_relu_bwd_s8({e}, {ee}, {y}, {n}, {slope_q8}, {dx}, {stats})")))
