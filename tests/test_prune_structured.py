"""Structured pruning (graph/prune_groups.py = kernels/prune.py group twins = tt_prune_group.c)
and shrinking (graph/convert.shrink).

The unit criterion's three twins on drawn tensors (every store dtype, many ties, extreme
values, several layers ranked together with shifts and multipliers); models trained with
structured pruning by the reference, the numba simulator and the C (UBSan) side by side, every
step, on drawn graphs and schedules; shrink on drawn graphs: the same logits (values and
exponent) as the masked model on drawn inputs, then the smaller model trains three-way equal;
the CLI; the emitted C; the refusals.
"""
from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.graph import prune as P
from tinytrain.graph import prune_groups as PG
from tinytrain.graph.conv import Conv2d, MaxPool2d
from tinytrain.graph.convert import ShrinkError, shrink
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.optim import SGD
from tinytrain.kernels import prune as K
from tinytrain.sim.simulator import Simulator

from .conftest import examples
from .test_exactness import _data, any_graph, any_optimizer, three_way
from .test_prune import DTYPES, prune_configs


@st.composite
def unit_tensors(draw):
    """A ranked store (any dtype, few distinct magnitudes: ties) cut into units: rows of `row`
    elements, each row one unit (neurons, channels: row = inner) or cut into units of `inner`,
    the last of a row shorter when inner does not divide it (1 x 4 blocks: inner 4, row K)."""
    dt = draw(st.sampled_from(list(DTYPES)))
    lo, hi = DTYPES[dt]
    rows, inner = draw(st.integers(1, 12)), draw(st.integers(1, 9))
    row = draw(st.sampled_from([inner, draw(st.integers(1, 11))]))
    units = rows * -(-row // inner)
    spread = draw(st.sampled_from([1, 3, hi]))
    vals = draw(st.lists(st.one_of(st.integers(-spread, spread), st.sampled_from([lo, hi, 0])),
                         min_size=rows * row, max_size=rows * row))
    return np.array(vals, dtype=dt), units, inner, row


def _c_group_select(ffi, lib, parts, shifts, mults, k):
    """tt_prune_group_select on [w0, b0, w1, b1, ...]: each ranked store followed by an int32
    follower of one element per unit (a bias)."""
    keep, n = [], 2 * len(parts)
    t, g = ffi.new("tt_prune_tensor[]", n), ffi.new("tt_prune_group[]", n)
    for j, ((v, units, inner, row), sh, mult) in enumerate(zip(parts, shifts, mults)):
        for pos, (arr, inn, rw) in enumerate(((v.copy(), inner, row), (np.arange(1, units + 1, dtype=np.int32), 1, 1))):
            mask = np.full(P.mask_words(arr.size), 0xFFFFFFFF, np.uint32)  # stale bits must be cleared
            keep += [mask, arr]
            t[2 * j + pos] = {"mask": ffi.cast("uint32_t *", ffi.from_buffer(mask)), "n": arr.size,
                              "w": ffi.cast("void *", ffi.from_buffer(arr)), "w_bytes": arr.itemsize,
                              "shift": sh if pos == 0 else 0}
            g[2 * j + pos] = {"units": units, "inner": inn, "lead": 2 * j, "mult": mult if pos == 0 else 1, "row": rw}
    lib.tt_prune_group_select(t, g, n, k)
    return keep


@settings(max_examples=100, deadline=None)
@given(st.lists(unit_tensors(), min_size=1, max_size=3), st.lists(st.integers(0, 20), min_size=3, max_size=3),
       st.lists(st.integers(1, 6), min_size=3, max_size=3), st.data())
def test_unit_criterion_reference_numba_c_equal(clib_ubsan, parts, shifts, mults, data):
    """The k units with the smallest ((L1 * mult) << shift, tensor, unit), exactly k; the
    followers' masks follow their lead's units; numba (one norm array) and C (no buffer) equal
    the reference, and the C zeroes what it prunes. Units are whole rows or blocks of a row
    (the last one shorter when the block does not divide the row)."""
    ffi, lib = clib_ubsan
    shifts, mults = shifts[:len(parts)], mults[:len(parts)]
    total = sum(u for _, u, _, _ in parts)
    k = data.draw(st.integers(0, total))
    cuts = [(inner, row) for _, _, inner, row in parts]
    ref = PG.select_units([v for v, _, _, _ in parts], [u for _, u, _, _ in parts], shifts, mults, k, cuts)
    assert sum(int(r.sum()) for r in ref) == k
    norms = np.concatenate([PG.norms(v, u, s, m, inner, row) for (v, u, inner, row), s, m in zip(parts, shifts, mults)])
    for v, u, inner, row in parts:  # the units' norms: sums over unit_of's elements
        idx = PG.unit_of(v.size, inner, row)
        assert np.array_equal(PG.norms(v, u, 0, 1, inner, row),
                              [int(np.abs(v[idx == g].astype(np.int64)).sum()) for g in range(u)])
    chosen = np.concatenate(ref)
    if 0 < k < total:  # nothing kept is smaller; ties went to the lower (tensor, unit)
        assert norms[chosen].max() <= norms[~chosen].min()
        tied = np.flatnonzero(norms == norms[chosen].max())
        assert list(chosen[tied]) == sorted(chosen[tied], reverse=True)
    nb_norms = np.empty(total, np.int64)
    off = 0
    for (v, u, inner, row), s, m in zip(parts, shifts, mults):
        K.prune_group_norms(v, inner, row, m, s, nb_norms, off)
        off += u
    assert np.array_equal(nb_norms, norms)
    sel = np.zeros(total, np.uint8)
    K.prune_select_mags(nb_norms, k, sel)
    keep = _c_group_select(ffi, lib, parts, shifts, mults, k)
    off = 0
    for j, ((v, u, inner, row), r) in enumerate(zip(parts, ref)):
        want_w, want_b = P.pack(r[PG.unit_of(v.size, inner, row)]), P.pack(r)
        for inn, rw, n, want, (mask, arr) in ((inner, row, v.size, want_w, keep[4 * j:4 * j + 2]),
                                              (1, 1, u, want_b, keep[4 * j + 2:4 * j + 4])):
            nb = np.zeros_like(want)
            K.prune_group_mask_from(sel, off, n, inn, rw, nb)
            assert np.array_equal(nb, want) and np.array_equal(mask, want), j
            assert not arr[P.unpack(want, arr.size)].any()
        off += u


def _check_pruned(m):
    """Every pruned element is zero in every slot; after the last event of a unit the count is
    exact: single weights for a "weights" unit, units for a structured one."""
    tab = m.prune_table
    for u, (a, b) in enumerate(tab.units):
        total = 0
        for j in range(a, b):
            li, pi = tab.keys[j]
            p = m.layers[li].params[pi]
            pruned = P.unpack(m.masks[(li, pi)], p.data.size)
            g = tab.groups[j]
            total += int(pruned.sum()) // (1 if g is None else g[1]) if g is None or g[2] == j else 0
            for arr in (p.data, m.master.get((li, pi)), m.accum.get((li, pi)), m.velocity.get((li, pi))):
                if arr is not None:
                    assert not arr.reshape(-1)[pruned].any(), (li, pi)
        done = [r for r in range(tab.steps.size) if tab.steps[r] < m.meta[1] and tab.zeros[r, u] >= 0]
        if done:
            assert total == tab.zeros[done[-1], u]


def _cnn(prune, opt=None, seed=3, c=(6, 8)):
    """conv-bn-relu-pool, conv-bn-relu, flatten, dense-relu, dense: every structure applies."""
    return Sequential([Conv2d(c[0], 3, padding="same"), BatchNorm(), ReLU(), MaxPool2d(2),
                       Conv2d(c[1], 3, padding="same"), BatchNorm(), ReLU(), Flatten(), Dense(5), ReLU(), Dense(3)],
                      input_shape=(6, 6, 1), input_exp=-7, seed=seed, optimizer=opt or SGD(lr=0.05), prune=prune)


def test_units_table_and_what_is_pruned_with_them():
    """Per layer: the weights rank, the bias and the batch norm's gamma/beta follow; the count is
    round(s * units), at most units - 1; the last dense layer (the outputs) is skipped; global
    ranks the covered layers together with multipliers lcm / inner."""
    m = _cnn({"schedule": "one_shot", "final_sparsity": 0.99, "structure": "channels"})
    tab = m.prune_table
    assert tab.keys == [(0, 0), (0, 1), (1, 0), (1, 1), (4, 0), (4, 1), (5, 0), (5, 1)]
    assert tab.units == [(0, 4), (4, 8)] and tab.zeros.tolist() == [[5, 7]]  # a layer keeps one unit
    assert tab.groups[:4] == [(6, 9, 0, 1, 9), (6, 1, 0, 1, 1), (6, 1, 0, 1, 1), (6, 1, 0, 1, 1)]
    assert _cnn({"schedule": "one_shot", "final_sparsity": 0.5, "structure": "neurons"}).prune_table.keys == [(8, 0), (8, 1)]
    g = _cnn({"schedule": "one_shot", "final_sparsity": 0.5, "structure": "filters", "scope": "global"}).prune_table
    assert g.units == [(0, 8)] and g.zeros.tolist() == [[7]]  # round(0.5 * 14)
    assert [x[3] for x in g.groups] == [6, 1, 1, 1, 1, 1, 1, 1]  # lcm(9, 54) / 9, / 54
    mixed = _cnn({0: {"schedule": "one_shot", "final_sparsity": 0.5, "structure": "channels"},
                  8: {"schedule": "one_shot", "final_sparsity": 0.5}})
    assert mixed.prune_table.keys == [(8, 0), (0, 0), (0, 1), (1, 0), (1, 1)]  # structured units last
    assert not mixed.prune_table.structured(0) and mixed.prune_table.structured(1)


@pytest.mark.parametrize("structure, scope, opt", [
    ("channels", "layer", SGD(lr=0.05, momentum=0.9, master_weights=True)),
    ("filters", "global", SGD(lr=0.05, batch_size=2, stochastic_rounding=True)),
    ("neurons", "layer", SGD(lr=0.05, momentum=0.9, batch_size=2, weight_decay=1e-3)),
], ids=["channels-momentum-master", "global-batch-sr", "neurons-momentum-batch-wd"])
def test_cnn_three_way_through_the_schedule(structure, scope, opt):
    """Reference = numba = C every step through a polynomial schedule; then every pruned unit
    is zero in every slot of its weights, bias and batch norm, and the count is exact."""
    m = _cnn({"schedule": "polynomial", "final_sparsity": 0.5, "end_step": 4, "frequency": 2,
              "structure": structure, "scope": scope}, opt)
    x, y = _data(8, (6, 6, 1), 3, 1)
    three_way(m, x, y, epochs=2)
    _check_pruned(m)
    units = PG.pruned_units(m)
    for j, key in enumerate(m.prune_table.keys):  # the followers' masks are their lead's units
        li, pi = key
        lead = m.prune_table.keys[m.prune_table.groups[j][2]]
        assert np.array_equal(P.unpack(m.masks[key], m.layers[li].params[pi].data.size).reshape(
            units[lead[0]].size, -1)[:, 0], units[lead[0]])


def test_neurons_direct_update_keeps_the_bias_zero():
    """Direct SGD updates a dense layer's weights and bias in one fused C call; a pruned
    neuron's bias must be re-zeroed after it too (no ReLU after the layer: its error is not 0)."""
    m = Sequential([Dense(6), Dense(3)], input_shape=(5,), input_exp=-5, optimizer=SGD(lr=0.2, master_weights=True),
                   prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 2, "structure": "neurons"})
    x, y = _data(8, (5,), 3, 5)
    three_way(m, x, y, epochs=1)
    _check_pruned(m)
    assert PG.pruned_units(m)[0].sum() == 3 and not m.layers[0].params[1].data[PG.pruned_units(m)[0]].any()


