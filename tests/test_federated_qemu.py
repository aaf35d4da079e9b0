"""Federated rounds across emulated boards (QEMU mps2_an386, W1 firmware built once and
cached): the final global model equals, bit for bit, the same federation of simulated
devices; a board killed mid-round is left out, the round completes, and it rejoins."""
import shutil
import threading

import pytest

from tinytrain.graph import io as tio
from tinytrain.federated import FedConfig, Federation, federate, make_devices, resolve


def _missing():
    miss = [t for t in ("qemu-system-arm", "arm-none-eabi-gcc") if shutil.which(t) is None]
    try:
        import platformio  # noqa: F401
    except ImportError:
        miss.append("platformio")
    return miss


pytestmark = [pytest.mark.qemu, pytest.mark.skipif(bool(_missing()), reason=f"missing: {', '.join(_missing())}")]
BOARD = "mps2_an386"


@pytest.fixture(scope="module")
def w1():
    return resolve("digits-mlp", "digits")


@pytest.fixture(scope="module")
def elf(w1):
    from tinytrain.verify import build_cached

    # one build per session (cached by source hash), with the on-device update codec
    return build_cached(w1[0], BOARD, fedcodec=True)


def test_four_boards_non_iid_equal_simulated(w1, elf):
    model, ds = w1
    kw = dict(rounds=5, partition="dirichlet:0.5", local_steps=60, compress="int8")
    cfg = FedConfig(**kw)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=4, elf=elf)
    fed = Federation(model, ds, devs, cfg)
    try:
        boards = fed.run()
    finally:
        fed.close()
    sim = federate(model, ds, simulated=4, **kw)
    # the boards encoded their int8 updates themselves (tt_fedcodec) and committed residuals
    assert all(d.last_begin is not None and d.last_ack.status == 1 for d in devs)
    assert boards["serial_bytes"] > boards["bytes_up"]
    assert boards["state_hash"] == sim["state_hash"]
    assert boards["accuracy_per_round"] == sim["accuracy_per_round"]
    acc = boards["accuracy_per_round"]
    assert acc[-1] > acc[0] + 0.2 and acc[-1] >= max(acc) - 0.02, acc
    assert boards["dropped_updates"] == 0


@pytest.mark.parametrize("compress", ["int4", "none", "topk32", "signmv"])
def test_fedprox_and_fedavgm_on_boards_equal_simulated(w1, elf, compress):
    """FedProx's pull runs on the boards (FED_PROX, tt_fedcodec_prox) every 7 samples, between
    TRAIN_BATCH chunks, toward their ROUND_BEGIN snapshot - with the update encoded on the board
    (int4; signmv: codec 8, aggregated by majority vote), sent whole (none: ROUND_BEGIN codec 0)
    or encoded by the host (topk32) - and the server applies FedAvgM: the global model equals
    simulated devices' bit for bit."""
    model, ds = w1
    kw = dict(rounds=3, partition="dirichlet:0.5", local_steps=40, compress=compress,
              server_momentum=0.5, server_lr=0.8, prox_mu=0.1, prox_every=7)
    cfg = FedConfig(**kw)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=2, elf=elf)
    assert all(d.prox is not None and d.prox.every == 7 for d in devs)
    fed = Federation(model, ds, devs, cfg)
    try:
        boards = fed.run()
    finally:
        fed.close()
    sim = federate(model, ds, simulated=2, **kw)
    plain = federate(model, ds, simulated=2, **{**kw, "prox_mu": 0.0})
    assert boards["dropped_updates"] == 0
    assert boards["state_hash"] == sim["state_hash"] != plain["state_hash"]
    assert boards["accuracy_per_round"] == sim["accuracy_per_round"]


