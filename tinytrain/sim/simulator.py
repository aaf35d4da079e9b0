"""The fast host simulator: the whole training loop of a model compiled by numba.

From a Sequential model this module generates the source of two numba functions,
``train_run`` (forward, loss, backward and update for a range of samples, no Python in the
loop) and ``predict_run``, specialised with the model's shapes and constants. The source is
written to the cache directory and imported, so numba's on-disk cache applies across runs.
It computes exactly what ``Sequential.ref_train_step`` computes (tests/test_sim.py).
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np

from tinytrain.graph import optable
from tinytrain.graph.optable import Names
from tinytrain.graph.optim import V8_SHIFT, sat_range


def _kernels_fingerprint() -> str:
    """Hash of the kernel sources the generated code calls. numba's on-disk cache of a function
    does not notice changes in the functions it calls from other files, so the generated module
    (and with it its cache entry) is keyed by this fingerprint too."""
    h = hashlib.sha256()
    pkg = Path(__file__).resolve().parent.parent
    for p in sorted((pkg / "kernels").glob("*.py")) + [pkg / "fixedpoint.py"]:
        h.update(p.name.encode() + p.read_bytes())
    return h.hexdigest()[:16]


def _cache_dir() -> Path:
    d = Path(os.environ.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain")) / "sim"
    d.mkdir(parents=True, exist_ok=True)
    return d


class _NbNames(Names):
    """The numba spelling of a model's buffers: tuples of arrays indexed by position."""

    target, stats = "nb", "stats"

    def __init__(self, model, pidx, gidx, bidx):
        self.model, self.pidx, self.gidx, self.bidx = model, pidx, gidx, bidx

    def param(self, li, pi):
        return f"P[{self.pidx[li][pi]}]"

    def grad(self, li, pi):  # a learning layer's frozen parameters get their gradient in GD
        return f"G[{self.gidx[(li, pi)]}]" if (li, pi) in self.gidx else f"GD[{self.pidx[li][pi]}]"

    def grad_exp(self, li, pi):
        return f"ge_{li}_{pi}"

    def buf(self, li, name):
        return f"B[{self.bidx[li][name]}]"

    def learns(self, li, pis):
        return any(self.model.learns(li, pi) for pi in pis)

    def stmt(self, s):
        return s

    def scratch(self, words):
        return "S64" if words is None else f"S64[:{words}]"


def buffer_index(model) -> list[dict]:
    """Per layer, its op-table buffers' positions in the simulator's B tuple."""
    out, n = [], 0
    for l in model.layers:
        names = [b[0] for b in optable.buffers(l)]
        out.append({name: n + j for j, name in enumerate(names)})
        n += len(names)
    return out


# The optimizer's integer constants reach the compiled loop as data (train_run's OC argument),
# not as literals: models that differ only in hyper-parameters share one compiled function
# (numba compiles per source). Only the structure is in the source: direct vs accumulated
# updates, momentum slots, master copies, the parameters' exponents and bounds.
OPT_CONSTANTS = ("lr_m", "lr_k", "schedule", "gamma_q15", "step_size", "total_steps", "sr", "wd_m", "wd_k",
                 "batch_size", "ib_m", "ib_k", "mu_m", "mu_k")


def opt_constants(opt) -> np.ndarray:
    """OPT_CONSTANTS of a compiled optimizer (IntSGD) as the int64 array train_run reads."""
    names = {"lr_m": "m", "lr_k": "k"}
    return np.array([int(getattr(opt, names.get(n, n))) for n in OPT_CONSTANTS], np.int64)


