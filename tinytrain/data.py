"""Datasets and input quantization (build time: floats are allowed here, nowhere after).

Every dataset ends up as a `Dataset`: int8 inputs with one power-of-two exponent
(real value = q * 2**input_exp), int32 class labels (or int8 regression targets with
their own exponent), the float originals for float twins and reports, and its shape
channels-last.  All loaders funnel through `from_arrays`, which validates and quantizes.

Quantization rule (`quantize_inputs`): symmetric, scale 2**exp, q = sat(round(x * 2**-exp))
with round = half away from zero and sat = clamp to [-qmax, qmax], qmax = 2**(bits-1) - 1
(never -2**(bits-1), so negation cannot overflow).  exp is the smallest integer with
max|x_train| * 2**-exp <= qmax + 1/2: every training value is then within half a step of
its code (a value at exactly qmax + 1/2 rounds to qmax + 1 and saturates back to qmax, an
error of exactly half a step).  Test data uses the training exponent and may saturate.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import json
import math
import os
import random
import re
from pathlib import Path

import numpy as np

__all__ = [
    "DataError", "Dataset", "quantize_inputs", "dequantize", "from_arrays",
    "load", "load_digits", "load_mnist1d", "mnist1d_args", "parse_mnist1d", "load_npz", "load_csv", "load_idx_dir",
    "read_idx", "write_idx", "BUILTINS",
]


class DataError(ValueError):
    """Bad or unreadable data; the message names the problem and the fix."""


# --------------------------------------------------------------------------- dataset

@dataclasses.dataclass
class Dataset:
    """A quantized dataset.  Shapes: x_* (N, *input_shape) int8; y_* (N,) int32 labels in
    [0, n_classes) or, for regression (n_classes == 0), (N, ...) int8 targets scaled by
    2**target_exp.  input_exp: real input = x * 2**input_exp.  float_range: (min, max) of
    the float training inputs.  float_x_*: float32 originals, for float twins/reports only."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple
    n_classes: int
    input_exp: int
    float_range: tuple
    float_x_train: np.ndarray
    float_x_test: np.ndarray
    input_bits: int = 8
    target_exp: int | None = None
    source: str = ""

    def __post_init__(self):
        self.input_shape = tuple(int(d) for d in self.input_shape)
        for split in ("train", "test"):
            x, y = getattr(self, "x_" + split), getattr(self, "y_" + split)
            fx = getattr(self, "float_x_" + split)
            if x.dtype != np.int8 or fx.dtype != np.float32:
                raise DataError(f"{self.name}: x_{split} must be int8 and float_x_{split} "
                                f"float32, got {x.dtype} and {fx.dtype}")
            if x.shape[1:] != self.input_shape or fx.shape != x.shape:
                raise DataError(f"{self.name}: x_{split} shape {x.shape} does not match "
                                f"input_shape {self.input_shape} (float twin {fx.shape})")
            want = np.int32 if self.n_classes > 0 else np.int8
            if y.dtype != want or len(y) != len(x):
                raise DataError(f"{self.name}: y_{split} must be {np.dtype(want)} with "
                                f"{len(x)} rows, got {y.dtype} with {len(y)}")
            if self.n_classes > 0 and len(y) and (y.min() < 0 or y.max() >= self.n_classes):
                raise DataError(f"{self.name}: y_{split} has labels outside "
                                f"[0, {self.n_classes})")

    @property
    def task(self) -> str:
        return "classification" if self.n_classes > 0 else "regression"

    @property
    def input_scale(self) -> float:
        """2**input_exp as a float, for reports only."""
        return math.ldexp(1.0, self.input_exp)

    def __repr__(self):
        return (f"Dataset({self.name!r}, train={len(self.x_train)}, test={len(self.x_test)}, "
                f"input_shape={self.input_shape}, n_classes={self.n_classes}, "
                f"input_exp={self.input_exp}, float_range={self.float_range})")


# --------------------------------------------------------------------------- quantization

