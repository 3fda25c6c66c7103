"""Loaders against the facts listed in the README of the offline data directory (FEDFILTER_DATA).

Tests that need the offline data call the loaders directly, so a missing
data folder fails them with FileNotFoundError rather than skipping.
"""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest

from fedfilter.simulations.tasks import paths
from fedfilter.simulations.tasks import shakespeare as sh
from fedfilter.simulations.tasks.adult import CATEGORICAL, NUMERIC, adult_feature_names, load_adult
from fedfilter.simulations.tasks.digits import load_digits
from fedfilter.simulations.tasks.femnist import load_femnist
from fedfilter.simulations.tasks.mnist import (
    MNIST_MEAN,
    MNIST_STD,
    load_mnist,
    read_idx_images,
    read_idx_labels,
)
from fedfilter.simulations.tasks.registry import TASKS, load_task

REPO = Path(__file__).resolve().parents[3]


# --- paths -------------------------------------------------------------------


def test_data_dir_defaults_next_to_the_repo(monkeypatch):
    monkeypatch.delenv(paths.ENV_VAR, raising=False)
    assert paths.data_dir() == REPO.parent / "shared" / "data"


def test_data_dir_env_override_and_missing(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.ENV_VAR, str(tmp_path))
    assert paths.data_dir() == tmp_path
    missing = tmp_path / "nope"
    monkeypatch.setenv(paths.ENV_VAR, str(missing))
    with pytest.raises(FileNotFoundError, match=paths.ENV_VAR) as err:
        paths.data_dir()
    assert str(missing) in str(err.value)


def test_no_absolute_work_paths_in_our_files():
    files = list((REPO / "fedfilter" / "simulations" / "tasks").glob("*.py"))
    files += list((REPO / "tests").glob("test_tasks_*.py"))
    marker = "/" + "work" + "/"
    assert [f.name for f in files if marker in f.read_text()] == []


# --- digits ------------------------------------------------------------------


def test_digits_split_is_fixed_stratified_and_scaled():
    x_train, y_train, x_test, y_test = load_digits()
    assert x_train.shape == (1437, 64) and x_test.shape == (360, 64)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() == 1.0
    # Stratified: every class has 20% (+-1) of its samples in test.
    total = np.bincount(y_train) + np.bincount(y_test)
    assert np.all(np.abs(np.bincount(y_test) - 0.2 * total) <= 1)
    assert not x_train.flags.writeable  # cached arrays are shared


# --- MNIST -------------------------------------------------------------------

TRAIN_COUNTS = [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949]
TEST_COUNTS = [980, 1135, 1032, 1010, 982, 892, 958, 1028, 974, 1009]


def test_mnist_counts_shapes_and_pixel_statistics():
    x_train, y_train, x_test, y_test = load_mnist()
    assert x_train.shape == (60000, 1, 28, 28) and x_test.shape == (10000, 1, 28, 28)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert np.bincount(y_train).tolist() == TRAIN_COUNTS
    assert np.bincount(y_test).tolist() == TEST_COUNTS
    raw = x_train.astype(np.float64) * MNIST_STD + MNIST_MEAN  # back to [0, 1]
    assert raw.mean() == pytest.approx(0.1307, abs=5e-5)
    assert raw.std() == pytest.approx(0.3081, abs=5e-5)
    assert abs(x_train.mean()) < 1e-3 and x_train.std() == pytest.approx(1.0, abs=1e-3)


def _idx(path, magic, dims, payload):
    with gzip.open(path, "wb") as f:
        f.write(struct.pack(">I", magic) + b"".join(struct.pack(">I", d) for d in dims) + payload)
    return path


def test_idx_magic_and_size_are_checked(tmp_path):
    good = _idx(tmp_path / "l.gz", 0x801, [3], bytes([1, 2, 3]))
    assert read_idx_labels(good).tolist() == [1, 2, 3]
    with pytest.raises(ValueError, match=r"l\.gz.*0x801.*0x803"):
        read_idx_images(good)
    bad = _idx(tmp_path / "bad.gz", 0x802, [3], bytes(3))
    with pytest.raises(ValueError, match=r"bad\.gz.*0x802"):
        read_idx_labels(bad)
    short = _idx(tmp_path / "short.gz", 0x803, [2, 2, 2], bytes(7))
    with pytest.raises(ValueError, match="short.gz"):
        read_idx_images(short)


# --- Adult -------------------------------------------------------------------


