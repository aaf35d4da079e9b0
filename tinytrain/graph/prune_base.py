"""What pruning's reference (graph/prune.py) and its structured part (graph/prune_groups.py) share:
the error type, the structures, the mask bitmap format. A module of its own so the two import it
rather than each other."""
from __future__ import annotations

import numpy as np

STRUCTURES = {"neurons": ("dense",), "channels": ("conv1d", "conv2d"), "filters": ("conv1d", "conv2d"),
              "blocks": ("dense",)}
#: "structure": "blocks": weights pruned by runs of BLOCK consecutive inputs of one output (1 x 4)
BLOCK = 4


class PruneError(ValueError):
    """A pruning configuration that cannot be used (the message names the field)."""


def mask_words(n: int) -> int:
    return (int(n) + 31) // 32


def pack(pruned: np.ndarray) -> np.ndarray:
    """Bool array (any shape, row-major) -> the bitmap (uint32 words, bit i % 32 of word i // 32)."""
    b = np.asarray(pruned, bool).reshape(-1)
    words = mask_words(b.size)
    pad = np.zeros(words * 32, np.uint64)
    pad[:b.size] = b
    return (pad.reshape(words, 32) << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(np.uint32)


def unpack(mask: np.ndarray, n: int) -> np.ndarray:
    """The bitmap -> bool array of n elements (True: pruned)."""
    bits = (np.asarray(mask, np.uint32).astype(np.uint64)[:, None] >> np.arange(32, dtype=np.uint64)) & 1
    return bits.reshape(-1)[:n].astype(bool)


def layer_prune(layer):
    """The prune configuration attached to a layer object (a model file's layer "prune"), or None."""
    return getattr(layer, "prune", None)
