"""Run the population demo: the private federation on the vectorised engine, then the same without privacy.

The private run is ``fedfilter.simulations.engine``: the device's own privacy code (the spend
template, the rdp filter and its worst-case account, the Skellam mechanism on the SecAgg+ integer
grid) applied to every device at once, with the noise multiplier of ``settings.plan_population``.
Each device's worst-case-epsilon is ``min_reports`` times its budget, rounded up to 2 decimals (what
the Flower demo enrols a simulated device with). The no-privacy
run is ``no_privacy.no_privacy_accuracy`` on the same task, asked by the same rule.

The data: MNIST from the offline copy (``FEDFILTER_DATA``); when it is not there, scikit-learn's
bundled digits, with at most one device per training example; ``PopulationRun.task`` says which ran.

Examples
--------
>>> s = PopulationSettings(devices=20, per_round=10, rounds=1, budgets=(8.0,), min_reports=5, task="digits")
>>> run = run_population(s)
>>> run.task, run.devices, len(run.private_accuracy), len(run.no_privacy_accuracy)
('digits', 20, 1, 1)
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfilter.simulations.engine import EngineConfig, EngineResult, RoundRecord, run_engine
from fedfilter.simulations.population.no_privacy import no_privacy_accuracy
from fedfilter.simulations.population.settings import FILTER, PopulationSettings, plan_population

__all__ = ["PopulationRun", "engine_config", "load_population_task", "run_population"]

RUN_ID = "population-demo"
EXHAUSTED_BELOW = 0.02  # the distributed studies' rule (simulations/configs/local_vs_distributed.toml)


@dataclass
class PopulationRun:
    """What the population demo measured.

    Attributes
    ----------
    settings : PopulationSettings
        The federation as run (``task`` and ``devices`` may differ from the request: see below).
    task : str
        The data set that ran (``mnist``, or ``digits`` when MNIST was not found).
    fallback : str or None
        Why the requested data set did not run (None when it did).
    devices, examples_per_device : int, float
        The federation that ran, and the mean training examples a device holds.
    dim : int
        The coordinates each device releases.
    plan : dict
        ``plan_population``'s.
    engine : EngineResult
        The private run: per-round records, every device's spent epsilon and exhaustion round.
    budgets : numpy.ndarray
        Every device's epsilon.
    no_privacy_accuracy : list of float
        The same federation without privacy, per round.
    seconds : dict
        Wall seconds of the ``private`` run, and of ``both`` runs (side by side when run in parallel).

    Examples
    --------
    >>> s = PopulationSettings(devices=20, per_round=10, rounds=1, budgets=(8.0,), min_reports=5, task="digits")
    >>> run = run_population(s)
    >>> bool(np.all(run.engine.spent_epsilon <= run.budgets))
    True
    """

    settings: PopulationSettings
    task: str
    fallback: str | None
    devices: int
    examples_per_device: float
    dim: int
    plan: dict[str, Any]
    engine: EngineResult
    budgets: np.ndarray
    no_privacy_accuracy: list[float]
    seconds: dict[str, float]

    @property
    def private_accuracy(self) -> list[float]:
        """The private run's test accuracy per round.

        Examples
        --------
        >>> s = PopulationSettings(devices=20, per_round=10, rounds=1, budgets=(8.0,), min_reports=5, task="digits")
        >>> len(run_population(s).private_accuracy)
        1
        """
        return [float("nan") if r.accuracy is None else float(r.accuracy) for r in self.engine.rounds]


def load_population_task(settings: PopulationSettings):
    """The task split among the devices, its test set cut to ``test_examples``, and the fallback taken.

    Parameters
    ----------
    settings : PopulationSettings
        ``task``, ``devices``, ``seed`` and ``test_examples``.

    Returns
    -------
    tuple
        ``(task, fallback)``: the Task, and None or why the requested data set was not used.

    Examples
    --------
    >>> task, fallback = load_population_task(PopulationSettings(devices=3000, task="digits"))
    >>> task.num_clients, fallback  # digits has 1,437 training examples: one device each at most
    (1437, 'digits has 1437 training examples: 1437 devices instead of 3000')
    """
    from fedfilter.simulations.tasks.registry import load_task

    fallback, name, devices = None, settings.task, settings.devices
    if name == "mnist":
        try:
            from fedfilter.simulations.tasks.mnist import load_mnist

            load_mnist(None)
        except (FileNotFoundError, OSError) as err:
            fallback, name = f"MNIST not found ({err}); ran scikit-learn's bundled digits", "digits"
    if name == "digits":
        from fedfilter.simulations.tasks.digits import load_digits

        examples = len(load_digits()[1])
        if devices > examples:
            note = f"digits has {examples} training examples: {examples} devices instead of {devices}"
            fallback, devices = note if fallback is None else f"{fallback}; {note}", examples
    task = load_task(name, num_clients=devices, seed=settings.seed)
    x, y = task.test_data
    if len(y) > settings.test_examples:
        rng = np.random.default_rng([settings.seed, 0x7E57])
        idx = np.sort(rng.choice(len(y), size=settings.test_examples, replace=False))
        task = dataclasses.replace(task, test_data=(np.ascontiguousarray(x[idx]), np.ascontiguousarray(y[idx])))
    return task, fallback


def _fraction(per_round: int, devices: int) -> float:
    """The engine's ``fraction`` that asks exactly ``per_round`` (it asks ``ceil(fraction * devices)``)."""
    f = per_round / devices
    while math.ceil(f * devices) > per_round:
        f = float(np.nextafter(f, 0.0))
    return f


