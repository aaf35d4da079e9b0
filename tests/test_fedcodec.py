"""The on-device update codec (tinytrain/firmware/src/tt_fedcodec.c, built with cffi and UBSan) against
tinytrain/federated/codec.py: the same message bytes and the same error-feedback residual for
hypothesis-drawn tensors, codecs and residuals; FedProx's pull (tt_fedcodec_prox) against
tinytrain/federated/prox.py; and the ROUND_BEGIN / GET_UPDATE / UPDATE_ACK / FED_PROX
conversation between DeviceLink and the C protocol (fake model of tests/c/tt_fake_model.c)."""
from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tinytrain.device import cbuild
from tinytrain import fixedpoint as fp
from tinytrain.device import protocol as P
from tinytrain.federated.codec import CODECS, DEVICE_CODECS, compress, encode_update, store_hash

HARNESS = r"""
#include <string.h>
#include "tt_fedcodec.h"

static uint8_t blob[1 << 16];
static uint32_t blob_len;
static tt_fed_tensor tens[8];
static uint8_t glob[1 << 16];
static int64_t res[1 << 13];
static uint8_t shifts[8];
static tt_fedcodec codec;

static int blob_read(uint32_t off, uint8_t *dst, uint32_t n)
{
    if (off > blob_len || n > blob_len - off) return -1;
    memcpy(dst, blob + off, n);
    return 0;
}

static uint32_t res_width = 8;
static int16_t res16[1 << 13];
static int32_t res32[1 << 13];
static void *res_buf(void) { return res_width == 2 ? (void *)res16 : res_width == 4 ? (void *)res32 : (void *)res; }

void tfh_width(uint32_t w) { res_width = w; }
void tfh_setup(const uint32_t *spec, uint32_t nt)
{
    uint32_t i;
    for (i = 0; i < nt; i++) {
        tens[i].offset = spec[3 * i];
        tens[i].count = spec[3 * i + 1];
        tens[i].width = spec[3 * i + 2];
    }
    tt_fedcodec_init(&codec, tens, nt, blob_read, glob, res_buf(), res_width, shifts);
}
void tfh_blob(const uint8_t *p, uint32_t n) { memcpy(blob, p, n); blob_len = n; }
void tfh_residual(int64_t *dst, const int64_t *src, uint32_t n)
{
    uint32_t i;
    for (i = 0; src && i < n; i++) {
        if (res_width == 2) res16[i] = (int16_t)src[i];
        else if (res_width == 4) res32[i] = (int32_t)src[i];
        else res[i] = src[i];
    }
    for (i = 0; dst && i < n; i++) dst[i] = res_width == 2 ? res16[i] : res_width == 4 ? res32[i] : res[i];
}
uint32_t tfh_saturations(void) { return tt_fedcodec_residual_saturations(&codec); }
int tfh_begin(uint32_t k, uint32_t r, uint32_t d) { return tt_fedcodec_begin(&codec, k, r, d); }
uint32_t tfh_global_hash(void) { return tt_fedcodec_global_hash(&codec); }
uint32_t tfh_residual_crc(void) { return tt_fedcodec_residual_crc(&codec); }
int tfh_prepare(uint32_t n, uint32_t step, uint32_t *len, uint32_t *crc)
{ return tt_fedcodec_prepare(&codec, n, step, len, crc); }
int tfh_read(uint32_t off, uint8_t *dst, uint32_t n) { return tt_fedcodec_read(&codec, off, dst, n); }
int tfh_ack(uint32_t r, uint32_t crc, uint32_t a, uint32_t *st) { return tt_fedcodec_ack(&codec, r, crc, a, st); }
static int blob_write(uint32_t off, const uint8_t *src, uint32_t n)
{
    if (off > blob_len || n > blob_len - off) return -1;
    memcpy(blob + off, src, n);
    return 0;
}
int tfh_prox(uint32_t m, uint32_t s) { return tt_fedcodec_prox(&codec, blob_write, m, s); }
void tfh_get_blob(uint8_t *dst) { memcpy(dst, blob, blob_len); }
"""
CDEF = """
void tfh_width(uint32_t w);
uint32_t tfh_saturations(void);
void tfh_setup(const uint32_t *spec, uint32_t nt);
void tfh_blob(const uint8_t *p, uint32_t n);
void tfh_residual(int64_t *dst, const int64_t *src, uint32_t n);
int tfh_begin(uint32_t k, uint32_t r, uint32_t d);
uint32_t tfh_global_hash(void);
uint32_t tfh_residual_crc(void);
int tfh_prepare(uint32_t n, uint32_t step, uint32_t *len, uint32_t *crc);
int tfh_read(uint32_t off, uint8_t *dst, uint32_t n);
int tfh_ack(uint32_t r, uint32_t crc, uint32_t a, uint32_t *st);
int tfh_prox(uint32_t m, uint32_t s);
void tfh_get_blob(uint8_t *dst);
"""
DTYPES = {1: np.int8, 2: np.int16, 4: np.int32}


