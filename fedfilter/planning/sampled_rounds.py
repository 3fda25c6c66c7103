"""What a device's own coin buys: the asks a fresh device's filter admits when it samples itself.

Asked in a round, the device contributes its clipped update with probability ``sampling_rate`` and
otherwise only the noise (``privacy/subsampled.py``). Each ask is charged the Poisson-subsampled
loss at the device's order, whatever the coin shows: in local placement the exact sampled Gaussian
(Mironov, Talwar and Zhang 2019), in distributed placement Zhu and Wang 2019's general bound over the
Skellam curve of the sum (``alone``: of the device's own share, its worst-case account). The filter is
the rdp filter at that single integer order (``order_for_rate`` unless given): Feldman and Zrnic
2021, Theorem 4.3 at a fixed order, docs/derivations/amplification.md. The count runs the filter's
own rounding (``rounds._run_charges``), so the plan never promises an ask the ledger would refuse.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.planning.rounds import (
    MAX_PLANNED_ROUNDS,
    _check_setting,
    _check_z,
    _run_charges,
    check_distributed_filter,
    distributed_mu,
)
from fedfilter.privacy.bisection import MIN_RATE, largest_rate
from fedfilter.privacy.filters import make_filter
from fedfilter.privacy.rounding import up
from fedfilter.privacy.skellam import l1_cap
from fedfilter.privacy.subsampled import (
    SUBSAMPLED_ORDERS,
    order_for_rate,
    sampled_gaussian_rdp,
    subsampled_skellam_rdp,
)
from fedfilter.protocol.request import PLACEMENTS
from fedfilter.protocol.secagg.grid import grid_step


@dataclass(frozen=True)
class SampledPlan:
    """What a fresh device's filter admits when it samples itself (``plan_sampled_rounds``'s answer).

    Parameters
    ----------
    epsilon, delta, noise_multiplier, sampling_rate, placement
        The setting planned.
    order : int or float
        The filter's single Rényi order (``SUBSAMPLED_ORDERS``).
    charge : float
        One full-clip ask, in the rdp filter's units (``eps(order) / order``), rounded up.
    rounds : int
        Full-clip asks admitted (each charged whether or not the coin put the update in).

    Examples
    --------
    >>> plan = plan_sampled_rounds(epsilon=1.0, delta=1e-5, noise_multiplier=1.1, sampling_rate=0.01)
    >>> plan.order, plan.rounds, round(plan.expected_contributions, 2)
    (10.6, 141, 1.41)
    """

    epsilon: float
    delta: float
    noise_multiplier: float
    sampling_rate: float
    placement: str
    order: int | float
    charge: float
    rounds: int

    @property
    def expected_contributions(self) -> float:
        """``rounds * sampling_rate``: how many of those asks carry the update, on average.

        Examples
        --------
        >>> SampledPlan(1.0, 1e-5, 1.1, 0.01, "local", 10.6, 9.7e-05, 141).expected_contributions
        1.41
        """
        return self.rounds * self.sampling_rate


def _check_rate(sampling_rate: float) -> None:
    if isinstance(sampling_rate, bool) or not isinstance(sampling_rate, (int, float)) or not 0 < sampling_rate <= 1:
        raise ValueError(f"sampling_rate must be a number in (0, 1]. Found {sampling_rate!r}.")


def full_ask_charge(
    *,
    order: int | float,
    noise_multiplier: float,
    sampling_rate: float,
    placement: str = "local",
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
    alone: bool = False,
) -> float:
    """One full-clip ask at ``sampling_rate``, in the rdp filter's units at ``order`` (rounded up).

    Parameters
    ----------
    order : int or float
        The filter's order (``SUBSAMPLED_ORDERS``).
    noise_multiplier, sampling_rate : float
        ``z`` and the device's rate ``q`` in (0, 1].
    placement : {"local", "distributed"}
        Gaussian noise on each report, or Skellam noise over SecAgg+.
    clip, min_reports, dim, alone : optional
        Distributed placement: the clip, the fewest reports in a sum, the model size, and whether the
        charge is the worst-case account's (one report read alone).

    Returns
    -------
    float

    Examples
    --------
    At rate 1 a local ask costs the Gaussian ``1 / (2 z^2)``:

    >>> round(full_ask_charge(order=8, noise_multiplier=2.0, sampling_rate=1.0), 12), 1 / (2 * 2.0**2)
    (0.125, 0.125)
    """
    _check_z(noise_multiplier)
    _check_rate(sampling_rate)
    if placement == "local":
        loss = sampled_gaussian_rdp(sampling_rate, 1.0 / noise_multiplier, order)
    elif placement == "distributed":
        _check_setting(clip, min_reports, dim)
        mu = distributed_mu(noise_multiplier, clip, min_reports, alone=alone)
        l2 = clip / grid_step(clip)
        loss = subsampled_skellam_rdp(sampling_rate, float(l1_cap(l2, dim)), l2, mu, order)
    else:
        raise ValueError(f"placement must be one of {PLACEMENTS}. Found {placement!r}.")
    return float(up(float(loss) / order))


def plan_sampled_rounds(
    *,
    epsilon: float,
    delta: float,
    noise_multiplier: float,
    sampling_rate: float,
    placement: str = "local",
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
    kind: str = "rdp",
    order: int | float | None = None,
    alone: bool = False,
) -> SampledPlan:
    """Full-clip asks a fresh device's filter admits when it contributes with probability ``sampling_rate``.

    Parameters
    ----------
    epsilon, delta : float
        The device's lifetime budget (with ``alone``: its worst-case-epsilon).
    noise_multiplier : float
        ``z``: the noise std is ``z C`` (in the sum, distributed).
    sampling_rate : float
        ``q`` in (0, 1]: the device's own coin.
    placement : {"local", "distributed"}, optional
    clip, min_reports, dim, alone : optional
        As ``full_ask_charge`` takes them (distributed placement).
    kind : str, optional
        Must be ``"rdp"``: a subsampled release has no exact Gaussian-DP or zCDP curve.
    order : int, optional
        The filter's order (default ``order_for_rate``: the best for a local ask at this rate and z).

    Returns
    -------
    SampledPlan

    Raises
    ------
    ValueError
        Naming a bad argument and its value, a filter other than rdp, or a setting too generous to count.

    Examples
    --------
    At rate 1 it is the rdp filter's count at that order; sampling at 0.05 buys far more asks:

    >>> whole = plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=2.0, sampling_rate=1.0)
    >>> sampled = plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=2.0, sampling_rate=0.05)
    >>> whole.rounds, sampled.rounds
    (2, 989)
    """
    if kind != "rdp":
        raise ValueError(
            f"filter={kind!r}: a device that samples itself needs filter='rdp' (a subsampled release has an "
            "exact Rényi curve, not a Gaussian-DP or zCDP one)."
        )
    if placement == "distributed":
        check_distributed_filter(kind)
    _check_z(noise_multiplier)
    _check_rate(sampling_rate)
    if order is None:
        order = order_for_rate(epsilon, delta, rate=sampling_rate, noise_multiplier=noise_multiplier)
    elif isinstance(order, bool) or not isinstance(order, (int, float)) or order not in SUBSAMPLED_ORDERS:
        raise ValueError(f"order must be one of SUBSAMPLED_ORDERS (2 to {SUBSAMPLED_ORDERS[-1]}). Found {order!r}.")
    filt = make_filter("rdp", epsilon, delta, [float(order)])
    charge = full_ask_charge(
        order=order,
        noise_multiplier=noise_multiplier,
        sampling_rate=sampling_rate,
        placement=placement,
        clip=clip,
        min_reports=min_reports,
        dim=dim,
        alone=alone,
    )
    if charge <= 0:
        raise ValueError(
            f"noise_multiplier={noise_multiplier} at sampling_rate={sampling_rate} costs nothing to count."
        )
    _, rounds = _run_charges(filt, charge, MAX_PLANNED_ROUNDS)
    if rounds >= MAX_PLANNED_ROUNDS:
        raise ValueError(
            f"more than {MAX_PLANNED_ROUNDS} asks; noise_multiplier={noise_multiplier} at "
            f"sampling_rate={sampling_rate} is too generous to plan."
        )
    return SampledPlan(epsilon, delta, noise_multiplier, sampling_rate, placement, order, charge, rounds)


def _admits(epsilon: float, delta: float, z: float, q: float, asks: int, setting: dict) -> bool:
    order = order_for_rate(epsilon, delta, rate=q, noise_multiplier=z)
    filt = make_filter("rdp", epsilon, delta, [float(order)])
    charge = full_ask_charge(order=order, noise_multiplier=z, sampling_rate=q, **setting)
    return _run_charges(filt, charge, asks)[1] >= asks


def _saturating_z(epsilon: float, delta: float, asks: int, cap: float, setting: dict) -> float | None:
    """The least z (to 1e-6 relative, rounded up) at which a fresh device's filter admits ``asks`` asks
    at rate ``cap``; None above 64 (no plan saturates there)."""
    lo, hi = math.log(0.05), math.log(64.0)
    if not _admits(epsilon, delta, math.exp(hi), cap, asks, setting):
        return None
    if _admits(epsilon, delta, math.exp(lo), cap, asks, setting):
        return math.exp(lo)
    while hi - lo > 1e-6:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _admits(epsilon, delta, math.exp(mid), cap, asks, setting) else (mid, hi)
    return math.exp(hi)


def rate_for_budget(
    *,
    epsilon: float,
    delta: float,
    noise_multiplier: float,
    asks: int,
    cap: float = 1.0,
    placement: str = "local",
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
) -> float:
    """The largest sampling rate, at most ``cap``, at which a fresh device's filter admits ``asks``
    full-clip asks: the rate that spends a budget over the asks a plan expects (Boenisch et al.,
    "Have it your way", NeurIPS 2023, give each privacy group its own rate the same way).

    The asks admitted fall as the rate grows (at every order, so also at the best one), so bisection
    on ``log q`` applies (``bisection.largest_rate``); each step counts with the
    filter's own charge and rounding at the order ``order_for_rate`` picks for that rate.

    Parameters
    ----------
    epsilon, delta : float
        The device's budget.
    noise_multiplier : float
        The plan's ``z``.
    asks : int
        The asks the plan expects for the device (>= 1).
    cap : float, optional
        The owner's largest rate, in (0, 1].
    placement, clip, min_reports, dim : optional
        As ``full_ask_charge`` takes them.

    Returns
    -------
    float
        The rate; 0.0 when not even ``bisection.MIN_RATE`` fits.

    Raises
    ------
    ValueError
        Naming a bad ``asks`` or ``cap``.

    Examples
    --------
    A budget of 2 over 100 asks at z 1.1; a budget of 6 contributes more often:

    >>> small = rate_for_budget(epsilon=2.0, delta=1e-5, noise_multiplier=1.1, asks=100)
    >>> large = rate_for_budget(epsilon=6.0, delta=1e-5, noise_multiplier=1.1, asks=100)
    >>> round(small, 3), round(large, 3)
    (0.029, 0.091)
    """
    if isinstance(asks, bool) or not isinstance(asks, int) or not 1 <= asks < MAX_PLANNED_ROUNDS:
        raise ValueError(f"asks must be an integer in [1, {MAX_PLANNED_ROUNDS}). Found {asks!r}.")
    _check_rate(cap)
    _check_z(noise_multiplier)
    setting = dict(placement=placement, clip=clip, min_reports=min_reports, dim=dim)

    def fits(rate):
        return np.asarray(_admits(epsilon, delta, noise_multiplier, float(rate), asks, setting))

    return float(largest_rate(fits, cap, ()))


def enrolment_order(
    *, epsilon: float, delta: float, noise_multiplier: float, asks: int, cap: float = 1.0
) -> int | float:
    """The one order a device that samples itself enrols its rdp filter at (node-config ``rdp-order``):
    ``order_for_rate`` at the rate its budget buys over the plan's asks (``rate_for_budget``; the
    smallest rate where not even that fits). Public numbers only, fixed before the first charge.

    Parameters
    ----------
    epsilon, delta : float
        The device's budget.
    noise_multiplier : float
        The plan's ``z``.
    asks : int
        The asks per device the plan expects.
    cap : float, optional
        The owner's largest rate.

    Returns
    -------
    int or float

    Examples
    --------
    >>> enrolment_order(epsilon=1.0, delta=1e-5, noise_multiplier=1.1, asks=141)
    10.6
    """
    rate = rate_for_budget(epsilon=epsilon, delta=delta, noise_multiplier=noise_multiplier, asks=asks, cap=cap)
    return order_for_rate(epsilon, delta, rate=max(rate, MIN_RATE), noise_multiplier=noise_multiplier)


@dataclass(frozen=True)
class SamplingPlan:
    """The noise and the rates a federation of self-sampling devices runs at (``plan_sampling``).

    Parameters
    ----------
    noise_multiplier : float
        The ``z`` chosen.
    asks : int
        The asks each device is planned for.
    budgets, shares, rates : tuple of float
        Each budget (epsilon), the fraction of the devices holding it, and the rate its rule gives at
        ``noise_multiplier`` (``rate_for_budget``).
    signal_per_noise : float
        ``sum(shares * rates) / z``: the expected contributions per ask over the noise, what the plan
        maximises.
    spending_limit : float or None
        The largest ``z`` at which every budget is spent over the asks: the largest budget's rate
        reaches the cap there, and above it that budget ends with some unspent (None: no budget reaches
        the cap below 64).

    Examples
    --------
    >>> SamplingPlan(2.0, 6, (2.0, 6.0), (0.5, 0.5), (0.27, 1.0), 0.32).mean_rate
    0.635
    """

    noise_multiplier: float
    asks: int
    budgets: tuple[float, ...]
    shares: tuple[float, ...]
    rates: tuple[float, ...]
    signal_per_noise: float
    spending_limit: float | None = None

    @property
    def mean_rate(self) -> float:
        """The expected fraction of the asked devices whose update is in their reply.

        Examples
        --------
        >>> SamplingPlan(2.0, 6, (2.0,), (1.0,), (0.25,), 0.125).mean_rate
        0.25
        """
        return float(sum(s * q for s, q in zip(self.shares, self.rates)))

    @property
    def spends_every_budget(self) -> bool:
        """Whether, asked as planned, every budget ends spent (``z`` at most ``spending_limit``).

        Examples
        --------
        >>> SamplingPlan(2.0, 6, (2.0, 6.0), (0.5, 0.5), (0.27, 1.0), 0.32, spending_limit=1.99).spends_every_budget
        False
        """
        return self.spending_limit is None or self.noise_multiplier <= self.spending_limit


def plan_sampling(
    *,
    budgets: list[float],
    shares: list[float] | None = None,
    delta: float,
    asks: int,
    cap: float = 1.0,
    noise_multipliers: list[float] | None = None,
    noise_limit: float | None = None,
    placement: str = "local",
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> SamplingPlan:
    """The ``z`` at which self-sampling devices spend every budget and put the most expected signal over
    the noise into the released mean, and each budget's rate there.

    At a given ``z`` every device's rule (``rate_for_budget``: its budget over the planned asks) fixes
    its rate ``q_i``; the asked devices then contribute ``sum_i share_i q_i`` updates per ask on average,
    against noise of std ``z C`` (in the sum, distributed; per report, local: both scale with ``z`` alone
    at a fixed number asked), so the plan takes the ``z`` that maximises ``sum_i share_i q_i / z`` among
    those at which every budget is spent: at most the largest budget's saturating ``z`` (its
    ``spending_limit``), where its rate reaches ``cap``. Above it the largest budgets would run at the cap
    and end with budget unspent, however much signal per noise that bought (Boenisch et al., "Have it
    your way", NeurIPS 2023, fix their "Sample" rates so that every group exhausts its budget at the
    horizon the same way). A small ``z`` buys only small rates.

    Parameters
    ----------
    budgets : list of float
        The budgets (epsilon) in the federation.
    shares : list of float, optional
        The fraction of the devices holding each (default equal); they must sum to 1.
    delta : float
        The devices' delta.
    asks : int
        The asks each device is planned for.
    cap : float, optional
        The largest rate a device takes.
    noise_multipliers : list of float, optional
        The ``z`` to choose from (default 24 values from 0.5 to 8, evenly spaced in log, with each
        budget's saturating ``z`` and ``noise_limit``). When none of them spends every budget, the
        smallest is taken (one value fixes ``z``).
    noise_limit : float, optional
        The largest ``z`` the devices accept (distributed placement: SecAgg+'s range for the devices
        asked, ``protocol.secagg.grid.largest_noise_multiplier``).
    placement, clip, min_reports, dim : optional
        As ``full_ask_charge`` takes them.
    progress : callable, optional
        ``progress(done, total)`` after each budget's rate at each ``z`` (the search's unit of work,
        about a second each): a command line shows it.

    Returns
    -------
    SamplingPlan

    Raises
    ------
    ValueError
        Naming bad budgets or shares, or a ``noise_limit`` below every ``z`` given.

    Examples
    --------
    Budget tiers 2 / 6, six asks each: the larger budget contributes more often. Its rate reaches 1 at
    z 1.99, so z 2 (rates 0.27 and 1, more signal over noise) would leave part of it unspent:

    >>> plan = plan_sampling(budgets=[2.0, 6.0], shares=[0.5, 0.5], delta=1e-5, asks=6, noise_multipliers=[1.5, 2.0])
    >>> plan.noise_multiplier, [round(q, 2) for q in plan.rates], round(plan.spending_limit, 2)
    (1.5, [0.16, 0.63], 1.99)
    """
    if not budgets or not all(isinstance(e, (int, float)) and math.isfinite(e) and e > 0 for e in budgets):
        raise ValueError(f"budgets must be a non-empty list of finite numbers > 0. Found {budgets!r}.")
    shares = [1.0 / len(budgets)] * len(budgets) if shares is None else list(shares)
    if len(shares) != len(budgets) or any(s < 0 for s in shares) or abs(sum(shares) - 1) > 1e-9:
        raise ValueError(f"shares must give one fraction per budget, summing to 1. Found {shares!r}.")
    if noise_limit is not None and (problem := positive_finite("noise_limit", noise_limit)) is not None:
        raise ValueError(problem)
    setting: dict[str, Any] = dict(placement=placement, clip=clip, min_reports=min_reports, dim=dim)
    # Saturating z falls as the budget grows: the largest budget's bounds every budget's spending.
    spending_limit = _saturating_z(float(max(budgets)), delta, asks, cap, setting)
    grid = noise_multipliers or [float(0.5 * 16 ** (i / 23)) for i in range(24)]
    if noise_multipliers is None:
        # The score peaks where a budget's rate reaches the cap (below it, q / z barely moves: the
        # subsampled loss is about q^2 times the unsampled one). The smaller budgets saturate above
        # the spending limit, so of those peaks only the limit itself can be chosen: it joins the grid,
        # which alone could miss it by a step (0.5 * 16^(1/23), 13%), and so does the noise limit.
        grid = sorted({*grid, *(z for z in (spending_limit, noise_limit) if z)})
    accepted = [float(z) for z in grid if noise_limit is None or z <= noise_limit]
    if not accepted:
        raise ValueError(f"noise_limit {noise_limit!r} is below every noise multiplier given ({sorted(grid)!r}).")
    spending = [z for z in accepted if spending_limit is None or z <= spending_limit]
    candidates = spending or [min(accepted)]
    total, done = len(candidates) * len(budgets), 0
    best: SamplingPlan | None = None
    for z in candidates:
        rates_at_z = []
        for e in budgets:
            rates_at_z.append(
                rate_for_budget(epsilon=float(e), delta=delta, noise_multiplier=z, asks=asks, cap=cap, **setting)
            )
            done += 1
            if progress is not None:
                progress(done, total)
        rates = tuple(rates_at_z)
        score = sum(s * q for s, q in zip(shares, rates)) / z
        if best is None or score > best.signal_per_noise:
            best = SamplingPlan(z, asks, tuple(map(float, budgets)), tuple(shares), rates, score, spending_limit)
    assert best is not None
    return best
