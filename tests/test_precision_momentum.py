"""int8 momentum (policy "momentum": "int8"): the slot rule on its own (numpy reference = numba
kernel = C, drawn values at the edges), why the slot is rounded stochastically, and whole models
(dense, conv, batch norm) under drawn optimizer options: reference = numba = C every step."""
from __future__ import annotations

import copy
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.graph import io as tio
from tinytrain.graph.conv import Conv1d, Conv2d, GlobalAvgPool
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.norm import BatchNorm
from tinytrain.graph.optim import V8_SHIFT, IntSGD, apply_accumulated_ref, sat_range
from tinytrain.graph.precision import Precision, PrecisionError
from tinytrain.kernels.optim import apply_accumulated as nb_apply

from .conftest import examples
from .oputil import c_i8, c_i16, c_i32
from .test_boards_qemu import needs_qemu
from .test_exactness import _data, any_optimizer, three_way

MU = [(29491, 15), (32767, 15), (1, 1), (16384, 15), (3, 2)]
WD = [(0, 0), (0, 0), (27488, 31), (19661, 20), (5, 8), (300, 3)]  # no decay (and batch 1): the 32-bit fast path


@st.composite
def slot_case(draw):
    n = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    narrow = draw(st.booleans())
    lim = 127 if narrow else 32767
    w = rng.choice([-lim, -lim + 1, -1, 0, 1, lim - 1, lim], n) if draw(st.booleans()) else rng.integers(-lim, lim + 1, n)
    w = w.astype(np.int8 if narrow else np.int16)
    V = rng.choice([-127, -126, -1, 0, 1, 126, 127], n) if draw(st.booleans()) else rng.integers(-127, 128, n)
    ab = draw(st.sampled_from([0, 4, 12, 20, 31]))
    A = np.clip(rng.integers(-(2**ab), 2**ab + 1, n), -(2**31), 2**31 - 1).astype(np.int32)
    return w, A, V.astype(np.int8), draw(st.sampled_from(MU)), draw(st.sampled_from(WD)), \
        draw(st.sampled_from([1, 3])), draw(st.integers(0, 1)), draw(st.integers(1, 2**32 - 1))


def _opt(mu, wd, batch, sr):
    ib = (21845, 16) if batch > 1 else (0, 0)
    return IntSGD(m=1, k=20, mu_m=mu[0], mu_k=mu[1], wd_m=wd[0], wd_k=wd[1], ib_m=ib[0], ib_k=ib[1],
                  batch_size=batch, schedule=0, gamma_q15=32768, step_size=1, total_steps=1,
                  cosine=np.zeros(65, np.int32), sr=bool(sr), master=False)


def _c_apply(ffi, lib, case):
    w, A, V, mu, wd, batch, sr, seed = case
    w, A, V = w.copy(), A.copy(), V.copy()
    o = _opt(mu, wd, batch, sr)
    cos = ffi.new("int32_t[65]")
    cfg = ffi.new("tt_sgd *", {"m": 1, "k": 20, "mu_m": o.mu_m, "mu_k": o.mu_k, "wd_m": o.wd_m, "wd_k": o.wd_k,
                               "ib_m": o.ib_m, "ib_k": o.ib_k, "batch_size": batch, "sr": sr, "cosine": cos})
    prng, stats = ffi.new("uint32_t *", seed), ffi.new("tt_stats *")
    u = ffi.new("tt_sgd_step *", {"cfg": cfg, "m_t": 1, "prng": prng, "stats": stats})
    if w.dtype == np.int8:
        lib.tt_sgd_apply_accumulated_s8_v8(u, c_i8(ffi, w), c_i32(ffi, A), c_i8(ffi, V), w.size)
    else:
        lib.tt_sgd_apply_accumulated_s16_v8(u, c_i16(ffi, w), c_i32(ffi, A), c_i8(ffi, V), w.size)
    return w, A, V, int(stats.saturated), int(prng[0])


