"""Compile C (the firmware runtime, generated models, test shims) for the host and load it
with cffi. The same sources are built for boards with PlatformIO; here gcc builds a shared
library with -Wall -Wextra -Werror (and, on request, -fsanitize=undefined)."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
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
    h = hashlib.sha256()
    files = []
    for s in sources:
        if isinstance(s, tuple):
            fname, text = s
        else:
            fname, text = Path(s).name, Path(s).read_text()
        files.append((fname, text))
        h.update(fname.encode() + b"\0" + text.encode() + b"\0")
    incs = [FIRMWARE_INCLUDE, *map(Path, include_dirs)]
    for d in incs:
        for p in sorted(Path(d).glob("*.h")):
            h.update(p.name.encode() + p.read_bytes())
    flags = CFLAGS + (SANITIZE if sanitize else []) + list(extra_flags)
    h.update(" ".join(flags).encode() + cdef.encode())
    key = h.hexdigest()[:20]
    out = cache_dir() / f"{name}-{key}.so"
    if not out.exists():
        src_dir = cache_dir() / f"{name}-{key}-src"
        src_dir.mkdir(exist_ok=True)
        paths = []
        for fname, text in files:
            p = src_dir / fname
            p.write_text(text)
            paths.append(str(p))
        tmp = out.with_suffix(f".{os.getpid()}.tmp")
        cmd = [cc, *flags, *[f"-I{d}" for d in incs], "-o", str(tmp), *paths]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"host C build failed:\n$ {' '.join(cmd)}\n{r.stderr.strip()}")
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


def cdef_from_header(path) -> str:
    """Function prototypes of a tinytrain header, stripped for cffi's cdef (no inline
    functions, no macros, no includes)."""
    text = Path(path).read_text()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
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
