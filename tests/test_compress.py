"""tinytrain compress: a pipeline equals the same trainings done by hand, resumes bit-identically
after a killed stage, refuses a changed schedule; the accuracy-aware controller's decisions on
scripted metrics and on a real tiny run."""
from __future__ import annotations

import dataclasses
import json
from fractions import Fraction

import numpy as np

from tinytrain import cli, data
from tinytrain.compress import stages as S
from tinytrain.compress.adaptive import Controller
from tinytrain.graph import io as tio
from tinytrain.graph import prune as P
from tinytrain.graph.convert import with_precision
from tinytrain.graph.models import build_model
from tinytrain.train import fit

SCHEDULE = """
model = "digits-mlp"
data = "digits"
seed = 3
validation = 0.1

[[stage]]
kind = "train"
epochs = 2

[[stage]]
name = "prune"
kind = "prune"
epochs = 2
prune = { schedule = "polynomial", final_sparsity = 0.7, begin_epoch = 0, end_epoch = 1, frequency = 300 }

[[stage]]
name = "q8"
kind = "quantize"
epochs = 1
precision = "int8-master16"

[[stage]]
name = "ft"
kind = "finetune"
epochs = 2
lr = 0.02
"""


def _run(tmp_path, out, *extra):
    (tmp_path / "s.toml").write_text(SCHEDULE)
    return cli.main(["compress", "--schedule", str(tmp_path / "s.toml"), "--out", str(out), "--json", *extra])


def _by_hand():
    """The same four trainings with the public pieces: fit, prune.attach, with_precision, SGD."""
    ds = data.load("digits")
    train, valid = S.split_validation(ds, 0.1)
    n = len(train.x_train)
    m = build_model("digits-mlp", ds, seed=3)
    hashes = []
    fit(m, train, 2, seed=3 + 1000)
    hashes.append(m.state_hash())
    t = int(m.meta[1])
    P.attach(m, {"schedule": "polynomial", "final_sparsity": 0.7, "begin_step": t, "end_step": t + n, "frequency": 300})
    fit(m, train, 2, seed=3 + 2000)
    hashes.append(m.state_hash())
    m = with_precision(m, "int8-master16")
    fit(m, train, 1, seed=3 + 3000)
    hashes.append(m.state_hash())
    m.optimizer = dataclasses.replace(m.optimizer, lr=0.02)
    m.opt = m.optimizer.compile()
    fit(m, train, 2, seed=3 + 4000)
    hashes.append(m.state_hash())
    return hashes, m, valid


def test_pipeline_equals_the_trainings_by_hand(tmp_path, capsys):
    assert _run(tmp_path, tmp_path / "out") == 0
    r = json.loads(capsys.readouterr().out)
    hashes, m, valid = _by_hand()
    assert [s["state_hash"] for s in r["stages"][1:]] == [f"{h:08x}" for h in hashes]
    saved, _ = tio.load(r["final"])
    assert saved.state_hash() == hashes[-1]
    z = P.sparsity(saved)
    assert all(zz == P.zeros_for(0.7, nn) for zz, nn in z.values())  # the exact target, kept through int8
    assert r["stages"][3]["precision"] == "int8-master16"
    from tinytrain.train import evaluate
    assert r["stages"][-1]["validation_accuracy"] == evaluate(m, valid)["accuracy"]
    man = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert [s["file"] for s in man["stages"]] == ["01-train.tt", "02-prune.tt", "03-q8.tt", "04-ft.tt"]
    # a rerun has nothing left to do and says so
    assert _run(tmp_path, tmp_path / "out") == 0
    again = json.loads(capsys.readouterr().out)
    assert again["resumed_after"] == 4 and again["final_state_hash"] == r["final_state_hash"]