def _structured_draw(data):
    """A drawn graph and optimizer with a structured prune object (the model's, or a layer's on a
    layer it applies to), a schedule over the run."""
    shape, layers, n_cls = data.draw(any_graph())
    head = max(i for i, l in enumerate(layers) if l.kind == "dense")  # a hidden dense layer before the head
    layers.insert(head, Dense(data.draw(st.integers(2, 8))))
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = data.draw(any_optimizer(probe.layers))
    n = data.draw(st.integers(4, 8))
    steps = 2 * n // opt.batch_size
    convs = any(l.kind in P.STRUCTURES["channels"] for l in layers)
    cfg = {**data.draw(prune_configs(steps, glob=True)),
           "structure": data.draw(st.sampled_from(["neurons", "channels", "filters"] if convs else ["neurons"]))}
    if cfg["structure"] != "neurons" and data.draw(st.booleans()):
        cfg["criterion"] = "gamma"  # layers without a batch norm after them are skipped
    try:
        learning = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, optimizer=copy.deepcopy(opt),
                              prune=cfg)
    except ModelError as exc:  # no layer the object covers (frozen, no batch norm, coupled): all of them train
        assert str(exc).startswith(("prune", "layer")) and "prune" in str(exc), exc
        cfg.pop("criterion", None)
        opt = dataclasses.replace(opt, train="all")
        learning = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, optimizer=copy.deepcopy(opt),
                              prune={**cfg, "structure": "neurons"})
        cfg["structure"] = "neurons"
    own = sorted(PG.pruned_units(learning))  # the layers the model's object prunes
    prune = cfg
    if own and cfg.get("scope") != "global" and data.draw(st.booleans()):  # a layer's own object
        prune = {data.draw(st.sampled_from(own)): cfg}
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), prune=prune)
    return ref, _data(n, shape, n_cls, data.draw(st.integers(0, 2**16)))


