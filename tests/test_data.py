"""tinytrain.data: quantization edge cases, built-in splits, file round trips, errors."""

import gzip
import math
import random
import socket

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra import numpy as hnp

from tinytrain import data as D
from tinytrain.data import DataError, dequantize, quantize_inputs


# ------------------------------------------------------------------ quantization

@pytest.mark.parametrize("k", range(-12, 13))
@pytest.mark.parametrize("sign", [1, -1])
def test_exact_power_of_two_max_maps_to_64(k, sign):
    # 2**k * 2**-(k-7) = 128 > 127.5, so the exponent is k-6 and 2**k -> 64.
    q, e = quantize_inputs([sign * 2.0**k, 0.0])
    assert e == k - 6 and q.tolist() == [sign * 64, 0]


@pytest.mark.parametrize("k", range(-4, 5))
def test_near_power_of_two_boundaries(k):
    s = 2.0**k
    q, e = quantize_inputs([127.0 * s])
    assert (q.tolist(), e) == ([127], k)
    q, e = quantize_inputs([127.5 * s])  # tie: rounds to 128, saturates to 127 (half step)
    assert (q.tolist(), e) == ([127], k)
    q, e = quantize_inputs([np.nextafter(127.5, 200) * s])
    assert (q.tolist(), e) == ([64], k + 1)
    q, e = quantize_inputs([np.nextafter(2.0**k, 0)])  # just below 2**k: 127.99.. at k-7
    assert e == k - 6 and q.tolist() == [64]


def test_all_zeros_and_empty():
    q, e = quantize_inputs(np.zeros((3, 4)))
    assert e == 0 and q.dtype == np.int8 and not q.any()
    q, e = quantize_inputs(np.zeros((0, 4)))
    assert e == 0 and q.shape == (0, 4)


def test_round_half_away_from_zero():
    q, e = quantize_inputs([0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 0.49999999999999994, 3.0], exp=0)
    assert e == 0 and q.tolist() == [1, -1, 2, -2, 3, -3, 0, 3]


def test_negative_values_symmetric():
    x = np.array([-3.7, -0.01, 2.2, 9.9, -10.0])
    q, e = quantize_inputs(x)
    qn, en = quantize_inputs(-x)
    assert e == en and (qn == -q).all()
    assert q.min() >= -127


def test_saturation_of_test_data_with_train_exponent():
    _, e = quantize_inputs([1.0])  # e = -6
    q, e2 = quantize_inputs([5.0, -5.0, 1.0, -1e30], exp=e)
    assert e2 == e and q.tolist() == [127, -127, 64, -127]  # never -128


@pytest.mark.parametrize("bits,qmax", [(2, 1), (4, 7), (8, 127)])
def test_bits(bits, qmax):
    q, e = quantize_inputs([1.0, -1.0, 1e9], bits=bits, exp=-10)
    assert q.tolist() == [qmax, -qmax, qmax]
    q, e = quantize_inputs([float(qmax)], bits=bits)
    assert (q.tolist(), e) == ([qmax], 0)


def test_bad_bits():
    with pytest.raises(DataError, match="bits=9"):
        quantize_inputs([1.0], bits=9)


def test_nan_inf_rejected_with_column():
    x = np.ones((5, 10))
    x[1, 7] = np.nan
    x[3, 7] = np.nan
    x[2, 2] = np.inf
    with pytest.raises(DataError, match=r"x_test has 2 NaN and 1 inf values in columns 2, 7: "
                                        r"clean or impute them before training"):
        quantize_inputs(x, exp=-3, what="x_test")


def test_dequantize_exact():
    q = np.array([-127, -1, 0, 1, 127], np.int8)
    assert dequantize(q, -3).tolist() == [-127 / 8, -1 / 8, 0, 1 / 8, 127 / 8]
    assert dequantize(q, 2).dtype == np.float32


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(max_dims=3, max_side=6),
                  elements=st.floats(-1e30, 1e30, allow_subnormal=False)),
       st.integers(2, 8))
def test_quantize_properties(x, bits):
    qmax = 2 ** (bits - 1) - 1
    q, e = quantize_inputs(x, bits=bits)
    assert q.dtype == np.int8 and q.shape == x.shape
    assert np.abs(q.astype(int)).max(initial=0) <= qmax
    # every training value is within half a step, and the exponent is the smallest such
    assert (np.abs(q * 2.0**e - x) <= 2.0**(e - 1)).all()
    m = np.abs(x).max(initial=0.0)
    if m > 0:
        # ldexp: 2.0**-e alone overflows for the tiniest normal floats (e near -1024)
        assert math.ldexp(m, -e) <= qmax + 0.5 < math.ldexp(m, -(e - 1))
    # requantizing the dequantized codes is the identity
    q2, _ = quantize_inputs(q * 2.0**e, bits=bits, exp=e)
    assert (q2 == q).all()


