"""`--data mnist1d:N`: MNIST-1D with N training samples from the same generator and defaults."""
import numpy as np
import pytest

from tinytrain import data as D


def test_mnist1d_args_give_exactly_n_and_the_default_for_4000():
    import mnist1d.data as m1d

    split = m1d.get_dataset_args(as_dict=True)["train_split"]
    assert split == 0.8  # mnist1d_args assumes the generator's default split
    for n in (10, 11, 79, 80, 81, 3999, 4000, 4001, 99_999, 100_000, D.MNIST1D_MAX_TRAIN):
        num = D.mnist1d_args(n)["num_samples"]
        assert num % 10 == 0 and int(num * split) >= n and int((num - 10) * split) < n, n
    assert D.mnist1d_args(4000) == {"num_samples": m1d.get_dataset_args(as_dict=True)["num_samples"]}


def test_mnist1d_4000_is_the_default_dataset_and_n_cuts_the_train_split():
    a, b = D.load("mnist1d:4000"), D.load("mnist1d")
    assert a.name == "mnist1d:4000" and a.x_train.shape == (4000, 40, 1) and a.x_test.shape == (1000, 40, 1)
    assert (a.x_train == b.x_train).all() and (a.y_train == b.y_train).all()
    assert (a.x_test == b.x_test).all() and a.input_exp == b.input_exp
    c = D.load("mnist1d-flat:1234")
    assert c.name == "mnist1d-flat:1234" and c.x_train.shape == (1234, 40) and c.input_shape == (40,)
    assert D.mnist1d_args(1234) == {"num_samples": 1550}  # train split 1240, cut to 1234
    assert c.x_test.shape == (1550 - 1240, 40)


@pytest.mark.parametrize("spec", ["mnist1d:", "mnist1d:abc", "mnist1d:9", "mnist1d:-5", "mnist1d:1e5",
                                  "mnist1d-flat:2000001", "mnist1d:10.5"])
def test_bad_n_is_one_line_and_exit_2(spec, capsys):
    from tinytrain.cli import main

    with pytest.raises(D.DataError, match="number of training samples, an integer from 10"):
        D.load(spec)
    rc = main(["federate", "--simulated", "2", "--rounds", "1", "--model", "digits-mlp", "--data", spec])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "mnist1d" in err[0] and "e.g." in err[0]
    assert main(["train", "--data", spec, "--model", "digits-mlp", "--epochs", "0"]) == 2
