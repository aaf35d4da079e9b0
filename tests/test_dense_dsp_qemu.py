"""The Dense DSP kernels as the Cortex-M4 really runs them (inline-asm LDRD/STRD, SMLAD, the fused
update's Q-flag guard), against the simulator on drawn shapes: test_ops_dsp.py checks the same
paths on the host with emulated intrinsics, where the asm loads and stores are plain C."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.qemu,
              pytest.mark.skipif(any(shutil.which(t) is None for t in ("qemu-system-arm", "arm-none-eabi-gcc")),
                                 reason="QEMU or arm-none-eabi-gcc missing")]


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(h1=st.sampled_from([1, 3, 5, 8, 13, 33, 64]), h2=st.sampled_from([2, 7, 9, 31, 66]),
       lr=st.sampled_from([0.01, 0.05, 0.5, 1.0]), seed=st.integers(0, 3))
@example(h1=33, h2=7, lr=1.0, seed=0)  # odd K in layers 2 and 3 (unaligned rows), the largest rate
def test_dense_mlp_shapes_train_bit_exact_on_m4(tmp_path_factory, h1, h2, lr, seed):
    """64-h1-h2-10 MLPs (odd and even widths: K and N not multiples of 2 or 4, rows not 4-byte
    aligned when K is odd; a large learning rate drives weights to the int16 limits, where the
    update's guard redoes blocks), 40 steps verified after each on mps2_an386."""
    from tinytrain import data
    from tinytrain.codegen.project import build_firmware
    from tinytrain.graph.layers import Dense, ReLU
    from tinytrain.graph.model import Sequential
    from tinytrain.graph.optim import SGD
    from tinytrain.verify import verify

    ds = data.load("digits")
    model = lambda: Sequential([Dense(h1), ReLU(), Dense(h2), ReLU(), Dense(10)], input_shape=(64,),  # noqa: E731
                               input_exp=ds.input_exp - 4, optimizer=SGD(lr=lr), seed=seed)
    elf = build_firmware(model(), "mps2_an386", tmp_path_factory.mktemp("fw"))
    r = verify(model(), ds, 40, board="mps2_an386", elf=elf)
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 40
