"""Flower's own central differential privacy on a Grid of Flower ClientApps, in one process (arm (a) of
benchmarks/fl_vs_flower_dp.py).

``DifferentialPrivacyServerSideFixedClipping`` around Flower's ``FedAvg`` with Flower's RDP accountant
(``flwr.supercore.privacy_accounting``), or plain ``FedAvg`` (``z=None``), run by Flower's strategy
code (``Strategy.start``) on ``LoopbackGrid``; each node is a plain Flower ClientApp training a prebuilt
``Task``'s partition with ``fedfilter.app.client_app.train``'s local SGD and seeds. Nothing here is
fedfilter's privacy code: it is the baseline ``benchmarks/fl_vs_flower_dp.py`` compares against.

A long run survives being stopped (``checkpoint=PATH``): after every ``checkpoint_every`` rounds it
writes the model, Python's and numpy's global generators (FedAvg's sampling, Flower's noise) and the
accountant's own ``state_dict``; rerun, it loads them and ``Strategy.start`` runs the rounds left, the
round each node sees (its shuffling seed) shifted by the rounds done, so the run is the same one.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

NODE_BASE = 100  # Grid node ids: NODE_BASE + partition id (the loopback's server is node 1)


def flower_accountant(epsilon: float, delta: float, population: int):
    """Flower's RDP accountant for fixed clipping, at ``max_epsilon = epsilon``."""
    from flwr.serverapp import NeighboringRelation, PrivacyConfig, SamplingMethod
    from flwr.supercore.privacy_accounting.rdp_accountant import RdpAccountant

    config = PrivacyConfig(
        target_delta=delta,
        population_size=population,
        neighboring_relation=NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.NO_AMPLIFICATION,
        max_epsilon=epsilon,
    )
    return RdpAccountant(config)


def flower_noise_multiplier(epsilon: float, delta: float, rounds: int, population: int, sampled: int) -> float:
    """The smallest ``z`` (to 1e-4 relative, rounded up) whose ``rounds`` releases Flower's accountant
    admits within ``epsilon``: its own ``would_exceed``, the check its strategy makes before each round."""
    from flwr.serverapp import GaussianPrivacyEvent

    accountant = flower_accountant(epsilon, delta, population)

    def fits(z: float) -> bool:
        event = GaussianPrivacyEvent(noise_multiplier=z, sample_size=sampled, population_size=population)
        return not accountant.would_exceed(event, count=rounds)

    return smallest_noise_multiplier(fits, f"{rounds} rounds at epsilon={epsilon!r}")


def smallest_noise_multiplier(fits, what: str) -> float:
    """The smallest ``z`` (to 1e-4 relative, rounded up) that ``fits`` admits, ``fits`` admitting every
    ``z`` above one it admits: doubling from 1, then bisection. ``what`` names the setting in the error."""
    lo, hi = 1e-3, 1.0
    while not fits(hi):
        lo, hi = hi, hi * 2
        if hi > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 fits {what}")
    while hi - lo > 1e-4 * hi:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if fits(mid) else (mid, hi)
    return hi


def client_app(task, *, local_epochs: int, lr: float, batch_size: int, round_offset: int = 0):
    """A plain Flower ClientApp: ``fedfilter.app.client_app.train``'s local SGD on this node's partition
    (the prebuilt task), returning the new weights with weight 1 (uniform FedAvg). ``round_offset``: the
    rounds a resumed run already did (Flower's ``server-round`` restarts at 1)."""
    import torch
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    from fedfilter.simulations.tasks.training import local_update, set_weights

    app = ClientApp()
    model = task.model_fn()

    @app.train()
    def train(msg, context):
        torch.set_num_threads(1)
        pid = int(context.node_config["partition-id"])
        server_round = int(msg.content["config"]["server-round"]) + round_offset
        set_weights(model, msg.content["arrays"].to_numpy_ndarrays())
        x, y = task.train_data[pid]
        local_update(
            model,
            x,
            y,
            epochs=local_epochs,
            lr=lr,
            batch_size=batch_size,
            seed=1_000_003 * server_round + pid,  # fedfilter.app.client_app.train's seed
            loss_fn=task.loss,
        )
        content = RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": MetricRecord({"num-examples": 1})})
        return Message(content, reply_to=msg)

    return app


