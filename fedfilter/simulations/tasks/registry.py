"""The built-in tasks by name: data split across clients, model and loss."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
from torch import nn
from torch.nn import functional as F

from . import models
from .partition import dirichlet_partition, iid_partition

Arrays = tuple[np.ndarray, np.ndarray]
TASKS = ("digits", "mnist", "adult", "femnist", "shakespeare")
PARTITIONS = ("iid", "dirichlet")


@dataclass(frozen=True, eq=False)
class Task:
    """A federated learning task.

    Parameters
    ----------
    name : str
        Task name, one of :data:`TASKS`.
    model_fn : callable
        Builds a fresh model (picklable; seed torch first for reproducible
        initial weights).
    loss : callable
        ``loss(logits, labels) -> mean loss``; cross-entropy for every task.
    train_data : list of (x, y)
        One ``(x, y)`` per client.
    test_data : (x, y)
        Held-out ``(x, y)`` for evaluating the global model.
    num_classes : int
        Number of classes (logits per sample).
    client_ids : list of str
        A name per client: the writer / role for natural partitions, else
        ``"client-<k>"``.

    Examples
    --------
    >>> import torch
    >>> task = load_task("digits", num_clients=3)
    >>> task.client_ids, task.num_classes, task.model_fn()(torch.from_numpy(task.test_data[0][:2].copy())).shape
    (['client-0', 'client-1', 'client-2'], 10, torch.Size([2, 10]))
    """

    name: str
    model_fn: Callable[[], nn.Module]
    loss: Callable
    train_data: list[Arrays]
    test_data: Arrays
    num_classes: int
    client_ids: list[str]

    @property
    def num_clients(self) -> int:
        """The number of clients (of ``train_data``).

        Returns
        -------
        int
            ``len(train_data)``.

        Examples
        --------
        >>> load_task("digits", num_clients=3).num_clients
        3
        """
        return len(self.train_data)


def _split(x, y, *, num_clients, partition, alpha, seed) -> list[Arrays]:
    if partition == "iid":
        parts = iid_partition(len(y), num_clients, seed)
    else:
        parts = dirichlet_partition(y, num_clients, alpha, seed)
    out = []
    for idx in parts:
        cx, cy = x[idx], y[idx]  # copies; keep them read-only like the source
        cx.flags.writeable = False
        cy.flags.writeable = False
        out.append((cx, cy))
    return out


def _concat(pairs: list[Arrays], like: Arrays) -> Arrays:
    pairs = [p for p in pairs if len(p[1])] or [like]
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def load_task(
    name: str,
    *,
    num_clients: int,
    partition: str = "iid",
    alpha: float = 0.5,
    seed: int = 0,
    data_dir: str | os.PathLike | None = None,
) -> Task:
    """Load task ``name`` split across ``num_clients`` clients.

    Parameters
    ----------
    name : str
        ``digits`` (bundled with scikit-learn), ``mnist``, ``adult``,
        ``femnist`` or ``shakespeare``.
    num_clients : int
        Clients to create. For ``femnist`` and ``shakespeare`` the data are
        split by writer / speaking role and this only caps the number of
        clients (first ones by id; Shakespeare roles with no 81-character
        example are skipped), so ``Task.num_clients`` may be smaller.
    partition : str, optional
        ``"iid"`` or ``"dirichlet"`` (label skew with concentration
        ``alpha``); ignored by the naturally federated tasks.
    alpha : float, optional
        The Dirichlet concentration.
    seed : int, optional
        Seed of the partition.
    data_dir : str or PathLike, optional
        Root of the offline data; default :func:`paths.data_dir`.

    Returns
    -------
    Task
        The task.

    Raises
    ------
    ValueError
        An unknown task or partition, or a bad ``num_clients``.

    Notes
    -----
    For the natural tasks the test set is the held-out samples of the chosen
    clients (LEAF's per-user split). Shakespeare's test windows are copied
    into one int64 array: about 0.3 MB per client on average (212 MB for all
    715 roles).

    Examples
    --------
    >>> task = load_task("digits", num_clients=4, partition="dirichlet", alpha=0.3)
    >>> sum(len(y) for _, y in task.train_data), len(task.test_data[1])
    (1437, 360)
    """
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(TASKS)}")
    if isinstance(num_clients, bool) or not isinstance(num_clients, (int, np.integer)) or num_clients < 1:
        raise ValueError(f"num_clients must be an integer >= 1, got {num_clients!r}")
    if partition not in PARTITIONS:
        raise ValueError(f"partition must be one of {PARTITIONS}, got {partition!r}")
    split = partial(_split, num_clients=num_clients, partition=partition, alpha=alpha, seed=seed)
    default_ids = [f"client-{k}" for k in range(num_clients)]

    if name == "digits":
        from .digits import load_digits

        x, y, x_test, y_test = load_digits()
        return Task(name, models.DigitsMLP, F.cross_entropy, split(x, y), (x_test, y_test), 10, default_ids)
    if name == "mnist":
        from .mnist import load_mnist

        x, y, x_test, y_test = load_mnist(data_dir)
        return Task(name, models.MnistCNN, F.cross_entropy, split(x, y), (x_test, y_test), 10, default_ids)
    if name == "adult":
        from .adult import load_adult

        x, y, x_test, y_test = load_adult(data_dir)
        return Task(
            name,
            partial(models.LogisticRegression, x.shape[1]),
            F.cross_entropy,
            split(x, y),
            (x_test, y_test),
            2,
            default_ids,
        )
    if name == "femnist":
        from .femnist import NUM_CLASSES, load_femnist

        train, test = load_femnist(data_dir, max_clients=num_clients)
        ids = list(train)
        empty = (np.zeros((0, 1, 28, 28), np.float32), np.zeros(0, np.int64))
        return Task(
            name,
            models.FemnistCNN,
            F.cross_entropy,
            [train[w] for w in ids],
            _concat([test.get(w, empty) for w in ids], empty),
            NUM_CLASSES,
            ids,
        )

    from .shakespeare import SEQ_LEN, VOCAB_SIZE, load_shakespeare

    train = {c: xy for c, xy in load_shakespeare("train", data_dir).items() if len(xy[1])}
    ids = list(train)[:num_clients]
    test = load_shakespeare("test", data_dir)
    empty = (np.zeros((0, SEQ_LEN), np.int64), np.zeros(0, np.int64))
    return Task(
        name,
        partial(models.CharLSTM, VOCAB_SIZE),
        F.cross_entropy,
        [train[c] for c in ids],
        _concat([test.get(c, empty) for c in ids], empty),
        VOCAB_SIZE,
        ids,
    )
