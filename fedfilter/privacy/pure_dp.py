"""Filters for pure-DP steps from Rogers, Roth, Ullman and Vadhan, "Privacy Odometers and Filters:
Pay-as-you-Go Composition" (NeurIPS 2016), the baselines.

Each step is ``eps_t``-DP with ``eps_t`` chosen adaptively.

* Basic composition filter (Rogers et al. 2016, Theorem 3.4): continue while ``sum eps_t <= eps_g``.
* Advanced filter (ibid. Theorem 5.1, eq. (6)): continue while ``K <= eps_g`` with

      K = sum eps_j (e^eps_j - 1)/2
          + sqrt(2 (sum eps_i^2 + x) (1 + log(sum eps_i^2 / x + 1)/2) log(1/delta_g)),
      x = eps_g^2 / (28.04 log(1/delta_g)),   valid for delta_g in (0, 1/e).

* Steps with ``delta_t > 0`` (ibid. Lemma 3.3): feed ``2 eps_t`` to the pure filter and also
  halt once ``sum 2 delta_t / (eps_t e^eps_t) > delta_g'``; the result is (eps_g, delta_g + delta_g')-DP.
  ``gaussian_as_approx_dp`` describes a Gaussian step as such an (eps_t, delta_t) pair through its
  exact curve, which is how the benchmark puts Gaussian rounds through these baselines.

The state of both filters is the pair of sufficient statistics
``(sum eps_t (e^eps_t - 1)/2, sum eps_t^2)`` plus ``sum eps_t``, each accumulated with upward rounding.
``ADVANCED_X_CONSTANT`` is the 28.04 of ``x`` above.

Examples
--------
Ten steps of 0.1 stay within a basic budget of 1.1, and within an advanced budget of 2.5:

>>> stats = (0.0, 0.0, 0.0)
>>> for _ in range(10):
...     stats = add_stats(stats, pure_step_stats(0.1))
>>> basic_admits(stats, 1.1), advanced_admits(stats, 2.5, 1e-5)
(True, True)
"""

from __future__ import annotations

import math

from fedfilter.checks import positive_finite
from fedfilter.privacy.gaussian_dp import delta_for_epsilon
from fedfilter.privacy.rounding import up

ADVANCED_X_CONSTANT = 28.04  # Rogers et al. 2016, Theorem 5.1 (the corrected constant, footnote 6)


