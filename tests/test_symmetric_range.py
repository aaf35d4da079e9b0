"""int8 and int16 tensors of the training state stay in the symmetric range [-127, 127] /
[-32767, 32767] (graph/optim.py sat_range): -128 / -32768 is never produced and, where a state
enters from outside, refused.

Why: the reference clamps an old -32768 to -32767 on every update touch, even a step of zero,
while the C skips updates that round to zero (rows whose error is zero), so a loaded -32768
made the C and the reference disagree from the first step (a drawn Dense layer with an
all-zero error row: reference -32767, C -32768). The doors: a .tt file (io.load), codegen (the
initial state, frozen weights in flash), the C's write_state (LOAD_PARAMS on a board, a
federated broadcast): each refuses, naming the tensor and the index. The reference and the
numba simulator, which a Python caller can still hand such a state, clamp it alike.

On drawn graphs x precision policies x optimizer options (and pruned MLPs stored sparse):
- updates pushed against the limits never leave the minimum on any path (three_way checks it
  after every step, for every three-way test of the suite);
- write_state refuses a blob holding it in any int8/int16 tensor, whole or in chunks split
  anywhere (inside the element too), and writes nothing of the refused chunk;
- codegen and io.load refuse it with the tensor's name and index;
- reference == simulator, step by step, on a state holding it.
"""
from __future__ import annotations

import copy
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.codegen.emit import CodegenError, generate
from tinytrain.codegen.host import HostModel
from tinytrain.graph import io as tio
from tinytrain.graph.layers import Dense, ModelError
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.precision import Precision
from tinytrain.graph.state import outside_symmetric, state_blob, state_layout
from tinytrain.sim.simulator import Simulator

from .conftest import examples
from .test_exactness import _data, any_graph, any_optimizer, three_way
from .test_precision import POLICIES, flat_model
from .test_sparse import _past_schedule, mlp_cases

SETTINGS = dict(deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def narrow_slots(model):
    """(slot, array) of the int8/int16 tensors of the state blob."""
    return [(s, a) for s, a in zip(state_layout(model), model.state_tensors()) if s.dtype in (np.int8, np.int16)]


@st.composite
def models(draw, lrs=None):
    """A drawn graph (any graph, or an MLP with per-layer overrides) under a drawn policy and
    optimizer (its lr from `lrs` when given); None when the draw is refused (a policy that does
    not fit its optimizer)."""
    if draw(st.booleans()):
        shape, layers, n_cls = draw(any_graph())
        pol = draw(st.sampled_from([p for p in POLICIES if not Precision.parse(p).blocked]))
    else:
        shape, layers, n_cls = draw(flat_model())
        pol = draw(st.sampled_from(POLICIES))
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, precision=pol)
    opt = draw(any_optimizer(probe.layers))
    if Precision.parse(pol).momentum == "int8":  # as test_precision._build
        opt = replace(opt, master_weights=False)
    if lrs:
        opt = replace(opt, lr=draw(st.sampled_from(lrs)))
    try:
        m = Sequential(layers, input_shape=shape, input_exp=draw(st.integers(-9, 0)), optimizer=opt,
                       seed=draw(st.integers(0, 1000)), precision=pol)
    except ModelError:
        return None
    return m, shape, n_cls


def _plant(draw, model):
    """Set one drawn element of a drawn int8/int16 state tensor to its minimum (in the blob)."""
    slots = narrow_slots(model)
    if not slots:
        return None
    s, a = slots[draw(st.integers(0, len(slots) - 1))]
    i = draw(st.integers(0, a.size - 1))
    blob = bytearray(state_blob(model))
    lo = int(np.iinfo(s.dtype).min)
    blob[s.offset + i * s.dtype.itemsize:s.offset + (i + 1) * s.dtype.itemsize] = np.array(
        [lo], s.dtype.newbyteorder("<")).tobytes()
    return bytes(blob), s, i


