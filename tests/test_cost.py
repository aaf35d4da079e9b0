"""tinytrain.cost.device_cost: the measured device cost that sensitivity, compress and pareto share."""
import pytest

from tests.test_boards_qemu import needs_qemu
from tinytrain.codegen.memory import breakdown
from tinytrain.cost import TRAINING_RAM, device_cost
from tinytrain.lab.precision import integer_model
from tinytrain.lab.workloads import WORKLOADS


@pytest.fixture(scope="module")
def w1():
    wl = WORKLOADS["w1"]
    ds = wl.load()
    return integer_model(wl, ds, 0, {}), ds


@pytest.mark.qemu
@needs_qemu
def test_device_cost_is_the_linked_breakdown_and_a_verified_qemu_count(w1):
    m, ds = w1
    h = m.state_hash()
    c = device_cost(m, "microbit", ds, steps=3)
    bd = breakdown(m, "microbit")
    assert m.state_hash() == h  # the model is not trained by measuring it
    assert c["fits"] and c["shadow"] and c["steps"] == 3
    assert c["training_ram"] == sum(bd.ram[k] for k in TRAINING_RAM)
    assert c["ram_total"] == bd.ram_total <= c["board_ram"]
    assert c["instructions_per_sample"] > 10_000  # W1 on an M0 costs ~60k per sample
    # exact instruction counts (QEMU -icount shift=7, tt_qemu_instructions): a rerun, which waits
    # for the host a different time before each step, measures the very same figures
    assert device_cost(m, "microbit", ds, steps=3) == c


def test_device_cost_reports_a_model_too_big_for_the_board(w1):
    m, ds = w1
    big = integer_model(WORKLOADS["w1"], ds, 0, {"precision": "int16-master32"})
    c = device_cost(big, "microbit", ds, instructions=False)
    bare = breakdown(big, "microbit", shadow=False)
    assert not c["fits"] and not c["shadow"]
    need = bare.ram_needed  # static RAM and the 2 KiB stack the micro:bit's link script reserves
    assert need == bare.ram_static + 2048 > bare.ram_total
    assert c["why"] == (f"needs {need} B of RAM, microbit has 16384 B ({need - 16384} B over; "
                        "its link script reserves 2048 B of stack)")
    assert c["instructions_per_sample"] is None
    small = device_cost(m, "microbit", instructions=False)
    assert small["fits"] and small["instructions_per_sample"] is None


def test_a_model_the_estimate_fits_but_the_link_does_not_is_reported_not_raised(w1, monkeypatch):
    """The RAM estimate (the linked static RAM plus gcc's stack estimate) can fit while the link,
    which reserves the port's fixed stack, overflows (a W3 variant on the micro:bit did by 64 B and
    `sensitivity --board microbit` died with an internal error): the link decides, and the point
    is reported as not fitting, with the linker's own words."""
    from tinytrain import verify
    from tinytrain.device.pio_project import FitError

    m, ds = w1

    def overflowing(*a, **k):
        raise FitError("build for microbit failed (pio run ...): region `RAM' overflowed by 64 bytes: "
                       "the firmware does not fit microbit; use a smaller model")
    monkeypatch.setattr(verify, "verify", overflowing)
    c = device_cost(m, "microbit", ds, steps=2)
    assert not c["fits"] and c["instructions_per_sample"] is None
    assert c["why"] == "the linked firmware does not fit microbit: region `RAM' overflowed by 64 bytes"


_VARIANTS = ("dense", "pruned", "int8", "int4-row-master16", "cnn")


def _variant(kind, w1):
    from tinytrain.sensitivity import pruned, with_layer_policy

    m, ds = w1
    if kind == "pruned":
        return pruned(m, (0, 0), 0.5), ds
    if kind in ("int8", "int4-row-master16"):
        return with_layer_policy(m, 2, kind), ds
    if kind == "cnn":
        wl = WORKLOADS["w3"]
        d3 = wl.load()
        return integer_model(wl, d3, 0, {}), d3
    return m, ds


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board,kind", [("microbit", "dense"), ("microbit", "pruned"), ("mps2_an386", "int8"),
                                        ("mps2_an386", "pruned"), ("microbit", "int4-row-master16"),
                                        ("mps2_an385", "cnn")])
def test_the_direct_link_measures_what_the_platformio_build_does(w1, tmp_path, board, kind):
    """Sweeps run the size link's ELF (build="direct", no PlatformIO): the same code in another
    order in flash, so the exact QEMU counts, the RAM and the flash equal the pio-built firmware's."""
    m, ds = _variant(kind, w1)
    direct = device_cost(m, board, ds, steps=3, build_dir=tmp_path / "d", build="direct")
    pio = device_cost(m, board, ds, steps=3, build_dir=tmp_path / "p")
    assert direct["instructions_per_sample"] is not None
    assert direct == pio
    assert (tmp_path / "d" / "firmware.elf").is_file()


@pytest.mark.qemu
@needs_qemu
@pytest.mark.parametrize("board,kind", [("microbit", "int8"), ("mps2_an386", "pruned"), ("mps2_an385", "cnn")])
def test_the_reference_checker_measures_what_the_simulator_checker_does(w1, tmp_path, board, kind):
    """Sweeps check each step against the numpy reference instead of compiling a simulator per
    variant: the same exact counts, RAM and flash."""
    m, ds = _variant(kind, w1)
    ref = device_cost(m, board, ds, steps=3, build_dir=tmp_path, build="direct", checker="reference")
    assert ref["instructions_per_sample"] is not None
    assert ref == device_cost(m, board, ds, steps=3, build_dir=tmp_path, build="direct")


def test_the_direct_link_reports_an_overflow_with_the_linkers_line(w1, monkeypatch, tmp_path):
    from tinytrain import verify
    from tinytrain.codegen import memory

    m, ds = w1
    real = memory.link_firmware

    def overflowing(em, glue, board, keep=None):
        out = dict(real(em, glue, board))
        if keep is not None:  # the firmware's own link (the sizes link is the estimate's)
            out["overflow"] = "region `RAM' overflowed by 12 bytes"
        return out

    def no_qemu(*a, **k):
        raise AssertionError("a firmware that does not link must not run")
    monkeypatch.setattr(memory, "link_firmware", overflowing)
    monkeypatch.setattr(verify, "verify", no_qemu)
    c = device_cost(m, "microbit", ds, steps=2, build_dir=tmp_path, build="direct")
    assert not c["fits"] and c["instructions_per_sample"] is None
    assert c["why"] == "the linked firmware does not fit microbit: region `RAM' overflowed by 12 bytes"
    with pytest.raises(ValueError, match="build='cmake'"):
        device_cost(m, "microbit", ds, build="cmake")
