"""`tinytrain sensitivity` with weight bits and device cost (the pruning levels alone are in
tests/test_prune.py): each policy row equals evaluating the converted model directly, the
variants the board would run, the work shared by processes, and a QEMU micro:bit run."""
from pathlib import Path

import numpy as np

import pytest
from hypothesis import given, settings, strategies as st

from tests.conftest import examples
from tests.test_boards_qemu import needs_qemu
from tinytrain import sensitivity as S
from tinytrain.graph import prune as P


@pytest.fixture(scope="module")
def w1():
    from tinytrain import data
    from tinytrain.graph.models import build_model
    from tinytrain.train import fit

    ds = data.load("digits")
    m = build_model("digits-mlp", ds)
    fit(m, ds, 1, progress=False, log=None)
    return m, ds


def test_policy_rows_are_the_converted_layer_evaluated_and_jobs_do_not_matter(w1):
    from tinytrain.train import evaluate

    m, ds = w1
    h = m.state_hash()
    work = {}
    a = S.sensitivity(m, ds, levels=(0.0, 0.7), policies=("int16", "int8", "int8-master16"), jobs=1, work=work)
    assert m.state_hash() == h
    assert S.sensitivity(m, ds, levels=(0.0, 0.7), policies=("int16", "int8", "int8-master16"), jobs=2) == a
    for row in a["layers"]:
        by = {p["policy"]: p for p in row["policies"]}
        assert by["int16"]["unchanged"] and by["int16"]["drop_points"] == 0.0
        v = S.with_layer_policy(m, row["layer"], "int8")
        assert v.layers[row["layer"]].params[0].data.dtype == np.int8
        assert by["int8"]["accuracy"] == evaluate(v, ds)["accuracy"] and by["int8"]["weight_bits"] == 8
    assert work["tasks"] == 2 + 5 and work["jobs"] == 1  # a tensor's levels; base + 2 layers x 2 narrowing policies


@settings(max_examples=examples(6), deadline=None)
@given(st.sampled_from([(0, 0), (2, 0)]), st.sampled_from([0.0, 0.25, 0.5, 0.9]))
def test_pruned_variant_keeps_exactly_its_mask(w1, key, s):
    """The variant the board measures: round(s n) zeros by the criterion, as a mask the device
    honours (a one-shot event in the past), the other tensors untouched."""
    m, _ = w1
    v = S.pruned(m, key, s)
    li, pi = key
    k = P.zeros_for(s, m.layers[li].params[pi].data.size)
    w = v.layers[li].params[pi].data
    if k == 0:
        assert not v.masks
        return
    assert int(P.unpack(v.masks[key], w.size).sum()) == k
    assert np.array_equal(w.reshape(-1)[P.unpack(v.masks[key], w.size)], np.zeros(k, w.dtype))
    assert list(v.prune_table.steps) == [0] < [int(v.meta[1])]
    other = 2 - li
    assert np.array_equal(v.layers[other].params[0].data, m.layers[other].params[0].data)


@pytest.mark.qemu
@needs_qemu
def test_device_change_on_the_microbit(w1, capsys):
    """Level 0 is the model itself (no change); pruning layer 2 by half stores it sparse (its
    mask is final: codegen/sparse.py), so its RAM falls; every variant verified on QEMU."""
    m, ds = w1
    work = {}
    r = S.sensitivity(m, ds, levels=(0.0, 0.5), policies=("int16",), board="microbit", steps=3, layers=[2], jobs=2,
                      work=work)
    row, = r["layers"]
    zero, half = (p["device"] for p in row["points"])
    assert zero["delta_ram_total"] == 0 and zero["delta_instructions_per_sample"] == 0
    assert half["fits"] and half["steps"] == 3 and half["delta_ram_total"] < 0
    assert row["policies"][0]["device"]["delta_flash_total"] == 0
    assert work["tasks"] == 1 + 1 + 2  # levels of layer 2, the base's accuracy, two distinct builds
    assert r["device"]["instructions_per_sample"] > 10_000


def test_a_policy_a_layer_cannot_take_is_reported_not_fatal(capsys):
    """Row/block exponents exist for dense layers only: on W3 the default policies give the conv
    layers an n/a row with the reason, and the dense layer its measured rows (the CLI too)."""
    from tinytrain import cli, data
    from tinytrain.graph.models import build_model

    ds = data.load("digits-image")
    m = build_model("digits-cnn", ds)
    r = S.sensitivity(m, ds, levels=(0.0,), layers=[0, 9], policies=("int16", "int8-master16", "int4-row-master16"))
    by = {row["layer"]: {p["policy"]: p for p in row["policies"]} for row in r["layers"]}
    conv, dense = by[0], by[max(by)]
    assert "int4-row-master16" in conv and "int4-row-master16" in dense
    na = conv["int4-row-master16"]
    assert na["applicable"] is False and na["accuracy"] is None and "dense layers only" in na["why"]
    assert dense["int4-row-master16"]["accuracy"] is not None
    assert conv["int8-master16"]["accuracy"] is not None  # what a conv can take is still measured
    assert "n/a" in S.table(r)
    code = cli.main(["sensitivity", "--model", "digits-cnn", "--data", "digits-image", "--epochs", "0",
                     "--levels", "0", "--layers", "0", "--policies", "int16,int4-row-master16", "--json"])
    out = capsys.readouterr().out
    assert code == 0 and '"applicable": false' in out



