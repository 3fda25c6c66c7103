"""Properties of the IID and label-Dirichlet client partitions."""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fedfilter.simulations.tasks.partition import dirichlet_partition, iid_partition


def _covers_once(parts, n):
    allidx = np.concatenate(parts)
    return len(allidx) == n and np.array_equal(np.sort(allidx), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 500), k=st.integers(1, 50), seed=st.integers(0, 2**32 - 1))
def test_iid_covers_every_index_once_balanced(n, k, seed):
    k = min(k, n)
    parts = iid_partition(n, k, seed)
    assert len(parts) == k and _covers_once(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    assert all(p.dtype == np.int64 for p in parts)


@settings(max_examples=40, deadline=None)
@given(
    n_classes=st.integers(1, 12),
    k=st.integers(1, 20),
    alpha=st.floats(0.01, 100.0),
    seed=st.integers(0, 2**32 - 1),
    min_size=st.integers(0, 5),
)
def test_dirichlet_covers_every_index_once(n_classes, k, alpha, seed, min_size):
    labels = np.random.default_rng(seed).integers(0, n_classes, size=600)
    try:
        parts = dirichlet_partition(labels, k, alpha, seed, min_size=min_size)
    except ValueError as err:  # the documented refusal of a split too skewed to meet min_size
        assert "no Dirichlet split" in str(err) and min_size > 0
        assume(False)
    assert len(parts) == k and _covers_once(parts, len(labels))
    assert min(len(p) for p in parts) >= min_size


def test_a_split_too_skewed_for_min_size_is_refused_by_name():
    # One class, 8 clients, alpha 0.125: nearly all of a draw goes to one client (hypothesis found it).
    labels = np.random.default_rng(1).integers(0, 1, size=600)
    with pytest.raises(ValueError, match="no Dirichlet split with min_size=2"):
        dirichlet_partition(labels, 8, 0.125, 1, min_size=2)


def test_deterministic_for_a_seed_and_seed_matters():
    labels = np.repeat(np.arange(10), 100)
    for split in (
        lambda s: iid_partition(1000, 7, s),
        lambda s: dirichlet_partition(labels, 7, 0.5, s),
    ):
        a, b, c = split(3), split(3), split(4)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
        assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def _dominant_class_share(parts, labels):
    return np.mean([np.bincount(labels[p]).max() / len(p) for p in parts])


def test_small_alpha_is_label_skewed_large_alpha_is_not():
    labels = np.repeat(np.arange(10), 300)
    skewed = dirichlet_partition(labels, 20, 0.05, seed=0)
    mixed = dirichlet_partition(labels, 20, 1000.0, seed=0)
    assert _dominant_class_share(skewed, labels) > 0.7
    assert _dominant_class_share(mixed, labels) < 0.2


def test_min_size_is_respected_when_hard():
    labels = np.repeat(np.arange(10), 60)
    parts = dirichlet_partition(labels, 30, 0.1, seed=1, min_size=5)
    assert min(len(p) for p in parts) >= 5


def test_hopeless_min_size_raises_instead_of_looping():
    labels = np.repeat(np.arange(10), 60)
    with pytest.raises(ValueError, match="draws"):
        dirichlet_partition(labels, 50, 0.1, seed=1, min_size=5)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(n_samples=0, n_clients=1), "n_samples"),
        (dict(n_samples=10, n_clients=0), "n_clients"),
        (dict(n_samples=10, n_clients=2.5), "n_clients"),
        (dict(n_samples=10, n_clients=True), "n_clients"),
        (dict(n_samples=3, n_clients=4), "n_clients=4"),
    ],
)
def test_iid_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        iid_partition(seed=0, **kwargs)


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(n_clients=0), "n_clients"),
        (dict(alpha=0.0), "alpha"),
        (dict(alpha=-1.0), "alpha"),
        (dict(alpha=float("nan")), "alpha"),
        (dict(alpha=float("inf")), "alpha"),
        (dict(min_size=-1), "min_size"),
        (dict(min_size=11), "min_size=11"),
        (dict(labels=np.zeros((5, 2))), "labels"),
        (dict(labels=[]), "labels"),
    ],
)
def test_dirichlet_bad_arguments(kwargs, name):
    args = dict(labels=np.arange(100) % 10, n_clients=9, alpha=0.5, seed=0) | kwargs
    with pytest.raises(ValueError, match=name):
        dirichlet_partition(**args)
