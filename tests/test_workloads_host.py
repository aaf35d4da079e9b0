"""W1, W2 and W3 for full epochs: the generated C (host build through cffi) equals the
simulator after every step (tinytrain.verify on board "host")."""
from __future__ import annotations

import pytest

from tinytrain import data
from tinytrain.graph.models import build_model
from tinytrain.verify import verify


@pytest.mark.parametrize("name,dataset,epochs", [
    ("digits-mlp", "digits", 2),
    ("digits-cnn", "digits-image", 1),
    ("mnist1d-cnn", "mnist1d", 1),
    ("mnist1d-cnn-pool", "mnist1d", 1),
])
def test_workload_full_epochs_bit_exact_on_host(name, dataset, epochs):
    ds = data.load(dataset)
    model = build_model(name, ds, seed=0)
    steps = epochs * len(ds.x_train)
    r = verify(model, ds, steps, board="host", seed=1)
    assert r["steps"] == steps
    assert r["mismatches"] == 0, r["first_mismatch"]
