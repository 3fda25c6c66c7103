"""Amplification by the device's own coin: Rényi curves of Poisson-subsampled releases (pure math).

A device asked in a round flips its own coin: with probability ``q`` (its rate) it releases its
clipped update plus the round's noise, otherwise the noise alone, in a reply of the same form. Against
the neighbouring world without the device's data (where it releases the noise alone), that round is a
Poisson-subsampled mechanism, whatever the coordinator does: the amplification rests on the device's
coin, not on the coordinator's sampling (Balle, Kairouz, McMahan, Thakkar and Thakurta, "Privacy
amplification via random check-ins", NeurIPS 2020, make the same move). At an integer order
``alpha >= 2``, with ``mu = s / std`` (the release's L2 sensitivity over the noise std):

- **Gaussian noise, exact** (``sampled_gaussian_rdp``): Mironov, Talwar and Zhang, "Rényi
  Differential Privacy of the Sampled Gaussian Mechanism" (2019), Section 3.3, the integer-order
  formula (dp_accounting's ``_compute_log_a_int`` computes the same sum)::

      eps(alpha) = log( sum_{k=0}^{alpha} C(alpha, k) (1-q)^(alpha-k) q^k exp((k^2 - k) mu^2 / 2) ) / (alpha - 1)

- **Any mechanism with a Rényi curve** ``eps_M`` at the integer orders ``2..alpha`` (Skellam noise on
  the SecAgg+ grid, ``subsampled_skellam_rdp``): Zhu and Wang, "Poisson Subsampled Rényi Differential
  Privacy" (ICML 2019), Theorem 6, their general upper bound (``subsampled_rdp_bound``)::

      eps(alpha) <= log( (1-q)^(alpha-1) (1 + (alpha-1) q) + C(alpha, 2) q^2 (1-q)^(alpha-2) exp(eps_M(2))
                         + 3 sum_{l=3}^{alpha} C(alpha, l) q^l (1-q)^(alpha-l) exp((l-1) eps_M(l)) ) / (alpha - 1)

  and never above ``eps_M(alpha)`` itself (the Rényi divergence is jointly quasi-convex, van Erven
  and Harremoës 2014, and the subsampled pair is a mixture of the base pair and equal
  distributions).

Every value is computed in log space and rounded up with a margin that covers its floating-point
error; ``q = 1`` gives the base curve (Gaussian: ``alpha mu^2 / 2``), ``q = 0`` or ``mu = 0`` gives 0.
Why one order, fixed before the device's first charge, keeps Feldman and Zrnic's filter valid over
adaptive sequences, and how that order is chosen (``order_for_rate``), is in
docs/derivations/amplification.md.

Examples
--------
At rate 1 the sampled Gaussian is the Gaussian (``alpha mu^2 / 2``); at rate 0.01 it costs far less:

>>> round(float(sampled_gaussian_rdp(1.0, 0.5, 8)), 12), round(float(sampled_gaussian_rdp(0.01, 0.5, 8)), 8)
(1.0, 0.00011576)
"""

from __future__ import annotations

import functools
import math

import numpy as np
from scipy.special import gammaln, log_ndtr, logsumexp, xlog1py, xlogy

from fedfilter.privacy import renyi
from fedfilter.privacy.bisection import ALLOWANCE_STEPS, largest_admitted  # noqa: F401  (re-exported)
from fedfilter.privacy.rounding import up

# The orders a device may fix its filter at: the integers 2..256, and the tenths from 2 to 64, where the
# sampled Gaussian's curve bends fastest (dp_accounting's grid has the tenths up to 11).
SUBSAMPLED_ORDERS: tuple[float, ...] = tuple(
    sorted({float(a) for a in range(2, 257)} | {round(2 + t / 10, 1) for t in range(1, 620)})
)
MAX_SUBSAMPLED_ORDER = SUBSAMPLED_ORDERS[-1]
FRACTIONAL_TERMS = 2048  # terms of the fractional-order series (then a proven bound on the rest)
_Z0_CAP = 1024.0  # |z0|, the series' split point, is kept below this by capping sigma (a larger loss)
_SIGMA_CAP = 2.0**20  # and sigma = 1 / mu below this: a norm under 1e-6 of the std is charged as 1e-6
_HUGE_MU = 1e150  # a norm this many noise stds is charged as infinite (its square would overflow)
_ULPS = 16  # error allowance per log-space term, in ulps of its parts' magnitudes (``_log_sum_up``)