@settings(max_examples=examples(4), **SETTINGS)
@given(st.data())
def test_c_write_state_refuses_the_minimum_whole_and_in_chunks(data):
    drawn = data.draw(models())
    if drawn is None:
        return
    m, shape, n_cls = drawn
    if data.draw(st.booleans()):  # train a little first: a state that is not the initial one
        x, y = _data(4, shape, n_cls, data.draw(st.integers(0, 2**16)))
        Simulator(m).train(x, y, np.arange(4))
    planted = _plant(data.draw, m)
    if planted is None:
        return
    bad, slot, i = planted
    hm = HostModel(m, sanitize=True)
    good = hm.read_state()
    assert good == state_blob(m)
    assert hm.write_state(bad) == -1, f"{slot.name}[{i}] = min accepted"
    assert hm.read_state() == good  # nothing written
    # in two chunks split anywhere (inside the planted element too): the chunk that completes
    # the minimum is refused and writes nothing, so the state never holds it
    cut = data.draw(st.integers(1, len(bad) - 1))
    r1 = hm.write_state(bad[:cut], 0)
    after1 = hm.read_state()
    assert (r1 == 0 and after1[:cut] == bad[:cut]) or (r1 == -1 and after1 == good)
    assert hm.write_state(bad[cut:], cut) == -1 or r1 == -1
    held = hm.read_state()
    elem = held[slot.offset + i * slot.dtype.itemsize:slot.offset + (i + 1) * slot.dtype.itemsize]
    assert int(np.frombuffer(elem, slot.dtype.newbyteorder("<"))[0]) != int(np.iinfo(slot.dtype).min)
    assert hm.write_state(good) == 0 and hm.state_hash() == m.state_hash()


@settings(max_examples=examples(2), **SETTINGS)
@given(st.data())
def test_c_write_state_refuses_the_minimum_in_packed_weights(data):
    """Pruned MLPs whose schedule is over: the weights packed (rows, bitmap or blocks) and shown
    through their dense view; a kept element set to -32768 is refused as a dense one is."""
    shape, layers, n_cls, opt, prune = data.draw(mlp_cases())
    prune = {**prune, "storage": data.draw(st.sampled_from(["rows", "bitmap"]))}
    m = Sequential(layers, input_shape=shape, input_exp=-7, optimizer=opt, seed=data.draw(st.integers(0, 99)),
                   prune=prune)
    if m.prune_table is None:
        return
    x, y = _data(6, shape, n_cls, 1)
    _past_schedule(m, x, y)
    hm = HostModel(m, sanitize=True)
    good = hm.read_state()
    kept = [(s, a) for s, a in narrow_slots(m) if (s.layer, 0) in m.masks and s.param == "w" and
            (a.reshape(-1) != 0).any()]
    if not kept:
        return
    s, a = kept[data.draw(st.integers(0, len(kept) - 1))]
    nz = np.flatnonzero(a.reshape(-1))
    i = int(nz[data.draw(st.integers(0, nz.size - 1))])
    bad = bytearray(good)
    bad[s.offset + 2 * i:s.offset + 2 * i + 2] = b"\x00\x80"
    assert hm.write_state(bytes(bad)) == -1 and hm.read_state() == good
    bad[s.offset + 2 * i:s.offset + 2 * i + 2] = b"\x01\x80"  # -32767: written
    assert hm.write_state(bytes(bad)) == 0 and hm.read_state() == bytes(bad)


@settings(max_examples=examples(25), **SETTINGS)
@given(st.data())
def test_codegen_and_load_refuse_the_minimum_naming_the_tensor(tmp_path_factory, data):
    drawn = data.draw(models())
    if drawn is None:
        return
    m = drawn[0]
    slots = narrow_slots(m)
    assert outside_symmetric(m) is None
    generate(m)  # the symmetric state emits
    if not slots:
        return
    s, a = slots[data.draw(st.integers(0, len(slots) - 1))]
    idx = np.unravel_index(data.draw(st.integers(0, a.size - 1)), a.shape)
    a[idx] = np.iinfo(a.dtype).min
    where = f"tensor {s.name} holds {int(np.iinfo(a.dtype).min)} at {[int(v) for v in idx]}"
    assert outside_symmetric(m)[0] == s.name
    with pytest.raises(CodegenError, match=re.escape(where)):
        generate(m)
    p = tmp_path_factory.mktemp("sym") / "m.tt"
    tio.save(m, p)
    with pytest.raises(tio.FileFormatError, match=re.escape(where)):
        tio.load(p)


