"""Precision policies: the bit width of every tensor a model trains with.

A policy is a ``"precision"`` object in the model file (the model's default), which any layer
object may override with its own ``"precision"`` object, e.g.::

    "precision": {"weights": "int8", "master": "none"},
    "layers": [{"type": "dense", "units": 32, "precision": {"master": "int16"}}, ...]

or a preset name (:data:`PRESETS`). Keys and what tinytrain does with them:

``weights``  the compute copy of the weights of dense and conv layers: ``int16`` (the default),
             ``int8`` or ``int4`` (packed two per byte in C; the reference keeps the values
             unpacked in an int8 array). With ``exponent`` ``tensor`` its exponent is fixed at
             build time with 4x headroom above the initialisation bound (the int16 rule, in the
             narrower width). Values stay in the symmetric range (+-32767, +-127, +-7): every
             product bound of the kernels holds.
``exponent`` ``tensor`` (one fixed exponent per tensor), ``row`` (one per output row) or
             ``block32`` (one per 32 consecutive weights along the reduction, the integer form
             of the MX block formats), for int8 and int4 weights of dense layers, with an int16
             master: after every update each block's exponent is picked from the master
             (the rule is in tinytrain/ops/wblock.py). int4 weights need ``row`` or ``block32``.
``master``   a wider copy the optimizer updates, narrowed (rounded, saturated) into the
             compute copy after each update, the integer form of FP32 master weights:
             ``none``, ``int16`` (only for int8 weights) or ``int32``. It sits
             ``bits(master) - bits(weights)`` bits below the weights' exponent.
             ``optimizer.master_weights: true`` is the older spelling of ``int32``.
``rounding`` how an update is rounded into its storage: ``nearest``, ``stochastic`` or
             ``auto`` (the default): stochastic exactly when some int8 weights have no master.
             A step of an int8 weight is 1/128 of its range: most SGD updates are smaller than
             half a step and round-to-nearest drops them all (W1 stops learning), while
             stochastic rounding keeps their expectation. So int8 weights without a master
             and with ``nearest`` are refused. This sets the optimizer's
             ``stochastic_rounding`` (the PRNG is the optimizer's; it is one for the model).

``momentum`` ``int32``, ``int16`` or ``int8`` (graph/model.py; int8 has its own exponent and is
stored with stochastic rounding, graph/optim.py).

``activations``, ``errors`` ``int8`` (the default) or ``int16``: the activations kept for
             backward and the errors passed down, each with its per-step dynamic exponent
             (requantized from a wide accumulator to the symmetric range +-127 or +-32767).
             Model-wide, and int16 for both together (``A16``): the input is widened to int16
             at its exponent, every layer has an int16 twin (dense, relu, leaky_relu, flatten,
             conv2d, depthwise_conv2d, conv1d, maxpool2d, maxpool1d, batchnorm, avgpool2d,
             global_avgpool: graph/act16.py; residual blocks are refused naming the fix), the softmax head reads int16 logits in 64-bit
             integers. Needs int16 weights and the ``dynamic`` loss scale.

``bias``     the biases of dense and conv layers: ``int32`` (the default, 8 bits below the
             exponent of the layer's int16 weights) or ``int16`` (at that exponent: the
             weights' rule, 4x headroom above the initialisation bound). Added to the
             accumulator as an int32 is (C widens it first); the optimizer updates it as an
             int16 store (saturating to +-32767; stochastic rounding and int16/int8 momentum
             as for int16 weights). A bias has no master copy: ``master`` is the weights'.

``loss_scale`` ``dynamic`` (per-step error exponents, the default), ``global`` (a loss-scale
exponent with GradScaler's growth, backoff and skipped steps) or ``static`` (a fixed exponent):
graph/loss_scale.py. Model-wide: a layer cannot override it.

Batch-norm parameters and running statistics keep their formats under every policy.
A policy that leaves everything at its default changes nothing: the schema, the generated C and
the state hash of such a model are those of a model without a policy.
"""
from __future__ import annotations

from dataclasses import dataclass, fields as dc_fields, replace

import numpy as np

from tinytrain.graph import fields as F

WEIGHT_BITS = {"int16": 16, "int8": 8, "int4": 4}
MASTER_BITS = {"none": 0, "int16": 16, "int32": 32}
DTYPES = {"int8": np.int8, "int16": np.int16, "int32": np.int32}
#: weights per block of a block exponent (``row``: the whole reduction, see block_len)
BLOCK_LEN = {"row": 0, "block32": 32}