def _check_order(alpha, *, integer: bool = True) -> int | float:
    """``alpha`` as an int when it is a whole number in [2, MAX], else (``integer=False``) a float in [2, MAX]."""
    ok = not isinstance(alpha, bool) and isinstance(alpha, (int, float, np.integer, np.floating))
    if ok and math.isfinite(alpha) and 2 <= alpha <= MAX_SUBSAMPLED_ORDER:
        if float(alpha).is_integer():
            return int(alpha)
        if not integer:
            return float(alpha)
    kind = "an integer" if integer else "a number"
    raise ValueError(f"alpha (the Rényi order) must be {kind} in [2, {MAX_SUBSAMPLED_ORDER}]. Found {alpha!r}.")


def _check_rate(rate) -> np.ndarray:
    q = np.asarray(rate, dtype=np.float64)
    if np.any(~np.isfinite(q) | (q < 0) | (q > 1)):
        raise ValueError(f"rate (the device's sampling rate) must be in [0, 1]. Found {rate!r}.")
    return q


@functools.cache
def _log_binomials(alpha: int) -> np.ndarray:
    """``log C(alpha, k)`` for ``k = 0..alpha``, each within an ulp (from the exact integers)."""
    return np.array([math.log(math.comb(alpha, k)) for k in range(alpha + 1)], dtype=np.float64)


def _log_sum_up(parts: list[np.ndarray], alpha: float | np.ndarray, signs: np.ndarray | None = None) -> np.ndarray:
    """``log(sum_k sign_k exp(t_k)) / (alpha - 1)`` with ``t_k`` the sum of ``parts`` (last axis ``k``),
    rounded up; the signed sum must be at least 1 (a Rényi moment ``A_alpha``), else the sum of the
    magnitudes (an upper bound) is taken.

    Each part is within a few ulps of its exact value, so ``t_k`` is within ``_ULPS`` ulps of the sum of
    the parts' magnitudes ``S_k``; the sum is then off by at most ``sum_k exp(t_k) S_k`` of those ulps,
    relative to itself after dividing by it, and its log by that plus an ulp of slack.
    """
    terms = np.asarray(sum(parts))
    magnitude = np.asarray(sum(np.abs(np.where(np.isfinite(p), p, 0.0)) for p in parts))
    unsigned = logsumexp(terms, axis=-1)
    if signs is None:
        total = unsigned
    else:
        signed, sign = logsumexp(terms, axis=-1, b=np.broadcast_to(signs, terms.shape), return_sign=True)
        total = np.where((sign > 0) & (signed >= 0), signed, unsigned)
    weights = np.exp(terms - total[..., None])  # exp(t_k) / A: the terms' shares of the (signed) sum
    error = _ULPS * 2.0**-52 * (np.sum(weights * (magnitude + 1.0), axis=-1) + np.abs(total) + 1.0)
    return up(np.maximum(total + error, 0.0) / (alpha - 1))


def _integer_order_parts(q: np.ndarray, m: np.ndarray, alpha: int) -> list[np.ndarray]:
    """The finite sum at an integer order (module docstring), as the parts of each log-space term."""
    k = np.arange(alpha + 1, dtype=np.float64)
    qe, me = q[..., None], m[..., None]
    shape = (*q.shape, alpha + 1)
    parts = [_log_binomials(alpha), xlog1py(alpha - k, -qe), xlogy(k, qe), (k * k - k) * (me * me) / 2.0]
    return [np.broadcast_to(p, shape) for p in parts]


def _integer_orders_rdp(q: float, mu: float, orders: np.ndarray) -> np.ndarray:
    """``sampled_gaussian_rdp(q, mu, a)`` for every integer order ``a`` of ``orders`` at once (one row
    per order, the terms past ``a`` at ``-inf``): the order search's fast path, equal to the one-order
    call up to the summation's rounding."""
    top = int(orders.max())
    k = np.arange(top + 1, dtype=np.float64)
    a = orders.astype(np.float64)[:, None]
    log_binom = np.full((len(orders), top + 1), -np.inf)
    for row, order in enumerate(orders):
        log_binom[row, : int(order) + 1] = _log_binomials(int(order))
    qa, m = np.float64(q), np.float64(mu)
    parts = [
        log_binom,
        xlog1py(np.maximum(a - k, 0.0), -qa),
        xlogy(k, qa),
        np.broadcast_to((k * k - k) * m * m / 2.0, log_binom.shape),
    ]
    parts = [np.broadcast_to(p, log_binom.shape) for p in parts]
    values = _log_sum_up(parts, a[:, 0])
    return np.where((q == 0) | (mu == 0), 0.0, np.minimum(values, up(a[:, 0] * up(m * m) / 2.0)))