@settings(max_examples=examples(10), **SETTINGS)
@given(st.data())
def test_reference_and_simulator_clamp_a_held_minimum_alike(data):
    """A state handed over by a Python caller with minima in its int8/int16 tensors (the C
    refuses it): the reference and the numba simulator, step by step, equal."""
    drawn = data.draw(models())
    if drawn is None:
        return
    ref, shape, n_cls = drawn
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    for s, a in narrow_slots(ref):
        if s.role != "mask":
            f = a.reshape(-1)
            f[rng.random(f.size) < 0.3] = np.iinfo(a.dtype).min
    for li, pi in ref.master:  # the compute copies follow their masters (a master's minimum narrows to -limit)
        ref._refresh(li, pi)
    fast = ref.copy()
    sim = Simulator(fast)
    x, y = _data(data.draw(st.integers(3, 6)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    for i in range(len(x)):
        a = tuple(int(v) for v in ref.ref_train_step(x[i], y[i]))
        b = tuple(int(v) for v in sim.train(x, y, [i])[0])
        assert a == b and ref.state_hash() == fast.state_hash(), f"step {i}"
        assert list(ref.stats) == list(fast.stats), f"step {i}: stats {ref.stats} {fast.stats}"


@st.composite
def pushed_models(draw):
    """A drawn MLP whose weights and biases sit at or next to the symmetric limits, trained
    with a large learning rate, so that updates saturate both ways."""
    drawn = draw(models(lrs=[0.2, 0.5, 1.0]))
    if drawn is None:
        return None
    m, shape, n_cls = drawn
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    for s, a in narrow_slots(m):
        if s.role in ("param", "master", "velocity"):
            hi = int(np.iinfo(a.dtype).max)
            f = a.reshape(-1)
            near = rng.choice([-hi, -hi + 1, -hi + 2, hi - 1, hi], f.size)
            f[:] = np.where(rng.random(f.size) < 0.6, near, f)
    for li, pi in m.master:
        m._refresh(li, pi)
    return m, shape, n_cls


@settings(max_examples=examples(6), **SETTINGS)
@given(st.data())
def test_updates_at_the_limits_never_produce_the_minimum(data):
    """Weights (masters, momentum) at +-limit and next to it, lr up to 1.0: the updates saturate
    (counted) and every path lands on -limit, never on the minimum (three_way asserts it each
    step, and the C's state equals the reference's)."""
    drawn = data.draw(pushed_models())
    if drawn is None:
        return
    m, shape, n_cls = drawn
    x, y = _data(data.draw(st.integers(4, 8)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(m, x, y, epochs=1)


def test_the_reference_clamps_a_held_minimum_and_codegen_refuses_it():
    """The reference clamps an old -32768 on any update touch, a step of zero too (here a zero
    input: every weight gradient is zero), where the C skips rows with a zero error: so the C
    never gets such a state (HostModel, like a board build, goes through codegen)."""
    m = Sequential([Dense(2)], input_shape=(3,), input_exp=-7, optimizer=SGD(lr=0.01), seed=0)
    m.layers[0].params[0].data[1, 0] = -32768
    ref = m.copy()
    ref.ref_train_step(np.zeros(3, np.int8), 0)
    assert int(ref.layers[0].params[0].data[1, 0]) == -32767 and ref.stats[1] >= 1
    with pytest.raises(CodegenError, match=re.escape("holds -32768 at [1, 0]")):
        HostModel(m)
