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

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tinytrain.graph.optim import MASTER_EXTRA_BITS
from tinytrain.ops import avgpool as r_avg

CTYPE = {np.dtype(np.int8): "int8_t", np.dtype(np.int16): "int16_t", np.dtype(np.int32): "int32_t",
         np.dtype(np.uint32): "uint32_t"}


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
    role: str  # param | master | accum | velocity | activation | error | grad | scratch | meta
    layer: int = -1
    init: np.ndarray | None = None

    @property
    def bytes(self) -> int:
        return self.count * {"int8_t": 1, "int16_t": 2, "int32_t": 4, "uint32_t": 4, "int64_t": 8}[self.ctype]


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


class _C:
    """Names of one layer's buffers inside the generated step function."""

    def __init__(self, em, li):
        self.em, self.li = em, li
        l = em.model.layers[li]
        self.layer = l
        self.x = "x" if li == 0 else em.sym(f"a{li - 1}")
        self.ex = f"e{li}"
        self.y = em.sym(f"a{li}")
        self.ey = f"e{li + 1}"
        self.e = self.ee = self.dx = self.edx = None

    def p(self, j):
        return self.em.sym(f"l{self.li}_{self.layer.params[j].name}")

    def pe(self, j):
        return str(self.layer.params[j].exp)

    def g(self, j):
        return self.em.grad_name(self.li, j)

    @property
    def grads(self) -> bool:
        """Whether the layer learns: the shared gradient buffers are sized for the layers that
        do, so a frozen layer's backward must not run its gradient kernel."""
        return self.em.model.layer_learns(self.li)

    def saved(self):
        return self.em.sym(f"l{self.li}_saved")

    def geo(self, j):
        return f"ge{j}"

    def decl(self, tag, ctype, **fields):
        """``&name`` of this layer's ``static const ctype`` params struct (see Emitter.decl)."""
        return self.em.decl(f"l{self.li}_{tag}", ctype, fields)


def _dense_params(l, c):
    return c.decl("dense", "tt_dense_params", K=l.in_shape[0], N=l.units, w=c.p(0), ew=c.pe(0), b=c.p(1), eb=c.pe(1))


def _dense_fwd(l, c):
    return [f"{c.ey} = tt_dense_fwd_s8(&CTX, {_dense_params(l, c)}, {c.x}, {c.ex}, {c.y});"]


def _dense_bwd(l, c):
    out = []
    if c.dx:
        out.append(f"{c.edx} = tt_dense_bwd_s8(&CTX, {_dense_params(l, c)}, {c.e}, {c.ee}, {c.dx});")
    if c.grads:
        out.append(f"tt_dense_grad_s32({_dense_params(l, c)}, {c.e}, {c.x}, {c.g(0)}, {c.g(1)});")
        out.append(f"{c.geo(0)} = {c.ee} + {c.ex};")
        out.append(f"{c.geo(1)} = {c.ee};")
    return out


def _relu_fwd(l, c):
    return [f"{c.ey} = tt_relu_fwd_s8({c.x}, {c.ex}, {l.in_size}, {c.y}, &STATS);"]


def _relu_bwd(l, c):
    return [f"{c.edx} = tt_relu_bwd_s8({c.e}, {c.ee}, {c.y}, {l.in_size}, {c.dx}, &STATS);"] if c.dx else []


def _flatten_fwd(l, c):
    return [f"{c.ey} = tt_flatten_fwd_s8({c.x}, {c.ex}, {l.in_size}, {c.y}, &STATS);"]


def _flatten_bwd(l, c):
    return [f"{c.edx} = tt_flatten_bwd_s8({c.e}, {c.ee}, {l.in_size}, {c.dx}, &STATS);"] if c.dx else []