#: values accepted by the model file, per key (what is implemented; see NOT_YET)
FIELDS = {
    "weights": F.one_of("int16", "int8", "int4"),
    "master": F.one_of("none", "int16", "int32"),
    "rounding": F.one_of("auto", "nearest", "stochastic"),
    "momentum": F.one_of("int8", "int16", "int32"),
    "activations": F.one_of("int8", "int16"),
    "errors": F.one_of("int8", "int16"),
    "bias": F.one_of("int16", "int32"),
    "exponent": F.one_of("tensor", "row", "block32"),
    "loss_scale": F.Field('"dynamic", "global", "static", a compact string such as "global:init_scale=7" or an '
                          'object with "mode" (docs/precision.md)', lambda v: isinstance(v, (str, dict))),
}

#: values the issue tracker names that tinytrain does not implement yet: (key, value) -> advice
NOT_YET: dict = {}
#: bits of an activation / error tensor per policy value
ACT_BITS = {"int8": 8, "int16": 16}


class PrecisionError(ValueError):
    """A precision policy that is malformed, not implemented, or cannot train."""


@dataclass(frozen=True)
class Precision:
    weights: str = "int16"
    master: str = "none"
    rounding: str = "auto"
    momentum: str = "int32"
    activations: str = "int8"
    errors: str = "int8"
    bias: str = "int32"
    exponent: str = "tensor"
    loss_scale: str = "dynamic"

    # ---------------------------------------------------------------- parsing
    @classmethod
    def parse(cls, spec, where: str = "precision", base: "Precision | None" = None) -> "Precision":
        """A policy from a preset name, a dict of keys (over ``base``, default: the defaults) or
        a Precision. Raises PrecisionError naming the key."""
        base = base or cls()
        if spec is None:
            return base
        if isinstance(spec, Precision):
            return spec
        if isinstance(spec, str):
            if spec not in PRESETS:
                raise PrecisionError(f"{where}: unknown preset {spec!r}: use one of {', '.join(PRESETS)} "
                                     "or an object of keys (docs/precision.md)")
            return PRESETS[spec]
        cls.check_keys(spec, where)
        if "loss_scale" in spec:  # stored in its canonical compact form (graph/loss_scale.py)
            spec = {**spec, "loss_scale": _loss_scale_str(spec["loss_scale"], where)}
        p = replace(base, **spec)
        p.check(where)
        return p

    @staticmethod
    def check_keys(spec, where: str = "precision") -> None:
        """The keys and values of an object (or a preset name), not yet their combination (a
        layer's override is complete only over the model's policy)."""
        if isinstance(spec, str):
            Precision.parse(spec, where)
            return
        if not isinstance(spec, dict):
            raise PrecisionError(f"{where} must be a preset name or an object of keys, got {F.show(spec)}")
        F.check(spec, FIELDS, where, PrecisionError)
        if "loss_scale" in spec:
            _loss_scale_str(spec["loss_scale"], where)
        for k, v in spec.items():
            if isinstance(v, str) and (k, v) in NOT_YET:
                raise PrecisionError(f"{where}: {k} = {F.show(v)} is not implemented yet: {NOT_YET[(k, v)]}")

    def check(self, where: str = "precision") -> None:
        if self.master != "none" and MASTER_BITS[self.master] <= WEIGHT_BITS[self.weights]:
            raise PrecisionError(f"{where}: master = {self.master!r} is not wider than the {self.weights} weights: "
                                 f"use {'int32' if self.weights == 'int16' else 'int16 or int32'}, or none")
        if self.weights == "int4" and self.exponent == "tensor":
            raise PrecisionError(f"{where}: int4 weights need a finer exponent than one per tensor: "
                                 "add \"exponent\": \"row\" or \"block32\" (and \"master\": \"int16\")")
        if self.blocked and self.weights == "int16":
            raise PrecisionError(f"{where}: exponent = {self.exponent!r} is for int8 or int4 weights; int16 weights "
                                 "have one exponent per tensor: drop exponent or use \"weights\": \"int4\"")
        if self.blocked and self.master != "int16":
            raise PrecisionError(f"{where}: exponent = {self.exponent!r} picks each block's exponent from an int16 "
                                 f"master copy, and master is {self.master!r}: use \"master\": \"int16\"")
        if self.momentum == "int8" and self.master == "int32":
            raise PrecisionError(f"{where}: momentum = \"int8\" has no int8 store to follow: an int32 master keeps int32 "
                                 "momentum (an int8 slot holds whole int16/int8 store steps): use master \"int16\" or "
                                 "\"none\", or momentum \"int32\"")
        if self.momentum == "int8" and self.rounding == "nearest":
            raise PrecisionError(f"{where}: momentum = \"int8\" stores its slot with stochastic rounding (round-to-nearest "
                                 "stalls a decaying slot a few steps from 0): use rounding \"auto\" or \"stochastic\", or "
                                 "momentum \"int16\"")
        if self.activations != self.errors:
            raise PrecisionError(f"{where}: activations = \"{self.activations}\" with errors = \"{self.errors}\": the "
                                 "kernels take both at one width: give \"activations\" and \"errors\" the same value")
        if self.a16 and self.weights != "int16":
            raise PrecisionError(f"{where}: activations = \"int16\" is implemented with int16 weights only, and weights "
                                 f"is \"{self.weights}\": use \"weights\": \"int16\" (master int32 is allowed), or int8 activations")
        if self.a16 and self.loss_scale != "dynamic":
            raise PrecisionError(f"{where}: activations = \"int16\" takes the loss head's error at its dynamic exponent: "
                                 "drop loss_scale (or use \"dynamic\"), or use int8 activations")
        if self.weights == "int8" and self.master == "none" and self.rounding == "nearest":
            raise PrecisionError(f"{where}: int8 weights without a master copy cannot train with rounding = \"nearest\" "
                                 "(updates below half a step are all lost): use rounding \"stochastic\" (or \"auto\") "
                                 "or master \"int16\"")

    # ----------------------------------------------------------------- queries
    @property
    def scaler(self):
        """The loss_scale as a graph.loss_scale.LossScale."""
        from tinytrain.graph.loss_scale import LossScale

        return LossScale.parse(self.loss_scale)

    def to_dict(self, only_changed: bool = True) -> dict:
        d = {f.name: getattr(self, f.name) for f in dc_fields(self)}
        if only_changed:
            d = {k: v for k, v in d.items() if v != getattr(DEFAULT, k)}
        return d

    @property
    def weight_dtype(self):
        return np.int8 if self.weights == "int4" else DTYPES[self.weights]

    @property
    def weight_bits(self) -> int:
        return WEIGHT_BITS[self.weights]

    def master_shift(self) -> int:
        """Bits the master sits below the compute copy (0: no master)."""
        return MASTER_BITS[self.master] - self.weight_bits if self.master != "none" else 0

    @property
    def blocked(self) -> bool:
        """Whether the weights carry one exponent per row or per block (ops/wblock.py)."""
        return self.exponent in BLOCK_LEN

    def block_len(self, K: int) -> int:
        """Weights per block along a reduction of length K (row: all K; block32: 32)."""
        return K if self.exponent == "row" else min(BLOCK_LEN[self.exponent], K)

    @property
    def a16(self) -> bool:
        """Whether activations and errors are int16 (graph/act16.py)."""
        return self.activations == "int16"

    @property
    def act_bits(self) -> int:
        """Bits of the activation and error tensors (8 or 16)."""
        return ACT_BITS[self.activations]

    @property
    def act_dtype(self):
        return DTYPES[self.activations]

    @property
    def needs_stochastic(self) -> bool:
        return self.weights == "int8" and self.master == "none"