def _fractional_order_parts(q: np.ndarray, m: np.ndarray, alpha: float) -> tuple[list[np.ndarray], np.ndarray]:
    """Mironov, Talwar and Zhang 2019, Section 3.3, at a fractional order: ``A_alpha = A_0 + A_1``, the
    integrals of ``N(0, sigma^2) ((1-q) + q exp((2x - 1) / (2 sigma^2)))^alpha`` below and above
    ``z0 = s^2 log(1/q - 1) + 1/2``, each a binomial series (``s = sigma = 1 / mu``)::

        A_0 = sum_i C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2 s^2)) Phi((z0 - i) / s)
        A_1 = sum_i C(alpha, i) q^(alpha-i) (1-q)^i exp(((alpha-i)^2 - (alpha-i)) / (2 s^2)) Phi((alpha-i-z0) / s)

    The terms are summed with their signs (``C(alpha, i)`` alternates past ``alpha``) over
    ``FRACTIONAL_TERMS`` terms for every row (constant work); ``A_alpha >= 1`` and the negative terms
    are small beside it, so the signed sum loses no precision. The rest is bounded and added: for
    ``i >= max(z0, alpha - z0, alpha + 1)`` the terms of each series are at most ``|C(alpha, i)| / 2``
    (``Phi(-y) <= exp(-y^2 / 2) / 2``, and the exponents cancel by the choice of z0), and
    ``sum_{i >= N} |C(alpha, i)| = |Gamma(alpha + 1) sin(pi alpha)| / pi * Gamma(N - alpha) /
    (alpha Gamma(N))`` (the reflection formula and a telescoping sum). ``sigma`` is capped where
    ``|z0|`` would pass ``_Z0_CAP`` (so ``N`` covers ``max(z0, alpha - z0, alpha + 1)``), and at
    ``_SIGMA_CAP`` (a smaller sigma costs more: a valid upper bound).
    Needs ``0 < q < 1``. Returns the parts (the first holds the tail bound in its last slot) and the
    signs.
    """
    n = FRACTIONAL_TERMS
    i = np.arange(n, dtype=np.float64)
    log_odds = np.log1p(-q) - np.log(q)  # log(1/q - 1)
    sigma = 1.0 / np.maximum(m, 1.0 / _SIGMA_CAP)
    spread = np.abs(log_odds)  # |z0 - 1/2| = sigma^2 |log(1/q - 1)|: both series' tails need it small
    cap = np.sqrt(np.where(spread > 0, (_Z0_CAP - 0.5) / np.where(spread > 0, spread, 1.0), _SIGMA_CAP**2))
    sigma = np.minimum(sigma, cap)
    z0 = sigma * sigma * log_odds + 0.5
    qe, se, ze = q[..., None], sigma[..., None], z0[..., None]
    log_binom = gammaln(alpha + 1) - gammaln(i + 1) - gammaln(alpha - i + 1)  # log |C(alpha, i)|
    j = alpha - i
    t0 = [log_binom, xlogy(i, qe), xlog1py(j, -qe), (i * i - i) / (2 * se * se), log_ndtr((ze - i) / se)]
    t1 = [log_binom, xlogy(j, qe), xlog1py(i, -qe), (j * j - j) / (2 * se * se), log_ndtr((j - ze) / se)]
    shape = (*q.shape, n)
    parts = [np.concatenate([np.broadcast_to(a, shape), np.broadcast_to(b, shape)], axis=-1) for a, b in zip(t0, t1)]
    log_tail = (
        gammaln(alpha + 1)
        + math.log(abs(math.sin(math.pi * alpha)))
        - math.log(math.pi)
        + gammaln(n - alpha)
        - math.log(alpha)
        - gammaln(n)
    )
    tail = np.broadcast_to(np.float64(log_tail), (*q.shape, 1))
    zeros = np.zeros((*q.shape, 1))
    # sign of C(alpha, i): one negative factor (alpha - j) for each j = ceil(alpha) .. i - 1
    sign = np.where(i > alpha, (-1.0) ** np.maximum(i - math.ceil(alpha), 0), 1.0)
    signs = np.concatenate([sign, sign, [1.0]])  # the tail bound is added, whatever the tail's sign
    return [np.concatenate([p, tail if k == 0 else zeros], axis=-1) for k, p in enumerate(parts)], signs