def generate_source(model) -> str:
    opt = model.opt
    L = len(model.layers)
    imports = {"import numpy as np", "from numba import njit",
               "from tinytrain.kernels.loss import softmax_ce, mse",
               "from tinytrain.kernels.optim import update_direct, accumulate, apply_accumulated, refresh_copy, lr_mult"}
    pidx, k = [], 0
    for l in model.layers:
        pidx.append(list(range(k, k + len(l.params))))
        k += len(l.params)
    keys = [(li, pi) for li, l in enumerate(model.layers) for pi in range(len(l.params))]
    train_keys = [key for key in keys if model.learns(*key)]
    gidx = {key: i for i, key in enumerate(train_keys)}
    names = _NbNames(model, pidx, gidx, buffer_index(model))
    first = model.first_learning
    prune = _PruneLines(model, pidx, gidx)
    if model.prune_table is not None:
        imports.add("from tinytrain.kernels.prune import prune_zero, prune_mags, prune_select_mags, prune_mask_from, prune_row, "
                    "prune_group_norms, prune_group_mask_from")

    def src(li):
        return "x" if li == 0 else f"A[{li - 1}]"

    def refresh(key):
        """The compute copy of a master narrowed into its parameter (shift and range as data)."""
        if model.blocked(*key):  # block exponents: q and the shifts from the master (ops/wblock.py)
            from tinytrain.graph.wblock import shifts_of
            from tinytrain.ops.wblock import limits

            l, p = model.layers[key[0]], model.layers[key[0]].params[key[1]]
            sj = next(j for j, q in enumerate(l.params) if q is shifts_of(l, p.name))
            imports.add("from tinytrain.kernels.wblock import wblock_refresh")
            qmax, smax = limits(model.param_policy(*key).weight_bits)
            return (f"wblock_refresh(MS[{gidx[key]}], P[{pidx[key[0]][key[1]]}], P[{pidx[key[0]][sj]}], "
                    f"{model._block_len(*key)}, {qmax}, {smax})")
        lo, hi = sat_range(model.layers[key[0]].params[key[1]].data.dtype)
        return (f"refresh_copy(MS[{gidx[key]}].reshape(-1), P[{pidx[key[0]][key[1]]}].reshape(-1), "
                f"{model.master_shift[key]}, {lo}, {hi})")

    def fwd(train):
        out = []
        for li, l in enumerate(model.layers):
            imports.update(optable.imports(l))
            out += optable.forward_lines(l, names, li, src(li), f"e{li}", f"A[{li}]", f"e{li + 1}", train)
        return out

    body = ["for n in range(order.size):", "    i = order[n]", "    x = X[i]", f"    e0 = {model.input_exp}"]
    body += ["    " + s for s in fwd(True)]
    zl = f"A[{L - 1}]"
    if model.loss == "softmax_ce":
        body.append(f"    ee, loss, pred = softmax_ce({zl}, e{L}, Y[i], S64[:{model.output_shape[0]}], D[{L - 1}], stats)")
    else:
        body.append(f"    ee, loss, lexp = mse({zl}, e{L}, T[i], {model.target_exp}, S64[:{model.output_shape[0]}], D[{L - 1}], stats)")
        body.append("    pred = 0")
    body.append("    out[n, 0] = loss")
    body.append("    out[n, 1] = pred")
    if model.loss_scale.enabled:  # graph/loss_scale.py: the head's error at -SC[0]; an overflow skips
        imports.add("from tinytrain.kernels.loss import loss_scale")
        eg = "-15" if model.loss == "softmax_ce" else "lexp // 2"
        body.append(f"    ee, skip = loss_scale(S64[:{model.output_shape[0]}], {eg}, D[{L - 1}], SC, LS, stats)")
        body.append("    if skip:")
        body.append("        continue")
    body.append("    m_t = lr_mult(lr_m, schedule, gamma_q15, step_size, total_steps, cos, meta[1])")
    body.append(f"    de{L - 1} = ee")
    def fused(li) -> bool:
        """A Dense layer whose weight and bias train (no block exponents; in direct mode no master
        either): its weight update or accumulation forms the gradient from e and x itself
        (dense_update_direct, dense_accumulate: no gradient buffer), as the C's direct mode does
        (codegen/emit.py fused)."""
        l = model.layers[li]
        return (l.kind == "dense" and len(l.params) == 2
                and all((li, pi) in gidx and not model.blocked(li, pi) and (opt.accumulate or (li, pi) not in model.master)
                        for pi in (0, 1)))

    for li in range(L - 1, first - 1, -1):
        l = model.layers[li]
        dx, edx = (f"D[{li - 1}]", f"de{li - 1}") if li > first else (None, None)
        if fused(li):
            body += ["    " + s for s in optable.backward_lines(l, names, li, src(li), f"e{li}", f"A[{li}]",
                                                               f"D[{li}]", f"de{li}", dx, edx, grads=False)]
            gexp = optable.op_for(l).grad_exp
            ge = {0: gexp["w"].format(ee=f"de{li}", ex=f"e{li}"), 1: gexp["b"].format(ee=f"de{li}")}
            for pi, p in enumerate(l.params):
                key = (li, pi)
                if opt.accumulate:
                    ews = model.master_exp(key) if key in model.master else p.exp
                    acc = f"ACC[{gidx[key]}].reshape(-1)"
                    if pi == 0:
                        imports.add("from tinytrain.kernels.optim import dense_accumulate")
                        body.append(f"    dense_accumulate({acc}, D[{li}], {src(li)}, {ews}, {ge[0]}, lr_k, m_t, sr, meta, stats)")
                    else:
                        body.append(f"    accumulate({acc}, {ews}, D[{li}], {ge[1]}, lr_k, m_t, sr, meta, stats)")
                else:
                    lo, hi = sat_range(p.data.dtype)
                    if pi == 0:
                        imports.add("from tinytrain.kernels.optim import dense_update_direct")
                        body.append(f"    dense_update_direct(P[{pidx[li][0]}], D[{li}], {src(li)}, {p.exp}, {ge[0]}, "
                                    f"lr_k, m_t, sr, wd_m, wd_k, {lo}, {hi}, meta, stats)")
                    else:
                        body.append(f"    update_direct(P[{pidx[li][1]}].reshape(-1), {p.exp}, D[{li}], {ge[1]}, "
                                    f"lr_k, m_t, sr, wd_m, wd_k, {lo}, {hi}, meta, stats)")
                body += prune.zero(key, "    ")
            continue
        body += ["    " + s for s in optable.backward_lines(l, names, li, src(li), f"e{li}", f"A[{li}]",
                                                           f"D[{li}]", f"de{li}", dx, edx)]
        for pi, p in enumerate(l.params):
            key = (li, pi)
            if key not in gidx:
                continue
            g = f"G[{gidx[key]}].reshape(-1)"
            ge = names.grad_exp(li, pi)
            is_master = key in model.master
            store, ews = (f"MS[{gidx[key]}].reshape(-1)", model.master_exp(key)) if is_master else (f"P[{pidx[li][pi]}].reshape(-1)", p.exp)
            lo, hi = sat_range(model.master[key].dtype if is_master else p.data.dtype)
            if opt.accumulate:
                body.append(f"    accumulate(ACC[{gidx[key]}].reshape(-1), {ews}, {g}, {ge}, lr_k, m_t, sr, meta, stats)")
            else:
                body.append(f"    update_direct({store}, {ews}, {g}, {ge}, lr_k, m_t, sr, wd_m, wd_k, {lo}, {hi}, meta, stats)")
                if is_master:
                    body.append(f"    {refresh(key)}")
            body += prune.zero(key, "    ")
    body.append("    meta[2] += 1")
    if not opt.accumulate:
        body += prune.scheduled("    ")
        body.append("    meta[1] += 1")
    else:
        body.append("    if meta[2] == batch_size:")
        for key in sorted(train_keys):
            li, pi = key
            p = model.layers[li].params[pi]
            is_master = key in model.master
            store = f"MS[{gidx[key]}].reshape(-1)" if is_master else f"P[{pidx[li][pi]}].reshape(-1)"
            lo, hi = sat_range(model.master[key].dtype if is_master else p.data.dtype)
            vel = f"VEL[{gidx[key]}].reshape(-1)" if opt.mu_m else f"ACC[{gidx[key]}].reshape(-1)"
            vdt = model.velocity[key].dtype if key in model.velocity else np.dtype(np.int32)
            vlo, vhi = sat_range(vdt)
            vsh = V8_SHIFT if vdt == np.int8 else 0  # an int8 slot's own exponent
            body.append(f"        apply_accumulated({store}, ACC[{gidx[key]}].reshape(-1), {vel}, batch_size, ib_m, ib_k, mu_m, mu_k, wd_m, wd_k, sr, {lo}, {hi}, meta, stats, {vlo}, {vhi}, {vsh})")
            if is_master:
                body.append(f"        {refresh(key)}")
            body += prune.zero(key, "        ")
        body += prune.scheduled("        ")
        body.append("        meta[1] += 1")
        body.append("        meta[2] = 0")

    pred_body = ["for n in range(X.shape[0]):", "    x = X[n]", f"    e0 = {model.input_exp}"]
    pred_body += ["    " + s for s in fwd(False)]
    if model.loss == "softmax_ce":
        pred_body += [f"    z = A[{L - 1}]", "    best = 0", "    for j in range(1, z.size):",
                      "        if z[j] > z[best]:", "            best = j", "    preds[n] = best"]
    else:
        pred_body += [f"    outs[n, :] = A[{L - 1}]", f"    oexp[n] = e{L}"]
    src = ["# generated by tinytrain.sim.simulator -- do not edit", f"# kernels {_kernels_fingerprint()}",
           *sorted(imports), "", "",
           "@njit(cache=True)",
           "def train_run(X, Y, T, order, P, MS, ACC, VEL, G, GD, A, D, B, S64, I32, meta, stats, cos, OC, out,",
           "              PM, PST, PZ, SC, LS):",
           *[f"    {n} = OC[{j}]" for j, n in enumerate(OPT_CONSTANTS)],
           *["    " + s for s in body], "", "",
           "@njit(cache=True)",
           "def predict_run(X, P, A, B, S64, I32, stats, preds, outs, oexp):",
           *["    " + s for s in pred_body], ""]
    return "\n".join(src)


