"""Emit a self-contained C99 model (header + source) for a tinytrain Sequential model.

The generated code holds the model's whole training state in static arrays planned at
build time (no malloc), calls one runtime kernel per op (firmware/), and exposes:

    int32_t <p>_train_step(const int8_t *x, int32_t label, int32_t *loss_q16);   -> prediction
    int32_t <p>_predict(const int8_t *x);
    uint32_t <p>_state_hash(void);
    uint32_t <p>_state_size(void);
    int <p>_read_state(uint32_t off, uint8_t *dst, uint32_t n);
    int <p>_write_state(uint32_t off, const uint8_t *src, uint32_t n);
    void <p>_reset(void);  void <p>_set_seed(uint32_t seed);
    int <p>_get_tensor(uint32_t id, uint32_t off, uint8_t *dst, uint32_t n, uint32_t *total);

The state blob is the concatenation, in schema order, of the tensors of
``Sequential.state_tensors()`` (little-endian), so its CRC-32 is the state hash.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tinytrain.codegen import sparse as S
from tinytrain.graph import optable
from tinytrain.graph.optable import Names
from tinytrain.graph.state import outside_symmetric, symmetric_error
from tinytrain.ops.wblock import pack_int4

CTYPE = {np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t", np.dtype(np.int32): "int32_t",
         np.dtype(np.uint32): "uint32_t", np.dtype(np.uint8): "uint8_t"}
#: layer types with C kernels for int8 weights (optable.weight_variant "_w8")
C_WEIGHT_VARIANTS = {"dense", "conv2d", "depthwise_conv2d", "conv1d"}
#: layer types whose weight gradients the C forms one output channel at a time (tt_conv_wgrad.h)
BY_CHANNEL = {"conv2d", "conv1d"}
#: the SGD kernels' suffix for a storage type
#: the tt_sgd_apply_accumulated_* suffix of a velocity's width (precision policy "momentum")
_VEL_SUFFIX = {np.dtype(np.int32): "", np.dtype(np.int16): "_v16", np.dtype(np.int8): "_v8"}
STORE_TAG = {np.dtype(np.int8): "s8", np.dtype(np.int16): "s16", np.dtype(np.int32): "s32"}
#: (master dtype, compute dtype, shift) -> the C call narrowing a master into its compute copy
REFRESH = {(np.dtype(np.int32), np.dtype(np.int16), 16): "tt_sgd_refresh_copy",
           (np.dtype(np.int32), np.dtype(np.int8), 24): "tt_sgd_refresh_copy_s32_s8",
           (np.dtype(np.int16), np.dtype(np.int8), 8): "tt_sgd_refresh_copy_s16_s8"}


class CodegenError(ValueError):
    """The model cannot be emitted as C (an op without a C kernel, a bad prefix...)."""


def c_array(ctype: str, name: str, values: np.ndarray, const=False, per_line=16) -> str:
    vals = [str(int(v)) for v in np.asarray(values).reshape(-1)]
    rows = [", ".join(vals[i:i + per_line]) for i in range(0, len(vals), per_line)] or ["0"]
    body = ",\n    ".join(rows)
    return f"{'static const' if const else 'static'} {ctype} {name}[{max(1, len(vals))}] = {{\n    {body}\n}};"


@dataclass
class Tensor:
    """One buffer of the generated model with its role, for the memory report."""

    name: str
    ctype: str
    count: int
    role: str  # param | master | accum | zero | velocity | activation | error | grad | scratch | meta
    layer: int = -1
    init: np.ndarray | None = None
    dense: int = 0   # stored sparse (tinytrain.codegen.sparse): the element count of its dense view
    mask: str = ""   # stored sparse: the mask it is packed by (the mask itself: its own name)
    shape: tuple = ()  # stored sparse: (rows, cols) of the dense view
    fmt: str = ""    # stored sparse: "blocks", "rows" or "bitmap" (tinytrain.codegen.sparse.FORMATS)

    @property
    def bytes(self) -> int:
        if self.role == "zero":  # a state tensor that is always 0 and has no storage (keeps_rows)
            return 0
        return self.count * {"int8_t": 1, "uint8_t": 1, "int16_t": 2, "int32_t": 4, "uint32_t": 4, "int64_t": 8}[self.ctype]


@dataclass
class Emitted:
    header: str
    source: str
    prefix: str
    tensors: list = field(default_factory=list)
    state_order: list = field(default_factory=list)  # names of the tensors hashed, in order
    flash_const_bytes: int = 0

    def write(self, out_dir) -> list[Path]:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        h, c = out / f"{self.prefix}.h", out / f"{self.prefix}.c"
        h.write_text(self.header)
        c.write_text(self.source)
        return [h, c]


class _CNames(Names):
    """The C spelling of a model's buffers: prefixed static arrays (Emitter.sym)."""

    target, stats = "c", "&STATS"

    def __init__(self, em):
        self.em = em

    def param(self, li, pi):
        return self.em.sym(f"l{li}_{self.em.model.layers[li].params[pi].name}")

    def grad(self, li, pi):
        return self.em.grad_name(li, pi)

    def grad_exp(self, li, pi):
        return f"ge{pi}"

    def buf(self, li, name):
        return self.em.sym(f"l{li}_{name}")

    def learns(self, li, pis):
        """The shared gradient buffers are sized for the layers that learn, so a frozen
        layer's backward must not run its gradient kernel."""
        return any(self.em.model.learns(li, pi) for pi in pis)

    def stmt(self, s):
        return s + ";"

    def scratch(self, words):
        return "SCRATCH"

    def unused(self, names):
        return [" ".join(f"(void){n};" for n in names)]

    def decl(self, li, tag, ctype, fields):
        return self.em.decl(f"l{li}_{tag}", ctype, fields)


def _has_c(layer) -> bool:
    op = optable.OPS.get(layer.kind)
    if op is None:
        return False
    if op.composite:
        return all(_has_c(l) for l in layer.inner)
    return op.fwd is not None and bool(op.fwd.c)


