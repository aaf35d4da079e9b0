"""Every optimizer option's Dense paths end to end (issue 13): drawn option combinations (momentum,
weight decay, stochastic rounding, int32 master weights, batch sizes, learning rates, int16/int8
velocities) on MLPs of drawn, odd widths (inputs past one 64-wide chunk too), the reference, the
numba simulator and the generated C (host, portable build) compared after every step; on QEMU the
Cortex-M4 (DSP paths: SMMULR rows, the SR accumulate, the fused master apply) and the Cortex-M3
(portable paths) verified against the simulator at every step."""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinytrain.graph.layers import Dense, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD

from .conftest import examples
from .test_boards_qemu import needs_qemu
from .test_exactness import _data, three_way


@st.composite
def options(draw):
    """Drawn optimizer options (at least one of momentum, decay, rounding, master on) and a
    velocity width."""
    mu, wd = draw(st.sampled_from([0.9, 0.0, 0.5])), draw(st.sampled_from([1e-3, 0.0, 1e-4, 3e-2]))
    sr, master = draw(st.booleans()), draw(st.booleans())
    sr = sr or not (mu or wd or master)
    opt = SGD(lr=draw(st.sampled_from([0.005, 0.05, 0.2, 0.7])), momentum=mu, weight_decay=wd,
              stochastic_rounding=sr, master_weights=master, batch_size=draw(st.sampled_from([1, 1, 2, 4])))
    vel = draw(st.sampled_from(["int32", "int32", "int16", "int8"])) if mu and not master else "int32"
    return opt, ({} if vel == "int32" else {"momentum": vel})


@settings(max_examples=examples(25), deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example])
@given(options(), st.sampled_from([1, 5, 12, 67, 130]), st.lists(st.integers(1, 19), min_size=0, max_size=2),
       st.integers(2, 9), st.integers(0, 2**16))
def test_dense_option_paths_reference_sim_c_equal(opt_pol, n_in, hidden, n_cls, seed):
    opt, policy = opt_pol
    layers = []
    for h in hidden:
        layers += [Dense(h), ReLU()]
    m = Sequential([*layers, Dense(n_cls)], input_shape=(n_in,), input_exp=-7, optimizer=opt, seed=seed,
                   precision=policy or None)
    x, y = _data(6, (n_in,), n_cls, seed)
    three_way(m, x, y)


