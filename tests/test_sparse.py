"""Sparse storage of pruned Dense layers on the device (tinytrain/codegen/sparse.py, firmware
tt_sparse_rows.c for the "rows" format, tt_sparse.c for "bitmap"; the masked dense reference is
the specification).

Models whose pruning schedule is over (the mask final) are emitted with packed weights and slots
and kernels that skip the pruned weights; on drawn MLPs x sparsities x optimizer options
(momentum, decay, stochastic rounding, masters, batch, frozen layers) x both formats the C equals
the reference and the numba simulator every step, by state hash (the blob keeps its dense view).
Also: the rows code, the blob's view read, written and refused where it cannot be written, what
is emitted, the refusals, and a QEMU verify of sparse W1 on the Cortex-M4 and the micro:bit.
"""
from __future__ import annotations

import copy
import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.codegen import sparse as S
from tinytrain.codegen.emit import CodegenError, generate
from tinytrain.graph import prune as P
from tinytrain.graph.conv import Conv1d
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.state import state_blob

from .conftest import examples
from .test_exactness import _data, any_optimizer, three_way


def _past_schedule(m, x, y):
    """Reference steps until no pruning event is left (the mask final)."""
    i = 0
    while not S.final(m):
        m.ref_train_step(x[i % len(x)], y[i % len(y)])
        i += 1


@st.composite
def mlps(draw):
    """An MLP of 1-3 Dense layers (fan-in and fan-out across the 32-bit word of a mask column)."""
    k = draw(st.integers(1, 70))
    widths = draw(st.lists(st.integers(1, 45), min_size=0, max_size=2))
    layers = []
    for w in widths:
        layers += [Dense(w), ReLU()]
    n_cls = draw(st.integers(2, 5))
    return (k,), layers + [Dense(n_cls)], n_cls


@st.composite
def mlp_cases(draw):
    """A drawn MLP, an optimizer for it and a short schedule (over within two steps) to a drawn sparsity."""
    shape, layers, n_cls = draw(mlps())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = draw(any_optimizer(probe.layers))
    s = draw(st.sampled_from([0.25, 0.5, 0.8, 0.9, 0.99]))
    prune = draw(st.sampled_from([
        {"schedule": "one_shot", "final_sparsity": s, "begin_step": 0},
        {"schedule": "polynomial", "final_sparsity": s, "begin_step": 0, "end_step": 2, "frequency": 1},
        {"schedule": "one_shot", "final_sparsity": s, "begin_step": 1, "scope": "global"}]))
    return shape, layers, n_cls, opt, prune


