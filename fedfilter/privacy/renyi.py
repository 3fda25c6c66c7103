"""Rényi differential privacy (RDP): the Gaussian mechanism's curve and the conversion to (eps, delta).

A Gaussian mechanism with sensitivity ``s`` and noise standard deviation ``std`` is
``(alpha, alpha * s^2 / (2 std^2))``-RDP for every order ``alpha > 1`` (Mironov 2017,
arXiv 1702.07476 v3, Proposition 7; papers/004 Proposition 5.2's proof); the filter's ``charge``
(filters.py) computes it with the weights ``alpha / 2``.

``(alpha, r)``-RDP implies ``(eps, delta)``-DP with

    eps = r + log1p(-1/alpha) - log(delta * alpha) / (alpha - 1)

(Canonne, Kamath and Steinke 2020, arXiv 2004.00010 v4, Proposition 12; Balle et al. 2020,
arXiv 1905.09982, Theorem 21). This is the conversion of Google's ``dp_accounting``; the tests
check agreement with its ``RdpAccountant``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from fedfilter.privacy.rounding import down, up

# dp_accounting's RdpAccountant orders (``DEFAULT_RDP_ORDERS``, 156 orders from 1.1 to 1024), the
# default of the ``rdp`` filter: its single threshold (filters.py) pays nothing for a fine grid.
DEFAULT_ORDERS: tuple[float, ...] = tuple(
    [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512, 1024]
)


def check_orders(orders: Sequence[float] | np.ndarray) -> np.ndarray:
    """Orders as a float array; each must be finite and > 1.01 (the conversion's stable range)."""
    arr = np.asarray(orders, dtype=np.float64)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"orders must be a non-empty sequence. Found {orders!r}.")
    bad = arr[~np.isfinite(arr) | (arr <= 1.01)]
    if bad.size:
        raise ValueError(f"every order must be finite and > 1.01. Found {bad.tolist()}.")
    return arr


_EPS = 2.0**-52


def _conversion_offset(orders: np.ndarray, delta: float) -> tuple[np.ndarray, np.ndarray]:
    """``log1p(-1/alpha) - log(delta*alpha)/(alpha-1)`` per order (CKS 2020, Proposition 12), and a
    bound on its absolute floating-point error.

    Each operation is correctly rounded (libm log and log1p within an ulp), so each term is off by a
    few ulps of its own size, plus ``1/alpha``'s rounding, which log1p amplifies to at most
    ``eps_mach / (2 (alpha - 1))``; ``alpha - 1`` is exact. The bound is taken generously, as the
    difference of the two terms can be far smaller than either (then ulps of the result do not
    cover them).
    """
    t1 = np.array([math.log1p(-1 / a) for a in orders], dtype=np.float64)
    t2 = np.array([math.log(delta * a) / (a - 1) for a in orders], dtype=np.float64)
    err = 16 * _EPS * (np.abs(t1) + np.abs(t2)) + _EPS / (orders - 1)
    return t1 - t2, err


def epsilon_from_rdp(orders: Sequence[float], rdp: Sequence[float], delta: float) -> float:
    """The best epsilon over the orders for RDP values ``rdp`` at ``delta`` (rounded up).

    Mirrors ``dp_accounting.rdp.compute_epsilon``, including its KL shortcut: when
    ``delta^2 + expm1(-r) > 0`` the bound ``delta <= sqrt(1 - exp(-KL))`` already gives eps = 0
    (RDP is non-decreasing in the order, so ``r`` bounds the KL divergence); here with a few ulps
    of margin on each side, so it is never taken where the exact inequality fails.
    """
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1). Found {delta!r}.")
    orders_arr = check_orders(orders)
    rdp_arr = np.asarray(rdp, dtype=np.float64)
    if rdp_arr.shape != orders_arr.shape:
        raise ValueError(f"rdp must have one value per order ({orders_arr.size}). Found {rdp_arr.size}.")
    best = math.inf
    offsets, errors = _conversion_offset(orders_arr, delta)
    for a, r, offset, err in zip(orders_arr, rdp_arr, offsets, errors):
        if r < 0 or not math.isfinite(r):
            raise ValueError(f"RDP values must be finite and >= 0. Found {r!r} at order {a}.")
        if delta * delta * (1 - 4 * _EPS) + math.expm1(-r) * (1 + 4 * _EPS) > 0:
            return 0.0
        # Twice rdp_budgets' margin: epsilon_spent's readout must build a filter that admits it.
        best = min(best, r + offset + err + 32 * _EPS * (r + abs(offset)))
    return float(max(0.0, up(best)))


def rdp_budgets(orders: Sequence[float] | np.ndarray, epsilon: float, delta: float) -> np.ndarray:
    """Per order, the largest RDP value that converts to at most (epsilon, delta) (rounded down).

    Orders whose budget would be <= 0 get 0: they admit nothing and never certify the budget.
    """
    orders_arr = check_orders(orders)
    offsets, errors = _conversion_offset(orders_arr, delta)
    budgets = down(epsilon - offsets - errors - 16 * _EPS * abs(epsilon))
    return np.maximum(budgets, 0.0)


def gaussian_rho_budget(orders: Sequence[float] | np.ndarray, epsilon: float, delta: float) -> float:
    """The largest ``rho`` such that ``(alpha, alpha * rho)``-RDP at some order of the grid implies
    (epsilon, delta)-DP by ``epsilon_from_rdp``'s conversion (rounded down; 0 if none).

    ``max_alpha B_alpha / alpha`` over the per-order budgets of ``rdp_budgets``, and, as in
    ``epsilon_from_rdp``, the KL shortcut at the smallest order: ``alpha_min * rho <=
    -log(1 - delta^2)`` bounds KL <= D_alpha_min (RDP is non-decreasing in the order), and then
    TV <= sqrt(1 - exp(-KL)) <= delta (Bretagnolle-Huber) is (0, delta)-DP.
    """
    orders_arr = check_orders(orders)
    per_order = down(rdp_budgets(orders_arr, epsilon, delta) / orders_arr)
    kl = -math.log1p(-delta * delta)  # delta^2 and log1p: a few ulps; 16 cover them
    kl_rho = down(down(kl * (1 - 16 * 2.0**-52)) / float(np.min(orders_arr)))
    return float(max(float(np.max(per_order)), float(kl_rho), 0.0))
