"""Sequential models: definition, integer training state, and the reference training step.

The reference step (``Model.ref_train_step``) is the executable specification of one training
step; the numba fast path (sim.py) and the generated C (codegen) must leave the model in a
state with the same ``state_hash`` after every step.

Order of a step (one sample): forward through all layers (activations kept), loss head,
backward from the last layer: each layer computes dx with its current parameters, then its
parameter gradients, which the optimizer applies (direct mode) or accumulates (batch mode).
In batch mode, after the last sample of a batch the accumulated updates are applied layer by
layer in forward order. PRNG draws (stochastic rounding) happen in exactly this order.
Pruning (graph/prune.py) adds two hooks: after every optimizer touch of a pruned tensor its
pruned elements are set to zero in every slot, and the pruning event of optimizer step t, if
the schedule has one, runs just before the step counter moves past t.
"""
from __future__ import annotations

import numpy as np

from tinytrain import fixedpoint as fp
from tinytrain.graph.fields import is_int
from tinytrain.graph.layers import Layer, ModelError, layer_config, layer_from_config
from tinytrain.graph.precision import DTYPES, MASTER_BITS, Precision, PrecisionError
from tinytrain.graph import conv, norm, residual, wblock  # noqa: F401  (register the layer types, the rows)
from tinytrain.graph import act16
from tinytrain.ops import mse as r_mse
from tinytrain.ops import softmax_ce as r_ce
from tinytrain.graph.optim import SGD, IntSGD
from tinytrain.graph import optim as r_opt
from tinytrain.graph import prune as r_prune
from tinytrain.graph import loss_scale as r_lscale
from tinytrain.graph.wblock import shifts_of
from tinytrain.ops import wblock as r_wblock

LOSSES = ("softmax_ce", "mse")


