"""tinytrain: integer-only on-device training, bit-exact between laptop and microcontroller.

The public API mirrors the command line::

    import tinytrain as tt
    ds = tt.load_dataset("digits")                      # tinytrain train --data digits
    model = tt.build_model("digits-mlp", ds)            #   --model digits-mlp
    # or by hand: tt.Sequential([tt.Dense(32), tt.ReLU(), tt.Dense(10)], dataset=ds)
    history = tt.fit(model, ds, epochs=20, seed=0)      #   --epochs 20 --seed 0
    tt.save(model, "runs/digits-mlp.tt")                #   --out runs/digits-mlp.tt
    model, extra = tt.load("runs/digits-mlp.tt")        # tinytrain eval --model ...
    tt.evaluate(model, ds)["accuracy"]

Names are imported on first use, so ``import tinytrain`` stays light (no numba, no sklearn).
"""

__version__ = "0.1.0"

# public name -> (module, attribute); attribute None means the module itself
_EXPORTS = {
    "Sequential": ("graph.model", "Sequential"),
    "Dense": ("graph.layers", "Dense"),
    "ReLU": ("graph.layers", "ReLU"),
    "Flatten": ("graph.layers", "Flatten"),
    "Layer": ("graph.layers", "Layer"),
    "Conv2d": ("graph.conv", "Conv2d"),
    "DepthwiseConv2d": ("graph.conv", "DepthwiseConv2d"),
    "Conv1d": ("graph.conv", "Conv1d"),
    "MaxPool2d": ("graph.conv", "MaxPool2d"),
    "MaxPool1d": ("graph.conv", "MaxPool1d"),
    "AvgPool2d": ("graph.conv", "AvgPool2d"),
    "GlobalAvgPool": ("graph.conv", "GlobalAvgPool"),
    "BatchNorm": ("graph.norm", "BatchNorm"),
    "Residual": ("graph.residual", "Residual"),
    "TrainWarning": ("train", "TrainWarning"),
    "ModelError": ("graph.layers", "ModelError"),
    "SGD": ("graph.optim", "SGD"),
    "Precision": ("graph.precision", "Precision"),
    "with_precision": ("graph.convert", "with_precision"),
    "shrink": ("graph.convert", "shrink"),

    "Prune": ("graph.prune", "Prune"),
    "ConfigError": ("graph.optim", "ConfigError"),
    "Simulator": ("sim.simulator", "Simulator"),
    "save": ("graph.io", "save"),
    "load": ("graph.io", "load"),
    "save_model": ("graph.io", "save"),
    "load_model": ("graph.io", "load"),
    "FileFormatError": ("graph.io", "FileFormatError"),
    "fit": ("train", "fit"),
    "evaluate": ("train", "evaluate"),
    "History": ("train", "History"),
    "TrainError": ("train", "TrainError"),
    "build_model": ("graph.models", "build_model"),
    "MODELS": ("graph.models", "MODELS"),
    "memory_estimate": ("codegen.memory", "memory_estimate"),
    "datasets": ("data", None),
    "load_dataset": ("data", "load"),
    "Dataset": ("data", "Dataset"),
    "DataError": ("data", "DataError"),
    "fixedpoint": ("fixedpoint", None),
    "from_torch": ("interop", "from_torch"),
    "from_onnx": ("interop", "from_onnx"),
    "from_tflite": ("interop", "from_tflite"),
    "to_onnx": ("interop", "to_onnx"),
    "InteropError": ("interop", "InteropError"),
}

# __all__ is computed on first use (module __getattr__): it lists every registered layer class too


def _layer_classes() -> dict:
    """Every registered layer type by class name (tt.LeakyReLU, ...): a layer added with its op
    table row is public without an entry here."""
    from tinytrain.graph import model  # noqa: F401  (registers every built-in layer type)
    from tinytrain.graph.layers import LAYER_TYPES
    return {cls.__name__: cls for cls in LAYER_TYPES.values()}


def __getattr__(name):
    if name == "__all__":
        globals()["__all__"] = value = ["__version__", *_EXPORTS, *sorted(set(_layer_classes()) - set(_EXPORTS))]
        return value
    if name not in _EXPORTS:
        if name[:1].isupper() and name in _layer_classes():
            globals()[name] = value = _layer_classes()[name]
            return value
        raise AttributeError(f"module 'tinytrain' has no attribute {name!r}")
    import importlib
    mod, attr = _EXPORTS[name]
    m = importlib.import_module(f".{mod}", __name__)
    value = m if attr is None else getattr(m, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS) | set(_layer_classes()))
