"""Flower simulation (optional extra `flower`, engine `flwr[simulation]`): 100 tinytrain
clients through Flower's run_simulation with the IntegerFedAvg strategy; the result equals
tinytrain's own engine with the same devices, bit for bit."""
import pytest

flwr = pytest.importorskip("flwr", reason="flwr not installed (pip install tinytrain[flower])")
pytest.importorskip("ray", reason="Flower's simulation engine needs ray (pip install 'flwr[simulation]')")


def test_flower_simulation_100_clients_equals_engine():
    from tinytrain.federated import federate
    from tinytrain.federated.flower import run

    r = run("digits-mlp", "digits", clients=100, rounds=2, compress="int8", log=lambda s: None)
    assert r["clients"] == 100 and r["rounds"] == 2 and r["dropped_updates"] == 0
    e = federate("digits-mlp", "digits", simulated=100, rounds=2, compress="int8", compress_down="none")
    assert r["state_hash"] == e["state_hash"] and r["bytes_up"] == e["bytes_up"]
    assert r["accuracy_per_round"] == e["accuracy_per_round"]
