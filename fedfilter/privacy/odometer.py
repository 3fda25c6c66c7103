"""Privacy odometers: a bound on the privacy loss so far, valid at every round at once.

A filter (``filters.py``) halts before a budget fixed in advance is exceeded; its guarantee is the
budget. An odometer (papers/003, Rogers, Roth, Ullman and Vadhan, Definition 3.2) instead reports
after every round k a number ``COMP_k`` such that, with probability at least ``1 - delta_g`` over the
whole interaction, the realized privacy loss ``Loss_k <= COMP_k`` for EVERY k simultaneously, with the
privacy parameters chosen adaptively. So ``COMP_k`` bounds the loss of a device that stops at round k
for whatever reason: the transcript up to then is ``(COMP_k, delta_g)``-DP (a loss bound at probability
``1 - delta_g`` implies approximate DP at ``delta_g``). All values round UP. The Gaussian and Rényi
odometers below bound the loss from above (the log-ratio at an output drawn under the first
dataset); approximate DP takes both orderings of the neighbours, each bounded so. papers/003 bounds
``|Loss|``, which for these two would need the lower tail too, at twice delta_g.

Pure-DP steps (papers/003):
* ``basic_odometer``: Theorem 3.4, ``sum eps_i`` (delta_g = 0).
* ``advanced_odometer``: Theorem 6.5, equations (11) and (12).
* ``lemma33_odometer``: Lemma 3.3, steps with delta_i > 0 through a pure-DP odometer.

Gaussian and Rényi steps (what fedfilter charges): time-uniform bounds from Ville's inequality on
the privacy-loss supermartingale, the construction behind the odometers of Whitehouse, Ramdas,
Rogers and Wu ("Fully-Adaptive Composition in Differential Privacy", ICML 2023, Section 5) and the
stitching of Howard, Ramdas, McAuliffe and Sekhon (Annals of Statistics 2021):
* ``gdp_odometer``: for adaptively chosen Gaussian releases of mean shifts ``mu_t`` (chosen from
  the past), the loss is ``L_k = sum mu_t Z_t + V_k / 2`` with ``V_k = sum mu_t^2`` and Z_t
  independent N(0,1). For every lambda, ``exp(lambda M_k - lambda^2 V_k / 2)`` (``M_k = sum mu_t
  Z_t``) is a martingale, so by Ville ``P(exists k: M_k >= log(1/d)/lambda + lambda V_k / 2) <= d``.
  Level j (budget ``B_j = first_level * ratio^j``, the filter of that budget) takes ``lambda_j =
  sqrt(2 log(1/d_j) / B_j)``, the tightest at ``V = B_j``, and ``d_j = delta_g * w_j`` with ``w_j
  = 1/((j+1)(j+2))`` (``sum_j w_j = 1``): a union bound over the levels gives, for every k at once,
  ``L_k <= V_k / 2 + min_j (log(1/d_j)/lambda_j + lambda_j V_k / 2)``. Each level's bound holds at
  every V (not only below B_j), so the minimum is over all levels up to ``MAX_LEVELS``.
* ``rdp_odometer``: a step that is ``(alpha, eps_t)``-RDP has ``E[exp((alpha-1) Loss_t) | past] =
  exp((alpha-1) D_alpha) <= exp((alpha-1) eps_t)`` (the supermartingale M_t of papers/004's proof of Theorem 3.1), so by
  Ville ``L_k <= sum eps_t + log(1/delta_g)/(alpha-1)`` for every k at once. An rdp ledger holds
  the Rényi sum at the single order alpha* (its Skellam charges are valid at that order only), so
  this odometer uses alpha* alone: every level of a grid would use the same order and give the
  same bound, so no union bound is paid, but the order is not tuned to what was spent: far below
  the budget the bound is looser than a best-order reading would be.
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
GDP_RATIO = 2.0


def _up(value: float) -> float:
    return float(up(value * (1 + _SLACK)))


def _check_delta_g(delta_g: float, *, upper: float = 1.0) -> None:
    if not (isinstance(delta_g, (int, float)) and 0 < delta_g < upper):
        raise ValueError(f"delta_g must be in (0, {upper:.6g}). Found {delta_g!r}.")


def check_losses(name: str, values: Sequence[float]) -> list[float]:
    out = [float(v) for v in values]
    bad = [v for v in out if not (math.isfinite(v) and v >= 0)]
    if bad:
        raise ValueError(f"{name} must be finite numbers >= 0. Found {bad[0]!r}.")
    return out


def basic_odometer(epsilons: Sequence[float]) -> float:
    """papers/003 Theorem 3.4: ``COMP(eps_1, 0, ..., eps_k, 0) = sum eps_i`` (valid at delta_g = 0)."""
    eps = check_losses("epsilons", epsilons)
    return _up(math.fsum(eps)) if eps else 0.0


def advanced_branch(epsilons: Sequence[float], n: int) -> int:
    """11 where papers/003 Theorem 6.5's ``sum eps_i^2`` lies in [1/n^2, 1], else 12."""
    eps = check_losses("epsilons", epsilons)
    if not (isinstance(n, int) and n >= 2):
        raise ValueError(f"n must be an integer >= 2 (Theorem 6.5 takes log(n) and log2(n)). Found {n!r}.")
    sum_sq = math.fsum(e * e for e in eps)
    return 11 if 1 / n**2 <= sum_sq <= 1 else 12


def advanced_odometer(epsilons: Sequence[float], *, delta_g: float, n: int) -> float:
    """papers/003 Theorem 6.5 (advanced privacy odometer), rounded up; delta_g in (0, 1/e).

    Equation (11), where ``sum eps_i^2`` lies in [1/n^2, 1]:
        sum eps_i (e^eps_i - 1)/2 + sqrt(2 sum eps_i^2 (log(110 e) + 2 log(log(n) / delta_g)))
    Equation (12), otherwise:
        sum eps_i (e^eps_i - 1)/2
        + sqrt(2 (1/n^2 + sum eps_i^2)(1 + log(1 + n^2 sum eps_i^2)/2) log(4 log2(n) / delta_g))
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
    """papers/003 Lemma 3.3: an odometer for (eps_i, delta_i) steps, valid at ``delta_g + delta_g'``.

    ``inf`` once ``sum 2 delta_i / (eps_i e^eps_i) > delta_g'``, else the pure-DP odometer
    (valid at delta_g) at ``(2 eps_1, ..., 2 eps_k)``. A step with delta_i = 0 charges nothing.
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
    """Level j of the gdp odometer: ``(B_j, w_j)`` = ``(first_level ratio^j, 1/((j+1)(j+2)))``."""
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
    (Ville on the supermartingale M_t of papers/004's proof of Theorem 3.1 at the one order alpha), rounded up.

    ``sum_rdp`` is the Rényi loss at ``order`` (for an rdp ledger ``alpha* * rho``).
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
