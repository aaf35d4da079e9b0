"""Sparse storage of pruned Dense layers in the generated C (runtime: firmware tt_sparse.h).

Once a model's pruning schedule has no event left (its optimizer step is past the table's last
row: the zero pattern is fixed for good), a pruned Dense weight tensor is emitted packed: its
mask becomes a constant in flash and the weights, their int32 master, accumulator and momentum
keep only the kept elements (row-major order); the kernels skip the pruned weights in forward,
input error, gradient and update. The state blob and hash are unchanged: a packed tensor's span
is its dense view (tt_state.h), so ``verify`` compares the same bytes every step.

Which tensors (``storage``, the prune object's key, or ``generate(..., storage=)``):

* ``"auto"`` (default): every pruned tensor that can be packed, when the mask is final;
* ``"sparse"``: all of them, refused with a message naming the reason when one cannot be
  (the schedule still has events, or a tensor is not a Dense layer's int16 weights);
* ``"dense"``: none (the masks are re-applied after every update, as before).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinytrain.graph import prune as P

STORAGES = ("auto", "dense", "sparse")


@dataclass
class Packed:
    """One packed weight tensor w[N][K]: its row-major mask (the state's) and the device order,
    column by column (input k outer, output n inner: tt_sparse.h)."""

    mask: np.ndarray
    shape: tuple  # (N, K)

    @property
    def n(self) -> int:
        return int(self.shape[0] * self.shape[1])

    @property
    def kept_t(self) -> np.ndarray:
        """Kept elements in device (column-major) order."""
        return ~P.unpack(self.mask, self.n).reshape(self.shape).T.reshape(-1)

    @property
    def nnz(self) -> int:
        return int(self.kept_t.sum())

    @property
    def device_mask(self) -> np.ndarray:
        """The transposed bitmap, each column in whole words: S = ceil(N / 32) words per input k,
        bit n % 32 of word k S + n // 32 set when w[n][k] is pruned; padding bits set."""
        N, K = self.shape
        S = (N + 31) // 32
        pruned = np.ones((K, 32 * S), bool)
        pruned[:, :N] = ~self.kept_t.reshape(K, N)
        return P.pack(pruned)

    def pack(self, a) -> np.ndarray:
        """A dense slot (w, master, accumulator, momentum) in device order, the kept only."""
        return np.asarray(a).reshape(self.shape).T.reshape(-1)[self.kept_t].copy()


def final(model) -> bool:
    """No pruning event is left: the model's optimizer step is past the schedule's last row."""
    tab = model.prune_table
    return tab is not None and int(model.meta[1]) > int(tab.steps[-1])


def _why_not(model, key) -> str | None:
    """Why the pruned tensor `key` cannot be packed (None: it can)."""
    li, pi = key
    l = model.layers[li]
    tab = model.prune_table
    if tab.groups[tab.keys.index(key)] is not None:  # its bias and batch-norm slots are masked too
        return f"layer {li} ({l.kind}): structured pruning removes whole units: shrink the model instead (tinytrain shrink)"
    if l.kind != "dense" or l.params[pi].name != "w":
        return f"layer {li} ({l.kind}): sparse storage covers Dense weights only so far"
    if l.params[pi].data.dtype != np.int16:
        return f"layer {li} (dense): sparse storage needs int16 weights (a precision policy gives {l.params[pi].data.dtype})"
    if key in model.master and model.master[key].dtype != np.int32:
        return f"layer {li} (dense): sparse storage needs an int32 master (the policy gives {model.master[key].dtype})"
    v = model.velocity.get(key)
    if v is not None and v.dtype == np.int8:
        return f"layer {li} (dense): sparse storage has no kernel for int8 momentum"
    if v is not None and v.dtype == np.int16 and key in model.master:
        return f"layer {li} (dense): sparse storage has no kernel for int16 momentum with a master copy"
    return None


def _storage(model, key, storage) -> str:
    if storage is not None:
        return storage
    cfg = P.layer_prune(model.layers[key[0]]) or model.prune
    return getattr(cfg, "storage", None) or "auto"


def choose(model, storage: str | None = None, error=ValueError) -> dict:
    """(layer, param) -> Packed for the pruned tensors emitted sparse."""
    if storage is not None and storage not in STORAGES:
        raise error(f"storage = {storage!r} must be one of {', '.join(STORAGES)}")
    tab = model.prune_table
    if tab is None:
        if storage == "sparse":
            raise error("storage = \"sparse\": the model does not prune (give it a \"prune\" object)")
        return {}
    out = {}
    for key in tab.keys:
        how = _storage(model, key, storage)
        if how == "dense":
            continue
        why = None if final(model) else (f"the pruning schedule still has events (optimizer step {int(model.meta[1])}, "
                                         f"last event at step {int(tab.steps[-1])}): train past it first")
        why = why or _why_not(model, key)
        if why:
            if how == "sparse":
                raise error(f"storage = \"sparse\": {why}")
            continue
        li, pi = key
        out[key] = Packed(model.masks[key].copy(), model.layers[li].params[pi].data.shape)
    return out


def plan(sparse: dict, tensors, sym) -> None:
    """Rewrite the planned buffers of the packed tensors: nnz elements with packed initial
    values; the mask becomes a constant in flash (role "frozen": a read-only span)."""
    byname = {t.name: t for t in tensors}
    for (li, pi), pk in sparse.items():
        base = sym(f"l{li}_w")
        for suffix in ("", "_master", "_acc", "_vel"):
            t = byname.get(base + suffix)
            if t is None:
                continue
            t.count, t.dense, t.mask, t.shape = pk.nnz, pk.n, base + "_mask", pk.shape
            t.init = pk.pack(t.init) if t.init is not None else None
        m = byname[base + "_mask"]
        m.role, m.init, m.mask, m.shape = "frozen", pk.device_mask, m.name, pk.shape


def weight_storage(sparse: dict, model) -> dict:
    """Device bytes of the weights of the pruned tensors: dense (n int16) and as emitted: stored
    sparse, the packed values plus the column-major mask as the device holds it (whole words per
    column); stored dense, the tensor plus its row-major mask."""
    dense = sparse_b = 0
    for key in (model.prune_table.keys if model.prune_table is not None else []):
        li, pi = key
        p = model.layers[li].params[pi]
        dense += p.data.nbytes
        if key in sparse:
            sparse_b += sparse[key].nnz * p.data.itemsize + sparse[key].device_mask.nbytes
        else:
            sparse_b += p.data.nbytes + P.mask_words(p.data.size) * 4
    return {"dense_bytes": dense, "bytes": sparse_b}


class Renderer:
    """The C statements of the packed Dense layers of one Emitter (its decl/sym/names)."""

    def __init__(self, em, sparse: dict):
        self.em, self.sparse = em, sparse
        self.layers = {li for li, _ in sparse}

    def _pn(self, li):
        return self.em.sym(f"l{li}_w")

    def count(self, key) -> int:
        """Elements of a parameter's buffers (nnz when packed)."""
        if key in self.sparse:
            return self.sparse[key].nnz
        li, pi = key
        return self.em.model.layers[li].params[pi].data.size

    def params(self, li) -> str:
        m, em = self.em.model, self.em
        l = m.layers[li]
        w, b = l.params
        return em.decl(f"l{li}_sparse", "tt_sparse_dense_params",
                       {"K": l.in_shape[0], "N": l.units, "mask": self._pn(li) + "_mask", "w": self._pn(li),
                        "ew": w.exp, "b": em.names.param(li, 1), "eb": b.exp})

    def layout(self, li) -> str:
        l = self.em.model.layers[li]
        return self.em.decl(f"l{li}_layout", "tt_sparse_layout", {"mask": self._pn(li) + "_mask",
                            "K": l.in_shape[0], "N": l.units, "work": "(int32_t *)SCRATCH"})

    def forward(self, li, x, ex, y, ey) -> list[str]:
        return [f"{ey} = tt_sparse_dense_fwd_s8(&CTX, {self.params(li)}, {x}, {ex}, {y});"]

    def backward(self, li, x, ex, e, dx) -> list[str]:
        """Input error (pre-update weights), then the direct update or the per-sample accumulation."""
        em, m = self.em, self.em.model
        out = [f"    ee = tt_sparse_dense_bwd_s8(&CTX, {self.params(li)}, {e}, de, {dx});"] if dx else []
        l = m.layers[li]
        w, b = l.params
        ub = m.learns(li, 1)
        if not m.opt.accumulate:
            pw, t = em._update_target(li, 0)
            ews = m.master_exp((li, 0)) if (li, 0) in m.master else w.exp
            sp = em.decl(f"l{li}_sparse_sgd", f"tt_sparse_sgd_dense_{t}_params",
                         {"K": l.in_shape[0], "N": l.units, "mask": self._pn(li) + "_mask", "w": pw, "ew": ews,
                          "b": em.names.param(li, 1) if ub else 0, "eb": b.exp, "work": "(int32_t *)SCRATCH"})
            out.append(f"    tt_sparse_sgd_dense_direct_{t}(&sgd, {sp}, {e}, de, {x}, {ex});")
            if (li, 0) in m.master:
                out.append("    " + em._refresh(li, 0))
            return out
        g0, g1 = em.grad_name(li, 0), em.grad_name(li, 1)
        out += [f"    tt_sparse_dense_grad_s32({self.params(li)}, {e}, {x}, {g0}, {g1});",
                f"    ge0 = de + {ex};", "    ge1 = de;"]
        ews = m.master_exp((li, 0)) if (li, 0) in m.master else w.exp
        out.append(f"    tt_sparse_sgd_accumulate_s32(&sgd, {self.layout(li)}, {self._pn(li)}_acc, {ews}, {g0}, ge0);")
        if ub:
            eb = m.master_exp((li, 1)) if (li, 1) in m.master else b.exp
            out.append(f"    tt_sgd_accumulate_s32(&sgd, {em.names.param(li, 1)}_acc, {b.data.size}, {eb}, {g1}, ge1);")
        return out

    def apply_accumulated(self, li, ind) -> list[str]:
        em, m = self.em, self.em.model
        key = (li, 0)
        w, t = em._update_target(li, 0)
        vel = f"{self._pn(li)}_vel" if key in m.velocity else "0"
        v16 = "_v16" if key in m.velocity and m.velocity[key].dtype == np.int16 else ""
        out = [f"{ind}tt_sparse_sgd_apply_accumulated_{t}{v16}(&sgd, {self.layout(li)}, {w}, {self._pn(li)}_acc, {vel});"]
        if key in m.master:
            out.append(ind + em._refresh(li, 0))
        return out
