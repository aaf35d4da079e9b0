"""Federated rounds with simulated devices: the FedAvg rounding rule, update codecs with error
feedback, corruption checks, partitions, faults and quorum, resume, the CLI, 1,000 clients."""
import json
import os
import struct
from fractions import Fraction
from math import floor

import numpy as np
import pytest

from tinytrain import fixedpoint as fp
from tinytrain.graph import io as tio
from tinytrain.federated import (CorruptUpdate, DeviceFault, FaultyDevice, FedConfig, Federation,
                                 QuorumError, Schema, fedavg, federate, make_devices, partition,
                                 resolve)
from tinytrain.federated.codec import compress, decode_update, encode_update, store_hash
from tinytrain.train import fit


@pytest.fixture(scope="module")
def w1():
    return resolve("digits-mlp", "digits")


# ------------------------------------------------------------------------------ FedAvg

def _exact(ws, ns):
    q = Fraction(sum(n * w for w, n in zip(ws, ns)), sum(ns))
    return floor(q + Fraction(1, 2))  # nearest, ties toward +inf


@pytest.mark.parametrize("dtype", [np.int16, np.int32])
def test_fedavg_rounds_half_up_exactly(dtype):
    hi = 32767 if dtype == np.int16 else 2**31 - 1
    lo = -hi if dtype == np.int16 else -(2**31)
    edge = [lo, lo + 1, -2, -1, 0, 1, 2, hi - 1, hi]
    rng = np.random.default_rng(0)
    for _ in range(200):
        k = int(rng.integers(1, 5))
        ws = [np.array(rng.choice(edge, 9) if rng.random() < .5 else rng.integers(lo, hi, 9), dtype)
              for _ in range(k)]
        ns = [int(v) for v in rng.integers(1, 2000, k)]
        got = fedavg([([w], n) for w, n in zip(ws, ns)])[0]
        assert got.dtype == dtype
        assert [int(v) for v in got] == [_exact([int(w[j]) for w in ws], ns) for j in range(9)]
    # ties go toward +inf: (1 + 2) / 2 -> 2, (-1 + -2) / 2 -> -1
    assert fedavg([([np.array([1, -1], dtype)], 1), ([np.array([2, -2], dtype)], 1)])[0].tolist() == [2, -1]


# ------------------------------------------------------------------------------ codecs