def _conv_params(l, c):
    """The layer's tt_conv_params (conv2d, depthwise: Cout = Cin) or tt_conv1d_params."""
    tensors = dict(w=c.p(0), ew=c.pe(0), b=c.p(1), eb=c.pe(1))
    if l.kind == "conv1d":
        (L, C), (OL, F) = l.in_shape, l.out_shape
        return c.decl("conv", "tt_conv1d_params", L=L, Cin=C, Cout=F, k=l.kernel, stride=l.stride, pad=l.pad[0],
                      Lo=OL, **tensors)
    (H, W, C), (OH, OW, F) = l.in_shape, l.out_shape
    return c.decl("conv", "tt_conv_params", H=H, W=W, Cin=C, Cout=F, kh=l.kernel[0], kw=l.kernel[1],
                  stride_h=l.stride[0], stride_w=l.stride[1], pad_h=l.pad[0], pad_w=l.pad[2], Ho=OH, Wo=OW, **tensors)


def _conv_fwd(name):
    def f(l, c):
        return [f"{c.ey} = tt_{name}_fwd_s8(&CTX, {_conv_params(l, c)}, {c.x}, {c.ex}, {c.y});"]
    return f


def _conv_bwd(name):
    def f(l, c):
        out = []
        if c.dx:
            out.append(f"{c.edx} = tt_{name}_bwd_s8(&CTX, {_conv_params(l, c)}, {c.e}, {c.ee}, {c.dx});")
        if c.grads:
            out.append(f"tt_{name}_grad_s32({_conv_params(l, c)}, {c.e}, {c.x}, {c.g(0)}, {c.g(1)});")
            out += [f"{c.geo(0)} = {c.ee} + {c.ex};", f"{c.geo(1)} = {c.ee};"]
        return out
    return f


def _pool_params(l, c, recip=None):
    """The layer's tt_pool_params / tt_pool1d_params; recip: AvgPool's (mult, shift)."""
    rq = dict(zip(("mult", "shift"), recip)) if recip else {}
    if l.kind.endswith("1d"):
        L, C = l.in_shape
        return c.decl("pool", "tt_pool1d_params", L=L, C=C, k=l.kernel, stride=l.stride, **rq)
    H, W, C = l.in_shape
    return c.decl("pool", "tt_pool_params", H=H, W=W, C=C, kh=l.kernel[0], kw=l.kernel[1],
                  stride_h=l.stride[0], stride_w=l.stride[1], **rq)


def _maxpool_fwd(l, c):
    d = l.kind[-2:]
    return [f"{c.ey} = tt_maxpool{d}_fwd_s8(&CTX, {_pool_params(l, c)}, {c.x}, {c.ex}, {c.y});"]


def _maxpool_bwd(l, c):
    if not c.dx:
        return []
    d = l.kind[-2:]
    return [f"{c.edx} = tt_maxpool{d}_bwd_s8(&CTX, {_pool_params(l, c)}, {c.e}, {c.ee}, {c.x}, {c.dx});"]


def _avgpool_fwd(l, c):
    return [f"{c.ey} = tt_avgpool2d_fwd_s8(&CTX, {_pool_params(l, c, l._mk())}, {c.x}, {c.ex}, {c.y});"]


def _avgpool_bwd(l, c):
    if not c.dx:
        return []
    return [f"{c.edx} = tt_avgpool2d_bwd_s8(&CTX, {_pool_params(l, c, l._mk())}, {c.e}, {c.ee}, {c.dx});"]


def _gap_params(l, c):
    m, k = r_avg.reciprocal(l._P())
    return c.decl("pool", "tt_global_pool_params", P=l._P(), C=l.in_shape[-1], mult=m, shift=k)


def _gap_fwd(l, c):
    return [f"{c.ey} = tt_global_avgpool_fwd_s8(&CTX, {_gap_params(l, c)}, {c.x}, {c.ex}, {c.y});"]


def _gap_bwd(l, c):
    if not c.dx:
        return []
    return [f"{c.edx} = tt_global_avgpool_bwd_s8(&CTX, {_gap_params(l, c)}, {c.e}, {c.ee}, {c.dx});"]


