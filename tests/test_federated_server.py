"""Non-IID remedies: FedAvgM (server momentum, federated/server.py) and FedProx's proximal pull
(federated/prox.py) - integer rules against exact Python-int references, equal across the
engine, worker processes, resume and Flower's strategy (boards: tests/test_federated_qemu.py,
the C pull: tests/test_fedcodec.py)."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tinytrain.federated import federate
from tinytrain.federated.server import ServerMomentum, server_opt

LIM = {np.int16: 32767, np.int32: 2**31 - 1}


def _rr(x: int, s: int) -> int:
    """rshift_round on Python ints: floor(x / 2^s + 1/2)."""
    return x if s == 0 else (x + (1 << (s - 1))) >> s


@settings(max_examples=200, deadline=None)
@given(beta=st.sampled_from([0.0, 0.3, 0.5, 0.9, 0.99]), eta=st.sampled_from([1.0, 0.8, 0.5, 2.0, 4.0]),
       dt=st.sampled_from([np.int16, np.int32]), rounds=st.integers(1, 4), data=st.data())
def test_server_momentum_equals_python_ints(beta, eta, dt, rounds, data):
    """Round after round, ServerMomentum.step equals the rule in server.py computed on Python
    ints (unbounded), edge values included; beta 0 and eta 1 give the FedAvg average itself."""
    n = data.draw(st.integers(1, 12))
    lim = LIM[dt]
    vals = st.one_of(st.integers(-lim, lim), st.sampled_from([-lim, lim, 0, 1, -1]))
    o = server_opt(beta, eta)
    sm = ServerMomentum(o, [np.zeros(n, dt)])
    M = [0] * n
    g = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)), dt)
    for _ in range(rounds):
        a = np.array(data.draw(st.lists(vals, min_size=n, max_size=n)), dt)
        got = sm.step([g], [a])[0]
        want = []
        for i in range(n):
            M[i] = (_rr(M[i] * o.beta_m, o.beta_k) if o.beta_m else 0) + int(a[i]) - int(g[i])
            step = M[i] if (o.eta_m, o.eta_k) == (1, 0) else _rr(M[i] * o.eta_m, o.eta_k)
            lo = -lim if dt == np.int16 else -lim - 1
            want.append(min(max(int(g[i]) + step, lo), lim))
        assert got.dtype == dt and got.tolist() == want
        if beta == 0 and eta == 1:
            assert got.tolist() == a.tolist()
        g = got


def test_plain_settings_are_fedavg_bit_for_bit():
    kw = dict(simulated=3, rounds=2, partition="dirichlet:0.5")
    a = federate("digits-mlp", "digits", **kw)
    b = federate("digits-mlp", "digits", server_momentum=0.0, server_lr=1.0, prox_mu=0.0, **kw)
    assert a["state_hash"] == b["state_hash"]


KW = dict(simulated=4, rounds=4, partition="dirichlet:0.5", compress="int4", local_steps=50,
          server_momentum=0.5, server_lr=0.8, prox_mu=0.1, prox_every=5)


def test_fedavgm_and_fedprox_change_the_run_and_resume_bit_identically(tmp_path):
    full = federate("digits-mlp", "digits", **KW)
    plain = federate("digits-mlp", "digits", **{**KW, "server_momentum": 0.0, "server_lr": 1.0})
    noprox = federate("digits-mlp", "digits", **{**KW, "prox_mu": 0.0})
    assert len({full["state_hash"], plain["state_hash"], noprox["state_hash"]}) == 3
    out = tmp_path / "fed"
    federate("digits-mlp", "digits", **{**KW, "rounds": 2}, out=out)
    resumed = federate("digits-mlp", "digits", **KW, out=out, resume=True)
    assert resumed["state_hash"] == full["state_hash"]
    assert resumed["accuracy_per_round"] == full["accuracy_per_round"]
    with pytest.raises(ValueError, match="server_momentum=0.5, this run server_momentum=0.3"):
        federate("digits-mlp", "digits", **{**KW, "server_momentum": 0.3}, out=out, resume=True)


def test_workers_equal_one_process():
    from tinytrain.federated.pool import can_fork

    if not can_fork():
        pytest.skip("needs fork")
    a = federate("digits-mlp", "digits", **KW)
    b = federate("digits-mlp", "digits", **KW, workers=2)
    assert a["state_hash"] == b["state_hash"]


def test_prox_every_one_is_the_per_step_term():
    """every = 1: one pull after each local sample, with coefficient lr * mu."""
    from tinytrain.federated.prox import prox_config

    p = prox_config(0.2, 1, 0.05)
    assert (p.mult, p.shift) == (20972, 21)  # 0.01 ~ 20972 / 2^21 (to_mult_shift, 15 bits)
    assert prox_config(0.0, 3, 0.05) is None
    with pytest.raises(ValueError, match="rounds to zero"):
        prox_config(1e-30, 1, 0.05)


@pytest.mark.parametrize("compress", ["int8", "signmv"])
def test_flower_strategy_equals_engine(compress):
    """FedAvgM, FedProx and the majority vote give the engine's global model through Flower."""
    pytest.importorskip("flwr", reason="flwr not installed")
    pytest.importorskip("ray", reason="Flower's simulation engine needs ray")
    from tinytrain.federated.flower import run

    rc = {"server-momentum": 0.5, "server-lr": 0.8, "prox-mu": 0.1, "prox-every": 5}
    r = run("digits-mlp", "digits", clients=6, rounds=3, compress=compress, partition="dirichlet:0.5",
            local_steps=40, log=lambda s: None, run_config=rc)
    e = federate("digits-mlp", "digits", simulated=6, rounds=3, compress=compress, compress_down="none",
                 partition="dirichlet:0.5", local_steps=40, server_momentum=0.5, server_lr=0.8,
                 prox_mu=0.1, prox_every=5)
    assert r["state_hash"] == e["state_hash"]
    assert r["accuracy_per_round"] == e["accuracy_per_round"]


