"""The precision lab's parts: each cast is the format's (ml_dtypes) after clipping, stochastic
rounding is unbiased between the two neighbours, delayed scaling and the loss scale follow
their stated semantics, and the all-fp32 recipe is the float twin's own training, exactly."""
from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest
import torch

from tinytrain import cli
from tinytrain.lab import precision as P
from tinytrain.lab import twins
from tinytrain.lab.workloads import WORKLOADS, epoch_orders


@pytest.mark.parametrize("fmt, dt", [("fp16", np.float16), ("bf16", ml_dtypes.bfloat16),
                                     ("fp8_e4m3", ml_dtypes.float8_e4m3fn), ("fp8_e5m2", ml_dtypes.float8_e5m2)])
def test_cast_is_ml_dtypes_after_clipping(fmt, dt):
    rng = np.random.default_rng(0)
    a = (rng.standard_normal(4000) * 10.0 ** rng.integers(-9, 6, 4000)).astype(np.float32)
    c = P.Counts()
    q = P.cast(a, fmt, c)
    mx = float(ml_dtypes.finfo(dt).max)
    assert np.array_equal(q, np.clip(a, -mx, mx).astype(dt).astype(np.float32))
    assert c.cast == a.size and c.overflow == int((np.abs(a) > mx).sum())
    assert c.underflow == int(((a != 0) & (q == 0)).sum())
    assert np.all(np.isfinite(q))  # never inf or nan: clipped first


def test_tf32_rounds_the_mantissa_to_ten_bits_nearest_even():
    u = 2.0**-10
    a = np.array([1 + u / 2, 1 + 3 * u / 2, 1 + u / 2 + 2**-20, -(1 + 3 * u / 2), 1 + u], np.float32)
    assert list(P.cast(a, "tf32")) == [1.0, 1 + 2 * u, 1 + u, -(1 + 2 * u), 1 + u]


def test_stochastic_rounding_is_unbiased_between_neighbours():
    x = np.full(200_000, 1.0 + 2**-9, np.float32)  # 1/4 of the way from 1.0 to bf16's next value 1 + 2^-7
    q = P.cast(x, "bf16", rng=np.random.default_rng(1))
    assert set(np.unique(q)) == {1.0, 1.0 + 2**-7}
    assert abs(float(q.mean()) - float(x[0])) < 2e-5  # E[q] = x (nearest-even would always give 1.0)
    exact = np.array([1.5, -2.0, 0.0], np.float32)
    assert np.array_equal(P.cast(exact, "fp8_e4m3", rng=np.random.default_rng(2)), exact)


def test_delayed_scaling_uses_the_history_of_amax():
    d = P._Delayed("fp8_e4m3")
    c = P.Counts()
    a = np.array([0.001, -0.0005], np.float32)  # E4M3 alone would flush these (smallest 2^-9)
    q = d(a, c)
    assert np.allclose(q, a, rtol=0.07) and c.underflow == 0 and d.hist == [float(np.float32(0.001))]
    big = np.array([0.01], np.float32)  # beyond the history's amax: the scale saturates it
    q2 = d(big, c)
    assert float(q2[0]) == pytest.approx(0.001, rel=0.01) and c.overflow == 1
    for _ in range(P.AMAX_HISTORY):
        d(np.array([0.02], np.float32), c)
    assert d.hist == [float(np.float32(0.02))] * P.AMAX_HISTORY  # the history keeps the last 16 steps only


def test_loss_scale_semantics():
    none, static, dyn = P.LossScale("none"), P.LossScale("static"), P.LossScale("dynamic")
    assert none.step(True) is False and none.scale == 1.0
    assert static.step(True) is True and static.scale == P.STATIC_SCALE and static.step(False) is False
    assert dyn.scale == P.DYNAMIC_INIT and dyn.step(True) is True and dyn.scale == P.DYNAMIC_INIT / 2
    for _ in range(P.GROWTH_INTERVAL - 1):
        assert dyn.step(False) is False
    assert dyn.scale == P.DYNAMIC_INIT / 2 and dyn.step(False) is False and dyn.scale == P.DYNAMIC_INIT


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_fp32_recipe_is_the_twin_training_exactly(schedule):
    torch.set_num_threads(1)
    wl = WORKLOADS["w1"]
    ds = wl.load()
    got = P.train_float(wl, ds, 0, P.recipe("fp32"), 2, 32, schedule=schedule)
    net = twins.twin("w1", 0)
    xtr, _ = wl.float_inputs(ds)
    twins.train(net, xtr, ds.y_train, epoch_orders(0, len(xtr), 2), wl.lr * 32**0.5, 32, schedule=schedule)
    for a, b in zip(got["net"].parameters(), net.parameters()):
        assert torch.equal(a, b)
    assert got["skipped_steps"] == 0 and got["counts"]["gradients"]["underflow"] == 0


