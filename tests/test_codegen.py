"""Generated C: bit-exact with the simulator after every step (host build, UBSan), snapshot
and determinism of the emitted files, integer-only proof on Cortex-M, memory report."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tinytrain import fixedpoint as fp
from tinytrain.codegen import memory
from tinytrain.codegen.emit import generate, CodegenError
from tinytrain.codegen.host import HostModel
from tinytrain.graph.layers import Dense, Flatten, ReLU
from tinytrain.graph.model import Sequential
from tinytrain.graph.optim import SGD
from tinytrain.sim.simulator import Simulator

from .conftest import examples


def _data(n, shape, n_classes, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-127, 128, (n, *shape)).astype(np.int8)
    y = rng.integers(0, n_classes, n).astype(np.int32)
    return x, y


def _run_both(model, x, y, epochs, seed=0):
    hm = HostModel(model, sanitize=True)
    assert hm.state_hash() == model.state_hash()
    sim = Simulator(model)
    st_ = fp.prng_seed(seed)
    steps = 0
    for _ in range(epochs):
        st_, order = fp.permutation(st_, len(x))
        for i in order:
            o = sim.train(x, y, [i])
            l, p = hm.train_step(x[i], y[i])
            assert (l, p) == tuple(o[0]), f"step {steps}: C (loss, pred) {(l, p)} != sim {tuple(o[0])}"
            assert hm.state_hash() == model.state_hash(), f"state hash differs after step {steps}"
            steps += 1
    blob = b"".join(np.ascontiguousarray(t).tobytes() for t in model.state_tensors())
    assert hm.read_state() == blob
    return hm


OPTIMIZERS = [
    SGD(lr=0.05),
    SGD(lr=0.02, stochastic_rounding=True),
    SGD(lr=0.05, batch_size=4, momentum=0.9, weight_decay=1e-4),
    SGD(lr=0.05, master_weights=True, schedule="cosine", total_steps=200),
    SGD(lr=0.1, batch_size=3, schedule="step", step_size=7, gamma=0.5, stochastic_rounding=True),
    SGD(lr=0.05, train="last:1"),
    SGD(lr=0.05, train="bias"),
]


@pytest.mark.parametrize("opt", OPTIMIZERS, ids=lambda o: f"bs{o.batch_size}-mu{o.momentum}-sr{int(o.stochastic_rounding)}-{o.train}")
def test_mlp_c_equals_simulator_every_step(opt):
    x, y = _data(60, (12,), 5, 1)
    m = Sequential([Dense(16), ReLU(), Dense(8), ReLU(), Dense(5)], input_shape=(12,), input_exp=-7, optimizer=opt, seed=3)
    _run_both(m, x, y, epochs=3)


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 24), min_size=0, max_size=3), st.integers(2, 30), st.integers(2, 8),
       st.integers(0, 2**16), st.sampled_from([0.01, 0.05, 0.2]), st.booleans(), st.integers(-9, 2))
def test_random_mlps_c_equals_simulator(hidden, n_in, n_cls, seed, lr, sr, in_exp):
    layers = []
    for h in hidden:
        layers += [Dense(h), ReLU()]
    layers.append(Dense(n_cls))
    m = Sequential(layers, input_shape=(n_in,), input_exp=in_exp, optimizer=SGD(lr=lr, stochastic_rounding=sr), seed=seed)
    x, y = _data(25, (n_in,), n_cls, seed)
    _run_both(m, x, y, epochs=2, seed=seed)


def test_flatten_image_input():
    x, y = _data(30, (4, 4, 2), 3, 7)
    m = Sequential([Flatten(), Dense(10), ReLU(), Dense(3)], input_shape=(4, 4, 2), input_exp=-7, seed=1)
    _run_both(m, x, y, epochs=2)


@pytest.mark.parametrize("opt", [SGD(lr=0.05), SGD(lr=0.05, stochastic_rounding=True), SGD(lr=0.05, weight_decay=1e-3),
                                 SGD(lr=0.05, master_weights=True), SGD(lr=0.05, batch_size=2, momentum=0.9)],
                         ids=["plain", "sr", "wd", "master", "momentum"])
def test_steps_whose_loss_error_is_zero_equal_the_simulator(opt):
    """A step whose loss error is all 0 (a logit far above the others: softmax exactly one-hot)
    skips its backward in the generated C when that changes nothing (plain SGD, Dense and ReLU);
    with stochastic rounding, decay, a master or momentum the backward runs (draws, decay, copy,
    velocity): C == simulator after every step either way, on runs mixing such steps with
    ordinary ones."""
    x, y = _data(40, (12,), 5, 4)
    y[::3] = 4
    m = Sequential([Dense(16), ReLU(), Dense(5)], input_shape=(12,), input_exp=-7, optimizer=opt, seed=2)
    m.layers[2].params[1].data[4] = 2**29  # class 4's logit saturates the output: error 0 there
    src = generate(m).source
    plain = opt.batch_size == 1 and not opt.stochastic_rounding and not opt.weight_decay and not opt.master_weights
    assert ("if (!tt_all_zero_s8(tt_model_err0, 5))" in src) == plain
    sim = Simulator(m.copy())
    zero = sum(int(sim.train(x, y, [i])[0][0] == 0) for i in range(len(x)))
    assert zero >= 10  # the zero-error steps are there (loss 0)
    _run_both(m, x, y, epochs=2)


def test_reset_seed_and_state_roundtrip():
    x, y = _data(20, (8,), 3, 2)
    m = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(8,), input_exp=-7, seed=1)
    h0 = m.state_hash()
    hm = HostModel(m)
    blob0 = hm.read_state()
    for i in range(10):
        hm.train_step(x[i], y[i])
    assert hm.state_hash() != h0
    hm.reset()
    assert hm.state_hash() == h0 and hm.read_state() == blob0
    assert hm.write_state(blob0[:5], off=len(blob0) - 2) == -1  # out of range refused
    hm.set_seed(5)
    m.meta[0] = fp.prng_seed(5)
    assert hm.state_hash() == m.state_hash()


def _w1(opt=None):
    return Sequential([Dense(32), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, optimizer=opt or SGD(lr=0.05), seed=0, name="digits-mlp")


def test_emitted_c_snapshot_substrings():
    em = generate(_w1(), prefix="w1")
    src, hdr = em.source, em.header
    assert "#ifndef W1_H" in hdr and "int32_t w1_train_step(const int8_t *x, int32_t label, int32_t *loss_q16);" in hdr
    assert ("static const tt_dense_params w1_l0_dense = {.K = 64, .N = 32, .w = w1_l0_w, .ew = -14, "
            ".b = w1_l0_b, .eb = -22};") in src
    assert "e1 = tt_dense_fwd_s8(&CTX, &w1_l0_dense, x, e0, w1_a0);" in src
    assert "e2 = tt_relu_fwd_s8(w1_a0, e1, 32, w1_a1, &STATS);" in src
    assert "pred = tt_softmax_ce_s8(&CTX, w1_a2, e3, label, 10, &loss);" in src
    assert "static const tt_ctx CTX = {.scratch = SCRATCH, .stats = &STATS};" in src and "#define CTX w1_ctx" in src
    assert ".m = " in src and ".cosine = w1_cosine};" in src  # the optimizer, with named fields
    assert "tt_sgd_dense_direct_s16(&sgd, &w1_l2_sgd, " in src
    assert "float" not in src and "double" not in src and "malloc" not in src
    for line in src.splitlines():  # every global symbol carries the prefix
        if line.startswith("static ") and "[" in line:
            assert " w1_" in line, line


def test_regeneration_is_identical(tmp_path):
    a = generate(_w1(), prefix="tt_model").write(tmp_path / "a")
    b = generate(_w1(), prefix="tt_model").write(tmp_path / "b")
    for fa, fb in zip(a, b):
        assert fa.read_bytes() == fb.read_bytes()


def test_bad_prefix_and_unknown_layer():
    with pytest.raises(CodegenError, match="identifier"):
        generate(_w1(), prefix="1bad")

    class Mystery(ReLU):  # a layer type the simulator could run but the C generator has no kernel for
        kind = "mystery"

    m = Sequential([Dense(8), Mystery(), Dense(3)], input_shape=(5,), input_exp=-7)
    with pytest.raises(CodegenError, match=r"layer 1 \(mystery\) has no C kernel yet.*dense"):
        generate(m)


needs_arm = pytest.mark.skipif(shutil.which("arm-none-eabi-gcc") is None, reason="arm-none-eabi-gcc not installed")


@needs_arm
@pytest.mark.parametrize("opt", [SGD(lr=0.05), SGD(lr=0.05, batch_size=8, momentum=0.9, stochastic_rounding=True, master_weights=True)])
def test_integer_only_on_cortex_m(opt):
    em = generate(_w1(opt))
    m0 = memory.compile_arm(em, "cortex-m0")
    assert memory.float_symbols(m0["undefined"]) == []
    assert "__aeabi_idiv" in m0["undefined"] or "__aeabi_uidiv" in m0["undefined"]  # the check sees helpers
    for cpu in ("cortex-m4", "cortex-m33"):  # hard-float builds: no VFP instruction
        hf = memory.compile_arm(em, cpu)
        assert memory.vfp_instructions(hf["disasm"]) == [], cpu
        assert hf["text"] > 1000


@needs_arm
def test_float_checks_do_detect_float():
    em = generate(_w1())
    em.source += "\nfloat tt_bad(float a, int b) { return a * (float)b; }\ndouble tt_bad2(double a) { return a / 3.0; }\n"
    m0 = memory.compile_arm(em, "cortex-m0")
    assert memory.float_symbols(m0["undefined"])
    for cpu in ("cortex-m4", "cortex-m33"):
        assert memory.vfp_instructions(memory.compile_arm(em, cpu)["disasm"]), cpu


@needs_arm
def test_memory_report_matches_linked_sections():
    em = generate(_w1())
    rep = memory.report(em, cpu="cortex-m4")
    objs = memory.compile_arm(em, "cortex-m4")
    # the model's own .data + .bss is exactly the static RAM the report plans
    assert objs["model_ram"] == rep.ram_static
    assert rep.stack_estimate > 0 and rep.flash_code > 0


@needs_arm
def test_link_reuses_the_runtime_objects_and_gives_the_same_sizes(tmp_path, monkeypatch):
    """link_firmware compiles the runtime and the port once per board (they do not depend on the
    model) and a second model's link compiles only its own two files; the figures are those of a
    link that compiles everything."""
    import subprocess

    from tinytrain.device.boards import get_board
    from tinytrain.codegen.device import device_source

    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cache"))
    calls = []
    real = subprocess.run

    def run(cmd, *a, **k):
        calls.append([str(c) for c in cmd])
        return real(cmd, *a, **k)

    monkeypatch.setattr(memory.subprocess, "run", run)
    b = get_board("microbit")
    models = [_w1(), Sequential([Dense(9), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, seed=3)]
    sizes = []
    for i, m in enumerate(models):
        calls.clear()
        em = generate(m)
        sizes.append(memory.link_firmware(em, device_source(m, em, True, False), b))
        compiled = sorted(Path(c[c.index("-c") + 1]).name for c in calls if "-c" in c)
        if i == 1:
            assert compiled == ["tt_model.c", "tt_model_device.c"]
        else:
            assert len(compiled) > 10  # the runtime too, into the object cache
    memory._LINK_CACHE.clear()
    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cold"))  # no link figures, no objects
    em = generate(models[1])
    assert memory.link_firmware(em, device_source(models[1], em, True, False), b) == sizes[1]
    assert sizes[0] != sizes[1]


@needs_arm
def test_models_that_differ_only_in_the_header_get_their_own_firmware(tmp_path, monkeypatch):
    """Row and block32 exponents of a 32-wide layer emit the same source, but their schemas (in
    the header) differ: the link and firmware caches must tell them apart, else the board runs the
    other model's firmware and verification stops with a schema mismatch (it did, in
    `sensitivity --board microbit`)."""
    from tinytrain import verify as V
    from tinytrain.codegen.device import device_source
    from tinytrain.device.boards import get_board
    from tinytrain.lab.precision import integer_model
    from tinytrain.lab.workloads import WORKLOADS
    from tinytrain.sensitivity import with_layer_policy

    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cache"))
    wl = WORKLOADS["w1"]
    m = integer_model(wl, wl.load(), 0, {})
    a, b = with_layer_policy(m, 2, "int4-row-master16"), with_layer_policy(m, 2, "int4-block32-master16")
    ea, eb = generate(a), generate(b)
    assert ea.source == eb.source and ea.header != eb.header and a.schema_hash() != b.schema_hash()
    board = get_board("microbit")
    images = []
    for mm, em in ((a, ea), (b, eb)):
        memory.link_firmware(em, device_source(mm, em, True, False), board, keep=tmp_path / "fw.elf")
        images.append((tmp_path / "fw.elf").read_bytes())
    assert images[0] != images[1]
    dirs = []
    monkeypatch.setattr("tinytrain.codegen.project.build_firmware", lambda model, brd, out, *x, **k: dirs.append(out))
    for mm in (a, b):
        V.build_cached(mm, "microbit")
    assert len(set(dirs)) == 2


def test_fits_check_names_what_to_shrink():
    from tinytrain.codegen.project import memory_report
    big = Sequential([Dense(512), ReLU(), Dense(10)], input_shape=(64,), input_exp=-6, seed=0)
    with pytest.raises(MemoryError, match=r"RAM to train but microbit has 16384.*Shrink the model"):
        memory_report(big, "microbit", measure_stack=False)


def test_conv_pool_models_reference_sim_and_c_equal():
    from tinytrain.graph.conv import AvgPool2d, Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool, MaxPool1d, MaxPool2d
    from tinytrain.graph.norm import BatchNorm
    rng = np.random.default_rng(0)
    cases = [
        ((8, 8, 1), [Conv2d(4, 3, padding="same"), ReLU(), MaxPool2d(2), DepthwiseConv2d(3, padding="same"), ReLU(),
                     AvgPool2d(2), Flatten(), Dense(5)], SGD(lr=0.05)),
        ((20, 2), [Conv1d(4, 5, stride=2), ReLU(), MaxPool1d(2), Conv1d(3, 3, padding="same"), GlobalAvgPool(), Dense(5)],
         SGD(lr=0.05, batch_size=2, momentum=0.5, stochastic_rounding=True)),
        ((8, 8, 1), [Conv2d(4, 3, padding="same"), BatchNorm(), ReLU(), MaxPool2d(2), Flatten(), Dense(5)], SGD(lr=0.05)),
        ((16, 2), [Conv1d(3, 3), BatchNorm(), ReLU(), Flatten(), Dense(5)], SGD(lr=0.05, batch_size=2, momentum=0.9)),
    ]
    for shape, layers, opt in cases:
        x = rng.integers(-127, 128, (30, *shape)).astype(np.int8)
        y = rng.integers(0, 5, 30).astype(np.int32)
        ref = Sequential(layers, input_shape=shape, input_exp=-7, optimizer=opt, seed=1)
        fast = ref.copy()
        sim, hm = Simulator(fast), HostModel(fast, sanitize=True)
        for i in range(30):
            lr_ = ref.ref_train_step(x[i], y[i])
            o = sim.train(x, y, [i])
            lc = hm.train_step(x[i], y[i])
            assert ref.state_hash() == fast.state_hash() == hm.state_hash(), f"{shape}: step {i}"
            assert tuple(lr_) == tuple(o[0]) == lc
        # eval mode (batch norm with running statistics) agrees too
        assert [ref.ref_predict(v) for v in x] == list(sim.predict(x)) == [hm.predict(v) for v in x]


def test_two_host_models_have_separate_state():
    x, y = _data(5, (8,), 3, 2)
    m = Sequential([Dense(6), ReLU(), Dense(3)], input_shape=(8,), input_exp=-7, seed=1)
    a, b = HostModel(m), HostModel(m)
    a.train_step(x[0], y[0])
    assert a.state_hash() != b.state_hash() == m.state_hash()


@st.composite
def random_graph(draw):
    """A random conv/pool/batch-norm graph with a random optimizer configuration."""
    from tinytrain.graph.conv import AvgPool2d, Conv1d, Conv2d, DepthwiseConv2d, GlobalAvgPool, MaxPool1d, MaxPool2d
    from tinytrain.graph.norm import BatchNorm
    one_d = draw(st.booleans())
    if one_d:
        shape = (draw(st.integers(6, 24)), draw(st.integers(1, 3)))
    else:
        shape = (draw(st.integers(4, 9)), draw(st.integers(4, 9)), draw(st.integers(1, 3)))
    layers, cur = [], shape
    for _ in range(draw(st.integers(1, 2))):
        k = draw(st.integers(1, 3))
        pad = draw(st.sampled_from(["valid", "same"]))
        stride = draw(st.integers(1, 2))
        if one_d:
            if cur[0] < k:
                break
            layers.append(Conv1d(draw(st.integers(1, 5)), k, stride=stride, padding=pad))
        elif draw(st.booleans()):
            if min(cur[:2]) < k:
                break
            layers.append(DepthwiseConv2d(k, stride=stride, padding=pad))
        else:
            if min(cur[:2]) < k:
                break
            layers.append(Conv2d(draw(st.integers(1, 5)), k, stride=stride, padding=pad))
        probe = Sequential(layers + [Flatten(), Dense(2)], input_shape=shape, input_exp=-7)
        cur = probe.layers[len(layers) - 1].out_shape
        if int(np.prod(cur[:-1])) >= 2 and draw(st.booleans()):
            layers.append(BatchNorm())
        if draw(st.booleans()):
            layers.append(ReLU())
        if draw(st.booleans()) and min(cur[:-1]) >= 2:
            if one_d:
                layers.append(MaxPool1d(2))
            else:
                layers.append(draw(st.sampled_from([MaxPool2d, AvgPool2d]))(2))
            cur = Sequential(layers + [Flatten(), Dense(2)], input_shape=shape, input_exp=-7).layers[len(layers) - 1].out_shape
    layers.append(draw(st.sampled_from([Flatten, GlobalAvgPool]))())
    n_cls = draw(st.integers(2, 5))
    layers.append(Dense(n_cls))
    opt = SGD(lr=draw(st.sampled_from([0.01, 0.05, 0.2])), batch_size=draw(st.integers(1, 3)),
              momentum=draw(st.sampled_from([0.0, 0.9])), stochastic_rounding=draw(st.booleans()),
              master_weights=draw(st.booleans()))
    return Sequential(layers, input_shape=shape, input_exp=draw(st.integers(-9, 0)), optimizer=opt,
                      seed=draw(st.integers(0, 1000))), n_cls


@settings(max_examples=examples(4), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graph(), st.integers(0, 2**16))
def test_random_cnn_graphs_reference_sim_and_c_equal(graph, seed):
    ref, n_cls = graph
    fast = ref.copy()
    sim, hm = Simulator(fast), HostModel(fast, sanitize=True)
    x, y = _data(12, ref.input_shape, n_cls, seed)
    for epoch in range(2):
        for i in range(len(x)):
            a = ref.ref_train_step(x[i], y[i])
            b = tuple(sim.train(x, y, [i])[0])
            c = hm.train_step(x[i], y[i])
            assert ref.state_hash() == fast.state_hash() == hm.state_hash(), f"epoch {epoch} step {i}: {ref.summary()}"
            assert tuple(a) == b == c
    assert [ref.ref_predict(v) for v in x] == list(sim.predict(x)) == [hm.predict(v) for v in x]


def _calls(src: str):
    """(name, argument count) of every function call inside a body or initializer of C source."""
    import re

    src = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    out, depth, i = [], 0, 0
    call = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
    while i < len(src):
        ch = src[i]
        depth += {"{": 1, "}": -1}.get(ch, 0)
        m = call.match(src, i) if depth > 0 and (i == 0 or not (src[i - 1].isalnum() or src[i - 1] == "_")) else None
        if m and m.group(1) not in ("if", "for", "while", "switch", "return", "sizeof"):
            j, par, n, empty = m.end(), 1, 1, True
            while par:
                c = src[j]
                par += {"(": 1, ")": -1}.get(c, 0)
                if par == 1 and c == ",":
                    n += 1
                elif par >= 1 and not c.isspace() and c != "(":
                    empty = False
                j += 1
            out.append((m.group(1), 0 if empty else n))
        i += 1
    return out


@pytest.mark.parametrize("name,dataset", [("digits-mlp", "digits"), ("digits-cnn", "digits-image"),
                                          ("mnist1d-cnn", "mnist1d"), ("mnist1d-cnn-pool", "mnist1d")])
def test_generated_kernel_calls_take_at_most_six_arguments(name, dataset):
    """W1, W3 and W2 read with named fields: each layer's dims and parameters are a static const
    struct with designated initializers, and no call of the generated C passes more than six
    arguments (the kernels used to take up to 21 positional integers)."""
    from tinytrain import data
    from tinytrain.graph import models

    em = generate(models.build_model(name, data.load(dataset)), prefix="m")
    calls = _calls(em.source)
    kernels = [(f, n) for f, n in calls if f.startswith("tt_")]
    assert len(kernels) > 10 and {f for f, _ in kernels} >= {"tt_softmax_ce_s8", "tt_state_hash", "tt_sgd_lr_mult"}
    assert max(n for _, n in calls) <= 6, [c for c in calls if c[1] > 6]
    assert "tt_relu_fwd_s8" in {f for f, _ in kernels}
    for line in em.source.splitlines():  # every params struct names its fields
        if line.startswith("static const tt_") and "_params " in line:
            assert " = {." in line and ", ." in line, line
    assert "= {\n    .m = " in em.source  # the optimizer too
    assert _calls("void f(void) { g(a, h(b, c), (d, e)); k(); }") == [("g", 3), ("h", 2), ("k", 0)]
