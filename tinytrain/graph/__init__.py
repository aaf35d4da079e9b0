"""The model: layers (configuration, shape inference, initialisation), the Sequential graph with
its reference training step, the optimizer settings, the training-state layout, the built-in
models and the ``.tt`` file format. Imports only the specification below it (fixed-point
primitives, reference ops, numba kernels)."""
