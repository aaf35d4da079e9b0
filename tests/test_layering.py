"""The package's modules import one way: no import cycle, counting imports inside functions
(which hide a cycle from Python but not from a reader), and the specification (fixed-point
primitives, reference ops, numba kernels) imports nothing above itself."""
from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "tinytrain"


def import_graph() -> dict[str, set[str]]:
    """module -> the tinytrain modules it imports anywhere in its source."""
    mods = {}
    for p in PKG.rglob("*.py"):
        if "platform-qemu-cortexm" in p.parts:  # PlatformIO's build script, not package code
            continue
        parts = p.relative_to(PKG.parent).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        pkg = m if p.name == "__init__.py" else m.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = pkg.split(".")[:len(pkg.split(".")) - node.level + 1] if node.level else []
                target = ".".join(base + ([node.module] if node.module else []))
                cands = [target] + [f"{target}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                cands = [a.name for a in node.names]
            else:
                continue
            for c in cands:
                while c and c not in mods:
                    c = c.rpartition(".")[0]
                if c and c != m and not m.startswith(c + "."):  # a package's own __init__ is fine
                    graph[m].add(c)
    return graph


def cycles(graph) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _within(m, pkgs) -> bool:
    """m is one of the modules or packages pkgs, or inside one (by dotted name, not prefix)."""
    return any(m == p or m.startswith(p + ".") for p in pkgs)


def test_specification_imports_nothing_above_it():
    spec = ("tinytrain.fixedpoint", "tinytrain.ops", "tinytrain.kernels")
    below = spec + ("tinytrain.graph.state",)
    bad = {m: sorted(d for d in deps if not _within(d, spec))
           for m, deps in import_graph().items() if _within(m, below)}
    assert {m: d for m, d in bad.items() if d} == {}


#: what each lower stage of the pipeline may import (besides itself): the model sits on the
#: specification, the simulator on the model, the code generator never reaches the simulator,
#: the training loop or the command line, and the board layer needs only its own files
ALLOWED = {
    "graph": {"fixedpoint", "ops", "kernels", "data"},
    "sim": {"fixedpoint", "ops", "kernels", "graph"},
    "codegen": {"fixedpoint", "ops", "graph", "device", "federated", "resources"},
    "device": {"resources"},
}


def test_stages_import_downward_only():
    bad = {}
    for m, deps in import_graph().items():
        st = m.split(".")[1] if m.count(".") else ""
        if st in ALLOWED:
            up = sorted(d for d in deps if d.split(".")[1] != st and d.split(".")[1] not in ALLOWED[st])
            if up:
                bad[m] = up
    assert bad == {}
