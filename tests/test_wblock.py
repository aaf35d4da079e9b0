"""Block-exponent weights (precision "exponent": "row" | "block32", int8/int4 weights, int16
master): the narrowing rule against an exact Python-int oracle, the numba and C kernels against
the reference on drawn shapes and values (UBSan), whole models reference = numba = C under drawn
optimizer options, the state (.tt, hash), conversion, refusals, and W1 on QEMU boards."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tinytrain.codegen.emit import generate
from tinytrain.ops.wblock import pack_int4
from tinytrain.graph import io as tio
from tinytrain.graph.conv import Conv1d
from tinytrain.graph.convert import with_precision
from tinytrain.graph.layers import Dense, Flatten, ModelError, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.graph.precision import Precision, PrecisionError
from tinytrain.graph.residual import Residual
from tinytrain.kernels import wblock as k_wblock
from tinytrain.ops import dense as r_dense
from tinytrain.ops import wblock as r_wblock
from tinytrain.sim.simulator import Simulator

from .conftest import examples
from .oputil import c_ctx, c_i8, c_i16, c_i32, draw_array
from .test_exactness import _data, any_optimizer, three_way
from .test_precision import _qemu_missing

BLOCKED = [{"weights": w, "master": "int16", "exponent": e} for w in ("int4", "int8") for e in ("row", "block32")]


def _oracle(master, L, bits):
    """The docstring's rule with Python ints: rounding = floor(v / 2^s + 1/2)."""
    qmax, smax = (1 << (bits - 1)) - 1, 16 - bits
    N, K = master.shape
    q, s = np.zeros((N, K), np.int64), np.zeros((N, -(-K // L)), np.int64)

    def rr(v, sh):
        return (2 * v + (1 << sh)) // (1 << (sh + 1)) if sh else v

    for n in range(N):
        for j in range(s.shape[1]):
            blk = [int(v) for v in master[n, j * L:(j + 1) * L]]
            M = max(abs(v) for v in blk)
            sh = next((c for c in range(smax + 1) if rr(M, c) <= qmax), smax)
            s[n, j] = sh
            for k, v in enumerate(blk):
                q[n, j * L + k] = max(-qmax, min(qmax, rr(v, sh)))
    return q, s


@st.composite
def blocked_tensor(draw):
    N, K = draw(st.integers(1, 5)), draw(st.integers(1, 70))
    L = draw(st.sampled_from([K, min(32, K), draw(st.integers(1, K))]))
    m = draw_array(draw, (N, K), np.int16, -32767, 32767)
    if draw(st.booleans()):  # powers of two and the saturation thresholds +-{0, 1}
        edges = [1 << b for b in range(15)] + [30719, 30720, 32639, 32640, 32767]
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        m = (rng.choice(np.array(edges + [e - 1 for e in edges] + [0]), (N, K)) * rng.choice([-1, 1], (N, K)))
        m = np.clip(m, -32767, 32767).astype(np.int16)
    return m, L, draw(st.sampled_from([4, 8]))


@settings(max_examples=examples(60), deadline=None)
@given(blocked_tensor())
def test_narrowing_follows_its_rule_and_decodes_within_int16(t):
    m, L, bits = t
    q, s = r_wblock.narrow(m, L, bits)
    oq, os_ = _oracle(m, L, bits)
    assert (q == oq).all() and (s == os_).all()
    qmax, smax = r_wblock.limits(bits)
    assert int(np.abs(q).max()) <= qmax and int(s.max()) <= smax
    w = r_wblock.expand(q, s, L)
    assert int(np.abs(w.astype(np.int64)).max()) <= 32767
    # saturation only where the block needs more than smax
    err = np.abs(w.astype(np.int64) - m.astype(np.int64))
    sk = s.astype(np.int64)[:, np.arange(m.shape[1]) // L]
    ok = err <= np.where(sk > 0, 1 << np.maximum(sk - 1, 0), 0)
    assert (ok | (sk == smax)).all()


@settings(max_examples=examples(40), deadline=None)
@given(blocked_tensor(), st.data())
def test_refresh_and_dense_kernels_numba_and_c_equal_the_reference(clib_ubsan, t, data):
    ffi, lib = clib_ubsan
    m, L, bits = t
    N, K = m.shape
    qmax, smax = r_wblock.limits(bits)
    q, s = r_wblock.narrow(m, L, bits)
    # numba refresh
    qn, sn = np.full((N, K), 99, np.int8), np.full(s.shape, 99, np.uint8)
    k_wblock.wblock_refresh(m, qn, sn, L, qmax, smax)
    assert (qn == q).all() and (sn == s).all()
    # C refresh: int8 storage, or int4 packed two per byte
    sc = np.full(s.size, 99, np.uint8)
    if bits == 8:
        qc = np.full(N * K, 99, np.int8)
        lib.tt_wblock_refresh_s16_w8(c_i16(ffi, m.reshape(-1).copy()), c_i8(ffi, qc), ffi.from_buffer(sc), N, K, L)
        assert (qc == q.reshape(-1)).all()
    else:
        qc = np.full((N * K + 1) // 2, 0xAB, np.uint8)  # stale nibbles, all rewritten
        if N * K % 2:
            qc[-1] = 0x0B  # but the padding nibble: never written, 0 from the initial image
        lib.tt_wblock_refresh_s16_w4(c_i16(ffi, m.reshape(-1).copy()), ffi.from_buffer(qc), ffi.from_buffer(sc), N, K, L)
        assert (qc == pack_int4(q)).all()
    assert (sc == s.reshape(-1)).all()
    # the rows variant (after a direct update without weight decay): rows with e[n] = 0 keep theirs
    m2 = draw_array(data.draw, (N, K), np.int16, -32767, 32767)
    er = draw_array(data.draw, (N,), np.int8, -127, 127)
    q2, s2 = r_wblock.narrow(m2, L, bits)
    keep = (er == 0)[:, None]
    want_q, want_s = np.where(keep, q, q2), np.where(keep, s, s2)
    getattr(lib, f"tt_wblock_refresh_rows_s16_w{bits}")(c_i16(ffi, m2.reshape(-1).copy()), ffi.from_buffer(qc),
                                                        ffi.from_buffer(sc), N, K, L, c_i8(ffi, er))
    assert (qc == (want_q.reshape(-1) if bits == 8 else pack_int4(want_q))).all() and (sc == want_s.reshape(-1)).all()
    # forward and input error on the decoded weights
    x = draw_array(data.draw, (K,), np.int8, -127, 127)
    e = draw_array(data.draw, (N,), np.int8, -127, 127)
    b = draw_array(data.draw, (N,), np.int32, -2**31 + 1, 2**31 - 1)
    ex, ew, eb, ee = data.draw(st.integers(-12, 2)), data.draw(st.integers(-16, -8)), data.draw(st.integers(-30, -10)), -5
    w = r_wblock.expand(q, s, L)
    y_ref, ey_ref, _ = r_dense.forward(x, ex, w, ew, b, eb)
    dx_ref, edx_ref, _, _ = r_dense.backward(e, ee, x, ex, w, ew)
    acc, y, stats = np.zeros(max(N, K), np.int64), np.zeros(N, np.int8), np.zeros(4, np.int64)
    assert k_wblock.dense_fwd_blk(x, ex, q, s, L, ew, b, eb, acc[:N], y, stats) == ey_ref and (y == y_ref).all()
    dx = np.zeros(K, np.int8)
    assert k_wblock.dense_bwd_blk(e, ee, q, s, L, ew, acc[:K], dx, stats) == edx_ref and (dx == dx_ref).all()
    scratch = np.zeros(max(N, K), np.int64)
    ctx, _ = c_ctx(ffi, scratch)
    wq = q.reshape(-1).copy() if bits == 8 else pack_int4(q)
    ws = s.reshape(-1).copy()
    tag = "w8" if bits == 8 else "w4"
    p = ffi.new(f"tt_dense_{tag}blk_params *", {"K": K, "N": N, "L": L, "w": ffi.from_buffer(wq), "ws": ffi.from_buffer(ws),
                                                 "ew": ew, "b": c_i32(ffi, b), "eb": eb})
    yc, dxc = np.zeros(N, np.int8), np.zeros(K, np.int8)
    assert getattr(lib, f"tt_dense_fwd_s8_{tag}blk")(ctx, p, c_i8(ffi, x), ex, c_i8(ffi, yc)) == ey_ref
    assert getattr(lib, f"tt_dense_bwd_s8_{tag}blk")(ctx, p, c_i8(ffi, e), ee, c_i8(ffi, dxc)) == edx_ref
    assert (yc == y_ref).all() and (dxc == dx_ref).all()


# ------------------------------------------------------------------ whole models, every path
@st.composite
def blocked_model(draw):
    n_in = draw(st.integers(3, 40))
    layers = [Dense(draw(st.integers(2, 36)))]
    if draw(st.booleans()):
        layers += [ReLU(), Residual([Dense(layers[0].units), ReLU()])]
    layers.append(Dense(draw(st.integers(2, 5))))
    for l in layers:  # per-layer overrides: another block format, or tensor-exponent weights
        if l.params and draw(st.integers(0, 2)) == 0:
            l.precision = draw(st.sampled_from(BLOCKED + [{"weights": "int8", "exponent": "tensor"},
                                                          {"weights": "int16", "master": "int32", "exponent": "tensor"}]))
    return (n_in,), layers, layers[-1].units


@settings(max_examples=examples(3), deadline=None, phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.data())
def test_blocked_policies_any_optimizer_reference_sim_c_equal(data):
    import copy

    shape, layers, n_cls = data.draw(blocked_model())
    policy = data.draw(st.sampled_from(BLOCKED))
    probe = Sequential(copy.deepcopy(layers), input_shape=shape, input_exp=-7, precision=policy)
    opt = data.draw(any_optimizer(probe.layers))
    ref = Sequential(layers, input_shape=shape, input_exp=data.draw(st.integers(-9, 0)), optimizer=opt,
                     seed=data.draw(st.integers(0, 1000)), precision=policy)
    x, y = _data(data.draw(st.integers(4, 8)), shape, n_cls, data.draw(st.integers(0, 2**16)))
    three_way(ref, x, y, epochs=1)


def test_state_carries_the_block_exponents_and_old_files_load(tmp_path):
    m = Sequential([Dense(40), ReLU(), Dense(3)], input_shape=(37,), input_exp=-7, seed=4, precision="int4-block32-master16")
    w, _, s = m.layers[0].params
    assert w.data.dtype == np.int8 and s.name == "w_exp" and s.data.shape == (40, 2) and s.role == "state"
    x, y = _data(12, (37,), 3, 1)
    Simulator(m).train(x, y, np.arange(12))
    assert any(t is s.data for t in m.state_tensors())  # in the hash and the blob
    h = m.state_hash()
    s.data[0, 0] ^= 1
    assert m.state_hash() != h
    s.data[0, 0] ^= 1
    tio.save(m, tmp_path / "m.tt")
    b, _ = tio.load(tmp_path / "m.tt")
    assert b.state_hash() == h and b.schema() == m.schema() and (b.layers[0].params[2].data == s.data).all()
    three_way(b, x, y, epochs=1)
    old = Sequential([Dense(4), Dense(3)], input_shape=(5,), input_exp=-7)  # a file without a policy
    tio.save(old, tmp_path / "old.tt")
    assert tio.load(tmp_path / "old.tt")[0].state_hash() == old.state_hash()


def test_int4_is_packed_in_c_and_the_memory_report_shows_it():
    from tinytrain.codegen.emit import Emitter
    from tinytrain.codegen.memory import breakdown

    m = Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, precision="int4-row-master16")
    t = {t.name: t for t in Emitter(m, "tt_model").plan()}
    assert (t["tt_model_l0_w"].ctype, t["tt_model_l0_w"].bytes) == ("uint8_t", 32 * 64 // 2)
    assert (t["tt_model_l0_w_exp"].ctype, t["tt_model_l0_w_exp"].bytes) == ("uint8_t", 32)
    assert t["tt_model_l0_w_master"].ctype == "int16_t"
    src = generate(m).source
    assert "tt_dense_fwd_s8_w4blk(" in src and "tt_wblock_refresh_s16_w4(" in src
    rows = breakdown(m, "mps2_an386").layers[0]["tensors"]
    assert {r["name"]: r["bytes"] for r in rows}["tt_model_l0_w"] == 1024


def test_conversion_to_and_from_block_exponents_keeps_the_values():
    a = Sequential([Dense(40), ReLU(), Dense(3)], input_shape=(37,), input_exp=-7, seed=2)
    x, y = _data(10, (37,), 3, 3)
    Simulator(a).train(x, y, np.arange(10))
    b = with_precision(a, "int4-block32-master16")
    assert (b.master[(0, 0)] == a.layers[0].params[0].data).all()  # the int16 weights become the master
    assert b.layers[0].params[0].exp == a.layers[0].params[0].exp
    q, s = r_wblock.narrow(a.layers[0].params[0].data, 32, 4)
    assert (b.layers[0].params[0].data == q).all() and (b.layers[0].params[2].data == s).all()
    c = with_precision(b, "int16")
    assert (c.layers[0].params[0].data == r_wblock.expand(q, s, 32)).all()
    three_way(b, x, y, epochs=1)


@pytest.mark.parametrize("spec, match", [
    ({"weights": "int4"}, 'int4 weights need a finer exponent.*"row" or "block32"'),
    ({"weights": "int4", "exponent": "row"}, 'from an int16 master copy, and master is .none.: use "master": "int16"'),
    ({"weights": "int4", "exponent": "row", "master": "int32"}, 'use "master": "int16"'),
    ({"exponent": "block32"}, "is for int8 or int4 weights"),
    ({"weights": "int4", "exponent": "row", "master": "int16", "momentum": "int8", "rounding": "nearest"},
     'momentum = "int8" stores its slot with stochastic rounding'),
])
def test_bad_block_policies_name_the_key(spec, match):
    with pytest.raises(PrecisionError, match=match):
        Precision.parse(spec)


def test_layers_without_block_kernels_and_pruning_are_refused_with_the_fix():
    with pytest.raises(ModelError, match=r'layer 0 \(conv1d\).*dense layers only.*"exponent": "tensor"'):
        Sequential([Conv1d(2, 3), Flatten(), Dense(3)], input_shape=(8, 1), input_exp=-7, precision="int4-row-master16")
    conv = Conv1d(2, 3)
    conv.precision = {"weights": "int8", "exponent": "tensor"}  # the fix: the rest stays int4
    m = Sequential([conv, Flatten(), Dense(3)], input_shape=(8, 1), input_exp=-7, precision="int4-row-master16")
    assert m.layers[0].params[0].data.dtype == np.int8 and m.blocked(2, 0) and not m.blocked(0, 0)
    assert "tt_conv1d_fwd_s8_w8(" in generate(m).source
    with pytest.raises(ModelError, match="pruning is not implemented for weights with exponent"):
        Sequential([Dense(3)], input_shape=(5,), precision="int4-row-master16",
                   prune={"schedule": "constant", "target_sparsity": 0.5})


@pytest.mark.qemu
@pytest.mark.skipif(bool(_qemu_missing()), reason="QEMU, arm-none-eabi-gcc or PlatformIO missing")
@pytest.mark.parametrize("policy, board", [({"weights": "int4", "master": "int16", "exponent": "block32",
                                             "momentum": "int16"}, "mps2_an386")])
def test_int4_block_policies_train_bit_exact_on_qemu_boards(policy, board):
    """W1 with int4 weights, block32 exponents, int16 momentum and batch 2 on the Cortex-M4:
    every step verified (bench/bench_policies.py verifies both int4 presets at batch 1, the
    row-skipping refresh, on the M4 and the M0 for 200 steps each)."""
    from tinytrain import data
    from tinytrain.graph.models import build_model
    from tinytrain.verify import verify

    ds = data.load("digits")
    m = build_model("digits-mlp", ds, precision=policy, **({"momentum": 0.9, "batch_size": 2} if board == "mps2_an386" else {}))
    r = verify(m, ds, 40, board=board, json=True)
    assert r["steps"] == 40 and r["mismatches"] == 0, r["first_mismatch"]