@settings(max_examples=examples(150), deadline=None)
@given(slot_case())
def test_int8_slot_rule_reference_numba_c_equal(clib, case):
    """tt_sgd_apply_accumulated_{s8,s16}_v8 == the numba kernel (vshift 8) == the reference, on
    edge and random weights, slots at +-127, accumulators up to the int32 limit, with and without
    batch averaging, decay and stochastic rounding of the update: weights, slots, accumulators
    (zeroed), saturations and the PRNG state (one slot draw per element, then the update's)."""
    w, A, V, mu, wd, batch, sr, seed = case
    got = _c_apply(*clib, case)
    wr, Ar, Vr, prng = w.copy(), A.copy(), V.copy(), [seed]
    nsat = apply_accumulated_ref(wr, Ar, Vr, _opt(mu, wd, batch, sr), prng)
    assert np.array_equal(got[0], wr) and np.array_equal(got[1], Ar) and np.array_equal(got[2], Vr)
    assert (got[3], got[4]) == (nsat, prng[0])
    wn, An, Vn = w.copy(), A.copy(), V.copy()
    meta, stats = np.array([seed, 0, 0], np.int64), np.zeros(4, np.int64)
    o = _opt(mu, wd, batch, sr)
    nb_apply(wn, An, Vn, batch, o.ib_m, o.ib_k, o.mu_m, o.mu_k, o.wd_m, o.wd_k, bool(sr), *sat_range(w.dtype),
             meta, stats, -127, 127, V8_SHIFT)
    assert np.array_equal(wn, wr) and np.array_equal(An, Ar) and np.array_equal(Vn, Vr)
    assert (int(stats[1]), int(meta[0])) == (nsat, prng[0])