@pytest.fixture(scope="module")
def cc():
    srcs = [*cbuild.runtime_sources(["tt_crc32", "tt_fedcodec"]), ("tt_fedcodec_harness.c", HARNESS)]
    return cbuild.compile_shared(srcs, CDEF, sanitize=True, name="ttfedcodec")


class CCodec:
    """The C codec over a state blob laid out as [gap | tensor | gap | tensor ...]."""

    def __init__(self, cc, widths, counts, gaps, residual_bits=64):
        self.ffi, self.lib = cc
        self.lib.tfh_width(residual_bits // 8)
        spec, off = [], 0
        for w, n, gap in zip(widths, counts, gaps):
            off += gap * w
            spec += [off, n, w]
            off += n * w
        self.spec, self.size = spec, off + 8
        self.widths, self.counts = widths, counts
        self.lib.tfh_setup(self.ffi.new("uint32_t[]", spec), len(widths))

    def blob(self, tensors, fill=0xA5):
        b = bytearray([fill]) * self.size
        for i, t in enumerate(tensors):
            raw = np.asarray(t, DTYPES[self.widths[i]]).astype(np.dtype(DTYPES[self.widths[i]]).newbyteorder("<")).tobytes()
            b[self.spec[3 * i]:self.spec[3 * i] + len(raw)] = raw
        self.lib.tfh_blob(bytes(b), len(b))

    @property
    def n(self):
        return sum(self.counts)

    def residual(self, set_to=None):
        out = self.ffi.new("int64_t[]", max(self.n, 1))
        src = self.ffi.NULL if set_to is None else self.ffi.new("int64_t[]", [int(x) for x in set_to] or [0])
        self.lib.tfh_residual(out, src, self.n)
        return np.array(list(out)[:self.n], np.int64)

    def prepare(self, n_samples, step):
        ln, crc = self.ffi.new("uint32_t *"), self.ffi.new("uint32_t *")
        assert self.lib.tfh_prepare(n_samples, step, ln, crc) == 0
        return ln[0], crc[0]

    def read(self, total, chunks):
        out, off = bytearray(), 0
        buf = self.ffi.new("uint8_t[]", total + 1)
        for k in chunks:
            k = min(k, total - off)
            assert self.lib.tfh_read(off, buf, k) == 0
            out += bytes(self.ffi.buffer(buf, k))
            off += k
            if off == total:
                break
        if off < total:
            assert self.lib.tfh_read(off, buf, total - off) == 0
            out += bytes(self.ffi.buffer(buf, total - off))
        return bytes(out)

    def tensors(self):
        """The store tensors as the blob holds them now."""
        buf = self.ffi.new("uint8_t[]", self.size)
        self.lib.tfh_get_blob(buf)
        raw = bytes(self.ffi.buffer(buf, self.size))
        return [np.frombuffer(raw, np.dtype(DTYPES[w]).newbyteorder("<"), n, self.spec[3 * i]).astype(DTYPES[w])
                for i, (w, n) in enumerate(zip(self.widths, self.counts))]

    def ack(self, rnd, crc, accepted):
        stt = self.ffi.new("uint32_t *")
        rc = self.lib.tfh_ack(rnd, crc, int(accepted), stt)
        return rc, stt[0]


def _values(draw, w, n, lo_bias):
    info = np.iinfo(DTYPES[w])
    edge = [int(info.min), int(info.max), 0, 1, -1, int(info.max) - 1, -int(info.max)]
    small = st.integers(-300, 300) if w > 1 else st.integers(-20, 20)
    return draw(st.lists(st.one_of(st.integers(int(info.min), int(info.max)), st.sampled_from(edge),
                                   small), min_size=n, max_size=n))


@st.composite
def cases(draw):
    nt = draw(st.integers(1, 4))
    widths = [draw(st.sampled_from([1, 2, 2, 4, 4])) for _ in range(nt)]
    counts = [draw(st.integers(0, 37)) for _ in range(nt)]
    gaps = [draw(st.integers(0, 3)) for _ in range(nt)]
    glob = [_values(draw, w, n, 0) for w, n in zip(widths, counts)]
    near = draw(st.booleans())  # local = global + small moves (the realistic case) or anything
    if near:
        info = [np.iinfo(DTYPES[w]) for w in widths]
        local = [[int(np.clip(g + draw(st.integers(-2000, 2000)), i.min, i.max)) for g in gl]
                 for gl, i in zip(glob, info)]
    else:
        local = [_values(draw, w, n, 0) for w, n in zip(widths, counts)]
    res = draw(st.lists(st.one_of(st.integers(-(1 << 40), 1 << 40), st.integers(-50, 50)),
                        min_size=sum(counts), max_size=sum(counts)))
    if draw(st.booleans()):
        res = [0] * sum(counts)
    codec = draw(st.sampled_from(DEVICE_CODECS[1:]))
    chunks = draw(st.lists(st.integers(1, 40), min_size=1, max_size=8))
    return widths, counts, gaps, glob, local, res, codec, chunks


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), meta=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
                                    st.integers(1, 2**32 - 1), st.integers(0, 2**32 - 1)),
       bits=st.sampled_from([64, 32, 16]))