def sampled_gaussian_rdp(rate, mu, alpha) -> np.ndarray:
    """The Rényi divergence at order ``alpha`` of a Gaussian release of sensitivity-to-noise ratio ``mu``
    that the device makes with probability ``rate``, rounded up: exact at an integer order, and at a
    fractional one Mironov, Talwar and Zhang 2019's series with a proven bound on its tail
    (``_fractional_order_parts``). Broadcasts over ``rate`` and ``mu``.

    Parameters
    ----------
    rate : float or array_like
        ``q`` in [0, 1]: the probability that the device's update is in its reply.
    mu : float or array_like
        ``s / std`` >= 0: the update's norm over the noise std (``1 / z`` at full clip).
    alpha : int or float
        The order, in ``[2, MAX_SUBSAMPLED_ORDER]``.

    Returns
    -------
    numpy.ndarray
        ``eps(alpha)``, at least 0 (infinite where ``mu`` passes 1e150, whose square overflows).

    Raises
    ------
    ValueError
        Naming a rate outside [0, 1], a negative or non-finite ``mu``, or a bad order.

    Examples
    --------
    dp_accounting's curve for ``PoissonSampledDpEvent(0.01, GaussianDpEvent(1.1))``: the same at an
    integer order; at a fractional one a little below it (dp_accounting adds the series' terms by
    their magnitudes, dropping the signs):

    >>> from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian
    >>> def ours_and_theirs(order):
    ...     ours = float(sampled_gaussian_rdp(0.01, 1 / 1.1, order))
    ...     return ours, float(_compute_rdp_poisson_subsampled_gaussian(0.01, 1.1, [order])[0])
    >>> ours, theirs = ours_and_theirs(10)
    >>> ours >= theirs, abs(ours - theirs) < 1e-9 * theirs
    (True, True)
    >>> ours, theirs = ours_and_theirs(10.6)
    >>> ours <= theirs, theirs - ours < 1e-6 * theirs
    (True, True)
    """
    alpha = _check_order(alpha, integer=False)
    q = _check_rate(rate)
    m = np.asarray(mu, dtype=np.float64)
    if np.any(~np.isfinite(m) | (m < 0)):
        raise ValueError(f"mu (sensitivity over noise std) must be finite and >= 0. Found {mu!r}.")
    q, m = np.broadcast_arrays(q, m)
    silent = (q == 0) | (m == 0)  # the two laws are equal: no loss at all
    # Past _HUGE_MU, mu^2 overflows (the series would be 0 * inf = NaN): charged as infinite, failing closed.
    huge = m > _HUGE_MU
    m = np.where(huge, 1.0, m)
    gaussian = up(alpha * up(m * m) / 2.0)  # q = 1: the Gaussian's alpha mu^2 / 2
    if isinstance(alpha, int):
        sampled = _log_sum_up(_integer_order_parts(q, m, alpha), alpha)
    else:
        inner = (q > 0) & (q < 1) & (m > 0)
        parts, signs = _fractional_order_parts(np.where(inner, q, 0.5), np.where(inner, m, 1.0), alpha)
        sampled = _log_sum_up(parts, alpha, signs)
    loss = np.where(huge, np.inf, np.where(q >= 1, gaussian, np.minimum(sampled, gaussian)))
    return np.where(silent, 0.0, loss)