def run_flower(
    task,
    *,
    clients_per_round: int,
    rounds: int,
    clip: float,
    delta: float,
    z: float | None,
    epsilon: float | None,
    local_epochs: int,
    lr: float,
    batch_size: int,
    seed: int,
    eval_every: int,
    progress: Callable[[], object] = lambda: None,
    noise_seed: int | None = None,
    checkpoint: str | Path | None = None,
    checkpoint_every: int = 5,
) -> dict[str, Any]:
    """Central DP with noise multiplier ``z`` and Flower's accountant at ``max_epsilon = epsilon``, or
    plain FedAvg (``z=None``); ``progress()`` after every round; ``noise_seed`` (default ``seed``) seeds
    only Flower's noise draws; ``checkpoint``: resume from and save to this file (module docstring).
    Returns accuracy and test loss per round (None where not evaluated), devices per round, rounds run
    and, with ``z``, what Flower's accountant spent."""
    import torch
    from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord
    from flwr.serverapp import Grid
    from flwr.serverapp.exception import PrivacyBudgetExhausted
    from flwr.serverapp.strategy import DifferentialPrivacyServerSideFixedClipping, FedAvg, Strategy

    from fedfilter.simulations.tasks.training import evaluate, set_weights
    from harness.secagg_loopback import LoopbackGrid

    n, k = task.num_clients, clients_per_round
    meta = {"rounds": rounds, "clients_per_round": k, "clip": clip, "z": z, "epsilon": epsilon, "seed": seed}
    meta["noise_seed"] = noise_seed
    saved = _load(checkpoint, meta)
    done = 0 if saved is None else int(saved["round_id"])
    app = client_app(task, local_epochs=local_epochs, lr=lr, batch_size=batch_size, round_offset=done)
    nodes = {NODE_BASE + pid: app for pid in range(n)}
    # record=False: a long run keeps no message (thousands a round would hold gigabytes)
    grid = LoopbackGrid(nodes, {NODE_BASE + pid: {"partition-id": pid} for pid in range(n)}, record=False)
    fedavg = FedAvg(
        fraction_train=k / n, fraction_evaluate=0.0, min_train_nodes=k, min_evaluate_nodes=0, min_available_nodes=k
    )
    dp = None
    if z is not None:
        if epsilon is None:
            raise ValueError("central DP needs its population budget: epsilon must be a number. Found None.")
        dp = DifferentialPrivacyServerSideFixedClipping(
            fedavg, z, clip, k, accountant=flower_accountant(epsilon, delta, n)
        )
    strategy: Strategy = fedavg if dp is None else dp
    torch.manual_seed(seed)  # the engine's initial model (EngineConfig.seed)
    model = task.model_fn()
    accuracy: list[float | None] = [] if saved is None else list(saved["accuracy"])
    losses: list[float | None] = [] if saved is None else list(saved["loss"])
    initial = ArrayRecord(model.state_dict())
    if saved is not None:  # the aggregate as Flower held it (its keys and dtypes)
        initial = ArrayRecord({key: Array(w) for key, w in zip(saved["keys"], saved["weights"], strict=True)})
        if dp is not None:
            assert dp.accountant is not None
            dp.accountant.load_state_dict(saved["accountant"])
        for _ in range(done):
            progress()

    def central_evaluation(label: int, arrays):
        if label == 0:
            return None
        server_round = label + done
        progress()
        result = None
        if server_round % eval_every and server_round != rounds:
            accuracy.append(None)
            losses.append(None)
        else:
            set_weights(model, arrays.to_numpy_ndarrays())
            loss, acc = evaluate(model, *task.test_data, loss_fn=task.loss)
            accuracy.append(float(acc))
            losses.append(float(loss))
            result = MetricRecord({"accuracy": float(acc), "loss": float(loss)})
        if checkpoint is not None and (server_round % checkpoint_every == 0 or server_round == rounds):
            _save(checkpoint, meta, server_round, arrays, dp, accuracy, losses)
        return result

    # The process's state this run sets is put back after it (a caller's logging and generators are its own).
    flwr_log = logging.getLogger("flwr")
    level = flwr_log.level
    py_state, np_state = random.getstate(), np.random.get_state()
    flwr_log.setLevel(logging.WARNING)  # Flower logs every round at INFO
    random.seed(seed)  # FedAvg's node sampling
    np.random.seed(seed if noise_seed is None else noise_seed)  # Flower's central noise (np.random.normal)
    if saved is not None:  # where the stopped run's generators stood after its last saved round
        random.setstate(_python_state(saved["python_random"]))
        np.random.set_state(_numpy_state(saved["numpy_random"]))
    stopped = None
    try:
        strategy.start(
            grid=cast(Grid, grid),  # a Grid in all but name: the loopback implements what strategies call
            initial_arrays=initial,
            num_rounds=rounds - done,
            train_config=ConfigRecord({}),
            evaluate_fn=central_evaluation,
        )
    except PrivacyBudgetExhausted as e:  # the planned z should prevent it: reported, not hidden
        stopped = str(e)
    finally:
        flwr_log.setLevel(level)
        random.setstate(py_state)
        np.random.set_state(np_state)
    out: dict[str, Any] = {
        "accuracy_per_round": accuracy,
        "loss_per_round": losses,
        "accuracy": next((a for a in reversed(accuracy) if a is not None), None),
        "contributing_per_round": [k] * len(accuracy),
        "rounds_run": len(accuracy),
        "trusted_server": True,
        "stopped": stopped,
    }
    if dp is not None:
        spent = dp.privacy_spent()
        assert spent is not None  # an accountant is configured
        out.update(
            noise_multiplier=z,
            epsilon_budget=epsilon,
            spent_epsilon=float(spent.epsilon),
            spent_delta=float(spent.delta),
            releases=int(spent.num_releases),
            rounds_run=int(spent.num_releases),
        )
    return out