def _round_half_away(v: np.ndarray) -> np.ndarray:
    """Exact round-half-away-from-zero of float64 (no |v|+0.5 double rounding)."""
    t = np.trunc(v)
    frac = v - t  # exact for float64
    return t + np.where(np.abs(frac) >= 0.5, np.sign(v), 0.0)


def _qmax(bits: int) -> int:
    if not 2 <= bits <= 8:
        raise DataError(f"bits={bits}: inputs are stored as int8, use 2 <= bits <= 8")
    return (1 << (bits - 1)) - 1


def _choose_exp(absmax: float, qmax: int) -> int:
    """Smallest integer e with absmax * 2**-e <= qmax + 1/2 (0 for all-zero data)."""
    if absmax == 0.0:
        return 0
    _, k = math.frexp(absmax)  # absmax = m * 2**k, 0.5 <= m < 1
    e = k - qmax.bit_length()  # absmax * 2**-e < 2**bit_length: close to the answer
    while math.ldexp(absmax, -e) > qmax + 0.5:
        e += 1
    while math.ldexp(absmax, -(e - 1)) <= qmax + 0.5:
        e -= 1
    return e


def quantize_inputs(x_float, bits: int = 8, exp: int | None = None, *, what: str = "x"):
    """Quantize to int8 codes with scale 2**exp.  exp=None chooses it from this data (use
    that on the training set); pass the training exp to quantize test data identically.
    Returns (q int8 array, exp).  Raises DataError on NaN/inf."""
    qmax = _qmax(bits)
    x = np.asarray(x_float, dtype=np.float64)
    _check_finite(x, what)
    if exp is None:
        exp = _choose_exp(float(np.max(np.abs(x))) if x.size else 0.0, qmax)
    q = np.clip(_round_half_away(np.ldexp(x, -int(exp))), -qmax, qmax)
    return q.astype(np.int8), int(exp)


def dequantize(q, exp: int) -> np.ndarray:
    """q * 2**exp as float32 (reports and float twins only)."""
    return np.ldexp(np.asarray(q, dtype=np.float64), int(exp)).astype(np.float32)


# --------------------------------------------------------------------------- validation

def _check_finite(x: np.ndarray, what: str, columns=None):
    """Raise naming how many NaN/inf values there are and in which columns (feature
    index after the sample axis, or `columns[i]` names when given)."""
    if not np.issubdtype(x.dtype, np.floating):
        return
    bad = ~np.isfinite(x)
    if not bad.any():
        return
    n_nan, n_inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
    kinds = " and ".join(s for s in (f"{n_nan} NaN" if n_nan else "",
                                     f"{n_inf} inf" if n_inf else "") if s)
    where = ""
    if x.ndim >= 2:
        cols = np.flatnonzero(bad.reshape(len(x), -1).any(axis=0))
        names = [repr(columns[c]) if columns is not None else str(c) for c in cols[:5]]
        more = f" (and {len(cols) - 5} more)" if len(cols) > 5 else ""
        where = f" in column{'s' if len(cols) > 1 else ''} {', '.join(names)}{more}"
    raise DataError(f"{what} has {kinds} values{where}: clean or impute them before training")