@pytest.mark.qemu
@needs_qemu
def test_sweep_links_take_the_runtime_from_the_object_cache_and_give_the_same_firmware(w1, tmp_path, monkeypatch):
    """sweep.Costs links each variant without PlatformIO: a second variant compiles only its own
    two files (generated model, glue), taking the ~25 runtime and port objects from the link's
    object cache, and its measurement and flash image are those of a link with empty caches."""
    import subprocess

    from tinytrain.codegen import memory
    from tinytrain.sweep import Costs, config_key

    m, ds = w1
    v = S.pruned(m, (2, 0), 0.5)
    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(memory, "_LINK_CACHE", {})
    objects = tmp_path / "cache" / "objects"

    def entries():
        return sum(1 for p in objects.rglob("*") if p.is_file())
    Costs("microbit", ds, 2, tmp_path / "sweep")(m)
    first = entries()
    compiled = []
    real = subprocess.run

    def run(cmd, *a, **k):
        if "-c" in cmd:
            compiled.append(Path(cmd[cmd.index("-c") + 1]).name)
        return real(cmd, *a, **k)
    monkeypatch.setattr(memory.subprocess, "run", run)
    warm = Costs("microbit", ds, 2, tmp_path / "sweep")(v)
    assert first > 20 and entries() == first
    assert sorted(set(compiled)) == ["tt_model.c", "tt_model_device.c"]
    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cold"))
    monkeypatch.setattr(memory, "_LINK_CACHE", {})
    cold = Costs("microbit", ds, 2, tmp_path / "cold-sweep")(v)
    assert warm == cold and warm["steps"] == 2

    def image(root):
        elf, = root.rglob("firmware.elf")
        subprocess.run(["arm-none-eabi-objcopy", "-O", "binary", str(elf), str(elf.with_suffix(".bin"))], check=True)
        return elf.with_suffix(".bin").read_bytes()
    assert image(tmp_path / "sweep" / config_key(v)) == image(tmp_path / "cold-sweep")


def _square(x):
    return x * x


def test_run_tasks_dispatches_the_heaviest_first_and_keeps_the_task_order():
    from tinytrain.sweep import dispatch_order, run_tasks

    assert dispatch_order([0, 2, 1, 2, 0]) == [1, 3, 2, 0, 4]
    w = [(7 * i) % 11 for i in range(23)]
    for jobs in (1, 2, 3):
        assert run_tasks(_square, list(range(23)), jobs, weights=w)[0] == [i * i for i in range(23)]


def test_prepare_runtime_fills_the_object_cache_the_links_then_use(tmp_path, monkeypatch):
    """Costs.prepare (memory.prepare_runtime) compiles every runtime and port object of the board
    into link_firmware's object cache; a link after it compiles only the model's two sources and
    gives the figures of a link from an empty cache; a second prepare compiles nothing."""
    from tinytrain.codegen import memory
    from tinytrain.device.boards import get_board
    from tinytrain.lab.workloads import W1

    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "a"))
    memory._LINK_CACHE.clear()
    board = get_board("microbit")
    memory.prepare_runtime("microbit")
    objdir, srcs = memory._runtime_sources(board, tmp_path / "a")
    objs = {s.stem: (objdir / f"{s.stem}.o").stat().st_mtime_ns for s in srcs}
    assert len(objs) == len(srcs) > 20 and all((objdir / f"{s}.su").is_file() for s in objs)
    memory.prepare_runtime("microbit")
    ds = W1.load()
    m = W1.model(ds, 0)
    calls = []
    real = memory.subprocess.run
    monkeypatch.setattr(memory.subprocess, "run", lambda cmd, **kw: calls.append(cmd) or real(cmd, **kw))
    b = memory.breakdown(m, "microbit")
    got = (b.ram, b.flash)
    compiled = [c for c in calls if "-c" in c]
    assert len(compiled) == 2 and all(Path(c[c.index("-c") + 1]).parent != memory.cbuild.FIRMWARE_INCLUDE.parent / "src"
                                      for c in compiled)
    assert {s.stem: (objdir / f"{s.stem}.o").stat().st_mtime_ns for s in srcs} == objs
    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "b"))
    monkeypatch.setattr(memory.subprocess, "run", real)
    memory._LINK_CACHE.clear()
    b = memory.breakdown(m, "microbit")
    assert (b.ram, b.flash) == got
    memory._LINK_CACHE.clear()