def engine_config(settings: PopulationSettings, plan: dict[str, Any], budgets: np.ndarray) -> EngineConfig:
    """The private run's engine configuration.

    Parameters
    ----------
    settings : PopulationSettings
        The federation (``devices`` as it runs).
    plan : dict
        ``plan_population``'s (its ``noise_multiplier``).
    budgets : numpy.ndarray
        Every device's epsilon.

    Returns
    -------
    EngineConfig

    Raises
    ------
    ValueError
        When the settings ask for balanced passes or adaptive clipping and this engine has neither.

    Examples
    --------
    >>> s = PopulationSettings(devices=10, per_round=5, rounds=2, budgets=(8.0,), min_reports=5, task="digits")
    >>> config = engine_config(s, {"noise_multiplier": 2.0}, np.full(10, 8.0))
    >>> config.placement, config.filter_kind, config.fraction, float(config.worst_case_epsilon[0])
    ('distributed', 'rdp', 0.5, 40.0)
    """
    s = settings
    # min_reports x the budget, rounded up to 2 decimals: what the Flower demo enrols a simulated
    # device with (fedfilter.deploy.devices.simulated_worst_case_epsilon, tests/cli/test_demo_population.py).
    worst = np.ceil(np.asarray(budgets, dtype=np.float64) * int(s.min_reports) * 100) / 100
    extra: dict[str, Any] = {}
    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    if s.participation != "uniform":
        extra["participation"] = s.participation
    if s.adaptive_clipping is not None:
        extra["adaptive_clipping"] = s.adaptive_clipping
    missing = sorted(set(extra) - fields)
    if missing:
        raise ValueError(f"this engine has no {', '.join(missing)}: run the population demo without it.")
    return EngineConfig(
        task=s.task,
        num_clients=s.devices,
        epsilon=budgets,
        delta=s.delta,
        filter_kind=FILTER,
        noise_multiplier=plan["noise_multiplier"],
        clip=s.clip,
        placement="distributed",
        min_reports=s.min_reports,
        worst_case_epsilon=worst,
        after_exhaustion="noise-only",
        exhausted_below=EXHAUSTED_BELOW,
        noise_draw="aggregate",  # one Skellam draw for the sum: the same law as the sum of the shares
        norms="vectorised",
        rounds=s.rounds,
        fraction=_fraction(s.per_round, s.devices),
        local_epochs=s.local_epochs,
        lr=s.lr,
        batch_size=s.batch_size,
        server_lr=s.server_lr,
        seed=s.seed,
        run_id=RUN_ID,
        eval_every=1,
        group_by="none",
        torch_threads=1,
        **extra,
    )


