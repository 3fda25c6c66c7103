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
    """A ``Task`` (model factory, per-client train data, held-out test data), cached per process."""
    from fedfilter.simulations.tasks.registry import load_task as _load

    return _load(name, num_clients=num_clients, partition=partition, alpha=alpha, seed=seed, data_dir=data_dir)


def local_update(*args, **kwargs):
    from fedfilter.simulations.tasks.training import local_update as _local_update

    return _local_update(*args, **kwargs)


def evaluate(*args, **kwargs):
    from fedfilter.simulations.tasks.training import evaluate as _evaluate

    return _evaluate(*args, **kwargs)


def get_weights(model):
    from fedfilter.simulations.tasks.training import get_weights as _get_weights

    return _get_weights(model)


def set_weights(model, weights) -> None:
    from fedfilter.simulations.tasks.training import set_weights as _set_weights

    _set_weights(model, weights)
