"""Simulated devices in worker processes (pool.SimPool, `federate --workers`): the same global
model, accuracies, bytes and drops as one process, bit for bit, with error feedback, delta
broadcasts and resume; and a worker pool scales to 10,000 clients of mnist1d:N."""
import json

import pytest

from tinytrain.federated import federate, resolve
from tinytrain.federated.pool import can_fork

pytestmark = pytest.mark.skipif(not can_fork(), reason="worker processes need fork (Linux)")

SAME = ("state_hash", "accuracy_per_round", "bytes_up", "bytes_down", "dropped_updates")


@pytest.fixture(scope="module")
def w1():
    return resolve("digits-mlp", "digits")


@pytest.mark.parametrize("codec,down", [("none", None), ("int8", None), ("int4", "int8"), ("sign", "none"),
                                        ("topk16", "topk32"), ("int4b32", "int4b64")])
def test_workers_equal_one_process(w1, codec, down):
    model, ds = w1
    kw = dict(simulated=7, rounds=3, partition="dirichlet:0.5", local_steps=40, compress=codec,
              compress_down=down)
    one = federate(model, ds, **kw)
    three = federate(model, ds, workers=3, **kw)
    assert {k: three[k] for k in SAME} == {k: one[k] for k in SAME}
    assert [h["accepted"] for h in three["history"]] == [h["accepted"] for h in one["history"]]



@pytest.mark.parametrize("codec", ["int8", "signmv"])
def test_updates_checked_in_the_workers_drop_what_the_coordinator_drops(w1, codec):
    """Each worker checks its devices' updates and sends partial sums: injected faults, a corrupted
    and a tampered update (only the hash catches it) in both shards are dropped with the same
    reasons, and the global model, bytes and accuracies equal one process's (FedAvg, and the
    sign vote's sums)."""
    from tinytrain.federated import FaultyDevice, FedConfig, Federation, make_devices
    from tinytrain.federated.pool import SimPool

    model, ds = w1
    cfg = FedConfig(rounds=3, local_steps=12, compress=codec, partition="dirichlet:0.5", quorum=0.5)
    plan = {(1, 0): "tamper", (2, 6): "corrupt", (2, 1): "timeout", (3, 8): "reset", (3, 2): "tamper"}

    def run(workers):
        devs = [FaultyDevice(d, plan) for d in make_devices(model, ds, cfg, simulated=9)]
        fed = Federation(model, ds, SimPool(devs, workers).proxies if workers > 1 else devs, cfg)
        try:
            fed.run()
            return fed.history, fed.state_hash()
        finally:
            fed.close()

    (one, h1), (two, h2) = run(1), run(2)
    assert h1 == h2
    keys = ("accepted", "dropped", "samples", "bytes_up", "bytes_down", "accuracy", "state_hash")
    assert [{k: e[k] for k in keys} for e in two] == [{k: e[k] for k in keys} for e in one]
    assert [len(e["dropped"]) for e in one] == [1, 2, 2]
    assert {d["reason"] for e in one for d in e["dropped"]} == {"corrupt", "timeout", "reset"}


def test_workers_resume_equals_uninterrupted(w1, tmp_path):
    """Residuals and the held broadcast go to the fleet checkpoint from the workers and back."""
    model, ds = w1
    kw = dict(simulated=5, partition="iid", local_steps=30, compress="int8")
    a = federate(model, ds, rounds=4, **kw)
    federate(model, ds, rounds=2, out=tmp_path / "b", workers=2, **kw)
    b = federate(model, ds, rounds=4, out=tmp_path / "b", resume=True, workers=2, **kw)
    assert {k: b[k] for k in SAME} == {k: a[k] for k in SAME}


def test_ten_thousand_clients_of_mnist1d_n_on_two_workers():
    model, ds = resolve("digits-mlp", "mnist1d-flat:100000")
    r = federate(model, ds, simulated=10_000, rounds=1, compress="int8", workers=2)
    h = r["history"][0]
    assert h["accepted"] == 10_000 and h["samples"] == 100_000 and r["dropped_updates"] == 0


@pytest.mark.parametrize("argv,msg", [
    (["--simulated", "4", "--workers", "-1"], "--workers -1: give a count >= 1"),
    (["--board", "mps2_an386", "--workers", "2"], "only with --simulated"),
])
def test_cli_bad_workers(argv, msg, capsys):
    from tinytrain.cli import main

    rc = main(["federate", "--rounds", "1", "--model", "digits-mlp", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and msg in err[0]


def test_cli_workers_json(capsys):
    from tinytrain.cli import main

    argv = ["federate", "--simulated", "6", "--rounds", "2", "--model", "digits-mlp",
            "--local-steps", "20", "--compress", "int8", "--json"]
    assert main(argv) == 0
    one = json.loads(capsys.readouterr().out)
    assert main(argv + ["--workers", "0"]) == 0
    many = json.loads(capsys.readouterr().out)
    assert many["state_hash"] == one["state_hash"] and many["bytes_on_wire"] == one["bytes_on_wire"]


def test_build_in_workers_builds_after_the_fork_and_reports_a_failed_build(w1):
    """make_devices with workers builds no device in the coordinator: each worker builds its own
    shard (pool.SimPool.build_in_workers), in device order; a build that raises in a worker is
    raised by the coordinator's first command, not lost as a dead pipe."""
    import os

    from tinytrain.federated import FedConfig, make_devices
    from tinytrain.federated.devices import SimDevice
    from tinytrain.federated.pool import SimPool

    model, ds = w1
    built = []
    init = SimDevice.__init__

    def spy(self, *a, **k):
        built.append(os.getpid())
        init(self, *a, **k)

    SimDevice.__init__ = spy
    try:
        proxies = make_devices(model, ds, FedConfig(compress="int8"), simulated=5, workers=2)
    finally:
        SimDevice.__init__ = init
    try:
        assert built == [] and [p.id for p in proxies] == list(range(5))
        assert sum(p.n_samples for p in proxies) == len(ds.y_train)
        pids = {p.pid for p in proxies[0].group.procs}
        assert sorted(proxies[0].group.get_states()) == list(range(5))  # each worker's residuals
        assert len(pids) == 2 and os.getpid() not in pids
    finally:
        proxies[0].close()

    def bad(i):
        raise ValueError(f"no device {i}")

    pool = SimPool.build_in_workers([(0, 3), (1, 3)], bad, 2)
    try:
        with pytest.raises(RuntimeError, match="could not build its devices.*no device"):
            pool.ack(1, ())
    finally:
        pool.close()
