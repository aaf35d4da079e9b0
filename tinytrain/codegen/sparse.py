"""Sparse storage of pruned Dense layers in the generated C (runtime: firmware tt_sparse.h).

Once a model's pruning schedule has no event left (its optimizer step is past the table's last
row: the zero pattern is fixed for good), a pruned Dense weight tensor is emitted packed: its
mask becomes a constant in flash and the weights, their int32 master, accumulator and momentum
keep only the kept elements (row-major order); the kernels skip the pruned weights in forward,
input error, gradient and update. The state blob and hash are unchanged: a packed tensor's span
is its dense view (tt_state.h), so ``verify`` compares the same bytes every step.

Three formats: ``"blocks"`` (tt_sparse_blocks.h: for layers pruned by 1 x 4 blocks, "structure":
"blocks"; the kept blocks' weights row by row, one byte per kept block and one per row; the
fastest, SMLAD on whole blocks, for K <= 258 inputs), ``"rows"`` (tt_sparse_rows.h: the kept
weights row by row, their columns as a byte code of two 4-bit gaps, 2 bytes per row; for
K <= 255 inputs) and ``"bitmap"`` (tt_sparse.h: column by column under a column-major bitmap;
any size).

Which tensors and how (``storage``, the prune object's key, or ``generate(..., storage=)``):

* ``"auto"`` (default): every pruned tensor that can be packed, when the mask is final, in the
  fastest format it fits (blocks when its mask is made of whole 1 x 4 blocks, else rows, else
  bitmap);
* ``"sparse"``: the same for all of them, refused with a message naming the reason when one
  cannot be (the schedule still has events, or a tensor is not a Dense layer's int16 weights);
* ``"blocks"`` / ``"rows"`` / ``"bitmap"``: that format for all of them, refused the same way
  (rows: also when a layer has more than 255 inputs; blocks: a layer not pruned by blocks, or
  with more than 258 inputs);
* ``"dense"``: none (the masks are re-applied after every update, as before).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tinytrain.graph import prune as P

STORAGES = ("auto", "dense", "sparse", "blocks", "rows", "bitmap")
FORMATS = ("blocks", "rows", "bitmap")  # fastest first (bench/bench_prune.py --device-only measures them)
ROWS_MAX_K = 255  # a row's code bytes and kept weights are uint8 counts
ROWS_MAX_N = 516  # TT_DENSE_S32_MAX_N: the input error's sums fit int32
BLOCKS_MAX_K = 258  # TT_DENSE_S32_MAX_K: the forward's sums fit int32 (and ceil(K / 4) <= 255)


def block_code(kept: np.ndarray) -> np.ndarray:
    """The blocks format's code of a kept-element matrix kept[N][K] made of whole 1 x 4 blocks
    (tt_sparse_blocks.h): per row its kept blocks, then each row's kept block indices."""
    N, K = kept.shape
    B = -(-K // P.BLOCK)
    pad = np.zeros((N, B * P.BLOCK), bool)
    pad[:, :K] = kept
    blocks = pad.reshape(N, B, P.BLOCK).any(axis=2)
    return np.concatenate([blocks.sum(axis=1), *(np.flatnonzero(r) for r in blocks)]).astype(np.uint8)


def whole_blocks(kept: np.ndarray) -> bool:
    """Every 1 x 4 block of kept[N][K] (the last of a row K % 4 wide) kept or pruned whole."""
    N, K = kept.shape
    B = -(-K // P.BLOCK)
    pad = np.zeros((N, B * P.BLOCK), bool)
    pad[:, :K] = kept
    sizes = np.minimum(P.BLOCK, K - P.BLOCK * np.arange(B))
    count = pad.reshape(N, B, P.BLOCK).sum(axis=2)
    return bool(((count == 0) | (count == sizes)).all())


def row_code(kept: np.ndarray) -> np.ndarray:
    """The rows format's code of a kept-element matrix kept[N][K] (tt_sparse_rows.h): per row
    (code bytes, kept weights), then each row's bytes: two gaps (1..15) per byte, low nibble
    first, a lone gap as one byte, 0 for a step of 15 with no weight; c starts at -1."""
    N, K = kept.shape
    heads, body = [], []
    for n in range(N):
        cols = np.flatnonzero(kept[n])
        gaps = np.diff(np.concatenate(([-1], cols))).tolist()
        out, i = [], 0
        while i < len(gaps):
            g = gaps[i]
            while g > 15:
                out.append(0)
                g -= 15
            if i + 1 < len(gaps) and gaps[i + 1] <= 15:
                out.append(g | gaps[i + 1] << 4)
                i += 2
            else:
                out.append(g)
                i += 1
        heads += [len(out), len(cols)]
        body += out
    return np.array(heads + body, dtype=np.uint8)


@dataclass
class Packed:
    """One packed weight tensor w[N][K]: its row-major mask (the state's) and its device format,
    "blocks" or "rows" (element order, tt_sparse_blocks.h, tt_sparse_rows.h) or "bitmap" (column
    by column, input k outer, output n inner: tt_sparse.h)."""

    mask: np.ndarray
    shape: tuple  # (N, K)
    fmt: str = "bitmap"

    @property
    def n(self) -> int:
        return int(self.shape[0] * self.shape[1])

    @property
    def kept(self) -> np.ndarray:
        """Kept elements, kept[N][K]."""
        return ~P.unpack(self.mask, self.n).reshape(self.shape)

    @property
    def kept_t(self) -> np.ndarray:
        """Kept elements in the bitmap format's (column-major) order."""
        return self.kept.T.reshape(-1)

    @property
    def code(self) -> np.ndarray:
        """The rows or blocks format's code (uint8)."""
        return block_code(self.kept) if self.fmt == "blocks" else row_code(self.kept)

    @property
    def device(self) -> np.ndarray:
        """What the device holds in flash for the format: the code or the column-major mask."""
        return self.device_mask if self.fmt == "bitmap" else self.code

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
        if self.fmt != "bitmap":
            return np.asarray(a).reshape(-1)[self.kept.reshape(-1)].copy()
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
    g = tab.groups[tab.keys.index(key)]
    # neurons, channels: its bias (and batch-norm slots) are masked too; not the group's shape, which
    # 1 x 4 blocks of a 4-input layer share with neurons
    if g is not None and (li, 1) in tab.keys:
        return f"layer {li} ({l.kind}): structured pruning removes whole units: shrink the model instead (tinytrain shrink)"
    if l.kind != "dense" or l.params[pi].name != "w":
        return f"layer {li} ({l.kind}): sparse storage covers Dense weights only so far: use storage \"auto\" (keeps it dense)"
    if l.params[pi].data.dtype != np.int16:
        return (f"layer {li} (dense): sparse storage needs int16 weights (a precision policy gives {l.params[pi].data.dtype}): "
                "use storage \"auto\" (keeps this layer dense)")
    if key in model.master and model.master[key].dtype != np.int32:
        return (f"layer {li} (dense): sparse storage needs an int32 master (the policy gives {model.master[key].dtype}): "
                "use storage \"auto\" (keeps this layer dense)")
    if l.params[1].data.dtype != np.int32:
        return (f"layer {li} (dense): sparse storage needs an int32 bias (the policy gives {l.params[1].data.dtype}): "
                "use storage \"auto\" (keeps this layer dense) or drop \"bias\": \"int16\"")
    v = model.velocity.get(key)
    if v is not None and v.dtype == np.int8:
        return (f"layer {li} (dense): sparse storage has no kernel for int8 momentum: use momentum \"int32\", "
                "or storage \"auto\" (keeps this layer dense)")
    if v is not None and v.dtype == np.int16 and key in model.master:
        return (f"layer {li} (dense): sparse storage has no kernel for int16 momentum with a master copy: use momentum "
                "\"int32\", or storage \"auto\" (keeps this layer dense)")
    return None


def _why_not_rows(model, key) -> str | None:
    """Why the rows format cannot hold `key` (None: it can)."""
    l = model.layers[key[0]]
    if l.kind != "dense" or l.params[key[1]].name != "w":
        return f"layer {key[0]} ({l.kind}): the rows format holds Dense weights"
    N, K = model.layers[key[0]].params[key[1]].data.shape
    if K > ROWS_MAX_K:
        return f"layer {key[0]} (dense): the rows format takes at most {ROWS_MAX_K} inputs (it has {K}): use \"bitmap\""
    if N > ROWS_MAX_N:
        return f"layer {key[0]} (dense): the rows format takes at most {ROWS_MAX_N} outputs (it has {N}): use \"bitmap\""
    return None


def _why_not_blocks(model, key, mask=None) -> str | None:
    """Why the blocks format cannot hold `key` (None: it can); mask: the final one, checked for
    whole blocks (without it, the pruning structure is)."""
    l = model.layers[key[0]]
    if l.kind != "dense" or l.params[key[1]].name != "w":
        return f"layer {key[0]} ({l.kind}): the blocks format holds Dense weights"
    N, K = l.params[key[1]].data.shape
    if K > BLOCKS_MAX_K:
        return f"layer {key[0]} (dense): the blocks format takes at most {BLOCKS_MAX_K} inputs (it has {K}): use \"bitmap\""
    if N > ROWS_MAX_N:
        return f"layer {key[0]} (dense): the blocks format takes at most {ROWS_MAX_N} outputs (it has {N}): use \"bitmap\""
    cfg = P.layer_prune(l) or model.prune
    if (mask is None and getattr(cfg, "structure", None) != "blocks") or (
            mask is not None and not whole_blocks(~P.unpack(mask, N * K).reshape(N, K))):
        return (f"layer {key[0]} (dense): the blocks format holds layers pruned by 1 x 4 blocks: give the prune object "
                "\"structure\": \"blocks\", or use storage \"rows\"")
    return None


_WHY_NOT = {"rows": lambda m, k, mask=None: _why_not_rows(m, k), "blocks": _why_not_blocks,
            "bitmap": lambda m, k, mask=None: None}


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
    for key in tab.keys:  # a format given for a layer it cannot hold first: training on does not change it
        l = model.layers[key[0]]
        how = _storage(model, key, storage)
        if how in ("rows", "blocks") and l.kind == "dense" and l.params[key[1]].name == "w":
            why = _WHY_NOT[how](model, key, model.masks[key] if final(model) else None)
            if why:
                raise error(f"storage = \"{how}\": {why}")
    out = {}
    for key in tab.keys:
        how = _storage(model, key, storage)
        if how == "dense":
            continue
        why = None if final(model) else (f"the pruning schedule still has events (optimizer step {int(model.meta[1])}, "
                                         f"last event at step {int(tab.steps[-1])}): train past it first")
        why = why or _why_not(model, key)
        fmt = how if how in FORMATS else next(f for f in FORMATS if not _WHY_NOT[f](model, key, model.masks[key]))
        if why:
            if how != "auto":
                raise error(f"storage = \"{how}\": {why}")
            continue
        li, pi = key
        out[key] = Packed(model.masks[key].copy(), model.layers[li].params[pi].data.shape, fmt)
    return out


def frozen(model, storage: str | None = None, packable=lambda li: True) -> dict:
    """(layer, 0) -> Packed for the frozen Dense weights of a pruning model stored sparse in flash.

    A layer that does not train (``train``: "last:k", "bias") keeps its weights as constants in
    flash and has no mask in the state (the schedule covers what learns); when the model prunes
    (a prune object on the model or the layer) and its storage is not "dense", a frozen Dense
    int16 weight tensor is packed by its zeros -- each zero skipped is exact, 0 * x adds nothing
    -- in the format the storage names when it holds the tensor, else the first that does
    (FORMATS: blocks when the zeros are whole 1 x 4 blocks, else rows, else bitmap), when that
    takes fewer bytes than the dense tensor. packable(li):
    the emitter can render the layer's backward around packed weights (forward only, or the
    fused Dense update of its bias)."""
    out = {}
    for li, l in enumerate(model.layers):
        cfg = P.layer_prune(l) or model.prune
        if cfg is None or l.kind != "dense" or model.learns(li, 0) or not packable(li):
            continue
        how = storage or getattr(cfg, "storage", None) or "auto"
        if how == "dense":
            continue
        w = l.params[0].data
        if w.dtype != np.int16 or w.ndim != 2 or (li, 0) in model.master:
            continue
        N, K = w.shape
        kept = w != 0
        holds = {"blocks": K <= BLOCKS_MAX_K and N <= ROWS_MAX_N and whole_blocks(kept),
                 "rows": K <= ROWS_MAX_K and N <= ROWS_MAX_N, "bitmap": True}
        fmt = how if how in FORMATS and holds[how] else next(f for f in FORMATS if holds[f])
        pk = Packed(P.pack(~kept.reshape(-1)), (N, K), fmt)
        if pk.nnz * w.itemsize + pk.device.nbytes < w.nbytes:
            out[(li, 0)] = pk
    return out


def check_storage(model, error=ValueError) -> None:
    """Before training: a storage the model file asks for that codegen will refuse whatever the
    training does (the tensor's format, dtype or momentum, not the schedule) is refused now."""
    tab = model.prune_table
    for key in (tab.keys if tab is not None else ()):
        how = _storage(model, key, None)
        if how in ("auto", "dense"):
            continue
        l = model.layers[key[0]]
        why = _WHY_NOT[how](model, key) if how in ("rows", "blocks") and l.kind == "dense" and l.params[key[1]].name == "w" \
            else None
        why = why or _why_not(model, key)
        if why:
            raise error(f"prune: storage = \"{how}\": {why}")


def includes(sparse: dict) -> list[str]:
    """The runtime headers of the formats in use."""
    hs = {"bitmap": "tt_sparse.h", "rows": "tt_sparse_rows.h", "blocks": "tt_sparse_blocks.h"}
    return [f'#include "{hs[f]}"' for f in FORMATS[::-1] if any(p.fmt == f for p in sparse.values())]


#: tt_span.sym of a writable tensor of this C type: int8/int16 values stay in the symmetric range
SYM_BYTES = {"int8_t": 1, "int16_t": 2}


def span(t) -> str:
    """The tt_span (tt_state.h) of a packed tensor or of its device mask / code: the dense view."""
    rows, cols = t.shape
    mask, code = (t.mask, 0) if t.fmt == "bitmap" else (0, t.mask)
    blocks = ", 1u" if t.fmt == "blocks" else ", 0u"
    if t.mask == t.name:  # the mask, shown row-major
        return (f"    {{(void *){t.name}, {4 * ((rows * cols + 31) // 32)}u, 1, {mask}, 0u, {rows}u, {cols}u, "
                f"{code}{blocks}, 0u}},")
    size = {"int16_t": 2, "int32_t": 4}[t.ctype]
    if t.role == "frozen":  # in flash: read-only (a write must give the values it holds)
        return f"    {{(void *){t.name}, {t.dense * size}u, 1, {mask}, {size}u, {rows}u, {cols}u, {code}{blocks}, 0u}},"
    return (f"    {{{t.name}, {t.dense * size}u, 0, {mask}, {size}u, {rows}u, {cols}u, {code}{blocks}, "
            f"{SYM_BYTES.get(t.ctype, 0)}u}},")


def plan(sparse: dict, tensors, sym) -> None:
    """Rewrite the planned buffers of the packed tensors: nnz elements with packed initial
    values; the mask becomes a constant in flash (role "frozen": a read-only span), the rows
    format's code in its place (uint8)."""
    byname = {t.name: t for t in tensors}
    for (li, pi), pk in sparse.items():
        base = sym(f"l{li}_w")
        if base + "_mask" not in byname:  # frozen weights (frozen()): no mask in the state, the code in flash
            w = byname[base]
            tensors.append(type(w)(base + "_mask", "uint32_t", int(pk.device.size), "frozen", li, None))
            byname[base + "_mask"] = tensors[-1]
        for suffix in ("", "_master", "_acc", "_vel"):
            t = byname.get(base + suffix)
            if t is None:
                continue
            t.count, t.dense, t.mask, t.shape, t.fmt = pk.nnz, pk.n, base + "_mask", pk.shape, pk.fmt
            t.init = pk.pack(t.init) if t.init is not None else None
        m = byname[base + "_mask"]
        m.role, m.init, m.mask, m.shape, m.fmt = "frozen", pk.device, m.name, pk.shape, pk.fmt
        if pk.fmt != "bitmap":
            m.ctype, m.count = "uint8_t", int(pk.device.size)


def weight_storage(sparse: dict, model) -> dict:
    """Device bytes of the weights of the pruned tensors: dense (n int16) and as emitted: stored
    sparse, the packed values plus what the format adds (rows: the code; bitmap: the column-major
    mask, whole words per column); stored dense, the tensor plus its row-major mask."""
    dense = sparse_b = 0
    for key in (model.prune_table.keys if model.prune_table is not None else []):
        li, pi = key
        p = model.layers[li].params[pi]
        dense += p.data.nbytes
        if key in sparse:
            sparse_b += sparse[key].nnz * p.data.itemsize + sparse[key].device.nbytes
        else:
            sparse_b += p.data.nbytes + P.mask_words(p.data.size) * 4
    return {"dense_bytes": dense, "bytes": sparse_b}


class Renderer:
    """The C statements of the packed Dense layers of one Emitter (its decl/sym/names), in each
    tensor's format: the calls are tt_sparse_<kernel> (bitmap) or tt_sparse_rows_<kernel> (rows)."""

    # kernel -> (bitmap name, rows name); the blocks format: the rows name with "blocks" for the
    # kernels (its structs are the rows format's)
    NAMES = {"fwd": ("tt_sparse_dense_fwd_s8", "tt_sparse_rows_fwd_s8"),
             "bwd": ("tt_sparse_dense_bwd_s8", "tt_sparse_rows_bwd_s8"),
             "grad": ("tt_sparse_dense_grad_s32", "tt_sparse_rows_grad_s32"),
             "direct": ("tt_sparse_sgd_dense_direct_{t}", "tt_sparse_rows_sgd_direct_{t}"),
             "sgd_params": ("tt_sparse_sgd_dense_{t}_params", "tt_sparse_rows_sgd_{t}_params"),
             "params": ("tt_sparse_dense_params", "tt_sparse_rows_params"),
             "layout": ("tt_sparse_layout", "tt_sparse_rows_layout"),
             "accumulate": ("tt_sparse_sgd_accumulate_s32", "tt_sparse_rows_sgd_accumulate_s32"),
             "apply": ("tt_sparse_sgd_apply_accumulated_{t}{v16}", "tt_sparse_rows_sgd_apply_accumulated_{t}{v16}")}
    STRUCTS = ("sgd_params", "params", "layout")

    def __init__(self, em, sparse: dict, frozen: dict | None = None):
        """sparse: the pruned tensors packed (choose); frozen: the frozen weights packed (frozen())."""
        self.pruned, self.frozen = sparse, frozen or {}
        self.em, self.sparse = em, {**sparse, **self.frozen}
        self.layers = {li for li, _ in self.sparse}

    def _pn(self, li):
        return self.em.sym(f"l{li}_w")

    def _fn(self, li, kernel, **kw) -> str:
        fmt = self.sparse[(li, 0)].fmt
        name = self.NAMES[kernel][fmt != "bitmap"].format(**kw)
        return name.replace("_rows_", "_blocks_") if fmt == "blocks" and kernel not in self.STRUCTS else name

    def _where(self, li) -> dict:
        """The format's field of the packed layout: the mask or the code (both the _mask array)."""
        return {"mask" if self.sparse[(li, 0)].fmt == "bitmap" else "code": self._pn(li) + "_mask"}

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
        return em.decl(f"l{li}_sparse", self._fn(li, "params"),
                       {"K": l.in_shape[0], "N": l.units, **self._where(li), "w": self._pn(li),
                        "ew": w.exp, "b": em.names.param(li, 1), "eb": b.exp})

    def layout(self, li) -> str:
        l = self.em.model.layers[li]
        return self.em.decl(f"l{li}_layout", self._fn(li, "layout"),
                            {**self._where(li), "K": l.in_shape[0], "N": l.units, "work": "(int32_t *)SCRATCH"})

    def forward(self, li, x, ex, y, ey) -> list[str]:
        call = f"{ey} = {self._fn(li, 'fwd')}(&CTX, {self.params(li)}, {x}, {ex}, {y});"
        rows = self._rows_fn(li)
        if rows is None:
            return [call]
        fast = f"{ey} = tt_sparse_blocks_fwd_rows_s8(&CTX, {self.params(li)}, {x}, {ex}, {y}, {rows});"
        return ["#if TT_SPARSE_BLOCKS_UNROLL", fast, "#else", call, "#endif"]

    #: most kept blocks a forward is unrolled for (4 instructions, ~12 bytes of flash each)
    UNROLL_MAX_BLOCKS = 1024

    def _rows_fn(self, li) -> str | None:
        """The name of layer li's forward rows unrolled from its block code (a
        tt_sparse_blocks_rows_fn, declared once among the decls under TT_SPARSE_BLOCKS_UNROLL), or
        None: not the blocks format, 4 not dividing K, an input offset past LDRD's 1020 bytes, or
        more than UNROLL_MAX_BLOCKS kept blocks."""
        pk = self.sparse[(li, 0)]
        N, K = pk.shape
        code = [int(v) for v in pk.code] if pk.fmt == "blocks" else []
        if pk.fmt != "blocks" or K % 4 or 8 * (K // 4 - 1) > 1020 or len(code) - N > self.UNROLL_MAX_BLOCKS:
            return None
        name = self.em.sym(f"l{li}_fwd_rows")
        body, at, base = [], N, 0  # base: int16 elements w was stepped by (LDRD offsets <= 1020 bytes)
        for n in range(N):
            js = code[at:at + code[n]]
            at += code[n]
            body.append(f"    a = tt_sparse_blocks_bias(b[{n}], d1); /* row {n}: blocks {', '.join(map(str, js)) or 'none'} */")
            for j in js:
                if 2 * base > 1020:  # past LDRD's immediate range: step w
                    body.append(f"    w += {base};")
                    base = 0
                body.append(f"    TT_SPARSE_BLOCKS_MAC(a, xx, {8 * j}, w, {2 * base});")
                base += 4
            body += [f"    acc[{n}] = a;", "    m |= (uint32_t)(a ^ (a >> 31));"]
        text = "\n".join([
            "#if TT_SPARSE_BLOCKS_UNROLL",
            f"/** Layer {li}'s forward rows over its kept 1 x 4 blocks, unrolled from its block code "
            "(tt_sparse_blocks_rows_fn). */",
            f"static TT_SPARSE_BLOCKS_NOINLINE uint32_t {name}(const uint32_t *xx, const int16_t *w, "
            "const int32_t *b, int32_t d1, int32_t *acc)",
            "{", "    uint32_t m = 0;", "    int32_t a;", *body, "    return m;", "}", "#endif"])
        if self.em.decls.setdefault(name, text) != text:
            raise ValueError(f"{name} emitted twice with different bodies")
        return name

    def backward(self, li, x, ex, e, dx) -> list[str]:
        """Input error (pre-update weights), then the direct update or the per-sample accumulation."""
        em, m = self.em, self.em.model
        out = [f"    ee = {self._fn(li, 'bwd')}(&CTX, {self.params(li)}, {e}, de, {dx});"] if dx else []
        l = m.layers[li]
        if (li, 0) in self.frozen:  # the weights in flash: the fused Dense update of what learns (its bias)
            return out + em._fused_dense(li, l, x, ex, e, None)
        w, b = l.params
        ub = m.learns(li, 1)
        if not m.opt.accumulate:
            pw, t = em._update_target(li, 0)
            ews = m.master_exp((li, 0)) if (li, 0) in m.master else w.exp
            sp = em.decl(f"l{li}_sparse_sgd", self._fn(li, "sgd_params", t=t),
                         {"K": l.in_shape[0], "N": l.units, **self._where(li), "w": pw, "ew": ews,
                          "b": em.names.param(li, 1) if ub else 0, "eb": b.exp, "work": "(int32_t *)SCRATCH"})
            out.append(f"    {self._fn(li, 'direct', t=t)}(&sgd, {sp}, {e}, de, {x}, {ex});")
            if (li, 0) in m.master:
                out.append("    " + em._refresh(li, 0))
            return out
        g0, g1 = em.grad_name(li, 0), em.grad_name(li, 1)
        out += [f"    {self._fn(li, 'grad')}({self.params(li)}, {e}, {x}, {g0}, {g1});",
                f"    ge0 = de + {ex};", "    ge1 = de;"]
        ews = m.master_exp((li, 0)) if (li, 0) in m.master else w.exp
        out.append(f"    {self._fn(li, 'accumulate')}(&sgd, {self.layout(li)}, {self._pn(li)}_acc, {ews}, {g0}, ge0);")
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
        out = [f"{ind}{self._fn(li, 'apply', t=t, v16=v16)}(&sgd, {self.layout(li)}, {w}, {self._pn(li)}_acc, {vel});"]
        if key in m.master:
            out.append(ind + em._refresh(li, 0))
        return out