def test_c_codec_equals_python_bytes_and_residual(cc, case, meta, bits):
    """... for a residual kept in int64, int32 or int16 (saturating, counted the same)."""
    widths, counts, gaps, glob, local, res, codec, chunks = case
    dev, rnd, n_samples, step = meta
    c = CCodec(cc, widths, counts, gaps, bits)
    from tinytrain.federated.codec import residual_bounds

    lo_r, hi_r = residual_bounds(bits)
    res = [min(max(int(x), lo_r), hi_r) for x in res]  # a residual the device can hold
    g = [np.array(v, DTYPES[w]) for v, w in zip(glob, widths)]
    lo = [np.array(v, DTYPES[w]) for v, w in zip(local, widths)]
    c.blob(g)
    k = CODECS.index(codec)
    assert c.lib.tfh_begin(k, rnd, dev) == 0
    assert c.lib.tfh_global_hash() == store_hash(g)
    r0 = np.array(res, np.int64)
    c.residual(r0)
    sizes = np.cumsum(counts)[:-1]
    py_res = np.split(r0, sizes)
    stats = {}
    body, recon, new_res = compress(codec, lo, g, py_res, bits, stats)
    want = encode_update(codec, dev, rnd, n_samples, step, store_hash(recon), len(g), body)
    c.blob(lo, fill=0x3C)
    total, crc = c.prepare(n_samples, step)
    assert total == len(want) and crc == struct.unpack("<I", want[-4:])[0]
    got = c.read(total, chunks)
    assert got == want, _first_diff(got, want)
    # a dropped update keeps the residual; the accepted one commits exactly Python's
    assert c.ack(rnd, crc, False) == (0, 0)
    assert np.array_equal(c.residual(), r0)
    assert c.ack(rnd, crc, True) == (0, 2)           # round already closed: nothing changes
    c.blob(g)
    assert c.lib.tfh_begin(k, rnd, dev) == 0         # snapshot the global again
    c.blob(lo, fill=0x3C)
    assert c.prepare(n_samples, step) == (total, crc)
    assert c.ack((rnd + 1) & 0xFFFFFFFF, crc, True)[0] == P.ErrorCode.RANGE
    assert c.ack(rnd, crc ^ 1, True)[0] == P.ErrorCode.BLOB_CRC
    assert c.prepare(n_samples, step) == (total, crc)
    assert c.ack(rnd, crc, True) == (0, 1)
    want_res = np.concatenate(new_res) if new_res else np.zeros(0, np.int64)
    assert np.array_equal(c.residual(), want_res)
    assert c.lib.tfh_saturations() == stats.get("residual_saturated", 0)
    assert c.lib.tfh_residual_crc() == fp.crc32(want_res.astype("<i8").tobytes())


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first differing byte {i}: C 0x{x:02x} != Python 0x{y:02x} (lengths {len(a)}, {len(b)})"
    return f"lengths {len(a)} != {len(b)}"


