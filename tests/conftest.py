"""Shared fixtures: the firmware runtime compiled for the host (cffi), once per session."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from hypothesis import settings

from tinytrain.device import cbuild

# HYPOTHESIS_PROFILE=thorough, for shaking out the exactness areas with several
# --hypothesis-seed values: tests without their own max_examples draw 1000 examples, and those
# counted by examples() below 10x theirs (times TINYTRAIN_EXAMPLES); tests that give a literal
# max_examples keep it. The default profile changes nothing.
THOROUGH = os.environ.get("HYPOTHESIS_PROFILE") == "thorough"
settings.register_profile("thorough", max_examples=1000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

HERE = Path(__file__).parent


def examples(n: int) -> int:
    """Hypothesis examples of a test that compiles a simulator and a C model per example (the
    random-graph tests: ~5-10 s each): n by default, n * TINYTRAIN_EXAMPLES for a longer
    search (e.g. TINYTRAIN_EXAMPLES=10 overnight). The suite's default keeps them ~2-4 min."""
    return n * max(1, int(os.environ.get("TINYTRAIN_EXAMPLES", "1"))) * (10 if THOROUGH else 1)
SHIM_CDEF = """
int64_t tt_t_rshift_round_s64(int64_t x, int32_t s);
int32_t tt_t_rshift_round_s32(int32_t x, int32_t s);
int64_t tt_t_rshift_stoch_s64(int64_t x, int32_t s, uint32_t r);
int8_t tt_t_sat_s8(int64_t x);
int16_t tt_t_sat_s16(int64_t x);
int32_t tt_t_sat_s32(int64_t x);
int32_t tt_t_bitwidth_u64(uint64_t v);
int32_t tt_t_requant_shift(uint64_t m, int32_t bits);
int64_t tt_t_align(int32_t v, int32_t ef, int32_t et);
int32_t tt_t_div_trunc_s32(int32_t a, int32_t b);
uint32_t tt_t_prng_next(uint32_t s);
"""


def runtime_cdef() -> str:
    parts = [SHIM_CDEF]
    # tt_fixedpoint first, then by name, a header after those it includes (it uses their types:
    # tt_conv_wgrad.h the params of tt_conv.h and tt_conv_w8.h, tt_sparse_blocks.h tt_sparse_rows.h's)
    byname = {h.name: h for h in sorted(cbuild.FIRMWARE_INCLUDE.glob("tt_*.h"),
                                        key=lambda h: (h.stem != "tt_fixedpoint", h.name))}
    headers: list = []

    def visit(h):
        if h not in headers:
            for dep in re.findall(r'#include "(tt_\w+\.h)"', h.read_text()):
                if dep in byname:
                    visit(byname[dep])
            headers.append(h)

    for h in byname.values():
        visit(h)
    for h in headers:
        if h.stem in ("tt_port", "tt_device", "tt_protocol", "tt_cobs", "tt_crc32", "tt_fedcodec", "tt_state"):
            continue
        parts.append(cbuild.cdef_from_header(h))
    return "\n".join(parts)


def _build(sanitize: bool):
    srcs = [p for p in cbuild.runtime_sources() if p.stem not in ("tt_protocol", "tt_cobs", "tt_crc32", "tt_fedcodec", "tt_state")]
    return cbuild.compile_shared(
        [*srcs, HERE / "c" / "tt_test_shim.c"], runtime_cdef(), sanitize=sanitize, name="ttrt"
    )


@pytest.fixture(scope="session")
def clib():
    """(ffi, lib) of the whole runtime built for the host."""
    return _build(sanitize=False)


@pytest.fixture(scope="session")
def clib_ubsan():
    """The runtime built with -fsanitize=undefined (aborts on any UB)."""
    return _build(sanitize=True)
