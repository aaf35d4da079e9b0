"""The .tt model file: exact round trip of the whole training state, and a named error for
every kind of bad file."""
from __future__ import annotations

import os
import struct

import numpy as np
import pytest

from tinytrain import data, fixedpoint as fp
from tinytrain.graph import io as tio
from tinytrain.graph.models import build_model


@pytest.fixture(scope="module")
def digits():
    return data.load("digits")


def _trained(digits, n=40, **opt):
    m = build_model("digits-mlp", digits, **opt)
    for i in range(n):
        m.ref_train_step(digits.x_train[i], digits.y_train[i])
    return m


def _arrays(m):
    return [a.copy() for _, a in tio._state_items(m)]


@pytest.mark.parametrize("opt", [{}, {"batch_size": 3, "momentum": 0.9, "stochastic_rounding": True},
                                 {"master_weights": True, "weight_decay": 1e-3}, {"train": "last:1"}])
def test_round_trip_is_exact(digits, tmp_path, opt):
    m = _trained(digits, 41, **opt)
    p = tio.save(m, tmp_path / "m.tt", extra={"epoch": 2, "data_prng": 123, "note": np.int64(5)})
    m2, extra = tio.load(p)
    assert m2.state_hash() == m.state_hash()
    assert m2.config() == m.config() and m2.schema() == m.schema()
    for a, b in zip(_arrays(m), _arrays(m2)):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert extra == {"epoch": 2, "data_prng": 123, "note": 5}
    assert m2.data_input_exp == digits.input_exp
    # and it keeps training identically
    for i in range(41, 50):
        assert m.ref_train_step(digits.x_train[i], digits.y_train[i]) == m2.ref_train_step(digits.x_train[i], digits.y_train[i])
    assert m.state_hash() == m2.state_hash()


def test_layout(digits, tmp_path):
    m = _trained(digits, 3)
    buf = tio.to_bytes(m)
    magic, version, flags, hlen, total = struct.unpack_from("<8sHHIQ", buf)
    assert magic == tio.MAGIC and version == tio.FORMAT_VERSION and flags == 0 and total == len(buf)
    assert struct.unpack("<I", buf[-4:])[0] == fp.crc32(buf[:-4])
    hdr = tio.read_header(tio.save(m, tmp_path / "m.tt"))
    names = [t["name"] for t in hdr["tensors"]]
    assert names == ["L0.w", "L0.b", "L2.w", "L2.b", "meta", "stats"]
    assert all(t["offset"] % 8 == 0 for t in hdr["tensors"])
    assert hdr["state_hash"] == m.state_hash()


def test_save_is_atomic_and_overwrites(digits, tmp_path):
    m = _trained(digits, 2)
    p = tmp_path / "sub" / "m.tt"
    tio.save(m, p)
    m.ref_train_step(digits.x_train[5], digits.y_train[5])
    tio.save(m, p)
    assert tio.load(p)[0].state_hash() == m.state_hash()
    assert sorted(os.listdir(p.parent)) == ["m.tt"]  # no temporary left behind


def _bad(tmp_path, raw: bytes):
    p = tmp_path / "bad.tt"
    p.write_bytes(raw)
    with pytest.raises(tio.FileFormatError) as ei:
        tio.load(p)
    return str(ei.value)


def test_corrupt_byte(digits, tmp_path):
    buf = bytearray(tio.to_bytes(_trained(digits, 2)))
    buf[len(buf) // 2] ^= 0x10
    msg = _bad(tmp_path, bytes(buf))
    assert "corrupt" in msg and "checksum" in msg and "earlier checkpoint" in msg


@pytest.mark.parametrize("keep", [3, 20, 200, -1])
def test_truncated(digits, tmp_path, keep):
    buf = tio.to_bytes(_trained(digits, 2))
    msg = _bad(tmp_path, buf[:keep])
    assert "truncated" in msg


def test_trailing_bytes(digits, tmp_path):
    assert "unexpected bytes" in _bad(tmp_path, tio.to_bytes(_trained(digits, 2)) + b"xx")


def test_future_version(digits, tmp_path):
    buf = bytearray(tio.to_bytes(_trained(digits, 2)))
    struct.pack_into("<H", buf, 8, tio.FORMAT_VERSION + 1)
    buf[-4:] = struct.pack("<I", fp.crc32(bytes(buf[:-4])))
    msg = _bad(tmp_path, bytes(buf))
    assert "version 2" in msg and "upgrade tinytrain" in msg


@pytest.mark.parametrize("raw, what", [
    (b'{"layers": []}', "JSON file"),
    (b"PK\x03\x04" + b"\0" * 40, "zip"),
    (b"\x93NUMPY" + b"\0" * 40, "numpy"),
    (b"hello world, this is text" * 4, "not a tinytrain model"),
])
def test_foreign_files(tmp_path, raw, what):
    msg = _bad(tmp_path, raw)
    assert what in msg and "wrong magic" in msg


def test_empty_file(tmp_path):
    msg = _bad(tmp_path, b"")
    assert "empty file (0 bytes), not a tinytrain model" in msg and "train again" in msg


def test_text_mode_damage(digits, tmp_path):
    buf = tio.to_bytes(_trained(digits, 2)).replace(b"\r\n", b"\n", 1)
    assert "magic" in _bad(tmp_path, buf)


def test_missing_file(tmp_path):
    with pytest.raises(tio.FileFormatError, match="no such model file"):
        tio.load(tmp_path / "nope.tt")


def test_extra_must_be_json(digits, tmp_path):
    with pytest.raises(tio.FileFormatError, match="JSON"):
        tio.save(_trained(digits, 1), tmp_path / "m.tt", extra={"f": object()})
    assert not (tmp_path / "m.tt").exists()


def test_int16_minus_32768_is_refused(tmp_path):
    """-32768 would make the device (which skips zero updates) and the reference (which clamps)
    disagree; training never produces it, so a file holding it is refused."""
    from tinytrain import data
    from tinytrain.graph import io
    from tinytrain.graph.models import build_model
    import pytest as _pt
    ds = data.load("digits")
    m = build_model("digits-mlp", ds, seed=0)
    m.layers[0].params[0].data[0, 0] = -32768
    p = tmp_path / "bad.tt"
    io.save(m, p)
    with _pt.raises(io.FileFormatError, match="-32768"):
        io.load(p)


def test_stale_tmp_cleanup_leaves_odd_names_and_live_writers(tmp_path):
    """Only .NAME.PID.tmp files of dead PIDs go: a live PID's (a write in progress), names with
    digits too long for a PID (a nanosecond stamp: os.kill would overflow), other files stay."""
    import os

    from tinytrain.graph.io import remove_stale_tmp

    dead = 2**22 + 7  # above Linux's PID limit (pid_max <= 2^22): never a running process
    names = [f".m.tt.{os.getpid()}.tmp", f".m.tt.{dead}.tmp", ".m.tt.17012345678901234567.tmp", "m.tt", ".x.tmp"]
    for n in names:
        (tmp_path / n).write_bytes(b"x")
    removed = remove_stale_tmp(tmp_path)
    assert [p.name for p in removed] == [f".m.tt.{dead}.tmp"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - {f".m.tt.{dead}.tmp"})
