"""The simulator: the whole training loop generated as one numba function per model, equal bit
for bit to the reference step in ``tinytrain.graph`` and to the generated C."""