@pytest.mark.parametrize("codec", ["int8", "int4", "sign", "topk16", "topk32", "int4b32", "int4b64"])
def test_codec_error_feedback_loses_nothing(w1, codec):
    """Over rounds, sum of what the coordinator reconstructs + the final residual equals the
    sum of the true deltas, exactly (error feedback), and the decoder agrees bit for bit."""
    model, _ = w1
    schema = Schema.of(model)
    rng = np.random.default_rng(1)
    glob = [t.copy() for t in schema.store_from_blob(b"\0" * schema.blob_bytes)]
    res, sent, true = None, [np.zeros(int(np.prod(s)), np.int64) for s in schema.shapes], None
    true = [np.zeros_like(x) for x in sent]
    for rnd in range(6):
        local = [np.clip(g.astype(np.int64) + rng.integers(-900, 900, g.shape), -30000, 30000).astype(g.dtype)
                 for g in glob]
        body, recon, res = compress(codec, local, glob, res)
        msg = encode_update(codec, 3, rnd, 10, 0, store_hash(recon), len(glob), body)
        u = decode_update(msg, schema, glob, rnd)
        for a, b in zip(u.store, recon):
            assert np.array_equal(a, b) and a.dtype == b.dtype
        for i, (lo, g, rc) in enumerate(zip(local, glob, recon)):
            true[i] += lo.reshape(-1).astype(np.int64) - g.reshape(-1)
            sent[i] += rc.reshape(-1).astype(np.int64) - g.reshape(-1)
    for t, s, r in zip(true, sent, res):
        assert np.array_equal(t, s + r)
    n = schema.n_params
    topk = sum(3 * -(-int(np.prod(sh)) // (16 if codec == "topk16" else 32)) for sh in schema.shapes)
    b = {"int4b32": 32, "int4b64": 64}.get(codec, 1)
    block = sum(-(-int(np.prod(sh)) // 2) + -(-int(np.prod(sh)) // b) for sh in schema.shapes)
    per = {"int8": n, "int4": n / 2, "sign": n / 8, "int4b32": block, "int4b64": block}.get(codec, topk)
    assert len(msg) <= per + 2 * len(glob) + 40


def test_topk_sends_the_k_largest_and_refuses_bad_indices(w1):
    from tinytrain.federated.codec import HEADER, topk_count

    model, _ = w1
    schema = Schema.of(model)
    glob = [np.zeros(sh, dt) for sh, dt in zip(schema.shapes, schema.dtypes)]
    rng = np.random.default_rng(7)
    local = [rng.integers(-3000, 3000, sh).astype(dt) for sh, dt in zip(schema.shapes, schema.dtypes)]
    local[0].reshape(-1)[:5] = 2999  # ties: the lower indices win
    body, recon, res = compress("topk16", local, glob, None)
    for lo, rc in zip(local, recon):
        v, k = np.abs(lo.reshape(-1).astype(np.int64)), topk_count(lo.size, "topk16")
        sent = np.flatnonzero(rc.reshape(-1))
        assert len(sent) <= k and np.abs(v[sent]).min() >= np.sort(v)[-k] - 1
    assert set(range(5)) <= set(np.flatnonzero(recon[0].reshape(-1)))
    msg = encode_update("topk16", 0, 1, 5, 0, store_hash(recon), len(glob), body)
    assert [np.array_equal(a, b) for a, b in zip(decode_update(msg, schema, glob, 1).store, recon)] == [True] * 4
    bad = bytearray(msg)
    off = HEADER.size + 1  # header, tensor 0's shift byte, then its indices: swap the first two
    bad[off:off + 4] = bad[off + 2:off + 4] + bad[off:off + 2]
    bad[-4:] = struct.pack("<I", fp.crc32(bytes(bad[:-4])))
    with pytest.raises(CorruptUpdate, match="strictly increasing"):
        decode_update(bytes(bad), schema, glob, 1)


def test_update_crc_and_tamper_are_caught(w1):
    model, _ = w1
    schema = Schema.of(model)
    from tinytrain.verify import state_blob

    glob = [t.copy() for t in schema.store_from_blob(state_blob(model))]
    blob = state_blob(model)
    good = encode_update("none", 0, 1, 5, 0, fp.crc32(blob), len(schema.slots), blob)
    assert decode_update(good, schema, glob, 1).n_samples == 5
    bad = bytearray(good)
    bad[100] ^= 1
    with pytest.raises(CorruptUpdate, match="CRC"):
        decode_update(bytes(bad), schema, glob, 1)
    bad[-4:] = struct.pack("<I", fp.crc32(bytes(bad[:-4])))  # tampered, CRC recomputed
    with pytest.raises(CorruptUpdate, match="hash"):
        decode_update(bytes(bad), schema, glob, 1)
    with pytest.raises(CorruptUpdate, match="round"):
        decode_update(good, schema, glob, 2)


def test_partitions_cover_the_data_once():
    y = np.repeat(np.arange(10), 50)
    for spec in ("iid", "dirichlet:0.1", "dirichlet:10"):
        parts = partition(y, 7, spec, seed=3)
        allidx = np.concatenate(parts)
        assert sorted(allidx.tolist()) == list(range(len(y))) and all(len(p) for p in parts)
        assert all(np.array_equal(a, b) for a, b in zip(parts, partition(y, 7, spec, seed=3)))
    skew = [len(np.unique(y[p])) for p in partition(y, 7, "dirichlet:0.1", seed=3)]
    assert np.mean(skew) < 6  # non-IID: few classes per device
    with pytest.raises(ValueError, match="ALPHA"):
        partition(y, 3, "dirichlet:-1")


# ------------------------------------------------------------------- accuracy and bytes

def test_w1_four_devices_close_to_centralized_and_int8_cuts_bytes(w1):
    model, ds = w1
    central = resolve("digits-mlp", ds)[0]
    c_acc = fit(central, ds, 10, seed=0, progress=False).last["test_accuracy"]
    base = federate(model, ds, simulated=4, rounds=10, partition="iid")
    assert base["final_accuracy"] >= c_acc - 0.02, (base["final_accuracy"], c_acc)
    q = federate(model, ds, simulated=4, rounds=10, partition="iid", compress="int8")
    assert q["final_accuracy"] >= base["final_accuracy"] - 0.01
    msgs = 2 * 4 * 10  # down + up, per device per round
    int32_params = msgs * 4 * base["params"]
    assert int32_params >= 3 * q["bytes_on_wire"], (int32_params, q["bytes_on_wire"])
    assert q["bytes_on_wire"] < base["bytes_on_wire"]


# --------------------------------------------------------------------------- faults

@pytest.mark.parametrize("kind", ["timeout", "disconnect", "reset", "corrupt", "tamper"])
def test_faulty_device_is_left_out_and_rejoins(w1, kind):
    model, ds = w1
    cfg = FedConfig(rounds=3, local_steps=40, compress="int8", quorum=0.5)
    devs = make_devices(model, ds, cfg, simulated=3)
    devs[1] = FaultyDevice(devs[1], {(2, 1): kind})
    fed = Federation(model, ds, devs, cfg)
    fed.run()
    h = fed.history
    assert [e["accepted"] for e in h] == [3, 2, 3]
    assert h[1]["dropped"][0]["device"] == 1
    assert h[1]["dropped"][0]["reason"] == ("corrupt" if kind == "tamper" else kind)
    assert fed.dropped_total == 1


def test_quorum_not_met_raises_and_keeps_model(w1):
    model, ds = w1
    cfg = FedConfig(rounds=1, local_steps=10, quorum=3, max_retries=1)
    devs = [FaultyDevice(d, {(1, 0): "timeout"}) for d in make_devices(model, ds, cfg, simulated=3)]
    fed = Federation(model, ds, devs, cfg)
    h0 = fed.state_hash()
    with pytest.raises(QuorumError):
        fed.run()
    assert fed.state_hash() == h0 and fed.round == 0


@pytest.mark.parametrize("codec", ["none", "int8"])
def test_resume_equals_uninterrupted(w1, tmp_path, codec):
    model, ds = w1
    kw = dict(simulated=5, partition="dirichlet:0.3", local_steps=50, compress=codec)
    a = federate(model, ds, rounds=4, out=tmp_path / "a", **kw)
    federate(model, ds, rounds=2, out=tmp_path / "b", **kw)
    b = federate(model, ds, rounds=4, out=tmp_path / "b", resume=True, **kw)
    assert a["state_hash"] == b["state_hash"]
    assert a["accuracy_per_round"] == b["accuracy_per_round"]
    assert a["bytes_on_wire"] == b["bytes_on_wire"]
    m, extra = tio.load(tmp_path / "b" / "global.tt")
    assert extra["federated"]["round"] == 4 and f"{m.state_hash():08x}" == b["state_hash"]
    assert sorted(p.name for p in (tmp_path / "b" / "rounds").iterdir())[-1] == "global-r0004.tt"


# ------------------------------------------------------------------------------- scale

def test_thousand_simulated_clients_in_one_round(w1):
    model, ds = w1
    r = federate(model, ds, simulated=1000, rounds=1, compress="int8")
    h = r["history"][0]
    assert h["accepted"] == 1000 and h["samples"] == len(ds.x_train)


# --------------------------------------------------------------------------------- CLI

def test_cli_federate_json(tmp_path, capsys):
    from tinytrain.cli import main

    out = tmp_path / "fed"
    rc = main(["federate", "--simulated", "3", "--rounds", "2", "--model", "digits-mlp",
               "--partition", "dirichlet:0.5", "--local-steps", "30", "--compress", "int4",
               "--out", str(out), "--json"])
    assert rc == 0
    res = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for k in ("rounds", "final_accuracy", "bytes_on_wire", "dropped_updates"):
        assert k in res
    assert res["rounds"] == 2 and res["dropped_updates"] == 0
    assert (out / "global.tt").is_file() and (out / "federated.png").stat().st_size > 1000
    assert main(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp",
                 "--partition", "dirichlet:x"]) == 2


def test_killed_run_temp_files_are_removed_on_the_next_run(w1, tmp_path):
    """A run killed between creating and renaming its checkpoint leaves .NAME.PID.tmp files;
    the next run writing there removes those whose PID is dead, and keeps a live writer's."""
    import subprocess
    import sys

    model, ds = w1
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True, check=True).stdout.strip()
    out = tmp_path / "fed"
    (out / "rounds").mkdir(parents=True)
    stale = [out / f".global.tt.{dead}.tmp", out / f".fleet-r0003.npz.{dead}.tmp",
             out / "rounds" / f".global-r0003.tt.{dead}.tmp"]
    live = out / f".global.tt.{os.getppid()}.tmp"  # a running process: maybe a write in progress
    other = out / f"notes.{dead}.tmp"              # not a name atomic_write makes
    for p in (*stale, live, other):
        p.write_bytes(b"partial")
    federate(model, ds, simulated=2, rounds=1, local_steps=10, compress="int8", out=out)
    assert [p for p in stale if p.exists()] == []
    assert live.exists() and other.exists()
    assert (out / "global.tt").is_file() and (out / "fleet-r0001.npz").is_file()


def test_board_that_misses_a_round_is_restarted_then_left_out(w1, caplog):
    """LinkDevice's contract, without hardware: a failed link marks the board as having
    missed a round; the next ensure_ready() restarts it (emulated: kill and boot; real: DTR/RTS
    pulse) before connecting; a board that answers again is back in, one that does not is
    left out for good with one logged message and no further connection attempts."""
    from types import SimpleNamespace

    from tinytrain.federated.devices import LinkDevice
    from tinytrain.device.protocol import DeviceTimeout
    from tinytrain.train import prepare_inputs

    model, ds = w1
    X, Y, _, _ = prepare_inputs(model, ds)
    calls = []
    answers = iter([False, True, False])  # connect() outcomes, in order

    def connect():
        calls.append("connect")
        if not next(answers):
            raise DeviceTimeout("no reply")
        return SimpleNamespace(info=SimpleNamespace(schema_hash=model.schema_hash()), close=lambda: None)

    dev = LinkDevice(0, Schema.of(model), np.arange(10), X, Y, model, connect,
                     restart=lambda: calls.append("restart"))
    with pytest.raises(DeviceFault) as e1:
        dev.ensure_ready()                      # first connection fails: no restart yet
    assert e1.value.kind == "disconnect" and dev.missed and calls == ["connect"]
    dev.ensure_ready()                          # restarted, answers: back in
    assert calls == ["connect", "restart", "connect"] and not dev.missed
    dev._drop()                                 # its link breaks in a round (timeout)
    caplog.set_level("WARNING", logger="tinytrain.federated")
    with pytest.raises(DeviceFault) as e2:
        dev.ensure_ready()                      # restarted, silent: left out
    assert e2.value.kind == "left-out" and "does not answer after a restart" in str(e2.value)
    assert caplog.text.count("left out of the federation") == 1
    with pytest.raises(DeviceFault) as e3:
        dev.ensure_ready()                      # no more attempts
    assert e3.value.kind == "left-out"
    assert calls == ["connect", "restart", "connect", "restart", "connect"]