@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_structured_training_and_shrink_reference_sim_c_equal(data):
    """Drawn graphs x optimizers x schedules x structures and criteria: reference = numba = C
    every step, every pruned element zero in every slot, the units count exact; then, the
    schedule over, shrink gives the masked model's logits (values and exponent) on drawn inputs
    with fewer parameters, and the smaller model trains with reference = numba = C."""
    ref, (x, y) = _structured_draw(data)
    three_way(ref, x, y)
    tab = ref.prune_table
    if tab is None:
        return
    _check_pruned(ref)
    if int(tab.steps[-1]) >= int(ref.meta[1]) or any(u.all() for u in PG.pruned_units(ref).values()):
        with pytest.raises(ShrinkError):
            shrink(ref)
        return
    small = shrink(ref)
    assert small.prune_table is None and not small.masks
    removed = sum(int(u.sum()) for u in PG.pruned_units(ref).values())
    assert small.param_count() < ref.param_count() or removed == 0
    xt, _ = _data(12, ref.input_shape, 2, data.draw(st.integers(0, 2**16)))
    for v in xt:
        a, ea, _ = ref.ref_forward(v)
        b, eb, _ = small.ref_forward(v)
        assert ea == eb and np.array_equal(a, b)
    three_way(small, x, y, epochs=1)


