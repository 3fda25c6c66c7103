"""Privacy odometers: a bound on the privacy loss so far, valid at every round at once.

A filter (``filters.py``) halts before a budget fixed in advance is exceeded; its guarantee is the
budget. An odometer (Rogers, Roth, Ullman and Vadhan, "Privacy Odometers and Filters: Pay-as-you-Go
Composition", NeurIPS 2016, Definition 3.2) instead reports after every round k a number ``COMP_k``
such that, with probability at least ``1 - delta_g``, the realized privacy loss ``Loss_k <= COMP_k``
for EVERY k simultaneously, with the privacy parameters chosen adaptively: the transcript up to a
device's stop is ``(COMP_k, delta_g)``-DP. All values round UP.

Pure-DP steps (Rogers et al. 2016):

* ``basic_odometer``: Theorem 3.4, ``sum eps_i`` (delta_g = 0).
* ``advanced_odometer``: Theorem 6.5, equations (11) and (12).
* ``lemma33_odometer``: Lemma 3.3, steps with delta_i > 0 through a pure-DP odometer.

Gaussian and Rényi steps (what fedfilter charges): time-uniform bounds from Ville's inequality on
the privacy-loss supermartingale (Whitehouse, Ramdas, Rogers and Wu, "Fully-Adaptive Composition in
Differential Privacy", ICML 2023, Section 5; the stitching of Howard, Ramdas, McAuliffe and Sekhon,
Annals of Statistics 2021):

* ``gdp_odometer``: ``V/2 + min_j (log(1/d_j)/lambda_j + lambda_j V/2)``, ``V = sum mu_t^2``, over
  levels ``j`` with budgets ``B_j = GDP_FIRST_LEVEL * GDP_RATIO^j`` (``gdp_level``; at most
  ``MAX_LEVELS``), ``lambda_j = sqrt(2 log(1/d_j) / B_j)`` and ``d_j = delta_g / ((j+1)(j+2))``.
* ``rdp_odometer``: ``sum eps_t(alpha) + log(1/delta_g)/(alpha - 1)`` at the rdp filter's single
  order alpha* (Feldman and Zrnic, "Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021,
  the supermartingale of the proof of Theorem 3.1).

The derivations (and why these bound the loss from above only) are in docs/derivations/odometers.md.

Examples
--------
Gaussian releases with ``sum mu_t^2 = 1`` (e.g. 100 rounds at noise multiplier 10): the loss is
at most about 6.23 at every round at once, with probability ``1 - 1e-5``:

>>> round(gdp_odometer(1.0, delta_g=1e-5), 4)
6.2268
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from fedfilter.privacy.filters import GaussianFilter, rdp_order
from fedfilter.privacy.pure_dp import lemma33_delta_charge
from fedfilter.privacy.rounding import mul_up, up

# Relative slack added to every float formula: far above its few-ulp rounding error, far below
# any precision that matters (the tests check each value against mpmath at 50 digits).
_SLACK = 1e-13
MAX_LEVELS = 200  # gdp odometer levels: first_level * ratio^199 covers any budget a device holds
GDP_FIRST_LEVEL = 1e-3  # B_0 in mu^2 units: a history below this is read at the B_0 level
GDP_RATIO = 2.0  # B_{j+1} / B_j


def _up(value: float) -> float:
    return float(up(value * (1 + _SLACK)))


def _check_delta_g(delta_g: float, *, upper: float = 1.0) -> None:
    if not (isinstance(delta_g, (int, float)) and 0 < delta_g < upper):
        raise ValueError(f"delta_g must be in (0, {upper:.6g}). Found {delta_g!r}.")


def check_losses(name: str, values: Sequence[float]) -> list[float]:
    """The per-step losses as floats; each must be finite and >= 0.

    Parameters
    ----------
    name : str
        The argument's name, for the message.
    values : sequence of float
        The losses.

    Returns
    -------
    list of float
        The values as floats.

    Raises
    ------
    ValueError
        Naming the first bad value.

    Examples
    --------
    >>> check_losses("epsilons", [0.1, 1])
    [0.1, 1.0]
    >>> check_losses("epsilons", [0.1, -1])
    Traceback (most recent call last):
    ...
    ValueError: epsilons must be finite numbers >= 0. Found -1.0.
    """
    out = [float(v) for v in values]
    bad = [v for v in out if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"{name} must be finite numbers >= 0. Found {bad[0]!r}.")
    return out


def basic_odometer(epsilons: Sequence[float]) -> float:
    """Rogers et al. 2016, Theorem 3.4: ``COMP(eps_1, 0, ..., eps_k, 0) = sum eps_i`` (valid at delta_g = 0).

    Parameters
    ----------
    epsilons : sequence of float
        The pure-DP steps' epsilons, each >= 0.

    Returns
    -------
    float
        ``sum eps_i``, rounded up; 0 for no steps.

    Examples
    --------
    >>> basic_odometer([0.5, 0.25]), basic_odometer([])
    (0.750000000000075, 0.0)
    """
    eps = check_losses("epsilons", epsilons)
    return _up(math.fsum(eps)) if eps else 0.0


def advanced_branch(epsilons: Sequence[float], n: int) -> int:
    """11 where Rogers et al. 2016 Theorem 6.5's ``sum eps_i^2`` lies in [1/n^2, 1], else 12.

    Parameters
    ----------
    epsilons : sequence of float
        The pure-DP steps' epsilons.
    n : int
        Theorem 6.5's ``n``, >= 2.

    Returns
    -------
    int
        The number of the equation that applies (11 or 12).

    Raises
    ------
    ValueError
        For a bad epsilon or ``n``.

    Examples
    --------
    >>> advanced_branch([0.1] * 10, 100), advanced_branch([0.001], 10)
    (11, 12)
    """
    eps = check_losses("epsilons", epsilons)
    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an integer >= 2 (Theorem 6.5 takes log(n) and log2(n)). Found {n!r}.")
    sum_sq = math.fsum(e * e for e in eps)
    return 11 if 1 / n**2 <= sum_sq <= 1 else 12


def advanced_odometer(epsilons: Sequence[float], *, delta_g: float, n: int) -> float:
    """Rogers et al. 2016, Theorem 6.5 (advanced privacy odometer), rounded up; delta_g in (0, 1/e).

    Equation (11), where ``sum eps_i^2`` lies in [1/n^2, 1]:
        sum eps_i (e^eps_i - 1)/2 + sqrt(2 sum eps_i^2 (log(110 e) + 2 log(log(n) / delta_g)))
    Equation (12), otherwise:
        sum eps_i (e^eps_i - 1)/2
        + sqrt(2 (1/n^2 + sum eps_i^2)(1 + log(1 + n^2 sum eps_i^2)/2) log(4 log2(n) / delta_g))

    Parameters
    ----------
    epsilons : sequence of float
        The pure-DP steps' epsilons.
    delta_g : float
        The odometer's failure probability, in (0, 1/e).
    n : int
        Theorem 6.5's ``n``, >= 2.

    Returns
    -------
    float
        The bound, rounded up.

    Examples
    --------
    Ten steps of 0.1 (``sum eps_i^2 = 0.1``: equation (11)):

    >>> advanced_odometer([0.1] * 10, delta_g=1e-5, n=100)
    2.5737237157526427
    >>> drift = 10 * 0.1 * math.expm1(0.1) / 2
    >>> round(drift + math.sqrt(2 * 0.1 * (math.log(110 * math.e) + 2 * math.log(math.log(100) / 1e-5))), 10)
    2.5737237158
    """
    _check_delta_g(delta_g, upper=1 / math.e)
    branch = advanced_branch(epsilons, n)
    eps = [float(e) for e in epsilons]
    drift = math.fsum(e * math.expm1(e) / 2 for e in eps)
    sum_sq = math.fsum(e * e for e in eps)
    if branch == 11:
        radical = 2 * sum_sq * (math.log(110 * math.e) + 2 * math.log(math.log(n) / delta_g))
    else:
        x = 1 / n**2
        radical = 2 * (x + sum_sq) * (1 + 0.5 * math.log1p(n**2 * sum_sq)) * math.log(4 * math.log2(n) / delta_g)
    return _up(drift + math.sqrt(radical))


def lemma33_odometer(
    pure_odometer: Callable[[list[float]], float],
    epsilons: Sequence[float],
    deltas: Sequence[float],
    delta_g_prime: float,
) -> float:
    """Rogers et al. 2016, Lemma 3.3: an odometer for (eps_i, delta_i) steps, valid at ``delta_g + delta_g'``.

    ``inf`` once ``sum 2 delta_i / (eps_i e^eps_i) > delta_g'``, else the pure-DP odometer
    (valid at delta_g) at ``(2 eps_1, ..., 2 eps_k)``. A step with delta_i = 0 charges nothing.

    Parameters
    ----------
    pure_odometer : callable
        A pure-DP odometer, e.g. ``basic_odometer``.
    epsilons : sequence of float
        The steps' epsilons.
    deltas : sequence of float
        The steps' deltas, one per epsilon.
    delta_g_prime : float
        The share of delta the steps' deltas may use, in [0, 1).

    Returns
    -------
    float
        The bound, or ``inf`` once the deltas exceed ``delta_g_prime``.

    Raises
    ------
    ValueError
        For bad or mismatched losses, or a bad ``delta_g_prime``.

    Examples
    --------
    >>> lemma33_odometer(basic_odometer, [0.5, 0.25], [1e-6, 0.0], 1e-5)  # 2 * (0.5 + 0.25)
    1.50000000000015
    >>> lemma33_odometer(basic_odometer, [0.5], [1e-3], 1e-5)
    inf
    """
    eps = check_losses("epsilons", epsilons)
    dels = check_losses("deltas", deltas)
    if len(eps) != len(dels):
        raise ValueError(f"deltas must have one entry per epsilon. Found {len(dels)} for {len(eps)}.")
    if not (isinstance(delta_g_prime, (int, float)) and 0 <= delta_g_prime < 1):
        raise ValueError(f"delta_g_prime must be in [0, 1). Found {delta_g_prime!r}.")
    charge = 0.0
    for e, d in zip(eps, dels, strict=True):
        if d > 0:
            charge = float(up(charge + lemma33_delta_charge(e, d)))  # raises for eps_i = 0 < delta_i
    if charge > delta_g_prime:
        return math.inf
    return pure_odometer([2 * e for e in eps])


def gdp_level(j: int, first_level: float = GDP_FIRST_LEVEL, ratio: float = GDP_RATIO) -> tuple[float, float]:
    """Level j of the gdp odometer: ``(B_j, w_j)`` = ``(first_level ratio^j, 1/((j+1)(j+2)))``.

    Parameters
    ----------
    j : int
        The level, >= 0.
    first_level : float, optional
        ``B_0`` in ``mu^2`` units (default ``GDP_FIRST_LEVEL``).
    ratio : float, optional
        ``B_{j+1} / B_j`` (default ``GDP_RATIO``).

    Returns
    -------
    tuple of float
        The level's budget and its share of delta_g (the shares sum to 1 over all levels).

    Examples
    --------
    >>> gdp_level(0), gdp_level(3)
    ((0.001, 0.5), (0.008, 0.05))
    """
    return first_level * ratio**j, 1.0 / ((j + 1) * (j + 2))


def gdp_odometer(
    sum_mu_sq: float,
    *,
    delta_g: float,
    first_level: float = GDP_FIRST_LEVEL,
    ratio: float = GDP_RATIO,
) -> float:
    """A bound on the privacy loss of adaptively chosen Gaussian releases, from ``sum mu_t^2``.

    ``V/2 + min_j (log(1/d_j)/lambda_j + lambda_j V/2)`` over the levels of the module docstring,
    valid for every round at once with probability ``1 - delta_g``; rounded up.

    Parameters
    ----------
    sum_mu_sq : float
        ``V = sum mu_t^2`` over the releases so far, >= 0.
    delta_g : float
        The failure probability, in (0, 1).
    first_level : float, optional
        ``B_0`` (default ``GDP_FIRST_LEVEL``).
    ratio : float, optional
        ``B_{j+1} / B_j`` (default ``GDP_RATIO``), > 1.

    Returns
    -------
    float
        The bound on the loss; exactly 0 when ``V == 0``.

    Raises
    ------
    ValueError
        For a bad ``sum_mu_sq``, ``delta_g`` or level setting.

    Examples
    --------
    At ``V = B_j`` for some level the bound is ``V/2 + 2 sqrt(log(1/d_j) V / 2)``: level 10 has
    ``B_10 = 1.024`` and ``d_10 = delta_g / 132``:

    >>> round(gdp_odometer(1.024, delta_g=1e-5), 10)
    6.3066915095
    >>> round(1.024 / 2 + 2 * math.sqrt(math.log(132 / 1e-5) * 1.024 / 2), 10)
    6.3066915095
    """
    _check_delta_g(delta_g)
    v = float(sum_mu_sq)
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"sum_mu_sq must be a finite number >= 0. Found {sum_mu_sq!r}.")
    if not (math.isfinite(first_level) and first_level > 0 and math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"levels need first_level > 0 and ratio > 1. Found {first_level!r}, {ratio!r}.")
    if v == 0:  # no release carried data: every mu_t = 0, so M_k = 0 and the loss is exactly 0
        return 0.0
    best = math.inf
    for j in range(MAX_LEVELS):
        b_j, w_j = gdp_level(j, first_level, ratio)
        log_inv = -math.log(delta_g * w_j)
        lam = math.sqrt(2 * log_inv / b_j)
        best = min(best, log_inv / lam + lam * v / 2)
        # Past the first level with B_j >= V the terms only grow (sqrt(log(1/d_j) B_j / 2) (1 +
        # V / B_j) increases in B_j for B_j >= V, and log(1/d_j) increases in j): stop there.
        if b_j >= v:
            break
    return _up(v / 2 + best)


def rdp_odometer(sum_rdp: float, *, order: float, delta_g: float) -> float:
    """``sum eps_t(alpha) + log(1/delta_g)/(alpha - 1)``: a bound on the loss at every round at once
    (Ville on the supermartingale of Feldman and Zrnic 2021's proof of Theorem 3.1 at the one order
    alpha), rounded up.

    ``sum_rdp`` is the Rényi loss at ``order`` (for an rdp ledger ``alpha* * rho``).

    Parameters
    ----------
    sum_rdp : float
        The Rényi loss so far at ``order``, >= 0.
    order : float
        The Rényi order, > 1.
    delta_g : float
        The failure probability, in (0, 1).

    Returns
    -------
    float
        The bound; exactly 0 when ``sum_rdp == 0``.

    Raises
    ------
    ValueError
        For a bad argument.

    Examples
    --------
    >>> round(rdp_odometer(2.0, order=8.0, delta_g=1e-5), 10), round(2.0 + math.log(1e5) / 7, 10)
    (3.6447036379, 3.6447036379)
    """
    _check_delta_g(delta_g)
    r = float(sum_rdp)
    if not (math.isfinite(r) and r >= 0):
        raise ValueError(f"sum_rdp must be a finite number >= 0. Found {sum_rdp!r}.")
    if not (math.isfinite(order) and order > 1):
        raise ValueError(f"order must be a finite number > 1. Found {order!r}.")
    if r == 0:  # every step had D_alpha = 0: its output does not depend on the data, the loss is 0
        return 0.0
    return _up(r + -math.log(delta_g) / (order - 1))


def filter_odometer(filt: GaussianFilter, state) -> float:
    """The odometer of a ledger's filter state, at the filter's delta (rounded up).

    gdp: the state is ``sum mu_t^2``. zcdp: ``sum mu_t^2 / 2`` of Gaussian releases only (Skellam
    needs rdp), so ``2 rho`` is the same sum. rdp: ``rho`` with ``alpha* rho`` bounding the Rényi
    loss at alpha* (Gaussian and Skellam charges alike), read at alpha* only (module docstring).

    Parameters
    ----------
    filt : GaussianFilter
        The ledger's filter; its delta is the odometer's delta_g.
    state : array_like
        One client's state (one value).

    Returns
    -------
    float
        The bound on the loss so far.

    Raises
    ------
    ValueError
        If ``state`` holds more than one value.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> gdp = make_filter("gdp", 4.0, 1e-5)
    >>> filter_odometer(gdp, [0.5]) == gdp_odometer(0.5, delta_g=1e-5)
    True
    >>> rdp = make_filter("rdp", 4.0, 1e-5)  # alpha* = 6.1
    >>> round(filter_odometer(rdp, [0.125]), 10), round(6.1 * 0.125 + math.log(1e5) / 5.1, 10)
    (3.0199363657, 3.0199363657)
    """
    arr = np.asarray(state, dtype=np.float64).reshape(-1)
    if arr.size != 1:
        raise ValueError(f"state must hold one value (one client). Found {arr.size} values.")
    value = float(arr[0])
    if filt.kind == "gdp":
        return gdp_odometer(value, delta_g=filt.delta)
    if filt.kind == "zcdp":
        return gdp_odometer(float(mul_up(2.0, value)), delta_g=filt.delta)
    order = rdp_order(filt)
    return rdp_odometer(float(mul_up(order, value)), order=order, delta_g=filt.delta)