# --- checkpoints: the engine's file format (fedfilter.simulations.engine.checkpoint) -----------------


def _save(path, meta: dict, server_round: int, arrays, dp, accuracy: list, losses: list) -> None:
    from fedfilter.simulations.engine.checkpoint import save_checkpoint

    state = np.random.get_state()
    snapshot = {
        "round_id": server_round,
        "weights": arrays.to_numpy_ndarrays(),
        "keys": list(arrays.keys()),
        "python_random": [random.getstate()[0], list(random.getstate()[1]), random.getstate()[2]],
        "numpy_random": [state[0], [int(v) for v in state[1]], *[float(v) for v in state[2:]]],
        "accountant": None if dp is None else dp.accountant.state_dict(),
        "accuracy": accuracy,
        "loss": losses,
    }
    save_checkpoint(path, snapshot, meta)


def _load(path, meta: dict) -> dict | None:
    """The checkpoint at ``path`` (None when absent); a checkpoint of another run is an error."""
    from fedfilter.simulations.engine.checkpoint import load_checkpoint

    if path is None or not Path(path).exists():
        return None
    snapshot, saved_meta = load_checkpoint(path)
    if saved_meta != meta:
        raise ValueError(f"checkpoint {path} is of another run: {saved_meta}, not {meta}; move it away.")
    return snapshot


def _python_state(saved: list) -> tuple:
    return (int(saved[0]), tuple(int(v) for v in saved[1]), None if saved[2] is None else float(saved[2]))


def _numpy_state(saved: list) -> tuple:
    return (saved[0], np.array(saved[1], dtype=np.uint32), int(saved[2]), int(saved[3]), float(saved[4]))
