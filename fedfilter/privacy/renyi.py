"""Rényi differential privacy (RDP): the Gaussian mechanism's curve and the conversion to (eps, delta).

A Gaussian mechanism with sensitivity ``s`` and noise standard deviation ``std`` is
``(alpha, alpha * s^2 / (2 std^2))``-RDP for every order ``alpha > 1`` (Mironov 2017,
arXiv 1702.07476 v3, Proposition 7; Feldman and Zrnic, "Individual Privacy Accounting via a Rényi
Filter", NeurIPS 2021, Proposition 5.2's proof); the filter's ``charge``
(filters.py) computes it with the weights ``alpha / 2``.

``(alpha, r)``-RDP implies ``(eps, delta)``-DP with

    eps = r + log1p(-1/alpha) - log(delta * alpha) / (alpha - 1)

(Canonne, Kamath and Steinke 2020, arXiv 2004.00010 v4, Proposition 12; Balle et al. 2020,
arXiv 1905.09982, Theorem 21). This is the conversion of Google's ``dp_accounting``; the tests
check agreement with its ``RdpAccountant``.

``DEFAULT_ORDERS`` is dp_accounting's grid of 156 orders from 1.1 to 1024, the default of the rdp
filter.

Examples
--------
Eight Gaussian rounds at noise multiplier 4 are ``(alpha, 8 alpha / (2 * 4^2))``-RDP at every order;
at delta = 1e-5 that is epsilon 3.189 (dp_accounting's ``RdpAccountant`` says the same):

>>> round(epsilon_from_rdp(DEFAULT_ORDERS, [8 * a / 32 for a in DEFAULT_ORDERS], 1e-5), 3)
3.189
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
    """Orders as a float array; each must be finite and > 1.01 (the conversion's stable range).

    Parameters
    ----------
    orders : sequence of float or numpy.ndarray
        Rényi orders, a non-empty 1-D sequence.

    Returns
    -------
    numpy.ndarray
        The orders as float64.

    Raises
    ------
    ValueError
        If the sequence is empty or not 1-D, or naming the orders that are not finite and > 1.01.

    Examples
    --------
    >>> check_orders([2, 4.5])
    array([2. , 4.5])
    >>> check_orders([1.0, 2.0])
    Traceback (most recent call last):
    ...
    ValueError: every order must be finite and > 1.01. Found [1.0].
    """
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

    Parameters
    ----------
    orders : sequence of float
        The Rényi orders (``check_orders``).
    rdp : sequence of float
        The RDP value at each order, finite and >= 0.
    delta : float
        The target delta, in (0, 1).

    Returns
    -------
    float
        ``min_alpha rdp(alpha) + log1p(-1/alpha) - log(delta alpha) / (alpha - 1)``, at least 0,
        rounded up (with a margin covering the floating-point error).

    Raises
    ------
    ValueError
        For a bad delta or order, a length mismatch, or a negative or non-finite RDP value.

    Examples
    --------
    One order, against the closed form of Canonne, Kamath and Steinke 2020, Proposition 12 (a
    Gaussian round at z = 2, order 8, RDP ``8 / (2 * 2^2) = 1``):

    >>> epsilon_from_rdp([8.0], [1.0], 1e-5)
    2.214109167845555
    >>> round(1.0 + math.log1p(-1 / 8) - math.log(1e-5 * 8) / 7, 12)
    2.214109167846
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

    Parameters
    ----------
    orders : sequence of float or numpy.ndarray
        The Rényi orders.
    epsilon : float
        The target epsilon.
    delta : float
        The target delta, in (0, 1).

    Returns
    -------
    numpy.ndarray
        ``B_alpha = epsilon - log1p(-1/alpha) + log(delta alpha) / (alpha - 1)`` per order, rounded
        down with a margin, and at least 0.

    Examples
    --------
    >>> budgets = rdp_budgets([2.0, 8.0], 4.0, 1e-5)
    >>> budgets
    array([0.        , 2.78589083])
    >>> round(4.0 - math.log1p(-1 / 8) + math.log(1e-5 * 8) / 7, 8)
    2.78589083
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

    Parameters
    ----------
    orders : sequence of float or numpy.ndarray
        The Rényi orders.
    epsilon : float
        The target epsilon.
    delta : float
        The target delta, in (0, 1).

    Returns
    -------
    float
        ``rho*``, the rdp filter's budget (docs/derivations/rdp-filter.md).

    Examples
    --------
    Here order 8 attains the maximum, ``B_8 / 8``:

    >>> rho = gaussian_rho_budget([2.0, 8.0], 4.0, 1e-5)
    >>> rho
    0.34823635401930575
    >>> bool(rho == down(rdp_budgets([8.0], 4.0, 1e-5)[0] / 8))
    True
    """
    orders_arr = check_orders(orders)
    per_order = down(rdp_budgets(orders_arr, epsilon, delta) / orders_arr)
    kl = -math.log1p(-delta * delta)  # delta^2 and log1p: a few ulps; 16 cover them
    kl_rho = down(down(kl * (1 - 16 * 2.0**-52)) / float(np.min(orders_arr)))
    return float(max(float(np.max(per_order)), float(kl_rho), 0.0))