def test_c_codec_error_feedback_over_rounds(cc):
    """Several rounds of the same device, some updates dropped: C and Python agree round by
    round, and a dropped round's residual shows up in the next update."""
    rng = np.random.default_rng(5)
    widths, counts = [2, 4, 4], [50, 17, 9]
    for codec in DEVICE_CODECS[1:]:
        c = CCodec(cc, widths, counts, [1, 0, 2])
        g = [rng.integers(-3000, 3000, n).astype(DTYPES[w]) for w, n in zip(widths, counts)]
        py_res = [np.zeros(n, np.int64) for n in counts]
        for rnd, accepted in enumerate([True, False, True, True, False, True], start=1):
            lo = [(t.astype(np.int64) + rng.integers(-400, 400, t.size)).astype(t.dtype) for t in g]
            c.blob(g)
            assert c.lib.tfh_begin(CODECS.index(codec), rnd, 3) == 0
            c.blob(lo)
            body, recon, new_res = compress(codec, lo, g, py_res)
            want = encode_update(codec, 3, rnd, 11, rnd * 10, store_hash(recon), 3, body)
            total, crc = c.prepare(11, rnd * 10)
            assert c.read(total, [64]) == want
            assert c.ack(rnd, crc, accepted) == (0, int(accepted))
            if accepted:
                py_res = new_res
            assert np.array_equal(c.residual(), np.concatenate(py_res))
            g = recon if accepted else g


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=cases(), mult=st.one_of(st.integers(0, 32767), st.sampled_from([0, 1, 16384, 32767])),
       shift=st.one_of(st.integers(0, 62), st.sampled_from([15, 16, 30, 62])))
def test_c_prox_equals_python(cc, case, mult, shift):
    """tt_fedcodec_prox pulls the live store toward the ROUND_BEGIN snapshot exactly as
    prox.pull_ref (hypothesis: widths, sizes, edge values; any mult < 2^15, shift <= 62)."""
    from tinytrain.federated.prox import pull_ref

    widths, counts, gaps, glob, local, _, _, _ = case
    c = CCodec(cc, widths, counts, gaps)
    g = [np.array(v, DTYPES[w]) for v, w in zip(glob, widths)]
    lo = [np.array(v, DTYPES[w]) for v, w in zip(local, widths)]
    if shift == 0 and mult > 1:  # a coefficient >= 1 (not what prox_config emits) may leave the dtype
        mult = 1
    c.blob(g)
    assert c.lib.tfh_begin(0, 1, 0) == 0
    c.blob(lo, fill=0x3C)
    assert c.lib.tfh_prox(mult, shift) == 0
    want = [pull_ref(w, gl, mult, shift) for w, gl in zip(lo, g)]
    got = c.tensors()
    for i, (a, b) in enumerate(zip(got, want)):
        assert np.array_equal(a, b), f"tensor {i}: first differing index {np.flatnonzero(a != b)[:1]}"
    assert c.lib.tfh_prox(32768, 16) == P.ErrorCode.RANGE
    assert c.lib.tfh_prox(1, 63) == P.ErrorCode.RANGE


