"""The runtime's state blob (tinytrain/firmware/src/tt_state.c) against a Python model of it:
spans crossing boundaries, an empty span, out-of-range and overflowing ranges, writes over a
read-only (flash) span with equal and with different bytes (all or nothing), a zero span (no
storage: the accumulators of momentum slots at batch 1; it behaves as a read-only span of zeros),
-32768 into a
symmetric int16 span (refused, whole or split over writes), tensors by id, reset. Built twice:
with cffi and UBSan (random ranges), and as a standalone binary under ASan + UBSan that walks
every range of the fixture (tests/c/tt_state_fixture.c, tt_state_harness.c)."""
from __future__ import annotations

import shutil
import struct
import subprocess
import zlib

import numpy as np
import pytest

from tinytrain.device import cbuild

from .conftest import HERE

C = HERE / "c"
SRCS = [cbuild.FIRMWARE_SRC / "tt_state.c", cbuild.FIRMWARE_SRC / "tt_crc32.c", C / "tt_state_fixture.c"]
# the fixture's spans: (initial bytes, read-only); the zero span last reads and writes as a
# read-only span of zeros
SPANS = [(struct.pack("<3h", 1, -2, 3), False), (b"", False), (bytes([5, 6, 7, 8, 9]), True),
         (struct.pack("<2i", 0x01020304, -1), False), (struct.pack("<I", 42), False), (bytes(6), True)]
BLOB = b"".join(b for b, _ in SPANS)


def model_write(blob: bytes, off: int, src: bytes):
    """(rc, blob after) of tt_state_write: all or nothing, refused (nothing written) when src
    would change a read-only span or leave -32768 in the symmetric int16 span (span 0; an
    element split by the range keeps the byte it holds)."""
    n, out = len(src), bytearray(blob)
    if off > len(blob) or n > len(blob) - off:
        return -1, bytes(blob)
    start, i = 0, 0
    for data, ro in SPANS:
        if n == 0:
            break
        if off < len(data):
            k = min(len(data) - off, n)
            a = start + off
            if ro and out[a:a + k] != src[i:i + k]:
                return -1, bytes(blob)
            out[a:a + k] = src[i:i + k]
            i, n, off = i + k, n - k, 0
        else:
            off -= len(data)
        start += len(data)
    if -32768 in struct.unpack_from("<3h", out):
        return -1, bytes(blob)
    return 0, bytes(out)


def model_read(blob: bytes, off: int, n: int):
    return (0, blob[off:off + n]) if off <= len(blob) and n <= len(blob) - off else (-1, b"")


@pytest.fixture(scope="module")
def state_lib():
    cdef = cbuild.cdef_from_header(cbuild.FIRMWARE_INCLUDE / "tt_state.h")
    cdef += "\nconst tt_spans *tts_table(void);\nvoid tts_reset(void);\n"
    ffi, lib = cbuild.compile_shared(SRCS, cdef, sanitize=True, name="ttstate", private=True)
    return ffi, lib, lib.tts_table()


def _blob(ffi, lib, t):
    buf = ffi.new("uint8_t[]", len(BLOB))
    assert lib.tt_state_read(t, 0, buf, len(BLOB)) == 0
    return bytes(ffi.buffer(buf, len(BLOB)))


def test_size_hash_and_tensors(state_lib):
    ffi, lib, t = state_lib
    assert lib.tt_state_size(t) == len(BLOB) == 29
    assert lib.tt_state_hash(t) == zlib.crc32(BLOB)
    total, buf = ffi.new("uint32_t *"), ffi.new("uint8_t[8]")
    for i, (data, _) in enumerate(SPANS):
        for off in range(len(data) + 2):
            for n in range(len(data) + 2 - off):
                total[0] = 12345
                rc = lib.tt_state_get_tensor(t, i, off, buf, n, total)
                ok = off + n <= len(data)
                assert rc == (0 if ok else -1) and total[0] == len(data), (i, off, n)
                if ok:
                    assert bytes(ffi.buffer(buf, n)) == data[off:off + n]
    for bad in (len(SPANS), 2**32 - 1):
        total[0] = 7
        assert lib.tt_state_get_tensor(t, bad, 0, buf, 0, total) == -1 and total[0] == 7
    assert lib.tt_state_get_tensor(t, 0, 2**32 - 1, buf, 2, total) == -1  # off + n overflows


def test_random_ranges_equal_the_model(state_lib):
    ffi, lib, t = state_lib
    rng = np.random.default_rng(0)
    blob = _blob(ffi, lib, t)
    assert blob == BLOB
    for _ in range(3000):
        off = int(rng.integers(0, len(blob) + 2))
        n = int(rng.integers(0, len(blob) + 2 - off))
        rc, want = model_read(blob, off, n)
        buf = ffi.new("uint8_t[]", max(1, n))
        assert lib.tt_state_read(t, off, buf, n) == rc
        assert rc or bytes(ffi.buffer(buf, n)) == want
        # a write with some bytes kept and some changed, over any spans
        src = bytes(blob[off + i] if off + i < len(blob) and rng.random() < 0.5 else int(rng.integers(0, 256))
                    for i in range(n))
        rc, want = model_write(blob, off, src)
        assert lib.tt_state_write(t, off, src, n) == rc, (off, n)
        blob = _blob(ffi, lib, t)
        assert blob == want, (off, n)
        assert lib.tt_state_hash(t) == zlib.crc32(blob)
        if rng.random() < 0.1:  # back to the start (the read-only span never changed)
            assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0
            blob = BLOB