# ------------------------------------------------------------------ built-ins

def test_digits_exact_split():
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = D.load("digits")
    X, y = load_digits(return_X_y=True)
    xtr, xte, ytr, yte = train_test_split(X, y, test_size=360, random_state=0, stratify=y)
    assert (len(d.x_train), len(d.x_test)) == (1437, 360)
    assert d.input_shape == (64,) and d.n_classes == 10 and d.task == "classification"
    assert (d.float_x_train == xtr).all() and (d.y_test == yte).all()
    assert d.y_train.dtype == np.int32 and d.x_train.dtype == np.int8
    assert d.input_exp == -2 and d.float_range == (0.0, 16.0)
    assert (d.x_train == 4 * xtr).all()  # pixel values 0..16 are exact multiples of 2**-2
    # stratified: every class's test share matches its overall share to within one sample
    for c in range(10):
        assert abs((d.y_test == c).sum() - 360 * (y == c).mean()) < 1
    img = D.load_digits(layout="image")
    assert img.input_shape == (8, 8, 1) and img.x_train.shape == (1437, 8, 8, 1)
    assert (img.x_train.reshape(1437, 64) == d.x_train).all()


@pytest.fixture(scope="module")
def mnist1d():
    return D.load_mnist1d()


def test_mnist1d_shapes(mnist1d):
    d = mnist1d
    assert d.x_train.shape == (4000, 40, 1) and d.x_test.shape == (1000, 40, 1)
    assert d.input_shape == (40, 1) and d.n_classes == 10
    assert set(np.unique(d.y_train)) == set(range(10))
    assert np.abs(d.x_train.astype(int)).max() <= 127
    flat = D.load("mnist1d-flat")
    assert flat.input_shape == (40,) and (flat.x_test.reshape(1000, 40, 1) == d.x_test).all()


def test_mnist1d_generates_offline_and_matches_cache(mnist1d, tmp_path, monkeypatch):
    def no_network(*a, **k):
        raise AssertionError("mnist1d tried to use the network")
    monkeypatch.setattr(socket.socket, "connect", no_network)
    np.random.seed(123)
    random.seed(123)
    before = np.random.random(), random.random()
    np.random.seed(123)
    random.seed(123)
    d = D.load_mnist1d(cache=tmp_path)
    assert (np.random.random(), random.random()) == before  # global RNGs untouched
    (cached,) = tmp_path.iterdir()  # same key as the default cache the fixture used
    assert cached.name.startswith("mnist1d-") and (D.cache_dir() / cached.name).exists()
    assert (d.x_train == mnist1d.x_train).all() and (d.y_test == mnist1d.y_test).all()
    assert (D.load_mnist1d(cache=tmp_path).x_test == d.x_test).all()  # from the new cache


def test_mnist1d_unknown_arg(tmp_path):
    with pytest.raises(DataError, match="unknown mnist1d args"):
        D.load_mnist1d(args={"nope": 1}, cache=tmp_path)


# ------------------------------------------------------------------ npz

def test_npz_round_trip_full(tmp_path):
    rng = np.random.default_rng(0)
    a = {"x_train": rng.normal(size=(20, 4, 3)), "y_train": np.arange(20) % 3,
         "x_test": rng.normal(size=(6, 4, 3)), "y_test": np.arange(6) % 3}
    np.savez(tmp_path / "toy.npz", **a)
    d = D.load(tmp_path / "toy.npz")
    assert d.name == "toy" and d.input_shape == (4, 3) and d.n_classes == 3
    assert (d.float_x_train == a["x_train"].astype(np.float32)).all()
    q, e = quantize_inputs(a["x_test"], exp=d.input_exp)
    assert (d.x_test == q).all() and (d.y_test == a["y_test"]).all()


def test_npz_xy_split_is_deterministic(tmp_path):
    x = np.arange(100, dtype=float).reshape(50, 2)
    y = np.arange(50) % 5
    np.savez(tmp_path / "xy.npz", x=x, y=y)
    a = D.load_npz(tmp_path / "xy.npz", test_fraction=0.2, seed=7)
    b = D.load_npz(tmp_path / "xy.npz", test_fraction=0.2, seed=7)
    c = D.load_npz(tmp_path / "xy.npz", test_fraction=0.2, seed=8)
    assert (len(a.x_train), len(a.x_test)) == (40, 10)
    assert (a.float_x_test == b.float_x_test).all() and (a.float_x_test != c.float_x_test).any()
    got = np.sort(np.concatenate([a.float_x_train[:, 0], a.float_x_test[:, 0]]))
    assert (got == x[:, 0]).all()  # a partition: nothing lost or duplicated


