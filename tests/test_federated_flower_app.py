"""The Flower App (examples/flower-app) run as Flower users run it: `flwr run` against a
SuperLink in simulation mode (started here on a free localhost port, insecure: a local test),
settings from run_config; the global model after every round equals tinytrain's own engine's,
bit for bit; a bad run_config value fails the run and saves nothing."""
import json

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr not installed (pip install tinytrain[flower])")
pytest.importorskip("ray", reason="Flower's simulation engine needs ray (pip install 'flwr[simulation]')")

from tests.flowerutil import Flower  # noqa: E402


@pytest.fixture(scope="module")
def flower(tmp_path_factory):
    f = Flower(tmp_path_factory.mktemp("flwr-home"), simulation=True)
    yield f
    f.close()


def test_flwr_run_equals_engine_bit_for_bit(flower, tmp_path):
    from tinytrain.federated import federate
    from tinytrain.federated.fedavg import store_tensors
    from tinytrain.graph import io as tio

    out = tmp_path / "fl"
    rc = flower.run(f'out-dir="{out}" num-server-rounds=3 partition="dirichlet:0.5" compress="int4" '
                    'local-steps=200 seed=3', "--federation-config", "num-supernodes=5")
    assert rc.returncode == 0, rc.stdout[-3000:] + rc.stderr[-3000:]
    s = json.loads((out / "summary.json").read_text())
    e = federate("digits-mlp", "digits", simulated=5, rounds=3, partition="dirichlet:0.5", compress="int4",
                 local_steps=200, seed=3, compress_down="none", out=tmp_path / "engine")
    assert s["rounds"] == 3 and s["clients"] == 5 and s["dropped_updates"] == 0
    assert s["state_hash"] == e["state_hash"] and s["accuracy_per_round"] == e["accuracy_per_round"]
    assert s["bytes_up"] == e["bytes_up"]
    for r in (1, 2, 3):
        a, _ = tio.load(out / "rounds" / f"global-r{r:04d}.tt")
        b, _ = tio.load(tmp_path / "engine" / "rounds" / f"global-r{r:04d}.tt")
        for x, y in zip(store_tensors(a), store_tensors(b)):
            assert x.dtype == y.dtype and np.array_equal(x, y), f"round {r}"
        assert a.meta.tolist() == b.meta.tolist()
    m, extra = tio.load(out / "global.tt")
    assert f"{m.state_hash():08x}" == e["state_hash"] and extra["federated"]["round"] == 3
    assert "'accuracy'" in rc.stdout + rc.stderr  # centralized evaluation logged as a MetricRecord


def test_flwr_run_bad_run_config_fails_and_saves_nothing(flower, tmp_path):
    out = tmp_path / "bad"
    rc = flower.run(f'out-dir="{out}" compress="int9"', "--federation-config", "num-supernodes=2")
    assert "compress='int9': use one of none, int8, int4, sign" in rc.stdout + rc.stderr
    assert not out.exists()