def test_prox_ref_edges():
    """pull_ref on edge values against Python ints: w - floor((w - g) * m / 2^s + 1/2)."""
    from tinytrain.federated.prox import pull_ref

    vals = [-32767, -32768, -1, 0, 1, 2, 32766, 32767, 16384, -16385]
    for m, s in ((16384, 15), (32767, 15), (20972, 20), (1, 1), (32767, 62)):
        for dt, lo, hi in ((np.int16, -32768, 32767), (np.int32, -2**31, 2**31 - 1)):
            ws = [v for v in vals + [lo, hi] if lo <= v <= hi]
            for gv in ws:
                w = np.array(ws, dt)
                got = pull_ref(w, np.full(len(ws), gv, dt), m, s)
                want = [x - ((x - gv) * m + (1 << (s - 1))) // (1 << s) for x in ws]
                assert got.tolist() == want and all(lo <= v <= hi for v in want)


# ------------------------------------------------------------------ over the serial protocol

def test_protocol_fed_prox(dev_link):
    """FED_PROX pulls the fake model's store toward its ROUND_BEGIN snapshot as prox.pull_ref;
    without an open round it answers SEQUENCE; HELLO advertises it (flag bit 2)."""
    from tinytrain.federated.prox import pull_ref

    link, cdev = dev_link
    assert link.info.fedprox

    def store(blob):
        return [np.frombuffer(blob, "<i2", 300, 0).astype(np.int16),
                np.frombuffer(blob, "<i4", 100, 600).astype(np.int32)]
    with pytest.raises(P.DeviceError) as e:
        link.fed_prox(20972, 20)
    assert e.value.code == P.ErrorCode.SEQUENCE
    g = store(link.read_params())
    link.round_begin(3, 1, 0)
    for i in range(4):
        link.train(np.arange(16, dtype=np.int8) * (i + 2), i)
    before = link.read_params()
    h = link.fed_prox(20972, 20)
    after = link.read_params()
    assert h == link.state_hash()
    want = [pull_ref(w, gl, 20972, 20) for w, gl in zip(store(before), g)]
    assert all(np.array_equal(a, b) for a, b in zip(store(after), want))
    assert after[1000:] == before[1000:]  # outside the store nothing moves
    with pytest.raises(P.DeviceError) as e:
        link.fed_prox(32768, 20)
    assert e.value.code == P.ErrorCode.RANGE


def test_protocol_update_commands(dev_link):
    """ROUND_BEGIN / GET_UPDATE / UPDATE_ACK between DeviceLink and the C protocol: the update
    read in chunks equals Python's codec on the fake model's store (300 int16, 100 int32)."""
    link, cdev = dev_link
    assert link.info.fedcodec
    glob_blob = link.read_params()

    def store(blob):
        return [np.frombuffer(blob, "<i2", 300, 0).astype(np.int16),
                np.frombuffer(blob, "<i4", 100, 600).astype(np.int32)]
    g = store(glob_blob)
    rb = link.round_begin(7, 2, CODECS.index("int8"))
    assert rb.global_hash == store_hash(g) and rb.residual_crc == fp.crc32(bytes(8 * 400))
    for i in range(5):
        link.train(np.arange(16, dtype=np.int8) * (i + 1), i)
    blob = link.read_params()
    res = [np.zeros(300, np.int64), np.zeros(100, np.int64)]
    body, recon, new_res = compress("int8", store(blob), g, res)
    msg = link.get_update(5)
    assert msg == encode_update("int8", 2, 7, 5, 5, store_hash(recon), 2, body)
    assert len(msg) > link.info.max_payload  # it really came in several chunks
    crc = struct.unpack("<I", msg[-4:])[0]
    with pytest.raises(P.DeviceError) as e:
        link.update_ack(8, crc, True)
    assert e.value.code == P.ErrorCode.RANGE
    ack = link.update_ack(7, crc, True)
    assert ack.status == 1
    assert ack.residual_crc == fp.crc32(np.concatenate(new_res).astype("<i8").tobytes())
    assert link.update_ack(7, crc, True).status == 2  # closed: a second ack changes nothing
    # a new round with codec sign zeroes the residual (it was built with int8)
    assert link.round_begin(8, 2, CODECS.index("sign")).residual_crc == fp.crc32(bytes(8 * 400))
    with pytest.raises(P.DeviceError) as e:
        link.round_begin(9, 2, 4)
    assert e.value.code == P.ErrorCode.RANGE
    link.round_begin(9, 2, 0)  # codec 0: the snapshot only (FED_PROX, update encoded by the host)
    with pytest.raises(P.DeviceError) as e:
        link.get_update(1)
    assert e.value.code == P.ErrorCode.SEQUENCE


def test_protocol_update_without_round_and_after_change(dev_link):
    link, cdev = dev_link
    with pytest.raises(P.DeviceError) as e:
        link.get_update(3)
    assert e.value.code == P.ErrorCode.SEQUENCE
    link.round_begin(1, 0, 2)
    link.train(np.ones(16, np.int8), 1)
    msg = link.get_update(1)
    link.train(np.ones(16, np.int8), 2)  # the state moved on: the message is no longer its encoding
    with pytest.raises(P.DeviceError) as e:
        link.update_ack(1, struct.unpack("<I", msg[-4:])[0], True)
    assert e.value.code == P.ErrorCode.BLOB_CRC
    assert link.update_ack(1, 0, False).status == 0


@pytest.fixture
def dev_link():
    from tests.test_protocol import CDevice, HARNESS_CDEF, DEVICE_SOURCES, HERE

    d = cbuild.compile_shared([*cbuild.runtime_sources(DEVICE_SOURCES), HERE / "c" / "tt_fake_model.c",
                               HERE / "c" / "tt_proto_harness.c"], HARNESS_CDEF,
                              include_dirs=[HERE / "c"], sanitize=True, name="ttproto")
    cdev = CDevice(d)
    link = P.DeviceLink(cdev, timeout=0.2, retries=1)
    yield link, cdev