class _PruneLines:
    """The numba spelling of the pruning calls (graph/prune.py): PM the masks (in the prune
    table's order), PST its steps, PZ its zeros counts."""

    def __init__(self, model, pidx, gidx):
        self.model, self.pidx, self.gidx = model, pidx, gidx
        tab = model.prune_table
        self.j = {key: j for j, key in enumerate(tab.keys)} if tab is not None else {}

    def _slots(self, key):
        m, (li, pi), g = self.model, key, self.gidx[key]
        out = [f"P[{self.pidx[li][pi]}]"]
        out += [f"{arr}[{g}]" for arr, d in (("MS", m.master), ("ACC", m.accum), ("VEL", m.velocity)) if key in d]
        return out

    def zero(self, key, ind) -> list[str]:
        """After every optimizer touch of a pruned tensor: its pruned elements to zero in every slot."""
        if key not in self.j:
            return []
        return [f"{ind}prune_zero(PM[{self.j[key]}], {a}.reshape(-1))" for a in self._slots(key)]

    def scheduled(self, ind) -> list[str]:
        """Before the step counter moves past update t = meta[1]: that step's pruning event, each
        unit (one tensor, or the tensors a global scope ranks together) on one magnitude array."""
        if not self.j:
            return []
        m, tab = self.model, self.model.prune_table
        out = [f"{ind}prow = prune_row(PST, meta[1])", f"{ind}if prow >= 0:"]
        for u, (a, b) in enumerate(tab.units):
            if tab.structured(u):
                out += self._scheduled_units(u, ind)
                continue
            keys = tab.keys[a:b]
            sizes = [m.layers[li].params[pi].data.size for li, pi in keys]
            offs = [sum(sizes[:i]) for i in range(len(keys))]
            i2 = ind + "        "
            out += [f"{ind}    if PZ[prow, {u}] >= 0:", f"{i2}pmag = np.empty({sum(sizes)}, np.int64)"]
            for key, off, sh in zip(keys, offs, tab.shifts[a:b]):
                store = self._slots(key)[1 if key in m.master else 0]
                out.append(f"{i2}prune_mags({store}.reshape(-1), {sh}, pmag, {off})")
            out += [f"{i2}psel = np.zeros({sum(sizes)}, np.uint8)", f"{i2}prune_select_mags(pmag, PZ[prow, {u}], psel)"]
            for key, off, n in zip(keys, offs, sizes):
                out.append(f"{i2}prune_mask_from(psel, {off}, {n}, PM[{self.j[key]}])")
                out += self.zero(key, i2)
        return out

    def _scheduled_units(self, u, ind) -> list[str]:
        """A structured unit (graph/prune_groups.py): the L1 norms of the ranked tensors' units on
        one array, the k smallest selected, every tensor's mask expanded from its lead's units."""
        tab = self.model.prune_table
        a, b = tab.units[u]
        ranked = [j for j in range(a, b) if tab.groups[j][2] == j]
        offs = dict(zip(ranked, np.cumsum([0] + [tab.groups[j][0] for j in ranked]).tolist()))
        total = sum(tab.groups[j][0] for j in ranked)
        i2 = ind + "        "
        out = [f"{ind}    if PZ[prow, {u}] >= 0:", f"{i2}pmag = np.empty({total}, np.int64)"]
        for j in ranked:
            key = tab.keys[j]
            store = self._slots(key)[1 if key in self.model.master else 0]
            _, inner, _, mult, row = tab.groups[j]
            out.append(f"{i2}prune_group_norms({store}.reshape(-1), {inner}, {row}, {mult}, {tab.shifts[j]}, pmag, "
                       f"{offs[j]})")
        out += [f"{i2}psel = np.zeros({total}, np.uint8)", f"{i2}prune_select_mags(pmag, PZ[prow, {u}], psel)"]
        for j in range(a, b):
            _, inner, lead, _, row = tab.groups[j]
            n = self.model.layers[tab.keys[j][0]].params[tab.keys[j][1]].data.size
            out.append(f"{i2}prune_group_mask_from(psel, {offs[lead]}, {n}, {inner}, {row}, PM[{j}])")
            out += self.zero(tab.keys[j], i2)
        return out