#: kind -> (headers, forward emitter, backward emitter, extra scratch words(int64) needed)
EMITTERS = {
    "dense": (["tt_dense.h"], _dense_fwd, _dense_bwd),
    "relu": (["tt_relu.h"], _relu_fwd, _relu_bwd),
    "flatten": (["tt_flatten.h"], _flatten_fwd, _flatten_bwd),
    "conv2d": (["tt_conv.h"], _conv_fwd("conv2d"), _conv_bwd("conv2d")),
    "depthwise_conv2d": (["tt_conv.h"], _conv_fwd("depthwise"), _conv_bwd("depthwise")),
    "conv1d": (["tt_conv.h"], _conv_fwd("conv1d"), _conv_bwd("conv1d")),
    "maxpool2d": (["tt_pool.h"], _maxpool_fwd, _maxpool_bwd),
    "maxpool1d": (["tt_pool.h"], _maxpool_fwd, _maxpool_bwd),
    "avgpool2d": (["tt_pool.h"], _avgpool_fwd, _avgpool_bwd),
    "global_avgpool": (["tt_pool.h"], _gap_fwd, _gap_bwd),
    "batchnorm": (["tt_batchnorm.h"], lambda l, c: l.c_forward(c), lambda l, c: l.c_backward(c)),
    "residual": (["tt_add.h", "tt_dense.h", "tt_relu.h", "tt_flatten.h", "tt_conv.h", "tt_pool.h", "tt_batchnorm.h"],
                 lambda l, c: l.c_forward(c), lambda l, c: l.c_backward(c)),
}


def scratch_words(l) -> int:
    """int64 scratch words a layer needs (the widest of its inputs and outputs by default)."""
    return int(getattr(l, "c_scratch_words", lambda: max(l.in_size, l.out_size))())