@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_sparse_training_reference_sim_c_equal(data):
    """Drawn MLPs x sparsities x optimizer options, the schedule over: every pruned Dense weight
    tensor is packed, and reference = numba = C (sparse kernels, UBSan) every step."""
    shape, layers, n_cls, opt, prune = data.draw(mlp_cases())
    fmt = data.draw(st.sampled_from(["rows", "bitmap"]))
    prune = {**prune, "storage": "auto" if fmt == "rows" else fmt}  # auto picks rows (K <= 70 here; blocks, below)
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), prune=prune)
    if ref.prune_table is None:  # nothing learns that can be pruned
        return
    x, y = _data(data.draw(st.integers(4, 7)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(ref, x, y)
    chosen = S.choose(ref)
    # auto: blocks where single weights happen to fall in whole 1 x 4 blocks (K = 1, or 0 % pruned)
    assert set(chosen) == set(ref.prune_table.keys)
    assert all(p.fmt == ("blocks" if fmt == "rows" and S.whole_blocks(p.kept) else fmt) for p in chosen.values())
    three_way(ref, x, y, epochs=1)


def _frozen_pruned(data, s, storage="auto"):
    """A drawn MLP pruned to s while every layer trains (one-shot at step 0, the schedule over),
    then given a drawn partial training (last:k, bias, a list of layers: what a device does with
    a host-pretrained model), with_precision carrying the state: the frozen layers keep their
    zeros and lose their masks. Returns (model, x, y, {frozen Dense layer: its nonzero weights})."""
    from dataclasses import replace

    from tinytrain.graph.convert import with_precision

    shape, layers, n_cls = data.draw(mlps())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = data.draw(any_optimizer(probe.layers))
    train = opt.train if opt.train != "all" else "bias"
    m = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)),
                   optimizer=replace(opt, train="all"), seed=data.draw(st.integers(0, 1000)),
                   prune={"schedule": "one_shot", "final_sparsity": s, "begin_step": 0, "storage": storage})
    x, y = _data(data.draw(st.integers(4, 7)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(m, x, y)
    f = with_precision(m, None, edit=lambda cfg: cfg["optimizer"].update(train=train))
    frozen = {li: int(np.count_nonzero(l.params[0].data)) for li, l in enumerate(f.layers)
              if l.kind == "dense" and not f.learns(li, 0)}
    return f, x, y, frozen


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_frozen_pruned_layers_packed_reference_sim_c_equal(data):
    """Drawn MLPs x sparsities x optimizer options x partial trainings x storage: a pruned layer
    that no longer trains is packed by its zeros in flash (no mask in the state) and the C with
    its sparse forward and input error equals the reference and the numba simulator every step;
    its packed array holds the nonzero weights only; "dense" keeps it dense."""
    s = data.draw(st.sampled_from([0.5, 0.8, 0.9, 0.99]))
    storage = data.draw(st.sampled_from(["auto", "rows", "bitmap", "dense"]))
    f, x, y, frozen = _frozen_pruned(data, s, storage)
    from tinytrain.codegen.emit import Emitter

    em, emitter = generate(f), Emitter(f)
    packed = emitter.sparse.frozen
    assert all(f"tt_model_l{li}_w[{p.nnz}]" in em.source for (li, _), p in packed.items() if p.nnz)
    if storage == "dense":
        assert not packed
    else:
        for li, nnz in frozen.items():
            renders = li < f.first_learning or emitter.fused(li)  # forward only, or the fused Dense update
            if (li, 0) not in f.master and renders:  # packed exactly when its format makes it smaller
                fmt, nbytes, dense = _packed_size(f.layers[li].params[0].data, storage)
                assert ((li, 0) in packed) == (nbytes < dense), (li, fmt, nbytes, dense, packed)
                if (li, 0) in packed:
                    assert packed[(li, 0)].nnz == nnz and packed[(li, 0)].fmt == fmt, (li, nnz, packed)
    three_way(f, x, y, epochs=1)


def _packed_size(w, storage):
    """(format, bytes packed, bytes dense) of frozen int16 weights w, from the formats' layouts
    (tt_sparse.h, tt_sparse_rows.h, tt_sparse_blocks.h), not from codegen: the kept values, two
    bytes each, plus bitmap: one uint32 per input per 32 outputs; rows: two bytes a row and a
    byte per two gaps of 1..15 (a 0 byte per 15 more); blocks: a byte a row and a byte per kept
    block. The format: the storage's when it holds w, else the first of blocks, rows, bitmap."""
    N, K = w.shape
    kept = w != 0
    B = -(-K // 4)
    pad = np.zeros((N, 4 * B), bool)
    pad[:, :K] = kept
    per_block = pad.reshape(N, B, 4).sum(axis=2)
    whole = ((per_block == 0) | (per_block == np.minimum(4, K - 4 * np.arange(B)))).all()

    def row_bytes(cols):
        gaps, n, i = np.diff(np.concatenate(([-1], cols))), 0, 0
        while i < len(gaps):
            n += (int(gaps[i]) - 1) // 15 + 1  # the zero bytes, then the byte holding its rest
            i += 2 if i + 1 < len(gaps) and gaps[i + 1] <= 15 else 1  # the next gap shares it
        return n

    sizes = {"blocks": N + int((per_block > 0).sum()) if whole and K <= S.BLOCKS_MAX_K and N <= S.ROWS_MAX_N else None,
             "rows": 2 * N + sum(row_bytes(np.flatnonzero(r)) for r in kept)
             if K <= S.ROWS_MAX_K and N <= S.ROWS_MAX_N else None,
             "bitmap": 4 * K * -(-N // 32)}
    fmt = storage if sizes.get(storage) is not None else next(f for f in ("blocks", "rows", "bitmap") if sizes[f] is not None)
    return fmt, 2 * int(kept.sum()) + sizes[fmt], 2 * N * K


def test_frozen_bitmap_of_few_outputs_stays_dense():
    """The draw that once failed the test above (sparsity 0.9, storage "bitmap", 52 inputs): a
    frozen layer of 2 outputs costs 52 words of bitmap, as many bytes as its dense weights, so
    packing it saves nothing and codegen keeps it dense; by rows it packs. Both train three-way equal."""
    from tinytrain.codegen.emit import Emitter
    from tinytrain.graph.convert import with_precision

    for storage, is_packed in (("bitmap", False), ("rows", True)):
        m = Sequential([Dense(2), ReLU(), Dense(3)], input_shape=(52,), input_exp=-7, optimizer=SGD(lr=0.05), seed=4,
                       prune={"schedule": "one_shot", "final_sparsity": 0.9, "begin_step": 0, "storage": storage})
        x, y = _data(5, (52,), 3, 7)
        _past_schedule(m, x, y)
        f = with_precision(m, None, edit=lambda cfg: cfg["optimizer"].update(train="last:1"))
        fmt, nbytes, dense = _packed_size(f.layers[0].params[0].data, storage)
        assert fmt == storage and (nbytes < dense) == is_packed and dense == 208
        assert ((0, 0) in Emitter(f).sparse.frozen) == is_packed
        three_way(f, x, y, epochs=1)


def test_frozen_packed_state_reads_dense_and_is_read_only(monkeypatch):
    """A pruned layer frozen by "last:1": the C blob is the reference's (its weights read
    densely from the packed flash array), a write of the same bytes is accepted, a changed kept
    weight or a nonzero written over a zero is refused (-1, the state unchanged); the parameter
    flash of the generated C falls by the zeros, less the rows code."""
    from tinytrain.codegen.host import HostModel
    from tinytrain.graph.convert import with_precision
    from tinytrain.verify import state_layout

    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(37,), input_exp=-7, optimizer=SGD(lr=0.05), seed=2,
                   prune={"schedule": "one_shot", "final_sparsity": 0.8, "begin_step": 0})
    x, y = _data(6, (37,), 4, 3)
    _past_schedule(m, x, y)
    f = with_precision(m, None, edit=lambda cfg: cfg["optimizer"].update(train="last:1"))
    assert f.prune_table.keys == [(2, 0)] and (0, 0) not in f.masks  # the frozen layer has no mask
    packed = S.frozen(f)
    assert {k: (p.fmt, p.nnz) for k, p in packed.items()} == {(0, 0): ("rows", 296)}
    hm = HostModel(f)
    blob = state_blob(f)
    assert hm.read_state() == blob and hm.write_state(blob) == 0 and hm.state_hash() == f.state_hash()
    w = next(s for s in state_layout(f) if (s.layer, s.param) == (0, "w"))
    flat = f.layers[0].params[0].data.reshape(-1)
    for i in (int(np.flatnonzero(flat)[0]), int(np.flatnonzero(flat == 0)[0])):
        bad = bytearray(blob)
        bad[w.offset + 2 * i] ^= 1
        assert hm.write_state(bytes(bad)) == -1, i
        assert hm.read_state() == blob
    assert hm.get_tensor(0) == f.layers[0].params[0].data.tobytes()
    from tinytrain.codegen.memory import flash_parameters
    now = flash_parameters(generate(f))
    monkeypatch.setattr(S, "frozen", lambda *a, **k: {})  # the layout before frozen layers were packed
    assert now == flash_parameters(generate(f)) - 2 * (1480 - 296) + S.row_code(packed[(0, 0)].kept).nbytes


@pytest.mark.parametrize("opt, fmt", [(SGD(lr=0.2, momentum=0.9, batch_size=3, stochastic_rounding=True), "rows"),
                                      (SGD(lr=0.05, master_weights=True, stochastic_rounding=True, weight_decay=1e-3),
                                       "bitmap")],
                         ids=["momentum-batch-sr-rows", "master-sr-wd-bitmap"])
def test_sparse_options_exact(opt, fmt):
    """Fixed cases of the option paths: the fused fast update, the per-element path with the
    pruned elements' PRNG draws, masters narrowed from packed masters, accumulators and
    momentum packed; three-way equal, 90 % and 40-wide (rows: gaps over 15, 0x00 steps;
    bitmap: two mask words per column)."""
    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(37,), input_exp=-7, optimizer=opt, seed=3,
                   prune={"schedule": "polynomial", "final_sparsity": 0.9, "begin_step": 0, "end_step": 2,
                          "frequency": 1, "storage": fmt})
    x, y = _data(9, (37,), 4, 5)
    _past_schedule(m, x, y)
    chosen = S.choose(m)
    assert {k: p.nnz for k, p in chosen.items()} == {(0, 0): 148, (2, 0): 16}
    assert fmt == "bitmap" or (chosen[(0, 0)].code[2 * 40:] == 0).any()  # a gap over 15 is in the code
    three_way(m, x, y)


def _structure(fmt) -> dict:
    """The prune keys of a format: "blocks" holds layers pruned by 1 x 4 blocks."""
    return {"structure": "blocks"} if fmt == "blocks" else {}


@pytest.mark.parametrize("fmt", ["blocks", "rows", "bitmap"])
def test_dsp_path_equals_reference(tmp_path, fmt):
    """The sparse kernels' DSP path (the fused update: SMMULR, blocks SMLAWB pairs; rows and blocks: SMLAD in the
    forward; tt_dsp_emul.h's plain C intrinsics on the host) equals the reference as the
    portable path does; the Cortex-M4 objects really have them (a silent fallback to the
    portable path fails here), the Cortex-M0 ones not."""
    import subprocess

    from tinytrain.codegen.host import HostModel
    from tinytrain.codegen.memory import CPU_FLAGS
    from tinytrain.device import cbuild

    from .conftest import HERE

    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(37,), input_exp=-7, optimizer=SGD(lr=0.05), seed=4,
                   prune={"schedule": "one_shot", "final_sparsity": 0.8, "begin_step": 0, "storage": fmt,
                          **_structure(fmt)})
    x, y = _data(8, (37,), 4, 9)
    _past_schedule(m, x, y)
    hm = HostModel(m, sanitize=True, extra_flags=["-DTT_HAVE_DSP=1", f"-I{HERE / 'c'}"])
    for i in range(len(x)):
        assert hm.train_step(x[i], y[i]) == tuple(int(v) for v in m.ref_train_step(x[i], y[i]))
        assert hm.state_hash() == m.state_hash(), i
    if shutil.which("arm-none-eabi-gcc") is None:
        return
    src, ops = {"rows": ("tt_sparse_rows.c", ("\tsmmulr", "\tsmlad")), "bitmap": ("tt_sparse.c", ("\tsmmulr",)),
                "blocks": ("tt_sparse_blocks.c", ("\tsmlawb", "\tsmlad"))}[fmt]
    for cpu, dsp in (("cortex-m4", True), ("cortex-m0", False)):
        obj = str(tmp_path / f"{src}-{cpu}.o")
        subprocess.run(["arm-none-eabi-gcc", "-std=c99", "-O2", "-c", *CPU_FLAGS[cpu], f"-I{cbuild.FIRMWARE_INCLUDE}",
                        str(cbuild.FIRMWARE_SRC / src), "-o", obj], check=True, capture_output=True)
        dis = subprocess.run(["arm-none-eabi-objdump", "-d", obj], capture_output=True, text=True, check=True).stdout
        assert all((op in dis) == dsp for op in ops), cpu


@pytest.mark.parametrize("d", [-2, 0, 5, 33], ids=lambda d: f"bias-shift-{d}")
def test_rows_kernel_edges_exact(d):
    """The rows kernels at their edges, portable and DSP (tt_dsp_emul.h) builds against the
    reference every step: kept weights drawn from {-32767, 32766, 32767} under a large lr, so
    the fused update's store-then-clamp saturates both ways;
    layer 0's bias exponent set so that the forward's bias shift d = ex + ew - eb is below 1, 0,
    inside [1, 31] (the plain rounding shift) or above 31 (tt_align_s32's other paths)."""
    from tinytrain.codegen.host import HostModel

    from .conftest import HERE

    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(37,), input_exp=-7, optimizer=SGD(lr=1.0), seed=5,
                   prune={"schedule": "one_shot", "final_sparsity": 0.8, "begin_step": 0, "storage": "rows"})
    x, y = _data(8, (37,), 4, 11)
    _past_schedule(m, x, y)
    rng = np.random.default_rng(d + 7)
    for li in (0, 2):
        w = m.layers[li].params[0]
        kept = ~P.unpack(m.masks[(li, 0)], w.data.size).reshape(w.data.shape)
        edge = rng.choice(np.array([-32767, 32766, 32767], np.int16), w.data.shape)
        w.data[kept] = edge[kept]
    w0, b0 = m.layers[0].params
    b0.exp = -7 + w0.exp - d
    b0.data[:] = rng.integers(-2**30, 2**30, b0.data.shape)
    assert S.choose(m)[(0, 0)].fmt == "rows"
    for flags in ([], ["-DTT_HAVE_DSP=1", f"-I{HERE / 'c'}"]):
        hm, ref = HostModel(m.copy(), sanitize=True, extra_flags=flags), m.copy()
        for i in range(len(x)):
            assert hm.train_step(x[i], y[i]) == tuple(int(v) for v in ref.ref_train_step(x[i], y[i])), (flags, i)
            assert hm.state_hash() == ref.state_hash(), (flags, i)
        assert ref.stats[1] > 0  # weight saturations: the clamp was reached


def test_row_code():
    """The rows format's code (tt_sparse_rows.h): two gaps a byte, low nibble first, a lone gap
    alone, 0x00 for each 15 of a gap over 15; per row (bytes, kept) first."""
    kept = np.zeros((3, 40), bool)
    kept[0, [0, 1, 17, 40 - 1]] = True  # gaps 1, 1, 16 (0x00 then 1), 22 (0x00 then 7)
    kept[2, [14, 29]] = True  # gaps 15, 15: one byte
    code = S.row_code(kept).tolist()
    assert code == [5, 4, 0, 0, 1, 2, 0x11, 0x00, 0x01, 0x00, 0x07, 0xFF]


def _sparse_w1ish(fmt="auto"):
    m = Sequential([Dense(12), ReLU(), Dense(4)], input_shape=(10,), input_exp=-7, optimizer=SGD(lr=0.05, momentum=0.9),
                   seed=1, prune={"schedule": "one_shot", "final_sparsity": 0.75, "begin_step": 0, "storage": fmt,
                                  **_structure(fmt)})
    x, y = _data(6, (10,), 4, 2)
    _past_schedule(m, x, y)
    return m, x, y


@pytest.mark.parametrize("fmt", ["blocks", "rows", "bitmap"])
def test_state_blob_is_the_dense_view(fmt):
    """The C blob of a sparse model is the reference's blob byte for byte (pruned weights read as
    zeros, the mask row-major); writing it back is accepted; a nonzero pruned weight or a changed
    mask bit is refused (-1); the packed tensor reads densely through get_tensor."""
    from tinytrain.codegen.host import HostModel
    from tinytrain.verify import state_layout

    m, x, y = _sparse_w1ish(fmt)
    hm = HostModel(m)
    blob = state_blob(m)
    assert hm.read_state() == blob and hm.state_hash() == m.state_hash()
    assert hm.write_state(blob) == 0 and hm.state_hash() == m.state_hash()
    lay = {(s.layer, s.param, s.role): s for s in state_layout(m)}
    w, mask = lay[(0, "w", "param")], lay[(0, "w", "mask")]
    pruned = int(np.flatnonzero(P.unpack(m.masks[(0, 0)], 120))[0])
    bad = bytearray(blob)
    bad[w.offset + 2 * pruned] = 1
    assert hm.write_state(bytes(bad)) == -1
    bad = bytearray(blob)
    bad[mask.offset] ^= 1
    assert hm.write_state(bytes(bad)) == -1
    assert hm.write_state(blob) == 0 and hm.state_hash() == m.state_hash()
    assert hm.get_tensor(0) == m.layers[0].params[0].data.tobytes()
    hm.train_step(x[0], y[0])
    m.ref_train_step(x[0], y[0])
    assert hm.read_state() == state_blob(m)


def test_emitted_sparse_c():
    """What the generator emits once the mask is final: auto picks rows (the code in flash),
    packed buffers (30 of 120 kept), the sparse kernels, no re-zeroing and no schedule; storage
    "bitmap" the column-major mask and its kernels; "dense" keeps the old path; the memory
    report sees the smaller parameters."""
    m, _, _ = _sparse_w1ish()
    em = generate(m)
    src = em.source
    code = S.choose(m)[(0, 0)].code
    assert '#include "tt_sparse_rows.h"' in src and "tt_prune_apply" not in src and "tt_prune_step" not in src
    assert f"static const uint8_t tt_model_l0_w_mask[{code.size}] = {{" in src and code.size < 30 + 2 * 12
    assert "/** param of layer 0 (30 x int16_t, packed: the 30 of 120 kept) */" in src
    assert "static int32_t tt_model_l0_w_vel[30] = {" in src
    step = src[src.index("_train_step("):src.index("_predict(")]
    assert "e1 = tt_sparse_rows_fwd_s8(&CTX, &tt_model_l0_sparse, x, e0, tt_model_a0);" in step
    assert "tt_sparse_rows_grad_s32(&tt_model_l2_sparse, tt_model_err0, tt_model_a1, tt_model_grad0, tt_model_grad1);" in step
    assert ("tt_sparse_rows_sgd_apply_accumulated_s16(&sgd, &tt_model_l0_layout, tt_model_l0_w, tt_model_l0_w_acc, "
            "tt_model_l0_w_vel);") in step
    assert "{tt_model_l0_w, 240u, 0, 0, 2u, 12u, 10u, tt_model_l0_w_mask, 0u, 2u}," in src
    assert "{(void *)tt_model_l0_w_mask, 16u, 1, 0, 0u, 12u, 10u, tt_model_l0_w_mask, 0u, 0u}," in src
    bm = generate(m, storage="bitmap").source
    assert '#include "tt_sparse.h"' in bm and "tt_sparse_rows" not in bm
    assert "static const uint32_t tt_model_l0_w_mask[10] = {" in bm  # 10 inputs, one word per column
    assert "e1 = tt_sparse_dense_fwd_s8(&CTX, &tt_model_l0_sparse, x, e0, tt_model_a0);" in bm
    assert "{tt_model_l0_w, 240u, 0, tt_model_l0_w_mask, 2u, 12u, 10u, 0, 0u, 2u}," in bm
    dense = generate(m, storage="dense").source
    assert "tt_sparse" not in dense and "tt_prune_apply(&tt_model_prune[0]);" in dense
    mm = copy.deepcopy(m)
    mm.prune.storage = "dense"
    assert generate(mm).source == dense
    params = lambda e: sum(t.bytes for t in e.tensors if t.role in ("param", "master", "accum", "velocity"))  # noqa: E731
    assert params(generate(m, storage="dense")) - params(em) == (120 - 30 + 48 - 12) * (2 + 4 + 4)


def test_storage_refusals():
    """storage "sparse" where it cannot apply names why; "auto" then stays dense; a bad value
    names the field."""
    m = Sequential([Dense(12), ReLU(), Dense(4)], input_shape=(10,), input_exp=-7,
                   prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 3})
    with pytest.raises(CodegenError, match="still has events"):
        generate(m, storage="sparse")
    assert "tt_sparse" not in generate(m).source
    with pytest.raises(CodegenError, match="does not prune"):
        generate(Sequential([Dense(3)], input_shape=(4,)), storage="sparse")
    with pytest.raises(CodegenError, match="storage = 'packed' must be one of auto, dense, sparse, blocks, rows, bitmap"):
        generate(m, storage="packed")
    conv = Sequential([Conv1d(2, 3), Flatten(), Dense(3)], input_shape=(8, 1), input_exp=-7,
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "storage": "sparse"})
    x, y = _data(3, (8, 1), 3, 0)
    _past_schedule(conv, x, y)
    with pytest.raises(CodegenError, match="Dense weights only"):
        generate(conv)
    conv.prune.storage = None
    assert set(S.choose(conv)) == {(2, 0)}  # auto: the Dense head packed, the convolution dense
    wide = Sequential([Dense(3)], input_shape=(256,), input_exp=-7,
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0})
    x, y = _data(2, (256,), 3, 0)
    _past_schedule(wide, x, y)
    assert {k: p.fmt for k, p in S.choose(wide).items()} == {(0, 0): "bitmap"}  # auto: too wide for rows
    with pytest.raises(CodegenError, match="at most 255 inputs"):
        generate(wide, storage="rows")
    with pytest.raises(ModelError, match="storage"):
        Sequential([Dense(3)], input_shape=(4,), prune={"schedule": "one_shot", "final_sparsity": 0.5,
                                                         "storage": "packed"})
    # structured pruning masks the bias (and batch norms) with the rows: those layers are shrunk, not packed
    st_m = Sequential([Dense(12), ReLU(), Dense(4)], input_shape=(10,), input_exp=-7,
                      prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "structure": "neurons"})
    x, y = _data(3, (10,), 4, 0)
    _past_schedule(st_m, x, y)
    assert S.final(st_m) and S.choose(st_m) == {}
    assert "tt_sparse" not in generate(st_m).source
    with pytest.raises(CodegenError, match="shrink the model instead"):
        generate(st_m, storage="sparse")