def test_adult_counts_and_encoding():
    x_train, y_train, x_test, y_test = load_adult()
    assert np.bincount(y_train).tolist() == [24720, 7841]
    assert np.bincount(y_test).tolist() == [12435, 3846]
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert x_train.shape[1] == x_test.shape[1] == len(adult_feature_names())
    assert np.isfinite(x_train).all() and np.isfinite(x_test).all()
    numeric = slice(0, len(NUMERIC))
    np.testing.assert_allclose(x_train[:, numeric].mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(x_train[:, numeric].std(0), 1, atol=1e-4)
    # One category per categorical column in train; "?" is its own category.
    assert np.all(x_train[:, len(NUMERIC) :].sum(1) == len(CATEGORICAL))
    assert {"workclass=?", "occupation=?", "native-country=?"} <= set(adult_feature_names())


def test_adult_test_uses_train_statistics():
    folder = paths.data_dir() / "adult"

    def ages(name):
        lines = (folder / name).read_text().splitlines()
        return np.array([float(l.split(",")[0]) for l in lines if l and not l.startswith("|")])

    train_age, test_age = ages("adult.data"), ages("adult.test")
    expected = (test_age - train_age.mean()) / train_age.std()
    np.testing.assert_allclose(load_adult()[2][:, 0], expected, rtol=1e-5, atol=1e-5)


# --- FEMNIST -----------------------------------------------------------------


def test_femnist_writers_and_sample_counts():
    train, test = load_femnist()
    assert len(train) == 105 and set(test) <= set(train)
    assert sum(len(y) for _, y in train.values()) == 14708
    assert sum(len(y) for _, y in test.values()) == 1685
    x, y = next(iter(train.values()))
    assert x.shape[1:] == (1, 28, 28) and x.dtype == np.float32 and y.dtype == np.int64
    ys = np.concatenate([y for _, y in train.values()])
    assert ys.min() >= 0 and ys.max() <= 61
    assert min(x.min() for x, _ in train.values()) >= 0.0
    assert max(x.max() for x, _ in train.values()) <= 1.0
    few, _ = load_femnist(max_clients=3)
    assert list(few) == sorted(train)[:3]


# --- Shakespeare -------------------------------------------------------------


def test_shakespeare_clients_and_snippets():
    train = sh.read_snippets("train")
    test = sh.read_snippets("test")
    assert len(train) == 715 and set(test) == set(train)
    assert sum(map(len, train.values())) == 16068
    assert sum(map(len, test.values())) == 2356


def test_shakespeare_vocabulary_and_windows():
    assert len(sh.CHARACTERS) == 80 and sh.OOV_ID == 80 and sh.VOCAB_SIZE == 81
    a, b = sh.CHARACTERS.index("a"), sh.CHARACTERS.index("b")
    assert sh.encode("ab$é\n").tolist() == [a, b, 80, 80, 0]
    assert sh.decode(sh.encode("To be, or not to be")) == "To be, or not to be"
    assert sh.clean(["a\n b  c", "d"]) == "a b c d"
    text = "".join(chr(ord("a") + i % 26) for i in range(100))
    x, y = sh.windows(text)
    assert x.shape == (20, 80) and y.shape == (20,)
    assert sh.decode(x[3]) == text[3:83] and sh.decode(y[3:4]) == text[83]
    assert sh.windows("short")[0].shape == (0, 80)


def test_shakespeare_examples_are_bounded_and_consistent():
    data = sh.load_shakespeare("train", max_clients=4, max_snippets_per_client=3)
    assert len(data) == 4
    for x, y in data.values():
        assert x.dtype == np.int64 and y.dtype == np.int64 and x.shape[1] == 80
        assert np.array_equal(x[1:, -1], y[:-1])  # each label is the next input's last char
    with pytest.raises(ValueError, match="split"):
        sh.read_snippets("valid")


# --- registry ----------------------------------------------------------------


@pytest.mark.parametrize("name", TASKS)
def test_load_task_shapes(name):
    task = load_task(name, num_clients=4, partition="dirichlet", alpha=0.5, seed=1)
    assert task.name == name and task.num_clients == 4 == len(task.client_ids)
    x_test, y_test = task.test_data
    assert len(x_test) == len(y_test) > 0
    assert 0 <= y_test.min() and y_test.max() < task.num_classes
    for x, y in task.train_data:
        assert len(x) == len(y) > 0 and x.shape[1:] == x_test.shape[1:]


def test_load_task_partitions_cover_the_train_set():
    task = load_task("mnist", num_clients=10, seed=3)
    assert sum(len(y) for _, y in task.train_data) == 60000
    counts = sum(np.bincount(y, minlength=10) for _, y in task.train_data)
    assert counts.tolist() == TRAIN_COUNTS


def test_natural_tasks_cap_clients():
    assert load_task("femnist", num_clients=500).num_clients == 105
    shakespeare = load_task("shakespeare", num_clients=10_000)
    assert shakespeare.num_clients == 715 - 72  # roles with >= 81 characters
    assert len(shakespeare.test_data[1]) > 0


def test_load_task_bad_arguments():
    with pytest.raises(ValueError, match="digits, mnist, adult, femnist, shakespeare"):
        load_task("cifar", num_clients=2)
    with pytest.raises(ValueError, match="partition"):
        load_task("digits", num_clients=2, partition="pathological")
    with pytest.raises(ValueError, match="num_clients"):
        load_task("digits", num_clients=0)