CASES = [  # (options, velocity policy): the bench's combinations and drawn-looking mixes
    (dict(momentum=0.9, weight_decay=1e-3, stochastic_rounding=True, master_weights=True), {}),
    (dict(momentum=0.9), {}),
    (dict(batch_size=4, stochastic_rounding=True, weight_decay=1e-4), {}),
    (dict(weight_decay=3e-2, master_weights=True, lr=0.2), {}),
    (dict(momentum=0.5, stochastic_rounding=True, batch_size=2), {"momentum": "int16"}),
    (dict(stochastic_rounding=True), {}),  # the four-per-turn SR rows (M4), shift classes (M0)
    (dict(weight_decay=1e-3), {}),  # the four-per-turn decay rows (M4)
    (dict(weight_decay=3e-2, stochastic_rounding=True, lr=0.2), {}),
    (dict(stochastic_rounding=True), {"weights": "int8"}),  # int8 SR rows by shift class
    (dict(momentum=0.9), {"momentum": "int8"}),  # gradient-free weight accumulate, bias applied after
]


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board", ["mps2_an386", "mps2_an385", "microbit"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_dense_option_paths_bit_exact_on_qemu(board, case):
    """A 64-17-13-10 MLP on digits (the bench's model; 130-input variant for the two-chunk rows)
    under each option mix: every step's state hash on the Cortex-M4, M3 and M0 == the simulator's."""
    from tinytrain import data
    from tinytrain.verify import verify

    kw, policy = CASES[case]
    if board == "microbit" and kw.get("momentum") and not policy:
        pytest.skip("int32 momentum and its accumulators need 17-23 KB of RAM: the micro:bit has 16 KB")
    ds = data.load("digits")
    m = Sequential([Dense(17), ReLU(), Dense(13), ReLU(), Dense(10)], dataset=ds, seed=case,
                   optimizer=SGD(**{"lr": 0.05, **kw}), precision=policy or None)
    r = verify(m, ds, 12, board=board, json=True)
    assert r["steps"] == 12 and r["mismatches"] == 0, r["first_mismatch"]


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board", ["microbit", "mps2_an386", "mps2_an385"])
@pytest.mark.parametrize("policy", ["int8", "int16"])
def test_trained_model_stochastic_rounding_bit_exact_on_qemu(board, policy):
    """W1 trained 20 epochs on the host, then fine-tuned with stochastic rounding (int8 weights: the
    policy's default) on the board: its small errors put the update shift past 31, the class the
    32-bit SR rows once left for the int64 element rule (~230 instructions per weight on the M0).
    Every step's state hash == the simulator's."""
    import numpy as np

    from tinytrain import data
    from tinytrain.graph.convert import with_precision
    from tinytrain.graph.models import build_model
    from tinytrain.sim.simulator import Simulator
    from tinytrain.verify import verify

    ds = data.load("digits")
    m = build_model("digits-mlp", ds, stochastic_rounding=True)
    sim = Simulator(m)
    for epoch in range(20):
        sim.train(ds.x_train, ds.y_train, np.random.default_rng(epoch).permutation(len(ds.y_train)))
    if policy == "int8":
        m = with_precision(m, "int8")
    assert m.opt.sr
    r = verify(m, ds, 12, board=board, json=True)
    assert r["steps"] == 12 and r["mismatches"] == 0, r["first_mismatch"]
    if (board, policy) == ("microbit", "int8"):  # QEMU's count is exact: 570k per step on the int64 rule
        assert r["instructions_per_step"] < 150_000, r["instructions_per_step"]


def test_waiting_accumulate_after_a_state_write():
    """A Dense layer's weight accumulate waits for the end-of-step apply only while its accumulators
    are known to be 0 (tt_sgd_dense_apply_kept_s32, emit.keeps): a written state whose accumulators
    hold sums (a LOAD_PARAMS or a pull of a state saved elsewhere) is applied with them, as the
    reference does, and the steps after it wait again: write_state marks every keep unknown (state 0;
    the host's portable path forms the waiting accumulate into the accumulators at the end, so it is
    the M4's one pass, tests/test_sgd_apply_qemu.py, that needs the mark); the C equals the reference
    at every step."""
    import numpy as np

    from tinytrain.codegen.emit import generate
    from tinytrain.codegen.host import HostModel

    opt = SGD(lr=0.05, momentum=0.9, weight_decay=1e-3, stochastic_rounding=True, master_weights=True)
    ref = Sequential([Dense(17), ReLU(), Dense(13), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6,
                     optimizer=opt, seed=3)
    src = generate(ref).source
    assert "tt_sgd_dense_apply_kept_s32(" in src
    write = src[src.index("_write_state(uint32_t off"):]
    assert all(f"tt_model_l{li}_keep.state = 0;" in write[:write.index("\n}\n")] for li in (0, 2, 4))
    x, y = _data(12, (64,), 10, 5)
    hm = HostModel(ref.copy(), sanitize=True)
    rng = np.random.default_rng(0)
    for i in range(12):
        if i in (4, 9):  # accumulators that are not 0, written into both
            for key, A in ref.accum.items():
                A[...] = rng.integers(-(2**20), 2**20, A.shape)
            assert hm.write_state(b"".join(t.astype(t.dtype.newbyteorder("<")).tobytes() for t in ref.state_tensors())) == 0
            assert ref.state_hash() == hm.state_hash()
        a = tuple(int(v) for v in ref.ref_train_step(x[i], y[i]))
        assert a == tuple(int(v) for v in hm.train_step(x[i], y[i])), i
        assert ref.state_hash() == hm.state_hash(), i
