"""The population demo's federation and its plan: who is asked, how often, and the noise the budgets pay for.

``PopulationSettings`` holds what the operator chooses (devices, devices asked per round, rounds, the
budget tiers, the SecAgg+ threshold, the clip and the training); ``plan_population`` takes the rest
from ``fedfilter.planning``, never by hand:

* the asks a device is planned for: under uniform sampling the ``plan_quantile`` of
  ``Binomial(rounds, per_round / devices)`` (``participation.asks_planned``), under balanced passes
  ``ceil(rounds * per_round / devices)`` (``participation.balanced_asks``);
* the noise multiplier ``z``: the least whose planned asks at full clip the SMALLEST budget's own
  filter admits (``federation.plan_federation``'s ``least_affordable_noise_multiplier``), rounded up
  to two decimals and checked again (``rounds.admits_rounds``), so every device can pay for every ask
  the plan makes;
* the figures a reader checks the plan by: the released mean's expected noise norm over the clip
  (``federation.mean_noise_norm``) and the devices per round the planner would want for it to be at
  most half the clip.

Pure: no torch, no I/O.

Examples
--------
>>> plan = plan_population(PopulationSettings(devices=6000, per_round=500, rounds=20), dim=26010)
>>> plan["asks_planned"], plan["noise_multiplier"], round(plan["noise_to_clip"], 2)
(3, 7.01, 5.06)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from fedfilter.checks import int_in, positive_finite, short_repr
from fedfilter.planning.federation import plan_federation
from fedfilter.planning.participation import asks_planned, balanced_asks
from fedfilter.planning.rounds import admits_rounds
from fedfilter.protocol.adaptive_clip import AdaptiveClipping

__all__ = ["MAX_DEMO_EPSILON", "PARTICIPATIONS", "PopulationSettings", "plan_population", "planned_noise_multiplier"]

# The demo's promise: no device it enrols holds a budget above this.
MAX_DEMO_EPSILON = 8.0
PARTICIPATIONS = ("uniform", "balanced")
FILTER = "rdp"  # the Skellam mechanism's accountant (distributed placement needs it)


@dataclass(frozen=True)
class PopulationSettings:
    """A population of devices on the vectorised engine, with distributed noise over (simulated) SecAgg+.

    Parameters
    ----------
    devices : int
        Devices in the federation; the task's training data are split IID among them.
    per_round : int
        Devices asked per round, at most ``devices``.
    rounds : int
        Rounds of the run.
    budgets : tuple of float
        The budget tiers: device ``k`` holds ``budgets[k % len(budgets)]`` (epsilon at ``delta``),
        each in ``(0, MAX_DEMO_EPSILON]``.
    delta : float
        Every device's delta.
    min_reports : int
        The SecAgg+ threshold ``m``: a round is released only from the sum of at least ``m`` reports,
        and each device's Skellam share is calibrated to it (at most ``per_round``).
    clip : float
        The clip norm ``C`` of each update.
    task : str
        ``mnist`` (the offline copy) or ``digits`` (bundled with scikit-learn).
    local_epochs, lr, batch_size : int, float, int
        Each device's local SGD.
    server_lr : float
        The coordinator's step on the released mean.
    seed : int
        The initial model, the sampling and every noise stream.
    test_examples : int
        The size of the random subset of the test set each round is evaluated on.
    participation : {"uniform", "balanced"}
        How devices are asked: uniformly at random each round (the engine's ``fraction``), or in
        balanced passes (needs an engine with ``participation``).
    plan_quantile : float
        Uniform sampling: the quantile of a device's asks the plan pays for.
    adaptive_clipping : AdaptiveClipping or None
        Andrew et al.'s adaptive clip (needs an engine with ``adaptive_clipping``); None: fixed clip.

    Examples
    --------
    >>> PopulationSettings().budgets
    (1.0, 2.0, 4.0, 8.0)
    >>> PopulationSettings(budgets=(2.0, 16.0))
    Traceback (most recent call last):
    ...
    ValueError: invalid PopulationSettings: budgets must be numbers in (0, 8]. Found (2.0, 16.0).
    """

    devices: int = 6000
    per_round: int = 500
    rounds: int = 20
    budgets: tuple[float, ...] = (1.0, 2.0, 4.0, 8.0)
    delta: float = 1e-5
    min_reports: int = 100
    clip: float = 0.5
    task: str = "mnist"
    local_epochs: int = 1
    lr: float = 0.3
    batch_size: int = 10
    server_lr: float = 1.0
    seed: int = 0
    test_examples: int = 2000
    participation: str = "uniform"
    plan_quantile: float = 0.9
    adaptive_clipping: AdaptiveClipping | None = field(default=None)

    def __post_init__(self) -> None:
        problems = []
        for name in ("devices", "per_round", "rounds", "min_reports", "local_epochs", "batch_size", "test_examples"):
            if not int_in(getattr(self, name), 1, 2**40):
                problems.append(f"{name} must be a positive integer. Found {short_repr(getattr(self, name))}.")
        if not problems and self.per_round > self.devices:
            problems.append(f"per_round must be at most devices={self.devices}. Found {self.per_round}.")
        if not problems and self.min_reports > self.per_round:
            problems.append(f"min_reports must be at most per_round={self.per_round}. Found {self.min_reports}.")
        for name in ("clip", "lr", "server_lr"):
            if (problem := positive_finite(name, getattr(self, name))) is not None:
                problems.append(problem)
        b = self.budgets
        if not (
            isinstance(b, tuple)
            and b
            and all(positive_finite("epsilon", e) is None and e <= MAX_DEMO_EPSILON for e in b)
        ):
            problems.append(f"budgets must be numbers in (0, {MAX_DEMO_EPSILON:g}]. Found {short_repr(b)}.")
        if not (isinstance(self.delta, float) and 0 < self.delta < 1):
            problems.append(f"delta must be a number in (0, 1). Found {short_repr(self.delta)}.")
        if self.participation not in PARTICIPATIONS:
            problems.append(f"participation must be one of {PARTICIPATIONS}. Found {short_repr(self.participation)}.")
        if not (isinstance(self.plan_quantile, float) and 0 < self.plan_quantile < 1):
            problems.append(f"plan_quantile must be a number in (0, 1). Found {short_repr(self.plan_quantile)}.")
        if self.adaptive_clipping is not None:
            problems += self.adaptive_clipping.problems()
        if problems:
            raise ValueError("invalid PopulationSettings: " + " ".join(problems))


def planned_noise_multiplier(plan: dict[str, Any], *, rounds: int, delta: float) -> float:
    """The least noise multiplier of a ``plan_federation`` plan, rounded up to two decimals and checked.

    ``rounds`` full-clip rounds at the plan's budget, placement, clip, ``min_reports`` and ``dim`` are
    admitted by a fresh device's own filter at the returned multiplier (``rounds.admits_rounds``);
    rounding only ever goes up.

    Parameters
    ----------
    plan : dict
        ``fedfilter.planning.federation.plan_federation``'s result.
    rounds : int
        The full-clip rounds (asks) the plan was made for.
    delta : float
        The budget's delta.

    Returns
    -------
    float
        The noise multiplier, two decimals.

    Raises
    ------
    ValueError
        When no multiplier up to the planner's limit fits the rounds in the budget.

    Examples
    --------
    The gdp filter admits ``k`` full rounds at ``z`` while ``k / z^2 <= mu^2``:

    >>> from fedfilter.privacy.gaussian_dp import mu_for_budget
    >>> plan = plan_federation(devices=10, dim=10, noise_multiplier=1.0, clip=1.0, epsilon=1.0, delta=1e-5, rounds=5)
    >>> z = planned_noise_multiplier(plan, rounds=5, delta=1e-5)
    >>> z, math.ceil(math.sqrt(5) / mu_for_budget(1.0, 1e-5) * 100) / 100
    (8.35, 8.35)
    """
    least = plan["least_affordable_noise_multiplier"]
    if least is None:
        raise ValueError(
            f"no noise multiplier fits {rounds} full-clip rounds in a budget of epsilon {plan['epsilon']:g}: "
            "plan fewer rounds or asks"
        )
    setting = dict(placement=plan["placement"], clip=plan["clip"], min_reports=plan["min_reports"], dim=plan["dim"])
    z = math.ceil(least * 100) / 100  # rounded up: never below what the budget pays for
    while not admits_rounds(
        plan["filter"], rounds=rounds, epsilon=plan["epsilon"], delta=delta, noise_multiplier=z, **setting
    ):
        z = round(z + 0.01, 2)
    return z


def plan_population(settings: PopulationSettings, *, dim: int) -> dict[str, Any]:
    """The asks each device is planned for, the noise multiplier the smallest budget pays for, and
    what the released mean then carries.

    Parameters
    ----------
    settings : PopulationSettings
        The federation.
    dim : int
        The coordinates each device releases (the model's parameters).

    Returns
    -------
    dict
        ``asks_planned``, ``participation``, ``plan_quantile`` (None under balanced passes),
        ``planned_epsilon`` (the smallest budget), ``noise_multiplier`` (z, the accounted one),
        ``mean_noise_norm`` and ``noise_to_clip`` (the released mean of ``per_round`` reports),
        ``devices_for_half_clip`` (the planner's devices per round for a noise norm of half the clip
        at its own multiplier, with ``min_reports`` equal to them) and ``verdict`` (the planner's).

    Raises
    ------
    ValueError
        When no noise multiplier up to the planner's limit fits the planned asks.

    Examples
    --------
    >>> s = PopulationSettings(devices=1000, per_round=100, rounds=10, budgets=(8.0,), min_reports=50)
    >>> p = plan_population(s, dim=2410)
    >>> p["asks_planned"], p["noise_multiplier"]
    (2, 0.91)
    """
    s = settings
    if s.participation == "balanced":
        asks, quantile = balanced_asks(s.rounds, s.per_round, s.devices), None
    else:
        asks, quantile = asks_planned(s.rounds, s.per_round, s.devices, s.plan_quantile), s.plan_quantile
    asks = max(asks, 1)
    epsilon = min(s.budgets)
    federation: dict[str, Any] = dict(
        devices=s.per_round,
        dim=dim,
        clip=s.clip,
        epsilon=epsilon,
        delta=s.delta,
        rounds=asks,
        placement="distributed",
        min_reports=s.min_reports,
        filter=FILTER,
    )
    z = planned_noise_multiplier(plan_federation(noise_multiplier=1.0, **federation), rounds=asks, delta=s.delta)
    plan = plan_federation(noise_multiplier=z, **federation)  # the figures at the planned z
    return {
        "participation": s.participation,
        "asks_planned": asks,
        "plan_quantile": quantile,
        "planned_epsilon": epsilon,
        "noise_multiplier": z,
        "mean_noise_norm": plan["mean_noise_norm"],
        "noise_to_clip": plan["noise_to_clip"],
        "devices_for_half_clip": plan["recommended"].get("devices"),
        "verdict": plan["verdict"],
    }
