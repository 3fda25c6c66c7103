"""Filters for pure-DP steps from papers/003 (Rogers, Roth, Ullman, Vadhan), the baselines.

Each step is ``eps_t``-DP with ``eps_t`` chosen adaptively.

* Basic composition filter (papers/003 Theorem 3.4): continue while ``sum eps_t <= eps_g``.
* Advanced filter (papers/003 Theorem 5.1, eq. (6)): continue while ``K <= eps_g`` with

      K = sum eps_j (e^eps_j - 1)/2
          + sqrt(2 (sum eps_i^2 + x) (1 + log(sum eps_i^2 / x + 1)/2) log(1/delta_g)),
      x = eps_g^2 / (28.04 log(1/delta_g)),   valid for delta_g in (0, 1/e).

* Steps with ``delta_t > 0`` (papers/003 Lemma 3.3): feed ``2 eps_t`` to the pure filter and also
  halt once ``sum 2 delta_t / (eps_t e^eps_t) > delta_g'``; the result is (eps_g, delta_g + delta_g')-DP.
  ``gaussian_as_approx_dp`` describes a Gaussian step as such an (eps_t, delta_t) pair through its
  exact curve, which is how the benchmark puts Gaussian rounds through these baselines.

The state of both filters is the pair of sufficient statistics
``(sum eps_t (e^eps_t - 1)/2, sum eps_t^2)`` plus ``sum eps_t``, each accumulated with upward rounding.
"""

from __future__ import annotations

import math

from fedfilter.checks import positive_finite
from fedfilter.privacy.gaussian_dp import delta_for_epsilon
from fedfilter.privacy.rounding import up

ADVANCED_X_CONSTANT = 28.04  # papers/003 Theorem 5.1 (the corrected constant, footnote 6)


def _check_budget(epsilon: float, delta: float, *, max_delta: float = 1.0) -> None:
    problems = []
    if (problem := positive_finite("epsilon", epsilon)) is not None:
        problems.append(problem)
    if not 0 < delta < max_delta:
        problems.append(f"delta must be in (0, {max_delta:.6g}). Found {delta!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def pure_step_stats(eps_t: float) -> tuple[float, float, float]:
    """``(eps_t, eps_t (e^eps_t - 1)/2, eps_t^2)``, each rounded up."""
    if not (math.isfinite(eps_t) and eps_t >= 0):
        raise ValueError(f"eps_t must be a finite number >= 0. Found {eps_t!r}.")
    return (eps_t, float(up(eps_t * math.expm1(eps_t) / 2)), float(up(eps_t * eps_t)))


def add_stats(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    return (float(up(a[0] + b[0])), float(up(a[1] + b[1])), float(up(a[2] + b[2])))


def basic_admits(stats: tuple[float, float, float], epsilon_g: float) -> bool:
    """papers/003 Theorem 3.4."""
    return stats[0] <= epsilon_g


def advanced_k(stats: tuple[float, float, float], epsilon_g: float, delta_g: float) -> float:
    """papers/003 Theorem 5.1, eq. (6): the quantity K, rounded up."""
    _check_budget(epsilon_g, delta_g, max_delta=1 / math.e)
    _, drift, sum_sq = stats
    log_inv = -math.log(delta_g)
    x = epsilon_g**2 / (ADVANCED_X_CONSTANT * log_inv)
    radical = 2 * (sum_sq + x) * (1 + 0.5 * math.log(sum_sq / x + 1)) * log_inv
    value = drift + math.sqrt(radical)
    return float(up(value + 16 * math.ulp(value)))


def advanced_admits(stats, epsilon_g: float, delta_g: float) -> bool:
    return advanced_k(stats, epsilon_g, delta_g) <= epsilon_g


def lemma33_delta_charge(eps_t: float, delta_t: float) -> float:
    """papers/003 Lemma 3.3: the step's share ``2 delta_t / (eps_t e^eps_t)`` of delta_g' (up)."""
    if eps_t <= 0:
        raise ValueError(f"eps_t must be > 0 for Lemma 3.3. Found {eps_t!r}.")
    return float(up(2 * delta_t / (eps_t * math.exp(eps_t)) * (1 + 8 * 2**-52)))


def gaussian_as_approx_dp(mu: float, eps_t: float) -> tuple[float, float]:
    """A ``mu``-GDP step is (eps_t, delta(eps_t; mu))-DP for every eps_t (exact curve, delta up)."""
    return eps_t, delta_for_epsilon(eps_t, mu)