def subsampled_rdp_bound(rate, base_rdp, alpha: int) -> np.ndarray:
    """Zhu and Wang 2019, Theorem 6 (module docstring): an upper bound at integer order ``alpha`` on the
    Rényi divergence of a mechanism run with probability ``rate``, from its curve at the orders
    ``2..alpha``; never above the curve at ``alpha``. Rounded up. Broadcasts over leading axes.

    Parameters
    ----------
    rate : float or array_like
        ``q`` in [0, 1].
    base_rdp : array_like
        The mechanism's RDP ``eps_M(l)`` for ``l = 2, ..., alpha`` on the last axis (length
        ``alpha - 1``), finite and >= 0: a bound valid in both directions of the neighbouring pair.
    alpha : int
        The order, an integer in ``[2, MAX_SUBSAMPLED_ORDER]``.

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        Naming a bad rate, order, or a base curve of the wrong length or with bad values.

    Examples
    --------
    Fed the Gaussian curve ``l mu^2 / 2``, the general bound lies above the exact sampled Gaussian and
    within ``log(3) / (alpha - 1)`` of it:

    >>> base = [l * 0.25 / 2 for l in range(2, 9)]
    >>> general, exact = float(subsampled_rdp_bound(0.01, base, 8)), float(sampled_gaussian_rdp(0.01, 0.5, 8))
    >>> exact <= general <= exact + math.log(3) / 7
    True
    """
    alpha = int(_check_order(alpha))
    q = _check_rate(rate)
    eps = np.asarray(base_rdp, dtype=np.float64)
    if eps.ndim == 0 or eps.shape[-1] != alpha - 1:
        raise ValueError(
            f"base_rdp must hold the orders 2..{alpha} ({alpha - 1} values) on its last axis. Found shape {eps.shape}."
        )
    if np.any(~np.isfinite(eps) | (eps < 0)):
        raise ValueError(f"base_rdp must be finite and >= 0. Found {base_rdp!r}.")
    q = np.broadcast_to(q, np.broadcast_shapes(q.shape, eps.shape[:-1]))[..., None]
    eps = np.broadcast_to(eps, (*q.shape[:-1], alpha - 1))
    ell = np.arange(2, alpha + 1, dtype=np.float64)
    log_binom = _log_binomials(alpha)[2:]
    shape = (*q.shape[:-1], alpha)
    three = np.where(ell >= 3, math.log(3.0), 0.0)
    higher = [three + log_binom, xlogy(ell, q), xlog1py(alpha - ell, -q), (ell - 1.0) * eps]
    head = [np.zeros(1), np.zeros(1), xlog1py(alpha - 1.0, -q), np.log1p((alpha - 1.0) * q)]
    lead = shape[:-1]
    parts = [
        np.concatenate([np.broadcast_to(h, (*lead, 1)), np.broadcast_to(t, (*lead, alpha - 1))], axis=-1)
        for h, t in zip(head, higher)
    ]
    bound = _log_sum_up(parts, alpha)
    return np.where(q[..., 0] == 0, 0.0, np.minimum(bound, up(eps[..., -1])))


def skellam_curve(l1, l2, mu_total, alpha: int) -> np.ndarray:
    """Agarwal, Kairouz and Liu 2021's Skellam bound (``skellam.py``'s closed form) at the integer
    orders ``2..alpha`` on a new last axis, rounded up: the ``base_rdp`` of ``subsampled_rdp_bound``.

    Parameters
    ----------
    l1, l2 : float or array_like
        The sensitivities on the integer grid, ``0 <= l2 <= l1``.
    mu_total : float or array_like
        The Skellam variance per coordinate of the released noise, > 0.
    alpha : int
        The largest order.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> from fedfilter.privacy.skellam_curve import skellam_rdp_bound
    >>> curve = skellam_curve(2.0, math.sqrt(2), 50.0, 4)
    >>> [bool(c >= skellam_rdp_bound(2.0, math.sqrt(2), 50.0, a)) for a, c in zip((2, 3, 4), curve)]
    [True, True, True]
    """
    from fedfilter.privacy.skellam import _RHO_MARGIN, _akl_integer_order

    alpha = int(_check_order(alpha))
    l1 = np.asarray(l1, dtype=np.float64)[..., None]
    l2 = np.asarray(l2, dtype=np.float64)[..., None]
    mu = np.asarray(mu_total, dtype=np.float64)[..., None]
    if np.any(~np.isfinite(l1) | ~np.isfinite(l2) | (l2 < 0) | (l2 > l1 * (1 + 2.0**-40))):
        raise ValueError(f"need finite sensitivities with 0 <= l2 <= l1. Found l1={l1[..., 0]!r}, l2={l2[..., 0]!r}.")
    if np.any(~np.isfinite(mu) | (mu <= 0)):
        raise ValueError(f"mu_total (the Skellam variance per coordinate) must be finite and > 0. Found {mu_total!r}.")
    orders = np.arange(2, alpha + 1, dtype=np.float64)
    return up(_akl_integer_order(l1, l2 * l2, mu, orders) * _RHO_MARGIN)


