"""Layers: configuration, parameter initialisation (build time, float allowed), and the glue
that calls each op's reference (simulator spec), numba kernel (fast path) and C kernel
(codegen). One class per layer type; the arithmetic lives in ops/, kernels/ and firmware/."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np

from tinytrain.graph import fields as F
from tinytrain.ops import dense as r_dense
from tinytrain.ops import flatten as r_flatten
from tinytrain.ops import relu as r_relu


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


def _weight_exp(bound: float) -> int:
    """Fixed int16 exponent leaving 4x headroom above the init bound (range >= 4 * bound)."""
    return math.ceil(math.log2(4.0 * bound)) - 15


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

    def __init__(self):
        self.params = []
        self.in_shape = self.out_shape = None

    def config(self) -> dict:
        return {}

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
        ew = _weight_exp(bound)
        w = _quantize(rng.uniform(-bound, bound, (self.units, K)), ew, np.int16)
        return [Param("w", w, ew, "weight"), Param("b", np.zeros(self.units, np.int32), ew - 8, "bias")]

    def macs(self):
        return self.units * self.in_shape[0]

    def ref_forward(self, x, ex, train):
        w, b = self.params
        y, ey, nsat = r_dense.forward(x, ex, w.data, w.exp, b.data, b.exp)
        return y, ey, nsat, (x, ex)

    def ref_backward(self, e, ee, saved, need_dx):
        x, ex = saved
        w = self.params[0]
        return r_dense.backward(e, ee, x, ex, w.data, w.exp, need_dx)


class ReLU(Layer):
    kind = "relu"
    fields = {}

    def ref_forward(self, x, ex, train):
        y, ey, nsat = r_relu.forward(x, ex)
        return y, ey, nsat, y

    def ref_backward(self, e, ee, saved, need_dx):
        return r_relu.backward(e, ee, saved, need_dx)


class Flatten(Layer):
    kind = "flatten"
    fields = {}

    def _out_shape(self, in_shape):
        return (int(np.prod(in_shape)),)

    def ref_forward(self, x, ex, train):
        y, ey, nsat = r_flatten.forward(x, ex)
        return y, ey, nsat, None

    def ref_backward(self, e, ee, saved, need_dx):
        return r_flatten.backward(e, ee, self.in_shape, need_dx)


LAYER_TYPES = {cls.kind: cls for cls in (Dense, ReLU, Flatten)}


def register(cls):
    LAYER_TYPES[cls.kind] = cls
    return cls


def layer_from_config(d: dict) -> Layer:
    d = dict(d)
    kind = d.pop("type", None)
    if not isinstance(kind, str) or kind not in LAYER_TYPES:
        raise ModelError(
            f"unknown layer type {kind!r}: known types are {', '.join(sorted(LAYER_TYPES))}"
        )
    cls = LAYER_TYPES[kind]
    if cls.fields is not None:
        F.check(d, cls.fields, kind, ModelError)
        sig = inspect.signature(cls.__init__).parameters.values()
        missing = [p.name for p in sig if p.default is p.empty and p.name != "self" and p.name not in d]
        if missing:
            raise ModelError(f"{kind} needs {', '.join(f'{m} ({cls.fields[m].desc})' for m in missing)}")
    try:
        return cls(**d)
    except TypeError as exc:
        raise ModelError(f"bad options for layer {kind!r}: {exc}") from None


# ---------------------------------------------------------------------------------------
# numba emitters: each returns source lines for the generated training function (sim.py).
# ctx provides: x (input buffer expr), ex (input exponent expr), y (output buffer expr),
# p(j) (param j storage expr, shaped), pe(j) (its exponent literal), e (output-error expr),
# dx (input-error expr or None), g(j) (gradient buffer expr for param j), buf(j) (extra buffer).

def _nb_dense_fwd(self, c):
    return [f"{c.ey} = dense_fwd({c.x}, {c.ex}, {c.p(0)}, {c.pe(0)}, {c.p(1)}, {c.pe(1)}, S64[:{self.units}], {c.y}, stats)"]


def _nb_dense_bwd(self, c):
    lines = []
    if c.dx is not None:
        lines.append(f"{c.edx} = dense_bwd({c.e}, {c.ee}, {c.p(0)}, {c.pe(0)}, S64[:{self.in_shape[0]}], {c.dx}, stats)")
    lines.append(f"dense_grad({c.e}, {c.x}, {c.g(0)}, {c.g(1)})")
    lines.append(f"{c.geo(0)} = {c.ee} + {c.ex}")
    lines.append(f"{c.geo(1)} = {c.ee}")
    return lines


Dense.nb_imports = ["from tinytrain.kernels.dense import dense_fwd, dense_bwd, dense_grad"]
Dense.nb_forward = _nb_dense_fwd
Dense.nb_backward = _nb_dense_bwd

# the kernels tests/test_ops_elementwise.py checks against ops/relu.py and ops/flatten.py
ReLU.nb_imports = ["from tinytrain.kernels.elementwise import relu_fwd, relu_bwd"]
ReLU.nb_forward = lambda self, c: [f"{c.ey} = relu_fwd({c.x}, {c.ex}, {c.y}, stats)"]
ReLU.nb_backward = lambda self, c: ([f"{c.edx} = relu_bwd({c.e}, {c.ee}, {c.y}, {c.dx}, stats)"] if c.dx is not None else [])

Flatten.nb_imports = ["from tinytrain.kernels.elementwise import flatten_fwd, flatten_bwd"]
Flatten.nb_forward = lambda self, c: [f"{c.ey} = flatten_fwd({c.x}, {c.ex}, {c.y}, stats)"]
Flatten.nb_backward = lambda self, c: ([f"{c.edx} = flatten_bwd({c.e}, {c.ee}, {c.dx}, stats)"] if c.dx is not None else [])