def test_npz_bad_keys(tmp_path):
    np.savez(tmp_path / "k.npz", inputs=np.zeros((3, 2)))
    with pytest.raises(DataError, match=r"has keys \['inputs'\]: expected x_train"):
        D.load(tmp_path / "k.npz")


def test_regression_targets(tmp_path):
    x = np.linspace(-1, 1, 40).reshape(20, 2)
    np.savez(tmp_path / "r.npz", x=x, y=x.sum(1) * 3)
    d = D.load(tmp_path / "r.npz", task="regression")
    assert d.task == "regression" and d.n_classes == 0 and d.y_train.dtype == np.int8
    assert d.target_exp == -4  # max |y| = 6: 6 * 2**4 = 96 fits, 6 * 2**5 = 192 does not


# ------------------------------------------------------------------ CSV

def test_csv_header_autodetect_and_label_by_name(tmp_path):
    p = tmp_path / "h.csv"
    rows = [f"{i},{-i / 2},{i % 3}" for i in range(10)]
    p.write_text("a,b,label\n" + "\n".join(rows) + "\n\n")
    d = D.load(p, label_column="label", test_fraction=0.3)
    assert (len(d.x_train), len(d.x_test)) == (7, 3) and d.input_shape == (2,)
    allx = np.concatenate([d.float_x_train, d.float_x_test])
    ally = np.concatenate([d.y_train, d.y_test])
    assert ((allx[:, 0] % 3) == ally).all() and (allx[:, 1] == -allx[:, 0] / 2).all()
    p2 = tmp_path / "n.csv"
    p2.write_text("\n".join(rows))
    d2 = D.load(p2, test_fraction=0.3)  # no header: first row is data
    assert len(d2.x_train) + len(d2.x_test) == 10
    assert (d2.float_x_test == d.float_x_test).all()


def test_csv_label_column_index_tsv_and_test_path(tmp_path):
    tr, te = tmp_path / "tr.tsv", tmp_path / "te.tsv"
    tr.write_text("".join(f"{i % 2}\t{i}\t{2 * i}\n" for i in range(8)))
    te.write_text("".join(f"{i % 2}\t{i}\t{2 * i}\n" for i in range(3)))
    d = D.load_csv(tr, label_column=0, test_path=te)
    assert (d.y_train == np.arange(8) % 2).all() and d.float_x_test[:, 1].tolist() == [0, 2, 4]


def test_csv_nan_names_column(tmp_path):
    p = tmp_path / "foo.csv"
    p.write_text("a,b,c,y\n" + "1,2,,0\n1,NA,3,1\n1,nan,3,0\n4,5,6,1\n")
    with pytest.raises(DataError, match=r"foo.csv has 3 NaN values in columns 'b', 'c': "
                                        "clean or impute them before training"):
        D.load(p)
    p.write_text("1,2,0\n1,nan,1\n")
    with pytest.raises(DataError, match=r"has 1 NaN values in column 1: clean or impute"):
        D.load(p)


def test_csv_non_numeric_and_ragged(tmp_path):
    p = tmp_path / "bad.csv"
    p.write_text("x,y\n1,0\nabc,1\n")
    with pytest.raises(DataError, match=r"line 3, column 'x': 'abc' is not a number"):
        D.load(p)
    p.write_text("1,2,0\n1,2\n")
    with pytest.raises(DataError, match=r"line 2 has 2 fields, expected 3"):
        D.load(p)


@pytest.mark.parametrize("labels,kw,msg", [
    ("0 1 1.5 0", {}, r"1 non-integer labels .*task='regression'"),
    ("0 -1 1 0", {}, r"1 negative labels"),
    ("0 1 5 0", {"n_classes": 3}, r"label 5 is out of range for n_classes=3"),
    ("0 0 0 0", {}, r"only one class"),
])
def test_label_errors(tmp_path, labels, kw, msg):
    p = tmp_path / "l.csv"
    p.write_text("".join(f"{i},{lab}\n" for i, lab in enumerate(labels.split())))
    with pytest.raises(DataError, match=msg):
        D.load(p, test_fraction=0.5, **kw)


def test_csv_empty_and_missing_label_name(tmp_path):
    p = tmp_path / "e.csv"
    p.write_text("\n\n")
    with pytest.raises(DataError, match="is empty"):
        D.load(p)
    p.write_text("a,b\n1,0\n2,1\n")
    with pytest.raises(DataError, match="no column named 'y'"):
        D.load(p, label_column="y")