def subsampled_skellam_rdp(rate, l1, l2, mu_total, alpha) -> np.ndarray:
    """A Skellam release on the grid made with probability ``rate``: ``subsampled_rdp_bound`` of
    ``skellam_curve`` at order ``alpha``; exactly 0 where ``l2 == 0``. At a fractional order, the
    bounds at the integers around it, interpolated: ``(a - 1) D_a`` is convex in ``a`` (van Erven and
    Harremoës 2014), so ``(alpha - 1) D_alpha <= (1 - t) (n - 1) E_n + t n E_(n+1)`` for
    ``n = floor(alpha)``, ``t = alpha - n`` and any upper bounds ``E`` at the integers.

    Parameters
    ----------
    rate : float or array_like
        ``q`` in [0, 1].
    l1, l2 : float or array_like
        The sensitivities on the integer grid, ``0 <= l2 <= l1``.
    mu_total : float or array_like
        The Skellam variance per coordinate of the released noise, > 0.
    alpha : int or float
        The order, in ``[2, MAX_SUBSAMPLED_ORDER]``.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    At rate 1 it is the Skellam bound itself; at rate 0.05 far below it; a fractional order lies
    between its integer neighbours:

    >>> from fedfilter.privacy.skellam_curve import skellam_rdp_bound
    >>> whole = skellam_rdp_bound(100.0, 20.0, 4000.0, 8)
    >>> bool(subsampled_skellam_rdp(1.0, 100.0, 20.0, 4000.0, 8) == up(skellam_curve(100.0, 20.0, 4000.0, 8)[-1]))
    True
    >>> float(subsampled_skellam_rdp(0.05, 100.0, 20.0, 4000.0, 8)) < whole / 10
    True
    >>> a, b, c = (float(subsampled_skellam_rdp(0.05, 100.0, 20.0, 4000.0, o)) for o in (8, 8.5, 9))
    >>> a <= b <= c
    True
    """
    alpha = _check_order(alpha, integer=False)
    n = int(math.floor(alpha))
    curve = skellam_curve(l1, l2, mu_total, n if n == alpha else n + 1)
    if n == alpha:
        bound = subsampled_rdp_bound(rate, curve, n)
    else:
        t = alpha - n
        lower = subsampled_rdp_bound(rate, curve[..., : n - 1], n)
        upper = subsampled_rdp_bound(rate, curve, n + 1)
        bound = up(up(up((1 - t) * (n - 1) * lower) + up(t * n * upper)) / (alpha - 1))
    return np.where(np.asarray(l2, dtype=np.float64) > 0, bound, 0.0)


def sampled_gaussian_allowance(room, *, rate, noise_std, alpha, max_norm) -> np.ndarray:
    """The largest norm ``s`` in ``[0, max_norm]`` whose sampled-Gaussian loss at order ``alpha``,
    ``sampled_gaussian_rdp(rate, s / noise_std, alpha)``, is at most ``room`` (per row).

    The loss is non-decreasing in ``s``, so bisection applies. Constant work: ``max_norm`` and every
    one of ``ALLOWANCE_STEPS`` midpoints are evaluated whatever the room (no early exit), so the time
    does not reveal the budget; every returned value was itself checked.

    Parameters
    ----------
    room : array_like
        The loss the release may still cost, in the same units (``eps(alpha)``), >= 0.
    rate : float or array_like
        ``q`` in [0, 1].
    noise_std : float or array_like
        The noise std, > 0.
    alpha : int or float
        The order.
    max_norm : float or array_like
        The largest norm considered (the clip), >= 0.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> s = sampled_gaussian_allowance(0.0005, rate=0.01, noise_std=1.0, alpha=10, max_norm=1.0)
    >>> round(float(s), 6), bool(sampled_gaussian_rdp(0.01, s, 10) <= 0.0005)
    (0.801594, True)
    """
    g = np.asarray(room, dtype=np.float64)
    if np.any(~np.isfinite(g) | (g < 0)):
        raise ValueError(f"room must be finite and >= 0. Found {room!r}.")
    std = np.asarray(noise_std, dtype=np.float64)
    if np.any(~np.isfinite(std) | (std <= 0)):
        raise ValueError(f"noise_std must be finite and > 0. Found {noise_std!r}.")
    top = np.asarray(max_norm, dtype=np.float64)
    if np.any(~np.isfinite(top) | (top < 0)):
        raise ValueError(f"max_norm must be finite and >= 0. Found {max_norm!r}.")

    def fits(norm):
        return sampled_gaussian_rdp(rate, norm / std, alpha) <= g

    shape = np.broadcast_shapes(g.shape, top.shape, std.shape, np.shape(rate))
    return largest_admitted(fits, top, shape)


