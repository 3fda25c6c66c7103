"""The Rényi curve of Skellam noise: the exact divergence (the reference) and the closed-form bound.

Split from ``fedfilter.privacy.skellam`` (which re-exports every name here): ``skellam_rdp_exact``
sums ``D_alpha(Sk(mu) + k || Sk(mu))`` in log space with a proven tail bound (slow: for tests and
studies); ``skellam_rdp_bound`` is Agarwal, Kairouz, Liu, "The Skellam Mechanism for Differentially
Private Federated Learning" (NeurIPS 2021), Theorem 3.5 / Corollary 3.6; ``device_rdp_curve`` and
``device_epsilon`` read one release at every order. The arguments are in docs/derivations/skellam.md.

Examples
--------
>>> round(skellam_rdp_exact([1], 50.0, 2.0), 6), round(skellam_rdp_bound(1, 1, 50.0, 2.0), 6)
(0.019997, 0.0209)
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np
from scipy.special import gammaln, ive, logsumexp

from fedfilter.privacy.renyi import DEFAULT_ORDERS, check_orders, epsilon_from_rdp
from fedfilter.privacy.rounding import up

# The exact value is returned with the tail added: the window is widened until the tail bound is
# below this (absolute, on the sum S >= 1 of which the divergence is log(S) / (alpha - 1)).
_TAIL_TOLERANCE = 1e-30
# Relative margin on the closed-form bound: at most ~10 correctly rounded operations on
# non-negative terms, each within half an ulp; 64 ulps cover them with room.
_BOUND_MARGIN = 1 + 64 * 2.0**-52


def _check_mu(mu: float) -> float:
    mu = float(mu)
    if not (math.isfinite(mu) and mu > 0):
        raise ValueError(f"mu (the Skellam variance per coordinate) must be finite and > 0. Found {mu!r}.")
    return mu


def _check_alpha(alpha: float) -> float:
    alpha = float(alpha)
    if not (math.isfinite(alpha) and alpha > 1):
        raise ValueError(f"alpha (the Rényi order) must be finite and > 1. Found {alpha!r}.")
    return alpha


def _integer_vector(k: Sequence[int] | np.ndarray) -> list[int]:
    arr = np.asarray(k)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.ndim != 1:
        raise ValueError(f"k must be a 1-D integer vector. Found shape {arr.shape}.")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not (np.all(np.isfinite(arr)) and np.all(arr == np.round(arr))):
            raise ValueError(f"k must hold integers (points of the grid). Found {arr[:8].tolist()}...")
    return [int(v) for v in arr.tolist()]


def skellam_log_pmf_table(mu: float, n: int) -> np.ndarray:
    """``log q_mu(y)`` for ``y = 0..n`` without underflow.

    ``log I_0(mu) = log(ive(0, mu)) + mu``; the ratios ``r_v = I_{v+1}(mu) / I_v(mu)`` come from the
    backward recurrence ``r_{v-1} = 1 / (2 v / mu + r_v)`` (the minimal solution of the three-term
    recurrence ``I_{v-1} - I_{v+1} = (2 v / mu) I_v``, so backward evaluation is stable), started
    at ``r = 0`` far beyond ``n`` and ``mu``: each step shrinks the start error by at least
    ``r_v^2``, and past ``2 mu`` there are over 200 steps with ``r_v < 1/2``.

    Parameters
    ----------
    mu : float
        The Skellam variance, finite and > 0.
    n : int
        The largest ``y`` of the table, >= 0.

    Returns
    -------
    numpy.ndarray
        ``n + 1`` values ``log(exp(-mu) I_y(mu))``.

    Examples
    --------
    >>> from scipy.special import iv
    >>> skellam_log_pmf_table(2.0, 2)
    array([-1.17600646, -1.53586553, -2.37258883])
    >>> np.log(np.exp(-2.0) * iv([0, 1, 2], 2.0))
    array([-1.17600646, -1.53586553, -2.37258883])
    """
    mu = _check_mu(mu)
    start = int(n + 4 * mu + 400)
    r = 0.0
    log_ratios = np.empty(n, dtype=np.float64)
    for v in range(start, 0, -1):
        r = 1.0 / (2.0 * v / mu + r)  # now r = r_{v-1}
        if v - 1 < n:
            log_ratios[v - 1] = math.log(r)
    log_i0_scaled = math.log(float(ive(0, mu)))  # log(I_0(mu) exp(-mu)) = log q_mu(0)
    table = np.empty(n + 1, dtype=np.float64)
    table[0] = log_i0_scaled
    table[1:] = log_i0_scaled + np.cumsum(log_ratios)
    return table


def _tail_bounds(k: int, mu: float, alpha: float, right: int, left: int) -> float:
    """An upper bound on the summands ``f(x) = q(x - k)^alpha q(x)^(1 - alpha)`` left out of the
    window ``-left <= x <= right`` (``k >= 0``, ``right >= k``), as a log; ``inf`` if not yet proven.

    From the series of ``I_v``: ``L(y) <= q(y) <= L(y) exp(mu^2 / (4 (y + 1)))`` for ``y >= 0``, with
    ``L(y) = exp(-mu) (mu/2)^y / y!``. As ``1 - alpha < 0``, ``q(x)^(1-alpha) <= L(x)^(1-alpha)``.
    Right tail (``x > right``): ``f(x) <= exp(alpha mu^2 / (4 (right - k + 2))) h(x)`` with
    ``h(x) = L(x - k)^alpha L(x)^(1 - alpha)`` and ``h(x+1)/h(x) = (mu/2) ((x+1)/(x+1-k))^alpha / (x+1)``,
    decreasing in ``x``: a geometric series once that ratio is < 1. Left tail (``x = -y``,
    ``y > left``): ``f = q(y + k)^alpha q(y)^(1-alpha)`` likewise with ratio ``<= (mu/2) / (y + 1)``.
    """
    log_half_mu = math.log(mu / 2)

    def log_h_right(x: int) -> float:
        return -mu + (x - alpha * k) * log_half_mu + alpha * (gammaln(x + 1) - gammaln(x - k + 1)) - gammaln(x + 1)

    def log_h_left(y: int) -> float:
        return -mu + (y + alpha * k) * log_half_mu + alpha * (gammaln(y + 1) - gammaln(y + k + 1)) - gammaln(y + 1)

    x0 = right + 1
    rho_r = (mu / 2) * ((x0 + 1) / (x0 + 1 - k)) ** alpha / (x0 + 1)
    y0 = left + 1
    rho_l = (mu / 2) / (y0 + 1)
    if rho_r >= 1 or rho_l >= 1:
        return math.inf
    t_right = alpha * mu * mu / (4 * (x0 - k + 1)) + log_h_right(x0) - math.log1p(-rho_r)
    t_left = alpha * mu * mu / (4 * (y0 + k + 1)) + log_h_left(y0) - math.log1p(-rho_l)
    return float(np.logaddexp(t_right, t_left))


def _rdp_exact_1d(k: int, mu: float, alpha: float) -> float:
    """``D_alpha(Sk(mu) + k || Sk(mu))`` for one coordinate, ``k >= 0``."""
    if k == 0:
        return 0.0
    width = k + int(mu) + 16
    while True:
        log_tail = _tail_bounds(k, mu, alpha, right=width, left=width)
        if log_tail < math.log(_TAIL_TOLERANCE):
            break
        width *= 2
    table = skellam_log_pmf_table(mu, width + k)
    xs = np.arange(-width, width + 1)
    log_q_x = table[np.abs(xs)]
    log_q_shift = table[np.abs(xs - k)]
    log_s = logsumexp(alpha * log_q_shift + (1 - alpha) * log_q_x)
    return float(np.logaddexp(log_s, log_tail) / (alpha - 1))


def skellam_rdp_exact(k: Sequence[int] | np.ndarray, mu: float, alpha: float) -> float:
    """The exact ``D_alpha(Sk(mu)^d + k || Sk(mu)^d)`` for an integer vector ``k`` (the reference).

    Per-coordinate divergences add (product distributions); coordinates with the same ``|k_i|`` are
    computed once. Each is ``log(S) / (alpha - 1)`` with ``S`` summed in log space over a window
    plus a proven upper bound (< 1e-30, against ``S >= 1``) on the left-out tail, so the value is
    an upper estimate up to floating-point error of the summation (~1e-15 relative).

    Parameters
    ----------
    k : sequence of int or numpy.ndarray
        The shift, an integer vector (one entry per coordinate).
    mu : float
        The Skellam variance per coordinate, finite and > 0.
    alpha : float
        The Rényi order, finite and > 1.

    Returns
    -------
    float
        The divergence; 0 for the zero vector.

    Examples
    --------
    Coordinates add, and the sign of a coordinate does not matter:

    >>> round(skellam_rdp_exact([1, -1], 50.0, 2.0), 6), round(2 * skellam_rdp_exact([1], 50.0, 2.0), 6)
    (0.039994, 0.039994)
    """
    mu = _check_mu(mu)
    alpha = _check_alpha(alpha)
    counts = Counter(abs(v) for v in _integer_vector(k))
    return float(sum(n * _rdp_exact_1d(m, mu, alpha) for m, n in counts.items() if m))


def skellam_rdp_bound(l1: float, l2: float, mu: float, alpha: float) -> float:
    """Agarwal, Kairouz, Liu 2021's RDP bound for sensitivities ``l1``, ``l2`` on the integer grid and
    Skellam variance ``mu`` per coordinate, at order ``alpha`` (the integer order ``ceil(alpha)``
    when fractional), rounded up. Needs ``0 <= l2 <= l1`` (every vector has ``||k||_2 <= ||k||_1``).

    Parameters
    ----------
    l1 : float
        The L1 sensitivity on the integer grid.
    l2 : float
        The L2 sensitivity on the integer grid, ``0 <= l2 <= l1``.
    mu : float
        The Skellam variance per coordinate of the released noise, finite and > 0.
    alpha : float
        The Rényi order, finite and > 1.

    Returns
    -------
    float
        The module docstring's ``eps(ceil(alpha))``, rounded up with a margin.

    Raises
    ------
    ValueError
        Naming bad sensitivities, variance or order.

    Examples
    --------
    ``alpha L2^2 / (2 mu) + min(((2 alpha - 1) L2^2 + 6 L1) / (4 mu^2), 3 L1 / (2 mu))`` at L1 = L2 = 1,
    mu = 50, alpha = 2 is ``0.02 + 0.0009``; order 1.5 is charged at order 2:

    >>> round(skellam_rdp_bound(1, 1, 50.0, 2.0), 12)
    0.0209
    >>> skellam_rdp_bound(1, 1, 50.0, 1.5) == skellam_rdp_bound(1, 1, 50.0, 2.0)
    True
    """
    mu = _check_mu(mu)
    alpha = _check_alpha(alpha)
    l1, l2 = float(l1), float(l2)
    if not (math.isfinite(l1) and math.isfinite(l2) and 0 <= l2 <= l1 * (1 + 2.0**-40)):
        raise ValueError(f"need finite sensitivities with 0 <= l2 <= l1. Found l1={l1!r}, l2={l2!r}.")
    a = float(math.ceil(alpha))
    l2sq = l2 * l2
    gaussian = a * l2sq / (2 * mu)
    discrete = min(((2 * a - 1) * l2sq + 6 * l1) / (4 * mu * mu), 3 * l1 / (2 * mu))
    return float(up((gaussian + discrete) * _BOUND_MARGIN))


def _norms(k_int: Sequence[int] | np.ndarray) -> tuple[float, float]:
    """``||k||_1`` and ``||k||_2`` of an integer vector, the square computed exactly in integers and
    the root rounded up."""
    ints = _integer_vector(k_int)
    l1 = sum(abs(v) for v in ints)
    l2sq = sum(v * v for v in ints)
    root = math.isqrt(l2sq)
    l2 = float(root) if root * root == l2sq else float(up(math.sqrt(l2sq)))
    return float(l1), l2


def device_rdp_curve(
    k_int: Sequence[int] | np.ndarray, mu_total: float, orders: Sequence[float] = DEFAULT_ORDERS
) -> np.ndarray:
    """The RDP bound of releasing ``k_int + Sk(mu_total)``, at each order (for studies).

    The bound of ``skellam_rdp_bound`` with the vector's own L1 and L2 norms, rounded up. A device is
    charged at one order only (``skellam_charge``).

    Parameters
    ----------
    k_int : sequence of int or numpy.ndarray
        The release's integer vector.
    mu_total : float
        The Skellam variance per coordinate of the released noise.
    orders : sequence of float, optional
        The Rényi orders (default ``renyi.DEFAULT_ORDERS``).

    Returns
    -------
    numpy.ndarray
        One RDP value per order.

    Examples
    --------
    >>> device_rdp_curve([1, -1], 50.0, [2.0, 8.0])
    array([0.0418, 0.1642])
    """
    orders_arr = check_orders(orders)
    mu_total = _check_mu(mu_total)
    l1, l2 = _norms(k_int)
    return np.array([skellam_rdp_bound(l1, l2, mu_total, a) for a in orders_arr], dtype=np.float64)


def device_epsilon(
    k_int: Sequence[int] | np.ndarray, mu_total: float, delta: float, orders: Sequence[float] = DEFAULT_ORDERS
) -> float:
    """(epsilon at ``delta``) of one release, at the best order, by ``renyi.epsilon_from_rdp``.

    Parameters
    ----------
    k_int : sequence of int or numpy.ndarray
        The release's integer vector.
    mu_total : float
        The Skellam variance per coordinate of the released noise.
    delta : float
        The target delta, in (0, 1).
    orders : sequence of float, optional
        The Rényi orders (default ``renyi.DEFAULT_ORDERS``).

    Returns
    -------
    float
        The epsilon, rounded up.

    Examples
    --------
    >>> eps = device_epsilon([1, -1], 50.0, 1e-5, [2.0, 8.0])
    >>> eps == epsilon_from_rdp([2.0, 8.0], device_rdp_curve([1, -1], 50.0, [2.0, 8.0]), 1e-5), round(eps, 4)
    (True, 1.3783)
    """
    return epsilon_from_rdp(orders, device_rdp_curve(k_int, mu_total, orders).tolist(), delta)