class Emitter:
    def __init__(self, model, prefix="tt_model", storage=None):
        if not prefix.isidentifier():
            raise CodegenError(f"prefix {prefix!r} is not a valid C identifier")
        self.model, self.prefix = model, prefix
        pruned = S.choose(model, storage, CodegenError)
        self.sparse = S.Renderer(self, pruned)  # what fused() reads, before the frozen weights are chosen
        self.sparse = S.Renderer(self, pruned, S.frozen(model, storage,
                                                        lambda li: li < model.first_learning or self.fused(li)))
        self.decls: dict[str, str] = {}  # symbol -> its static const declaration (decl)
        for i, l in enumerate(model.layers):
            if not _has_c(l):
                supported = sorted(k for k, op in optable.OPS.items() if op.composite or (op.fwd and op.fwd.c))
                raise CodegenError(f"layer {i} ({l.kind}) has no C kernel yet: the code generator "
                                   f"supports {', '.join(supported)}")
        self.names = _CNames(self)

    def sym(self, name: str) -> str:
        """Every emitted symbol goes through this one prefixing function."""
        return f"{self.prefix}_{name}"

    def decl(self, name: str, ctype: str, fields: dict) -> str:
        """The declarations hook: emitters call this (through their context's ``decl``) for a
        ``static const ctype <prefix>_name = {.field = value, ...};`` emitted once, before the
        functions; returns ``&<prefix>_name`` for the kernel call. Fields are in the order given;
        the same name must always be declared with the same fields (train step and predict)."""
        sym = self.sym(name)
        text = f"static const {ctype} {sym} = {{" + ", ".join(f".{k} = {v}" for k, v in fields.items()) + "};"
        if self.decls.setdefault(sym, text) != text:
            raise CodegenError(f"{sym} declared twice with different fields")
        return f"&{sym}"

    def prng_jump(self, k: int) -> str:
        """The table of k PRNG steps at once (tt_prng_jump; fixedpoint.prng_jump_table), declared
        once per k before the declarations that point at it; returns its symbol."""
        from tinytrain.fixedpoint import prng_jump_table

        sym = self.sym(f"prng_jump_{k}")
        rows = ", ".join("{" + ", ".join(f"0x{int(v):08x}u" for v in row) + "}" for row in prng_jump_table(k))
        self.decls.setdefault(sym, f"/** {k} xorshift32 steps at once (tt_prng_jump) */\n"
                                   f"static const uint32_t {sym}[8][16] = {{{rows}}};")
        return sym

    @property
    def n_ge(self) -> int:
        """Gradient exponent variables / shared gradient buffers: one per parameter index."""
        return max([4] + [len(l.params) for l in self.model.layers])

    def by_channel(self, li) -> bool:
        """Conv2d / Conv1d layers that learn form their weight gradient one output channel at a
        time (tt_conv_wgrad.h) and apply it before the next: the gradient buffer holds one
        channel, not the whole tensor (W3's conv2: 72 values instead of 1,152)."""
        return self.model.layers[li].kind in BY_CHANNEL and self.model.layer_learns(li)

    def chan_size(self, li) -> int:
        w = self.model.layers[li].params[0].data
        return int(w.size // w.shape[0])

    def _chan_block(self, li) -> int:
        """Output channels per register block: tt_conv.c (conv2d_grad_gather) keeps 2 (4 when Cin < 4) output
        channels' sums in registers and shares each loaded input among them."""
        return min(self.model.layers[li].params[0].data.shape[0], 2 if self.model.layers[li].params[0].data.shape[-1] >= 4 else 4)

    def chan_group(self, li) -> int:
        """Output channels per gradient call: whole register blocks, as many as the shared gradient
        buffer holds anyway (its size is set by the layer needing the most with one block each:
        W3's conv1 takes all 8 channels in one call, in the 144 words conv2's 2 x 72 need; each call
        rebuilds the kernel's padded input and error copies)."""
        if not hasattr(self, "_grad0_words"):
            self._grad0_words = max([self._chan_block(i) * self.chan_size(i) for i, l in enumerate(self.model.layers)
                                     if self.model.layer_learns(i) and not self.fused(i) and self.by_channel(i)] or [0])
        blk, cout = self._chan_block(li), self.model.layers[li].params[0].data.shape[0]
        return max(blk, min(cout, self._grad0_words // self.chan_size(li) // blk * blk))

    def fused(self, li) -> bool:
        """Dense layers in direct mode update without a gradient buffer (tt_sgd_dense_direct), and so do
        those whose every learning tensor takes the fused accumulate-apply at its backward
        (tt_sgd_dense_accumulate_apply: momentum at batch size 1, int16 weights or an int32 master)."""
        m = self.model
        if m.layers[li].kind != "dense":
            return False
        if self.a16:  # int16 activations: row by row through the SGD kernels (_dense_a16)
            return True
        if not m.opt.accumulate:
            return True
        return self._fuses_dense_acc(li) or self._fuses_dense_accum(li)

    def _fuses_dense_accum(self, li) -> bool:
        """Accumulate mode: a Dense layer's per-sample accumulate forms its gradient as it goes
        (tt_sgd_dense_accumulate_s32) when no learning tensor is pruned or blocked (with stochastic
        rounding too: the draws in the same order, one per weight); the end-of-batch apply stays
        where it is."""
        m = self.model
        keys = [(li, pi) for pi in (0, 1) if m.learns(li, pi)]
        # a bias that applies at its backward (_fuses_apply: int8/int16 momentum weights beside an
        # int32-velocity bias at batch 1) is left out of the accumulate (ba NULL) and takes its own
        # accumulate-apply right after it, from e widened into the scratch (_bias_apply_after)
        return (m.layer_learns(li) and not m.masks and not m.blocked(li, 0)
                and all(k in m.accum and (not self._fuses_apply(k) or k == (li, 1) and self._bias_apply_after(li))
                        for k in keys))

    def _bias_apply_after(self, li) -> bool:
        """Dense layer li's weights accumulate per sample (no _fuses_apply) while its bias applies at
        its backward: no stochastic rounding (_fuses_apply), so no draw moves, and the bias's
        gradient e[n] needs N int32 of the scratch, not the gradient buffer."""
        m, key = self.model, (li, 1)
        return (m.layers[li].kind == "dense" and m.learns(li, 0) and m.learns(li, 1) and not self._fuses_apply((li, 0))
                and self._fuses_apply(key) and m.layers[li].params[1].data.dtype == np.int32)

    def keeps(self, li) -> bool:
        """A Dense layer on the per-sample accumulate route (_fuses_dense_accum) at batch size 1 whose
        weights' apply is tt_sgd_apply_accumulated_s32_copy (an int32 master, its int16 copy, an
        int32 velocity or none): its weight accumulate, when it draws nothing, waits for the
        end-of-step apply, which forms it in the same pass (tt_sgd_dense_apply_kept_s32; its error
        copied into l<li>_ekeep, its input, the step's x or a<li-1>, alive until then). The
        draws and bits are those of the two calls."""
        m, key = self.model, (li, 0)
        if not (m.layers[li].kind == "dense" and m.opt.accumulate and m.opt.batch_size == 1 and not self.a16
                and m.learns(li, 0) and self._fuses_dense_accum(li)):
            return False
        w, t = self._update_target(li, 0)
        return (t == "s32" and m.velocity.get(key, np.zeros(0, np.int32)).dtype == np.int32
                and self._refresh(li, 0) == f"tt_sgd_refresh_copy({w}, {self.names.param(li, 0)}, {m.layers[li].params[0].data.size});")

    def keeps_rows(self, li) -> bool:
        """A Dense layer on the per-sample accumulate route at batch size 1 whose weights have an
        int8 or int16 velocity slot (precision "momentum") and no master, without stochastic
        rounding: its weights need no accumulators. The backward keeps the error (l<li>_ekeep)
        and the step's input; the end-of-step apply forms and applies the accumulate row by row
        in the scratch (tt_sgd_dense_rows_apply: same bits, counts and draws). The accumulators
        stay in the state blob as a zero span (tt_state.h): always 0 between steps. K a multiple
        of 4 keeps every row of the weights and slots as aligned as the tensor (the DSP applies)."""
        m, opt, key = self.model, self.model.opt, (li, 0)
        if not (m.layers[li].kind == "dense" and opt.accumulate and opt.batch_size == 1 and not opt.sr and not self.a16
                and m.learns(li, 0) and key in m.accum and key not in m.master and self._fuses_dense_accum(li)
                and not self._fuses_dense_acc(li) and not self.keeps(li)):
            return False
        v = m.velocity.get(key)
        return (v is not None and v.dtype in (np.int8, np.int16) and m.layers[li].in_shape[0] % 4 == 0
                and self._update_target(li, 0)[1] in ("s16", "s8"))

    def _accum_fields(self, li) -> dict:
        """tt_sgd_dense_accum_params of Dense layer li (the per-sample accumulate and a kept apply)."""
        m, (w, b) = self.model, self.model.layers[li].params[:2]
        K, N = self.model.layers[li].in_shape[0], self.model.layers[li].units
        fields = {"K": K, "N": N, "wa": f"{self.names.param(li, 0)}_acc" if (li, 0) in m.accum and not self.keeps_rows(li) else 0,
                  "ew": m.master_exp((li, 0)) if (li, 0) in m.master else w.exp,
                  "ba": f"{self.names.param(li, 1)}_acc" if (li, 1) in m.accum and not self._bias_apply_after(li) else 0,
                  "eb": m.master_exp((li, 1)) if (li, 1) in m.master else b.exp}
        if self.keeps(li):
            fields["keep"] = f"&{self.sym(f'l{li}_keep')}"
        return fields

    def _rows_fields(self, li) -> str:
        """The initialiser of layer li's tt_sgd_dense_rows (keeps_rows)."""
        m, key = self.model, (li, 0)
        l, (w, t) = m.layers[li], self._update_target(li, 0)
        v = f"{self.names.param(li, 0)}_vel"
        return (f".K = {l.in_shape[0]}, .N = {l.units}, .ew = {l.params[0].exp}, .{'w16' if t == 's16' else 'w8'} = {w}, "
                f".{'v16' if m.velocity[key].dtype == np.int16 else 'v8'} = {v}, .e = {self.sym(f'l{li}_ekeep')}")

    def _fuses_dense_acc(self, li) -> bool:
        m = self.model
        if not m.layer_learns(li) or m.blocked(li, 0) or m.layers[li].params[0].data.dtype != np.int16:
            return False
        if (li, 1) in m.master or ((li, 0) in m.master and not self._refresh(li, 0).startswith("tt_sgd_refresh_copy(")):
            return False
        return all(self._fuses_apply((li, pi)) for pi in (0, 1) if m.learns(li, pi))

    @property
    def a16(self) -> bool:
        """int16 activations and errors (precision "activations": "int16", graph/act16.py)."""
        return self.model.precision.a16

    @property
    def act_ctype(self) -> str:
        return "int16_t" if self.a16 else "int8_t"

    @property
    def first_backward(self) -> int:
        """Index of the first layer whose backward is emitted (the first with a trainable
        parameter): layers before it run forward only, so declare no backward buffers."""
        return self.model.first_learning

    def grad_name(self, li, pi):
        return self.sym(f"grad{pi}")

    # ---------------------------------------------------------------- planning
    def plan(self):
        m = self.model
        for li, l in enumerate(m.layers):
            for k, leaf in enumerate(getattr(l, "inner", None) or [l]):
                if optable.weight_variant(leaf) and leaf.kind not in C_WEIGHT_VARIANTS:
                    where = f"layer {li}" + (f" (inner layer {k})" if leaf is not l else "")
                    raise CodegenError(f"{where} ({leaf.kind}) has int8 weights, for which its layer type has no C "
                                       "kernels: give it \"precision\": {\"weights\": \"int16\"} "
                                       "(the host simulator trains it as it is)")
        T, order = [], []
        for li, l in enumerate(m.layers):
            for pi, p in enumerate(l.params):
                key = (li, pi)
                nm = self.sym(f"l{li}_{p.name}")
                frozen = p.role != "state" and not m.learns(li, pi)
                ctype, count, init = CTYPE[p.data.dtype], p.data.size, p.data
                if m.blocked(li, pi) and m.param_policy(li, pi).weights == "int4":
                    ctype, init = "uint8_t", pack_int4(p.data)  # two per byte (tt_dense_wblk.h)
                    count = init.size
                T.append(Tensor(nm, ctype, count, "frozen" if frozen else "param", li, init))
                if key in m.master:
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_master"), CTYPE[m.master[key].dtype], p.data.size, "master", li, m.master[key]))
                    order.append(T[-1].name)
                else:
                    order.append(nm)
                if key in m.accum:
                    role = "zero" if pi == 0 and self.keeps_rows(li) else "accum"
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_acc"), "int32_t", p.data.size, role, li, m.accum[key]))
                    order.append(T[-1].name)
                if key in m.velocity:
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_vel"), CTYPE[m.velocity[key].dtype], p.data.size, "velocity", li, m.velocity[key]))
                    order.append(T[-1].name)
                if key in m.masks:  # pruning: the bitmap of the pruned elements (tt_prune.h)
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_mask"), "uint32_t", m.masks[key].size, "mask", li, m.masks[key]))
                    order.append(T[-1].name)
        T.append(Tensor(self.sym("meta"), "uint32_t", 3, "meta", -1, m.meta.astype(np.uint32)))
        order.append(self.sym("meta"))
        if m.loss_scale.enabled:  # [E, clean steps, overflow steps] (graph/loss_scale.py)
            T.append(Tensor(self.sym("scaler"), "int32_t", 3, "meta", -1, m.scaler.astype(np.int32)))
            order.append(self.sym("scaler"))
        if self.a16:  # the int8 input widened to int16 (tt_widen_s8_s16), kept for layer 0's gradient
            T.append(Tensor(self.sym("xin"), "int16_t", int(np.prod(m.input_shape)), "activation", -1))
        for li, l in enumerate(m.layers):
            T.append(Tensor(self.sym(f"a{li}"), self.act_ctype, l.out_size, "activation", li))
            backward = li >= self.first_backward
            for name, shape, dtype, role in optable.buffers(l, backward, target="c"):
                T.append(Tensor(self.names.buf(li, name), CTYPE[np.dtype(dtype)], int(np.prod(shape)), role, li))
        for li, l in enumerate(m.layers):
            if self.keeps(li) or self.keeps_rows(li):  # the error a waiting weight accumulate reads at the end of the step
                T.append(Tensor(self.sym(f"l{li}_ekeep"), "int8_t", l.units, "error", li))
        emax = max(l.out_size for l in m.layers)
        T.append(Tensor(self.sym("err0"), self.act_ctype, emax, "error"))
        T.append(Tensor(self.sym("err1"), self.act_ctype, emax, "error"))
        gmax = [0] * self.n_ge
        for li, l in enumerate(m.layers):
            if not m.layer_learns(li):
                continue
            if self.fused(li):
                continue
            if self.by_channel(li):  # one channel of weights, then the biases, in grad0
                gmax[0] = max(gmax[0], self.chan_group(li) * self.chan_size(li), l.params[1].data.size)
                continue
            for pi, p in enumerate(l.params):  # a layer's grad kernel writes all its grads
                if p.trainable:
                    gmax[pi] = max(gmax[pi], self.sparse.count((li, pi)), 1)  # 1: a tensor pruned whole still passes one
        for pi, n in enumerate(gmax):
            if n:
                T.append(Tensor(self.grad_name(0, pi), "int32_t", n, "grad"))
        sw = max([int(np.prod(m.input_shape))] + [optable.scratch_words(l) for l in m.layers]
                 + [l.in_shape[0] for li, l in enumerate(m.layers) if self.keeps_rows(li)])  # 2 K int32
        T.append(Tensor(self.sym("scratch"), "int64_t", sw, "scratch"))
        S.plan(self.sparse.sparse, T, self.sym)
        self.tensors, self.state_order = T, order
        return T

    # ---------------------------------------------------------------- emission
    def emit(self) -> Emitted:
        m, P = self.model, self.prefix
        T = self.plan()
        self.decls = {}
        opt = m.opt
        headers = sorted(set().union(*(optable.headers(l) for l in m.layers))
                         | ({"tt_conv_wgrad.h"} if any(self.by_channel(li) for li in range(len(m.layers))) else set()))
        in_size = int(np.prod(m.input_shape))
        out_size = m.layers[-1].out_size
        schema = m.schema_hash()
        hdr = f"""/** {P}: generated by tinytrain.codegen for model '{m.name}' (schema 0x{schema:08x}). Do not edit. */
#ifndef {P.upper()}_H
#define {P.upper()}_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {{
#endif

#define {P.upper()}_SCHEMA_HASH 0x{schema:08x}u
#define {P.upper()}_INPUT_LEN {in_size}
#define {P.upper()}_OUTPUT_LEN {out_size}
#define {P.upper()}_N_CLASSES {m.n_classes}
#define {P.upper()}_INPUT_EXP ({m.input_exp})

/** One training step on one int8 sample; writes -log2 p(label) in Q16; returns the prediction. */
int32_t {P}_train_step(const int8_t *x, int32_t label, int32_t *loss_q16);
/** Forward pass only (eval mode); returns argmax of the output. */
int32_t {P}_predict(const int8_t *x);
/** CRC-32 over the training state in schema order (equals tinytrain's state_hash). */
uint32_t {P}_state_hash(void);
/** Bytes of the state blob (all state tensors, schema order, little-endian). */
uint32_t {P}_state_size(void);
/** Copy n bytes of the state blob from offset off; 0 on success, -1 if out of range. */
int {P}_read_state(uint32_t off, uint8_t *dst, uint32_t n);
/** Overwrite n bytes of the state blob at offset off; 0 on success, -1 if out of range. */
int {P}_write_state(uint32_t off, const uint8_t *src, uint32_t n);
/** Restore the initial state (parameters as generated, optimizer state cleared). */
void {P}_reset(void);
/** Reseed the training PRNG. */
void {P}_set_seed(uint32_t seed);
/** Number of inspectable tensors (state tensors first, then activations). */
uint32_t {P}_tensor_count(void);
/** Copy part of tensor id; *total receives its size in bytes. 0 on success, -1 bad id/range. */
int {P}_get_tensor(uint32_t id, uint32_t off, uint8_t *dst, uint32_t n, uint32_t *total);
/** Saturation events counted by the kernels since reset. */
uint32_t {P}_saturations(void);

#ifdef __cplusplus
}}
#endif

#endif /* {P.upper()}_H */
"""
        src = [f"/** {P}: generated by tinytrain.codegen for model '{m.name}'. Do not edit. */",
               f'#include "{P}.h"', '#include "tt_fixedpoint.h"',
               '#include "tt_sgd.h"', '#include "tt_loss.h"', '#include "tt_state.h"']
        if m.prune_table is not None:
            src.append('#include "tt_prune.h"')
            if any(g is not None for g in m.prune_table.groups):
                src.append('#include "tt_prune_group.h"')
        src += S.includes(self.sparse.sparse)
        src += [f'#include "{h}"' for h in headers]
        src += ["", f"#define SCRATCH {self.sym('scratch')}", f"#define STATS {self.sym('stats')}",
                f"#define CTX {self.sym('ctx')}", ""]
        src.append(f"static tt_stats STATS;")
        flash = 0
        src.append("/* ---- training state (RAM); initial values kept in flash for reset ---- */")
        for t in T:
            if t.role == "frozen":
                what = "final pruning mask" if t.name.endswith("_mask") else "frozen parameter"
                src.append(f"/** {what} of layer {t.layer} ({t.count} x {t.ctype}), in flash */")
                src.append(c_array(t.ctype, t.name, t.init, const=True))
                flash += t.bytes
            if t.role in ("param", "master", "accum", "velocity", "mask", "meta"):
                packed = f", packed: the {t.count} of {t.dense} kept" if t.mask else ""
                src.append(f"/** {t.role} of layer {t.layer} ({t.count} x {t.ctype}{packed}) */" if t.layer >= 0 else f"/** [prng state, optimizer step, samples in batch] */"
                           if t.name == self.sym("meta") else "/** loss scaler [exponent, clean steps, overflow steps] */")
                src.append(c_array(t.ctype, t.name, t.init))
                if t.role in ("param", "master", "mask", "meta"):
                    src.append(c_array(t.ctype, t.name + "_init", t.init, const=True))
                    flash += t.bytes
        src.append("")
        src.append("/* ---- activations kept for backward, error ping-pong, gradients, scratch ---- */")
        for t in T:
            if t.role in ("activation", "error", "grad", "scratch") and t.init is None:
                src.append(f"static {t.ctype} {t.name}[{t.count}];  /* {t.role} */")
        for li in range(len(m.layers)):
            if self.keeps(li):  # state 0 until the first apply: the accumulators are only known 0 after one
                src.append(f"static tt_sgd_dense_keep {self.sym(f'l{li}_keep')} = {{.e = {self.sym(f'l{li}_ekeep')}}};")
            if self.keeps_rows(li):  # the layer's weights, slots and kept error for tt_sgd_dense_rows_apply
                src.append(f"static tt_sgd_dense_rows {self.sym(f'l{li}_rows')} = {{{self._rows_fields(li)}}};")
        cos = ", ".join(str(int(v)) for v in opt.cosine)
        src.append("")
        src.append(f"static const tt_ctx CTX = {{.scratch = SCRATCH, .stats = &STATS}};")
        src.append(f"static const int32_t {self.sym('cosine')}[65] = {{{cos}}};")
        src.append(f"static const tt_sgd {self.sym('opt')} = {{\n    .m = {opt.m}, .k = {opt.k}, .mu_m = {opt.mu_m}, .mu_k = {opt.mu_k}, "
                   f".wd_m = {opt.wd_m}, .wd_k = {opt.wd_k}, .ib_m = {opt.ib_m}, .ib_k = {opt.ib_k},\n"
                   f"    .batch_size = {opt.batch_size}, .schedule = {opt.schedule}, .gamma_q15 = {opt.gamma_q15}, "
                   f".step_size = {opt.step_size}, .total_steps = {opt.total_steps}, .sr = {int(opt.sr)},\n"
                   f"    .cosine = {self.sym('cosine')}}};")
        src += self._emit_prune_tables()
        body = self._emit_step() + self._emit_predict()  # fills self.decls
        src += ["", "/* ---- layer parameters and dims ---- */", *self.decls.values()]
        src += body
        src += self._emit_state_api()
        return Emitted(hdr, "\n".join(src) + "\n", P, T, self.state_order, flash)

    def _lvars(self, backward=True):
        L = len(self.model.layers)
        names = [f"e{i}" for i in range(L + 1)]
        for li, l in enumerate(self.model.layers):
            names += optable.exp_vars(l, li, backward and li >= self.first_backward)
        return "int32_t " + ", ".join(names) + ";"

    def _emit_step(self):
        m, opt, P = self.model, self.model.opt, self.prefix
        L = len(m.layers)
        out = ["", f"int32_t {P}_train_step(const int8_t *x, int32_t label, int32_t *loss_q16)", "{",
               "    " + self._lvars(), "    int32_t ee, de, pred, " + ", ".join(f"ge{i} = 0" for i in range(self.n_ge)) + ";",
               f"    const tt_sgd_step sgd = {{.cfg = &{self.sym('opt')}, .m_t = tt_sgd_lr_mult(&{self.sym('opt')}, {self.sym('meta')}[1]), "
               f".prng = &{self.sym('meta')}[0], .stats = &STATS}};",
               "    tt_loss_out loss = {" + f".e = {{}}}};",
               f"    e0 = {m.input_exp};", *self._widen_input()]
        for li, l in enumerate(m.layers):
            out.append(f"    /* layer {li}: {l!r} {l.in_shape} -> {l.out_shape} */")
            out += ["    " + s for s in self._forward_lines(li, train=True)]
        zl = self.sym(f"a{L - 1}")
        errs = [self.sym("err0"), self.sym("err1")]
        if m.loss == "softmax_ce":
            out.append(f"    pred = tt_softmax_ce_{'s16' if self.a16 else 's8'}(&CTX, {zl}, e{L}, label, {m.output_shape[0]}, &loss);")
        else:
            raise CodegenError("MSE models are not emitted to C yet")
        out[out.index("    tt_loss_out loss = {.e = {}};")] = (f"    tt_loss{'_s16' if self.a16 else ''}_out loss = "
                                                              f"{{.e = {errs[(L - 1) % 2]}}};")
        out.append("    *loss_q16 = loss.loss_q16;")
        out += self._loss_scale_lines()
        out.append("    de = ee = loss.ee;")
        first = self.first_backward
        head = len(out)
        for li in range(L - 1, first - 1, -1):
            l = m.layers[li]
            e = errs[li % 2]
            # dx's exponent goes to ee; de (this layer's error exponent) is still needed for the
            # parameter gradients and is replaced after the update
            dx = errs[(li - 1) % 2] if li > first else None
            out.append(f"    /* backward {li}: {l!r} */")
            x, ex, y, _ = self._io(li)
            if li in self.sparse.layers:
                out += self.sparse.backward(li, x, ex, e, dx)
                if dx:
                    out.append("    de = ee;")
                continue
            if self.fused(li):
                out += self._fused_dense(li, l, x, ex, e, dx)
                out += self._prune_apply((li, 0), "    ") + self._prune_apply((li, 1), "    ")  # b: neurons
                if dx:
                    out.append("    de = ee;")
                continue
            if self.by_channel(li):
                out += self._by_channel(li, l, x, ex, y, e, dx)
                if dx:
                    out.append("    de = ee;")
                continue
            out += ["    " + s for s in optable.backward_lines(l, self.names, li, x, ex, y, e, "de", dx, "ee" if dx else None)]
            for pi, p in enumerate(l.params):
                key = (li, pi)
                if not m.learns(li, pi):
                    continue
                pn = self.sym(f"l{li}_{p.name}")
                ews = m.master_exp(key) if key in m.master else p.exp
                if self._fuses_apply(key):
                    out += self._accumulate_apply(li, pi, ews)
                elif opt.accumulate:
                    out.append(f"    tt_sgd_accumulate_s32(&sgd, {pn}_acc, {p.data.size}, {ews}, {self.grad_name(li, pi)}, ge{pi});")
                else:
                    w, t = self._update_target(li, pi)
                    out.append(f"    tt_sgd_update_direct_{t}(&sgd, {w}, {p.data.size}, {ews}, {self.grad_name(li, pi)}, ge{pi});")
                    if key in m.master:
                        out.append("    " + self._refresh(li, pi))
                out += self._prune_apply(key, "    ")
            if dx:
                out.append("    de = ee;")
        if self._zero_error_skips_backward():
            out[head:] = ([f"    if (!tt_all_zero_s8({errs[(L - 1) % 2]}, {m.output_shape[0]})) {{ /* else nothing changes */"]
                          + ["    " + s for s in out[head:]] + ["    }"])
        meta = self.sym("meta")
        out.append(f"    {meta}[2] += 1;")
        if not opt.accumulate:
            out += self._prune_step("    ")
            out.append(f"    {meta}[1] += 1;")
        else:
            out.append(f"    if ({meta}[2] == {opt.batch_size}u) {{")
            for li, l in enumerate(m.layers):
                for pi, p in enumerate(l.params):
                    key = (li, pi)
                    if key not in m.accum or self._fuses_apply(key):
                        continue
                    if key in self.sparse.sparse:
                        out += self.sparse.apply_accumulated(li, "        ")
                        continue
                    pn = self.sym(f"l{li}_{p.name}")
                    w, t = self._update_target(li, pi)
                    vel = f"{pn}_vel" if key in m.velocity else "0"
                    vw = _VEL_SUFFIX[m.velocity[key].dtype] if key in m.velocity else ""  # int16/int8 momentum
                    refresh = self._refresh(li, pi) if key in m.master else ""
                    if pi == 0 and self.keeps_rows(li):  # the waiting accumulate and the apply, row by row
                        out.append(f"        tt_sgd_dense_rows_apply(&sgd, &{self.sym(f'l{li}_rows')}, (int32_t *)SCRATCH);")
                    elif pi == 0 and self.keeps(li):  # the waiting accumulate and the apply in one pass
                        sp = self.names.decl(li, "sgd_acc", "tt_sgd_dense_accum_params", self._accum_fields(li))
                        out.append(f"        tt_sgd_dense_apply_kept_s32(&sgd, {sp}, {w}, {pn}, {vel});")
                    elif t == "s32" and not vw and refresh == f"tt_sgd_refresh_copy({pn}_master, {pn}, {p.data.size});":
                        # the apply and the copy's refresh in one pass (same bits as the two calls)
                        out.append(f"        tt_sgd_apply_accumulated_s32_copy(&sgd, {w}, {pn}, {pn}_acc, {vel}, {p.data.size});")
                    else:
                        out.append(f"        tt_sgd_apply_accumulated_{t}{vw}(&sgd, {w}, {pn}_acc, {vel}, {p.data.size});")
                        if refresh:
                            out.append("        " + refresh)
                    out += self._prune_apply(key, "        ")
            out += self._prune_step("        ")
            out.append(f"        {meta}[1] += 1;")
            out.append(f"        {meta}[2] = 0;")
            out.append("    }")
        out += ["    " + " ".join(f"(void)ge{i};" for i in range(self.n_ge)) + f" (void)de; (void)sgd; (void){errs[0]}; (void){errs[1]};",
                "    return pred;", "}"]
        return out

    def _zero_error_skips_backward(self) -> bool:
        """Whether a step whose loss error is all 0 may skip its backward: every backward layer is
        a ReLU or a Dense on the fused direct update of int16 weights and int32 biases with plain
        SGD (no stochastic rounding, decay, momentum, batching, master, mask, loss scale), where a
        zero error makes zero input errors and rows whose steps are all 0, which keep their
        parameters (tt_sgd_dense_direct_s16 skips them, drawing nothing): the backward would
        change no state. Late in training a confident classifier's error often is all 0."""
        m, opt = self.model, self.model.opt
        if (self.a16 or opt.accumulate or opt.sr or opt.wd_m or m.master or m.masks or m.loss_scale.enabled
                or self.sparse.layers or m.loss != "softmax_ce"):
            return False
        for li in range(self.first_backward, len(m.layers)):
            l = m.layers[li]
            if l.kind == "relu":
                continue
            if l.kind != "dense" or not self.fused(li) or m.blocked(li, 0) or self._update_target(li, 0)[1] != "s16":
                return False
            if len(l.params) > 1 and m.learns(li, 1) and l.params[1].data.dtype != np.int32:
                return False
        return True

    def _loss_scale_lines(self):
        """A global or static loss scale: the head's error (still in scratch) again at the
        scale's exponent; an overflow under global returns before any update (graph/loss_scale.py)."""
        m = self.model
        if not m.loss_scale.enabled:
            return []
        ls, cfg = m.loss_scale, self.sym("loss_scaler")
        self.decls[cfg] = (f"static const tt_loss_scaler {cfg} = {{.mode = {1 if ls.mode == 'global' else 2}, "
                           f".growth_factor = {ls.growth_factor}, .backoff_factor = {ls.backoff_factor}, "
                           f".growth_interval = {ls.growth_interval}, .min_scale = {ls.min_scale}, "
                           f".max_scale = {ls.max_scale}}};")
        return [f"    if (tt_loss_scale_s8(&{cfg}, {self.sym('scaler')}, SCRATCH, -15, {m.output_shape[0]}, loss.e, "
                "&loss.ee, &STATS)) return pred;  /* overflow: step skipped */"]

    def _by_channel(self, li, l, x, ex, y, e, dx):
        """A conv layer's backward with its weight gradient one output channel at a time: the
        input error (the row's bwd call, with the pre-update weights), then per channel its
        gradient and its update (or accumulation) in weight order, then the biases; the PRNG
        draws come in the order of the whole-tensor path (weights row-major, then biases)."""
        m, opt = self.model, self.model.opt
        out = ["    " + s for s in optable.backward_lines(l, self.names, li, x, ex, y, e, "de", dx, "ee" if dx else None,
                                                           grads=False)]
        fm = optable.fill(l, self.names, li, {"x": x, "ex": ex, "y": y, "ey": "", "e": e, "ee": "de",
                                              "dx": dx or "", "edx": "", "_bufprefix": ""})
        kind, params, wv, g = l.kind, fm["params"], fm["wv"], self.grad_name(li, 0)
        chan, G = self.chan_size(li), self.chan_group(li)
        rows = [(f"de + {ex}", f"tt_{kind}_grad_w_chan_s32{wv}({params}, {e}, {x}, co, nco, {g})"),
                ("de", f"tt_{kind}_grad_b_s32{wv}({params}, {e}, {g})")]
        if self.a16:  # int16 activations: the int64 sums rounded by the static gshift (tt_act16_conv.h)
            gs = fm["gshift"]
            rows = [(f"de + {ex} + {gs}", f"tt_{kind}_grad_w_chan_s32_s16({params}, {e}, {x}, {gs}, co, nco, {g})"),
                    ("de", f"tt_{kind}_grad_b_s32_s16({params}, {e}, {g})")]
        for pi, (ge, grad) in enumerate(rows):
            if not m.learns(li, pi):
                continue
            key, p = (li, pi), l.params[pi]
            ews = m.master_exp(key) if key in m.master else p.exp
            tgt, t = self._update_target(li, pi)
            if opt.accumulate:
                tgt, t = self.names.param(li, pi) + "_acc", None
            n, off = (f"nco * {chan}", f" + co * {chan}") if pi == 0 else (p.data.size, "")
            upd = (f"tt_sgd_accumulate_s32(&sgd, {tgt}{off}, {n}, {ews}, {g}, {ge});" if t is None else
                   f"tt_sgd_update_direct_{t}(&sgd, {tgt}{off}, {n}, {ews}, {g}, {ge});")
            if pi == 0:
                C = p.data.shape[0]
                out += [f"    for (int32_t co = 0; co < {C}; co += {G}) {{",
                        f"        const int32_t nco = {C} - co < {G} ? {C} - co : {G};",
                        f"        {grad};", f"        {upd}", "    }"]
            else:
                out += [f"    {grad};", f"    {upd}"]
            if key in m.master and not opt.accumulate:
                out.append("    " + self._refresh(li, pi))
            out += self._prune_apply(key, "    ")
        return out

    # ---------------------------------------------------------------- pruning (tt_prune.h)
    def _emit_prune_tables(self) -> list[str]:
        """The pruned tensors (mask, tensor, optimizer slots) and the schedule, static const."""
        m, tab = self.model, self.model.prune_table
        if tab is None or all(k in self.sparse.sparse for k in tab.keys):
            return []
        rows = []
        for (li, pi), shift in zip(tab.keys, tab.shifts):
            if (li, pi) in self.sparse.sparse:  # packed: nothing to re-zero (never selected: no event left)
                rows.append("    {.n = 0u},")
                continue
            p, pn = m.layers[li].params[pi], self.sym(f"l{li}_{m.layers[li].params[pi].name}")
            slot = lambda d, suffix: f"{pn}_{suffix}" if (li, pi) in d else "0"  # noqa: E731
            width = lambda d: d[(li, pi)].dtype.itemsize if (li, pi) in d else 0  # noqa: E731
            rows.append(f"    {{.mask = {pn}_mask, .n = {p.data.size}u, .w = {pn}, .w_bytes = {p.data.dtype.itemsize}u, "
                        f".master = {slot(m.master, 'master')}, .master_bytes = {width(m.master)}u, "
                        f".acc = {slot(m.accum, 'acc')}, .vel = {slot(m.velocity, 'vel')}, "
                        f".vel_bytes = {width(m.velocity)}u, .shift = {shift}u}},")
        ps = self.sym("prune")
        table = [f"/** pruned tensors, unit by unit (the schedule's columns) */",
                 f"static const tt_prune_tensor {ps}[{len(tab.keys)}] = {{", *rows, "};"]
        if self.sparse.pruned:  # the schedule has no event left: no table of it
            return table
        out = [*table, c_array("uint32_t", f"{ps}_steps", tab.steps, const=True)]
        n_el = sum(not tab.structured(u) for u in range(len(tab.units)))  # the structured units come last
        if n_el:
            starts = [a for a, _ in tab.units[:n_el]] + [tab.units[n_el - 1][1]]
            out += [c_array("int32_t", f"{ps}_zeros", tab.zeros[:, :n_el], const=True),
                    c_array("uint32_t", f"{ps}_units", np.array(starts), const=True),
                    f"/** pruning events: optimizer step, zeros per unit (-1: none) */",
                    f"static const tt_prune_schedule {ps}_schedule = {{.steps = {ps}_steps, .zeros = {ps}_zeros, "
                    f".unit_start = {ps}_units, .rows = {tab.steps.size}u, .units = {n_el}u}};"]
        return out + self._emit_prune_groups(n_el)

    def _emit_prune_groups(self, n_el) -> list[str]:
        """Structured units (tt_prune_group.h): their schedule columns and each tensor's units,
        indexed from the first structured tensor of the table."""
        tab, ps = self.model.prune_table, self.sym("prune")
        if n_el == len(tab.units):
            return []
        e = tab.units[n_el][0]
        rows = []
        for u in range(n_el, len(tab.units)):
            a, b = tab.units[u]
            rows += [f"    {{.units = {g[0]}u, .inner = {g[1]}u, .lead = {g[2] - a}u, .mult = {g[3]}u, .row = {g[4]}u}},  /* L{tab.keys[j][0]} "
                     f"{self.model.layers[tab.keys[j][0]].params[tab.keys[j][1]].name} */"
                     for j, g in zip(range(a, b), tab.groups[a:b])]
        starts = [a - e for a, _ in tab.units[n_el:]] + [len(tab.keys) - e]
        return [f"/** structured pruning: the units of each tensor (tt_prune_group.h) */",
                f"static const tt_prune_group {ps}_groups[{len(tab.keys) - e}] = {{", *rows, "};",
                c_array("int32_t", f"{ps}_gzeros", tab.zeros[:, n_el:], const=True),
                c_array("uint32_t", f"{ps}_gunits", np.array(starts), const=True),
                f"/** structured pruning events: optimizer step, units to prune per unit of the schedule (-1: none) */",
                f"static const tt_prune_schedule {ps}_gschedule = {{.steps = {ps}_steps, .zeros = {ps}_gzeros, "
                f".unit_start = {ps}_gunits, .rows = {tab.steps.size}u, .units = {len(tab.units) - n_el}u}};"]

    def _prune_apply(self, key, ind) -> list[str]:
        """After every optimizer touch of a pruned tensor: its pruned elements back to zero."""
        tab = self.model.prune_table
        if tab is None or key not in tab.keys or key in self.sparse.sparse:
            return []
        return [f"{ind}tt_prune_apply(&{self.sym('prune')}[{tab.keys.index(key)}]);"]

    def _prune_step(self, ind) -> list[str]:
        """Before the step counter moves past update t: that step's pruning event, if any."""
        if self.model.prune_table is None or self.sparse.pruned:  # packed: no event is left
            return []
        ps, tab = self.sym("prune"), self.model.prune_table
        n_el = sum(not tab.structured(u) for u in range(len(tab.units)))
        out = [f"{ind}tt_prune_step(&{ps}_schedule, {ps}, {self.sym('meta')}[1]);"] if n_el else []
        if n_el < len(tab.units):
            out.append(f"{ind}tt_prune_group_step(&{ps}_gschedule, &{ps}[{tab.units[n_el][0]}], {ps}_groups, "
                       f"{self.sym('meta')}[1]);")
        return out

    def _emit_write_state(self, st) -> list[str]:
        """write_state: the blob holds a master copy, not its compute copy (the state hash covers
        the master), so after a write every compute copy is narrowed again from its master, as
        Sequential does after any change of a master (fedavg.set_store, the optimizer). A board
        loaded with LOAD_PARAMS or a FedProx pull then computes with the weights it was given."""
        P, m = self.prefix, self.model
        refresh = ["        " + self._refresh(li, pi) for li, pi in sorted(m.master)]
        # a written state may hold accumulators that are not 0: no weight accumulate waits until an apply
        unknown = [f"    {self.sym(f'l{li}_keep')}.state = 0;" for li in range(len(m.layers)) if self.keeps(li)]
        if not refresh and not unknown:
            return [f"int {P}_write_state(uint32_t off, const uint8_t *src, uint32_t n) {{ return tt_state_write(&{st}, off, src, n); }}"]
        return [f"int {P}_write_state(uint32_t off, const uint8_t *src, uint32_t n)", "{",
                f"    const int r = tt_state_write(&{st}, off, src, n);", *unknown,
                *(["    if (r == 0) {  /* the compute copies follow their masters */", *refresh, "    }"] if refresh else []),
                "    return r;", "}"]

    def _fuses_apply(self, key) -> bool:
        """Parameters whose per-sample accumulate and end-of-batch apply are one call at their
        backward (tt_sgd_accumulate_apply): batch size 1 without stochastic rounding (no draw
        whose order the move would change), an int32 velocity, no pruning mask, not a per-channel
        conv update. Nothing later in the step reads the tensor, so the result is the same."""
        m, opt = self.model, self.model.opt
        return (opt.accumulate and opt.batch_size == 1 and not opt.sr and key in m.accum and not m.masks and not self.a16
                and m.velocity.get(key, np.zeros(0, np.int32)).dtype == np.int32 and not self.by_channel(key[0])
                and self._update_target(*key)[1] in ("s16", "s32"))

    def _accumulate_apply(self, li, pi, ews, g=None, ge=None) -> list[str]:
        m, key = self.model, (li, pi)
        pn, (w, t) = self.sym(f"l{li}_{m.layers[li].params[pi].name}"), self._update_target(li, pi)
        vel = f"{pn}_vel" if key in m.velocity else "0"
        n, g, ge = m.layers[li].params[pi].data.size, g or self.grad_name(li, pi), ge or f"ge{pi}"
        refresh = self._refresh(li, pi) if key in m.master else ""
        copy = "0"
        if t == "s32" and refresh.startswith("tt_sgd_refresh_copy("):
            copy, refresh = self.names.param(li, pi), ""
        args = f"{w}, {copy}, " if t == "s32" else f"{w}, "
        out = [f"    tt_sgd_accumulate_apply_{t}(&sgd, {args}{pn}_acc, {vel}, {n}, {ews}, {g}, {ge});"]
        return out + (["    " + refresh] if refresh else [])

    def _update_target(self, li, pi):
        """(tensor, s8|s16|s32) an update of parameter pi of layer li writes: its master copy
        when it has one, else the parameter itself."""
        p, pn = self.model.layers[li].params[pi], self.sym(f"l{li}_{self.model.layers[li].params[pi].name}")
        if (li, pi) in self.model.master:
            return pn + "_master", STORE_TAG[self.model.master[(li, pi)].dtype]
        return pn, STORE_TAG[p.data.dtype]

    def _refresh(self, li, pi, rows_of=None) -> str:
        """The call narrowing the master of parameter pi of layer li into its compute copy
        (block exponents: only the rows whose error in ``rows_of`` is nonzero, the rows a direct
        update without weight decay changed)."""
        m = self.model
        p, pn = m.layers[li].params[pi], self.names.param(li, pi)
        if m.blocked(li, pi):  # q and the blocks' shifts from the int16 master (tt_dense_wblk.h)
            from tinytrain.graph.wblock import shifts_of

            l = m.layers[li]
            sn = self.names.param(li, next(j for j, q in enumerate(l.params) if q is shifts_of(l, p.name)))
            N, K = p.data.shape
            wv = "w4" if m.param_policy(li, pi).weights == "int4" else "w8"
            if rows_of is not None:
                return f"tt_wblock_refresh_rows_s16_{wv}({pn}_master, {pn}, {sn}, {N}, {K}, {m._block_len(li, pi)}, {rows_of});"
            return f"tt_wblock_refresh_s16_{wv}({pn}_master, {pn}, {sn}, {N}, {K}, {m._block_len(li, pi)});"
        kind = (m.master[(li, pi)].dtype, p.data.dtype, m.master_shift[(li, pi)])
        fn = REFRESH.get(kind)
        if fn is None:
            raise CodegenError(f"layer {li} ({m.layers[li].kind}): no C kernel narrows a {kind[0]} master into "
                               f"{kind[1]} {p.name}: use another precision policy")
        return f"{fn}({pn}_master, {pn}, {self.sparse.count((li, pi))});"

    def _io(self, li):
        """(input, its exponent, output, its exponent) of layer li in the generated step."""
        x = self.sym("xin") if self.a16 else "x"
        return x if li == 0 else self.sym(f"a{li - 1}"), f"e{li}", self.sym(f"a{li}"), f"e{li + 1}"

    def _widen_input(self) -> list[str]:
        """int16 activations: the step's int8 input widened at its exponent into xin."""
        return [f"    tt_widen_s8_s16(x, {int(np.prod(self.model.input_shape))}, {self.sym('xin')});"] if self.a16 else []

    def _dense_a16(self, li, l, x, e, dx):
        """Dense with int16 activations and errors: its input error (the row's bwd), then each
        learning tensor's update (direct) or accumulation, one weight row at a time: the row's
        gradient e[n] x (int32, |.| < 2^30) formed in the scratch (free after the input error)
        and passed to the SGD kernels, in the reference's order (weights row-major, then the
        bias from e widened to int32). A row with e[n] == 0 is skipped where it changes nothing
        and draws nothing (no stochastic rounding; in direct mode no weight decay)."""
        m, opt = self.model, self.model.opt
        K, N = l.in_shape[0], l.units
        out = []
        if dx:
            out += ["    " + s for s in optable.backward_lines(l, self.names, li, x, f"e{li}", self.sym(f"a{li}"), e, "de", dx, "ee",
                                                               grads=False)]
        g = "(int32_t *)SCRATCH"
        for pi, p in enumerate(l.params[:2]):
            key = (li, pi)
            if not m.learns(li, pi):
                continue
            ews = m.master_exp(key) if key in m.master else p.exp
            if opt.accumulate:
                upd = lambda off, n, ge: f"tt_sgd_accumulate_s32(&sgd, {self.names.param(li, pi)}_acc{off}, {n}, {ews}, {g}, {ge});"
            else:
                w, t = self._update_target(li, pi)
                upd = lambda off, n, ge, w=w, t=t: f"tt_sgd_update_direct_{t}(&sgd, {w}{off}, {n}, {ews}, {g}, {ge});"
            if pi == 0:
                skip = not opt.sr and (opt.accumulate or not opt.wd_m)
                rows = [f"    for (int32_t n = 0; n < {N}; n++) {{",
                        *([f"        if ({e}[n] == 0) continue;"] if skip else []),
                        f"        tt_dense_grad_row_s32_s16({x}, {K}, {e}[n], {g});",
                        f"        {upd(f' + n * {K}', K, f'de + e{li}')}", "    }"]
                if not opt.accumulate and not opt.sr and not opt.wd_m and key not in m.master:
                    # the fused kernel where its shift allows (it says so), else the rows above
                    sp = self.names.decl(li, "sgd", "tt_sgd_dense_s16_params",
                                         {"K": K, "N": N, "w": self.names.param(li, 0), "ew": ews, "b": 0, "eb": 0})
                    rows = [f"    if (!tt_dense_update_direct_s16_a16(&sgd, {sp}, {e}, de, {x}, e{li})) {{",
                            *["    " + r for r in rows], "    }"]
                out += rows
            else:
                out += [f"    tt_widen_s16_s32({e}, {N}, {g});", f"    {upd('', N, 'de')}"]
            if key in m.master and not opt.accumulate:
                out.append("    " + self._refresh(li, pi))
        return out

    def _fused_dense(self, li, l, x, ex, e, dx):
        """Dense in direct mode: its input error (the op table's bwd call), then one fused
        kernel forming and applying the weight and bias updates (no gradient buffer)."""
        m = self.model
        if self.a16:
            return self._dense_a16(li, l, x, e, dx)
        out = []
        K, N = l.in_shape[0], l.units
        if dx:
            out += ["    " + s for s in optable.backward_lines(l, self.names, li, x, ex, self.sym(f"a{li}"), e, "de", dx, "ee",
                                                               grads=False)]
        w, b = l.params[:2]
        uw, ub = bool(m.trainable[li][0]), bool(m.trainable[li][1])
        pw, t = self._update_target(li, 0)
        ews = m.master_exp((li, 0)) if (li, 0) in m.master else w.exp
        if m.opt.accumulate and not self._fuses_dense_acc(li):  # per sample: the accumulate only
            fields = self._accum_fields(li)
            if self.keeps_rows(li):  # the weights' accumulate waits for the end of the step
                out.append(f"    tt_sgd_dense_rows_keep(&{self.sym(f'l{li}_rows')}, {e}, de, {x}, {ex});")
            if fields["wa"] or fields["ba"]:
                sp = self.names.decl(li, "sgd_acc", "tt_sgd_dense_accum_params", fields)
                out.append(f"    tt_sgd_dense_accumulate_s32(&sgd, {sp}, {e}, de, {x}, {ex});")
            if self._bias_apply_after(li):  # the bias's gradient e (exponent de) in the scratch
                out.append(f"    tt_widen_s8_s32({e}, {N}, (int32_t *)SCRATCH);")
                out += self._accumulate_apply(li, 1, m.master_exp((li, 1)) if (li, 1) in m.master else b.exp,
                                              g="(int32_t *)SCRATCH", ge="de")
            return out
        # an int16 bias (policy "bias": "int16"): the fused kernels hold an int32 one, so it is NULL
        # there and updated after the weights (the reference's order) as an int16 store: direct,
        # tt_sgd_dense_bias_s16; with momentum, from its gradient e widened into the scratch (free
        # after the input error). No gradient buffer either way
        b16 = ub and b.data.dtype == np.int16
        bn = self.names.param(li, 1) if ub and not b16 else 0
        g16 = [f"    tt_widen_s8_s32({e}, {N}, (int32_t *)SCRATCH);"] if b16 else []
        if m.opt.accumulate:  # momentum at batch 1: accumulate and apply at the backward (_fuses_apply)
            def slot(pi, d, suffix):  # a learning tensor's accumulator / velocity, else NULL
                return f"{self.names.param(li, pi)}_{suffix}" if (li, pi) in d and m.learns(li, pi) and not (pi and b16) else 0

            fields = {"K": K, "N": N, "w": pw if uw else 0, "ew": ews, "wa": slot(0, m.accum, "acc"),
                      "wv": slot(0, m.velocity, "vel"), "b": bn, "eb": b.exp,
                      "ba": slot(1, m.accum, "acc"), "bv": slot(1, m.velocity, "vel")}
            if t == "s32":
                fields["copy"] = self.names.param(li, 0) if uw else 0
            sp = self.names.decl(li, "sgd", f"tt_sgd_dense_acc_{t}_params", fields)
            out.append(f"    tt_sgd_dense_accumulate_apply_{t}(&sgd, {sp}, {e}, de, {x}, {ex});")
            if b16:
                pb = self.names.param(li, 1)
                out += g16 + [f"    tt_sgd_accumulate_apply_s16(&sgd, {pb}, {pb}_acc, {pb + '_vel' if (li, 1) in m.velocity else 0}, "
                              f"{N}, {b.exp}, (int32_t *)SCRATCH, de);"]
            return out
        # a frozen tensor is NULL (frozen weights are const, in flash)
        fields = {"K": K, "N": N, "w": pw if uw else 0, "ew": ews, "b": bn, "eb": b.exp}
        if t == "s8" and uw and m.opt.sr:  # a row of zero steps draws its K numbers at once
            fields["jump"] = self.prng_jump(K)
        refresh = (li, 0) in m.master and uw
        if refresh and self._refresh(li, 0).startswith("tt_sgd_refresh_copy("):
            fields["copy"], refresh = self.names.param(li, 0), False  # the update narrows into the copy itself
        sp = self.names.decl(li, "sgd", f"tt_sgd_dense_{t}_params", fields)
        out.append(f"    tt_sgd_dense_direct_{t}(&sgd, {sp}, {e}, de, {x}, {ex});")
        if refresh:
            out.append("    " + self._refresh(li, 0, rows_of=e if m.blocked(li, 0) and not m.opt.wd_m else None))
        if b16:
            out.append(f"    tt_sgd_dense_bias_s16(&sgd, {self.names.param(li, 1)}, {b.exp}, {e}, de, {N});")
        return out

    def _forward_lines(self, li, train):
        if li in self.sparse.layers:
            return self.sparse.forward(li, *self._io(li))
        return optable.forward_lines(self.model.layers[li], self.names, li, *self._io(li), train=train)

    def _emit_predict(self):
        m, P = self.model, self.prefix
        L = len(m.layers)
        out = ["", f"int32_t {P}_predict(const int8_t *x)", "{", "    " + self._lvars(backward=False), f"    e0 = {m.input_exp};",
               *self._widen_input()]
        for li, l in enumerate(m.layers):
            out += ["    " + s for s in self._forward_lines(li, train=False)]
        out.append(f"    (void)e{L};")
        out += [f"    return tt_argmax_{'s16' if self.a16 else 's8'}({self.sym(f'a{L - 1}')}, {m.layers[-1].out_size});", "}"]
        return out

    def _emit_state_api(self):
        """The model's tables for the runtime's tt_state.h and one-line wrappers around it."""
        P = self.prefix
        byname = {t.name: t for t in self.tensors}
        state = [byname[n] for n in self.state_order]
        inspect = state + [t for t in self.tensors if t.role == "activation"]
        resettable = [t for t in self.tensors if t.role in ("param", "master", "mask", "meta")]
        zeroed = [t for t in self.tensors if t.role in ("accum", "velocity")]
        st, ts, rs = self.sym("state"), self.sym("tensors"), self.sym("resets")

        def span(t):
            ro = int(t.role == "frozen")  # in flash: a write must leave it unchanged
            if t.mask:  # stored sparse: its dense view (tt_state.h)
                return S.span(t)
            if t.role == "zero":  # no storage: reads as zeros, a write must give zeros (tt_state.h)
                return f"    {{0, {t.count * 4}u, 0, 0, 0u, 0u, 0u, 0, 0u, 0u}},"
            sym = 0 if ro else S.SYM_BYTES.get(t.ctype, 0)  # int8/int16: a write must not give -128/-32768
            return f"    {{{'(void *)' if ro else ''}{t.name}, sizeof({t.name}), {ro}, 0, 0u, 0u, 0u, 0, 0u, {sym}u}},"

        out = ["", "/* ---- the state blob (schema order), the inspectable tensors, what reset restores ---- */",
               f"static const tt_span {st}_spans[{len(state)}] = {{", *map(span, state), "};",
               f"static const tt_spans {st} = {{{st}_spans, {len(state)}u}};",
               f"static const tt_span {ts}_spans[{len(inspect)}] = {{", *map(span, inspect), "};",
               f"static const tt_spans {ts} = {{{ts}_spans, {len(inspect)}u}};",
               f"static const tt_init {rs}[{len(resettable) + len(zeroed)}] = {{",
               *[f"    {{{t.name}, {t.name}_init, sizeof({t.name})}}," for t in resettable],
               *[f"    {{{t.name}, 0, sizeof({t.name})}}," for t in zeroed], "};", "",
               f"uint32_t {P}_state_hash(void) {{ return tt_state_hash(&{st}); }}",
               f"uint32_t {P}_state_size(void) {{ return tt_state_size(&{st}); }}",
               f"int {P}_read_state(uint32_t off, uint8_t *dst, uint32_t n) {{ return tt_state_read(&{st}, off, dst, n); }}",
               *self._emit_write_state(st),
               f"void {P}_reset(void) {{ tt_state_reset({rs}, {len(resettable) + len(zeroed)}u); STATS.saturated = 0; }}",
               f"void {P}_set_seed(uint32_t seed) {{ {self.sym('meta')}[0] = tt_prng_seed(seed); }}",
               f"uint32_t {P}_tensor_count(void) {{ return {len(inspect)}u; }}",
               f"int {P}_get_tensor(uint32_t id, uint32_t off, uint8_t *dst, uint32_t n, uint32_t *total)",
               f"{{ return tt_state_get_tensor(&{ts}, id, off, dst, n, total); }}",
               f"uint32_t {P}_saturations(void) {{ return STATS.saturated; }}"]
        return out


def generate(model, prefix: str = "tt_model", storage: str | None = None) -> Emitted:
    """Emit C for ``model`` with its current training state as the initial state. ``storage``:
    how pruned layers are stored (tinytrain.codegen.sparse: "auto", "dense", "sparse"; None:
    the prune object's ``storage``, else "auto"). A state outside the symmetric int8/int16
    range (graph/state.py outside_symmetric) is refused: the C would train it differently."""
    bad = outside_symmetric(model)
    if bad is not None:
        raise CodegenError(f"{symmetric_error(bad)}: the C would not train it as the reference does; "
                           "clamp it to the symmetric range (np.clip) before generating code")
    return Emitter(model, prefix, storage).emit()