def test_int16_residual_on_boards_saturates_as_simulated(w1):
    """Firmware built with -DTT_FED_RESIDUAL_BITS=16 (HELLO reports it) keeps its sign residual in
    int16; it saturates (counted on the simulated twins), and the boards still equal simulated
    devices bit for bit. A run whose width differs from the firmware's leaves the boards out."""
    from tinytrain.federated import DevicesUnreachable
    from tinytrain.federated import api

    model, ds = w1
    kw = dict(rounds=3, partition="dirichlet:0.5", local_steps=60, compress="signmv", residual_bits=16)
    cfg = FedConfig(**kw)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=2)
    fed = Federation(model, ds, devs, cfg)
    try:
        boards = fed.run()
        assert all(d.link.info.residual_bits == 16 for d in devs)
    finally:
        fed.close()
    made = []
    real = api.make_devices
    api.make_devices = lambda *a, **k: made.extend(real(*a, **k)) or made
    try:
        sim = federate(model, ds, simulated=2, **kw)
    finally:
        api.make_devices = real
    assert sum(d.stats["residual_saturated"] for d in made) > 0
    assert boards["state_hash"] == sim["state_hash"] and boards["dropped_updates"] == 0
    wide = federate(model, ds, simulated=2, **{**kw, "residual_bits": 32})
    assert wide["state_hash"] != sim["state_hash"]
    from tinytrain.verify import build_cached

    elf16 = build_cached(model, BOARD, fedcodec="auto", build_flags=("-DTT_FED_RESIDUAL_BITS=16",))
    cfg32 = FedConfig(**{**kw, "rounds": 1, "residual_bits": 32})
    devs = make_devices(model, ds, cfg32, board=BOARD, devices=1, elf=elf16)
    fed = Federation(model, ds, devs, cfg32)
    try:
        with pytest.raises(DevicesUnreachable, match="keeps the residual in int16, this run in int32"):
            fed.run()
    finally:
        fed.close()


def test_board_killed_mid_round_rejoins(w1, elf, tmp_path):
    model, ds = w1
    cfg = FedConfig(rounds=3, local_steps=45, quorum=0.5)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=3, elf=elf)

    def kill(dev, rnd, k):
        if rnd == 2 and k >= 20:
            dev.board.kill()
    devs[2].on_step = kill
    out = tmp_path / "fed"
    seen, stop = [], threading.Event()

    def watch():  # every global model ever on disk must load (complete, checksummed)
        while not stop.is_set():
            p = out / "global.tt"
            if p.exists():
                seen.append(tio.load(p)[1]["federated"]["round"])
    t = threading.Thread(target=watch)
    t.start()
    fed = Federation(model, ds, devs, cfg, out=out)
    try:
        fed.run()
    finally:
        stop.set()
        t.join()
        fed.close()
    h = fed.history
    assert [e["accepted"] for e in h] == [3, 2, 3]
    assert [d["device"] for d in h[1]["dropped"]] == [2]
    assert h[1]["dropped"][0]["reason"] in ("disconnect", "timeout")
    assert seen and set(seen) <= {1, 2, 3}
    assert sorted(p.name for p in (out / "rounds").iterdir()) == [f"global-r000{i}.tt" for i in (1, 2, 3)]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


def test_residual_lives_on_the_board(w1, elf, caplog):
    """int4 over 3 boards: board 0's firmware has no codec, so its agent compresses on the host
    side of the link (the fallback, logged); boards 1 and 2 compress on the board. Board 1's round-2 update is corrupted in transit and dropped:
    the board keeps its round-1 residual (UPDATE_ACK status 0, same residual CRC at the next
    ROUND_BEGIN), and round 3 carries it. The global model equals simulated devices with the
    same fault, and each board's residual equals its simulated twin's."""
    import numpy as np

    from tinytrain import fixedpoint as fp
    from tinytrain.federated.devices import EmulatedBoard, FaultyDevice, LinkDevice
    from tinytrain.verify import build_cached

    caplog.set_level("INFO", logger="tinytrain.federated")

    model, ds = w1
    kw = dict(rounds=3, local_steps=30, compress="int4", quorum=0.5)
    cfg = FedConfig(**kw)
    plan = {(2, 1): "corrupt"}
    boards = make_devices(model, ds, cfg, board=BOARD, devices=3, elf=elf)
    # board 0 runs firmware built without the codec: its agent compresses on the host side
    eb = EmulatedBoard(BOARD, build_cached(model, BOARD), timeout=10.0)
    boards[0]._connect, boards[0].board = eb.connect, eb
    boards[0].close = lambda d=boards[0]: (LinkDevice.close(d), eb.close())
    acks, begins = [], []
    fed = Federation(model, ds, [FaultyDevice(d, plan) for d in boards], cfg)
    try:
        for _ in range(3):
            fed.run_round()
            begins.append(boards[1].last_begin)
            acks.append(boards[1].last_ack)
        assert not boards[0].link.info.fedcodec and boards[0].last_begin is None
        assert boards[2].last_ack.status == 1
        assert "compressing its updates on the host side" in caplog.text
    finally:
        fed.close()
    sim_devs = make_devices(model, ds, cfg, simulated=3)
    sim = Federation(model, ds, [FaultyDevice(d, plan) for d in sim_devs], cfg)
    sim.run()
    assert [h["accepted"] for h in fed.history] == [3, 2, 3]
    assert fed.history[1]["dropped"][0]["device"] == 1
    assert [a.status for a in acks] == [1, 0, 1]
    assert begins[1].residual_crc == acks[0].residual_crc  # round 2 began with round 1's residual
    assert begins[2].residual_crc == acks[0].residual_crc  # the dropped round committed nothing
    assert acks[2].residual_crc == fp.crc32(np.concatenate(sim_devs[1].residual).astype("<i8").tobytes())
    assert fed.state_hash() == sim.state_hash()
    assert [h["accuracy"] for h in fed.history] == [h["accuracy"] for h in sim.history]


