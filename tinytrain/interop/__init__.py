"""Bring your model, take it back: import from PyTorch, ONNX and TFLite; export to ONNX.

    model = tt.from_torch(net, example_input, dataset=ds)      # post-training quantization
    model = tt.from_onnx("net.onnx", dataset=ds)
    model = tt.from_tflite("net.tflite", dataset=ds)
    tt.to_onnx(model, "out.onnx")                               # float graph (or QDQ weights)

Every importer produces the same float graph (``ir.FloatOp``, channels-last) and one builder
(``ir.to_model``) quantizes it the way tinytrain quantizes its own parameters; see ir.py.
The frameworks are the ``interop`` extra (``pip install tinytrain-mcu[interop]``).
"""
from tinytrain.interop.ir import InteropError

__all__ = ["InteropError", "from_torch", "from_onnx", "from_tflite", "to_onnx"]


def from_torch(*args, **kwargs):
    from tinytrain.interop.torch_import import from_torch as f
    return f(*args, **kwargs)


def from_onnx(*args, **kwargs):
    from tinytrain.interop.onnx_import import from_onnx as f
    return f(*args, **kwargs)


def from_tflite(*args, **kwargs):
    from tinytrain.interop.tflite_import import from_tflite as f
    return f(*args, **kwargs)


def to_onnx(*args, **kwargs):
    from tinytrain.interop.export_onnx import to_onnx as f
    return f(*args, **kwargs)
