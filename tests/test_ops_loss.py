"""Softmax cross-entropy head: the C kernel (its 32-bit fast case and the general path) == the
numpy reference on hypothesis-drawn class counts, logits, exponents and labels."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from tinytrain.ops import softmax_ce as rsm

from .conftest import examples
from .oputil import c_ctx, c_i8


@st.composite
def softmax_case(draw):
    N = draw(st.integers(1, 40))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lo, hi = draw(st.sampled_from([(-127, 127), (-3, 3), (120, 127), (-128, -120)]))
    z = rng.integers(lo, hi + 1, N).astype(np.int8)
    if draw(st.booleans()):
        z[rng.integers(0, N)] = draw(st.sampled_from([-128, 127]))
    # shift 7 - ez on both sides of the fast case's [1, 31], and beyond 63 (a drawn graph reached
    # ez = -60: the C shifted an int64 by 67, undefined)
    ez = draw(st.integers(-90, 14))
    return z, ez, draw(st.integers(0, N - 1))


@settings(max_examples=examples(150), deadline=None)
@given(softmax_case())
def test_softmax_ce_c_equals_reference(clib, case):
    ffi, lib = clib
    z, ez, label = case
    N = z.size
    scratch = np.zeros(N, np.int64)
    ctx, st_c = c_ctx(ffi, scratch)
    e = np.zeros(N, np.int8)
    out = ffi.new("tt_loss_out *", {"e": c_i8(ffi, e)})
    pred = lib.tt_softmax_ce_s8(ctx, c_i8(ffi, z), ez, label, N, out)
    e_ref, ee_ref, nsat_ref, loss_ref, pred_ref = rsm.forward_backward(z, ez, label)
    assert pred == pred_ref and out.ee == ee_ref and out.loss_q16 == loss_ref
    assert np.array_equal(e, e_ref) and st_c.saturated == nsat_ref
    from tinytrain.kernels.loss import softmax_ce  # the numba twin
    e_nb, stats = np.zeros(N, np.int8), np.zeros(4, np.int64)
    ee_nb, loss_nb, pred_nb = softmax_ce(z, ez, label, np.zeros(N, np.int64), e_nb, stats)
    assert (ee_nb, loss_nb, pred_nb) == (ee_ref, loss_ref, pred_ref) and np.array_equal(e_nb, e_ref)
    assert stats[0] == nsat_ref