def test_resume_after_a_killed_stage_gives_the_same_final_hash(tmp_path, capsys, monkeypatch):
    import tinytrain.train as T

    assert _run(tmp_path, tmp_path / "straight") == 0
    want = json.loads(capsys.readouterr().out)["final_state_hash"]
    calls, real = [], T._save_checkpoint

    def killed(*a, **k):  # the process dies right after stage 2's first epoch checkpoint
        real(*a, **k)
        calls.append(a[1])
        if len(calls) == 3:
            raise KeyboardInterrupt
    monkeypatch.setattr(T, "_save_checkpoint", killed)
    out = tmp_path / "killed"
    assert _run(tmp_path, out) == 130
    capsys.readouterr()
    man = json.loads((out / "manifest.json").read_text())
    assert [s["name"] for s in man["stages"]] == ["train"]  # the last good state
    first = (out / "01-train.tt").read_bytes()
    assert len(list(out.glob(".02-prune.*.partial.tt"))) == 1 and not (out / "02-prune.tt").exists()
    monkeypatch.setattr(T, "_save_checkpoint", real)
    assert _run(tmp_path, out) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["resumed_after"] == 1 and r["stages"][2]["resumed_from_epoch"] == 1
    assert r["final_state_hash"] == want
    assert (out / "01-train.tt").read_bytes() == first and not list(out.glob(".*.partial.tt"))