def test_a_decaying_slot_reaches_zero_in_expectation():
    """Why the slot is rounded stochastically: with no gradient, momentum 0.9 decays a slot of 20
    store steps to 0. Round-to-nearest would stall it (5 * 0.9 = 4.5 -> 5, -4 * 0.9 = -3.6 -> -4),
    and the weights would keep drifting 4-5 steps per update forever."""
    n = 2000
    V = np.full(n, 20, np.int8)
    V[n // 2:] = -20
    w, A, prng = np.zeros(n, np.int16), np.zeros(n, np.int32), [12345]
    opt = _opt((29491, 15), (0, 0), 1, 0)
    for _ in range(80):
        apply_accumulated_ref(w, A, V, opt, prng)
    assert np.count_nonzero(V) <= n // 50, np.unique(V, return_counts=True)
    # the weights moved by sum_t 20 * 0.9^t = 180 steps on average (a stalled slot: over 400)
    assert abs(float(-w[: n // 2].mean()) - 180) < 8 and abs(float(w[n // 2:].mean()) - 180) < 8


def test_velocity_widths_and_what_is_refused():
    from tinytrain.graph.optim import SGD

    opt = dict(lr=0.05, momentum=0.9, batch_size=2)
    m = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, optimizer=SGD(**opt),
                   precision={"weights": "int8", "master": "int16", "momentum": "int8"})
    assert {k: v.dtype.name for k, v in m.velocity.items()} == {(0, 0): "int8", (0, 1): "int32", (2, 0): "int8",
                                                                (2, 1): "int32"}
    with pytest.raises(PrecisionError, match='momentum = "int8" has no int8 store.*use master "int16"'):
        Precision.parse({"momentum": "int8", "master": "int32"})
    with pytest.raises(PrecisionError, match='stochastic rounding.*use rounding "auto" or "stochastic"'):
        Precision.parse({"momentum": "int8", "rounding": "nearest"})
    with pytest.raises(ModelError, match=r'layer 0 \(dense\).*master_weights.*momentum "int32"'):
        Sequential([Dense(3)], input_shape=(9,), optimizer=SGD(**opt, master_weights=True),
                   precision={"momentum": "int8"})


def test_int8_momentum_round_trips_through_tt_files_and_saves_ram(tmp_path):
    from tinytrain.codegen.memory import breakdown
    from tinytrain.graph.optim import SGD

    def model(mom):
        return Sequential([Dense(8), ReLU(), Dense(3)], input_shape=(9,), input_exp=-7, seed=3,
                          optimizer=SGD(lr=0.1, momentum=0.9), precision={"momentum": mom})

    m = model("int8")
    x, y = _data(12, (9,), 3, 1)
    for i in range(12):
        m.ref_train_step(x[i], y[i])
    assert np.abs(m.velocity[(0, 0)]).max() > 0
    tio.save(m, tmp_path / "m.tt")
    b, _ = tio.load(tmp_path / "m.tt")
    assert b.layers[0].policy.momentum == "int8" and b.velocity[(0, 0)].dtype == np.int8
    assert b.state_hash() == m.state_hash() and np.array_equal(b.velocity[(0, 0)], m.velocity[(0, 0)])
    vel = lambda mm: sum(t["bytes"] for r in breakdown(mm, "mps2_an386", link=False).layers  # noqa: E731
                         for t in r["tensors"] if t["role"] == "velocity")
    n_w = 9 * 8 + 8 * 3
    assert vel(model("int32")) - vel(model("int8")) == 3 * n_w  # 4 -> 1 byte per weight, biases stay int32


def _conv_bn():
    return [Conv2d(3, 3, padding="same"), BatchNorm(), ReLU(), GlobalAvgPool(), Dense(3)], (4, 4, 2)


def _conv1d():
    return [Conv1d(3, 3, stride=2, padding="same"), ReLU(), Flatten(), Dense(3)], (9, 2)


def _mlp():
    return [Dense(7), ReLU(), Dense(4), ReLU(), Dense(3)], (6,)


@settings(max_examples=examples(2), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_int8_momentum_any_layer_any_optimizer_reference_sim_c_equal(data):
    """int8 momentum on dense, conv2d + batch norm and conv1d models, over int16 or int8 weights
    (with or without an int16 master), under drawn optimizer options (lr, weight decay, batch
    size, schedules, stochastic rounding, partial updates; momentum forced on)."""
    layers, shape = data.draw(st.sampled_from([_mlp, _conv_bn, _conv1d]))()
    policy = {"momentum": "int8", **data.draw(st.sampled_from([{}, {"weights": "int8"},
                                                               {"weights": "int8", "master": "int16"}]))}
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7)
    opt = replace(data.draw(any_optimizer(probe.layers)), momentum=0.9, master_weights=False)
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, -3)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), precision=policy)
    for (li, pi), v in ref.velocity.items():  # int8 wherever the store is int8 or int16
        store = ref.master.get((li, pi), ref.layers[li].params[pi].data)
        assert (v.dtype == np.int8) == (store.dtype in (np.int8, np.int16)), (li, pi, v.dtype, store.dtype)
    x, y = _data(data.draw(st.integers(4, 7)), shape, 3, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_slot_momentum_rows_without_accumulators_reference_sim_c_equal(data):
    """Momentum slots at batch 1 without stochastic rounding: the generated step keeps no weight
    accumulators (tt_sgd_dense_rows_apply forms each row's accumulate in the scratch at the end
    of the step): MLPs whose Dense inputs are multiples of 4, int8 or int16 slots, drawn learning
    rates (the accumulate's shift on both sides of its 32-bit path), weight decay (the slot's
    int64 loop), schedules and partial updates; reference = numba = C every step."""
    from tinytrain.codegen.emit import generate
    from tinytrain.graph.optim import SGD

    k0, k1 = 4 * data.draw(st.integers(1, 5)), 4 * data.draw(st.integers(1, 4))
    layers = [Dense(k1), ReLU(), Dense(data.draw(st.integers(2, 5)))]
    mom = data.draw(st.sampled_from(["int8", "int16"]))
    opt = SGD(lr=data.draw(st.sampled_from([0.0005, 0.01, 0.2, 0.9])), momentum=data.draw(st.sampled_from([0.5, 0.9])),
              weight_decay=data.draw(st.sampled_from([0.0, 1e-3])), batch_size=1,
              schedule=data.draw(st.sampled_from(["constant", "cosine"])), total_steps=8,
              stochastic_rounding=False, train=data.draw(st.sampled_from(["all", "last:1"])))
    ref = Sequential(layers, input_shape=(k0,), input_exp=data.draw(st.integers(-9, -3)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), precision={"momentum": mom})
    src = generate(ref).source
    assert src.count("tt_sgd_dense_rows_apply(") == (2 if opt.train == "all" else 1) and "_w_acc[" not in src
    x, y = _data(data.draw(st.integers(3, 6)), (k0,), ref.layers[-1].units, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y)


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("policy, board, w1", [({"momentum": "int8"}, "mps2_an386", True),
                                               ({"momentum": "int8"}, "microbit", True),
                                               ({"weights": "int8", "momentum": "int8"}, "microbit", False)])
def test_int8_momentum_trains_bit_exact_on_qemu_boards(policy, board, w1):
    """int8 momentum: W1 with int16 weights at batch 1 on the Cortex-M4 (DSP build, the 32-bit
    fast path) and on the Cortex-M0 (16 KB: it fits since the slots keep no accumulators at
    batch 1); a 64-16-10 MLP with int8 weights without a master (stochastic rounding of the
    update too) at batch 2 on the Cortex-M0 (the generic loop); every step's state hash
    verified against the simulator."""
    from tinytrain import data
    from tinytrain.graph.models import build_model
    from tinytrain.graph.optim import SGD
    from tinytrain.verify import verify

    ds = data.load("digits")
    if not w1:
        m = Sequential([Dense(16), ReLU(), Dense(10)], dataset=ds, seed=1, precision=policy,
                       optimizer=SGD(lr=0.005, momentum=0.9, batch_size=2))
    else:
        m = build_model("digits-mlp", ds, precision=policy, momentum=0.9, lr=0.005)
    assert m.velocity[(0, 0)].dtype == np.int8
    r = verify(m, ds, 60, board=board, json=True)
    assert r["steps"] == 60 and r["mismatches"] == 0, r["first_mismatch"]


@pytest.mark.skipif(__import__("shutil").which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")
def test_int8_momentum_is_integer_only_on_cortex_m():
    """Both slot loops (the 32-bit one and the int64 one, chosen at run time) link no float
    helper on M0 and contain no VFP instruction in a hard-float M4 build."""
    from tinytrain.codegen import memory
    from tinytrain.codegen.emit import generate
    from tinytrain.graph.optim import SGD

    em = generate(Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6,
                             optimizer=SGD(lr=0.005, momentum=0.9), precision={"weights": "int8", "momentum": "int8"}))
    assert memory.float_symbols(memory.compile_arm(em, "cortex-m0")["undefined"]) == []
    dis = memory.compile_arm(em, "cortex-m4")["disasm"]  # (M33 hard float: test_precision.py's int8 cases)
    assert "tt_sgd_apply_accumulated_s8_v8" in dis and memory.vfp_instructions(dis) == []


def test_int8_momentum_weights_beside_an_int32_velocity_bias_on_the_host():
    """W1 at batch 1 with int8 / int16 momentum: the weights (slots) keep no accumulators: the
    backward keeps the error, and the end of the step forms each row's accumulate in the scratch
    and applies it (tt_sgd_dense_rows_apply; the accumulators are a zero span of the state
    blob), while the biases (int32 velocity) accumulate and apply at their backward from the
    error widened into the scratch (codegen/emit.py _bias_apply_after). Before, such a layer
    formed its whole gradient in an int32 buffer (8 KB on W1), then kept 4 bytes of accumulator
    per weight (another 9.5 KB); an accumulate that also skipped the biases' apply was found by
    the drawn-graph test. Verified on the host, with no gradient buffer and no accumulators."""
    from tinytrain import data
    from tinytrain.codegen.emit import generate
    from tinytrain.graph.models import build_model
    from tinytrain.verify import verify

    ds = data.load("digits")
    for mom in ("int8", "int16"):
        m = build_model("digits-mlp", ds, precision={"momentum": mom}, momentum=0.9, lr=0.005)
        assert m.velocity[(0, 0)].dtype == np.dtype(mom) and m.velocity[(0, 1)].dtype == np.int32
        src = generate(m).source
        assert "/* grad */" not in src and "tt_sgd_dense_accumulate_s32(" not in src, mom
        assert src.count("tt_sgd_dense_rows_apply(") == 2 and "tt_model_l0_w_acc[" not in src, mom
        r = verify(m, ds, 10, board="host", json=True)
        assert r["steps"] == 10 and r["mismatches"] == 0, (mom, r["first_mismatch"])