def test_frozen_board_is_restarted_and_rejoins(w1, elf):
    """Board 2's QEMU is frozen (SIGSTOP: alive, socket open, silent) in the middle of round 2.
    The round completes with the other two after one request timeout (no retries over a
    socket); before round 3 the frozen process is killed and a fresh board booted, which takes
    part in round 3 again. The global model equals simulated devices with the same
    participation (device 2 out of round 2), bit for bit."""
    import os

    from tinytrain.federated.devices import FaultyDevice

    model, ds = w1
    cfg = FedConfig(rounds=3, local_steps=30, quorum=2)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=3, elf=elf, timeout=8.0)  # a loaded 2-core CI still answers in time
    frozen = []

    def freeze(dev, rnd, k):
        if rnd == 2 and k >= 10 and not frozen:
            frozen.append(dev.board.pid)
            dev.board.freeze()
    devs[2].on_step = freeze
    fed = Federation(model, ds, devs, cfg)
    try:
        fed.run()
        assert devs[2].board.restarts == 1 and devs[2].board.pid != frozen[0]
        assert not os.path.exists(f"/proc/{frozen[0]}")  # killed and reaped, not left stopped
        assert [d.board.restarts for d in devs[:2]] == [0, 0]
    finally:
        fed.close()
    h = fed.history
    assert [e["accepted"] for e in h] == [3, 2, 3]
    assert [(d["device"], d["reason"]) for d in h[1]["dropped"]] == [(2, "timeout")]
    sim_devs = [FaultyDevice(d, {(2, 2): "timeout"}) for d in make_devices(model, ds, cfg, simulated=3)]
    sim = Federation(model, ds, sim_devs, cfg)
    sim.run()
    assert fed.state_hash() == sim.state_hash()
    assert [e["accuracy"] for e in h] == [e["accuracy"] for e in sim.history]


@pytest.mark.parametrize("policy", ["int8-master16"])
def test_fedprox_on_boards_with_master_copies_equals_simulated(w1, policy):
    """A board's FedProx pull (and the broadcast) writes the master copies through write_state,
    which narrows the compute copies again: master-weight models (int32 over int16, int16 over
    int8) federate on boards bit for bit like simulated devices, round after round."""
    from tinytrain.graph.convert import with_precision
    from tinytrain.verify import build_cached

    model, ds = with_precision(w1[0], policy), w1[1]
    kw = dict(rounds=3, partition="iid", local_steps=30, compress="none", prox_mu=0.1, prox_every=7)
    cfg = FedConfig(**kw)
    devs = make_devices(model, ds, cfg, board=BOARD, devices=2, elf=build_cached(model, BOARD, fedcodec=True))
    fed = Federation(model, ds, devs, cfg)
    try:
        boards = fed.run()
    finally:
        fed.close()
    sim = federate(model, ds, simulated=2, **kw)
    assert boards["dropped_updates"] == 0
    assert boards["state_hash"] == sim["state_hash"] and boards["accuracy_per_round"] == sim["accuracy_per_round"]
