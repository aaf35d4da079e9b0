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
    "Sequential": ("model", "Sequential"),
    "Dense": ("layers", "Dense"),
    "ReLU": ("layers", "ReLU"),
    "Flatten": ("layers", "Flatten"),
    "Layer": ("layers", "Layer"),
    "Conv2d": ("layers_conv", "Conv2d"),
    "DepthwiseConv2d": ("layers_conv", "DepthwiseConv2d"),
    "Conv1d": ("layers_conv", "Conv1d"),
    "MaxPool2d": ("layers_conv", "MaxPool2d"),
    "MaxPool1d": ("layers_conv", "MaxPool1d"),
    "AvgPool2d": ("layers_conv", "AvgPool2d"),
    "GlobalAvgPool": ("layers_conv", "GlobalAvgPool"),
    "BatchNorm": ("layers_norm", "BatchNorm"),
    "Residual": ("layers_residual", "Residual"),
    "TrainWarning": ("train", "TrainWarning"),
    "ModelError": ("layers", "ModelError"),
    "SGD": ("optim", "SGD"),
    "ConfigError": ("optim", "ConfigError"),
    "Simulator": ("sim", "Simulator"),
    "save": ("io", "save"),
    "load": ("io", "load"),
    "save_model": ("io", "save"),
    "load_model": ("io", "load"),
    "FileFormatError": ("io", "FileFormatError"),
    "fit": ("train", "fit"),
    "evaluate": ("train", "evaluate"),
    "History": ("train", "History"),
    "TrainError": ("train", "TrainError"),
    "build_model": ("models", "build_model"),
    "MODELS": ("models", "MODELS"),
    "memory_estimate": ("models", "memory_estimate"),
    "datasets": ("data", None),
    "load_dataset": ("data", "load"),
    "Dataset": ("data", "Dataset"),
    "DataError": ("data", "DataError"),
    "fixedpoint": ("fixedpoint", None),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'tinytrain' has no attribute {name!r}")
    import importlib
    mod, attr = _EXPORTS[name]
    m = importlib.import_module(f".{mod}", __name__)
    value = m if attr is None else getattr(m, attr)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