# ------------------------------------------------------------------ IDX

@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32,
                                   np.float64])
@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_idx_round_trip(tmp_path, dtype, suffix):
    a = (np.arange(2 * 3 * 5) - 7).astype(dtype).reshape(2, 3, 5)
    p = tmp_path / f"a-idx3{suffix}"
    D.write_idx(p, a)
    b = D.read_idx(p)
    assert b.dtype == np.dtype(dtype) and b.shape == a.shape and (b == a).all()
    if suffix:
        assert p.read_bytes()[:2] == b"\x1f\x8b"


def test_idx_header_bytes(tmp_path):
    D.write_idx(tmp_path / "l", np.array([3, 1, 4], np.uint8))
    assert (tmp_path / "l").read_bytes() == bytes.fromhex("00000801 00000003 030104")


def test_idx_bad_magic_and_truncated(tmp_path):
    p = tmp_path / "x-idx"
    p.write_bytes(b"PK\x03\x04junk")
    with pytest.raises(DataError, match="wrong IDX magic number 504b0304"):
        D.read_idx(p)
    p.write_bytes(gzip.compress(bytes.fromhex("00000801 00000005 0102")))
    with pytest.raises(DataError, match=r"need 5 bytes of data, found 2"):
        D.read_idx(p)


def _mnist_dir(root, gz, prefix=""):
    rng = np.random.default_rng(1)
    ext = ".gz" if gz else ""
    arrays = {"train-images-idx3-ubyte": rng.integers(0, 256, (12, 4, 5), dtype=np.uint8),
              "train-labels-idx1-ubyte": (np.arange(12) % 10).astype(np.uint8),
              "t10k-images-idx3-ubyte": rng.integers(0, 256, (4, 4, 5), dtype=np.uint8),
              "t10k-labels-idx1-ubyte": np.arange(4, dtype=np.uint8)}
    root.mkdir()
    for name, a in arrays.items():
        D.write_idx(root / (prefix + name + ext), a)
    return arrays


@pytest.mark.parametrize("gz,prefix", [(False, ""), (True, ""), (True, "emnist-digits-")])
def test_idx_directory(tmp_path, gz, prefix):
    arrays = _mnist_dir(tmp_path / "mnist", gz, prefix)
    d = D.load(tmp_path / "mnist", n_classes=10)
    assert d.input_shape == (4, 5, 1) and d.n_classes == 10 and d.name == "mnist"
    assert (d.float_x_train[..., 0] == arrays["train-images-idx3-ubyte"]).all()
    assert (d.y_test == arrays["t10k-labels-idx1-ubyte"]).all()
    assert d.input_exp == 1  # 255 / 2 = 127.5 -> half a step, saturates to 127


def test_idx_directory_missing_file(tmp_path):
    _mnist_dir(tmp_path / "m", gz=False)
    (tmp_path / "m" / "t10k-labels-idx1-ubyte").unlink()
    with pytest.raises(DataError, match=r"no file for test labels: expected one file named "
                                        r"like t10k-labels-idx1-ubyte\[.gz\]"):
        D.load(tmp_path / "m")


# ------------------------------------------------------------------ dispatch and shapes

def test_load_unsupported_and_missing(tmp_path):
    p = tmp_path / "x.parquet"
    p.write_bytes(b"")
    with pytest.raises(DataError, match=r"unsupported file type '.parquet': use .npz"):
        D.load(p)
    with pytest.raises(DataError, match=r"nope.csv: no such file or directory \(built-in "
                                        r"datasets are digits"):
        D.load(tmp_path / "nope.csv")
    with pytest.raises(DataError, match="no such file"):
        D.load("digitz")


def test_from_arrays_errors():
    x, y = np.zeros((4, 2)), np.array([0, 1, 0, 1])
    with pytest.raises(DataError, match=r"x has 4 samples but y has 3"):
        D.from_arrays(x, y[:3], x, y)
    with pytest.raises(DataError, match=r"\(test split\) is empty"):
        D.from_arrays(x, y, x[:0], y[:0])
    with pytest.raises(DataError, match=r"map class names to integers"):
        D.from_arrays(x, np.array(["a", "b", "a", "b"]), x, y)
    with pytest.raises(DataError, match=r"do not fit input_shape \(3,\)"):
        D.from_arrays(x, y, x, y, input_shape=(3,))
    with pytest.raises(DataError, match=r"arrays x_test has 1 inf values in column 1: clean"):
        xt = x.copy()
        xt[2, 1] = -np.inf
        D.from_arrays(x, y, xt, y)
    with pytest.raises(ValueError):  # DataError is a ValueError
        D.from_arrays(x, y, x, y, task="ranking")
