"""Rényi accounting of integer Skellam noise on the secure-aggregation grid (pure math).

Mechanism. A device snaps its clipped update to an integer vector ``k`` and adds Skellam noise
``Sk(mu_share)`` per coordinate (``Sk(mu)`` = Poisson(mu/2) - Poisson(mu/2), variance ``mu``).
Independent Skellam variables add (Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially
Private Federated Learning", NeurIPS 2021), so a released sum of at least ``t`` reports carries at
least ``Sk(t * mu_share)`` per coordinate; for one device the release is ``k + Sk(mu_total)``
post-processed. In the integer units of the grid:

- the curve (``skellam_curve.py``, re-exported here): ``skellam_rdp_exact``, the exact divergence
  (the reference); ``skellam_rdp_bound``, their Theorem 3.5 / Corollary 3.6 (``mu`` the variance per
  coordinate of the released noise, L1 and L2 the sensitivities on the grid)::

      eps(alpha) <= alpha L2^2 / (2 mu) + min( ((2 alpha - 1) L2^2 + 6 L1) / (4 mu^2),  3 L1 / (2 mu) )

  and ``device_rdp_curve`` / ``device_epsilon`` (one release at every order, for studies);
- the shares: ``skellam_share`` (what a device adds) and ``released_variance`` (the least a sum holds);
- charging: ``integer_norms`` / ``l2_up`` (a release's exact norms), ``l1_cap`` (the worst L1 for an
  L2), ``skellam_rho`` (the charge at an order, interpolated between integer orders),
  ``skellam_charge`` (at the rdp filter's alpha*) and ``skellam_allowance`` (the largest L2 whose
  worst-case charge fits the Gaussian allowance's charge; ``ALLOWANCE_STEPS`` bisection steps).

Only the ``rdp`` filter may account Skellam releases: for Skellam noise the only proven guarantee is
the RDP curve (Feldman and Zrnic, "Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021,
Theorem 4.3 holds at a fixed order for any such mechanism). The arguments are in
docs/derivations/skellam.md.

Examples
--------
One coordinate moved by one grid step under variance 50: the exact divergence at order 2, the
Gaussian curve ``alpha k^2 / (2 mu) = 0.02`` and the closed-form bound above it:

>>> round(skellam_rdp_exact([1], 50.0, 2.0), 6), 2 * 1 / (2 * 50.0), round(skellam_rdp_bound(1, 1, 50.0, 2.0), 6)
(0.019997, 0.02, 0.0209)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from fedfilter.privacy.bisection import ALLOWANCE_STEPS, largest_admitted
from fedfilter.privacy.filters import rdp_order
from fedfilter.privacy.rounding import up

# The curve lives in skellam_curve.py (one idea per file); its names stay importable from here.
from fedfilter.privacy.skellam_curve import (
    _check_mu,
    _tail_bounds,  # noqa: F401 (tests read the tail bound from here)
    device_epsilon,
    device_rdp_curve,
    skellam_log_pmf_table,
    skellam_rdp_bound,
    skellam_rdp_exact,
)

__all__ = [
    "ALLOWANCE_STEPS",
    "device_epsilon",
    "device_rdp_curve",
    "integer_norms",
    "l1_cap",
    "l2_up",
    "released_variance",
    "skellam_allowance",
    "skellam_charge",
    "skellam_log_pmf_table",
    "skellam_rdp_bound",
    "skellam_rdp_exact",
    "skellam_rho",
    "skellam_share",
]


def skellam_share(mu_total: float, min_reports: int) -> float:
    """One report's share of the sum's Skellam variance, ``mu_total / m`` rounded up (so ``m`` shares
    carry at least ``mu_total``): what a device adds, and all a report carries read alone (its
    worst-case account, ``client/ledger/worst_case.py``). The device's grid and the planner both call this.

    Parameters
    ----------
    mu_total : float
        The Skellam variance per coordinate the released sum must carry.
    min_reports : int
        ``m``, the fewest reports in a released sum, >= 1.

    Returns
    -------
    float
        ``mu_total / m``, rounded up.

    Raises
    ------
    ValueError
        If ``min_reports`` is not an integer >= 1.

    Examples
    --------
    >>> skellam_share(2.25, 2) == float(np.nextafter(1.125, np.inf))
    True
    """
    if isinstance(min_reports, bool) or not isinstance(min_reports, int) or min_reports < 1:
        raise ValueError(f"min_reports must be an integer >= 1. Found {min_reports!r}.")
    return float(up(mu_total / min_reports))


def released_variance(mu_share: float, threshold: int) -> float:
    """The least Skellam variance per coordinate of a released sum: ``threshold * mu_share``, rounded
    down (fewer than ``threshold`` reports are never released).

    Parameters
    ----------
    mu_share : float
        The variance each report adds (``skellam_share``), finite and > 0.
    threshold : int
        The fewest reports in a release, >= 1.

    Returns
    -------
    float
        One float below ``threshold * mu_share``.

    Raises
    ------
    ValueError
        Naming a bad ``mu_share`` or ``threshold``.

    Examples
    --------
    Two shares of ``skellam_share(2.25, 2)`` carry at least the 2.25 asked for, one float below:

    >>> released_variance(1.125, 2) == float(np.nextafter(2.25, 0.0))
    True
    """
    mu_share = _check_mu(mu_share)
    if isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 1:
        raise ValueError(f"threshold (fewest reports in a release) must be an integer >= 1. Found {threshold!r}.")
    return float(np.nextafter(threshold * mu_share, 0.0))


# --- Charging Skellam releases to the rdp filter ------------------------------------------
# Vectorised over a leading client axis: the engine calls these on many rows, the device on one.

# Relative margin on ``_interpolated_bound``: at most ~25 correctly rounded operations on
# non-negative terms, each within half an ulp; 256 ulps cover them with room.
_RHO_MARGIN = 1 + 256 * 2.0**-52
# Largest |k_i| ``integer_norms`` accepts (SecAgg+ values are int32; Flower casts to int32).
_MAX_ABS_K = 2**31


def integer_norms(k_arrays) -> tuple:
    """``(||k||_1, ||k||_2^2)`` of integer vectors, exactly.

    A list or tuple of arrays (a model's layers), or one array of at most one axis, is ONE device's
    vector: the result is two Python ints. An array of two or more axes has one row per client on
    its leading axis: the result is two int64 arrays of shape ``(n_clients,)``, exact because every
    ``|k_i| <= 2**31`` and ``row size * max |k_i|^2 < 2**63`` are checked (a ValueError otherwise).
    Float arrays are accepted if they hold integers (grid points).

    Parameters
    ----------
    k_arrays : list or tuple of array_like, or numpy.ndarray
        One device's integer vector as layers, or an array with one row per client.

    Returns
    -------
    tuple
        ``(l1, l2_squared)``: two ints, or two int64 arrays with one entry per client.

    Raises
    ------
    ValueError
        For non-integer values, values beyond 2**31, or norms that would overflow int64.

    Examples
    --------
    >>> integer_norms([np.array([3, -4]), np.array([0])])
    (7, 25)
    >>> integer_norms(np.array([[3, 4], [1, 0]]))
    (array([7, 1]), array([25,  1]))
    """
    rows = isinstance(k_arrays, np.ndarray) and k_arrays.ndim >= 2
    parts = [k_arrays] if isinstance(k_arrays, np.ndarray) else list(k_arrays)
    l1_total: Any = 0  # a Python int per device, or an int64 array with one entry per client row
    l2sq_total: Any = 0
    for i, part in enumerate(parts):
        arr = np.asarray(part)
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            integral = np.issubdtype(arr.dtype, np.floating) and np.all(np.isfinite(arr))
            if not (integral and np.all(arr == np.round(arr))):
                raise ValueError(f"k_arrays[{i}] must hold integers (points of the grid). Found dtype {arr.dtype}.")
        if arr.size and float(np.max(np.abs(arr.astype(np.float64)))) > _MAX_ABS_K:
            raise ValueError(f"k_arrays[{i}] holds a value beyond +-2**31. Found {float(np.max(np.abs(arr)))!r}.")
        ints = arr.astype(np.int64).reshape(arr.shape[0], -1) if rows else arr.astype(np.int64).reshape(-1)
        per_row = ints.shape[-1]
        max_abs = int(np.max(np.abs(ints))) if ints.size else 0
        if per_row * max_abs * max_abs >= 2**63:
            raise ValueError(f"k_arrays[{i}] is too large for exact int64 norms ({per_row} values up to {max_abs}).")
        l1 = np.sum(np.abs(ints), axis=-1, dtype=np.int64)
        l2sq = np.sum(ints * ints, axis=-1, dtype=np.int64)
        if rows:
            if int(np.max(l2sq_total, initial=0)) + int(np.max(l2sq, initial=0)) >= 2**63:  # checked in Python ints
                raise ValueError("k_arrays' squared norms overflow int64 across layers.")
            l1_total, l2sq_total = l1_total + l1, l2sq_total + l2sq
        else:
            l1_total, l2sq_total = l1_total + int(l1), l2sq_total + int(l2sq)
    return l1_total, l2sq_total


def l2_up(l2_squared):
    """``sqrt(l2_squared)`` rounded up (exact for perfect squares): the L2 norm a charge may use.

    A Python int, or an integer array below 2**53 (then ``float`` is exact and ``sqrt`` correctly
    rounded, so one step up bounds it; a perfect square's root is exact).

    Parameters
    ----------
    l2_squared : int or numpy.ndarray
        The exact squared norm (``integer_norms``), >= 0.

    Returns
    -------
    float or numpy.ndarray
        The norm, rounded up.

    Raises
    ------
    ValueError
        For a negative value, or an array that is not integer or reaches 2**53.

    Examples
    --------
    >>> l2_up(25), l2_up(2) > math.sqrt(2)
    (5.0, True)
    >>> l2_up(np.array([4, 5]))
    array([2.        , 2.23606798])
    """
    if isinstance(l2_squared, (int, np.integer)) and not isinstance(l2_squared, bool):
        n = int(l2_squared)
        if n < 0:
            raise ValueError(f"l2_squared must be >= 0. Found {n!r}.")
        r = math.isqrt(n)
        if r * r == n and r < 2**53:
            return float(r)
        return float(up(math.sqrt(n))) if n < 2**53 else float(up(float(r + 1)))
    arr = np.asarray(l2_squared)
    if not np.issubdtype(arr.dtype, np.integer) or np.any(arr < 0) or np.any(arr >= 2**53):
        raise ValueError(f"l2_squared must be integers in [0, 2**53). Found dtype {arr.dtype}, values {arr!r}.")
    f = arr.astype(np.float64)
    s = np.sqrt(f)
    rs = np.rint(s)
    return np.where(rs * rs == f, rs, up(s))


def l1_cap(l2, dim):
    """An upper bound on ``||k||_1`` over integer vectors ``k`` with ``||k||_2 <= l2`` in ``dim``
    coordinates: ``max(l2, min(sqrt(dim) l2, l2^2))``, rounded up; 0 at ``l2 == 0``.

    ``sqrt(dim) l2`` by Cauchy-Schwarz on the support, ``l2^2`` as every non-zero integer has
    ``|k_i| <= k_i^2``; the proof is in docs/derivations/skellam.md. Every product is rounded up, so
    the float result is at least the exact bound.

    Parameters
    ----------
    l2 : float or array_like
        The L2 norm, finite and >= 0.
    dim : int or array_like
        The number of coordinates, >= 1.

    Returns
    -------
    numpy.ndarray
        The cap, per entry.

    Raises
    ------
    ValueError
        Naming a bad ``l2`` or ``dim``.

    Examples
    --------
    >>> l1_cap(np.array([0.0, 0.5, 3.0]), 100)  # 3.0: l2^2 = 9 < sqrt(100) * 3
    array([0. , 0.5, 9. ])
    >>> float(l1_cap(5.0, 4)) >= 10.0  # sqrt(4) * 5 < 5^2
    True
    """
    l2 = np.asarray(l2, dtype=np.float64)
    if np.any(~np.isfinite(l2) | (l2 < 0)):
        raise ValueError(f"l2 must be finite and >= 0. Found {l2!r}.")
    dim_arr = np.asarray(dim)
    if not np.issubdtype(dim_arr.dtype, np.integer) or np.any(dim_arr < 1):
        raise ValueError(f"dim (the number of coordinates) must be an integer >= 1. Found {dim!r}.")
    root_dim = up(np.sqrt(dim_arr.astype(np.float64)))
    return np.where(l2 > 0, np.maximum(l2, np.minimum(up(root_dim * l2), up(l2 * l2))), 0.0)


def _akl_integer_order(l1, l2sq, mu, m):
    """Agarwal, Kairouz, Liu 2021 Theorem 3.5 / Corollary 3.6 at the integer order ``m`` (module
    docstring), in floating point (the caller adds the margin)."""
    gaussian = m * l2sq / (2 * mu)
    discrete = np.minimum(((2 * m - 1) * l2sq + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu))
    return gaussian + discrete


def _interpolated_bound(l1, l2, mu, alpha):
    """An upper bound on ``D_alpha`` of the release at a real order ``alpha > 1`` from the bounds at
    the integers around it.

    ``F(a) = (a - 1) D_a`` is convex in ``a`` (van Erven and Harremoës 2014, IEEE Trans. IT 60(7)),
    so for ``n = floor(alpha) >= 2`` and ``t = alpha - n``, ``F(alpha) <= (1 - t) (n - 1) E_n + t n
    E_{n+1}``, with ``E_m`` the closed form at order ``m``; for ``1 < alpha < 2`` it is ``E_2``, the
    ``ceil`` rule. The argument is in docs/derivations/skellam.md ("Fractional orders").
    """
    l2sq = l2 * l2
    n = np.floor(alpha)
    t = alpha - n  # exact: alpha and n share an exponent range
    lower = _akl_integer_order(l1, l2sq, mu, np.maximum(n, 2.0))
    upper = _akl_integer_order(l1, l2sq, mu, n + 1)
    inner = ((1 - t) * (n - 1) * lower + t * n * upper) / (alpha - 1)
    return np.where(n >= 2, np.where(t == 0, lower, inner), upper)


def skellam_rho(l1, l2, mu_total, alpha):
    """The rho-unit charge of a Skellam release at order ``alpha``: ``up(eps(alpha) / alpha)``, with
    ``eps`` Agarwal-Kairouz-Liu's bound (interpolated between integer orders, ``_interpolated_bound``)
    for sensitivities ``l1``, ``l2`` on the integer grid and variance ``mu_total`` per coordinate.

    Exactly 0 where ``l2 == 0`` (the zero vector: no data, no loss). Broadcasts over its arguments.
    Needs ``0 <= l2 <= l1`` (every integer vector has ``||k||_2 <= ||k||_1``; ``l1_cap`` keeps it).

    Parameters
    ----------
    l1 : float or array_like
        The L1 sensitivity on the integer grid.
    l2 : float or array_like
        The L2 sensitivity on the integer grid.
    mu_total : float or array_like
        The Skellam variance per coordinate of the released noise, > 0.
    alpha : float or array_like
        The Rényi order, > 1.

    Returns
    -------
    numpy.ndarray
        The charge in rho units, rounded up.

    Raises
    ------
    ValueError
        Naming bad sensitivities, variance or order.

    Examples
    --------
    At an integer order the charge is the closed form divided by the order; for the vector
    ``(1, -1)`` (L1 = 2, L2 = sqrt 2) under mu = 50 at order 8 that is
    ``(8 * 2 / 100 + min((15 * 2 + 12) / 10000, 6 / 100)) / 8 = 0.1642 / 8``:

    >>> round(float(skellam_rho(2.0, math.sqrt(2), 50.0, 8.0)), 12), 0.1642 / 8
    (0.020525, 0.020525)
    >>> float(skellam_rho(0.0, 0.0, 50.0, 8.0))
    0.0
    """
    l1 = np.asarray(l1, dtype=np.float64)
    l2 = np.asarray(l2, dtype=np.float64)
    mu = np.asarray(mu_total, dtype=np.float64)
    alpha = np.asarray(alpha, dtype=np.float64)
    if np.any(~np.isfinite(l1) | ~np.isfinite(l2) | (l2 < 0) | (l2 > l1 * (1 + 2.0**-40))):
        raise ValueError(f"need finite sensitivities with 0 <= l2 <= l1. Found l1={l1!r}, l2={l2!r}.")
    if np.any(~np.isfinite(mu) | (mu <= 0)):
        raise ValueError(f"mu_total (the Skellam variance per coordinate) must be finite and > 0. Found {mu!r}.")
    if np.any(~np.isfinite(alpha) | (alpha <= 1)):
        raise ValueError(f"alpha (the Rényi order) must be finite and > 1. Found {alpha!r}.")
    eps = up(_interpolated_bound(l1, l2, mu, alpha) * _RHO_MARGIN)
    return np.where(l2 > 0, up(eps / alpha), 0.0)


def skellam_charge(filt, l1, l2, mu_total) -> np.ndarray:
    """The charge of a Skellam release in ``filt``'s units, shape ``(..., 1)``: ``skellam_rho`` at the
    filter's order ``filters.rdp_order(filt)`` (alpha*), where Feldman and Zrnic 2021 Theorem 4.3 holds for the
    rdp filter's single threshold (``sum_t eps_t(alpha*) <= alpha* rho* <= B_alpha*``; filters.py).

    Only ``filter='rdp'``: the gdp and zcdp filters assume Gaussian releases (module docstring).

    Parameters
    ----------
    filt : GaussianFilter
        The device's rdp filter.
    l1 : float or array_like
        The L1 sensitivity on the integer grid.
    l2 : float or array_like
        The L2 sensitivity on the integer grid.
    mu_total : float or array_like
        The Skellam variance per coordinate of the released noise.

    Returns
    -------
    numpy.ndarray
        The charge, shape ``(..., 1)``, ready for ``filt.spend``.

    Raises
    ------
    ValueError
        For a gdp or zcdp filter.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("rdp", 4.0, 1e-5)
    >>> charge = skellam_charge(filt, 2.0, math.sqrt(2), 50.0)
    >>> bool(charge[0] == skellam_rho(2.0, math.sqrt(2), 50.0, rdp_order(filt))), charge.shape
    (True, (1,))
    >>> skellam_charge(make_filter("gdp", 4.0, 1e-5), 2.0, 1.0, 50.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: filter='gdp': Skellam releases need filter='rdp' (the gdp and zcdp filters are ...
    """
    if getattr(filt, "kind", None) != "rdp":
        raise ValueError(
            f"filter={getattr(filt, 'kind', filt)!r}: Skellam releases need filter='rdp' (the gdp and zcdp "
            "filters are valid for Gaussian noise only)."
        )
    return np.expand_dims(skellam_rho(l1, l2, mu_total, rdp_order(filt)), -1)


def skellam_allowance(gaussian_charge, *, mu_total, alpha, dim, max_l2) -> np.ndarray:
    """The largest L2 (integer-grid units) in ``[0, max_l2]`` whose worst-case Skellam charge,
    ``skellam_rho(l1_cap(L2, dim), L2, mu_total, alpha)``, is at most ``gaussian_charge`` (per row).

    ``gaussian_charge``: shape ``(..., 1)`` as ``GaussianFilter.charge`` returns it, or ``(...)``; the
    device passes the charge of its Gaussian allowance, which its filters admit, so any release
    whose charge is at most it is admitted too. The charge is non-decreasing in L2 (``l1_cap`` and
    the bound are, and so are correctly rounded operations), so bisection applies. Constant work:
    ``max_l2`` and ``ALLOWANCE_STEPS`` midpoints are ALL evaluated, whatever the state (no early
    exit; ``GaussianFilter.allowance``), so the time does not reveal the budget. Every returned value
    was itself checked (admitted by construction), and is within ``max_l2 * 2**-64`` of the largest
    admitted one on the float grid of the bisection.

    Parameters
    ----------
    gaussian_charge : array_like
        The charge the release must not exceed, per row, shape ``(..., 1)`` or ``(...)``.
    mu_total : float
        The Skellam variance per coordinate of the released noise.
    alpha : float
        The order of the charge (the rdp filter's alpha*).
    dim : int
        The number of coordinates (the model size), for ``l1_cap``.
    max_l2 : float or array_like
        The largest L2 considered (the clip norm in grid units), >= 0.

    Returns
    -------
    numpy.ndarray
        The allowance per row, in ``[0, max_l2]``.

    Raises
    ------
    ValueError
        For a negative or non-finite ``gaussian_charge`` or ``max_l2``.

    Examples
    --------
    One client whose Gaussian allowance costs 0.005 (a charge of shape ``(1,)``, so the answer has
    shape ``()``):

    >>> cap = skellam_allowance(np.array([0.005]), mu_total=100.0, alpha=6.1, dim=10, max_l2=100.0)
    >>> round(float(cap), 6)
    0.991577
    >>> bool(skellam_rho(l1_cap(cap, 10), cap, 100.0, 6.1) <= 0.005)
    True
    """
    g = np.asarray(gaussian_charge, dtype=np.float64)
    if g.ndim and g.shape[-1] == 1:
        g = g[..., 0]
    if np.any(~np.isfinite(g) | (g < 0)):
        raise ValueError(f"gaussian_charge must be finite and >= 0. Found {g!r}.")
    top = np.asarray(max_l2, dtype=np.float64)
    if np.any(~np.isfinite(top) | (top < 0)):
        raise ValueError(f"max_l2 must be finite and >= 0. Found {max_l2!r}.")

    def fits(length):
        return skellam_rho(l1_cap(length, dim), length, mu_total, alpha) <= g

    shape = np.broadcast_shapes(g.shape, top.shape)
    return largest_admitted(fits, top, shape)