def test_a_changed_stage_or_file_is_refused(tmp_path, capsys):
    assert _run(tmp_path, tmp_path / "out") == 0
    capsys.readouterr()
    (tmp_path / "s.toml").write_text(SCHEDULE.replace("epochs = 1\n", "epochs = 2\n"))
    code = cli.main(["compress", "--schedule", str(tmp_path / "s.toml"), "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "stage 3 (q8) has changed since it was run" in err[0]
    (tmp_path / "s.toml").write_text(SCHEDULE)
    f = tmp_path / "out" / "02-prune.tt"
    f.write_bytes(f.read_bytes()[:-1] + b"\0")
    assert _run(tmp_path, tmp_path / "out") == 2
    assert "02-prune.tt: missing or changed since its stage completed" in capsys.readouterr().err


# ------------------------------------------------------------------ the controller

def _feed(ctl, script):
    """Feed (correct, sat, underflow) per epoch; returns the decisions."""
    out = [ctl.start()]
    for c, s, u in script:
        out.append(ctl.observe(c, s, u))
        if out[-1].kind == "stop":
            break
    return out


def test_controller_on_a_scripted_metric_sequence():
    ctl = Controller(100, 100)  # NNCF's defaults: tolerable 99 correct of 100
    assert ctl.tolerable == 99
    ok, bad = (100, 0, 0), (98, 0, 0)
    # initial 5 epochs; 0.1 .. 0.5 within; 0.6 fails; 0.55 within; 0.575 fails -> step 0.0125 < 0.025: stop
    script = [ok] * 5 + [ok] * 3 * 5 + [bad] * 3 + [(97, 0, 0), (99, 0, 0), (98, 0, 0)] + [bad] * 3
    d = _feed(ctl, script)
    rates = [lv.rate for lv in ctl.levels]
    assert rates == [0] + [Fraction(k, 10) for k in range(1, 7)] + [Fraction(55, 100), Fraction(575, 1000)]
    assert d[-1].kind == "stop" and "below min_step" in d[-1].note
    assert ctl.levels[ctl.result].rate == Fraction(55, 100) and ctl.met
    assert [lv.within for lv in ctl.levels] == [True] * 6 + [False, True, False]
    downs = [x for x in d if x.note.startswith("sparsity") and "(down)" in x.note]
    assert len(downs) == 1 and downs[0].restore  # a move down starts from the best copy
    assert sum(x.promote for x in d) == 7  # initial, 0.1 .. 0.5, 0.55
    assert d[6].snapshot and not d[7].snapshot  # the level's best epoch is the first of equal ones


def test_controller_brake_and_precision_ladder():
    ctl = Controller(100, 100, precisions=["int8-master16", "int8"], initial_epochs=1, patience=1)
    ref = (100, Fraction(1, 10), Fraction(100))
    # int8-master16 within; int8 within on accuracy but its underflows 3x the reference: braked
    d = _feed(ctl, [ref, (100, Fraction(1, 10), Fraction(150)), (100, Fraction(1, 10), Fraction(300)),
                    (100, Fraction(1, 2), Fraction(100))])
    assert [lv.precision for lv in ctl.levels[:3]] == [None, "int8-master16", "int8"]
    assert [lv.within for lv in ctl.levels[:3]] == [True, True, False]
    assert d[3].restore and ctl.levels[3].precision == "int8-master16" and ctl.levels[3].rate == Fraction(1, 10)
    # sparsity 0.1: saturations 0.5/sample > 4 x 0.1: braked, not within; down by the halved step, from the copy
    assert ctl.levels[3].within is False
    assert d[-1].kind == "train" and d[-1].restore and d[-1].rate == Fraction(1, 20)
    assert ctl.levels[ctl.result].precision == "int8-master16" and ctl.levels[ctl.result].rate == 0


def _feed_measured(ctl, script, costs):
    """_feed with a device budget: each measure decision takes the next (fits, cost) of costs,
    the controller's state saved and rebuilt there (a resumed search must go on the same)."""
    out = [ctl.start()]
    costs = list(costs)
    for c, s, u in script:
        d = ctl.observe(c, s, u)
        if d.kind == "measure":
            out.append(d)
            ctl = Controller.from_state(json.loads(json.dumps(ctl.state())))
            d = ctl.measured(*costs.pop(0))
        out.append(d)
        if d.kind == "stop":
            break
    return ctl, out


def _cost(ram, flash=1000):
    return {"ram_total": ram, "flash_total": flash, "board_ram": 16384, "board_flash": 262144, "fits": True}


def test_controller_stops_at_the_least_compression_that_fits_the_device_budget():
    ctl = Controller(100, 100, initial_epochs=1, patience=1, budget={"ram": 10000})
    ok, bad = (100, 0, 0), (98, 0, 0)
    # levels 0 (12 KB), 0.1 (11 KB) within but over; 0.2 not within (not measured); 0.15 within, 9.9 KB: fits
    ctl, d = _feed_measured(ctl, [ok, ok, bad, ok, ok, ok], [(False, _cost(12000)), (False, _cost(11000)),
                                                             (True, _cost(9900))])
    assert [x.kind for x in d] == ["train", "measure", "train", "measure", "train", "train", "measure", "stop"]
    assert d[-1].note == "fits the device budget" and d[-1].promote
    assert ctl.levels[ctl.result].rate == Fraction(15, 100) and ctl.device_met and ctl.met
    assert [lv.fits for lv in ctl.levels] == [False, False, None, True]
    s = ctl.summary()
    assert s["device_budget_met"] is True and s["device_closest_miss"] is None
    assert s["levels"][3]["cost"]["ram_total"] == 9900


def test_controller_with_a_device_budget_no_level_meets_names_the_closest():
    ctl = Controller(100, 100, initial_epochs=1, patience=1, max_sparsity=0.25, budget={"ram": 10000, "flash": 900})
    ok = (100, 0, 0)
    ctl, d = _feed_measured(ctl, [ok] * 5, [(False, _cost(12000)), (False, _cost(11000)), (False, _cost(10500, 920))])
    assert d[-1].kind == "stop" and "max_sparsity" in d[-1].note
    assert ctl.met and ctl.device_met is False
    # worst excess per level: 0: ram 20 %, 0.1: flash 11.1 %, 0.2: ram 5 % (flash 2.2 %): the closest
    msg = ctl.closest_miss()
    assert "level 2, sparsity 0.2" in msg and "needs 10500 B of ram, 500 over 10000 (5.0 %)" in msg
    assert Controller(100, 100).device_met is None and Controller(100, 100).closest_miss() is None


def test_adaptive_stage_with_a_ram_budget_measures_on_the_board(tmp_path, capsys):
    """The budget is measured on the real build for the micro:bit (linked RAM; no QEMU: the budget
    limits RAM only): the dense model (12.3 KB) is over 11.5 KB, the first sparse level fits."""
    text = SCHEDULE.split("[[stage]]")[0] + """
[[stage]]
kind = "train"
epochs = 2

[[stage]]
kind = "adaptive"
initial_epochs = 1
patience = 1
step = 0.5
min_step = 0.25
max_relative_drop = 20.0
budget = { ram = 11500 }
board = "microbit"
"""
    (tmp_path / "a.toml").write_text(text)
    assert cli.main(["compress", "--schedule", str(tmp_path / "a.toml"), "--out", str(tmp_path / "o"), "--json"]) == 0
    ad = json.loads(capsys.readouterr().out)["stages"][2]["adaptive"]
    lv = ad["levels"]
    assert ad["stopped"] == "fits the device budget" and ad["device_budget_met"] is True
    assert [x["sparsity"] for x in lv] == [0.0, 0.5] and ad["result_level"] == 1
    assert lv[0]["fits"] is False and lv[0]["cost"]["ram_total"] > 11500
    assert lv[1]["fits"] is True and lv[1]["cost"]["ram_total"] <= 11500 and lv[1]["cost"]["board"] == "microbit"


def test_adaptive_budget_without_a_board_is_refused(tmp_path, capsys):
    text = SCHEDULE.split("[[stage]]")[0] + """
[[stage]]
kind = "train"
epochs = 1

[[stage]]
kind = "adaptive"
budget = { ram = 11500 }
"""
    (tmp_path / "a.toml").write_text(text)
    assert cli.main(["compress", "--schedule", str(tmp_path / "a.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "budget is measured on a board" in err[0] and "--board" in err[0]
    assert not (tmp_path / "o").exists()
    (tmp_path / "b.toml").write_text(text.replace("ram = 11500", "stack = 3"))
    assert cli.main(["compress", "--schedule", str(tmp_path / "b.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "budget" in err[0] and "ram / flash" in err[0]
    (tmp_path / "c.toml").write_text(text.replace("budget = { ram = 11500 }", "budget = { ram = 11500 }\nboard = \"nosuch\""))
    assert cli.main(["compress", "--schedule", str(tmp_path / "c.toml"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "board" in err[0] and "nosuch" in err[0]
    assert not (tmp_path / "o").exists()


def test_adaptive_stage_on_a_real_tiny_run_is_deterministic(tmp_path, capsys, monkeypatch):
    text = SCHEDULE.split("[[stage]]")[0] + """
[[stage]]
kind = "train"
epochs = 3

[[stage]]
kind = "adaptive"
initial_epochs = 1
patience = 1
step = 0.4
min_step = 0.2
max_relative_drop = 5.0
"""
    (tmp_path / "a.toml").write_text(text)
    res = []
    for out in ("a", "b"):
        assert cli.main(["compress", "--schedule", str(tmp_path / "a.toml"), "--out", str(tmp_path / out), "--json"]) == 0
        res.append(json.loads(capsys.readouterr().out))
    assert res[0]["final_state_hash"] == res[1]["final_state_hash"]
    st = res[0]["stages"][2]
    ad = st["adaptive"]
    lv = ad["levels"][ad["result_level"]]
    assert [x["sparsity"] for x in ad["levels"]][:2] == [0.0, 0.4] and ad["epochs"] >= 2
    assert ad["stopped"]
    m, _ = tio.load(res[0]["final"])
    z = P.sparsity(m)
    if lv["sparsity"]:
        assert all(zz == P.zeros_for(lv["sparsity"], nn) for zz, nn in z.values())
    assert round(st["validation_accuracy"] * ad["validation_samples"]) == lv["best_correct"]
    assert lv["within"] == (lv["best_correct"] >= ad["tolerable_correct"])
    # killed after its first epoch, the stage continues from its checkpoint to the same result
    from tinytrain.compress import adaptive
    calls, real = [], adaptive._save_checkpoint

    def killed(*a, **k):
        real(*a, **k)
        calls.append(1)
        raise KeyboardInterrupt
    monkeypatch.setattr(adaptive, "_save_checkpoint", killed)
    argv = ["compress", "--schedule", str(tmp_path / "a.toml"), "--out", str(tmp_path / "k"), "--json"]
    assert cli.main(argv) == 130
    assert len(list((tmp_path / "k").glob(".02-adaptive.*.adaptive/*.tt"))) >= 1
    monkeypatch.setattr(adaptive, "_save_checkpoint", real)
    capsys.readouterr()
    assert cli.main(argv) == 0
    k = json.loads(capsys.readouterr().out)
    assert k["final_state_hash"] == res[0]["final_state_hash"] and k["stages"][2]["adaptive"] == ad
    assert not list((tmp_path / "k").glob(".*.adaptive"))
    # the result (its prune object replaced at every level) trains in the generated C bit for bit
    from tinytrain.verify import verify
    assert verify(m, data.load("digits"), 40, board="host", json=True)["mismatches"] == 0


def test_validation_split_is_carved_from_training():
    ds = data.load("digits")
    tr, va = S.split_validation(ds, 0.1)
    assert len(tr.x_train) + len(va.x_test) == len(ds.x_train) and len(va.x_test) == 144
    rows = {r.tobytes() for r in ds.x_train}
    assert all(r.tobytes() in rows for r in va.x_test)
    assert np.array_equal(tr.x_test, ds.x_test)  # the test split is untouched


def test_board_figures_are_measured_once_per_stage_and_board(tmp_path, capsys, monkeypatch):
    """--board: each stage's model (and the input) goes to tinytrain.cost once per board; a rerun
    reads the figures from the manifest (the QEMU measurement itself: tests/test_cost.py)."""
    from tinytrain.compress import pipeline

    seen = []

    def fake_device(model, board, dataset, steps):
        seen.append((board, f"{model.state_hash():08x}", steps))
        return {"board": board, "training_ram": 1, "ram_total": 2, "flash_total": 3, "fits": True, "why": None,
                "shadow": True, "instructions_per_sample": 4.0, "steps": steps}
    monkeypatch.setattr(pipeline, "device", fake_device)
    assert _run(tmp_path, tmp_path / "out", "--board", "mps2_an386", "--steps", "5") == 0
    r = json.loads(capsys.readouterr().out)
    assert [h for _, h, _ in seen] == [s["state_hash"] for s in r["stages"]] and len(seen) == 5
    assert all(s["device"]["mps2_an386"]["steps"] == 5 for s in r["stages"])
    assert _run(tmp_path, tmp_path / "out", "--board", "mps2_an386") == 0 and len(seen) == 5
    capsys.readouterr()
    assert _run(tmp_path, tmp_path / "out", "--board", "microbit") == 0 and len(seen) == 10
    r = json.loads(capsys.readouterr().out)
    assert set(r["stages"][-1]["device"]) == {"mps2_an386", "microbit"}


def test_example_schedules_parse():
    """Every examples/compress-*.toml is a valid schedule (keys and values checked)."""
    from pathlib import Path

    from tinytrain.compress.schedule import from_file

    files = sorted((Path(__file__).resolve().parents[1] / "examples").glob("compress-*.toml"))
    assert len(files) >= 5
    for f in files:
        sch = from_file(f)
        assert sch.stages, f
    micro = from_file(files[[f.name for f in files].index("compress-w1-microbit.toml")])
    assert micro.stages[-1].options["budget"] == {"ram": 10240} and micro.stages[-1].options["board"] == "microbit"
