"""Gaussian differential privacy (mu-GDP): the exact privacy curve of the Gaussian mechanism.

A Gaussian mechanism with sensitivity ``s`` and noise standard deviation ``std`` is ``mu``-GDP with
``mu = s / std``, and ``mu``-GDP is exactly (epsilon, delta)-DP for every pair on the curve

    delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps * Phi(-eps/mu - mu/2)

(Dong, Roth and Su, "Gaussian Differential Privacy", JRSS-B 2022, arXiv 1905.02383 v3, Corollary 2.13;
also Balle and Wang 2018, Theorem 8). Adaptive composition of Gaussian mechanisms whose
``mu_t`` are chosen adaptively, stopped when ``sum mu_t^2`` would exceed ``mu^2``, is ``mu``-GDP
(Smith and Thakurta 2022, arXiv 2210.17520, Theorem 1.1; Koskela, Tobaben and Honkela, ICLR 2023,
"Individual privacy accounting with Gaussian differential privacy", Theorem 6). Since plain
composition of Gaussians with those ``mu_t`` is exactly ``sqrt(sum mu_t^2)``-GDP, no valid
accountant can admit more rounds.

The curve is evaluated with mpmath at 60 significant digits; roots are found by Newton's method
(with the curve's closed-form derivatives) safeguarded by bisection, converted to float in the
conservative direction (``mu_for_budget`` rounds down, ``epsilon_for_mu`` rounds up) and the
float is verified against the curve before it is returned.

Examples
--------
The budget (epsilon, delta) = (4, 1e-5) allows ``mu = 0.925``: 85 full-norm rounds at noise
multiplier 10 (each ``mu_t = 0.1``, and ``85 * 0.1^2 <= 0.925^2 < 86 * 0.1^2``):

>>> mu = mu_for_budget(4.0, 1e-5)
>>> round(mu, 4), int(mu**2 / 0.1**2)
(0.9249, 85)
"""

from __future__ import annotations

import math

import mpmath

from fedfilter.checks import positive_finite
from fedfilter.privacy.rounding import down, up

_DPS = 60
# Root finding stops at this relative width, far below float64's resolution (2**-52 ~ 2.2e-16);
# the float result is then rounded outward and verified at 60 digits.
_REL_TOL = mpmath.mpf("1e-30")


def _check_delta(delta: float) -> None:
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0 and math.isfinite(delta)):
        raise ValueError(f"delta must be a number in (0, 1). Found {delta!r}.")


def _check_positive(name: str, value: float) -> None:
    if (problem := positive_finite(name, value)) is not None:
        raise ValueError(problem)