class Sequential:
    """A stack of layers trained with integer SGD.

    >>> m = Sequential([Dense(32), ReLU(), Dense(10)], dataset=ds)   # shaped and scaled for ds
    >>> m = Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6)

    dataset: take input_shape, n_classes and the input exponent from a tinytrain Dataset the
    way build_model does: the int8 codes are read unchanged, at an exponent that puts the float
    training range into about [-1, 1] (``data.input_exp - data.unit_shift(data)``). Giving
    the data's own ``input_exp`` instead reads pixels as large values (digits: 0..16), and at
    the usual learning rates the first update kills every ReLU; fit warns when that happens.
    """

    def __init__(self, layers: list[Layer], input_shape=None, input_exp: int | None = None,
                 n_classes: int | None = None, loss: str = "softmax_ce", optimizer: SGD | None = None,
                 seed: int = 0, name: str = "model", dataset=None, precision=None, prune=None):
        data_input_exp = None
        if dataset is not None:
            from tinytrain.data import unit_shift

            input_shape = dataset.input_shape if input_shape is None else input_shape
            n_classes = (dataset.n_classes or None) if n_classes is None else n_classes
            if input_exp is None:
                input_exp = int(dataset.input_exp) - unit_shift(dataset)
            data_input_exp = int(dataset.input_exp)
        if input_shape is None:
            raise ModelError("Sequential needs input_shape=(...) (and input_exp=), or dataset=ds to "
                             "take both from the data")
        if input_exp is None:
            input_exp = 0
        if isinstance(layers, Layer):
            layers = [layers]
        if not layers:
            raise ModelError("a model needs at least one layer")
        for i, l in enumerate(layers):
            if not isinstance(l, Layer):
                raise ModelError(f"layer {i} is {l!r}, not a tinytrain layer")
        if loss not in LOSSES:
            raise ModelError(f"unknown loss {loss!r}: use one of {', '.join(LOSSES)}")
        if not (is_int(seed) and seed >= 0):
            raise ModelError(f"seed {seed!r} must be an integer >= 0")
        try:
            #: the model's precision policy (layers may override it: layer.precision)
            self.precision = Precision.parse(precision)
        except PrecisionError as exc:
            raise ModelError(str(exc)) from None
        for i, l in enumerate(layers):
            l.set_policy(self.precision, f"layer {i} ({l.kind}) precision")
            if isinstance(l.precision, dict) and "loss_scale" in l.precision:
                raise ModelError(f"layer {i} ({l.kind}) precision: loss_scale is one scale for the whole model: "
                                 "move it to the model's \"precision\" object")
            for key in ("activations", "errors"):
                if isinstance(l.precision, dict) and l.precision.get(key, getattr(self.precision, key)) != getattr(self.precision, key):
                    raise ModelError(f"layer {i} ({l.kind}) precision: {key} is one width for the whole model: "
                                     "move it to the model's \"precision\" object")
        self.layers = list(layers)
        self.input_shape = tuple(int(v) for v in input_shape)
        self.input_exp = int(input_exp)
        self.loss = loss
        self.optimizer = optimizer or SGD()
        self.seed = int(seed)
        self.name = name
        rng = np.random.default_rng(self.seed)  # build-time float init only
        shape = self.input_shape
        for i, l in enumerate(self.layers):
            try:
                shape = l.build(shape, rng)
            except ModelError as exc:
                raise ModelError(f"layer {i} ({l.kind}): {exc}") from None
        self.output_shape = shape
        if loss == "softmax_ce":
            if len(shape) != 1:
                raise ModelError(f"softmax_ce needs a flat output, the model ends with shape {shape}")
            self.n_classes = shape[0] if n_classes is None else n_classes
            if self.n_classes != shape[0]:
                raise ModelError(f"the last layer has {shape[0]} outputs but the data has {self.n_classes} classes")
        else:
            self.n_classes = 0
        self.optimizer = self._resolve_rounding(self.optimizer)
        self.opt: IntSGD = self.optimizer.compile()
        self.prune = _prune_config(prune, self.layers)
        if any(l.policy.blocked for l in self._leaf_layers() if l.params) and (
                self.prune is not None or any(getattr(l, "prune", None) for l in [*self.layers, *self._leaf_layers()])):
            raise ModelError("prune: pruning is not implemented for weights with exponent \"row\" or \"block32\": "
                             "drop prune or use \"exponent\": \"tensor\"")
        if self.precision.a16 and (why := act16.check(self)):
            raise ModelError(why)
        if data_input_exp is not None:
            self.data_input_exp = data_input_exp
        self._init_training_state()

    # ------------------------------------------------------------------ policy
    def param_policy(self, li: int, pi: int) -> Precision:
        """The policy parameter pi of layer li was built with (an inner layer's, in a block)."""
        l = self.layers[li]
        inner = getattr(l, "inner", None)
        if inner:
            k = max(j for j, off in enumerate(l.offsets) if off <= pi)
            return inner[k].policy
        return l.policy

    def _leaf_layers(self):
        for l in self.layers:
            yield from (getattr(l, "inner", None) or [l])

    def _resolve_rounding(self, sgd: SGD) -> SGD:
        """The optimizer's stochastic_rounding under the policies: on where some learning layer
        asks for it (int8 weights without a master under rounding "auto", or "stochastic")."""
        from dataclasses import replace

        wants = {l.policy.rounding for l in self._leaf_layers() if l.params}
        auto_sr = any(l.policy.needs_stochastic and l.policy.rounding == "auto"
                      for l in self._leaf_layers() if l.params)
        sr = "stochastic" in wants or auto_sr
        if sr and "nearest" in wants:
            raise ModelError("precision: rounding = \"nearest\" in one layer and stochastic rounding in another: "
                             "rounding is one for the model (one PRNG); use the same rounding everywhere")
        if "nearest" in wants and sgd.stochastic_rounding:
            raise ModelError("precision: rounding = \"nearest\" but optimizer.stochastic_rounding is true: drop one")
        return replace(sgd, stochastic_rounding=True) if sr and not sgd.stochastic_rounding else sgd

    def _master_bits(self, li, pi) -> int:
        """Width of the master copy of parameter pi of layer li (0: none): the policy's master, or
        int32 for ``optimizer.master_weights``; only a copy wider than the parameter counts. A
        bias (int16 under ``"bias": "int16"``) has none: the master is the weights'."""
        p = self.layers[li].params[pi]
        if p.data.dtype not in (np.int8, np.int16) or p.role == "bias":
            return 0
        pol = self.param_policy(li, pi)
        bits = MASTER_BITS[pol.master] if pol.master != "none" else (32 if self.opt.master else 0)
        return bits if bits > 8 * p.data.dtype.itemsize else 0

    def _velocity_dtype(self, li, pi):
        """int16 momentum (policy "momentum": "int16") for a parameter whose optimizer store is
        int8 or int16, in the same units as int32 momentum (2^-8 of a store step), saturating:
        +-128 store steps per update. A bias or an int32 master keeps int32 momentum: in its units
        (2^-8 of an int32 step) int16 would saturate at a fraction of one compute-copy step.
        int8 momentum ("momentum": "int8") has its own exponent, V8_SHIFT bits above those units:
        one unit is one store step, +-127 steps, stored with stochastic rounding (graph/optim.py)."""
        mom = self.param_policy(li, pi).momentum
        if mom == "int32":
            return np.int32
        store = self.master.get((li, pi), self.layers[li].params[pi].data)
        if mom == "int8" and store.dtype == np.int32 and self.layers[li].params[pi].role == "weight":
            raise ModelError(f"layer {li} ({self.layers[li].kind}): precision momentum = \"int8\" with "
                             "optimizer.master_weights (an int32 master keeps int32 momentum): drop master_weights "
                             "or use precision master \"int16\", or momentum \"int32\"")
        return DTYPES[mom] if store.dtype in (np.int8, np.int16) else np.int32

    def blocked(self, li, pi) -> bool:
        """Whether parameter pi of layer li is a weight with block exponents (graph/wblock.py)."""
        return self.layers[li].params[pi].role == "weight" and self.param_policy(li, pi).blocked

    def _block_len(self, li, pi) -> int:
        return self.param_policy(li, pi).block_len(self.layers[li].params[pi].data.shape[1])

    def master_exp(self, key) -> int:
        """Exponent of the master copy of parameter ``key``."""
        li, pi = key
        return self.layers[li].params[pi].exp - self.master_shift[key]

    # ------------------------------------------------------------------ state
    def _init_training_state(self):
        opt = self.opt
        self.trainable = self._trainable_mask()
        self.master = {}
        #: bits between a master copy and its compute copy (master = compute << shift)
        self.master_shift = {}
        self.accum = {}
        self.velocity = {}
        for li, l in enumerate(self.layers):
            for pi, p in enumerate(l.params):
                if not self.learns(li, pi):
                    continue
                key = (li, pi)
                mb = self._master_bits(li, pi)
                if mb and self.blocked(li, pi):  # the master at the weights' exponent (ops/wblock.py)
                    l = self.layers[li]
                    self.master[key] = r_wblock.expand(p.data, shifts_of(l, p.name).data, self._block_len(li, pi))
                    self.master_shift[key] = 0
                elif mb:
                    shift = mb - 8 * p.data.dtype.itemsize
                    self.master[key] = p.data.astype(DTYPES[f"int{mb}"]) << shift
                    self.master_shift[key] = shift
                if opt.accumulate:
                    self.accum[key] = np.zeros(p.data.shape, np.int32)
                if opt.mu_m:
                    self.velocity[key] = np.zeros(p.data.shape, self._velocity_dtype(li, pi))
        # scalars: PRNG state, optimizer step, samples in the current batch
        self.meta = np.array([fp.prng_seed(self.seed), 0, 0], dtype=np.int64)
        #: loss scale (graph/loss_scale.py): [E, clean steps in a row, overflow steps]; only
        #: with a global or static scale is it part of the state
        self.loss_scale = self.precision.scaler
        self.scaler = self.loss_scale.initial_state()
        try:  # pruning: the integer schedule and an all-kept mask per pruned tensor
            self.prune_table = r_prune.compile(self)
        except r_prune.PruneError as exc:
            raise ModelError(str(exc)) from None
        self.masks = r_prune.init_masks(self)
        self.stats = np.zeros(4, dtype=np.int64)  # [act saturations, weight saturations, update underflows, -]

    def _trainable_mask(self):
        mask = self._select(self.optimizer.train)
        if not any(any(row) for row in mask):
            raise ModelError(f"train={self.optimizer.train!r} selects no trainable parameter: nothing "
                             "would learn; use 'all', 'bias', 'last:K' with K >= 1 or layers with weights")
        return mask

    def _select(self, spec):
        with_params = [i for i, l in enumerate(self.layers) if any(p.trainable for p in l.params)]
        mask = [[p.trainable for p in l.params] for l in self.layers]
        if spec in ("all", None):
            return mask
        if spec == "bias":
            return [[p.role == "bias" for p in l.params] for l in self.layers]
        if isinstance(spec, str) and spec.startswith("last:") and spec[5:].isdigit():
            k = int(spec[5:])
            if not 1 <= k <= len(with_params):
                raise ModelError(f"train='{spec}': K must be 1..{len(with_params)}, the number of layers "
                                 "with parameters in this model")
            keep = set(with_params[-k:])
            return [[m and i in keep for m in row] for i, row in enumerate(mask)]
        if isinstance(spec, (list, tuple)):
            keep = set(int(i) for i in spec)
            bad = keep - set(range(len(self.layers)))
            if bad:
                raise ModelError(f"train= names layers {sorted(bad)} but the model has {len(self.layers)} layers")
            return [[m and i in keep for m in row] for i, row in enumerate(mask)]
        raise ModelError(f"train={spec!r}: use 'all', 'bias', 'last:K' or a list of layer indices")

    def learns(self, li: int, pi: int) -> bool:
        """Whether parameter pi of layer li is updated by the optimizer: a weight or bias that
        the ``train=`` selection keeps (the mask is False for state tensors)."""
        return bool(self.trainable[li][pi])

    def layer_learns(self, li: int) -> bool:
        return any(self.trainable[li])

    @property
    def first_learning(self) -> int:
        """Index of the first layer that learns (len(layers) if none): backward runs down to
        it and no further, and it needs no input error."""
        return next((li for li in range(len(self.layers)) if self.layer_learns(li)), len(self.layers))

    def state_tensors(self):
        """The ordered state covered by the state hash (the model schema order)."""
        out = []
        for li, l in enumerate(self.layers):
            for pi, p in enumerate(l.params):
                key = (li, pi)
                out.append(self.master[key] if key in self.master else self.stored(li, pi))
                if key in self.accum:
                    out.append(self.accum[key])
                if key in self.velocity:
                    out.append(self.velocity[key])
                if key in self.masks:
                    out.append(self.masks[key])
        out.append(self.meta.astype(np.uint32))
        if self.loss_scale.enabled:
            out.append(self.scaler.astype(np.int32))
        return out

    def stored(self, li, pi) -> np.ndarray:
        """Parameter pi of layer li as the state holds it: int4 weights packed two per byte
        (ops/wblock.pack_int4, a copy), any other the array itself."""
        p = self.layers[li].params[pi]
        if self.blocked(li, pi) and self.param_policy(li, pi).weights == "int4":
            return r_wblock.pack_int4(p.data)
        return p.data

    def state_hash(self) -> int:
        return fp.state_hash(self.state_tensors())

    def schema(self) -> dict:
        d = {
            "input_shape": list(self.input_shape), "input_exp": self.input_exp, "loss": self.loss,
            "n_classes": self.n_classes, "layers": [layer_config(l) for l in self.layers],
            "optimizer": self.optimizer.to_dict(), **self._prune_config(),
            "params": [[p.name, str(p.data.dtype), list(p.data.shape), p.exp, p.role] for l in self.layers for p in l.params],
        }
        if self.precision.to_dict():  # a default policy leaves the schema (and its hash) as it was
            d["precision"] = self.precision.to_dict()
            d["masters"] = [[li, pi, str(m.dtype), self.master_shift[(li, pi)]] for (li, pi), m in sorted(self.master.items())]
        return d

    def schema_hash(self) -> int:
        import json
        return fp.crc32(json.dumps(self.schema(), sort_keys=True).encode())

    def param_count(self) -> int:
        return sum(p.data.size for l in self.layers for p in l.params if p.trainable)

    def macs(self) -> int:
        return sum(l.macs() for l in self.layers)

    def summary(self) -> str:
        lines = [f"{self.name}: input {self.input_shape} (exp {self.input_exp}), loss {self.loss}"]
        for i, l in enumerate(self.layers):
            ps = ", ".join(f"{p.name}{list(p.data.shape)}:{p.data.dtype}@2^{p.exp}" for p in l.params)
            lines.append(f"  {i:2d} {l!r:32s} -> {l.out_shape}  {ps}")
        lines.append(f"  trainable parameters: {self.param_count()}, MACs/forward: {self.macs()}")
        if self.precision.to_dict() or any(l.precision is not None for l in self._leaf_layers()):
            over = {i: l.precision for i, l in enumerate(self.layers) if l.precision is not None}
            lines.append(f"  precision: {self.precision.to_dict() or 'default'}"
                         + (f", layer overrides {over}" if over else "")
                         + (f"; masters {sorted({str(v.dtype) for v in self.master.values()})}" if self.master else ""))
        return "\n".join(lines)

    # --------------------------------------------------------- validation
    def check_sample(self, x: np.ndarray, label):
        if x.dtype != np.int8:
            raise ModelError(f"inputs must be int8 (quantized), got {x.dtype}: quantize with tinytrain.data.quantize_inputs")
        if tuple(x.shape) != self.input_shape:
            raise ModelError(f"input shape {tuple(x.shape)} does not match the model's input {self.input_shape}")
        if self.loss == "softmax_ce" and not 0 <= int(label) < self.n_classes:
            raise ModelError(f"label {label} out of range for {self.n_classes} classes")

    # ------------------------------------------------------ reference step
    @property
    def act_dtype(self):
        """dtype of the activations and errors (precision "activations"): int8 or int16."""
        return self.precision.act_dtype

    def ref_forward(self, x, train=False):
        # int16 activations: the int8 input widened at its exponent (exact)
        a, ea, saved = np.asarray(x).astype(self.act_dtype), self.input_exp, []
        for l in self.layers:
            a, ea, nsat, s = l.ref_forward(a, ea, train)
            self.stats[0] += nsat
            saved.append(s)
        return a, ea, saved

    def ref_predict(self, x) -> int:
        z, ez, _ = self.ref_forward(x, train=False)
        return int(np.argmax(z))

    def ref_train_step(self, x, label):
        """One training step on one sample with the plain numpy reference. Returns
        (loss_q16, pred)."""
        self.check_sample(x, label)
        opt = self.opt
        z, ez, saved = self.ref_forward(x, train=True)
        if self.loss == "softmax_ce":
            e, ee, nsat, loss, pred = r_ce.forward_backward(z, ez, int(label))
        else:
            t = np.asarray(label, dtype=np.int8).reshape(-1)
            e, ee, nsat, loss, _ = r_mse.forward_backward(z, ez, t, self.target_exp)
            pred = 0
        self.stats[0] += nsat
        if self.loss_scale.enabled:  # the error at the global exponent; an overflow skips the step
            g, eg = r_ce.error(z, ez, int(label)) if self.loss == "softmax_ce" else r_mse.error(z, ez, t, self.target_exp)
            e, ee, nsat = r_lscale.quantize(g, eg, int(self.scaler[0]))
            self.stats[0] += nsat  # (the dynamic head's count stays too: the kernels compute both)
            if r_lscale.step(self.loss_scale, self.scaler, nsat):
                return loss, pred
        prng = [int(self.meta[0])]
        m_t = opt.lr_mult(int(self.meta[1]))
        first_trainable = self.first_learning
        for li in range(len(self.layers) - 1, -1, -1):
            if li < first_trainable:
                break
            l = self.layers[li]
            need_dx = li > first_trainable
            dx, edx, nsat, grads = l.ref_grads(e, ee, saved[li], need_dx)
            self.stats[0] += nsat
            for pi, p in enumerate(l.params):  # parameter order: the order PRNG draws are made in
                if self.learns(li, pi):
                    g, eg = grads[p.name]
                    self._apply_grad(li, pi, g, eg, m_t, prng)
            e, ee = dx, edx
        self.meta[0] = prng[0]
        self.meta[2] += 1
        if not opt.accumulate:
            r_prune.scheduled(self, int(self.meta[1]))
            self.meta[1] += 1
        elif self.meta[2] == opt.batch_size:
            self._apply_batch(prng)
        self.meta[0] = prng[0]
        return loss, pred

    def _store(self, li, pi):
        key = (li, pi)
        p = self.layers[li].params[pi]
        if key in self.master:
            return self.master[key], self.master_exp(key)
        return p.data, p.exp

    def _apply_grad(self, li, pi, g, eg, m_t, prng):
        w, ew = self._store(li, pi)
        if self.opt.accumulate:
            r_opt.accumulate_ref(self.accum[(li, pi)], ew, g, eg, self.opt, m_t, prng, self.stats)
        else:
            self.stats[1] += r_opt.update_direct_ref(w, ew, g, eg, self.opt, m_t, prng, self.stats)
            self._refresh(li, pi)
        r_prune.apply_key(self, (li, pi))

    def _refresh(self, li, pi):
        if (li, pi) in self.master and self.blocked(li, pi):
            p = self.layers[li].params[pi]
            p.data[...], shifts_of(self.layers[li], p.name).data[...] = r_wblock.narrow(
                self.master[(li, pi)], self._block_len(li, pi), self.param_policy(li, pi).weight_bits)
        elif (li, pi) in self.master:
            r_opt.refresh_compute_copy(self.master[(li, pi)], self.layers[li].params[pi].data,
                                       self.master_shift[(li, pi)])

    def _apply_batch(self, prng):
        for li, l in enumerate(self.layers):
            for pi in range(len(l.params)):
                if (li, pi) in self.accum:
                    self._apply_accumulated(li, pi, prng)
        r_prune.scheduled(self, int(self.meta[1]))
        self.meta[1] += 1
        self.meta[2] = 0

    def _apply_accumulated(self, li, pi, prng):
        w, _ = self._store(li, pi)
        self.stats[1] += r_opt.apply_accumulated_ref(w, self.accum[(li, pi)], self.velocity.get((li, pi)), self.opt, prng)
        self._refresh(li, pi)
        r_prune.apply_key(self, (li, pi))

    target_exp = 0

    # ------------------------------------------------------------ copying
    def copy(self) -> "Sequential":
        import copy
        return copy.deepcopy(self)

    @classmethod
    def from_config(cls, cfg: dict) -> "Sequential":
        layers = [layer_from_config(d) for d in cfg["layers"]]
        opt = SGD.from_dict(cfg.get("optimizer", {}))
        return cls(layers, input_shape=cfg["input_shape"], input_exp=cfg.get("input_exp", 0),
                   n_classes=cfg.get("n_classes"), loss=cfg.get("loss", "softmax_ce"),
                   optimizer=opt, seed=cfg.get("seed", 0), name=cfg.get("name", "model"),
                   precision=cfg.get("precision"), prune=cfg.get("prune"))

    # ------------------------------------------------------------ pruning
    def _prune_config(self) -> dict:
        return {"prune": self.prune.to_dict()} if self.prune is not None else {}

    def config(self) -> dict:
        d = {"name": self.name, "input_shape": list(self.input_shape), "input_exp": self.input_exp,
             "n_classes": self.n_classes, "loss": self.loss, "seed": self.seed,
             "layers": [layer_config(l) for l in self.layers],
             "optimizer": self.optimizer.to_dict(), **self._prune_config()}
        if self.precision.to_dict():
            d["precision"] = self.precision.to_dict()
        return d


def _prune_config(prune, layers):
    """Sequential(prune=...): a Prune or a "prune" object for the whole model, or
    {layer index: Prune or object} attaching one to each named layer."""
    try:
        if prune is None:
            return None
        if isinstance(prune, r_prune.Prune):
            prune.check("prune")
            return prune
        if isinstance(prune, dict) and prune and all(isinstance(k, int) and not isinstance(k, bool) for k in prune):
            for i, cfg in prune.items():
                if not 0 <= i < len(layers):
                    raise ModelError(f"prune names layer {i} but the model has {len(layers)} layers")
                layers[i].prune = r_prune.Prune.from_dict(cfg, f"layer {i}: prune")
            return None
        return r_prune.Prune.from_dict(prune, "prune")
    except r_prune.PruneError as exc:
        raise ModelError(str(exc)) from None
