"""The batch-norm and conv DSP paths and the plain int16/int32 SGD updates as the Cortex-M4 really
runs them (inline-asm SMMULR/SMMLA, LDRD/STRD, the Q-flag guard), against the simulator on drawn
CNN shapes: test_ops_dsp.py checks the same paths on the host with emulated intrinsics, where the
asm is plain C."""
from __future__ import annotations

import shutil

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

pytestmark = [pytest.mark.qemu,
              pytest.mark.skipif(any(shutil.which(t) is None for t in ("qemu-system-arm", "arm-none-eabi-gcc")),
                                 reason="QEMU or arm-none-eabi-gcc missing")]


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(f1=st.sampled_from([1, 3, 4, 5, 8]), f2=st.sampled_from([2, 4, 7, 16]), pool=st.booleans(),
       lr=st.sampled_from([0.03, 0.3, 1.0]), seed=st.integers(0, 3))
@example(f1=5, f2=7, pool=False, lr=1.0, seed=0)  # channel counts off the four-lane words, P = 64 twice
def test_conv_batchnorm_shapes_train_bit_exact_on_m4(tmp_path_factory, f1, f2, pool, lr, seed):
    """conv(f1) - batch norm - ReLU [- maxpool] - conv(f2) - batch norm - ReLU - dense on 8x8
    digits (batch norm over P = 64 or 16 positions, channel counts in and off the DSP words; a
    large rate drives weights towards the int16 guard), 12 steps verified after each on
    mps2_an386."""
    from tinytrain import data
    from tinytrain.cost import _direct_firmware
    from tinytrain.device.boards import get_board
    from tinytrain.graph import models
    from tinytrain.verify import verify

    ds = data.load("digits-image")
    conv = lambda f: {"type": "conv2d", "filters": f, "kernel": 3, "padding": "same"}  # noqa: E731
    spec = {"name": "bn-dsp", "input_scale": "unit", "optimizer": {"lr": lr},
            "layers": [conv(f1), {"type": "batchnorm"}, {"type": "relu"},
                       *([{"type": "maxpool2d", "kernel": 2}] if pool else []),
                       conv(f2), {"type": "batchnorm"}, {"type": "relu"}, {"type": "maxpool2d", "kernel": 2},
                       {"type": "flatten"}, {"type": "dense", "units": ds.n_classes}]}
    model = lambda: models.from_spec(spec, ds, seed=seed)  # noqa: E731
    # the size link's ELF (no PlatformIO; tests/test_cost.py checks it runs as the pio build does)
    elf, over = _direct_firmware(model(), get_board("mps2_an386"), tmp_path_factory.mktemp("fw"))
    assert over is None, over
    r = verify(model(), ds, 12, board="mps2_an386", elf=elf, checker="reference")
    assert r["mismatches"] == 0 and r["first_mismatch"] is None and r["steps"] == 12
