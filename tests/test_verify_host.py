"""verify() on the host target: the generated C (cffi) against the simulator, step by step."""
import numpy as np
import pytest

from tinytrain import data
from tinytrain.graph.layers import Dense, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.verify import locate, sample_order, state_blob, state_layout, verify


@pytest.fixture(scope="module")
def ds():
    return data.load("digits")


def w1(ds, **opt):
    return Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=ds.input_exp - 4,
                      optimizer=SGD(lr=0.05, **opt), seed=0)


def slot(model, layer, param):
    return next(s for s in state_layout(model) if s.layer == layer and s.param == param)


def test_w1_host_bit_exact_every_step(ds):
    m = w1(ds)
    h0 = m.state_hash()
    r = verify(m, ds, 400, board="host")
    assert r["mismatches"] == 0 and r["first_mismatch"] is None, r["first_mismatch"]
    assert r["steps"] == 400 and r["board"] == "host" and r["instructions_per_step"] is None
    assert r["ram_bytes"] > 0
    assert m.state_hash() == h0  # the caller's model is not trained


def test_w1_host_with_sr_momentum_batch(ds):
    m = w1(ds, stochastic_rounding=True, batch_size=4, momentum=0.9)
    r = verify(m, ds, 120, board="host", seed=3)
    assert r["mismatches"] == 0, r["first_mismatch"]


def test_corrupted_parameter_is_caught_and_located(ds):
    m = w1(ds)
    s = slot(m, 2, "w")  # int16 (10, 32): flip the high byte of element 37 -> value +-256
    r = verify(m, ds, 100, board="host", corrupt=(25, s.offset + 2 * 37 + 1))
    fm = r["first_mismatch"]
    assert r["mismatches"] == 1 and r["steps"] == 26 and fm["step"] == 25
    assert (fm["layer"], fm["op"], fm["param"], fm["role"]) == (2, "dense", "w", "param")
    assert fm["index"] == 37 and fm["multi_index"] == [1, 5] and fm["differing"] == 1
    assert abs(fm["expected"] - fm["device"]) == 256
    assert fm["hash_expected"] != fm["hash_device"]


@pytest.mark.parametrize("opt", [{}, {"stochastic_rounding": True, "batch_size": 3, "momentum": 0.9},
                                 {"master_weights": True, "weight_decay": 1e-3}])
def test_the_reference_as_checker_sees_what_the_simulator_sees(ds, opt):
    """checker="reference" (what sweeps use: no simulator compiled) compares the C with the numpy
    reference every step: the same steps and final state as with the simulator, and a flipped
    byte is caught at the same step and located in the same tensor and element."""
    m = w1(ds, **opt)
    a = verify(m, ds, 30, board="host", seed=1, checker="reference")
    b = verify(m, ds, 30, board="host", seed=1)
    assert a["mismatches"] == b["mismatches"] == 0, (a["first_mismatch"], b["first_mismatch"])
    assert a["steps"] == b["steps"] == 30
    s = slot(m, 0, "w")
    ra = verify(m, ds, 30, board="host", corrupt=(11, s.offset + 2 * 100 + 1), checker="reference")
    rb = verify(m, ds, 30, board="host", corrupt=(11, s.offset + 2 * 100 + 1))
    fa, fb = ra["first_mismatch"], rb["first_mismatch"]
    assert ra["steps"] == rb["steps"] == 12 and fa["parties"] == ["reference", "host"]
    assert {k: fa[k] for k in ("step", "layer", "param", "index", "expected", "device", "hash_expected")} == \
        {k: fb[k] for k in ("step", "layer", "param", "index", "expected", "device", "hash_expected")}
    with pytest.raises(ValueError, match="checker"):
        verify(m, ds, 1, board="host", checker="numba")


def test_locate_names_meta_and_sizes(ds):
    m = w1(ds)
    blob = bytearray(state_blob(m))
    assert len(blob) == sum(s.nbytes for s in state_layout(m))
    assert locate(m, bytes(blob), bytes(blob)) is None
    blob[-8] ^= 0xFF  # meta[1]: the optimizer step
    where = locate(m, state_blob(m), bytes(blob))
    assert where["role"] == "meta" and where["index"] == 1
    assert locate(m, bytes(blob), bytes(blob[:-1]))["note"] == "blob sizes differ"


def test_sample_order_is_the_data_prng_permutation():
    o = sample_order(10, 25, seed=1)
    assert len(o) == 25
    for epoch in (o[:10], o[10:20]):
        assert sorted(epoch) == list(range(10))
    assert not np.array_equal(o[:10], o[10:20])
    assert np.array_equal(sample_order(10, 7, seed=1), o[:7])


def test_cli_verify_json_last_line(capsys):
    import json

    from tinytrain import cli

    rc = cli.main(["verify", "--board", "host", "--model", "digits-mlp", "--steps", "60", "--json"])
    out = capsys.readouterr().out.strip().splitlines()
    r = json.loads(out[-1])
    assert rc == 0 and r["mismatches"] == 0 and r["steps"] == 60 and r["board"] == "host"
    assert {"instructions_per_step", "ram_bytes"} <= set(r)


def test_reference_as_third_party(ds):
    m = w1(ds, momentum=0.9, batch_size=2)
    r = verify(m, ds, 80, board="host", reference=True)
    assert r["reference"] and r["mismatches"] == 0 and r["steps"] == 80, r["first_mismatch"]


def test_reference_divergence_is_located(ds, monkeypatch):
    """A reference that drifts from the simulator (here: the output layer's weight gradient off
    in element 5 from its 31st backward on) stops verification at that step and names the
    reference and the simulator. Only the reference calls ref_backward (the simulator is numba,
    the target C), so patching it changes the reference alone."""
    from tinytrain.graph.layers import Dense as D

    orig, calls = D.ref_backward, []

    def drifting(self, e, ee, saved, need_dx):
        dx, edx, n, grads = orig(self, e, ee, saved, need_dx)
        if self.units == 10:
            calls.append(1)
            if len(calls) > 30:
                g = grads[0][0].copy()
                g.flat[5] += 1 << 12
                grads = [(g, grads[0][1]), grads[1]]
        return dx, edx, n, grads

    monkeypatch.setattr(D, "ref_backward", drifting)
    r = verify(w1(ds), ds, 100, board="host", reference=True)
    fm = r["first_mismatch"]
    assert r["mismatches"] == 1 and fm["parties"] == ["reference", "simulator"], fm
    assert fm["step"] == 30 and r["steps"] == 30
    assert (fm["layer"], fm["op"], fm["param"]) == (2, "dense", "w") and fm["index"] == 5


def test_cli_verify_reference(capsys):
    import json

    from tinytrain import cli

    rc = cli.main(["verify", "--board", "host", "--model", "digits-mlp", "--steps", "40", "--reference", "--json"])
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rc == 0 and r["reference"] is True and r["mismatches"] == 0 and r["steps"] == 40