def _as_order(a: float) -> int | float:
    return int(a) if float(a).is_integer() else float(a)


def order_for_rate(epsilon: float, delta: float, *, rate: float, noise_multiplier: float) -> int | float:
    """The order at which a full-clip Gaussian round at ``rate`` and ``z`` takes the smallest share of the
    (epsilon, delta) budget: the argmax of ``B_alpha / eps(alpha)`` (``renyi.rdp_budgets``' ``B_alpha``)
    over the integers of ``SUBSAMPLED_ORDERS``, then over its tenths within one of the best integer
    (the smallest order on a tie).

    A device's filter holds one order for life, fixed at enrolment from public numbers (the owner's
    ``rdp-order``, which ``fedfilter plan --sampling`` names from the budget, its planned rate and the
    plan's ``z``); docs/derivations/amplification.md says why that keeps the filter valid and what a
    later, different ``z`` costs.

    Parameters
    ----------
    epsilon, delta : float
        The lifetime budget.
    rate : float
        The device's sampling rate, in (0, 1].
    noise_multiplier : float
        ``z`` > 0 of the rounds planned.

    Returns
    -------
    int or float
        The order (an int when whole); ``SUBSAMPLED_ORDERS[-1]`` when no order has a positive budget.

    Examples
    --------
    The budget alone would fix order 18 at epsilon 1; at rate 0.01 and z 1.1 the best is 10.6:

    >>> order_for_rate(1.0, 1e-5, rate=0.01, noise_multiplier=1.1)
    10.6
    """
    q = float(_check_rate(rate))
    if not q > 0:
        raise ValueError(f"rate must be > 0 to choose an order. Found {rate!r}.")
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier must be finite and > 0. Found {noise_multiplier!r}.")

    def best(orders: list[float]) -> tuple[float, float]:
        arr = np.array(orders, dtype=np.float64)
        budgets = renyi.rdp_budgets(arr, epsilon, delta)
        losses = np.array([float(sampled_gaussian_rdp(q, 1.0 / noise_multiplier, _as_order(a))) for a in arr])
        share = np.where(losses > 0, budgets / np.where(losses > 0, losses, 1.0), np.where(budgets > 0, np.inf, 0.0))
        i = int(np.argmax(share))
        return float(arr[i]), float(share[i])

    # the integers first (finite sums, all orders in one array), then the tenths within one of the best
    integers = np.array([a for a in SUBSAMPLED_ORDERS if a.is_integer()])
    losses = _integer_orders_rdp(q, 1.0 / noise_multiplier, integers.astype(int))
    budgets = renyi.rdp_budgets(integers, epsilon, delta)
    shares = np.where(losses > 0, budgets / np.where(losses > 0, losses, 1.0), np.where(budgets > 0, np.inf, 0.0))
    whole, share = float(integers[int(np.argmax(shares))]), float(np.max(shares))
    if not share > 0:
        return _as_order(SUBSAMPLED_ORDERS[-1])
    near = [a for a in SUBSAMPLED_ORDERS if abs(a - whole) < 1 and not a.is_integer()]
    if near:
        frac, frac_share = best(near)
        if frac_share > share:
            return _as_order(frac)
    return _as_order(whole)


def sampling_order(filt) -> int | float | None:
    """The order a self-sampling release is charged at in ``filt``: its rdp order (``filters.rdp_order``),
    or None where the filter cannot account one (not rdp, or an order outside ``[2, MAX_SUBSAMPLED_ORDER]``).

    Parameters
    ----------
    filt : GaussianFilter
        A device's filter.

    Returns
    -------
    int, float or None

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> sampling_order(make_filter("rdp", 1.0, 1e-5, [10.6])), sampling_order(make_filter("gdp", 1.0, 1e-5))
    (10.6, None)
    """
    from fedfilter.privacy.filters import rdp_order

    if getattr(filt, "kind", None) != "rdp":
        return None
    alpha = rdp_order(filt)
    return _as_order(alpha) if 2 <= alpha <= MAX_SUBSAMPLED_ORDER else None


