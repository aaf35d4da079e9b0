"""The tinytrain command line, in process through main([...]) and once as a subprocess."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tinytrain import cli
from tinytrain.graph import io as tio


def run(capsys, *argv):
    code = cli.main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_help_subprocess():
    exe = Path(sys.executable).parent / "tinytrain"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tinytrain.cli"]
    r = subprocess.run([*cmd, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0
    for name in ("train", "eval", "info"):
        assert name in r.stdout


def test_no_command_and_bad_usage(capsys):
    assert run(capsys, "train", "--help")[0] == 0
    code, out, err = run(capsys)
    assert code == 2 and "usage" in err
    code, out, err = run(capsys, "train", "--data", "digits")
    assert code == 2 and "--model" in err


def test_train_eval_info(capsys, tmp_path):
    out_file, png = tmp_path / "m.tt", tmp_path / "m.png"
    code, out, err = run(capsys, "train", "--data", "digits", "--model", "digits-mlp", "--epochs", 2,
                         "--seed", 0, "--out", out_file, "--plot", png, "--limit", 300, "--json")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    for k in ("test_accuracy", "train_seconds", "state_hash", "epochs", "train_accuracy", "saturations"):
        assert k in summary
    assert summary["epochs"] == 2 and summary["test_accuracy"] > 0.5
    model, extra = tio.load(out_file)
    assert f"{model.state_hash():08x}" == summary["state_hash"] and extra["epoch"] == 2
    assert png.exists()

    code, out, err = run(capsys, "eval", "--model", out_file, "--json")
    assert code == 0, err
    ev = json.loads(out.strip().splitlines()[-1])
    assert ev["test_accuracy"] == summary["test_accuracy"] and ev["data"] == "digits"

    code, out, err = run(capsys, "info", out_file)
    assert code == 0 and "Dense(units=32)" in out and summary["state_hash"] in out and "RAM" in out

    # resume to 3 epochs == 3 straight
    code, out, _ = run(capsys, "train", "--data", "digits", "--model", "digits-mlp", "--epochs", 3,
                       "--out", out_file, "--limit", 300, "--resume", "--json")
    resumed = json.loads(out.strip().splitlines()[-1])
    code, out, _ = run(capsys, "train", "--data", "digits", "--model", "digits-mlp", "--epochs", 3,
                       "--limit", 300, "--json")
    straight = json.loads(out.strip().splitlines()[-1])
    assert resumed["resumed_from_epoch"] == 2 and resumed["state_hash"] == straight["state_hash"]


def test_model_file_and_human_output(capsys, tmp_path):
    spec = tmp_path / "m.json"
    spec.write_text(json.dumps({"layers": [{"type": "dense", "units": 10}], "optimizer": {"lr": 0.02}}))
    code, out, err = run(capsys, "train", "--data", "digits", "--model", spec, "--epochs", 1,
                         "--limit", 100, "--lr", 0.01, "--batch-size", 2)
    assert code == 0, err
    assert "epoch   1/1" in out and "done: 1 epochs" in out


# bad input (exit 2, one line, nothing left behind): the table in test_bad_input.py


def test_registry_accepts_new_subcommands(capsys, monkeypatch):
    # the plugin modules register into SUBCOMMANDS when first imported: import them before the
    # registry is swapped for a copy, or they register into the copy and vanish for every later
    # test in this worker when monkeypatch puts the original back
    cli._load_plugins()
    monkeypatch.setattr(cli, "SUBCOMMANDS", dict(cli.SUBCOMMANDS))
    seen = {}
    cli.register("hello", "say hello", lambda p: p.add_argument("--name", default="board"),
                 lambda a: seen.setdefault("name", a.name) and 0)
    code, _, _ = run(capsys, "hello", "--name", "qemu")
    assert code == 0 and seen == {"name": "qemu"}


def test_epochs_zero_saves_the_initial_model(capsys, tmp_path):
    out_file = tmp_path / "init.tt"
    code, out, err = run(capsys, "train", "--data", "digits", "--model", "digits-mlp", "--epochs", 0,
                         "--out", out_file, "--json")
    assert code == 0, err
    summary = json.loads(out.strip().splitlines()[-1])
    model, extra = tio.load(out_file)
    assert extra["epoch"] == 0 and f"{model.state_hash():08x}" == summary["state_hash"]
    assert 0 <= summary["test_accuracy"] <= 1


def test_import_is_light_and_api_is_exported():
    code = ("import sys, tinytrain as tt; assert 'numba' not in sys.modules and 'numpy' not in sys.modules; "
            "names = ['Sequential', 'Dense', 'ReLU', 'Flatten', 'SGD', 'load', 'save', 'fit', 'evaluate', "
            "'datasets', 'build_model', 'load_dataset']; assert all(getattr(tt, n) for n in names)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("argv", [
    ["verify", "--model", "digits-mlp", "--board", "host", "--retries", "-1"],
    ["verify", "--model", "digits-mlp", "--board", "host", "--retries", "two"],
    ["verify", "--model", "digits-mlp", "--board", "host", "--timeout", "0"],
    ["verify", "--model", "digits-mlp", "--board", "host", "--timeout", "nan"],
    ["federate", "--ports", "loop://", "--rounds", "1", "--model", "digits-mlp", "--retries", "1.5"],
    ["federate", "--ports", "loop://", "--rounds", "1", "--model", "digits-mlp", "--timeout", "-2"],
])
def test_link_options_are_type_checked(capsys, argv):
    code, out, err = run(capsys, *argv)
    assert code == 2 and "must be" in err.strip().splitlines()[-1], err


@pytest.mark.parametrize("argv, timeout", [
    (["verify", "--model", "digits-mlp", "--port", "loop://", "--retries", "7", "--timeout", "0.25"], 0.25),
    (["federate", "--ports", "loop://", "--rounds", "1", "--model", "digits-mlp", "--retries", "7",
      "--timeout", "0.25", "--quorum", "1"], 0.25),
])
def test_link_options_reach_the_link(capsys, monkeypatch, argv, timeout):
    from tinytrain.device import protocol

    seen = []

    def fake_link(port, **kw):
        seen.append((port, kw["retries"], kw["timeout"]))
        raise protocol.DeviceTimeout("fake board: no reply")

    monkeypatch.setattr(protocol, "DeviceLink", fake_link)
    monkeypatch.delenv("TINYTRAIN_DEBUG", raising=False)
    run(capsys, *argv)
    assert seen and seen[0] == ("loop://", 7, timeout)
