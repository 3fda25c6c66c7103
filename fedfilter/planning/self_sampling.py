"""The plan's part for devices that sample themselves: the z, the asks each device spreads its budget
over, each budget's rate and rdp order, and the mean rate the coordinator divides by.

``plan_strategy(..., sampling=True)`` (``fedfilter plan --sampling``) puts this under ``"sampling"``;
``IndividualFilterStrategy.from_plan`` sends ``planned_asks`` with every request and divides the mean
by ``expected_rate``; each device's owner enrols at its budget's ``order`` (node-config ``rdp-order``).
Nothing here binds a device: its rate is its own (``client/mechanisms/sampled.py``), from what its
accounts have left, and any rate is accounted.

Examples
--------
>>> section = sampling_section(epsilons=[2.0, 6.0], delta=1e-5, asks=6, noise_multipliers=[2.0])
>>> section["noise_multiplier"], section["planned_asks"], [round(r, 2) for r in section["rates"]]
(2.0, 6, [0.27, 1.0])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from fedfilter.planning.sampled_rounds import enrolment_order, plan_sampling

__all__ = ["sampling_section"]


def sampling_section(
    *,
    epsilons: Sequence[float],
    delta: float,
    asks: int,
    placement: str = "local",
    min_reports: int = 1,
    dim: int = 1,
    noise_multipliers: Sequence[float] | None = None,
    noise_limit: float | None = None,
    cap: float = 1.0,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The ``"sampling"`` part of a plan: ``plan_sampling`` for budgets in equal shares, and each budget's order.

    Parameters
    ----------
    epsilons : sequence of float
        The budgets (one, or the tiers), in equal shares.
    delta : float
        Their delta.
    asks : int
        The asks per device the participation plans.
    placement, min_reports, dim : optional
        Where the noise is added, the threshold and the model's size (distributed placement).
    noise_multipliers : sequence of float, optional
        The z to choose from (default ``plan_sampling``'s grid); one value fixes it.
    noise_limit : float, optional
        The largest z the devices accept (distributed: SecAgg+'s range for the devices asked).
    cap : float, optional
        The owners' largest rate.
    progress : callable, optional
        Passed to ``plan_sampling``.

    Returns
    -------
    dict
        ``noise_multiplier``, ``planned_asks``, ``expected_rate`` (the budgets' mean rate), ``budgets``,
        ``rates``, ``orders`` (one per budget), ``signal_per_noise``, ``spending_limit`` (the largest z
        that spends every budget, or None) and ``spends_every_budget``.

    Examples
    --------
    >>> sampling_section(epsilons=[8.0], delta=1e-5, asks=10, noise_multipliers=[1.0])["orders"]
    [3.1]
    """
    budgets = sorted({float(e) for e in epsilons})
    plan = plan_sampling(
        budgets=budgets,
        delta=delta,
        asks=asks,
        cap=cap,
        noise_multipliers=None if noise_multipliers is None else [float(z) for z in noise_multipliers],
        noise_limit=noise_limit,
        placement=placement,
        clip=1.0,  # the Skellam charge at a power-of-two clip is the largest over the grid's binade
        min_reports=min_reports,
        dim=dim,
        progress=progress,
    )
    orders = [
        float(enrolment_order(epsilon=e, delta=delta, noise_multiplier=plan.noise_multiplier, asks=asks, cap=cap))
        for e in budgets
    ]
    return {
        "noise_multiplier": plan.noise_multiplier,
        "planned_asks": int(asks),
        "expected_rate": max(plan.mean_rate, 1e-6),
        "budgets": budgets,
        "rates": [float(q) for q in plan.rates],
        "orders": orders,
        "signal_per_noise": plan.signal_per_noise,
        "spending_limit": plan.spending_limit,
        "spends_every_budget": plan.spends_every_budget,
    }
