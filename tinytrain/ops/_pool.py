"""Window geometry shared by the pooling ops (valid padding, channels-last)."""
from __future__ import annotations


def pair(v) -> tuple[int, int]:
    """An int k -> (k, k); a pair -> (int, int)."""
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"expected an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def geometry(shape, kernel, stride=None):
    """(kh, kw, sh, sw, OH, OW) for an (H, W, C) input; stride defaults to the kernel.

    OH = (H - kh) // sh + 1 and OW = (W - kw) // sw + 1 (no padding; rows/columns past the
    last full window are not read). Raises ValueError on a window larger than the input.
    """
    H, W = int(shape[0]), int(shape[1])
    kh, kw = pair(kernel)
    sh, sw = pair(kernel if stride is None else stride)
    if min(kh, kw, sh, sw) < 1:
        raise ValueError(f"pool kernel {kernel!r} and stride {stride!r} must be >= 1")
    if kh > H or kw > W:
        raise ValueError(f"pool kernel {(kh, kw)} larger than the input {(H, W)}")
    return kh, kw, sh, sw, (H - kh) // sh + 1, (W - kw) // sw + 1


def window(a, i, j, sh, sw, OH, OW):
    """View of a[oh*sh + i, ow*sw + j, :] for all (oh, ow): shape (OH, OW, C)."""
    return a[i : i + sh * (OH - 1) + 1 : sh, j : j + sw * (OW - 1) + 1 : sw]