# ------------------------------------------------------------------ sign with majority vote

@settings(max_examples=200, deadline=None)
@given(data=st.data(), dt=st.sampled_from([np.int16, np.int32]))
def test_majority_vote_equals_python_ints(data, dt):
    """MajorityVote.result against the rule in its docstring on Python ints: sample-weighted
    votes (a tie moves up), the rounded mean shift of the devices that sent the tensor, zero
    tensors abstaining, saturation at the dtype's codec bounds."""
    from types import SimpleNamespace

    from tinytrain.federated.server import MajorityVote

    lim = LIM[dt]
    sizes = data.draw(st.lists(st.integers(1, 9), min_size=1, max_size=3))
    glob = [np.array(data.draw(st.lists(st.one_of(st.integers(-lim, lim), st.sampled_from([-lim, lim, 0])),
                                        min_size=n, max_size=n)), dt) for n in sizes]
    agg = MajorityVote(glob)
    devs = []
    for _ in range(data.draw(st.integers(1, 5))):
        n = data.draw(st.integers(1, 1000))
        signs = []
        for m in sizes:
            if data.draw(st.integers(0, 4)) == 0:
                signs.append(None)
            else:
                q = np.array(data.draw(st.lists(st.sampled_from([-1, 1]), min_size=m, max_size=m)), np.int64)
                signs.append((data.draw(st.integers(0, 20)), q))
        devs.append((n, signs))
        agg.add_update(SimpleNamespace(n_samples=n, signs=signs, codec="signmv"))
    got = agg.result()
    for i, g in enumerate(glob):
        voters = [(n, sg[i]) for n, sg in devs if sg[i] is not None]
        if not voters:
            assert got[i].tolist() == g.tolist()
            continue
        N = sum(n for n, _ in voters)
        S = (sum(n * s for n, (s, _) in voters) + N // 2) // N
        lo = -lim if dt == np.int16 else -lim - 1
        want = []
        for e in range(len(g)):
            vote = sum(n * int(q[e]) for n, (_, q) in voters)
            want.append(min(max(int(g[e]) + (1 if vote >= 0 else -1) * 2**S, lo), lim))
        assert got[i].dtype == dt and got[i].tolist() == want


def test_signmv_differs_from_sign_only_in_the_aggregation():
    """The device's signmv message equals its sign message but for the codec byte (and CRC)."""
    from tinytrain.federated.codec import CODECS, Schema, compress, encode_update, store_hash
    from tinytrain.federated.api import resolve

    m, _ = resolve("digits-mlp", "digits")
    sc = Schema.of(m)
    rng = np.random.default_rng(1)
    g = [rng.integers(-500, 500, s).astype(d) for s, d in zip(sc.shapes, sc.dtypes)]
    lo = [(t.astype(np.int64) + rng.integers(-40, 40, t.shape)).astype(t.dtype) for t in g]
    a = compress("sign", lo, g, None)
    b = compress("signmv", lo, g, None)
    assert a[0] == b[0] and store_hash(a[1]) == store_hash(b[1])
    ma = encode_update("sign", 1, 2, 3, 4, store_hash(a[1]), len(g), a[0])
    mb = encode_update("signmv", 1, 2, 3, 4, store_hash(b[1]), len(g), b[0])
    assert ma[1] == CODECS.index("sign") and mb[1] == CODECS.index("signmv") and ma[2:-4] == mb[2:-4]


def test_preloaded_sends_less_and_trains_the_same():
    """--preloaded: round 1's broadcast is a delta against the initial model the devices hold;
    the devices train from the same model, so the run is identical but for the bytes."""
    kw = dict(simulated=4, rounds=2, compress="signmv", partition="dirichlet:0.5", local_steps=40)
    a = federate("digits-mlp", "digits", **kw)
    b = federate("digits-mlp", "digits", preloaded=True, **kw)
    c = federate("digits-mlp", "digits", preloaded=True, workers=2, **kw)
    assert a["state_hash"] == b["state_hash"] == c["state_hash"]
    assert b["bytes_up"] == a["bytes_up"] and b["bytes_down"] == c["bytes_down"] < a["bytes_down"] - 15000
    with pytest.raises(ValueError, match="--preloaded with an uncompressed broadcast"):
        federate("digits-mlp", "digits", simulated=2, rounds=1, preloaded=True)


# ------------------------------------------------------------------ residual width

def test_residual_bits_32_equals_64_on_w1_and_16_saturates():
    """W1's residuals never leave int32 (the default width): the run equals int64's bit for
    bit; int16 saturates the sign residual (counted), which changes the run."""
    kw = dict(simulated=4, rounds=3, compress="sign", partition="dirichlet:0.5", local_steps=60)
    r64 = federate("digits-mlp", "digits", residual_bits=64, **kw)
    r32 = federate("digits-mlp", "digits", residual_bits=32, **kw)
    r16 = federate("digits-mlp", "digits", residual_bits=16, **kw)
    assert r64["state_hash"] == r32["state_hash"] != r16["state_hash"]
    assert r64["residual_saturated"] == r32["residual_saturated"] == 0 < r16["residual_saturated"]
    with pytest.raises(ValueError, match="--residual-bits 8: use one of 64, 32, 16"):
        federate("digits-mlp", "digits", residual_bits=8, **kw)


def test_compress_saturates_the_residual_to_its_width():
    from tinytrain.federated.codec import compress

    g = [np.zeros(4, np.int16)]
    lo = [np.array([32767, -32767, 5, 0], np.int16)]
    st_ = {}
    _, recon, res = compress("sign", lo, g, [np.array([40000, -40000, 0, 0], np.int64)], 16, st_)
    assert res[0].min() >= -32768 and res[0].max() <= 32767 and st_["residual_saturated"] == 2


def test_flower_nodes_serving_several_devices_equal_engine():
    """run_config devices-per-node=2: 3 SuperNodes serve 6 tinytrain devices (ids 2p, 2p + 1):
    the engine's global model with 6 simulated devices, bit for bit."""
    pytest.importorskip("flwr", reason="flwr not installed")
    pytest.importorskip("ray", reason="Flower's simulation engine needs ray")
    from tinytrain.federated.flower import run

    r = run("digits-mlp", "digits", clients=0, nodes=3, rounds=2, compress="int8", local_steps=30,
            log=lambda s: None, run_config={"devices-per-node": 2})
    e = federate("digits-mlp", "digits", simulated=6, rounds=2, compress="int8", compress_down="none",
                 local_steps=30)
    assert r["clients"] == 6 and r["state_hash"] == e["state_hash"]
    assert r["accuracy_per_round"] == e["accuracy_per_round"]
