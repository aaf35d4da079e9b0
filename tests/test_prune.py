"""Pruning inside the integer training (tinytrain/graph/prune.py = kernels/prune.py = tt_prune.c).

The criterion's three twins on drawn tensors of every weight dtype (many ties, extreme values);
the schedules' integer tables (TFMOT names, the exact final count round(s * n) reached); and
models trained with pruning by the reference, the numba simulator and the C (UBSan) side by
side, every step, on drawn graphs, schedules, sparsities and optimizer options (momentum,
batch > 1, master weights, stochastic rounding, frozen layers): the masks are in the state hash,
a pruned weight is exactly zero in every slot, and the final zeros count is exact.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.graph import prune as P
from tinytrain.graph.layers import Dense, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.state import state_layout
from tinytrain.kernels import prune as K

from .conftest import examples
from .test_exactness import _data, any_graph, any_optimizer, three_way

DTYPES = {np.int8: (-127, 127), np.int16: (-32767, 32767), np.int32: (-(2**31), 2**31 - 1)}


@st.composite
def tensors(draw):
    dt = draw(st.sampled_from(list(DTYPES)))
    lo, hi = DTYPES[dt]
    n = draw(st.integers(1, 200))
    spread = draw(st.sampled_from([3, 50, hi]))  # few distinct magnitudes: many ties
    vals = draw(st.lists(st.one_of(st.integers(-spread, spread), st.sampled_from([lo, hi, 0, -1, 1])),
                         min_size=n, max_size=n))
    return np.array(vals, dtype=dt), draw(st.integers(0, n))


def _c_select(ffi, lib, v, k):
    mask = np.full(P.mask_words(v.size), 0xFFFFFFFF, np.uint32)  # stale bits must be cleared
    w = v.copy()
    t = ffi.new("tt_prune_tensor *", {"mask": ffi.cast("uint32_t *", ffi.from_buffer(mask)), "n": v.size,
                                      "w": ffi.cast("void *", ffi.from_buffer(w)), "w_bytes": v.itemsize})
    lib.tt_prune_select(t, 1, k)
    return mask, w


@settings(max_examples=300, deadline=None)
@given(tensors())
def test_criterion_reference_numba_c_equal(clib_ubsan, case):
    """The k smallest by (|v|, index), exactly k of them; numba and C (binary search over
    magnitudes, no buffer) equal the reference (a sort); the C zeroes what it prunes."""
    ffi, lib = clib_ubsan
    v, k = case
    ref = P.select(v, k)
    pruned = P.unpack(ref, v.size)
    assert pruned.sum() == k
    if 0 < k < v.size:  # nothing kept is smaller, and ties went to the lower index
        mag = np.abs(v.astype(np.int64))
        assert mag[pruned].max() <= mag[~pruned].min()
        t = mag[pruned].max()
        tied = np.flatnonzero(mag == t)
        assert list(pruned[tied]) == sorted(pruned[tied], reverse=True)
    nb = np.full_like(ref, 0xFFFFFFFF)
    K.prune_select(nb, v, k)
    assert np.array_equal(nb, ref)
    mask, w = _c_select(ffi, lib, v, k)
    assert np.array_equal(mask, ref)
    expect = v.copy()
    expect[pruned] = 0
    assert np.array_equal(w, expect)


@settings(max_examples=200, deadline=None)
@given(st.lists(tensors(), min_size=1, max_size=3), st.lists(st.integers(0, 31), min_size=3, max_size=3),
       st.data())
def test_global_criterion_reference_numba_c_equal(clib_ubsan, parts, shifts, data):
    """Scope "global": the k smallest (|v| << shift, tensor, index) over several tensors of mixed
    dtypes; numba (one magnitude array) and C (walking the tensors, 64-bit magnitudes) equal
    the reference."""
    ffi, lib = clib_ubsan
    vs = [v for v, _ in parts]
    shifts = shifts[:len(vs)]
    N = sum(v.size for v in vs)
    k = data.draw(st.integers(0, N))
    ref = P.select_group(vs, shifts, k)
    assert sum(int(P.unpack(m, v.size).sum()) for m, v in zip(ref, vs)) == k
    mags = np.empty(N, np.int64)
    off = 0
    for v, sh in zip(vs, shifts):
        K.prune_mags(v, sh, mags, off)
        off += v.size
    sel = np.zeros(N, np.uint8)
    K.prune_select_mags(mags, k, sel)
    off = 0
    keep = []  # the C structs point into these
    arr = ffi.new("tt_prune_tensor[]", len(vs))
    for j, (v, sh) in enumerate(zip(vs, shifts)):
        nb = np.zeros(P.mask_words(v.size), np.uint32)
        K.prune_mask_from(sel, off, v.size, nb)
        assert np.array_equal(nb, ref[j]), j
        off += v.size
        mask, w = np.full(P.mask_words(v.size), 0xFFFFFFFF, np.uint32), v.copy()
        keep += [mask, w]
        arr[j] = {"mask": ffi.cast("uint32_t *", ffi.from_buffer(mask)), "n": v.size,
                  "w": ffi.cast("void *", ffi.from_buffer(w)), "w_bytes": v.itemsize, "shift": sh}
    lib.tt_prune_select(arr, len(vs), k)
    for j, v in enumerate(vs):
        assert np.array_equal(keep[2 * j], ref[j]), j
        assert not keep[2 * j + 1][P.unpack(ref[j], v.size)].any()


@pytest.fixture(scope="session")
def prune_m0_lib():
    """tt_prune built as for the Cortex-M0 (no unaligned word access: words only on arrays that
    start on one; the software ctz), UBSan on."""
    from tinytrain.device import cbuild

    from .conftest import HERE, runtime_cdef

    srcs = cbuild.runtime_sources(["tt_fixedpoint", "tt_prune", "tt_prune_group"])
    return cbuild.compile_shared([*srcs, HERE / "c" / "tt_test_shim.c"], runtime_cdef(),
                                 extra_flags=["-DTT_WORD_ACCESS=0", "-DTT_PRUNE_SOFT_CTZ=1"], sanitize=True,
                                 name="ttrt_prune_m0")


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_apply_zeroes_exactly_the_masked_elements(clib_ubsan, prune_m0_lib, data):
    """tt_prune_apply (word-at-a-time AND masks for int8/int16 where word access is cheap or the
    array starts on a word, set bits otherwise) against the rule: every masked element of w and of
    each slot is zero, every other element and every byte outside the arrays untouched; drawn
    lengths (off the words), sparsities (none, all, between), dtypes and starts off the word
    alignment; the host build and the Cortex-M0's rules."""
    ffi, lib = data.draw(st.sampled_from([clib_ubsan, prune_m0_lib]))
    n = data.draw(st.integers(1, 140))
    dt = data.draw(st.sampled_from([np.int8, np.int16, np.int32]))
    density = data.draw(st.sampled_from([0.0, 0.2, 0.5, 0.8, 0.97, 1.0]))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    pruned = rng.random(n) < density
    mask = P.pack(pruned)
    lo, hi = DTYPES[dt]
    off = data.draw(st.integers(0, 3))  # elements before the array: its start off a word
    pad = 5
    buf = rng.integers(lo, hi + 1, size=off + n + pad, dtype=np.int64).astype(dt)
    buf[buf == 0] = 1
    slots = [rng.integers(-2**31, 2**31, size=n + pad, dtype=np.int64).astype(np.int32) for _ in range(2)]
    before = [buf.copy()] + [s.copy() for s in slots]
    w = buf[off:off + n]
    t = ffi.new("tt_prune_tensor *", {
        "mask": ffi.cast("uint32_t *", ffi.from_buffer(mask)), "n": n, "w": ffi.cast("void *", ffi.from_buffer(w)),
        "w_bytes": np.dtype(dt).itemsize, "master": ffi.cast("void *", ffi.from_buffer(slots[0])), "master_bytes": 4,
        "acc": ffi.cast("int32_t *", ffi.from_buffer(slots[1]))})
    lib.tt_prune_apply(t)
    want = before[0].copy()
    want[off:off + n][pruned] = 0
    assert np.array_equal(buf, want)
    for s, b in zip(slots, before[1:]):
        b[:n][pruned] = 0
        assert np.array_equal(s, b)


