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


def test_flower_strategy_equals_engine():
    pytest.importorskip("flwr", reason="flwr not installed")
    pytest.importorskip("ray", reason="Flower's simulation engine needs ray")
    from tinytrain.federated.flower import run

    rc = {"server-momentum": 0.5, "server-lr": 0.8, "prox-mu": 0.1, "prox-every": 5}
    r = run("digits-mlp", "digits", clients=6, rounds=3, compress="int8", partition="dirichlet:0.5",
            local_steps=40, log=lambda s: None, run_config=rc)
    e = federate("digits-mlp", "digits", simulated=6, rounds=3, compress="int8", compress_down="none",
                 partition="dirichlet:0.5", local_steps=40, server_momentum=0.5, server_lr=0.8,
                 prox_mu=0.1, prox_every=5)
    assert r["state_hash"] == e["state_hash"]
    assert r["accuracy_per_round"] == e["accuracy_per_round"]
