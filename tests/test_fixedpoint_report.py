"""The fixed-point report (tinytrain info --fixed-point): its counts are the reference's own,
attributed per layer and tensor, and the saved model is left as it was."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tinytrain import cli, data
from tinytrain.fixedpoint_report import fixed_point_report, format_report, qformat
from tinytrain.graph import io as tio
from tinytrain.graph.models import build_model


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


def test_qformat():
    assert qformat(16, -14) == "Q1.14" and qformat(8, -5) == "Q2.5" and qformat(32, -22) == "Q9.22"
    assert qformat(16, -18) == "Q-3.18" and qformat(8, 2) == "Q9.-2"


@pytest.mark.parametrize("train, momentum, batch", [("all", 0.0, 1), ("last:1", 0.9, 3)])
def test_counts_are_the_reference_counts_per_tensor(digits, train, momentum, batch):
    m = build_model("digits-mlp", digits, train=train, momentum=momentum, batch_size=batch, seed=1)
    before = m.state_hash()
    n = 120
    r = fixed_point_report(m, digits, n)
    assert m.state_hash() == before and r["samples"] == n  # the model itself did not train
    plain = m.copy()
    s0 = plain.stats.copy()
    for i in range(n):
        plain.ref_train_step(digits.x_train[i], digits.y_train[i])
    d = plain.stats - s0
    t = r["totals"]
    assert t["act_saturations"] == d[0] and t["weight_saturations"] == d[1] and t["update_underflows"] == d[2]
    per_layer_sat = sum((L["activation"] or {}).get("saturations", 0) + (L["input_error"] or {}).get("saturations", 0)
                        for L in r["layers"])
    assert per_layer_sat <= d[0]  # the loss's own saturations are the rest
    assert sum(p.get("underflows", 0) for L in r["layers"] for p in L["params"]) == d[2]
    # ranges and headroom are those of the parameters the replay went through
    for L, layer in zip(r["layers"], plain.layers):
        for p, q in zip(L["params"], layer.params):
            lo, hi = p["range"]
            assert lo <= int(q.data.min()) and int(q.data.max()) <= hi
            bits = q.data.dtype.itemsize * 8
            assert p["headroom_bits"] == bits - 1 - max(abs(lo), abs(hi)).bit_length()
    frozen = [p for L in r["layers"] for p in L["params"] if p["role"] == "frozen"]
    assert (train == "all") == (not frozen) and all("underflows" not in p for p in frozen)
    assert "totals:" in format_report(r)


def test_accumulator_bounds_against_widths(digits):
    m = build_model("digits-mlp", digits)
    r = fixed_point_report(m, digits, 5)
    fwd = r["layers"][0]["accumulators"][0]
    assert fwd["what"] == "forward sum" and fwd["bound"] == 64 * 127 * 32767 + 2**30 and fwd["width"] == 32
    assert fwd["fits"] and fwd["margin_bits"] == 0
    assert all(a["fits"] for L in r["layers"] for a in L["accumulators"])


def test_cli_json_is_pure_and_bad_input_is_exit_2(digits, tmp_path, capsys):
    path = tmp_path / "w1.tt"
    tio.save(build_model("digits-mlp", digits), path, extra={"dataset": "digits"})
    assert cli.main(["info", "--model", str(path), "--fixed-point", "--samples", "30", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["fixed_point"]["samples"] == 30 and len(out["fixed_point"]["layers"]) == 3
    assert cli.main(["info", str(path), "--fixed-point", "--data", "digits-image", "--samples", "3"]) == 2
    assert "shape" in capsys.readouterr().err
    assert cli.main(["info", str(path), "--model", str(path)]) == 2
    assert "once" in capsys.readouterr().err
    bare = tmp_path / "bare.tt"
    tio.save(build_model("digits-mlp", digits), bare)
    assert cli.main(["info", str(bare), "--fixed-point"]) == 2
    assert "--data" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["info", str(path), "--samples", "0"])


def test_residual_blocks_report_their_inner_accumulators_and_saturations(digits):
    from tinytrain.graph.layers import Dense, LeakyReLU, ReLU
    from tinytrain.graph.model import Sequential
    from tinytrain.graph.optim import SGD
    from tinytrain.graph.residual import Residual

    m = Sequential([Dense(16), Residual([Dense(16), LeakyReLU(), Dense(16), ReLU(), Dense(16)]), Dense(10)],
                   input_shape=(64,), input_exp=digits.input_exp - 4, optimizer=SGD(lr=0.05, train="last:2"), seed=0)
    r = fixed_point_report(m, digits, 300)
    block = r["layers"][1]["accumulators"]
    assert [a["what"] for a in block][:3] == ["0 dense: forward sum", "0 dense: input-error sum", "0 dense: weight gradient"]
    assert len(block) == 9
    rows = sum((L["activation"] or {}).get("saturations", 0) + (L["input_error"] or {}).get("saturations", 0)
               for L in r["layers"])
    assert rows <= r["totals"]["act_saturations"]
    assert r["layers"][1]["input_error"] is None or "qformat" not in r["layers"][1]["input_error"]
    assert "totals:" in format_report(r)


@pytest.mark.parametrize("policy", ["int8", "int8-master16", "int8-master32"])
def test_int8_policies_in_the_report(digits, policy):
    """Under a precision policy the report shows the weights' width and Q-format, the master's,
    the counts the reference made, and the accumulator bounds of int8 x int8 products."""
    m = build_model("digits-mlp", digits, precision=policy)
    r = fixed_point_report(m, digits, 60)
    w = r["layers"][0]["params"][0]
    assert w["dtype"] == "int8" and w["qformat"] == qformat(8, m.layers[0].params[0].exp)
    if policy == "int8":
        assert "master" not in w
    else:
        bits = 16 if policy.endswith("16") else 32
        assert w["master"] == {"dtype": f"int{bits}", "qformat": qformat(bits, m.master_exp((0, 0)))}
    plain = m.copy()
    s0 = plain.stats.copy()
    for i in range(60):
        plain.ref_train_step(digits.x_train[i], digits.y_train[i])
    assert r["totals"]["update_underflows"] == (plain.stats - s0)[2]
    fwd = r["layers"][0]["accumulators"][0]
    assert fwd["bound"] == 64 * 127 * 127 + 2**30 and fwd["width"] == 32
