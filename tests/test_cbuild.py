"""The host build caches one object per source (its text, the headers it includes, the flags):
the runtime compiles once per flag set, a new model compiles only its own .c, and a changed
header rebuilds exactly the objects that include it."""
from __future__ import annotations

import pytest

from tinytrain.device import cbuild


def _objects(cache):
    return sorted(p.name for p in (cache / "cbuild" / "obj").glob("*.o"))


SRC_A = '#include "shared.h"\nint tt_a(void) { return SHARED_VALUE + 1; }\n'
SRC_B = "int tt_b(void) { return 7; }\n"
CDEF = "int tt_a(void); int tt_b(void);"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TINYTRAIN_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_objects_are_reused_and_headers_invalidate(cache, tmp_path):
    inc = tmp_path / "inc"
    inc.mkdir()
    (inc / "shared.h").write_text("#define SHARED_VALUE 41\n")
    srcs = [("a.c", SRC_A), ("b.c", SRC_B)]
    _, lib = cbuild.compile_shared(srcs, CDEF, include_dirs=[inc], name="t1", private=True)
    assert (lib.tt_a(), lib.tt_b()) == (42, 7)
    first = _objects(cache)
    assert len(first) == 2

    # a different source beside the same one: only the new one compiles
    srcs2 = [("a.c", SRC_A), ("b.c", SRC_B.replace("7", "8"))]
    _, lib = cbuild.compile_shared(srcs2, CDEF, include_dirs=[inc], name="t1", private=True)
    assert (lib.tt_a(), lib.tt_b()) == (42, 8)
    second = _objects(cache)
    assert len(second) == 3 and set(first) <= set(second)

    # the header a.c includes changes: a.c rebuilds, b.c does not
    (inc / "shared.h").write_text("#define SHARED_VALUE 99\n")
    _, lib = cbuild.compile_shared(srcs, CDEF, include_dirs=[inc], name="t1", private=True)
    assert (lib.tt_a(), lib.tt_b()) == (100, 7)
    third = _objects(cache)
    assert len(third) == 4
    assert [n for n in third if n.startswith("b-")] == [n for n in second if n.startswith("b-")]


def test_different_flags_are_different_objects(cache):
    srcs = [("b.c", SRC_B)]
    cbuild.compile_shared(srcs, "int tt_b(void);", name="t2")
    cbuild.compile_shared(srcs, "int tt_b(void);", name="t2", extra_flags=["-DX=1"])
    assert len(_objects(cache)) == 2


def test_compile_error_names_the_file(cache):
    with pytest.raises(cbuild.BuildError, match=r"(?s)host C build failed.*bad\.c:1:22: error"):
        cbuild.compile_shared([("bad.c", "int f(void) { return undefined_name; }\n")], "int f(void);",
                              name="t3")
    assert _objects(cache) == []