def _labels(y: np.ndarray, what: str) -> np.ndarray:
    """Class labels as int64, or DataError if they are not non-negative integers."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise DataError(f"{what} has shape {y.shape}: class labels must be one integer per "
                        "sample (convert one-hot labels with argmax)")
    if y.dtype.kind in "USO":
        raise DataError(f"{what} holds {y.dtype} values such as {y[:1].tolist()}: map class "
                        "names to integers 0..K-1 first")
    if y.dtype.kind == "b":
        y = y.astype(np.int64)
    if y.dtype.kind == "f":
        _check_finite(y, what)
        frac = y != np.round(y)
        if frac.any():
            raise DataError(f"{what} has {int(frac.sum())} non-integer labels (e.g. "
                            f"{y[frac][0]!r}): class labels must be integers 0..K-1; for "
                            "real-valued targets use task='regression'")
    if y.dtype.kind not in "iuf":
        raise DataError(f"{what} has unsupported dtype {y.dtype}: use integer labels")
    if len(y) and y.min() < 0:
        raise DataError(f"{what} has {int((y < 0).sum())} negative labels (min {y.min()}): "
                        "class labels must be 0..K-1; remap them")
    if len(y) and y.max() >= MAX_CLASSES:
        raise DataError(f"{what} has label {y.max():.0f}: class labels must be 0..K-1 with K <= "
                        f"{MAX_CLASSES} (the device protocol sends them as uint16); remap them")
    return y.astype(np.int64)


def _check_xy(x: np.ndarray, y: np.ndarray, what: str):
    if len(x) != len(y):
        raise DataError(f"{what}: x has {len(x)} samples but y has {len(y)}: they must "
                        "have one label per sample")
    if len(x) == 0:
        raise DataError(f"{what} is empty: it needs at least one sample")
    if x.ndim < 2 or 0 in x.shape[1:]:
        raise DataError(f"{what}: x has shape {x.shape}: expected (samples, features...) "
                        "with at least one feature")
    if x.dtype.kind not in "biuf":
        raise DataError(f"{what}: x has dtype {x.dtype}: inputs must be numbers")


# --------------------------------------------------------------------------- construction

def _split(x, y, test_fraction: float, seed: int):
    """Deterministic, unstratified split by a seeded permutation (numpy PCG64)."""
    if not 0.0 < test_fraction < 1.0:
        raise DataError(f"test_fraction={test_fraction}: use a value strictly between 0 and 1")
    n = len(x)
    n_test = min(max(int(round(n * test_fraction)), 1), n - 1) if n > 1 else 0
    if n_test == 0:
        raise DataError(f"only {n} sample(s): need at least 2 to split into train and test")
    perm = np.random.default_rng(seed).permutation(n)
    te, tr = perm[:n_test], perm[n_test:]
    return x[tr], y[tr], x[te], y[te]


def from_arrays(x_train, y_train, x_test, y_test, *, name: str = "arrays",
                input_shape=None, n_classes: int | None = None,
                task: str = "classification", bits: int = 8, source: str = "") -> Dataset:
    """Validate float (or integer) arrays and quantize them into a Dataset.
    input_shape defaults to x_train.shape[1:]; n_classes defaults to max label + 1."""
    where = source or name
    xs = []
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        x, y = np.asarray(x), np.asarray(y)
        _check_xy(x, y, f"{where} ({split} split)")
        xs.append((x, y))
    (xtr, ytr), (xte, yte) = xs
    shape = tuple(input_shape) if input_shape is not None else xtr.shape[1:]
    try:
        xtr = xtr.reshape((len(xtr),) + shape)
        xte = xte.reshape((len(xte),) + shape)
    except ValueError:
        raise DataError(f"{where}: samples of shape {xs[0][0].shape[1:]} / "
                        f"{xs[1][0].shape[1:]} do not fit input_shape {shape}") from None
    for split, x in (("train", xtr), ("test", xte)):
        big = np.argwhere(np.isfinite(x) & (np.abs(x) > F32_MAX)) if x.dtype.kind == "f" else []
        if len(big):  # NaN/inf: reported by quantize_inputs
            idx = tuple(int(i) for i in big[0])
            raise DataError(f"{where}: x_{split}{list(idx)} = {x[idx]:g} is beyond the float32 range "
                            f"(+-{F32_MAX:.3g}): rescale the inputs")
    qtr, exp = quantize_inputs(xtr, bits, what=f"{where} x_train")
    qte, _ = quantize_inputs(xte, bits, exp, what=f"{where} x_test")
    ftr = xtr.astype(np.float32)
    rng = (float(ftr.min()), float(ftr.max()))
    target_exp = None
    if task == "classification":
        ytr = _labels(ytr, f"{where} y_train")
        yte = _labels(yte, f"{where} y_test")
        top = int(max(ytr.max(), yte.max()))
        if n_classes is None:
            n_classes = top + 1
            seen = np.union1d(ytr, yte)  # sorted: the first seen[i] != i is the first gap
            if len(seen) < n_classes:
                gap = int(np.flatnonzero(seen != np.arange(len(seen)))[0])
                raise DataError(f"{where}: labels go up to {top} but only {len(seen)} distinct values "
                                f"occur (label {gap} never does): classes must be 0..K-1 with every "
                                "class present; remap them, e.g. numpy.unique(y, return_inverse=True)")
        elif top >= n_classes:
            raise DataError(f"{where}: label {top} is out of range for n_classes={n_classes}: "
                            f"labels must be 0..{n_classes - 1} (or pass n_classes={top + 1})")
        if n_classes < 2:
            raise DataError(f"{where}: only one class (label 0): classification needs at "
                            "least two")
        ytr, yte = ytr.astype(np.int32), yte.astype(np.int32)
    elif task == "regression":
        ytr, target_exp = quantize_inputs(ytr, bits, what=f"{where} y_train")
        yte, _ = quantize_inputs(yte, bits, target_exp, what=f"{where} y_test")
        n_classes = 0
    else:
        raise DataError(f"task={task!r}: use 'classification' or 'regression'")
    return Dataset(name=name, x_train=qtr, y_train=ytr, x_test=qte, y_test=yte,
                   input_shape=shape, n_classes=int(n_classes), input_exp=exp,
                   float_range=rng, float_x_train=ftr, float_x_test=xte.astype(np.float32),
                   input_bits=bits, target_exp=target_exp, source=source)


# --------------------------------------------------------------------------- built-ins

def load_digits(layout: str = "flat", bits: int = 8) -> Dataset:
    """sklearn 8x8 digits (pixels 0..16), the W1/W3 split: 1437 train / 360 test.
    layout "flat" -> (64,), "image" -> (8, 8, 1) channels-last."""
    from sklearn.datasets import load_digits as sk_digits
    from sklearn.model_selection import train_test_split

    shapes = {"flat": (64,), "image": (8, 8, 1)}
    if layout not in shapes:
        raise DataError(f"layout={layout!r}: use 'flat' or 'image'")
    X, y = sk_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(X, y, test_size=360, random_state=0, stratify=y)
    name = "digits" if layout == "flat" else "digits-image"
    return from_arrays(xtr, ytr, xte, yte, name=name, input_shape=shapes[layout],
                       n_classes=10, bits=bits, source="sklearn.datasets.load_digits")


def cache_dir() -> Path:
    """$TINYTRAIN_CACHE, else $XDG_CACHE_HOME/tinytrain, else ~/.cache/tinytrain."""
    if os.environ.get("TINYTRAIN_CACHE"):
        return Path(os.environ["TINYTRAIN_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "tinytrain"


def _mnist1d_arrays(args: dict | None, cache: Path | None):
    """Generate MNIST-1D locally (never its download path) and cache the arrays in an
    .npz keyed by the generation args and package version."""
    from importlib.metadata import version

    overrides = dict(args or {})
    ver = version("mnist1d")
    key = hashlib.sha256(json.dumps([ver, sorted(overrides.items())], default=str)
                         .encode()).hexdigest()[:16]
    path = (cache or cache_dir()) / f"mnist1d-{key}.npz"
    names = ("x", "y", "x_test", "y_test")
    if path.exists():
        try:
            with np.load(path) as f:
                return tuple(f[k] for k in names)
        except Exception:  # corrupt/partial cache: regenerate below
            pass
    import mnist1d.data as m1d

    full = m1d.get_dataset_args(as_dict=True)
    unknown = set(overrides) - set(full)
    if unknown:
        raise DataError(f"unknown mnist1d args {sorted(unknown)}: known are {sorted(full)}")
    full.update(overrides)
    # make_dataset reseeds numpy's and Python's global RNGs; leave the caller's untouched.
    np_state, py_state = np.random.get_state(), random.getstate()
    try:
        d = m1d.make_dataset(m1d.ObjectView(full))
    finally:
        np.random.set_state(np_state)
        random.setstate(py_state)
    arrays = tuple(np.asarray(d[k]) for k in names)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, **dict(zip(names, arrays)))
    os.replace(tmp, path)  # atomic: concurrent writers produce identical files
    return arrays


MNIST1D_MAX_TRAIN = 2_000_000  # 2.5M generated signals: ~1 GB of float64 while generating


def mnist1d_args(n_train: int) -> dict:
    """Generation args for MNIST-1D with `n_train` training samples and the generator's
    defaults otherwise: num_samples = the smallest multiple of 10 (the generator makes
    num_samples // 10 per class) whose train split (train_split, 0.8) holds n_train; the
    train split is then cut to its first n_train samples, the test split kept whole.
    n_train 4000 gives the default dataset exactly (5000 samples, 4000 / 1000)."""
    n = int(n_train)
    split = 0.8  # mnist1d's default train_split, checked against the package in the tests
    num = max(10, (n * 10 // 8) // 10 * 10 - 10)  # just below the answer; step up exactly
    while int(num * split) < n:
        num += 10
    return {"num_samples": num}


def parse_mnist1d(spec: str) -> tuple[str, int | None]:
    """"mnist1d", "mnist1d-flat", "mnist1d:N", "mnist1d-flat:N" -> (layout, N or None)."""
    base, sep, n = spec.partition(":")
    layout = {"mnist1d": "signal", "mnist1d-flat": "flat"}[base]
    if not sep:
        return layout, None
    if not n.strip().isdigit() or not 10 <= int(n) <= MNIST1D_MAX_TRAIN:
        raise DataError(f"--data {spec!r}: N in {base}:N is the number of training samples, an "
                        f"integer from 10 to {MNIST1D_MAX_TRAIN:,}, e.g. {base}:100000")
    return layout, int(n)


def load_mnist1d(layout: str = "signal", bits: int = 8, args: dict | None = None,
                 cache: str | os.PathLike | None = None, n_train: int | None = None) -> Dataset:
    """MNIST-1D generated locally with its default arguments (4000 train / 1000 test,
    40 samples per signal), cached under cache_dir().  layout "signal" -> (40, 1)
    channels-last for a 1-D CNN, "flat" -> (40,).  args overrides generation arguments;
    n_train: that many training samples (mnist1d_args), the dataset named "mnist1d:N"."""
    if layout not in ("signal", "flat"):
        raise DataError(f"layout={layout!r}: use 'signal' or 'flat'")
    if n_train is not None:
        if args and "num_samples" in args:
            raise DataError("give n_train or args['num_samples'], not both")
        args = {**(args or {}), **mnist1d_args(n_train)}
    x, y, xt, yt = _mnist1d_arrays(args, Path(cache) if cache else None)
    if n_train is not None:
        x, y = x[:n_train], y[:n_train]
    shape = (x.shape[1], 1) if layout == "signal" else (x.shape[1],)
    name = "mnist1d" if layout == "signal" else "mnist1d-flat"
    if n_train is not None:
        name += f":{n_train}"
    return from_arrays(x, y, xt, yt, name=name, input_shape=shape, n_classes=10,
                       bits=bits, source="mnist1d.data.make_dataset")


BUILTINS = {
    "digits": lambda **kw: load_digits("flat", **kw),
    "digits-image": lambda **kw: load_digits("image", **kw),
    "mnist1d": lambda **kw: load_mnist1d("signal", **kw),
    "mnist1d-flat": lambda **kw: load_mnist1d("flat", **kw),
}


# --------------------------------------------------------------------------- files

def _existing(path) -> Path:
    p = Path(path)
    if not p.exists():
        raise DataError(f"{p}: no such file or directory (built-in datasets are "
                        f"{', '.join(BUILTINS)})")
    return p


def load_npz(path, *, test_fraction: float = 0.2, seed: int = 0, task="classification",
             n_classes=None, input_shape=None, bits: int = 8) -> Dataset:
    """.npz with x_train/y_train/x_test/y_test, or x/y split by `_split(test_fraction,
    seed)`.  Inputs keep their stored shape (store images channels-last)."""
    p = _existing(path)
    try:
        with np.load(p, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except ValueError as e:
        raise DataError(f"{p}: cannot read as .npz without pickles ({e}): save plain "
                        "numeric arrays with numpy.savez") from None
    full, pair = ("x_train", "y_train", "x_test", "y_test"), ("x", "y")
    if all(k in arrays for k in full):
        parts = [arrays[k] for k in full]
    elif all(k in arrays for k in pair):
        x, y = arrays["x"], arrays["y"]
        _check_xy(x, y, str(p))
        xtr, ytr, xte, yte = _split(x, y, test_fraction, seed)
        parts = [xtr, ytr, xte, yte]
    else:
        raise DataError(f"{p} has keys {sorted(arrays)}: expected x_train, y_train, x_test, "
                        "y_test (or x and y to split)")
    return from_arrays(*parts, name=p.stem, source=str(p), task=task, n_classes=n_classes,
                       input_shape=input_shape, bits=bits)


F32_MAX = float(np.finfo(np.float32).max)
#: most classes a dataset may have: labels travel to the device as uint16 (protocol.md)
MAX_CLASSES = 65535

_MISSING = {"", "na", "n/a", "nan", "null", "none", "?"}


def _cell(s: str) -> float:
    s = s.strip()
    return math.nan if s.lower() in _MISSING else float(s)


def _read_csv(p: Path, delimiter: str, header):
    try:
        with open(p, newline="", encoding="utf-8") as f:
            reader = csv.reader(f, delimiter=delimiter)
            rows = [(reader.line_num, row) for row in reader if any(c.strip() for c in row)]
    except UnicodeDecodeError as e:
        raise DataError(f"{p}: not UTF-8 text (byte 0x{e.object[e.start]:02x} at offset {e.start}): "
                        "is it a binary file? CSV data must be UTF-8 (or ASCII) numbers; re-save "
                        "it as UTF-8") from None
    except csv.Error as e:  # e.g. a NUL byte: a binary file
        raise DataError(f"{p} line {reader.line_num}: {e}: is it a binary file? CSV data must be "
                        "text") from None
    if not rows:
        raise DataError(f"{p} is empty: it needs at least one row of data")
    first = rows[0][1]
    if header is None:  # a header is a first row with a cell that is not a number
        header = False
        for c in first:
            try:
                _cell(c)
            except ValueError:
                header = True
    names = [c.strip() for c in first] if header else None
    if header:
        rows = rows[1:]
    width = len(first)
    for line, row in rows:
        if len(row) != width:
            raise DataError(f"{p} line {line} has {len(row)} fields, expected {width}: "
                            "every row needs the same number of columns")
    if not rows:
        raise DataError(f"{p} has a header but no data rows")
    try:
        table = np.array([row for _, row in rows], dtype=np.float64)
    except ValueError:  # slow path: missing-value tokens, or find the bad cell
        table = np.empty((len(rows), width))
        for i, (line, row) in enumerate(rows):
            for j, c in enumerate(row):
                try:
                    table[i, j] = _cell(c)
                except ValueError:
                    col = repr(names[j]) if names else str(j)
                    raise DataError(f"{p} line {line}, column {col}: {c!r} is not a number: "
                                    "CSV data must be numeric (encode categories as "
                                    "integers)") from None
    big = np.abs(table) > F32_MAX  # NaN compares False: reported later as missing
    if big.any():
        i, j = np.argwhere(big)[0]
        col = repr(names[j]) if names else str(j)
        raise DataError(f"{p} line {rows[i][0]}, column {col}: {rows[i][1][j].strip()} is beyond the "
                        f"float32 range (+-{F32_MAX:.3g}): rescale that column")
    return table, names


def load_csv(path, *, label_column=-1, header=None, delimiter=None, test_path=None,
             test_fraction: float = 0.2, seed: int = 0, task="classification",
             n_classes=None, input_shape=None, bits: int = 8) -> Dataset:
    """CSV/TSV of numbers, one sample per row.  label_column: index (negative counts from
    the end, default last) or header name.  header None auto-detects (first row has a
    non-numeric cell).  Missing cells (empty, NA, nan, ?) count as NaN and are rejected.
    test_path gives a separate test file; otherwise rows are split by (test_fraction, seed)."""
    p = _existing(path)
    delim = delimiter or ("\t" if p.suffix.lower() in (".tsv", ".tab") else ",")

    def read(q: Path):
        table, names = _read_csv(q, delim, header)
        w = table.shape[1]
        if isinstance(label_column, str):
            if not names or label_column not in names:
                raise DataError(f"{q}: no column named {label_column!r} (header: {names}): "
                                "pass label_column as a name from the header or an index")
            j = names.index(label_column)
        elif -w <= label_column < w:
            j = label_column % w
        else:
            raise DataError(f"{q}: label_column={label_column} but the file has {w} columns")
        if w < 2:
            raise DataError(f"{q} has one column: need features plus a label column")
        keep = [k for k in range(w) if k != j]
        cols = [names[k] for k in keep] if names else keep
        x, y = table[:, keep], table[:, j]
        _check_finite(x, str(q), cols)
        label = repr(names[j]) if names else str(j)
        _check_finite(y, f"{q} label column {label}")
        return x, y

    x, y = read(p)
    if test_path is not None:
        xt, yt = read(_existing(test_path))
        if xt.shape[1] != x.shape[1]:
            raise DataError(f"{test_path} has {xt.shape[1]} feature columns but {p} has "
                            f"{x.shape[1]}: train and test must have the same columns")
        parts = (x, y, xt, yt)
    else:
        parts = _split(x, y, test_fraction, seed)
    return from_arrays(*parts, name=p.stem, source=str(p), task=task, n_classes=n_classes,
                       input_shape=input_shape, bits=bits)


# IDX (the MNIST format): magic = 0x00 0x00 <dtype code> <ndim>, then ndim big-endian
# uint32 dims, then the data big-endian, row-major.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_IDX_CODES = {np.dtype(v).newbyteorder("="): k for k, v in _IDX_DTYPES.items()}


def read_idx(path) -> np.ndarray:
    """Read an IDX file (gzip detected from content).  Returns a native-endian array."""
    p = _existing(path)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as e:
            raise DataError(f"{p}: corrupt gzip data ({e}): download the file again") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] not in _IDX_DTYPES or raw[3] == 0:
        magic = raw[:4].hex() if raw else "(empty file)"
        raise DataError(f"{p}: wrong IDX magic number {magic}: expected 0000TTNN with type "
                        "TT in 08,09,0b,0c,0d,0e and NN dimensions; is this an IDX file?")
    dtype, ndim = np.dtype(_IDX_DTYPES[raw[2]]), raw[3]
    if len(raw) < 4 + 4 * ndim:
        raise DataError(f"{p}: truncated IDX header ({ndim} dimensions declared)")
    dims = tuple(int(d) for d in np.frombuffer(raw, ">u4", ndim, 4))
    want = math.prod(dims) * dtype.itemsize
    body = raw[4 + 4 * ndim:]
    if len(body) != want:
        raise DataError(f"{p}: IDX dims {dims} need {want} bytes of data, found {len(body)}: "
                        "the file is truncated or not an IDX file")
    return np.frombuffer(body, dtype).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path, array) -> None:
    """Write an IDX file; gzip-compressed when the name ends with .gz."""
    a = np.asarray(array)
    code = _IDX_CODES.get(a.dtype.newbyteorder("="))
    if code is None or not 1 <= a.ndim <= 255:
        raise DataError(f"IDX cannot store dtype {a.dtype} with {a.ndim} dims: use uint8, "
                        "int8, int16, int32, float32 or float64 and 1..255 dims")
    body = (bytes([0, 0, code, a.ndim]) + np.asarray(a.shape, ">u4").tobytes()
            + a.astype(_IDX_DTYPES[code]).tobytes())
    p = Path(path)
    p.write_bytes(gzip.compress(body, mtime=0) if p.suffix == ".gz" else body)


_IDX_ROLE = re.compile(r"(train|t10k|test).*(images|labels)", re.I)


def load_idx_dir(path, *, n_classes=None, bits: int = 8) -> Dataset:
    """A directory with MNIST-named IDX files: {train,t10k|test}-{images,labels}-idxN-ubyte,
    optionally .gz, optionally prefixed (emnist-digits-train-...).  Images of shape
    (N, H, W) become (N, H, W, 1) channels-last."""
    d = _existing(path)
    found: dict[tuple, list] = {}
    for f in sorted(d.iterdir()):
        m = _IDX_ROLE.search(f.name)
        if f.is_file() and m and "idx" in f.name.lower():
            role = "train" if m.group(1).lower() == "train" else "test"
            found.setdefault((role, m.group(2).lower()), []).append(f)
    parts = []
    for key in (("train", "images"), ("train", "labels"), ("test", "images"),
                ("test", "labels")):
        files = found.get(key, [])
        if len(files) != 1:
            what = "no file" if not files else f"{len(files)} files ({[f.name for f in files]})"
            raise DataError(f"{d}: {what} for {key[0]} {key[1]}: expected one file named like "
                            f"{'train' if key[0] == 'train' else 't10k'}-{key[1]}-idx"
                            f"{3 if key[1] == 'images' else 1}-ubyte[.gz]")
        parts.append(read_idx(files[0]))
    xtr, ytr, xte, yte = parts
    if xtr.ndim == 3:
        xtr, xte = xtr[..., None], xte[..., None]
    return from_arrays(xtr, ytr, xte, yte, name=d.name, source=str(d), n_classes=n_classes,
                       input_shape=xtr.shape[1:], bits=bits)


def load(spec, **kwargs) -> Dataset:
    """A built-in name (digits, digits-image, mnist1d, mnist1d-flat, mnist1d:N,
    mnist1d-flat:N with N training samples) or a path: .npz,
    .csv/.tsv, or a directory of MNIST-style IDX files.  kwargs go to the loader."""
    if isinstance(spec, str) and spec in BUILTINS:
        return BUILTINS[spec](**kwargs)
    if isinstance(spec, str) and spec.partition(":")[0] in ("mnist1d", "mnist1d-flat") and ":" in spec:
        layout, n = parse_mnist1d(spec)
        return load_mnist1d(layout, n_train=n, **kwargs)
    p = _existing(spec)
    if p.is_dir():
        return load_idx_dir(p, **kwargs)
    ext = p.suffix.lower()
    if ext == ".npz":
        return load_npz(p, **kwargs)
    if ext in (".csv", ".tsv", ".tab", ".txt"):
        return load_csv(p, **kwargs)
    raise DataError(f"{p}: unsupported file type {ext or '(no extension)'!r}: use .npz, "
                    ".csv/.tsv, a directory of MNIST-style IDX files, or a built-in name "
                    f"({', '.join(BUILTINS)})")


def unit_shift(dataset) -> int:
    """Extra exponent shift that brings the float training range into about [-1, 1]:
    ceil(log2(max |x|)), never negative (data already within [-1, 1] is left alone)."""
    lo, hi = dataset.float_range
    absmax = max(abs(float(lo)), abs(float(hi)))
    if absmax <= 1.0:
        return 0
    return math.ceil(math.log2(absmax))
