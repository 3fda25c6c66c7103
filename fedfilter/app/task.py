"""The built-in app's task: data, model, local training and evaluation (Flower's ``task.py``).

A thin layer over the research tasks (``fedfilter.simulations.tasks``): the app imports the task
here and nowhere else, so the device and coordinator code (``fedfilter.client``,
``fedfilter.coordinator``) never depends on the studies. torch is imported on first use.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["load_task", "local_update", "evaluate", "get_weights", "set_weights"]


@lru_cache(maxsize=2)
def load_task(
    name: str, num_clients: int, partition: str = "iid", alpha: float = 0.5, seed: int = 0, data_dir: str | None = None
):
    """A ``Task`` (model factory, per-client train data, held-out test data), cached per process.

    Parameters
    ----------
    name : str
        A built-in task (``fedfilter.simulations.tasks.registry.TASKS``).
    num_clients : int
        The number of partitions of the training data.
    partition : str, optional
        ``iid`` or ``dirichlet``.
    alpha : float, optional
        The Dirichlet concentration (``dirichlet`` only).
    seed : int, optional
        The partition's seed.
    data_dir : str, optional
        The root of the offline data sets (default: ``$FEDFILTER_DATA``).

    Returns
    -------
    fedfilter.simulations.tasks.registry.Task
        The task.

    Examples
    --------
    >>> task = load_task("digits", 2)
    >>> task.num_clients, task.num_classes
    (2, 10)
    """
    from fedfilter.simulations.tasks.registry import load_task as _load

    return _load(name, num_clients=num_clients, partition=partition, alpha=alpha, seed=seed, data_dir=data_dir)


def local_update(*args, **kwargs):
    """Train the model in place with plain SGD; ``fedfilter.simulations.tasks.training.local_update``.

    Parameters
    ----------
    *args, **kwargs
        Those of ``fedfilter.simulations.tasks.training.local_update``: ``model, x, y``, and
        ``epochs``, ``lr``, ``batch_size``, ``seed``, ``loss_fn`` by keyword.

    Returns
    -------
    list of numpy.ndarray
        The weight change, in state-dict order.

    Examples
    --------
    >>> import numpy as np, torch
    >>> model = torch.nn.Linear(2, 2)
    >>> x, y = np.ones((4, 2), dtype=np.float32), np.array([0, 1, 0, 1])
    >>> delta = local_update(model, x, y, epochs=1, lr=0.1, batch_size=2, seed=0)
    >>> [d.shape for d in delta]
    [(2, 2), (2,)]
    """
    from fedfilter.simulations.tasks.training import local_update as _local_update

    return _local_update(*args, **kwargs)


def evaluate(*args, **kwargs):
    """Loss and accuracy of the model on data; ``fedfilter.simulations.tasks.training.evaluate``.

    Parameters
    ----------
    *args, **kwargs
        Those of ``fedfilter.simulations.tasks.training.evaluate``: ``model, x, y`` (and ``loss_fn``).

    Returns
    -------
    tuple of float
        ``(loss, accuracy)``.

    Examples
    --------
    >>> import numpy as np, torch
    >>> model = torch.nn.Linear(2, 2)
    >>> loss, accuracy = evaluate(model, np.ones((4, 2), dtype=np.float32), np.array([0, 1, 0, 1]))
    >>> accuracy
    0.5
    """
    from fedfilter.simulations.tasks.training import evaluate as _evaluate

    return _evaluate(*args, **kwargs)


def get_weights(model):
    """The model's state-dict values, in order, as numpy arrays (copies).

    Parameters
    ----------
    model : torch.nn.Module
        The model.

    Returns
    -------
    list of numpy.ndarray
        One array per state-dict entry.

    Examples
    --------
    >>> import torch
    >>> [w.shape for w in get_weights(torch.nn.Linear(3, 2))]
    [(2, 3), (2,)]
    """
    from fedfilter.simulations.tasks.training import get_weights as _get_weights

    return _get_weights(model)


def set_weights(model, weights) -> None:
    """Load arrays (in state-dict order, as from ``get_weights``) into the model.

    Parameters
    ----------
    model : torch.nn.Module
        The model, changed in place.
    weights : iterable of array_like
        One array per state-dict entry, of the entry's shape.

    Examples
    --------
    >>> import numpy as np, torch
    >>> model = torch.nn.Linear(3, 2)
    >>> set_weights(model, [np.zeros((2, 3)), np.ones(2)])
    >>> model.bias.tolist()
    [1.0, 1.0]
    """
    from fedfilter.simulations.tasks.training import set_weights as _set_weights

    _set_weights(model, weights)