def test_read_only_span(state_lib):
    ffi, lib, t = state_lib
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0
    ro = BLOB.index(bytes([5, 6, 7, 8, 9]))
    assert lib.tt_state_write(t, ro, bytes([5, 6, 7, 8, 9]), 5) == 0  # equal bytes: accepted
    assert lib.tt_state_write(t, ro + 1, bytes([6, 7]), 2) == 0
    assert lib.tt_state_write(t, ro + 4, bytes([8]), 1) == -1  # one byte differs: refused
    # across it: nothing is written, not even the writable span before it
    src = b"\xaa" * ro + b"\x00" + b"\xbb" * 10
    assert lib.tt_state_write(t, 0, src, len(src)) == -1
    assert _blob(ffi, lib, t) == BLOB
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0 and _blob(ffi, lib, t) == BLOB


@pytest.mark.parametrize("value", [-32768, -32767, 32767, -1, 0])
@pytest.mark.parametrize("elem", [0, 1, 2])
def test_symmetric_span_refuses_the_minimum_whole_or_split(state_lib, value, elem):
    """-32768 into the symmetric int16 span, in one write, in one write with other spans, or
    split over two writes either way round (each byte alone in range): refused, and nothing of
    that write lands; any other value is written."""
    ffi, lib, t = state_lib
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0
    two = struct.pack("<h", value)
    bad = value == -32768
    whole = bytearray(BLOB)
    whole[2 * elem:2 * elem + 2] = two
    assert lib.tt_state_write(t, 0, bytes(whole), len(BLOB)) == (-1 if bad else 0)
    assert _blob(ffi, lib, t) == (BLOB if bad else bytes(whole))
    for first in (0, 1):  # low byte first, then high, or the other way
        assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0
        a, b = 2 * elem + first, 2 * elem + 1 - first
        assert lib.tt_state_write(t, a, two[first:first + 1], 1) == model_write(BLOB, a, two[first:first + 1])[0]
        held = _blob(ffi, lib, t)
        assert lib.tt_state_write(t, b, two[1 - first:2 - first], 1) == (-1 if bad else 0)
        assert _blob(ffi, lib, t) == (held if bad else bytes(whole))
        assert -32768 not in struct.unpack_from("<3h", _blob(ffi, lib, t))
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0


def test_out_of_range_writes_nothing(state_lib):
    ffi, lib, t = state_lib
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0
    for off, n in ((0, len(BLOB) + 1), (len(BLOB), 1), (len(BLOB) + 1, 0), (1, 2**32 - 1), (2**32 - 1, 2)):
        src = ffi.new("uint8_t[]", 32)
        assert lib.tt_state_write(t, off, src, n) == -1 and lib.tt_state_read(t, off, src, n) == -1
        assert _blob(ffi, lib, t) == BLOB
    buf = ffi.new("uint8_t[1]")
    assert lib.tt_state_read(t, len(BLOB), buf, 0) == 0 and lib.tt_state_write(t, len(BLOB), buf, 0) == 0


def test_reset_copies_and_zeroes(state_lib):
    ffi, lib, t = state_lib
    lib.tts_reset()
    want = struct.pack("<3h", 10, 20, 30) + BLOB[6:11] + bytes(8) + BLOB[19:]
    assert _blob(ffi, lib, t) == want
    assert lib.tt_state_write(t, 0, BLOB, len(BLOB)) == 0


@pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc not installed")
def test_every_range_clean_under_asan_and_ubsan(tmp_path):
    from .test_codegen_asan import _asan_works

    if not _asan_works(tmp_path):
        pytest.skip("gcc cannot link -fsanitize=address here")
    exe = tmp_path / "state"
    cmd = ["gcc", "-std=c99", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
           "-fno-sanitize-recover=all", "-fno-omit-frame-pointer", f"-I{cbuild.FIRMWARE_INCLUDE}",
           *map(str, SRCS), str(C / "tt_state_harness.c"), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([str(exe)], capture_output=True, text=True, env={"ASAN_OPTIONS": "detect_leaks=0"})
    assert r.returncode == 0, r.stderr[-2000:]
    lines = r.stdout.splitlines()
    assert lines[0] == f"size {len(BLOB)} hash {zlib.crc32(BLOB):08x}"
    checked = 0
    for line in lines[1:]:
        op, off, n, rc, *rest = line.split()
        off, n, rc = int(off), int(n), int(rc)
        got = bytes.fromhex(rest[0]) if rest else b""
        if op == "r":
            want_rc, want = model_read(BLOB, off, n)
        else:
            src = bytes(BLOB[off + i] if op == "w=" else 255 - BLOB[off + i] for i in range(min(n, len(BLOB) - off)))
            want_rc, want = model_write(BLOB, off, src + bytes(n - len(src)))
        assert (rc, got) == (want_rc, want), line
        checked += 1
    assert checked == 3 * sum(len(BLOB) + 2 - off for off in range(len(BLOB) + 2)) + 2
