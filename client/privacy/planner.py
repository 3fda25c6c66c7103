"""Budget planning: how many full-norm rounds a fresh client gets, and what a run costs.

A "full-norm round" releases an update clipped to norm exactly C with noise std ``z * C``, so
every round costs ``mu_t = 1/z``. The counts come from running the very filter the client runs
(the same rounding), so the planner never promises a round the ledger would refuse.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfilter.client.privacy import pure_dp
from fedfilter.client.privacy.filters import GaussianFilter, make_filter
from fedfilter.client.privacy.renyi import epsilon_from_rdp
from fedfilter.client.privacy.rounding import mul_up, up

MAX_PLANNED_ROUNDS = 10_000_000
BASELINE_KINDS = ("basic", "advanced")


def _check_z(noise_multiplier: float) -> None:
    if not (isinstance(noise_multiplier, (int, float)) and math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be a finite number > 0. Found {noise_multiplier!r}.")


@dataclass(frozen=True)
class RoundsPlan:
    filter: str
    epsilon: float
    delta: float
    noise_multiplier: float
    rounds: int  # full-norm rounds admitted
    last_round_fraction: float  # norm fraction (of C) the next, partial round may still carry


def _run_full_rounds(filt: GaussianFilter, noise_multiplier: float, limit: int) -> tuple[np.ndarray, int]:
    """Spend full-norm charges while the filter admits them: a scalar loop with the same rounding
    as ``GaussianFilter.spend`` (``add_up``) and ``within_budget`` (``<=``)."""
    charge = float(filt.charge(sensitivity=1.0, noise_std=noise_multiplier)[0])
    s, b, k = 0.0, float(filt.budget[0]), 0
    while k < limit:
        nxt = math.nextafter(s + charge, math.inf)
        if nxt > b:
            break
        s, k = nxt, k + 1
    return np.array([s]), k


def plan_rounds(kind: str, *, epsilon: float, delta: float, noise_multiplier: float, orders=None) -> RoundsPlan:
    """Full-norm rounds a fresh client admits under filter ``kind`` (gdp, rdp, zcdp, basic, advanced)."""
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

    Also reports ``fixed_composition_epsilon``: the epsilon of the same rounds fixed in advance
    (no filter) under the kind's own conversion. It equals ``epsilon`` up to rounding: none of the
    filters pays anything for adaptivity (for rdp: one threshold, the full delta; see filters.py).
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


# --- papers/003 baselines for Gaussian rounds, through papers/003 Lemma 3.3 ---------------------


def _basic_feasible(k: int, epsilon: float, delta: float, mu: float) -> bool:
    # Lemma 3.3 feeds 2 eps_t to the pure filter: k * 2 eps_t <= epsilon (Theorem 3.4, delta_g = 0),
    # and spends delta' = delta on sum 2 delta_t / (eps_t e^eps_t).
    # k upward-rounded additions each add at most one ulp: leave room for them.
    eps_t = epsilon / (2 * k) * (1 - (4 * k + 8) * 2.0**-52)
    _, delta_t = pure_dp.gaussian_as_approx_dp(mu, eps_t)
    stats = (0.0, 0.0, 0.0)
    step = pure_dp.pure_step_stats(2 * eps_t)
    dsum = 0.0
    dstep = pure_dp.lemma33_delta_charge(eps_t, delta_t)
    for _ in range(k):  # k is small for these baselines
        stats = pure_dp.add_stats(stats, step)
        dsum = math.nextafter(dsum + dstep, math.inf)
    return pure_dp.basic_admits(stats, epsilon) and dsum <= delta


def _advanced_feasible(k: int, epsilon: float, delta: float, mu: float) -> bool:
    for share in (0.1, 0.25, 0.5, 0.75, 0.9):  # split delta between delta_g and Lemma 3.3's delta_g'
        delta_g, delta_p = delta * share, delta * (1 - share)
        lo, hi = 0.0, epsilon  # largest per-step eps_t with K(k steps of 2 eps_t) <= epsilon
        for _ in range(60):
            mid = (lo + hi) / 2
            stats = tuple(k * x for x in pure_dp.pure_step_stats(2 * mid))
            stats = tuple(math.nextafter(x, math.inf) * (1 + k * 2.0**-52) for x in stats)
            if pure_dp.advanced_admits(stats, epsilon, delta_g):
                lo = mid
            else:
                hi = mid
        if lo <= 0:
            continue
        _, delta_t = pure_dp.gaussian_as_approx_dp(mu, lo)
        if k * pure_dp.lemma33_delta_charge(lo, delta_t) * (1 + k * 2.0**-52) <= delta_p:
            return True
    return False


def _baseline_rounds(kind: str, epsilon: float, delta: float, mu: float) -> int:
    feasible = _basic_feasible if kind == "basic" else _advanced_feasible
    if kind == "advanced" and not delta < 1 / math.e:
        raise ValueError(f"the advanced filter needs delta < 1/e. Found {delta!r}.")
    if not feasible(1, epsilon, delta, mu):
        return 0
    lo, hi = 1, 2
    while feasible(hi, epsilon, delta, mu):
        lo, hi = hi, hi * 2
        if hi > 1_000_000:
            raise ValueError("more than a million baseline rounds; plan with a smaller noise multiplier.")
    while hi - lo > 1:  # feasibility is monotone in k
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if feasible(mid, epsilon, delta, mu) else (lo, mid)
    return lo
