"""The baselines of ``plan_rounds``: Gaussian rounds through pure-DP filters (private helpers).

Rogers, Roth, Ullman and Vadhan, "Privacy Odometers and Filters: Pay-as-you-Go Composition" (NeurIPS
2016): basic and advanced composition filters (Theorems 3.4 and 5.1), fed with Gaussian rounds
through Lemma 3.3 (``fedfilter.privacy.pure_dp``). For comparison only; split from ``rounds.py``.
"""

from __future__ import annotations

import math

from fedfilter.privacy import pure_dp


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