class Emitter:
    def __init__(self, model, prefix="tt_model"):
        if not prefix.isidentifier():
            raise CodegenError(f"prefix {prefix!r} is not a valid C identifier")
        self.model, self.prefix = model, prefix
        self.decls: dict[str, str] = {}  # symbol -> its static const declaration (decl)
        for i, l in enumerate(model.layers):
            if l.kind not in EMITTERS:
                raise CodegenError(f"layer {i} ({l.kind}) has no C kernel yet: the code generator "
                                   f"supports {', '.join(sorted(EMITTERS))}")

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

    @property
    def n_ge(self) -> int:
        """Gradient exponent variables / shared gradient buffers: one per parameter index."""
        return max([4] + [len(l.params) for l in self.model.layers])

    def fused(self, li) -> bool:
        """Dense layers in direct mode update without a gradient buffer (tt_sgd_dense_direct)."""
        return self.model.layers[li].kind == "dense" and not self.model.opt.accumulate

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
        T, order = [], []
        for li, l in enumerate(m.layers):
            for pi, p in enumerate(l.params):
                key = (li, pi)
                nm = self.sym(f"l{li}_{p.name}")
                frozen = p.role != "state" and not m.learns(li, pi)
                T.append(Tensor(nm, CTYPE[p.data.dtype], p.data.size, "frozen" if frozen else "param", li, p.data))
                if key in m.master:
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_master"), "int32_t", p.data.size, "master", li, m.master[key]))
                    order.append(T[-1].name)
                else:
                    order.append(nm)
                if key in m.accum:
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_acc"), "int32_t", p.data.size, "accum", li, m.accum[key]))
                    order.append(T[-1].name)
                if key in m.velocity:
                    T.append(Tensor(self.sym(f"l{li}_{p.name}_vel"), "int32_t", p.data.size, "velocity", li, m.velocity[key]))
                    order.append(T[-1].name)
        T.append(Tensor(self.sym("meta"), "uint32_t", 3, "meta", -1, m.meta.astype(np.uint32)))
        order.append(self.sym("meta"))
        for li, l in enumerate(m.layers):
            T.append(Tensor(self.sym(f"a{li}"), "int8_t", l.out_size, "activation", li))
            backward = li >= self.first_backward
            for name, ctype, count, role in getattr(l, "c_buffers", lambda em, li, backward: [])(self, li, backward):
                T.append(Tensor(name, ctype, count, role, li))
        emax = max(l.out_size for l in m.layers)
        T.append(Tensor(self.sym("err0"), "int8_t", emax, "error"))
        T.append(Tensor(self.sym("err1"), "int8_t", emax, "error"))
        gmax = [0] * self.n_ge
        for li, l in enumerate(m.layers):
            if not m.layer_learns(li):
                continue
            if self.fused(li):
                continue
            for pi, p in enumerate(l.params):  # a layer's grad kernel writes all its grads
                if p.trainable:
                    gmax[pi] = max(gmax[pi], p.data.size)
        for pi, n in enumerate(gmax):
            if n:
                T.append(Tensor(self.grad_name(0, pi), "int32_t", n, "grad"))
        sw = max([int(np.prod(m.input_shape))] + [scratch_words(l) for l in m.layers])
        T.append(Tensor(self.sym("scratch"), "int64_t", sw, "scratch"))
        self.tensors, self.state_order = T, order
        return T

    # ---------------------------------------------------------------- emission
    def emit(self) -> Emitted:
        m, P = self.model, self.prefix
        T = self.plan()
        self.decls = {}
        opt = m.opt
        headers = sorted({h for l in m.layers for h in EMITTERS[l.kind][0]})
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
        src += [f'#include "{h}"' for h in headers]
        src += ["", f"#define SCRATCH {self.sym('scratch')}", f"#define STATS {self.sym('stats')}",
                f"#define CTX {self.sym('ctx')}", ""]
        src.append(f"static tt_stats STATS;")
        flash = 0
        src.append("/* ---- training state (RAM); initial values kept in flash for reset ---- */")
        for t in T:
            if t.role == "frozen":
                src.append(f"/** frozen parameter of layer {t.layer} ({t.count} x {t.ctype}), in flash */")
                src.append(c_array(t.ctype, t.name, t.init, const=True))
                flash += t.bytes
            if t.role in ("param", "master", "accum", "velocity", "meta"):
                src.append(f"/** {t.role} of layer {t.layer} ({t.count} x {t.ctype}) */" if t.layer >= 0 else f"/** [prng state, optimizer step, samples in batch] */")
                src.append(c_array(t.ctype, t.name, t.init))
                if t.role in ("param", "master", "meta"):
                    src.append(c_array(t.ctype, t.name + "_init", t.init, const=True))
                    flash += t.bytes
        src.append("")
        src.append("/* ---- activations kept for backward, error ping-pong, gradients, scratch ---- */")
        for t in T:
            if t.role in ("activation", "error", "grad", "scratch") and t.init is None:
                src.append(f"static {t.ctype} {t.name}[{t.count}];  /* {t.role} */")
        cos = ", ".join(str(int(v)) for v in opt.cosine)
        src.append("")
        src.append(f"static const tt_ctx CTX = {{.scratch = SCRATCH, .stats = &STATS}};")
        src.append(f"static const int32_t {self.sym('cosine')}[65] = {{{cos}}};")
        src.append(f"static const tt_sgd {self.sym('opt')} = {{\n    .m = {opt.m}, .k = {opt.k}, .mu_m = {opt.mu_m}, .mu_k = {opt.mu_k}, "
                   f".wd_m = {opt.wd_m}, .wd_k = {opt.wd_k}, .ib_m = {opt.ib_m}, .ib_k = {opt.ib_k},\n"
                   f"    .batch_size = {opt.batch_size}, .schedule = {opt.schedule}, .gamma_q15 = {opt.gamma_q15}, "
                   f".step_size = {opt.step_size}, .total_steps = {opt.total_steps}, .sr = {int(opt.sr)},\n"
                   f"    .cosine = {self.sym('cosine')}}};")
        body = self._emit_step() + self._emit_predict()  # fills self.decls
        src += ["", "/* ---- layer parameters and dims ---- */", *self.decls.values()]
        src += body
        src += self._emit_state_api()
        return Emitted(hdr, "\n".join(src) + "\n", P, T, self.state_order, flash)

    def _lvars(self, backward=True):
        L = len(self.model.layers)
        names = [f"e{i}" for i in range(L + 1)]
        for li, l in enumerate(self.model.layers):
            names += getattr(l, "c_locals", lambda li, backward: [])(li, backward and li >= self.first_backward)
        return "int32_t " + ", ".join(names) + ";"

    def _emit_step(self):
        m, opt, P = self.model, self.model.opt, self.prefix
        L = len(m.layers)
        out = ["", f"int32_t {P}_train_step(const int8_t *x, int32_t label, int32_t *loss_q16)", "{",
               "    " + self._lvars(), "    int32_t ee, de, pred, " + ", ".join(f"ge{i} = 0" for i in range(self.n_ge)) + ";",
               f"    const tt_sgd_step sgd = {{.cfg = &{self.sym('opt')}, .m_t = tt_sgd_lr_mult(&{self.sym('opt')}, {self.sym('meta')}[1]), "
               f".prng = &{self.sym('meta')}[0], .stats = &STATS}};",
               "    tt_loss_out loss = {" + f".e = {{}}}};",
               f"    e0 = {m.input_exp};"]
        for li, l in enumerate(m.layers):
            c = _C(self, li)
            out.append(f"    /* layer {li}: {l!r} {l.in_shape} -> {l.out_shape} */")
            out += ["    " + s for s in EMITTERS[l.kind][1](l, c)]
        zl = self.sym(f"a{L - 1}")
        errs = [self.sym("err0"), self.sym("err1")]
        if m.loss == "softmax_ce":
            out.append(f"    pred = tt_softmax_ce_s8(&CTX, {zl}, e{L}, label, {m.output_shape[0]}, &loss);")
        else:
            raise CodegenError("MSE models are not emitted to C yet")
        out[out.index("    tt_loss_out loss = {.e = {}};")] = f"    tt_loss_out loss = {{.e = {errs[(L - 1) % 2]}}};"
        out.append("    *loss_q16 = loss.loss_q16;")
        out.append("    de = ee = loss.ee;")
        first = self.first_backward
        for li in range(L - 1, first - 1, -1):
            l = m.layers[li]
            c = _C(self, li)
            c.e, c.ee = errs[li % 2], "de"
            if li > first:
                # dx's exponent goes to ee; de (this layer's error exponent) is still needed
                # for the parameter gradients and is replaced after the update
                c.dx, c.edx = errs[(li - 1) % 2], "ee"
            out.append(f"    /* backward {li}: {l!r} */")
            if self.fused(li):
                out += self._fused_dense(li, l, c)
                if c.dx:
                    out.append("    de = ee;")
                continue
            out += ["    " + s for s in EMITTERS[l.kind][2](l, c)]
            for pi, p in enumerate(l.params):
                key = (li, pi)
                if not m.learns(li, pi):
                    continue
                pn = self.sym(f"l{li}_{p.name}")
                ews = p.exp - MASTER_EXTRA_BITS if key in m.master else p.exp
                if opt.accumulate:
                    out.append(f"    tt_sgd_accumulate_s32(&sgd, {pn}_acc, {p.data.size}, {ews}, {c.g(pi)}, ge{pi});")
                else:
                    w, t = self._update_target(li, pi)
                    out.append(f"    tt_sgd_update_direct_{t}(&sgd, {w}, {p.data.size}, {ews}, {c.g(pi)}, ge{pi});")
                    if key in m.master:
                        out.append(f"    tt_sgd_refresh_copy({pn}_master, {pn}, {p.data.size});")
            if c.dx:
                out.append("    de = ee;")
        meta = self.sym("meta")
        out.append(f"    {meta}[2] += 1;")
        if not opt.accumulate:
            out.append(f"    {meta}[1] += 1;")
        else:
            out.append(f"    if ({meta}[2] == {opt.batch_size}u) {{")
            for li, l in enumerate(m.layers):
                for pi, p in enumerate(l.params):
                    key = (li, pi)
                    if key not in m.accum:
                        continue
                    pn = self.sym(f"l{li}_{p.name}")
                    w, t = self._update_target(li, pi)
                    vel = f"{pn}_vel" if key in m.velocity else "0"
                    out.append(f"        tt_sgd_apply_accumulated_{t}(&sgd, {w}, {pn}_acc, {vel}, {p.data.size});")
                    if key in m.master:
                        out.append(f"        tt_sgd_refresh_copy({pn}_master, {pn}, {p.data.size});")
            out.append(f"        {meta}[1] += 1;")
            out.append(f"        {meta}[2] = 0;")
            out.append("    }")
        out += ["    " + " ".join(f"(void)ge{i};" for i in range(self.n_ge)) + f" (void)de; (void)sgd; (void){errs[0]}; (void){errs[1]};",
                "    return pred;", "}"]
        return out

    def _update_target(self, li, pi):
        """(tensor, s16|s32) an update of parameter pi of layer li writes: its int32 master
        copy when it has one, else the parameter itself."""
        p, pn = self.model.layers[li].params[pi], self.sym(f"l{li}_{self.model.layers[li].params[pi].name}")
        if (li, pi) in self.model.master:
            return pn + "_master", "s32"
        return pn, "s16" if p.data.dtype == np.int16 else "s32"

    def _fused_dense(self, li, l, c):
        m = self.model
        out = []
        if c.dx:
            out.append(f"    {c.edx} = tt_dense_bwd_s8(&CTX, {_dense_params(l, c)}, {c.e}, {c.ee}, {c.dx});")
        w, b = l.params
        uw, ub = bool(m.trainable[li][0]), bool(m.trainable[li][1])
        pw, t = self._update_target(li, 0)
        ews = w.exp - MASTER_EXTRA_BITS if (li, 0) in m.master else w.exp
        # a frozen tensor is NULL (frozen weights are const, in flash)
        sp = c.decl("sgd", f"tt_sgd_dense_{t}_params", K=l.in_shape[0], N=l.units, w=pw if uw else 0, ew=ews,
                    b=c.p(1) if ub else 0, eb=b.exp)
        out.append(f"    tt_sgd_dense_direct_{t}(&sgd, {sp}, {c.e}, {c.ee}, {c.x}, {c.ex});")
        if (li, 0) in m.master and uw:
            out.append(f"    tt_sgd_refresh_copy({c.p(0)}_master, {c.p(0)}, {w.data.size});")
        return out

    def _emit_predict(self):
        m, P = self.model, self.prefix
        L = len(m.layers)
        out = ["", f"int32_t {P}_predict(const int8_t *x)", "{", "    " + self._lvars(backward=False), f"    e0 = {m.input_exp};"]
        for li, l in enumerate(m.layers):
            c = _C(self, li)
            fwd = getattr(l, "c_forward_eval", None)
            out += ["    " + s for s in (fwd(c) if fwd else EMITTERS[l.kind][1](l, c))]
        out.append(f"    (void)e{L};")
        out += [f"    return tt_argmax_s8({self.sym(f'a{L - 1}')}, {m.layers[-1].out_size});", "}"]
        return out

    def _emit_state_api(self):
        """The model's tables for the runtime's tt_state.h and one-line wrappers around it."""
        P = self.prefix
        byname = {t.name: t for t in self.tensors}
        state = [byname[n] for n in self.state_order]
        inspect = state + [t for t in self.tensors if t.role == "activation"]
        resettable = [t for t in self.tensors if t.role in ("param", "master", "meta")]
        zeroed = [t for t in self.tensors if t.role in ("accum", "velocity")]
        st, ts, rs = self.sym("state"), self.sym("tensors"), self.sym("resets")

        def span(t):
            ro = int(t.role == "frozen")  # in flash: a write must leave it unchanged
            return f"    {{{'(void *)' if ro else ''}{t.name}, sizeof({t.name}), {ro}}},"

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
               f"int {P}_write_state(uint32_t off, const uint8_t *src, uint32_t n) {{ return tt_state_write(&{st}, off, src, n); }}",
               f"void {P}_reset(void) {{ tt_state_reset({rs}, {len(resettable) + len(zeroed)}u); STATS.saturated = 0; }}",
               f"void {P}_set_seed(uint32_t seed) {{ {self.sym('meta')}[0] = tt_prng_seed(seed); }}",
               f"uint32_t {P}_tensor_count(void) {{ return {len(inspect)}u; }}",
               f"int {P}_get_tensor(uint32_t id, uint32_t off, uint8_t *dst, uint32_t n, uint32_t *total)",
               f"{{ return tt_state_get_tensor(&{ts}, id, off, dst, n, total); }}",
               f"uint32_t {P}_saturations(void) {{ return STATS.saturated; }}"]
        return out


def generate(model, prefix: str = "tt_model") -> Emitted:
    """Emit C for ``model`` with its current training state as the initial state."""
    return Emitter(model, prefix).emit()