def _check_budget(epsilon: float, delta: float, *, max_delta: float = 1.0) -> None:
    problems = []
    if (problem := positive_finite("epsilon", epsilon)) is not None:
        problems.append(problem)
    if not 0 < delta < max_delta:
        problems.append(f"delta must be in (0, {max_delta:.6g}). Found {delta!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def pure_step_stats(eps_t: float) -> tuple[float, float, float]:
    """``(eps_t, eps_t (e^eps_t - 1)/2, eps_t^2)``, each rounded up.

    Parameters
    ----------
    eps_t : float
        The step's epsilon, finite and >= 0.

    Returns
    -------
    tuple of float
        The step's contribution to the filters' state.

    Raises
    ------
    ValueError
        For a bad ``eps_t``.

    Examples
    --------
    >>> pure_step_stats(0.5)
    (0.5, 0.16218031767503208, 0.25000000000000006)
    >>> 0.5 * math.expm1(0.5) / 2
    0.16218031767503205
    """
    if not (math.isfinite(eps_t) and eps_t >= 0):
        raise ValueError(f"eps_t must be a finite number >= 0. Found {eps_t!r}.")
    return (eps_t, float(up(eps_t * math.expm1(eps_t) / 2)), float(up(eps_t * eps_t)))


def add_stats(a: tuple[float, float, float], b: tuple[float, float, float]) -> tuple[float, float, float]:
    """The sum of two states, each coordinate rounded up.

    Parameters
    ----------
    a, b : tuple of float
        Two states (or step contributions, ``pure_step_stats``).

    Returns
    -------
    tuple of float
        ``a + b`` coordinate-wise, rounded up.

    Examples
    --------
    >>> add_stats((0.5, 0.125, 0.25), (0.25, 0.25, 0.0625))  # exact sums, each one float up
    (0.7500000000000001, 0.37500000000000006, 0.31250000000000006)
    """
    return (float(up(a[0] + b[0])), float(up(a[1] + b[1])), float(up(a[2] + b[2])))


def basic_admits(stats: tuple[float, float, float], epsilon_g: float) -> bool:
    """Rogers et al. 2016, Theorem 3.4: continue while ``sum eps_t <= epsilon_g``.

    Parameters
    ----------
    stats : tuple of float
        The state (``sum eps_t`` first).
    epsilon_g : float
        The budget.

    Returns
    -------
    bool
        True while within the budget.

    Examples
    --------
    >>> stats = add_stats(pure_step_stats(0.5), pure_step_stats(0.25))
    >>> basic_admits(stats, 1.0), basic_admits(stats, 0.7)
    (True, False)
    """
    return stats[0] <= epsilon_g


def advanced_k(stats: tuple[float, float, float], epsilon_g: float, delta_g: float) -> float:
    """Rogers et al. 2016, Theorem 5.1, eq. (6): the quantity K, rounded up.

    Parameters
    ----------
    stats : tuple of float
        The state.
    epsilon_g : float
        The budget's epsilon, finite and > 0.
    delta_g : float
        The budget's delta, in (0, 1/e).

    Returns
    -------
    float
        K (the module docstring's formula), rounded up.

    Raises
    ------
    ValueError
        For a bad budget.

    Examples
    --------
    >>> stats = add_stats(pure_step_stats(0.5), pure_step_stats(0.25))
    >>> k = advanced_k(stats, 2.0, 1e-5)
    >>> x = 2.0**2 / (28.04 * math.log(1e5))
    >>> drift = 0.5 * math.expm1(0.5) / 2 + 0.25 * math.expm1(0.25) / 2
    >>> closed = drift + math.sqrt(2 * (0.3125 + x) * (1 + 0.5 * math.log(0.3125 / x + 1)) * math.log(1e5))
    >>> round(k, 10) == round(closed, 10)
    True
    """
    _check_budget(epsilon_g, delta_g, max_delta=1 / math.e)
    _, drift, sum_sq = stats
    log_inv = -math.log(delta_g)
    x = epsilon_g**2 / (ADVANCED_X_CONSTANT * log_inv)
    radical = 2 * (sum_sq + x) * (1 + 0.5 * math.log(sum_sq / x + 1)) * log_inv
    value = drift + math.sqrt(radical)
    return float(up(value + 16 * math.ulp(value)))


def advanced_admits(stats, epsilon_g: float, delta_g: float) -> bool:
    """Rogers et al. 2016, Theorem 5.1: continue while ``K <= epsilon_g`` (``advanced_k``).

    Parameters
    ----------
    stats : tuple of float
        The state.
    epsilon_g : float
        The budget's epsilon.
    delta_g : float
        The budget's delta, in (0, 1/e).

    Returns
    -------
    bool
        True while within the budget.

    Examples
    --------
    >>> stats = add_stats(pure_step_stats(0.5), pure_step_stats(0.25))
    >>> advanced_admits(stats, 2.0, 1e-5), advanced_admits(stats, 20.0, 1e-5)
    (False, True)
    """
    return advanced_k(stats, epsilon_g, delta_g) <= epsilon_g


def lemma33_delta_charge(eps_t: float, delta_t: float) -> float:
    """Rogers et al. 2016, Lemma 3.3: the step's share ``2 delta_t / (eps_t e^eps_t)`` of delta_g' (up).

    Parameters
    ----------
    eps_t : float
        The step's epsilon, > 0.
    delta_t : float
        The step's delta.

    Returns
    -------
    float
        The share, rounded up.

    Raises
    ------
    ValueError
        If ``eps_t <= 0``.

    Examples
    --------
    >>> lemma33_delta_charge(0.5, 1e-6), 2e-6 / (0.5 * math.exp(0.5))
    (2.426122638850538e-06, 2.4261226388505334e-06)
    """
    if eps_t <= 0:
        raise ValueError(f"eps_t must be > 0 for Lemma 3.3. Found {eps_t!r}.")
    return float(up(2 * delta_t / (eps_t * math.exp(eps_t)) * (1 + 8 * 2**-52)))


def gaussian_as_approx_dp(mu: float, eps_t: float) -> tuple[float, float]:
    """A ``mu``-GDP step is (eps_t, delta(eps_t; mu))-DP for every eps_t (exact curve, delta up).

    Parameters
    ----------
    mu : float
        The step's GDP parameter (``s / std``), > 0.
    eps_t : float
        The epsilon to describe it at, >= 0.

    Returns
    -------
    tuple of float
        ``(eps_t, delta_for_epsilon(eps_t, mu))``.

    Examples
    --------
    >>> gaussian_as_approx_dp(1.0, 1.0)
    (1.0, 0.12693673750664397)
    """
    return eps_t, delta_for_epsilon(eps_t, mu)
