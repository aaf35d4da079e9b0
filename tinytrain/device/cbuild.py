"""Compile C (the firmware runtime, generated models, test shims) for the host and load it
with cffi. The same sources are built for boards with PlatformIO; here gcc builds a shared
library with -Wall -Wextra -Werror (and, on request, -fsanitize=undefined)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cffi

from tinytrain.resources import FIRMWARE, FIRMWARE_INCLUDE, FIRMWARE_SRC  # noqa: F401  (re-exported)
from tinytrain.device.toolchain import ToolchainError

CFLAGS = ["-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fPIC", "-shared"]
SANITIZE = ["-fsanitize=undefined", "-fno-sanitize-recover=undefined", "-fno-omit-frame-pointer"]


class BuildError(RuntimeError):
    """The host C compiler failed or is missing."""


class CompilerMissing(BuildError, ToolchainError):
    """No host C compiler: the user's to install (a ToolchainError, so the CLI says so in one line)."""


def cache_dir() -> Path:
    d = Path(os.environ.get("TINYTRAIN_CACHE", Path.home() / ".cache" / "tinytrain")) / "cbuild"
    d.mkdir(parents=True, exist_ok=True)
    return d


def runtime_sources(names=None) -> list[Path]:
    """Runtime C files (all of tinytrain/firmware/src, or the given stems such as 'tt_dense')."""
    if names is None:
        return sorted(p for p in FIRMWARE_SRC.glob("tt_*.c") if p.stem not in _DEVICE_ONLY)
    return [FIRMWARE_SRC / f"{n}.c" for n in names]


# Files that need a board port (UART) and are not part of the host build of the runtime.
_DEVICE_ONLY = {"tt_device_main"}


def compile_shared(sources, cdef: str, *, include_dirs=(), sanitize=False, extra_flags=(),
                   name="ttlib", private=False):
    """Compile ``sources`` (paths, or (filename, text) pairs) to a shared library and return
    (ffi, lib). Results are cached by the hash of all inputs."""
    cc = os.environ.get("CC", "gcc")
    if shutil.which(cc) is None:
        raise CompilerMissing(f"C compiler '{cc}' not found: install gcc (sudo apt-get install gcc)"
                              + (" or set CC to an installed compiler" if "CC" in os.environ else ""))
    files = []
    for s in sources:
        if isinstance(s, tuple):
            files.append(s)
        else:
            files.append((Path(s).name, Path(s).read_text()))
    incs = [FIRMWARE_INCLUDE, *map(Path, include_dirs)]
    flags = [f for f in CFLAGS if f != "-shared"] + (SANITIZE if sanitize else []) + list(extra_flags)
    # Each source becomes an object cached by its own text, the headers it includes and the
    # flags, so the runtime compiles once per flag set and a new model compiles only its own .c.
    scan = incs + [Path(f[2:]) for f in extra_flags if f.startswith("-I")]
    objs = [(_object_path(fname, text, scan, flags, cc), fname, text) for fname, text in files]
    missing = [o for o in objs if not o[0].exists()]
    if missing:
        with ThreadPoolExecutor(max_workers=min(len(missing), os.cpu_count() or 1)) as pool:
            list(pool.map(lambda o: _compile_object(cc, flags, incs, *o), missing))
    h = hashlib.sha256()
    for o, _, _ in objs:
        h.update(o.name.encode() + b"\0")
    link = ["-shared", *(SANITIZE if sanitize else [])]
    h.update(" ".join(link).encode() + cdef.encode())
    out = cache_dir() / f"{name}-{h.hexdigest()[:20]}.so"
    if not out.exists():
        tmp = out.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
        cmd = [cc, *link, "-o", str(tmp), *[str(o) for o, _, _ in objs]]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"host C link failed:\n$ {' '.join(cmd)}\n{r.stderr.strip()}")
        os.replace(tmp, out)
    ffi = cffi.FFI()
    ffi.cdef(cdef)
    if private:
        # dlopen returns the same handle (and the same static state) for the same path: a
        # private copy gives this caller its own instance of the library's globals
        import tempfile
        fd, tmp = tempfile.mkstemp(suffix=".so", prefix=f"{name}-", dir=cache_dir())
        os.close(fd)
        shutil.copyfile(out, tmp)
        lib = ffi.dlopen(tmp)
        os.unlink(tmp)  # the mapping stays valid
        return ffi, lib
    return ffi, ffi.dlopen(str(out))



_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _included_headers(text: str, incs) -> list[Path]:
    """The quoted headers ``text`` includes, directly or through other headers, found in ``incs``."""
    seen: dict[str, Path] = {}
    todo = _INCLUDE.findall(text)
    while todo:
        n = todo.pop()
        if n in seen:
            continue
        for d in incs:
            p = Path(d) / n
            if p.is_file():
                seen[n] = p
                todo.extend(_INCLUDE.findall(p.read_text()))
                break
    return [seen[n] for n in sorted(seen)]


def _object_path(fname: str, text: str, incs, flags, cc: str) -> Path:
    h = hashlib.sha256()
    h.update(cc.encode() + b"\0" + " ".join(flags).encode() + b"\0" + fname.encode() + b"\0" + text.encode())
    for p in _included_headers(text, incs):
        h.update(b"\0" + p.name.encode() + b"\0" + p.read_bytes())
    d = cache_dir() / "obj"
    d.mkdir(exist_ok=True)
    return d / f"{Path(fname).stem}-{h.hexdigest()[:20]}.o"


def _compile_object(cc: str, flags, incs, out: Path, fname: str, text: str) -> None:
    tag = f"{os.getpid()}.{threading.get_ident()}"
    work = out.parent / f"{out.stem}.{tag}"  # the source keeps its name (compiler messages)
    work.mkdir()
    src = work / fname
    src.write_text(text)
    tmp = work / "out.o"
    cmd = [cc, *flags, *[f"-I{d}" for d in incs], "-c", "-o", str(tmp), str(src)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"host C build failed:\n$ {' '.join(cmd)}\n{r.stderr.strip()}")
        os.replace(tmp, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def cdef_from_header(path) -> str:
    """Function prototypes of a tinytrain header, stripped for cffi's cdef (no inline
    functions, no macros, no includes)."""
    text = Path(path).read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r"\\\n", " ", text)  # a directive continued over lines is one line
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)
    text = re.sub(r"typedef char tt_require_arith_shift\[.*?\];", "", text, flags=re.S)
    # drop static inline function bodies
    out, i = [], 0
    for m in re.finditer(r"static inline[^{;]*\{", text):
        pass
    while True:
        m = re.search(r"static inline[^{;]*\{", text[i:])
        if not m:
            out.append(text[i:])
            break
        out.append(text[i : i + m.start()])
        j = i + m.end()
        depth = 1
        while depth:
            depth += {"{": 1, "}": -1}.get(text[j], 0)
            j += 1
        i = j
    return re.sub(r'^(extern "C" \{|\})\s*$', "", "".join(out), flags=re.M)  # C++ guard braces