def test_shrink_w3_shape_and_state():
    """W3's layer stack at 50 % channels: 8 -> 4 and 16 -> 8 filters, the second conv and the
    dense head sliced on their inputs, batch-norm statistics and every optimizer slot carried."""
    from tinytrain import data
    from tinytrain.graph.models import build_model

    ds = data.load("digits-image")
    m = build_model("digits-cnn", ds, prune={"schedule": "one_shot", "final_sparsity": 0.5,
                                             "structure": "channels"})
    sim = Simulator(m)
    sim.train(ds.x_train, ds.y_train, list(range(30)))
    s = shrink(m)
    assert [tuple(l.params[0].data.shape) for l in s.layers if l.params and l.kind != "batchnorm"] == \
        [(4, 3, 3, 1), (8, 3, 3, 4), (10, 32)]
    assert s.layers[1].params[2].data.shape == (4,) and s.config()["layers"][4]["filters"] == 8
    keep0 = np.flatnonzero(~PG.pruned_units(m)[0])
    assert np.array_equal(s.layers[1].params[2].data, m.layers[1].params[2].data[keep0])  # running mean
    assert s.meta.tolist() == m.meta.tolist()
    assert list(Simulator(m).predict(ds.x_test)) == list(Simulator(s).predict(ds.x_test))


