"""Build a generated model together with the firmware runtime for the host (cffi) and drive
it from Python: the fastest way to check that the C equals the simulator bit for bit."""
from __future__ import annotations

import re

import numpy as np

from tinytrain.device import cbuild
from tinytrain.codegen.emit import generate

# runtime files a model needs (the protocol/device loop is not part of the host model build)
_RUNTIME_EXCLUDE = {"tt_protocol", "tt_cobs", "tt_device_main"}


def _cdef(header: str) -> str:
    text = re.sub(r"/\*.*?\*/", "", header, flags=re.S)
    text = re.sub(r"^\s*#.*$", "", text, flags=re.M)
    return re.sub(r'^(extern "C" \{|\})$', "", text, flags=re.M)  # the C++ guard's braces


class HostModel:
    """The generated C of a model, compiled for this machine and loaded with cffi."""

    def __init__(self, model, prefix="tt_model", sanitize=False, extra_flags=()):
        self.model_name = model.name
        self.em = generate(model, prefix)
        self.prefix = prefix
        srcs = [p for p in cbuild.runtime_sources() if p.stem not in _RUNTIME_EXCLUDE]
        srcs += [(f"{prefix}.c", self.em.source), (f"{prefix}.h", self.em.header)]
        import tempfile, pathlib
        self._hdir = pathlib.Path(tempfile.mkdtemp(prefix="tt-gen-"))
        (self._hdir / f"{prefix}.h").write_text(self.em.header)
        srcs = [s for s in srcs if not (isinstance(s, tuple) and s[0].endswith(".h"))]
        self.ffi, self.lib = cbuild.compile_shared(srcs, _cdef(self.em.header), include_dirs=[self._hdir],
                                                   sanitize=sanitize, extra_flags=extra_flags, name=prefix,
                                                   private=True)
        self._f = lambda n: getattr(self.lib, f"{prefix}_{n}")
        self._loss = self.ffi.new("int32_t *")
        self.input_len = int(np.prod(model.input_shape))

    def train_step(self, x: np.ndarray, label: int):
        x = np.ascontiguousarray(x.reshape(-1), dtype=np.int8)
        pred = self._f("train_step")(self.ffi.cast("int8_t *", self.ffi.from_buffer(x)), int(label), self._loss)
        return int(self._loss[0]), int(pred)

    def predict(self, x: np.ndarray) -> int:
        x = np.ascontiguousarray(x.reshape(-1), dtype=np.int8)
        return int(self._f("predict")(self.ffi.cast("int8_t *", self.ffi.from_buffer(x))))

    def state_hash(self) -> int:
        return int(self._f("state_hash")())

    def read_state(self) -> bytes:
        n = self._f("state_size")()
        buf = self.ffi.new("uint8_t[]", n)
        assert self._f("read_state")(0, buf, n) == 0
        return bytes(self.ffi.buffer(buf, n))

    def write_state(self, blob: bytes, off: int = 0) -> int:
        return int(self._f("write_state")(off, blob, len(blob)))

    def reset(self):
        self._f("reset")()

    def set_seed(self, seed: int):
        self._f("set_seed")(seed & 0xFFFFFFFF)

    def get_tensor(self, i: int) -> bytes:
        total = self.ffi.new("uint32_t *")
        probe = self.ffi.new("uint8_t[1]")
        if self._f("get_tensor")(i, 0, probe, 0, total) != 0:
            raise IndexError(i)
        buf = self.ffi.new("uint8_t[]", max(1, total[0]))
        self._f("get_tensor")(i, 0, buf, total[0], total)
        return bytes(self.ffi.buffer(buf, total[0]))