def _load(src: str):
    key = hashlib.sha256(src.encode()).hexdigest()[:16]
    name = f"tt_sim_{key}"
    if name in sys.modules:
        return sys.modules[name]
    path = _cache_dir() / f"{name}.py"
    if not path.exists():
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(src)
        os.replace(tmp, path)
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


class Simulator:
    """Binds a model's arrays to its compiled training loop. The model's arrays are used in
    place, so the model object always holds the current state."""

    def __init__(self, model):
        self.model = model
        self.src = generate_source(model)
        self.mod = _load(self.src)
        m = model
        keys = [(li, pi) for li, l in enumerate(m.layers) for pi in range(len(l.params))]
        train_keys = [k for k in keys if m.learns(*k)]
        self.P = tuple(m.layers[li].params[pi].data for li, pi in keys)
        dummy32 = np.zeros(1, np.int32)
        self.MS = tuple(m.master.get(k, dummy32) for k in train_keys) or (dummy32,)
        self.ACC = tuple(m.accum.get(k, dummy32) for k in train_keys) or (dummy32,)
        self.VEL = tuple(m.velocity.get(k, dummy32) for k in train_keys) or (dummy32,)
        self.G = tuple(np.zeros(m.layers[li].params[pi].data.shape, np.int32) for li, pi in train_keys) or (dummy32,)
        self.GD = tuple(np.zeros(p.shape, np.int32) for p in self.P) or (dummy32,)  # grads of frozen params
        self.A = tuple(np.zeros(l.out_size, m.act_dtype) for l in m.layers)  # int8, or int16 (graph/act16.py)
        self.D = tuple(np.zeros(l.out_size, m.act_dtype) for l in m.layers)
        bufs = [np.zeros(shape, dt) for l in m.layers for _, shape, dt, _ in optable.buffers(l)]
        self.B = tuple(bufs) or (np.zeros(1, np.int32),)
        width = max([int(np.prod(m.input_shape))] + [l.out_size for l in m.layers] + [l.in_size for l in m.layers]
                    + [optable.scratch_words(l) for l in m.layers])
        self.S64 = np.zeros(width, np.int64)
        self.I32 = np.zeros(self.S64.size, np.int32)
        self.cos = m.opt.cosine.astype(np.int64)
        self.OC = opt_constants(m.opt)
        tab = m.prune_table  # pruning: masks (the model's, in place), steps, zeros counts
        self.PM = tuple(m.masks[k] for k in tab.keys) if tab is not None else (np.zeros(1, np.uint32),)
        self.PST = tab.steps.astype(np.int64) if tab is not None else np.zeros(0, np.int64)
        self.PZ = tab.zeros.astype(np.int64) if tab is not None else np.zeros((0, 1), np.int64)
        from tinytrain.kernels.loss import ls_constants

        self.LS = ls_constants(m.loss_scale)

    def train(self, X, Y, order, T=None):
        """Train on samples X[order] in that order. X: (n, *input_shape) int8. Returns an
        (len(order), 2) int64 array of (loss_q16, prediction)."""
        Xf = np.ascontiguousarray(X.reshape(X.shape[0], -1)).astype(self.model.act_dtype, copy=False)
        out = np.zeros((len(order), 2), np.int64)
        Yv = np.asarray(Y if Y is not None else np.zeros(len(X), np.int32), dtype=np.int32)
        Tv = np.zeros((1, 1), np.int8) if T is None else np.ascontiguousarray(T.reshape(T.shape[0], -1)).astype(np.int8)
        self.mod.train_run(Xf, Yv, Tv, np.asarray(order, np.int64), self.P, self.MS, self.ACC, self.VEL,
                           self.G, self.GD, self.A, self.D, self.B, self.S64, self.I32, self.model.meta,
                           self.model.stats, self.cos, self.OC, out, self.PM, self.PST, self.PZ,
                           self.model.scaler, self.LS)
        return out

    def predict(self, X):
        Xf = np.ascontiguousarray(X.reshape(X.shape[0], -1)).astype(self.model.act_dtype, copy=False)
        preds = np.zeros(len(X), np.int64)
        outs = np.zeros((len(X), self.model.layers[-1].out_size), self.model.act_dtype)
        oexp = np.zeros(len(X), np.int64)
        self.mod.predict_run(Xf, self.P, self.A, self.B, self.S64, self.I32, self.model.stats, preds, outs, oexp)
        return preds if self.model.loss == "softmax_ce" else (outs, oexp)