def test_refusals_name_the_field():
    """A layer's structured prune on a layer it cannot shrink, a frozen follower; shrink before
    the schedule ends, without structured pruning, or mixed with single weights."""
    one = {"schedule": "one_shot", "final_sparsity": 0.5}
    with pytest.raises(ModelError, match=r"layer 10 \(dense\): prune: structure \"neurons\": this layer cannot "
                                         r"shrink: its units are the model's outputs"):
        _cnn({10: {**one, "structure": "neurons"}})
    with pytest.raises(ModelError, match=r"layer 0 \(conv2d\): prune: structure \"neurons\" prunes dense layers; "
                                         r"for this layer use \"channels\""):
        _cnn({0: {**one, "structure": "neurons"}})
    with pytest.raises(ModelError, match=r"layer 1 \(batchnorm\) gamma does not learn"):
        _cnn({0: {**one, "structure": "channels"}}, SGD(lr=0.05, train=[0, 4, 5, 8, 10]))
    from tinytrain.graph.residual import Residual
    with pytest.raises(ModelError, match="couples the channels"):
        Sequential([Dense(4), Residual([Dense(4)]), Dense(2)], input_shape=(3,), prune={0: {**one, "structure": "neurons"}})
    with pytest.raises(ModelError, match="does not prune inside residual blocks"):
        Sequential([Dense(4), Residual([Dense(4)]), Dense(2)], input_shape=(3,), prune={1: {**one, "structure": "neurons"}})
    m = _cnn({**one, "begin_step": 3, "structure": "channels"})
    with pytest.raises(ShrinkError, match=r"1 event\(s\) left \(the last at optimizer step 3, the model is at step 0\)"):
        shrink(m)
    with pytest.raises(ShrinkError, match="no structured pruning"):
        shrink(_cnn(one))
    mixed = _cnn({0: {**one, "structure": "channels"}, 8: one})
    mixed.meta[1] = 1
    with pytest.raises(ShrinkError, match="also prunes single weights"):
        shrink(mixed)


def test_emitted_c_structured():
    """The generator emits the unit table and tt_prune_group_step before the step counter
    advances, beside tt_prune_step when single weights are pruned too."""
    from tinytrain.codegen.emit import generate

    src = generate(_cnn({0: {"schedule": "one_shot", "final_sparsity": 0.5, "structure": "channels"},
                         8: {"schedule": "one_shot", "final_sparsity": 0.5}})).source
    assert '#include "tt_prune_group.h"' in src
    assert "static const tt_prune_group tt_model_prune_groups[4] = {" in src
    assert "{.units = 6u, .inner = 9u, .lead = 0u, .mult = 1u, .row = 9u},  /* L0 w */" in src
    assert "{.units = 6u, .inner = 1u, .lead = 0u, .mult = 1u, .row = 1u},  /* L1 beta */" in src
    step = src[src.index("_train_step("):src.index("_predict(")]
    i = step.index("tt_prune_group_step(&tt_model_prune_gschedule, &tt_model_prune[1], tt_model_prune_groups, "
                   "tt_model_meta[1]);")
    assert step.index("tt_prune_step(&tt_model_prune_schedule, tt_model_prune, tt_model_meta[1]);") < i
    assert step.index("tt_model_meta[1] += 1;") > i
    only = generate(_cnn({"schedule": "one_shot", "final_sparsity": 0.5, "structure": "channels"})).source
    assert "tt_prune_step(" not in only and "tt_prune_group_step(" in only