def _no_privacy(
    settings: PopulationSettings, task=None, progress: Callable[[int, float], object] | None = None
) -> list[float]:
    """``no_privacy_accuracy`` for the federation as it runs (in a second process: ``task`` loaded there)."""
    if task is None:
        import torch

        torch.set_num_threads(1)
        task, _ = load_population_task(settings)
    return no_privacy_accuracy(
        task,
        per_round=settings.per_round,
        rounds=settings.rounds,
        local_epochs=settings.local_epochs,
        lr=settings.lr,
        batch_size=settings.batch_size,
        server_lr=settings.server_lr,
        seed=settings.seed,
        run_id=RUN_ID,
        participation=settings.participation,
        progress=progress,
    )


def _no_privacy_child(settings: PopulationSettings, send: Any) -> None:
    """The second process: the run without privacy, its result (or the error) sent back through ``send``."""
    import signal
    import traceback

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it ends this process
    try:
        send.send(("ok", _no_privacy(settings)))
    except Exception:  # noqa: BLE001 - reported by the parent
        send.send(("error", traceback.format_exc()))
    finally:
        send.close()


def run_population(
    settings: PopulationSettings,
    *,
    on_private: Callable[[RoundRecord], object] | None = None,
    on_no_privacy: Callable[[int, float], object] | None = None,
    parallel: bool = False,
) -> PopulationRun:
    """Plan, run the private federation and the same federation without privacy.

    Parameters
    ----------
    settings : PopulationSettings
        The federation.
    on_private : callable, optional
        Called with each private round's ``RoundRecord``.
    on_no_privacy : callable, optional
        Called as ``on_no_privacy(round_id, accuracy)`` after each round without privacy (not when
        ``parallel``).
    parallel : bool, optional
        Run the federation without privacy in a second process beside the private one (each on one
        torch thread: two cores finish both in about the time of one); else after it.

    Returns
    -------
    PopulationRun

    Examples
    --------
    >>> s = PopulationSettings(devices=20, per_round=10, rounds=1, budgets=(8.0,), min_reports=5, task="digits")
    >>> run_population(s).engine.rounds[0].released
    True
    """
    from fedfilter.simulations.tasks.training import get_weights

    task, fallback = load_population_task(settings)
    ran = dataclasses.replace(
        settings,
        task=task.name,
        devices=task.num_clients,
        per_round=min(settings.per_round, task.num_clients),
        min_reports=min(settings.min_reports, settings.per_round, task.num_clients),
    )
    dim = sum(int(w.size) for w in get_weights(task.model_fn()) if np.issubdtype(w.dtype, np.floating))
    plan = plan_population(ran, dim=dim)
    budgets = np.array([ran.budgets[k % len(ran.budgets)] for k in range(ran.devices)], dtype=np.float64)
    config = engine_config(ran, plan, budgets)
    started = time.monotonic()
    if parallel:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        receive, send = ctx.Pipe(duplex=False)
        child = ctx.Process(target=_no_privacy_child, args=(ran, send), daemon=True)
        child.start()
        send.close()  # the child holds the sending end now: if it dies, recv raises EOFError
        try:
            result = run_engine(config, on_private, task=task)
            private_s = time.monotonic() - started
            try:
                status, baseline = receive.recv()
            except EOFError:
                status, baseline = "error", f"it ended with exit code {child.exitcode} and no result"
            if status != "ok":
                raise RuntimeError(f"the run without privacy failed in its process:\n{baseline}")
        finally:  # also on Ctrl-C or an error here: the second process never outlives this one
            if child.is_alive():
                child.terminate()
            child.join()
    else:
        result = run_engine(config, on_private, task=task)
        private_s = time.monotonic() - started
        baseline = _no_privacy(ran, task, on_no_privacy)
    return PopulationRun(
        settings=ran,
        task=task.name,
        fallback=fallback,
        devices=task.num_clients,
        examples_per_device=sum(len(y) for _, y in task.train_data) / task.num_clients,
        dim=dim,
        plan=plan,
        engine=result,
        budgets=budgets,
        no_privacy_accuracy=baseline,
        seconds={"private": private_s, "both": time.monotonic() - started},
    )