def test_low_precision_without_help_loses_gradients():
    """E4M3 gradients without scaling flush most small gradients; delayed scaling keeps them."""
    torch.set_num_threads(1)
    wl = WORKLOADS["w1"]
    ds = wl.load()
    plain = P.train_float(wl, ds, 0, P.recipe("fp8 e4m3 + master"), 1, 32)["counts"]["gradients"]
    scaled = P.train_float(wl, ds, 0, P.recipe("fp8 hybrid + master + delayed scaling"), 1, 32)["counts"]["gradients"]
    assert plain["underflow"] / plain["cast"] > 0.05 > scaled["underflow"] / scaled["cast"]


def test_cli_json_and_bad_input(capsys):
    assert cli.main(["precision-lab", "--workload", "w1", "--seeds", "0", "--epochs", "1", "--recipe", "fp32",
                     "--recipe", "bf16 + master", "--no-integer", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["recipe"] for r in out["rows"]] == ["fp32", "bf16 + master"] and out["seeds"] == [0]
    assert out["rows"][1]["bytes"]["master"] == 4 * 2410
    assert cli.main(["precision-lab", "--workload", "w1", "--recipe", "fp4"]) == 2
    err = capsys.readouterr().err
    assert "unknown recipe 'fp4'" in err and len(err.strip().splitlines()) == 1
    assert cli.main(["precision-lab", "--workload", "w1", "--seeds", "a,b"]) == 2
    assert cli.main(["precision-lab", "--workload", "w1", "--schedule", "linear"]) == 2
    assert "--schedule" in capsys.readouterr().err


def test_stochastic_rounding_in_fp8_e4m3_too():
    """E4M3FN has no infinity: the neighbour is found toward the largest finite value."""
    q = P.cast(np.full(100_000, 1.03, np.float32), "fp8_e4m3", rng=np.random.default_rng(0))
    assert set(np.unique(q)) == {1.0, 1.125} and abs(float(q.mean()) - 1.03) < 2e-3
    top = P.cast(np.full(10, 448.0, np.float32), "fp8_e4m3", rng=np.random.default_rng(0))
    assert np.all(top == 448.0)  # the largest value stays (no NaN neighbour)


def test_vs_fp32_found_by_name_and_master_bytes_are_the_models():
    res = P.run("w1", seeds=(0,), recipes=["bf16", "fp32"], epochs=1, integer=False)
    assert all(r["vs_fp32_points"] is not None for r in res["rows"])
    from tinytrain.graph.model import Sequential
    wl = WORKLOADS["w1"]
    cfg = wl.model(wl.load(), 0).config()
    cfg["optimizer"]["master_weights"] = True
    assert P._role_bytes(wl, wl.load(), None)["weights"] == 2 * 2368 + 4 * 42
    assert sum(v.nbytes for v in Sequential.from_config(cfg).master.values()) == 4 * 2368


def test_integer_rows_take_precision_policies():
    """The lab's integer rows build the workload's model under a "precision" policy: int8
    weights are one byte each, the int16 master two, and training runs the simulator on it."""
    wl, ds = WORKLOADS["w1"], WORKLOADS["w1"].load()
    m = P.integer_model(wl, ds, 0, {"precision": "int8-master16"})
    assert [p.data.dtype.name for p in m.layers[0].params] == ["int8", "int32"]
    assert sum(v.nbytes for v in m.master.values()) == 2 * 2368
    assert m.input_exp == wl.model(ds, 0).input_exp and not m.opt.sr
    assert P.integer_model(wl, ds, 0, {"precision": "int8"}).opt.sr
    assert {"tinytrain int8 w, no master (stochastic rounding)", "tinytrain int8 w + int16 master"} <= set(P.INTEGER_POLICIES)


def test_failures_names_the_recipes_under_fp32_and_what_helps_them():
    def row(name, acc, kind="float"):
        return {"recipe": name, "kind": kind, "accuracy_mean": acc}
    res = {"rows": [row("fp32", 90.0), row("fp16", 85.0), row("fp16 + master", 89.5), row("bf16", 88.5),
                    row("bf16 + master", 89.9), row("fp8 e4m3 + master", 80.0),
                    row("tinytrain int16 w / int8 act+err (today)", 50.0, "integer")]}
    line = P.failures(res)
    assert line.startswith("fail (more than 1 point under fp32): fp16 -5.00 (with master weights -0.50); "
                           "bf16 -1.50 (with master weights -0.10); fp8 e4m3 + master -10.00;")
    assert "tinytrain" not in line and "fp16 + master -" not in line  # integer rows and passing recipes left out
    assert P.failures({"rows": [row("bf16", 1.0)]}) == ""  # nothing to compare with
    w2 = P.failures({"rows": [row("fp32", 94.0), row("bf16 + master", 90.3), row("bf16 + master, fp32 gradients", 93.8)]})
    assert "bf16 + master -3.70 (with fp32 gradients -0.20)" in w2
    assert "none" in P.failures({"rows": [row("fp32", 90.0), row("bf16", 89.5)]})


def _w2_batch():
    wl = WORKLOADS["w2"]
    ds = wl.load()
    xtr, _ = wl.float_inputs(ds)
    return torch.from_numpy(np.ascontiguousarray(xtr[:32])), torch.from_numpy(ds.y_train[:32].astype(np.int64))


def _bf16_exact(t) -> bool:
    a = np.asarray(t, np.float32)
    return np.array_equal(a, a.astype(ml_dtypes.bfloat16).astype(np.float32))


def _one_step(r, x, y):
    """One forward/backward of W2's twin under recipe r's activation and error casts: the
    logits, every module's (output, error) as the casts left them, and the weight gradients."""
    net = twins.twin("w2", 0)
    seen = {}
    P._instrument(net, P._Quantizer(r, 0))

    def record(k, i, o):  # runs after the casts' hook: sees the output and (then) the error they left
        seen[k] = [i[0], o]
        if o.requires_grad:
            o.register_hook(lambda g: seen[k].append(g))
    for k, m in enumerate(net):
        m.register_forward_hook(lambda mod, i, o, k=k: record(k, i, o))
    out = net(x)
    torch.nn.functional.cross_entropy(out, y).backward()
    return out.detach(), seen, net


def test_bf16_conv_accumulates_in_fp32_and_rounds_only_its_output():
    """As BF16 hardware does (and the brief's emulation promises): a conv's products are summed
    in fp32 from the bf16 input and weights, and only the sum is rounded, once."""
    x, y = _w2_batch()
    _, seen, net = _one_step(P.Recipe("a", "fp32", "bf16", "fp32"), x, y)
    convs = [k for k, m in enumerate(net) if isinstance(m, torch.nn.Conv1d)]
    for k in convs:
        inp, out = seen[k][0], seen[k][1]
        assert _bf16_exact(inp.detach()) and _bf16_exact(out.detach())
        ref = torch.nn.functional.conv1d(inp.detach(), net[k].weight, net[k].bias)
        assert torch.equal(out.detach(), torch.from_numpy(P.cast(ref.detach().numpy(), "bf16")))
        assert not _bf16_exact(ref.detach())  # the fp32 sums are not bf16 values: the test can fail


def test_gradient_role_rounds_the_errors_only():
    """bf16 gradients leave the forward in fp32 (the logits are the fp32 run's, bit for bit), round
    every error to bf16 (nearest-even), and the weight gradients stay within bf16's precision of fp32's."""
    x, y = _w2_batch()
    ref_out, ref_seen, ref_net = _one_step(P.recipe("fp32"), x, y)
    out, seen, net = _one_step(P.Recipe("g", "fp32", "fp32", "bf16"), x, y)
    assert torch.equal(out, ref_out)
    errs = [v[2] for v in seen.values() if len(v) > 2]
    assert len(errs) == len(net) - 2 and all(_bf16_exact(e) for e in errs)  # all but the input's permute and pad
    assert not all(_bf16_exact(v[2]) for v in ref_seen.values() if len(v) > 2)  # fp32's errors are not
    for a, b in zip(ref_net.parameters(), net.parameters()):
        assert float((a.grad - b.grad).norm() / a.grad.norm()) < 2.0**-7


def test_bf16_master_stays_fp32_and_the_compute_copy_is_its_cast():
    """With a master the update lands in fp32 (most master values are no bf16 value) and the
    weights the net computes with are the master rounded to nearest-even bf16, exactly."""
    torch.set_num_threads(1)
    wl = WORKLOADS["w1"]
    ds = wl.load()
    got = P.train_float(wl, ds, 0, P.recipe("bf16 + master"), 1, 32)
    plain = P.train_float(wl, ds, 0, P.recipe("bf16"), 1, 32)
    for p, m in zip(got["net"].parameters(), got["masters"]):
        assert np.array_equal(p.detach().numpy(), m.astype(ml_dtypes.bfloat16).astype(np.float32))
    w = got["masters"][0]
    assert np.mean(w != w.astype(ml_dtypes.bfloat16).astype(np.float32)) > 0.9
    assert not all(torch.equal(a, b) for a, b in zip(got["net"].parameters(), plain["net"].parameters()))
    assert plain["masters"] is None


def test_validation_split_holds_out_part_of_train_and_never_the_test_set():
    """--validation: the test split becomes a held-out part of the training set (disjoint from
    what trains, together all of it), so a recipe can be chosen without the test set."""
    ds = WORKLOADS["w1"].load()
    v = P.validation_split(ds, 0.2)
    assert len(v.x_test) == round(0.2 * len(ds.x_train)) and len(v.x_train) + len(v.x_test) == len(ds.x_train)
    rows = {r.tobytes() for r in ds.float_x_train}
    assert {r.tobytes() for r in v.float_x_test} <= rows and {r.tobytes() for r in v.float_x_train} <= rows
    assert not {r.tobytes() for r in v.float_x_test} & {r.tobytes() for r in v.float_x_train}
    assert not {r.tobytes() for r in v.float_x_test} & {r.tobytes() for r in ds.float_x_test}
    with pytest.raises(ValueError, match="validation fraction"):
        P.validation_split(ds, 1.0)
    res = P.run("w1", seeds=(0,), recipes=["fp32"], epochs=1, integer=False, validation=0.2)
    assert res["validation"] == 0.2 and "validation split" in P.format_table(res)


def test_jobs_and_lr_give_the_serial_run_and_the_given_lr():
    """jobs 2 runs the same computations in worker processes: the same accuracies and counts as
    jobs 1; lr overrides the workload's float lr (a different lr trains differently)."""
    kw = dict(seeds=(0, 1), recipes=["fp32", "bf16 + master"], epochs=1, integer=False)
    one, two = P.run("w1", **kw, jobs=1), P.run("w1", **kw, jobs=2)
    key = lambda res: [(r["recipe"], r["accuracies"], r.get("underflow_fraction"), r.get("update_underflows_per_step"))
                       for r in res["rows"]]
    assert key(one) == key(two) and len(one["rows"]) == 2
    assert one["lr_float"] == P.float_lr(WORKLOADS["w1"], 32)
    wl, ds = WORKLOADS["w1"], WORKLOADS["w1"].load()
    a = P.train_float(wl, ds, 0, P.recipe("fp32"), 1, 32)
    b = P.train_float(wl, ds, 0, P.recipe("fp32"), 1, 32, lr=P.float_lr(wl, 32))
    c = P.train_float(wl, ds, 0, P.recipe("fp32"), 1, 32, lr=0.01)
    assert np.array_equal(a["net"][0].weight.detach().numpy(), b["net"][0].weight.detach().numpy())
    assert not np.array_equal(a["net"][0].weight.detach().numpy(), c["net"][0].weight.detach().numpy())


def test_cli_lr_validation_jobs_bad_input(capsys):
    for args in (["--lr", "0"], ["--lr", "x"], ["--validation", "1.5"], ["--jobs", "0"]):
        assert cli.main(["precision-lab", "--workload", "w1", *args]) == 2
        err = capsys.readouterr().err
        assert args[0] in err and len(err.strip().splitlines()) == 1


def test_the_workloads_lab_recipe_is_the_default_and_a_bad_schedule_is_refused(monkeypatch, capsys):
    """run() and the CLI train the float twins with the workload's lab schedule, lr and epochs
    unless told otherwise (W2: cosine, lr 0.08, 200 epochs, chosen on a validation carve); an
    unknown schedule is one line and exit 2."""
    import dataclasses

    from tinytrain.lab import workloads
    w2 = WORKLOADS["w2"]
    assert (w2.lab_schedule, w2.lab_lr, w2.lab_epochs) == ("cosine", 0.08, 200)
    assert WORKLOADS["w1"].lab_schedule == "constant"
    kw = dict(seeds=(0,), recipes=["fp32"], epochs=1, integer=False)
    plain = P.run("w1", **kw)
    assert plain["schedule"] == "constant"
    monkeypatch.setitem(workloads.WORKLOADS, "w1", dataclasses.replace(WORKLOADS["w1"], lab_schedule="cosine"))
    by_default, told = P.run("w1", **kw), P.run("w1", **kw, schedule="cosine")
    assert by_default["schedule"] == "cosine" and by_default["rows"][0]["accuracies"] == told["rows"][0]["accuracies"]
    assert P.run("w1", **kw, schedule="constant")["rows"][0]["accuracies"] == plain["rows"][0]["accuracies"]
    with pytest.raises(ValueError, match="schedule 'linear'"):
        P.run("w1", **kw, schedule="linear")
    assert cli.main(["precision-lab", "--workload", "w1", "--seeds", "0", "--epochs", "1", "--recipe", "fp32",
                     "--no-integer", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == "cosine"
    for args in (["--schedule", "cos"], ["--schedule", ""]):
        assert cli.main(["precision-lab", "--workload", "w1", *args]) == 2
        err = capsys.readouterr().err
        assert "--schedule" in err and len(err.strip().splitlines()) == 1
