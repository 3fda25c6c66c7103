"""The same federation without privacy: what the private run's accuracy is measured against.

Plain federated averaging over the very devices, data split, initial model, rounds, devices asked
per round and local training of a private run (``fedfilter.simulations.engine.updates.local_sgd_update``
with the ClientApp's shuffling seeds, the coordinator's ``protocol.rules.model_step``), with the
privacy taken out: no clip, no noise, no budget, every asked device's update in the plain mean. The
devices asked each round follow the same rule as the engine's: uniform sampling of ``per_round`` from
the engine's own sampling generator (``engine.seeds.sampling_rng``), so the very devices the private
run asks; or balanced passes (``planning.participation.BalancedSchedule``) on that generator; every
device when all are asked.

Examples
--------
>>> from fedfilter.simulations.tasks.registry import load_task
>>> accuracy = no_privacy_accuracy(load_task("digits", num_clients=4), per_round=4, rounds=1, local_epochs=1,
...     lr=0.1, batch_size=32, server_lr=1.0, seed=0, run_id="doc")
>>> len(accuracy), 0.0 <= accuracy[0] <= 1.0
(1, True)
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from fedfilter.planning.participation import BalancedSchedule
from fedfilter.protocol.rules import model_step
from fedfilter.simulations.engine.seeds import sampling_rng
from fedfilter.simulations.engine.updates import local_seed, local_sgd_update
from fedfilter.simulations.tasks.training import evaluate, get_weights, set_weights

__all__ = ["no_privacy_accuracy"]


def no_privacy_accuracy(
    task,
    *,
    per_round: int,
    rounds: int,
    local_epochs: int,
    lr: float,
    batch_size: int,
    server_lr: float,
    seed: int,
    run_id: str,
    participation: str = "uniform",
    progress: Callable[[int, float], object] | None = None,
) -> list[float]:
    """Test accuracy after each round of plain federated averaging (no clip, no noise, no budget).

    Parameters
    ----------
    task : fedfilter.simulations.tasks.registry.Task
        The devices' data, the model and the test set.
    per_round : int
        Devices asked per round (all of them when it equals the task's devices).
    rounds : int
        Rounds to run.
    local_epochs, lr, batch_size : int, float, int
        Each device's local SGD (as in the private run).
    server_lr : float
        The coordinator's step on the mean.
    seed : int
        The initial model (``torch.manual_seed(seed)``, as the engine and the ServerApp) and the sampling.
    run_id : str
        The sampling generator's run (the private run's ``run_id`` asks by the same rule).
    participation : {"uniform", "balanced"}, optional
        How the devices of a round are chosen when not all are asked.
    progress : callable, optional
        Called as ``progress(round_id, accuracy)`` after each round.

    Returns
    -------
    list of float
        One test accuracy per round.

    Examples
    --------
    >>> from fedfilter.simulations.tasks.registry import load_task
    >>> task = load_task("digits", num_clients=20)
    >>> acc = no_privacy_accuracy(task, per_round=10, rounds=3, local_epochs=1, lr=0.1, batch_size=32,
    ...     server_lr=1.0, seed=0, run_id="doc")
    >>> acc[-1] > 0.2  # learns: chance is 0.1
    True
    """
    n = task.num_clients
    torch.manual_seed(seed)
    model = task.model_fn()
    weights = get_weights(model)
    sampler = sampling_rng(seed, run_id) if per_round < n else None
    passes = BalancedSchedule(n, per_round, sampler) if sampler is not None and participation == "balanced" else None
    x_test, y_test = task.test_data
    out = []
    for round_id in range(1, rounds + 1):
        if sampler is None:
            asked = np.arange(n)
        elif passes is not None:
            asked = np.sort(passes.next_round())
        else:
            asked = np.sort(sampler.choice(n, size=per_round, replace=False))
        total = [np.zeros(w.shape, dtype=np.float64) for w in weights]
        for client in asked:
            x, y = task.train_data[client]
            update = local_sgd_update(
                model,
                weights,
                x,
                y,
                epochs=local_epochs,
                lr=lr,
                batch_size=batch_size,
                seed=local_seed(round_id, int(client)),
                loss_fn=task.loss,
            )
            for t, u in zip(total, update):
                t += u
        weights = model_step(weights, [t / len(asked) for t in total], server_lr)
        set_weights(model, weights)
        _, accuracy = evaluate(model, x_test, y_test, loss_fn=task.loss)
        out.append(float(accuracy))
        if progress is not None:
            progress(round_id, float(accuracy))
    return out
