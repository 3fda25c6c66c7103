"""Split a centralised data set across simulated clients."""

from __future__ import annotations

import numpy as np

from fedfilter.checks import positive_finite

MAX_DIRICHLET_DRAWS = 1000


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def iid_partition(n_samples: int, n_clients: int, seed: int) -> list[np.ndarray]:
    """Shuffle ``range(n_samples)`` and deal it into ``n_clients`` near-equal parts.

    Parameters
    ----------
    n_samples : int
        The number of samples (>= 1).
    n_clients : int
        The number of clients (1 to ``n_samples``).
    seed : int
        Seed of the shuffle.

    Returns
    -------
    list of numpy.ndarray
        ``n_clients`` int64 index arrays (sizes differ by at most one), covering every index exactly
        once; the same for the same ``seed``.

    Examples
    --------
    >>> parts = iid_partition(10, 3, seed=0)
    >>> [len(p) for p in parts], sorted(np.concatenate(parts).tolist()) == list(range(10))
    ([4, 3, 3], True)
    """
    n_samples = _check_int("n_samples", n_samples, 1)
    n_clients = _check_int("n_clients", n_clients, 1)
    if n_clients > n_samples:
        raise ValueError(f"n_clients={n_clients} exceeds n_samples={n_samples}")
    order = np.random.default_rng(seed).permutation(n_samples)
    return [part.astype(np.int64) for part in np.array_split(order, n_clients)]


def dirichlet_partition(labels, n_clients: int, alpha: float, seed: int, min_size: int = 1) -> list[np.ndarray]:
    """Label-skewed split with Dirichlet(``alpha``) class proportions.

    The split of Hsu et al. (2019) in the per-class form used by NIID-Bench
    (Li et al., 2022): for every class, draw client shares
    ``p ~ Dir(alpha * 1)`` and cut that class's (shuffled) samples by ``p``.
    Small ``alpha`` gives each client few classes; large ``alpha`` tends to
    IID. As in NIID-Bench, a client already holding ``n / n_clients`` samples
    gets no share of later classes, and the whole draw is repeated until every
    client has at least ``min_size`` samples.

    Parameters
    ----------
    labels : array_like
        One label per sample (1-D, non-empty).
    n_clients : int
        The number of clients.
    alpha : float
        The Dirichlet concentration (> 0).
    seed : int
        Seed of the draws.
    min_size : int, optional
        The fewest samples a client may get.

    Returns
    -------
    list of numpy.ndarray
        ``n_clients`` sorted int64 index arrays covering every sample exactly once; the same for
        the same ``seed``.

    Raises
    ------
    ValueError
        On bad arguments, or if no valid draw is found in 1,000 attempts.

    Examples
    --------
    >>> labels = np.repeat([0, 1, 2], 20)
    >>> parts = dirichlet_partition(labels, 4, alpha=0.5, seed=0)
    >>> len(parts), sum(len(p) for p in parts), min(len(p) for p in parts) >= 1
    (4, 60, True)
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    n_clients = _check_int("n_clients", n_clients, 1)
    min_size = _check_int("min_size", min_size, 0)
    if problem := positive_finite("alpha", alpha):
        raise ValueError(problem)
    n = labels.size
    if n_clients * min_size > n:
        raise ValueError(f"n_clients={n_clients} * min_size={min_size} exceeds the {n} samples")
    rng = np.random.default_rng(seed)
    by_class = [np.flatnonzero(labels == c) for c in np.unique(labels)]
    for _ in range(MAX_DIRICHLET_DRAWS):
        parts: list[list[np.ndarray]] = [[] for _ in range(n_clients)]
        sizes = np.zeros(n_clients, dtype=np.int64)
        for idx in by_class:
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n_clients, float(alpha)))
            open_ = sizes < n / n_clients
            p = p * open_  # stop feeding full clients
            # With tiny alpha all mass may sit on full clients (underflow).
            p = p / p.sum() if p.sum() > 0 else open_ / open_.sum()
            cuts = (np.cumsum(p) * len(idx)).astype(np.int64)[:-1]
            for k, chunk in enumerate(np.split(idx, cuts)):
                parts[k].append(chunk)
                sizes[k] += len(chunk)
        if sizes.min() >= min_size:
            return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]
    raise ValueError(
        f"no Dirichlet split with min_size={min_size} for n_clients={n_clients}, "
        f"alpha={alpha} after {MAX_DIRICHLET_DRAWS} draws; raise alpha or lower "
        "n_clients/min_size"
    )