def test_mask_bitmap_layout():
    """Bit i % 32 of word i // 32, padding bits 0; numba's zeroing follows the bitmap."""
    b = np.zeros(70, bool)
    b[[0, 31, 32, 69]] = True
    m = P.pack(b)
    assert m.dtype == np.uint32 and list(m) == [0x80000001, 1, 1 << 5]
    assert np.array_equal(P.unpack(m, 70), b)
    a = np.arange(1, 71, dtype=np.int16)
    K.prune_zero(m, a)
    assert np.flatnonzero(a == 0).tolist() == [0, 31, 32, 69]


def test_schedules_tables():
    """TFMOT's formulas at build time; the last event is end_step, at exactly round(s_f * n)."""
    p = P.Prune("polynomial", final_sparsity=0.8, begin_step=10, end_step=45, frequency=10)
    ev = p.events()
    assert [t for t, _ in ev] == [10, 20, 30, 40, 45]  # end_step added: final sparsity reached
    assert ev[0][1] == 0.0 and ev[-1][1] == 0.8
    assert ev[1][1] == pytest.approx(0.8 + (0 - 0.8) * (1 - 10 / 35) ** 3)
    assert P.zeros_for(0.8, 2048) == 1638 and P.zeros_for(0.5, 3) == 2 and P.zeros_for(0.9, 320) == 288
    assert P.Prune("one_shot", final_sparsity=0.5, begin_step=7).events() == [(7, 0.5)]
    assert P.Prune("constant", target_sparsity=0.5, begin_step=2, end_step=8, frequency=3).events() == \
        [(2, 0.5), (5, 0.5), (8, 0.5)]
    m = Sequential([Dense(8), ReLU(), Dense(3)], input_shape=(6,), input_exp=-7,
                   prune={1 - 1: {"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 3},
                          2: P.Prune("polynomial", final_sparsity=0.75, end_step=4, frequency=2)})
    tab = m.prune_table
    assert tab.keys == [(0, 0), (2, 0)] and list(tab.steps) == [0, 2, 3, 4]
    assert tab.zeros.tolist() == [[-1, 0], [-1, 16], [24, -1], [-1, 18]]
    assert tab.row(3) == 2 and tab.row(1) == -1 and tab.row(99) == -1


@pytest.mark.parametrize("bad, match", [
    ({"schedule": "polynomial", "final_sparsity": 0.5, "begin_step": 10, "end_step": 5}, "ends before it begins"),
    ({"schedule": "polynomial", "final_sparsity": 1.0, "end_step": 5}, "final_sparsity = 1.0 must be a number in [0, 1)"),
    ({"schedule": "constant", "target_sparsity": -0.1}, "target_sparsity = -0.1"),
    ({"schedule": "polynomial", "final_sparsity": 0.5}, "end_step is missing"),
    ({"schedule": "one_shot", "final_sparsity": 0.5, "frequency": 3}, "frequency does not apply"),
    ({"schedule": "gradual", "final_sparsity": 0.5}, "schedule = \"gradual\" must be one of"),
    ({"schedule": "one_shot", "final_sparsity": 0.5, "sparsity": 3}, "unknown key(s) sparsity"),
    ({"schedule": "one_shot"}, "final_sparsity is missing"),
    ({"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 2**31}, "begin_step = 2147483648 must be an integer in [0, 2^31)"),
    ({0: {"schedule": "one_shot", "final_sparsity": 0.5, "scope": "global"}}, "give it in the model's prune object"),
])
def test_bad_prune_config_names_the_field(bad, match):
    with pytest.raises(ModelError, match=None) as e:
        Sequential([Dense(3)], input_shape=(4,), prune=bad)
    assert match in str(e.value)


def test_global_scope_table_and_training():
    """One unit for every tensor the model's global prune covers (a layer's own prune is its own
    unit); shifts put the stores on one exponent; three-way equal; the total count exact."""
    m = Sequential([Dense(40), ReLU(), Dense(4)], input_shape=(4,), input_exp=-7, seed=1,  # exponents -12, -14
                   optimizer=SGD(lr=0.05, master_weights=True),
                   prune={"schedule": "polynomial", "final_sparsity": 0.7, "end_step": 6, "frequency": 2,
                          "scope": "global"})
    tab = m.prune_table
    assert tab.keys == [(0, 0), (2, 0)] and tab.units == [(0, 2)]
    e0, e2 = m.layers[0].params[0].exp, m.layers[2].params[0].exp
    assert tab.shifts == [e0 - min(e0, e2), e2 - min(e0, e2)] and max(tab.shifts) > 0
    assert tab.zeros[-1].tolist() == [P.zeros_for(0.7, 320)]
    x, y = _data(10, (4,), 4, 2)
    three_way(m, x, y, epochs=2)
    _check_pruned(m)
    z = P.sparsity(m)
    assert z["L0.w"][0] + z["L2.w"][0] == 224 and z["L0.w"][0] != 112  # not 70 % of each
    mixed = Sequential([Dense(8), ReLU(), Dense(6), ReLU(), Dense(3)], input_shape=(6,), input_exp=-7,
                       prune={"schedule": "one_shot", "final_sparsity": 0.5, "scope": "global"})
    mixed.layers[2].prune = P.Prune("one_shot", final_sparsity=0.25)
    mixed._init_training_state()
    assert mixed.prune_table.keys == [(0, 0), (4, 0), (2, 0)] and mixed.prune_table.units == [(0, 2), (2, 3)]


def test_frozen_and_weightless_layers():
    """A global prune skips frozen layers; a layer's own prune on a frozen or weightless layer is
    refused (its weights are constants in flash)."""
    m = Sequential([Dense(8), ReLU(), Dense(3)], input_shape=(6,), optimizer=SGD(train=[2]),
                   prune={"schedule": "one_shot", "final_sparsity": 0.5})
    assert m.prune_table.keys == [(2, 0)]
    with pytest.raises(ModelError, match="frozen"):
        Sequential([Dense(8), ReLU(), Dense(3)], input_shape=(6,), optimizer=SGD(train=[2]),
                   prune={0: {"schedule": "one_shot", "final_sparsity": 0.5}})
    with pytest.raises(ModelError, match="no weights to prune"):
        Sequential([Dense(8), ReLU(), Dense(3)], input_shape=(6,), prune={1: {"schedule": "one_shot", "final_sparsity": 0.5}})


def _check_pruned(m):
    """Every pruned element is zero in every slot; the last event's count is exact (per unit)."""
    tab = m.prune_table
    for u, (a, b) in enumerate(tab.units):
        total = 0
        for key in tab.keys[a:b]:
            li, pi = key
            p = m.layers[li].params[pi]
            pruned = P.unpack(m.masks[key], p.data.size)
            total += int(pruned.sum())
            for arr in (p.data, m.master.get(key), m.accum.get(key), m.velocity.get(key)):
                if arr is not None:
                    assert not arr.reshape(-1)[pruned].any(), key
        done = [r for r in range(tab.steps.size) if tab.steps[r] < m.meta[1] and tab.zeros[r, u] >= 0]
        if done:
            assert total == tab.zeros[done[-1], u]


@st.composite
def prune_configs(draw, steps, glob=False):
    kind = draw(st.sampled_from(P.SCHEDULES))
    s = draw(st.sampled_from([0.0, 0.25, 0.5, 0.8, 0.9, 0.99]))
    b = draw(st.integers(0, steps // 2))
    scope = {"scope": "global"} if glob and draw(st.booleans()) else {}
    if kind == "one_shot":
        return {"schedule": kind, "final_sparsity": s, "begin_step": b, **scope}
    e = draw(st.integers(b + 1, steps))
    cfg = {"schedule": kind, "final_sparsity": s, "begin_step": b, "end_step": e,
           "frequency": draw(st.integers(1, 4)), **scope}
    if kind == "polynomial":
        cfg.update(initial_sparsity=draw(st.sampled_from([0.0, 0.1])), power=draw(st.sampled_from([1, 3])))
    return cfg


@settings(max_examples=examples(5), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_pruned_training_reference_sim_c_equal(data):
    """Drawn graphs x optimizer options x schedules (global, or per layer): reference = numba =
    C every step; then every pruned element zero in every slot and the zeros count exact."""
    shape, layers, n_cls = data.draw(any_graph())
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = data.draw(any_optimizer(probe.layers))
    n = data.draw(st.integers(4, 9))
    steps = 2 * n // opt.batch_size
    learning = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, optimizer=copy.deepcopy(opt))
    prunable = [i for i, l in enumerate(learning.layers)
                if P._prunable(l) and all(learning.learns(i, pi) for pi in P._prunable(l))]
    if prunable and data.draw(st.booleans()):  # per layer
        chosen = data.draw(st.sets(st.sampled_from(prunable), min_size=1))
        prune = {i: data.draw(prune_configs(steps)) for i in sorted(chosen)}
    else:  # the whole model (the layers that learn), each layer alone or ranked together
        prune = data.draw(prune_configs(steps, glob=True))
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), prune=prune)
    x, y = _data(n, shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)
    if ref.prune_table is not None:
        _check_pruned(ref)


def _w1ish(opt, prune):
    return Sequential([Dense(12), ReLU(), Dense(4)], input_shape=(10,), input_exp=-7, optimizer=opt, seed=1,
                      prune=prune)


@pytest.mark.parametrize("opt", [SGD(lr=0.05), SGD(lr=0.05, momentum=0.9, batch_size=2),
                                 SGD(lr=0.05, master_weights=True, stochastic_rounding=True),
                                 SGD(lr=0.05, momentum=0.9, master_weights=True, weight_decay=1e-3)],
                         ids=["direct", "momentum-batch", "master-sr", "momentum-master-wd"])
def test_polynomial_to_90_percent_exact(opt):
    """Three-way equal through a whole polynomial schedule to 90 %: 108 of 120 and 43 of 48
    weights pruned at end_step, zero in every slot, and still so after further training."""
    ref = _w1ish(opt, {"schedule": "polynomial", "final_sparsity": 0.9, "begin_step": 1, "end_step": 9,
                       "frequency": 3})
    x, y = _data(12, (10,), 4, 5)
    three_way(ref, x, y, epochs=3)
    assert P.sparsity(ref) == {"L0.w": (108, 120), "L2.w": (43, 48)}
    _check_pruned(ref)
    assert (ref.layers[0].params[0].data == 0).sum() >= 108


def test_masks_are_state():
    """The masks are in the state blob (after their tensor's slots) and in the hash; a .tt file
    keeps them; an unpruned model's state is what it always was."""
    from tinytrain.graph import io as tio

    m = _w1ish(SGD(lr=0.05, momentum=0.9), {"schedule": "one_shot", "final_sparsity": 0.5})
    roles = [(s.layer, s.param, s.role) for s in state_layout(m)]
    assert roles[:4] == [(0, "w", "param"), (0, "w", "accum"), (0, "w", "velocity"), (0, "w", "mask")]
    x, y = _data(4, (10,), 4, 0)
    for i in range(4):
        m.ref_train_step(x[i], y[i])
    h = m.state_hash()
    m.masks[(0, 0)][0] ^= 1 << 7
    assert m.state_hash() != h
    m.masks[(0, 0)][0] ^= 1 << 7
    back, _ = tio.from_bytes(tio.to_bytes(m))
    assert back.state_hash() == h and back.config() == m.config()
    assert all(np.array_equal(back.masks[k], m.masks[k]) for k in m.masks)
    plain = _w1ish(SGD(lr=0.05), None)
    assert "prune" not in plain.config() and "prune" not in plain.schema() and not plain.masks
    assert all(s.role != "mask" for s in state_layout(plain))


def test_model_file_and_cli(tmp_path, capsys):
    """A "prune" object at the top of a model file or in a layer object; --prune on train."""
    import json

    from tinytrain import cli, data
    from tinytrain.graph import io as tio
    from tinytrain.graph.models import build_model

    ds = data.load("digits")
    spec = {"layers": [{"type": "dense", "units": 16, "prune": {"schedule": "one_shot", "final_sparsity": 0.5}},
                       {"type": "relu"}, {"type": "dense", "units": 10}]}
    f = tmp_path / "m.json"
    f.write_text(json.dumps(spec))
    m = build_model(f, ds)
    assert m.prune_table.keys == [(0, 0)] and m.config()["layers"][0]["prune"]["final_sparsity"] == 0.5
    out = tmp_path / "p.tt"
    assert cli.main(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--out", str(out),
                     "--prune", '{"schedule": "polynomial", "final_sparsity": 0.8, "end_step": 500, '
                     '"frequency": 50}']) == 0
    saved, _ = tio.load(out)
    assert P.sparsity(saved) == {"L0.w": (1638, 2048), "L2.w": (256, 320)}
    assert (saved.layers[0].params[0].data == 0).sum() >= 1638
    capsys.readouterr()
    assert cli.main(["info", str(out), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["pruned"]["L0.w"] == {"zeros": 1638, "of": 2048} and info["prune_events_left"] == 0
    # fine-tuning a dense .tt with pruning: the steps count on from its optimizer step
    dense = tmp_path / "d.tt"
    assert cli.main(["train", "--data", "digits", "--model", "digits-mlp", "--epochs", "1", "--out", str(dense)]) == 0
    t = int(tio.load(dense)[0].meta[1])
    m = build_model(dense, ds, prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": t})
    assert m.prune_table.steps.tolist() == [t] and int(m.meta[1]) == t
    with pytest.raises(ModelError, match=f"use begin_step >= {t}"):
        build_model(dense, ds, prune={"schedule": "one_shot", "final_sparsity": 0.5})
    with pytest.raises(ModelError, match="already prunes"):
        build_model(out, ds, prune={"schedule": "one_shot", "final_sparsity": 0.5, "begin_step": 10**6})


@pytest.mark.qemu
@pytest.mark.parametrize("board,precision", [("mps2_an386", None), ("microbit", None), ("mps2_an386", "int8"),
                                             ("microbit", "int8")])
def test_pruned_w1_bit_exact_in_qemu(tmp_path, board, precision):
    """W1 pruned on the board: 200 verified steps on QEMU through a polynomial schedule with
    events every 20 steps, ending at 80 % within the run; the Cortex-M4 (the masks applied a word
    at a time: two int16, or four int8 weights with `precision` int8) and the Cortex-M0 of the
    micro:bit (no unaligned word access, no CLZ: the portable loop over the set bits)."""
    import shutil

    if shutil.which("qemu-system-arm") is None or shutil.which("arm-none-eabi-gcc") is None:
        pytest.skip("qemu-system-arm / arm-none-eabi-gcc missing")
    from tinytrain import data
    from tinytrain.codegen.project import build_firmware
    from tinytrain.verify import verify

    ds = data.load("digits")
    model = lambda: Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,),  # noqa: E731
                               input_exp=ds.input_exp - 4, optimizer=SGD(lr=0.05), seed=0,
                               prune={"schedule": "polynomial", "final_sparsity": 0.8, "begin_step": 0,
                                      "end_step": 150, "frequency": 20},
                               **({"precision": precision} if precision else {}))
    elf = build_firmware(model(), board, tmp_path)
    r = verify(model(), ds, 200, board=board, elf=elf)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 200


def test_sensitivity_deterministic_and_exact(tmp_path, capsys):
    """`tinytrain sensitivity`: one tensor at a time pruned by the training's criterion; level 0
    changes nothing, counts are round(s n), a rerun gives the same numbers, JSON and plot."""
    import json

    from tinytrain import cli, data
    from tinytrain.graph.models import build_model
    from tinytrain.sensitivity import sensitivity
    from tinytrain.train import fit

    ds = data.load("digits")
    m = build_model("digits-mlp", ds)
    fit(m, ds, 2, progress=False, log=lambda line: None)
    h = m.state_hash()
    a = sensitivity(m, ds, levels=(0.0, 0.5, 0.9))
    assert m.state_hash() == h  # the model is not changed
    assert [r["layer"] for r in a["layers"]] == [0, 2]
    assert [p["zeros"] for p in a["layers"][0]["points"]] == [0, 1024, 1843]
    assert a["layers"][0]["points"][0]["drop_points"] == 0.0 and a["layers"][1]["ram_bytes"] == 80
    assert sensitivity(m, ds, levels=(0.0, 0.5, 0.9)) == a
    out = tmp_path / "m.tt"
    from tinytrain.graph import io as tio
    tio.save(m, out, {"dataset": "digits"})
    capsys.readouterr()
    assert cli.main(["sensitivity", "--model", str(out), "--levels", "0,0.5,0.9", "--json",
                     "--plot", str(tmp_path / "s.png")]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["layers"] == json.loads(json.dumps(a["layers"])) and (tmp_path / "s.png").stat().st_size > 0


def test_file_from_before_pruning_loads():
    """tests/data/pre_pruning_814deab.tt was written by tinytrain at commit 814deab, before
    pruning existed (regenerate: check that commit out and save the model below after 5
    reference steps, seed 4): it loads with its recorded state hash, has no masks, and its state
    blob and schema are unchanged."""
    from pathlib import Path

    from tinytrain.graph import io as tio

    m, extra = tio.load(Path(__file__).parent / "data" / "pre_pruning_814deab.tt")
    assert "814deab" in extra["note"] and not m.masks and m.prune is None and m.prune_table is None
    assert m.state_hash() == 0x6B17593A and m.schema_hash() == 2554853078
    assert all(s.role != "mask" for s in state_layout(m)) and int(m.meta[1]) == 5
    x, y = _data(4, (6,), 3, 1)
    three_way(m, x, y, epochs=1)


def test_emitted_c_hooks():
    """What the generator emits for a pruned model: the header, the static const tensor and
    schedule tables, one tt_prune_apply after each pruned tensor's update and tt_prune_step just
    before the step counter advances; a model that does not prune has none of it."""
    from tinytrain.codegen.emit import generate

    m = _w1ish(SGD(lr=0.05, momentum=0.9, batch_size=2),
               {"schedule": "polynomial", "final_sparsity": 0.5, "end_step": 4, "frequency": 2})
    src = generate(m).source
    assert '#include "tt_prune.h"' in src
    assert "static const tt_prune_tensor tt_model_prune[2] = {" in src
    assert (".mask = tt_model_l0_w_mask, .n = 120u, .w = tt_model_l0_w, .w_bytes = 2u, .master = 0, .master_bytes = 0u, "
            ".acc = tt_model_l0_w_acc, .vel = tt_model_l0_w_vel, .vel_bytes = 4u, .shift = 0u}") in src
    assert ".unit_start = tt_model_prune_units, .rows = 3u, .units = 2u}" in src
    step = src[src.index("_train_step("):src.index("_predict(")]
    assert step.count("tt_prune_apply(&tt_model_prune[0]);") == 2  # after accumulate and after the batch update
    i = step.index("tt_prune_step(&tt_model_prune_schedule, tt_model_prune, tt_model_meta[1]);")
    assert step.index("tt_model_meta[1] += 1;") > i
    assert "tt_prune" not in generate(_w1ish(SGD(lr=0.05), None)).source
