"""Pruning by 1 x 4 blocks ("structure": "blocks", graph/prune_groups.py) and their sparse
storage ("storage": "blocks", codegen/sparse.py, firmware tt_sparse_blocks.c).

Drawn graphs x optimizers x schedules pruned by blocks: reference = numba = C every step
through the schedule, every block kept or pruned whole, the block count exact; drawn MLPs
(input sizes 4 does not divide included) x sparsities x optimizers, the schedule over, stored
by blocks: reference = numba = C (UBSan) every step; the block code; the refusals. The unit
criterion's three twins on drawn block cuts are in test_prune_structured.py, the DSP path, the
state blob's view and the QEMU runs in test_sparse.py.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from tinytrain.codegen import sparse as S
from tinytrain.codegen.emit import CodegenError, generate
from tinytrain.graph import prune as P
from tinytrain.graph.conv import Conv1d
from tinytrain.graph.convert import ShrinkError, for_device, shrink
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.prune_groups import pruned_units
from tinytrain.graph.state import state_blob

from .conftest import examples
from .test_exactness import _data, any_graph, any_optimizer, three_way
from .test_prune import prune_configs
from .test_sparse import _past_schedule, mlp_cases


def _blocks_of(m, key):
    """Per block of a pruned Dense weight tensor: how many of its weights the mask prunes, and its size."""
    li, pi = key
    N, K = m.layers[li].params[pi].data.shape
    B = -(-K // P.BLOCK)
    pruned = np.zeros((N, B * P.BLOCK), int)
    pruned[:, :K] = P.unpack(m.masks[key], N * K).reshape(N, K)
    return pruned.reshape(N * B, P.BLOCK).sum(axis=1), np.tile(np.minimum(P.BLOCK, K - P.BLOCK * np.arange(B)), N)


def _check_blocks(m):
    """Every block kept or pruned whole, zero in every slot; after a unit's last event so far
    its pruned blocks are the table's count."""
    tab = m.prune_table
    for u, (a, b) in enumerate(tab.units):
        total = 0
        for key in tab.keys[a:b]:
            count, size = _blocks_of(m, key)
            assert ((count == 0) | (count == size)).all(), key
            total += int((count > 0).sum())
            pruned = P.unpack(m.masks[key], m.layers[key[0]].params[key[1]].data.size)
            for arr in (m.layers[key[0]].params[key[1]].data, m.master.get(key), m.accum.get(key), m.velocity.get(key)):
                if arr is not None:
                    assert not arr.reshape(-1)[pruned].any(), key
        done = [r for r in range(tab.steps.size) if tab.steps[r] < m.meta[1] and tab.zeros[r, u] >= 0]
        if done:
            assert total == tab.zeros[done[-1], u]


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_blocks_through_the_schedule_reference_sim_c_equal(data):
    """Drawn graphs x optimizers x schedules (per layer or global) pruned by 1 x 4 blocks: the
    masks chosen by the reference, numba and the C (tt_prune_group.c) agree every step, blocks
    pruned whole and counted exactly."""
    shape, layers, n_cls = data.draw(any_graph())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = data.draw(any_optimizer(probe.layers))
    n = data.draw(st.integers(4, 8))
    cfg = {**data.draw(prune_configs(2 * n // opt.batch_size, glob=True)), "structure": "blocks"}
    try:
        ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                         seed=data.draw(st.integers(0, 1000)), prune=cfg)
    except ModelError as exc:  # every dense layer frozen
        assert "prune" in str(exc), exc
        return
    x, y = _data(n, shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)
    if ref.prune_table is not None:
        _check_blocks(ref)


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_blocks_storage_reference_sim_c_equal(data):
    """Drawn MLPs (any input size: rows that end in a short block) x sparsities x optimizer
    options, the schedule over: every pruned tensor stored by blocks (auto picks it), and
    reference = numba = C (the block kernels, UBSan) every step."""
    shape, layers, n_cls, opt, prune = data.draw(mlp_cases())
    prune = {**prune, "structure": "blocks", "storage": data.draw(st.sampled_from(["auto", "blocks", "sparse"]))}
    try:
        ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                         seed=data.draw(st.integers(0, 1000)), prune=prune)
    except ModelError as exc:  # no dense weights learn: the object covers no layer
        assert "prune" in str(exc), exc
        return
    x, y = _data(data.draw(st.integers(4, 7)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(ref, x, y)
    chosen = S.choose(ref)
    assert set(chosen) == set(ref.prune_table.keys) and {p.fmt for p in chosen.values()} == {"blocks"}
    _check_blocks(ref)
    three_way(ref, x, y, epochs=1)
    _check_blocks(ref)


@pytest.mark.parametrize("opt", [SGD(lr=0.2, momentum=0.9, batch_size=3, stochastic_rounding=True),
                                 SGD(lr=0.05, master_weights=True, stochastic_rounding=True, weight_decay=1e-3),
                                 SGD(lr=0.3)], ids=["momentum-batch-sr", "master-sr-wd", "fused"])
def test_blocks_options_exact(opt):
    """Fixed cases: 37 inputs (a short block of one weight ends every row), 90 %: the element
    walks (PRNG draws of the pruned weights, masters, accumulators, momentum) and the fused
    update over the block code; three-way equal; the short blocks are ranked and kept too."""
    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(37,), input_exp=-7, optimizer=opt, seed=3,
                   prune={"schedule": "polynomial", "final_sparsity": 0.9, "begin_step": 0, "end_step": 2,
                          "frequency": 1, "structure": "blocks"})
    x, y = _data(9, (37,), 4, 5)
    _past_schedule(m, x, y)
    chosen = S.choose(m)
    assert {p.fmt for p in chosen.values()} == {"blocks"}
    assert {k: int(P.zeros_for(0.9, m.prune_table.groups[j][0])) for j, k in enumerate(m.prune_table.keys)} == \
        {(0, 0): 360, (2, 0): 36}  # of 40 x 10 and 4 x 10 blocks
    three_way(m, x, y)


def test_block_code():
    """Per row its kept blocks, then the rows' kept block indices; the short block of K = 10 is
    block 2 (2 weights); whole_blocks tells a block mask from another."""
    kept = np.zeros((3, 10), bool)
    kept[0, 0:4] = kept[0, 8:10] = True
    kept[2, 4:8] = True
    assert S.block_code(kept).tolist() == [2, 0, 1, 0, 2, 1]
    assert S.whole_blocks(kept)
    pk = S.Packed(P.pack(~kept), kept.shape, "blocks")
    assert pk.device.tolist() == [2, 0, 1, 0, 2, 1] and pk.nnz == 10
    w = np.arange(30).reshape(3, 10)
    assert pk.pack(w).tolist() == [0, 1, 2, 3, 8, 9, 24, 25, 26, 27]  # element order
    kept[1, 9] = True
    assert not S.whole_blocks(kept)


def test_blocks_table_and_criterion():
    """Units are the blocks of each row (K = 10: 3 a row, the last 2 weights wide); the k blocks
    with the smallest L1 go, ties to the lower block; round(s * blocks) of them."""
    m = Sequential([Dense(2), ReLU(), Dense(2)], input_shape=(10,), input_exp=-7, optimizer=SGD(lr=0.1), seed=0,
                   prune={0: {"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "structure": "blocks"}})
    tab = m.prune_table
    assert tab.keys == [(0, 0)] and tab.groups == [(6, 4, 0, 1, 10)] and tab.zeros.tolist() == [[3]]
    w = m.layers[0].params[0].data
    w[...] = [[1, 1, 1, 1, 9, 9, 9, 9, 2, 2], [0, 0, 0, 4, 5, 5, 5, 5, 1, 1]]
    P.scheduled(m, 0)
    # L1 per block: 4, 36, 4 | 4, 20, 2: the 2, then the first two 4s (blocks 0 and 2)
    pruned = P.unpack(m.masks[(0, 0)], 20).reshape(2, 10)
    assert pruned.tolist() == [[True] * 4 + [False] * 4 + [True] * 2, [False] * 8 + [True] * 2]


def test_blocks_refusals():
    """One line naming the field: gamma with blocks, blocks on a convolution's own object,
    storage "blocks" for single-weight pruning; shrink has nothing to delete; a model object
    over convolutions only."""
    dense = [Dense(8), ReLU(), Dense(3)]
    with pytest.raises(ModelError, match='criterion "gamma" ranks whole channels'):
        Sequential(copy.deepcopy(dense), input_shape=(12,), input_exp=-7,
                   prune={"schedule": "one_shot", "final_sparsity": 0.5, "structure": "blocks", "criterion": "gamma"})
    conv = [Conv1d(4, 3), ReLU(), Flatten(), Dense(3)]
    with pytest.raises(ModelError, match='structure "blocks" prunes dense layers'):
        Sequential(copy.deepcopy(conv), input_shape=(12, 1), input_exp=-7,
                   prune={0: {"schedule": "one_shot", "final_sparsity": 0.5, "structure": "blocks"}})
    weights = Sequential(copy.deepcopy(dense), input_shape=(12,), input_exp=-7, optimizer=SGD(lr=0.1),
                         prune={"schedule": "one_shot", "final_sparsity": 0.5, "storage": "blocks"})
    with pytest.raises(ValueError, match='storage = "blocks": layer 0 .* pruned by 1 x 4 blocks'):
        S.check_storage(weights)  # before training (train, compress): training cannot change it
    m = Sequential(copy.deepcopy(dense), input_shape=(12,), input_exp=-7, optimizer=SGD(lr=0.1),
                   prune={"schedule": "one_shot", "final_sparsity": 0.5, "structure": "blocks"})
    x, y = _data(4, (12,), 3, 1)
    _past_schedule(m, x, y)
    with pytest.raises(ShrinkError, match="1 x 4 blocks"):
        shrink(m)
    assert '#include "tt_sparse_blocks.h"' in generate(m).source
    # single weights pruned: the final mask is not made of whole blocks, so codegen refuses too
    u = Sequential(copy.deepcopy(dense), input_shape=(12,), input_exp=-7, optimizer=SGD(lr=0.1),
                   prune={"schedule": "one_shot", "final_sparsity": 0.5})
    _past_schedule(u, x, y)
    with pytest.raises(CodegenError, match='storage = "blocks"'):
        generate(u, storage="blocks")


def test_emitted_blocks_c():
    """What the generator emits for a block-pruned model once the mask is final: the block code
    in flash (one byte a row and one per kept block), the rows format's structs, the blocks
    kernels, spans flagged as block codes."""
    m = Sequential([Dense(12), ReLU(), Dense(4)], input_shape=(10,), input_exp=-7, optimizer=SGD(lr=0.05),
                   seed=1, prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "structure": "blocks"})
    x, y = _data(4, (10,), 4, 2)
    _past_schedule(m, x, y)
    pk = S.choose(m)[(0, 0)]
    src = generate(m).source
    assert pk.fmt == "blocks" and pk.device.size == 12 + 18  # 12 rows, 18 of 36 blocks kept
    assert '#include "tt_sparse_blocks.h"' in src and "tt_prune_apply" not in src
    assert f"static const uint8_t tt_model_l0_w_mask[{pk.device.size}] = {{" in src
    step = src[src.index("_train_step("):src.index("_predict(")]
    assert "e1 = tt_sparse_blocks_fwd_s8(&CTX, &tt_model_l0_sparse, x, e0, tt_model_a0);" in step
    assert "tt_sparse_blocks_sgd_direct_s16(&sgd, &tt_model_l0_sparse_sgd, " in step
    assert "static const tt_sparse_rows_params tt_model_l0_sparse = {" in src
    assert f"{{tt_model_l0_w, 240u, 0, 0, 2u, 12u, 10u, tt_model_l0_w_mask, 1u, 2u}}," in src


def test_blocks_of_a_four_input_layer_stored_by_blocks():
    """A layer of 4 inputs pruned by 1 x 4 blocks: each block is a whole row, the group has the
    shape of neuron pruning, but the bias is not masked: it is stored by blocks (once refused
    as "structured pruning removes whole units"), three-way equal (a hypothesis draw found it)."""
    m = Sequential([Dense(3)], input_shape=(4,), input_exp=-7, optimizer=SGD(lr=0.05), seed=2,
                   prune={"schedule": "one_shot", "final_sparsity": 0.67, "begin_step": 0, "structure": "blocks",
                          "storage": "sparse"})
    x, y = _data(6, (4,), 3, 5)
    _past_schedule(m, x, y)
    assert {p.fmt for p in S.choose(m).values()} == {"blocks"}
    three_way(m, x, y, epochs=1)


@st.composite
def blocks_dsp_cases(draw):
    """A drawn MLP stored by blocks (any input size: short last blocks, rows of odd alignment), its
    optimizer drawn, or plain SGD at batch 1 (the fused update's fast path) up to steps that
    saturate weights (the guard's exact redo)."""
    shape, layers, n_cls, opt, prune = draw(mlp_cases())
    if draw(st.booleans()):
        opt = SGD(lr=draw(st.sampled_from([0.05, 0.3, 1.0])))
    return shape, layers, n_cls, opt, {**prune, "structure": "blocks", "storage": "blocks"}


def _blocks_model(data):
    """The model of a blocks_dsp_cases draw past its schedule, with its data (None: no dense weight learns)."""
    shape, layers, n_cls, opt, prune = data.draw(blocks_dsp_cases())
    try:
        m = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                       seed=data.draw(st.integers(0, 1000)), prune=prune)
    except ModelError as exc:
        assert "prune" in str(exc), exc
        return None
    x, y = _data(data.draw(st.integers(6, 12)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(m, x, y)
    assert {p.fmt for p in S.choose(m).values()} == {"blocks"}
    return m, x, y


@settings(max_examples=examples(4), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_blocks_dsp_path_drawn_equals_reference(data):
    """The block kernels' Cortex-M4 paths (the forward's and input error's full-block loops, the
    requantization from the OR of the sums, the fused update's guarded rows and their redo; built
    for the host with tt_dsp_emul.h's intrinsics, UBSan) on drawn shapes, sparsities and options
    equal the reference: outputs and state hash every step."""
    from tinytrain.codegen.host import HostModel

    from .conftest import HERE

    case = _blocks_model(data)
    if case is None:
        return
    m, x, y = case
    hm = HostModel(m, sanitize=True, extra_flags=["-DTT_HAVE_DSP=1", f"-I{HERE / 'c'}"])
    for i in range(len(x)):
        assert hm.train_step(x[i], y[i]) == tuple(int(v) for v in m.ref_train_step(x[i], y[i])), i
        assert hm.state_hash() == m.state_hash(), i


@pytest.mark.qemu
@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_blocks_drawn_bit_exact_on_the_m4(data):
    """The same drawn models stored by blocks, verified for 10 steps on the QEMU Cortex-M4
    (mps2_an386: SMLAD, SMLAWB, LDRD/STRD, the Q-flag guard): 0 mismatches."""
    import shutil

    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain.data import Dataset
    from tinytrain.verify import verify

    case = _blocks_model(data)
    if case is None:
        return
    m, x, y = case
    shape, n_cls = m.input_shape, m.layers[-1].out_size
    fx = x.astype(np.float32) / 128
    ds = Dataset("drawn", x, y.astype(np.int32), x, y.astype(np.int32), shape, n_cls, m.input_exp, (-1.0, 1.0), fx, fx)
    r = verify(m, ds, 10, board="mps2_an386", json=True)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 10


def _shrink_changes_nothing(m, x):
    """No pruned units, shrink refused naming the blocks, for_device gives the model itself:
    the same state and the same predictions."""
    assert pruned_units(m) == {}
    with pytest.raises(ShrinkError, match="1 x 4 blocks"):
        shrink(m)
    before, preds = state_blob(m), [m.ref_predict(v) for v in x]
    dev, changed = for_device(m)
    assert changed == [] and dev.layers[0].params[0].data.shape == m.layers[0].params[0].data.shape
    assert state_blob(dev) == before and [dev.ref_predict(v) for v in x] == preds
    assert [l.params[0].data.shape for l in dev.layers if l.params] == [l.params[0].data.shape for l in m.layers if l.params]


@settings(max_examples=examples(20), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_shrink_never_deletes_a_block_pruned_row(data):
    """Blocks are not units of structured shrink. Drawn MLPs whose Dense layers have K in 1..9
    inputs (one block a row or several, the last partial) pruned by 1 x 4 blocks to high
    sparsities, so rows whose every block is pruned occur: shrink and for_device leave the
    state and the predictions as they are. With K = 4 (one block a row) the table's group has
    the shape of a neuron's, and a row whose block was pruned was deleted as a pruned neuron,
    changing the model (its output was its bias, not zero)."""
    k = data.draw(st.integers(1, 9))
    layers = []
    for _ in range(data.draw(st.integers(0, 2))):
        layers += [Dense(data.draw(st.integers(1, 9))), ReLU()]
    n_cls = data.draw(st.integers(2, 5))
    layers.append(Dense(n_cls))
    s = data.draw(st.sampled_from([0.5, 0.75, 0.9, 0.99]))
    prune = {"schedule": data.draw(st.sampled_from(["one_shot", "polynomial"])), "final_sparsity": s,
             "begin_step": 0, "structure": "blocks", "scope": data.draw(st.sampled_from(["layer", "global"]))}
    if prune["schedule"] == "polynomial":
        prune.update(end_step=2, frequency=1)
    m = Sequential(layers, input_shape=(k,), input_exp=-7, optimizer=SGD(lr=0.05), seed=data.draw(st.integers(0, 99)),
                   prune=prune)
    x, y = _data(6, (k,), n_cls, data.draw(st.integers(0, 2**16)))
    _past_schedule(m, x, y)
    _shrink_changes_nothing(m, x)


def test_shrink_of_a_four_input_layer_whose_rows_are_single_blocks():
    """The regression: K = 4, every row one block, half of them pruned; the rows stay."""
    m = Sequential([Dense(6)], input_shape=(4,), input_exp=-7, optimizer=SGD(lr=0.05), seed=2,
                   prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "structure": "blocks"})
    x, y = _data(6, (4,), 6, 5)
    _past_schedule(m, x, y)
    rows = P.unpack(m.masks[(0, 0)], 24).reshape(6, 4)
    assert rows.all(axis=1).sum() == 3  # three rows whose only block is pruned
    _shrink_changes_nothing(m, x)


def test_emitted_unrolled_blocks_forward():
    """A blocks-stored layer whose K 4 divides gets its forward rows unrolled from its code (block
    j of a row: the widened inputs at byte 8 j, the packed weights at the next 8 bytes, w stepped
    past LDRD's 1020-byte range), called under TT_SPARSE_BLOCKS_UNROLL with the generic kernel
    beside it; a K 4 does not divide keeps the generic kernel only."""
    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(64,), input_exp=-7, optimizer=SGD(lr=0.05),
                   seed=1, prune={"schedule": "one_shot", "final_sparsity": 0.1, "begin_step": 0, "structure": "blocks",
                                  "storage": "blocks"})
    x, y = _data(4, (64,), 4, 2)
    _past_schedule(m, x, y)
    packed = S.choose(m)
    code = [int(v) for v in packed[(0, 0)].code]
    src = generate(m).source
    fn = src[src.index("uint32_t tt_model_l0_fwd_rows("):]
    fn = fn[:fn.index("\n}\n")]
    N, first = 40, code[40:40 + code[0]]
    assert f"a = tt_sparse_blocks_bias(b[0], d1); /* row 0: blocks {', '.join(map(str, first))} */" in fn
    assert f"    TT_SPARSE_BLOCKS_MAC(a, xx, {8 * first[0]}, w, 0);" in fn
    assert fn.count("TT_SPARSE_BLOCKS_MAC(") == len(code) - N and fn.count("acc[") == N
    steps = [int(v.split()[-1][:-1]) for v in fn.splitlines() if v.strip().startswith("w += ")]
    assert steps and sum(steps) + 4 * (len(code) - N - sum(s // 4 for s in steps)) == 4 * (len(code) - N)
    assert all(int(v.split(", ")[-1][:-2]) <= 1020 for v in fn.splitlines() if "TT_SPARSE_BLOCKS_MAC(" in v)
    step = src[src.index("_train_step("):src.index("_predict(")]
    assert ("    #if TT_SPARSE_BLOCKS_UNROLL\n    e1 = tt_sparse_blocks_fwd_rows_s8(&CTX, &tt_model_l0_sparse, x, e0, "
            "tt_model_a0, tt_model_l0_fwd_rows);\n    #else\n    e1 = tt_sparse_blocks_fwd_s8(") in step
    if (2, 0) in packed:
        assert "tt_model_l2_fwd_rows" in src  # K = 40
    m10 = Sequential([Dense(6)], input_shape=(10,), input_exp=-7, optimizer=SGD(lr=0.05), seed=1,
                     prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 0, "structure": "blocks",
                            "storage": "blocks"})
    _past_schedule(m10, *_data(4, (10,), 6, 2))
    assert "fwd_rows" not in generate(m10).source


@pytest.mark.qemu
@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@example(K=64, N=32, sparsity=0.8, edges=False, exp=-7, seed=1)  # W1's first layer
@example(K=128, N=20, sparsity=0.0, edges=True, exp=-7, seed=2)  # every block kept, w stepped 4 times
@given(K=st.sampled_from([4, 8, 32, 64, 128]), N=st.integers(1, 48),
       sparsity=st.sampled_from([0.0, 0.5, 0.8, 0.95]), edges=st.booleans(), exp=st.integers(-9, 0),
       seed=st.integers(0, 2**16))
def test_unrolled_blocks_forward_bit_exact_on_the_m4(K, N, sparsity, edges, exp, seed):
    """The unrolled forward (TT_SPARSE_BLOCKS_UNROLL: the generated rows, LDRD at immediate offsets,
    w stepped past 1020 bytes) on the QEMU Cortex-M4 equals the reference for 6 verified steps:
    K 4 divides, drawn N, every block kept (0 %) up to rows with none (95 %), kept weights at
    +-32767 and inputs at -127 / 127 when `edges`, biases near the int32 limits."""
    import shutil

    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain.data import Dataset
    from tinytrain.verify import verify

    m = Sequential([Dense(N), ReLU(), Dense(3)], input_shape=(K,), input_exp=exp, optimizer=SGD(lr=0.05),
                   seed=seed % 1000, prune={"schedule": "one_shot", "final_sparsity": sparsity, "begin_step": 0,
                                            "structure": "blocks", "storage": "blocks"})
    x, y = _data(8, (K,), 3, seed)
    _past_schedule(m, x, y)
    assert S.choose(m)[(0, 0)].fmt == "blocks"
    if edges:
        rng = np.random.default_rng(seed)
        w = m.layers[0].params[0].data
        w[w != 0] = rng.choice(np.array([-32767, 32767], np.int16), int((w != 0).sum()))
        b = m.layers[0].params[1].data
        b[:] = rng.choice(np.array([-(2**31) + 2**20, 2**31 - 2**20, -1, 0, 1], np.int64), b.size).astype(b.dtype)
        x[:, ::2] = np.where(rng.random((len(x), (K + 1) // 2)) < 0.5, -127, 127).astype(np.int8)
    fx = x.astype(np.float32) / 128
    ds = Dataset("drawn", x, y, x, y, (K,), 3, m.input_exp, (-1.0, 1.0), fx, fx)
    r = verify(m, ds, 6, board="mps2_an386", json=True)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 6
