"""`tinytrain pareto`: the frontier on drawn points, the grid's pieces, and a real W1 sweep of two
points measured and verified on the QEMU micro:bit, whose chosen model builds and verifies."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import examples
from tests.test_boards_qemu import needs_qemu
from tinytrain import pareto as P

point = st.fixed_dictionaries({"val_accuracy": st.integers(0, 6).map(lambda v: v / 6),
                               "training_ram": st.one_of(st.none(), st.integers(1, 8))})


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(point, max_size=12))
def test_frontier_is_the_set_no_point_beats(pts):
    """Brute force: a point is on the frontier iff no other has at least its accuracy at no
    more RAM and is better in one of them; of identical points only the first is kept."""
    got = P.frontier(pts, "training_ram")
    ok = [i for i, p in enumerate(pts) if p["training_ram"] is not None]

    def beaten(i):
        a = pts[i]
        for j in ok:
            b = pts[j]
            if j == i:
                continue
            if b["val_accuracy"] >= a["val_accuracy"] and b["training_ram"] <= a["training_ram"]:
                same = (b["val_accuracy"], b["training_ram"]) == (a["val_accuracy"], a["training_ram"])
                if not same or j < i:
                    return True
        return False

    assert sorted(got) == [i for i in ok if not beaten(i)]
    assert [pts[i]["training_ram"] for i in got] == sorted(pts[i]["training_ram"] for i in got)


def test_budget_parsing_and_the_closest_miss():
    assert P.parse_budget("ram=16384, flash=1_000,instructions=5") == {"ram": 16384, "flash": 1000, "instructions": 5}
    assert P.parse_budget(None) == {}
    for bad, msg in (("ram", "give KEY=INTEGER"), ("speed=3", "give KEY=INTEGER"), ("ram=-1", "positive integer"),
                     ("flash=lots", "positive integer")):
        with pytest.raises(P.ParetoError, match=msg):
            P.parse_budget(bad)
    pts = [{"width": 1, "policy": "int16", "sparsity": 0, "train": "all", "ram_total": 12000, "flash_total": 30000,
            "instructions_per_sample": 90000},
           {"width": 0.5, "policy": "int8", "sparsity": 0, "train": "bias", "ram_total": 9000, "flash_total": 30000,
            "instructions_per_sample": 50000}]
    msg = P.closest_miss(pts, {"ram": 8000}, 16384, 262144)
    assert msg == ("no configuration meets --budget ram = 8000: the closest (width 0.5, int8, sparsity 0, train bias) "
                   "needs 9000 B, 1000 over (12.5 %); raise the budget or widen the grid")
    msg = P.closest_miss(pts, {"instructions": 40000}, 16384, 262144)
    assert "--budget instructions = 40000" in msg and "50000 instructions per sample, 10000 over (25.0 %)" in msg
    assert "the board's ram = 8192" in P.closest_miss(pts, {}, 8192, 262144)


def test_widths_scale_hidden_layers_and_the_carve_is_fixed():
    from tinytrain import data
    from tinytrain.graph.models import model_spec

    ds = data.load("digits-image")
    spec = model_spec("digits-cnn", ds)
    half = P.scaled(spec, 0.5)
    assert [l.get("filters") for l in half["layers"] if "filters" in l] == [4, 8]
    assert [l["units"] for l in half["layers"] if "units" in l] == [10]  # the classes stay
    assert spec["layers"][0]["filters"] == 8  # the original is not changed
    part = P.carve(ds)
    n = len(ds.x_train)
    assert len(part.x_test) == round(0.15 * n) and len(part.x_train) + len(part.x_test) == n
    assert np.array_equal(P.carve(ds).y_test, part.y_test)
    rows = {r.tobytes() for r in ds.x_train.reshape(n, -1)}
    assert all(r.tobytes() in rows for r in part.x_test.reshape(len(part.x_test), -1))
    assert np.array_equal(P.carve(ds).x_train, part.x_train)


@pytest.mark.qemu
@needs_qemu
def test_w1_sweep_on_the_microbit_and_the_chosen_model(tmp_path, capsys):
    """Two points (all, bias) of W1: each measured from its linked firmware and verified on the
    QEMU micro:bit; bias-only training needs less RAM (its weights go to flash); the chosen
    .tt verifies on the host build as it is, the .json builds as a model description."""
    from tinytrain import cli

    out = tmp_path / "best.tt"
    argv = ["pareto", "--model", "digits-mlp", "--board", "microbit", "--widths", "1", "--policies", "int16",
            "--sparsities", "0", "--train", "all,bias", "--epochs", "2", "--steps", "3", "--jobs", "2",
            "--out", str(out), "--plot", str(tmp_path / "p.png"), "--json"]
    assert cli.main(argv) == 0
    r = json.loads(capsys.readouterr().out)
    a, b = r["points"]
    assert (a["train"], b["train"]) == ("all", "bias")
    for p in (a, b):
        assert p["fits"] and p["feasible"] and p["verified_steps"] == 3 and p["instructions_per_sample"] > 0
    assert b["training_ram"] < a["training_ram"] and b["params"] == a["params"]
    assert r["chosen"] in r["frontier_training_ram"] and (tmp_path / "p.png").stat().st_size > 0
    assert r["val_samples"] == round(0.15 * (r["train_samples"] + r["val_samples"]))
    assert cli.main(["verify", "--board", "host", "--model", str(out), "--steps", "20", "--json"]) == 0
    v = json.loads(capsys.readouterr().out)
    assert v["mismatches"] == 0 and v["steps"] == 20
    from tinytrain.graph import io as tio
    assert v["hash_initial"] == f"0x{tio.load(out)[0].state_hash():08x}"


def test_the_chosen_description_is_a_model_file_codegen_takes(tmp_path):
    """--out X.json writes the chosen configuration as a model description (scaled widths,
    policy, pruning, what trains) that build_model and codegen take as they are."""
    from tinytrain import cli, data
    from tinytrain.graph.models import build_model, model_spec

    ds = data.load("digits")
    spec = P.scaled(model_spec("digits-mlp", ds), 0.5)
    spec["prune"] = P.prune_spec(0.5, 3000)
    desc = P._description(spec, "int8-master16", "last:1")
    out = tmp_path / "best.json"
    P.write_chosen({"chosen": 0, "points": [{}], "data": "digits", "_models": [(None, desc)]}, out)
    m = build_model(str(out), ds)
    assert 16 in m.layers[0].params[0].data.shape and m.precision.weights == "int8"
    assert m.optimizer.train == "last:1" and m.prune.final_sparsity == 0.5
    assert cli.main(["codegen", "--model", str(out), "--data", "digits", "--out", str(tmp_path / "gen")]) == 0


def test_partial_points_start_from_the_pretrained_all_point_and_repeat_exactly():
    """A family: 'all' trained from scratch; 'bias' and 'last:1' continue from its state and
    change only what they train; the whole family is the same on a rerun."""
    from tinytrain import data
    from tinytrain.graph.models import model_spec

    ds = data.load("digits")
    part = P.carve(ds)
    t = (model_spec("digits-mlp", ds), (0.5, "int16", 0.5), ("all", "bias", "last:1"), part, ds, 1, 1, 0)
    points, models = P._family(t)
    again, models2 = P._family(t)
    assert points == again
    assert [m.state_hash() for m, _ in models] == [m.state_hash() for m, _ in models2]
    (a, _), (b, _), (c, _) = models
    assert int(b.meta[1]) == int(a.meta[1]) + len(part.x_train)  # the optimizer step goes on
    for li in (0, 2):
        assert np.array_equal(a.layers[li].params[0].data, b.layers[li].params[0].data)  # bias: weights frozen
    assert np.array_equal(a.layers[0].params[0].data, c.layers[0].params[0].data)  # last:1: first layer frozen
    assert not np.array_equal(a.layers[2].params[0].data, c.layers[2].params[0].data)
    from tinytrain.graph.prune import zeros_for
    assert int((c.layers[2].params[0].data == 0).sum()) >= zeros_for(0.5, c.layers[2].params[0].data.size)
    assert [p["train"] for p in points] == ["all", "bias", "last:1"] and points[0]["params"] == points[1]["params"]