def _delta_mp(eps: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    """Dong-Roth-Su Corollary 2.13, in mpmath (exponent range is unbounded, so no underflow)."""
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def delta_for_epsilon(epsilon: float, mu: float) -> float:
    """The exact delta of ``mu``-GDP at ``epsilon``, rounded up to a float.

    Dong, Roth and Su 2022, Corollary 2.13: ``Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``.

    Parameters
    ----------
    epsilon : float
        A finite number >= 0.
    mu : float
        The GDP parameter, finite and > 0.

    Returns
    -------
    float
        delta(epsilon; mu), rounded up.

    Raises
    ------
    ValueError
        Naming a bad ``epsilon`` or ``mu``.

    Examples
    --------
    At epsilon = 0 the curve is the total variation ``Phi(mu/2) - Phi(-mu/2) = erf(mu / (2 sqrt 2))``:

    >>> delta_for_epsilon(0.0, 0.5)
    0.19741265136584749
    >>> math.erf(0.5 / (2 * math.sqrt(2)))
    0.19741265136584743
    >>> delta_for_epsilon(1.0, 1.0)
    0.12693673750664397
    """
    _check_positive("mu", mu)
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be a finite number >= 0. Found {epsilon!r}.")
    with mpmath.workdps(_DPS):
        value = _delta_mp(mpmath.mpf(epsilon), mpmath.mpf(mu))
        return float(up(float(value)))


def _newton(g, dg, lo: mpmath.mpf, hi: mpmath.mpf) -> mpmath.mpf:
    """A root of ``g`` in [lo, hi] (g changes sign there): Newton steps, bisection as safeguard."""
    g_lo = g(lo)
    x = (lo + hi) / 2
    for _ in range(400):
        gx = g(x)
        if gx == 0:
            return x
        if (gx < 0) == (g_lo < 0):
            lo, g_lo = x, gx
        else:
            hi = x
        d = dg(x)
        step = gx / d if d != 0 else None
        nxt = x - step if step is not None else (lo + hi) / 2
        if not lo < nxt < hi:
            nxt = (lo + hi) / 2
        if abs(nxt - x) <= _REL_TOL * abs(x) or hi - lo <= _REL_TOL * abs(hi):
            return nxt
        x = nxt
    raise ArithmeticError("the Gaussian-DP curve did not converge")  # pragma: no cover


def mu_for_budget(epsilon: float, delta: float) -> float:
    """The largest float ``mu`` such that ``mu``-GDP implies (epsilon, delta)-DP (rounded down).

    Parameters
    ----------
    epsilon : float
        The budget's epsilon, finite and > 0.
    delta : float
        The budget's delta, in (0, 1).

    Returns
    -------
    float
        ``mu_B``: the root of ``delta(epsilon; mu) = delta`` in ``mu``, rounded down and verified.

    Raises
    ------
    ValueError
        Naming a bad ``epsilon`` or ``delta``.

    Examples
    --------
    >>> mu = mu_for_budget(1.0, 1e-5)
    >>> mu
    0.26805112321129415
    >>> delta_for_epsilon(1.0, mu) <= 1e-5
    True
    """
    _check_positive("epsilon", epsilon)
    _check_delta(delta)
    with mpmath.workdps(_DPS):
        eps, target = mpmath.mpf(epsilon), mpmath.mpf(delta)
        hi = mpmath.mpf(1)
        while _delta_mp(eps, hi) <= target:  # delta(eps; mu) increases with mu
            hi *= 2
        lo = hi / 2
        while _delta_mp(eps, lo) > target:
            lo /= 2
        # d delta / d mu = phi(-eps/mu + mu/2) (Dong-Roth-Su's curve; the e^eps terms cancel).
        root = _newton(lambda m: _delta_mp(eps, m) - target, lambda m: mpmath.npdf(-eps / m + m / 2), lo, hi)
        # Round down, then verify at 60 digits: the returned mu is never above the true one.
        mu = float(down(float(root)))
        while _delta_mp(eps, mpmath.mpf(mu)) > target:
            mu = float(down(mu))
        return mu


def epsilon_for_mu(mu: float, delta: float) -> float:
    """The smallest float epsilon with delta(epsilon; mu) <= delta (rounded up); 0 for mu = 0.

    Parameters
    ----------
    mu : float
        The GDP parameter, finite and >= 0.
    delta : float
        The target delta, in (0, 1).

    Returns
    -------
    float
        The epsilon, rounded up and verified against the curve; 0 when ``delta(0; mu) <= delta``.

    Raises
    ------
    ValueError
        Naming a bad ``mu`` or ``delta``.

    Examples
    --------
    >>> eps = epsilon_for_mu(1.0, 1e-5)
    >>> eps
    4.377178095681225
    >>> delta_for_epsilon(eps, 1.0) <= 1e-5
    True
    >>> epsilon_for_mu(0.5, 0.2)  # delta(0; 0.5) = 0.197 is already below 0.2
    0.0
    """
    _check_delta(delta)
    if mu == 0:
        return 0.0
    _check_positive("mu", mu)
    with mpmath.workdps(_DPS):
        m, target = mpmath.mpf(mu), mpmath.mpf(delta)
        if _delta_mp(mpmath.mpf(0), m) <= target:
            return 0.0
        hi = mpmath.mpf(1)
        while _delta_mp(hi, m) > target:  # delta(eps; mu) decreases with eps
            hi *= 2
        # d delta / d eps = -e^eps Phi(-eps/mu - mu/2).
        root = _newton(
            lambda e: _delta_mp(e, m) - target,
            lambda e: -mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2),
            mpmath.mpf(0),
            hi,
        )
        eps = float(up(float(root)))
        while _delta_mp(mpmath.mpf(eps), m) > target:  # verify: the epsilon we print holds
            eps = float(up(eps))
        return eps