@pytest.mark.qemu
@settings(max_examples=examples(1), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_sparse_drawn_bit_exact_on_the_microbit(data):
    """A drawn MLP x sparsity (up to 99 %: gaps over 15 in the rows code) x format, the schedule
    over, verified for 12 steps on the QEMU Cortex-M0 (the portable paths, no CLZ): 0
    mismatches, the pruned tensors stored sparse."""
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain.data import Dataset
    from tinytrain.verify import verify

    shape, layers, n_cls = data.draw(mlps())
    s = data.draw(st.sampled_from([0.5, 0.8, 0.9, 0.99]))
    fmt = data.draw(st.sampled_from(["blocks", "rows", "bitmap"]))
    m = Sequential(layers, input_shape=shape, input_exp=-7, optimizer=SGD(lr=0.1), seed=data.draw(st.integers(0, 99)),
                   prune={"schedule": "one_shot", "final_sparsity": s, "begin_step": 0, "storage": fmt,
                          **_structure(fmt)})
    x, y = _data(16, shape, n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(m, x, y)
    assert {p.fmt for p in S.choose(m).values()} == {fmt}
    fx = x.astype(np.float32) / 128
    ds = Dataset("drawn", x, y.astype(np.int32), x, y.astype(np.int32), shape, n_cls, -7, (-1.0, 1.0), fx, fx)
    r = verify(m, ds, 12, board="microbit", json=True)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 12


@pytest.mark.qemu
@settings(max_examples=examples(1), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_frozen_pruned_drawn_bit_exact_in_qemu(data):
    """A drawn MLP pruned, then partly frozen (the frozen layers packed in flash by their zeros),
    verified for 12 steps on the QEMU Cortex-M4 (DSP paths) and Cortex-M0: 0 mismatches."""
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain.data import Dataset
    from tinytrain.verify import verify

    f, x, y, frozen = _frozen_pruned(data, data.draw(st.sampled_from([0.8, 0.9])))
    shape, n_cls = f.input_shape, f.layers[-1].out_size
    fx = x.astype(np.float32) / 128
    ds = Dataset("drawn", x, y.astype(np.int32), x, y.astype(np.int32), shape, n_cls, f.input_exp, (-1.0, 1.0), fx, fx)
    for board in ("mps2_an386", "microbit"):
        r = verify(f, ds, 12, board=board, json=True)
        assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 12, board


@pytest.mark.qemu
@pytest.mark.parametrize("board, fmt", [("mps2_an386", "rows"), ("mps2_an386", "blocks")])
def test_sparse_w1_bit_exact_in_qemu(board, fmt):
    """W1 pruned to 80 % (one-shot at step 30, trained to step 60 by the simulator; single
    weights, or 1 x 4 blocks), then emitted sparse (rows, blocks) and verified for 40 steps on
    the QEMU Cortex-M4 (SMLAD, SMMULR): 0 mismatches. The Cortex-M0 runs drawn models (above)."""
    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain import data
    from tinytrain.sim.simulator import Simulator
    from tinytrain.verify import verify

    ds = data.load("digits")
    m = Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=ds.input_exp - 4,
                   optimizer=SGD(lr=0.05), seed=0, prune={"schedule": "one_shot", "final_sparsity": 0.8,
                                                          "begin_step": 30, "storage": fmt, **_structure(fmt)})
    Simulator(m).train(ds.x_train, ds.y_train, list(range(60)))
    assert {k: (p.fmt, p.nnz) for k, p in S.choose(m).items()} == \
        ({(0, 0): ("rows", 410), (2, 0): ("rows", 64)} if fmt == "rows" else
         {(0, 0): ("blocks", 408), (2, 0): ("blocks", 64)})  # 102 of 512 blocks, 16 of 80 kept
    r = verify(m, ds, 40, board=board, json=True)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 40
