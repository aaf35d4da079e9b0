"""Flower's deployment engine on localhost, as separate processes: a SuperLink, a tinytrain
gateway owning two QEMU boards (mps2_an386, W1 firmware with the on-device codec) with the
SuperNode of that host, and a second SuperNode serving two simulated devices; `flwr run`
runs 3 rounds. The global model equals tinytrain's own engine's, bit for bit; a SuperNode
killed mid-run leaves its rounds to the others (quorum), every saved model is whole."""
import json
import time

import numpy as np
import pytest

pytest.importorskip("flwr", reason="flwr not installed (pip install tinytrain[flower])")

from tests.flowerutil import APP, BIN, Flower, free_port  # noqa: E402
from tests.test_federated_qemu import _missing  # noqa: E402  (QEMU, the ARM toolchain, PlatformIO)


pytestmark = [pytest.mark.qemu, pytest.mark.slow,
              pytest.mark.skipif(bool(_missing()), reason=f"missing: {', '.join(_missing())}")]
BOARD = "mps2_an386"
RUN = 'clients=4 min-available-nodes=2 num-server-rounds=3 compress="int8" local-steps=60 partition="dirichlet:0.5"'


@pytest.fixture(scope="module")
def w1():
    from tinytrain.federated import resolve
    from tinytrain.verify import build_cached

    model, ds = resolve("digits-mlp", "digits")
    build_cached(model, BOARD, fedcodec="auto")  # the gateway finds it in the cache
    return model, ds


def _federation(home):
    """SuperLink, gateway + SuperNode A (devices 0, 1 on QEMU), SuperNode B (2, 3 simulated)."""
    f = Flower(home, simulation=False)
    try:
        g = free_port()
        gw = f.start([str(BIN / "tinytrain"), "federate-gateway", "--board", BOARD, "--listen", f"127.0.0.1:{g}"],
                     "gateway")
        end = time.monotonic() + 60
        while "listening" not in (f.home / "gateway.log").read_text():
            assert gw.poll() is None and time.monotonic() < end, (f.home / "gateway.log").read_text()
            time.sleep(0.2)
        node = [str(BIN / "flower-supernode"), "--insecure", "--superlink", f"127.0.0.1:{f.port}"]
        f.start(node + ["--port", str(free_port()), "--node-config", f'devices="0,1" gateway="127.0.0.1:{g}"'],
                "supernode-a")
        b = f.start(node + ["--port", str(free_port()), "--node-config", 'devices="2,3"'], "supernode-b")
    except BaseException:
        f.close()
        raise
    return f, b


def _engine(model, ds, drop=None, out=None):
    """tinytrain's engine, 4 simulated devices (boards equal them: test_federated_qemu), the
    devices not accepted by the Flower run left out of those rounds."""
    from tinytrain.federated import FaultyDevice, FedConfig, Federation, make_devices

    cfg = FedConfig(rounds=3, compress="int8", compress_down="none", local_steps=60, partition="dirichlet:0.5")
    devs = make_devices(model, ds, cfg, simulated=4)
    devs = [FaultyDevice(d, {k: "timeout" for k in (drop or {}) if k[1] == d.id}) for d in devs]
    fed = Federation(model, ds, devs, cfg, out=out)
    return fed.run()


def test_two_supernodes_qemu_and_simulated_equal_engine(w1, tmp_path):
    model, ds = w1
    f, _ = _federation(tmp_path / "home")
    try:
        rc = f.run(f'{RUN} out-dir="{tmp_path / "fl"}"', timeout=900)
    finally:
        f.close()
    logs = {p.name: p.read_text()[-1500:] for p in f.home.glob("*.log")}
    assert rc.returncode == 0 and (tmp_path / "fl" / "summary.json").exists(), (rc.stdout[-3000:], logs)
    s = json.loads((tmp_path / "fl" / "summary.json").read_text())
    assert [h["accepted"] for h in s["history"]] == [4, 4, 4], s["history"]
    e = _engine(model, ds)
    assert s["state_hash"] == e["state_hash"] and s["accuracy_per_round"] == e["accuracy_per_round"]
    assert s["bytes_up"] == e["bytes_up"]


def test_supernode_killed_mid_run_leaves_rounds_to_the_others(w1, tmp_path):
    import os
    import signal
    import subprocess

    from tinytrain.graph import io as tio

    model, ds = w1
    out = tmp_path / "fl"
    f, b = _federation(tmp_path / "home")
    try:
        p = subprocess.Popen([str(BIN / "flwr"), "run", str(APP), "tt", "--run-config",
                              f'{RUN} out-dir="{out}" round-timeout=120.0', "--stream"],
                             env=f.env, stdout=open(f.home / "flwr-run.log", "w"), stderr=subprocess.STDOUT)
        end = time.monotonic() + 600
        while not (out / "rounds" / "global-r0001.tt").exists():
            assert p.poll() is None and time.monotonic() < end
            time.sleep(0.05)
        os.killpg(b.pid, signal.SIGKILL)  # SuperNode B and its ClientApp, while round 2 runs
        p.wait(timeout=900)
    finally:
        f.close()
    s = json.loads((out / "summary.json").read_text())
    acc = [h["accepted_devices"] for h in s["history"]]
    log = (f.home / "flwr-run.log").read_text()
    assert s["rounds"] == 3 and acc[0] == [0, 1, 2, 3] and acc[2] == [0, 1], (acc, log[-3000:])
    drop = {(h["round"], d) for h in s["history"] for d in range(4) if d not in h["accepted_devices"]}
    e = _engine(model, ds, drop, out=tmp_path / "engine")
    assert s["state_hash"] == e["state_hash"] and s["accuracy_per_round"] == e["accuracy_per_round"]
    assert not [p.name for p in out.rglob("*") if p.name.startswith(".") or p.suffix == ".tmp"]
    for r in (1, 2, 3):  # every saved round is whole and is the engine's
        a, _ = tio.load(out / "rounds" / f"global-r{r:04d}.tt")
        b_, _ = tio.load(tmp_path / "engine" / "rounds" / f"global-r{r:04d}.tt")
        assert a.state_hash() == b_.state_hash()
        assert all(np.array_equal(x.data, y.data) for la, lb in zip(a.layers, b_.layers)
                   for x, y in zip(la.params, lb.params))