def _in_filter_units(loss, alpha) -> np.ndarray:
    # The rdp filter's state is eps(alpha*) / alpha* (filters.rdp_filter); (..., 1) like GaussianFilter.charge.
    # A release without data costs exactly 0 (``up(0)`` is the smallest subnormal, not 0). A loss that is
    # not a number (``mu * mu`` overflowing, past 1e154) costs everything: it fails closed, never to 0.
    loss = np.asarray(loss, dtype=np.float64)
    loss = np.where(np.isnan(loss), np.inf, loss)
    return np.expand_dims(np.where(loss > 0, up(loss / alpha), 0.0), -1)


def sampled_gaussian_charge(filt, *, rate, sensitivity, noise_std) -> np.ndarray:
    """The charge of a Gaussian release made with probability ``rate``, in ``filt``'s units: the exact
    ``sampled_gaussian_rdp`` at the filter's order over that order (Feldman and Zrnic 2021, Theorem 4.3 at
    alpha*: ``sum_t eps_t(alpha*) <= alpha* rho* <= B_alpha*``), rounded up; exactly 0 without data.

    Parameters
    ----------
    filt : GaussianFilter
        An rdp filter whose order ``sampling_order`` accepts (``ValueError`` otherwise).
    rate : float or array_like
        ``q`` in [0, 1].
    sensitivity, noise_std : float or array_like
        The release's norm (>= 0) and its noise std (> 0), model units.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., 1)``, ready for ``filt.spend``.

    Examples
    --------
    At rate 1 it is the rdp filter's own Gaussian charge ``(s / std)^2 / 2``:

    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("rdp", 1.0, 1e-5, [10.6])
    >>> sampled = float(sampled_gaussian_charge(filt, rate=1.0, sensitivity=1.0, noise_std=2.0)[0])
    >>> round(sampled, 12), round(float(filt.charge(sensitivity=1.0, noise_std=2.0)[0]), 12)
    (0.125, 0.125)
    """
    alpha = _required_order(filt)
    s = np.asarray(sensitivity, dtype=np.float64)
    loss = sampled_gaussian_rdp(rate, s / np.asarray(noise_std, dtype=np.float64), alpha)
    return _in_filter_units(np.where(s > 0, loss, 0.0), alpha)


def sampled_skellam_charge(filt, *, rate, l1, l2, mu_total) -> np.ndarray:
    """The charge of a Skellam release on the grid made with probability ``rate``, in ``filt``'s units:
    ``subsampled_skellam_rdp`` (Zhu and Wang 2019, Theorem 6, of the Skellam curve) at the filter's
    order over that order, rounded up; exactly 0 where ``l2 == 0``.

    Parameters
    ----------
    filt : GaussianFilter
        An rdp filter whose order ``sampling_order`` accepts (``ValueError`` otherwise).
    rate : float or array_like
        ``q`` in [0, 1].
    l1, l2 : float or array_like
        The sensitivities on the integer grid.
    mu_total : float or array_like
        The Skellam variance per coordinate of the noise the release is read with.

    Returns
    -------
    numpy.ndarray
        Shape ``(..., 1)``.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("rdp", 8.0, 1e-5, [6.0])
    >>> full = sampled_skellam_charge(filt, rate=1.0, l1=40.0, l2=10.0, mu_total=400.0)
    >>> bool(sampled_skellam_charge(filt, rate=0.1, l1=40.0, l2=10.0, mu_total=400.0)[0] < full[0] / 10)
    True
    """
    alpha = _required_order(filt)
    return _in_filter_units(subsampled_skellam_rdp(rate, l1, l2, mu_total, alpha), alpha)


def _required_order(filt) -> int | float:
    alpha = sampling_order(filt)
    if alpha is None:
        raise ValueError(
            f"filter {getattr(filt, 'kind', filt)!r} cannot account a self-sampled release: it needs filter='rdp' "
            f"at an order in [2, {MAX_SUBSAMPLED_ORDER}] (enrol with one order, e.g. order_for_rate's)."
        )
    return alpha
