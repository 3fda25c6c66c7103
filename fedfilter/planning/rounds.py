"""Budget planning: how many full-norm rounds a fresh client gets, and what a run costs.

A "full-norm round" releases an update clipped to norm exactly C with noise std ``z * C`` (each
costs ``mu_t = 1/z``; in distributed placement, ``skellam_charge`` of the worst-case integer update).
The counts run the very filter, charge and rounding the client runs, so the planner never promises
a round the ledger would refuse. ``alone=True`` plans the worst-case account
(``client/ledger/worst_case.py``): each report read alone, under ``worst-case-epsilon``. Constants:
``MAX_PLANNED_ROUNDS`` (the most rounds counted), ``BASELINE_KINDS`` (the pure-DP baselines,
``baselines.py``), ``GAUSSIAN_ONLY_KINDS`` (the filters that may not account Skellam noise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.planning.baselines import _baseline_rounds
from fedfilter.privacy.filters import GaussianFilter, make_filter, rdp_order
from fedfilter.privacy.renyi import DEFAULT_ORDERS, epsilon_from_rdp
from fedfilter.privacy.rounding import down, mul_up, up
from fedfilter.privacy.skellam import l1_cap, released_variance, skellam_rho, skellam_share
from fedfilter.protocol.secagg.grid import grid_step

MAX_PLANNED_ROUNDS = 10_000_000
BASELINE_KINDS = ("basic", "advanced")


def _check_z(noise_multiplier: float) -> None:
    if (problem := positive_finite("noise_multiplier", noise_multiplier)) is not None:
        raise ValueError(problem)


@dataclass(frozen=True)
class RoundsPlan:
    """What a fresh client's filter admits at one noise multiplier (``plan_rounds``'s answer).

    Parameters
    ----------
    filter, epsilon, delta, noise_multiplier, rounds, last_round_fraction
        The filter kind (or baseline), the budget and ``z`` planned with; the full-norm rounds admitted;
        the norm fraction (of C, at most 1) the next, partial round may still carry (0 for a baseline).

    Examples
    --------
    >>> RoundsPlan("gdp", 4.0, 1e-5, 10.0, rounds=85, last_round_fraction=0.74).rounds
    85
    """

    filter: str
    epsilon: float
    delta: float
    noise_multiplier: float
    rounds: int  # full-norm rounds admitted
    last_round_fraction: float  # norm fraction (of C) the next, partial round may still carry


def _run_full_rounds(filt: GaussianFilter, noise_multiplier: float, limit: int) -> tuple[np.ndarray, int]:
    """Spend full-norm charges while the filter admits them."""
    return _run_charges(filt, float(filt.charge(sensitivity=1.0, noise_std=noise_multiplier)[0]), limit)


def _run_charges(filt: GaussianFilter, charge: float, limit: int) -> tuple[np.ndarray, int]:
    """Spend ``charge`` while the filter admits it: a scalar loop with the same rounding as
    ``GaussianFilter.spend`` (``add_up``) and ``within_budget`` (``<=``)."""
    s, b, k = 0.0, float(filt.budget[0]), 0
    while k < limit:
        nxt = math.nextafter(s + charge, math.inf)
        if nxt > b:
            break
        s, k = nxt, k + 1
    return np.array([s]), k


def plan_rounds(kind: str, *, epsilon: float, delta: float, noise_multiplier: float, orders=None) -> RoundsPlan:
    """Full-norm rounds a fresh client's filter admits at a noise multiplier, and what is left.

    Every round is charged as if the client's update had the full clip norm ``C`` (its largest
    cost), so the plan is a lower bound on the rounds the client actually contributes to.

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp", "basic", "advanced"}
        A filter of ``FILTER_KINDS``, or a baseline of Rogers, Roth, Ullman and Vadhan 2016: basic
        or advanced composition of pure-DP steps (Theorems 3.4 and 5.1), for comparison.
    epsilon, delta : float
        The client's lifetime budget: epsilon a finite number > 0, delta in (0, 1).
    noise_multiplier : float
        ``z``: each round's Gaussian noise std is ``z * C``. A finite number > 0.
    orders : sequence of float, optional
        The Rényi orders of the rdp filter (default ``renyi.DEFAULT_ORDERS``).

    Returns
    -------
    RoundsPlan
        ``rounds``: full-norm rounds admitted; ``last_round_fraction``: the share of ``C`` (at most
        1) the next, partial round may still carry.

    Raises
    ------
    ValueError
        Naming a bad argument and its value, or a noise multiplier too large to plan.

    Examples
    --------
    The gdp count is the closed form's: the filter continues while ``k / z^2 <= mu_B^2``.

    >>> from fedfilter.privacy.gaussian_dp import mu_for_budget
    >>> plan = plan_rounds("gdp", epsilon=4.0, delta=1e-5, noise_multiplier=10.0)
    >>> plan.rounds, int(mu_for_budget(4.0, 1e-5) ** 2 * 10.0**2), round(plan.last_round_fraction, 3)
    (85, 85, 0.741)
    """
    _check_z(noise_multiplier)
    if kind in BASELINE_KINDS:
        k = _baseline_rounds(kind, epsilon, delta, 1.0 / noise_multiplier)
        return RoundsPlan(kind, epsilon, delta, noise_multiplier, k, 0.0)
    filt = make_filter(kind, epsilon, delta, orders)
    state, k = _run_full_rounds(filt, noise_multiplier, MAX_PLANNED_ROUNDS)
    if k >= MAX_PLANNED_ROUNDS:
        raise ValueError(
            f"more than {MAX_PLANNED_ROUNDS} rounds; noise_multiplier={noise_multiplier} is too large to plan."
        )
    frac = float(filt.allowance(state, noise_std=noise_multiplier))
    return RoundsPlan(kind, epsilon, delta, noise_multiplier, k, min(frac, 1.0))


def plan_epsilon(kind: str, *, noise_multiplier: float, rounds: int, delta: float, orders=None) -> dict:
    """The smallest budget epsilon whose filter admits ``rounds`` full-norm rounds.

    ``fixed_composition_epsilon``: the same rounds fixed in advance (no filter); equal up to rounding,
    as no filter pays for adaptivity (for rdp: one threshold, the full delta; see filters.py).

    Parameters
    ----------
    kind : {"gdp", "rdp", "zcdp"}
        The filter kind.
    noise_multiplier, rounds, delta : float, int, float
        ``z`` (> 0), the full-norm rounds (>= 1) and the budget's delta.
    orders : sequence of float, optional
        The Rényi orders of the rdp filter (default ``renyi.DEFAULT_ORDERS``).

    Returns
    -------
    dict
        The arguments, ``epsilon`` and ``fixed_composition_epsilon``.

    Examples
    --------
    >>> from fedfilter.privacy.gaussian_dp import epsilon_for_mu  # 85 rounds at z = 10: sqrt(85)/10-GDP
    >>> plan = plan_epsilon("gdp", noise_multiplier=10.0, rounds=85, delta=1e-5)
    >>> round(plan["epsilon"], 9), round(epsilon_for_mu(math.sqrt(85) / 10, 1e-5), 9)
    (3.985179966, 3.985179966)
    """
    _check_z(noise_multiplier)
    if not (isinstance(rounds, int) and rounds >= 1):
        raise ValueError(f"rounds must be an integer >= 1. Found {rounds!r}.")
    # Any epsilon works for building the filter: only its charge and readout are used.
    filt = make_filter(kind, 1.0, delta, orders)
    charge = filt.charge(sensitivity=1.0, noise_std=noise_multiplier)
    state = filt.initial_state()
    for _ in range(rounds):
        state = filt.spend(state, charge)
    if kind == "rdp":
        # Gaussian-only rounds are (alpha, alpha rho)-RDP at every order, so the smallest budget whose
        # filter admits them reads the best order (epsilon_spent reads one filter's alpha* only, which
        # a state holding Skellam charges needs; see filters.py).
        eps = epsilon_from_rdp(filt.orders, mul_up(np.asarray(filt.orders), state[0]), delta)
    else:
        eps = filt.epsilon_spent(state)
    if kind == "rdp":  # dp_accounting's fixed composition: k rounds at order alpha cost k alpha / (2 z^2)
        per_order = np.asarray(filt.orders) * rounds / (2.0 * noise_multiplier**2)
        fixed = epsilon_from_rdp(filt.orders, up(per_order * (1 + 2.0**-50)), delta)  # 4 roundings
    else:
        fixed = eps
    return {
        "filter": kind,
        "noise_multiplier": noise_multiplier,
        "rounds": rounds,
        "delta": delta,
        "epsilon": eps,
        "fixed_composition_epsilon": fixed,
    }


# --- placement 'distributed': Skellam noise over SecAgg+ --------------------------------------------

GAUSSIAN_ONLY_KINDS = ("gdp", "zcdp")


def _check_setting(clip: float, min_reports: int, dim: int) -> None:
    problems = []
    if (problem := positive_finite("clip", clip)) is not None:
        problems.append(problem)
    if isinstance(min_reports, bool) or not isinstance(min_reports, int) or min_reports < 1:
        problems.append(f"min_reports must be an integer >= 1. Found {min_reports!r}.")
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        problems.append(f"dim (the model size) must be an integer >= 1. Found {dim!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def check_distributed_filter(kind: str) -> None:
    """Refuse the Gaussian-only filters for Skellam releases (``skellam.py``'s docstring).

    Parameters
    ----------
    kind : str
        The filter kind asked for; a ``ValueError`` unless ``"rdp"``.

    Examples
    --------
    >>> check_distributed_filter("rdp")
    """
    if kind in GAUSSIAN_ONLY_KINDS:
        raise ValueError(
            f"filter={kind!r}: placement 'distributed' (Skellam noise over SecAgg+) needs filter='rdp'; "
            "the gdp and zcdp filters are valid for Gaussian noise only."
        )
    if kind != "rdp":
        raise ValueError(f"filter must be 'rdp' for placement 'distributed'. Found {kind!r}.")


def distributed_mu(noise_multiplier: float, clip: float, min_reports: int, *, alone: bool = False) -> float:
    """The Skellam variance per coordinate a release carries, in grid units: ``mu_total = (z C /
    gamma)^2`` rounded down, each of ``min_reports`` shares ``skellam_share(mu_total, t)``, and the least
    variance of their sum (``released_variance``), whichever is smaller.

    Parameters
    ----------
    noise_multiplier, clip, min_reports : float, float, int
        ``z``, the clip norm ``C`` and ``t``, the fewest reports in a released sum.
    alone : bool, optional
        Return one report's share instead (what the worst-case account is charged at).

    Returns
    -------
    float

    Examples
    --------
    At C = 1 the grid step is ``2**-12``, so z = 1 asks for ``(1 / 2**-12)^2 = 2**24``:

    >>> round(distributed_mu(1.0, 1.0, 4)), round(distributed_mu(1.0, 1.0, 4, alone=True))
    (16777216, 4194304)
    """
    _check_z(noise_multiplier)
    _check_setting(clip, min_reports, 1)
    ratio = down(noise_multiplier * (clip / grid_step(clip)))  # clip / gamma is exact (gamma = 2**k)
    mu_total = float(down(ratio * ratio))
    share = skellam_share(mu_total, min_reports)
    return share if alone else min(mu_total, released_variance(share, min_reports))


@dataclass(frozen=True)
class DistributedPlan:
    """What a fresh client's rdp filter admits in distributed placement (``plan_distributed_rounds``).

    Parameters
    ----------
    epsilon, delta, noise_multiplier, clip, min_reports, dim
        The setting, as ``plan_distributed_rounds`` takes it.
    order, mu, l2, l1, charge : float
        alpha* (where Skellam charges are taken); the Skellam variance per coordinate (grid units);
        ``C / gamma``; ``l1_cap(l2, dim)``; one full-norm round's charge (rho units).
    rounds : int
        Full-norm rounds admitted.

    Examples
    --------
    >>> plan = plan_distributed_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=4.0, clip=1.0, min_reports=4, dim=1000)
    >>> plan.order, plan.l2, plan.rounds
    (6.1, 4096.0, 11)
    """

    epsilon: float
    delta: float
    noise_multiplier: float
    clip: float
    min_reports: int
    dim: int
    order: float  # alpha*, where the rdp filter's threshold holds and Skellam charges are taken
    mu: float  # Skellam variance per coordinate of a release (grid units)
    l2: float  # C / gamma: a full-norm update's L2 norm on the grid
    l1: float  # l1_cap(l2, dim): the worst-case L1 norm
    charge: float  # one full-norm round, in rho units
    rounds: int  # full-norm rounds admitted


def _full_round(filt, noise_multiplier: float, clip: float, min_reports: int, dim: int, alone: bool = False):
    mu = distributed_mu(noise_multiplier, clip, min_reports, alone=alone)
    l2 = clip / grid_step(clip)
    l1 = float(l1_cap(l2, dim))
    order = rdp_order(filt)
    return order, mu, l2, l1, float(skellam_rho(l1, l2, mu, order))


def plan_distributed_rounds(
    *,
    epsilon: float,
    delta: float,
    noise_multiplier: float,
    clip: float,
    min_reports: int,
    dim: int,
    kind: str = "rdp",
    orders=None,
    alone: bool = False,
) -> DistributedPlan:
    """Full-norm Skellam rounds a fresh client's rdp filter admits (worst-case L1 every round);
    ``alone``: its worst-case account's, each report read alone (``epsilon`` is then worst-case-epsilon).

    Parameters
    ----------
    epsilon, delta, noise_multiplier, clip : float
        The budget, ``z`` and the clip norm ``C``.
    min_reports, dim : int
        The fewest reports in a released sum, and the model size.
    kind, orders, alone : str, sequence of float, bool, optional
        Must be ``"rdp"``; the Rényi orders; plan the worst-case account instead.

    Returns
    -------
    DistributedPlan

    Examples
    --------
    The Skellam charge is a little above the Gaussian ``1 / (2 z^2)`` at the same variance:

    >>> plan = plan_distributed_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=4.0, clip=1.0, min_reports=4, dim=1000)
    >>> round(plan.charge, 6), 1 / (2 * 4.0**2), plan.rounds
    (0.03134, 0.03125, 11)
    """
    check_distributed_filter(kind)
    _check_z(noise_multiplier)
    _check_setting(clip, min_reports, dim)
    filt = make_filter("rdp", epsilon, delta, orders)
    order, mu, l2, l1, charge = _full_round(filt, noise_multiplier, clip, min_reports, dim, alone)
    _, rounds = _run_charges(filt, charge, MAX_PLANNED_ROUNDS)
    if rounds >= MAX_PLANNED_ROUNDS:
        raise ValueError(
            f"more than {MAX_PLANNED_ROUNDS} rounds; noise_multiplier={noise_multiplier} is too large to plan."
        )
    return DistributedPlan(epsilon, delta, noise_multiplier, clip, min_reports, dim, order, mu, l2, l1, charge, rounds)


def plan_distributed_epsilon(
    *,
    rounds: int,
    delta: float,
    noise_multiplier: float,
    clip: float,
    min_reports: int,
    dim: int,
    kind: str = "rdp",
    orders=None,
    alone: bool = False,
) -> dict:
    """The smallest budget epsilon (found by bisection, 60 steps) whose rdp filter admits ``rounds``
    full-norm Skellam rounds; the answer is itself checked (its filter admits them). ``alone``: the
    smallest worst-case-epsilon whose account admits them, each report read alone.

    ``fixed_composition_epsilon``: the same rounds fixed in advance, converted at the best order (no
    filter; often a little lower, as a filter holds one order fixed before the run).

    Parameters
    ----------
    rounds : int
        The number of full-norm rounds, in ``[1, MAX_PLANNED_ROUNDS)``.
    delta, noise_multiplier, clip, min_reports, dim, kind, orders, alone
        As ``plan_distributed_rounds`` takes them.

    Returns
    -------
    dict
        The setting, ``epsilon``, its filter's ``order`` and ``fixed_composition_epsilon``.

    Examples
    --------
    >>> setting = dict(delta=1e-5, noise_multiplier=4.0, clip=1.0, min_reports=4, dim=1000)
    >>> eps = plan_distributed_epsilon(rounds=11, **setting)["epsilon"]
    >>> eps <= 4.0, plan_distributed_rounds(epsilon=eps, **setting).rounds
    (True, 11)
    """
    check_distributed_filter(kind)
    _check_z(noise_multiplier)
    _check_setting(clip, min_reports, dim)
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds < MAX_PLANNED_ROUNDS:
        raise ValueError(f"rounds must be an integer in [1, {MAX_PLANNED_ROUNDS}). Found {rounds!r}.")

    def admits(eps: float) -> bool:
        filt = make_filter("rdp", eps, delta, orders)
        charge = _full_round(filt, noise_multiplier, clip, min_reports, dim, alone)[4]
        return _run_charges(filt, charge, rounds)[1] >= rounds

    hi = 1.0
    while not admits(hi):
        hi *= 2
        if hi > 1e6:
            raise ValueError(f"no epsilon up to 1e6 admits {rounds} rounds at noise_multiplier={noise_multiplier}.")
    lo = 0.0
    for _ in range(60):  # hi is always a checked, admitting epsilon
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if admits(mid) else (mid, hi)
    orders_arr = np.asarray(DEFAULT_ORDERS if orders is None else orders, dtype=np.float64)
    mu = distributed_mu(noise_multiplier, clip, min_reports, alone=alone)
    l2 = clip / grid_step(clip)
    per_order = up(skellam_rho(float(l1_cap(l2, dim)), l2, mu, orders_arr) * orders_arr * rounds * (1 + 2.0**-48))
    return {
        "filter": "rdp",
        "placement": "distributed",
        "noise_multiplier": noise_multiplier,
        "clip": clip,
        "min_reports": min_reports,
        "dim": dim,
        "rounds": rounds,
        "delta": delta,
        "epsilon": hi,
        "order": rdp_order(make_filter("rdp", hi, delta, orders)),
        "fixed_composition_epsilon": epsilon_from_rdp(orders_arr.tolist(), per_order.tolist(), delta),
    }


def rounds_admitted(
    kind: str,
    *,
    epsilon: float,
    delta: float,
    noise_multiplier: float,
    limit: int,
    placement: str = "local",
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
    orders=None,
    alone: bool = False,
) -> int:
    """``min(rounds a fresh client's filter admits, limit)``: cheap where ``plan_rounds`` would count
    millions. ``alone`` (distributed): the worst-case account's, under ``epsilon`` = worst-case-epsilon.

    Parameters
    ----------
    kind : str
        A filter kind, or a baseline of ``BASELINE_KINDS`` (local placement only).
    epsilon, delta, noise_multiplier, limit
        The budget, ``z``, and the count's cap, in ``[1, MAX_PLANNED_ROUNDS)``.
    placement, clip, min_reports, dim, orders, alone : optional
        ``"local"`` (default) or ``"distributed"``; the rest as ``plan_distributed_rounds`` takes them.

    Returns
    -------
    int

    Examples
    --------
    >>> rounds_admitted("gdp", epsilon=4.0, delta=1e-5, noise_multiplier=10.0, limit=50)
    50
    >>> rounds_admitted("gdp", epsilon=4.0, delta=1e-5, noise_multiplier=10.0, limit=1000)
    85
    """
    _check_z(noise_multiplier)
    if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit < MAX_PLANNED_ROUNDS:
        raise ValueError(f"limit must be an integer in [1, {MAX_PLANNED_ROUNDS}). Found {limit!r}.")
    if placement == "distributed":
        check_distributed_filter(kind)
        _check_setting(clip, min_reports, dim)
        filt = make_filter("rdp", epsilon, delta, orders)
        charge = _full_round(filt, noise_multiplier, clip, min_reports, dim, alone)[4]
        return _run_charges(filt, charge, limit)[1]
    if kind in BASELINE_KINDS:
        return min(plan_rounds(kind, epsilon=epsilon, delta=delta, noise_multiplier=noise_multiplier).rounds, limit)
    return _run_full_rounds(make_filter(kind, epsilon, delta, orders), noise_multiplier, limit)[1]


def admits_rounds(kind: str, *, rounds: int, **setting) -> bool:
    """Whether a fresh client's filter admits ``rounds`` full-norm rounds (``rounds_admitted``'s settings).

    Parameters
    ----------
    kind : str
        The filter kind (or baseline).
    rounds : int
        The number of rounds, in ``[1, MAX_PLANNED_ROUNDS)``.
    **setting
        ``rounds_admitted``'s keyword arguments except ``limit``.

    Returns
    -------
    bool

    Examples
    --------
    >>> setting = dict(epsilon=4.0, delta=1e-5, noise_multiplier=10.0)
    >>> admits_rounds("gdp", rounds=85, **setting), admits_rounds("gdp", rounds=86, **setting)
    (True, False)
    """
    if isinstance(rounds, bool) or not isinstance(rounds, int) or not 1 <= rounds < MAX_PLANNED_ROUNDS:
        raise ValueError(f"rounds must be an integer in [1, {MAX_PLANNED_ROUNDS}). Found {rounds!r}.")
    return rounds_admitted(kind, limit=rounds, **setting) >= rounds