DEFAULT = Precision()

#: named policies (``--precision NAME``)
PRESETS = {
    "int16": DEFAULT,
    "int16-master32": Precision(master="int32"),
    "int8": Precision(weights="int8"),
    "int8-master16": Precision(weights="int8", master="int16"),
    "int8-master32": Precision(weights="int8", master="int32"),
    "int4-row-master16": Precision(weights="int4", master="int16", exponent="row"),
    "int4-block32-master16": Precision(weights="int4", master="int16", exponent="block32"),
    "int16-bias16": Precision(bias="int16"),
    "int8-bias16": Precision(weights="int8", bias="int16"),
    "int16-act16": Precision(activations="int16", errors="int16"),
}


def _loss_scale_str(v, where: str) -> str:
    from tinytrain.graph.loss_scale import LossScaleError, canonical

    try:
        return canonical(v, f"{where}: loss_scale")
    except LossScaleError as exc:
        raise PrecisionError(str(exc)) from None


def parse_cli(text: str) -> "dict | str":
    """``--precision`` as given on the command line: a preset name or a JSON object."""
    import json

    t = text.strip()
    if t.startswith("{"):
        try:
            v = json.loads(t)
        except json.JSONDecodeError as exc:
            raise PrecisionError(f"--precision: not valid JSON ({exc.msg} at column {exc.colno}): "
                                 "give a preset name or an object such as '{\"weights\": \"int8\"}'") from None
        Precision.parse(v, "--precision")
        return v
    Precision.parse(t, "--precision")
    return t