def test_cli_shrink(tmp_path, capsys):
    """train --prune with structure "channels", then `tinytrain shrink`: the same predictions on
    the test set (checked by the command), fewer parameters; the result loads, and --json."""
    from tinytrain import cli
    from tinytrain.graph import io as tio

    pruned, small = tmp_path / "p.tt", tmp_path / "s.tt"
    assert cli.main(["train", "--data", "digits-image", "--model", "digits-cnn", "--epochs", "1", "--out",
                     str(pruned), "--prune", '{"schedule": "one_shot", "final_sparsity": 0.25, "begin_step": 100, '
                     '"structure": "channels"}']) == 0
    capsys.readouterr()
    assert cli.main(["shrink", "--model", str(pruned), "--out", str(small), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["layers"] == {"0": {"kind": "conv2d", "units": 8, "kept": 6},
                             "4": {"kind": "conv2d", "units": 16, "kept": 12}}
    assert out["checked"] == {"data": "digits-image", "samples": 360, "same_predictions": True}
    m, _ = tio.load(small)
    assert m.param_count() == out["params_after"] < out["params"] and m.layers[4].filters == 12
    assert cli.main(["shrink", "--model", str(pruned), "--out", str(small)]) == 2  # exists: --force
    assert cli.main(["shrink", "--model", str(pruned), "--out", str(small), "--force", "--data", "none"]) == 0
    assert "6 of 8 units kept" in capsys.readouterr().out


@pytest.mark.qemu
@pytest.mark.parametrize("board", ["mps2_an386", "microbit"])
def test_shrunk_model_bit_exact_in_qemu(tmp_path, board):
    """A shrunk CNN builds and verifies on the QEMU Cortex-M4 and the Cortex-M0 (micro:bit: 16 KB
    of RAM, the masked W3 only without the load shadow) like any model (and the masked one
    before it, with its unit table in the firmware), 0 mismatches."""
    import shutil

    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain import data
    from tinytrain.graph.models import build_model
    from tinytrain.verify import verify

    ds = data.load("digits-image")
    m = build_model("digits-cnn", ds, prune={"schedule": "polynomial", "final_sparsity": 0.5, "end_step": 40,
                                             "frequency": 10, "structure": "channels"})
    r = verify(m.copy(), ds, 60, board=board)  # through the schedule on the board
    assert r["mismatches"] == 0 and r["steps"] == 60
    Simulator(m).train(ds.x_train, ds.y_train, list(range(60)))
    r = verify(shrink(m), ds, 30, board=board)
    assert r["mismatches"] == 0 and r["steps"] == 30


def test_device_commands_shrink_a_finished_structured_pruning(tmp_path, capsys):
    """codegen (as build, verify and flash: they load through the same function) emits the shrunk
    layers of a model whose structured pruning is over, says so on stderr, and --keep-masks keeps
    the full layers and their unit table; a schedule still running keeps them too."""
    from tinytrain import cli, data
    from tinytrain.graph import io as tio
    from tinytrain.graph.convert import for_device
    from tinytrain.graph.models import build_model

    ds = data.load("digits-image")
    done, running = tmp_path / "done.tt", tmp_path / "running.tt"
    for out, begin in ((done, 0), (running, 10**6)):
        m = build_model("digits-cnn", ds, prune={"schedule": "one_shot", "final_sparsity": 0.25, "begin_step": begin,
                                                 "structure": "channels"})
        Simulator(m).train(ds.x_train, ds.y_train, list(range(20)))
        tio.save(m, out, {"dataset": "digits-image"})
    m, _ = tio.load(done)
    small, changed = for_device(m)
    assert changed == [(0, "conv2d", 8, 6), (4, "conv2d", 16, 12)]
    assert list(Simulator(m).predict(ds.x_test)) == list(Simulator(small).predict(ds.x_test))
    assert for_device(tio.load(running)[0])[1] == []
    assert cli.main(["codegen", "--model", str(done), "--out", str(tmp_path / "g")]) == 0
    err = capsys.readouterr().err
    assert "shrunk the structured-pruned layers for the device: layer 0 (conv2d) 8 -> 6, layer 4 (conv2d) 16 -> 12" in err
    src = (tmp_path / "g" / "tt_model.c").read_text()
    assert "tt_prune_group_step(" not in src and "tt_model_prune_groups" not in src
    assert cli.main(["codegen", "--model", str(done), "--out", str(tmp_path / "k"), "--keep-masks"]) == 0
    assert "shrunk" not in capsys.readouterr().err
    assert "tt_model_prune_groups" in (tmp_path / "k" / "tt_model.c").read_text()
    assert cli.main(["codegen", "--model", str(running), "--out", str(tmp_path / "r")]) == 0
    assert "shrunk" not in capsys.readouterr().err
    assert "tt_prune_group_step(" in (tmp_path / "r" / "tt_model.c").read_text()
    from tinytrain.cli_device import _load_model

    for keep in (False, True):  # flash parses the same model options and loads through _load_model
        args = cli.build_parser().parse_args(["flash", "--board", "nucleo_f446re", "--port", "/dev/null",
                                              "--model", str(done)] + ["--keep-masks"] * keep)
        widths = [lay.params[0].data.shape[0] for lay in _load_model(args)[0].layers if lay.kind == "conv2d"]
        assert widths == ([8, 16] if keep else [6, 12])
