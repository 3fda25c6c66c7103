"""Whether a released mean carries signal: its norm against the norm of pure noise.

A released mean is the devices' signal plus Gaussian noise ``N(0, s^2 I_d)`` (local placement; in
distributed placement Skellam noise of the same variance, whose norm the Gaussian's approximates
closely for large ``d``). Pure noise has norm ``s X`` with ``X`` chi-distributed with ``d`` degrees
of freedom, so its mean is the expected noise norm ``E = s * chi_mean(d)`` the wrapper logs
(``privacy/noise_norm.py``) and ``s = E / chi_mean(d)``.

**The round's test.** A round is *noise-like* when its mean's norm is at most ``s * q``, ``q`` the
``1 - alpha`` quantile of ``chi(d)``: the mean is then within the range pure noise reaches with
probability ``1 - alpha``. So a pure-noise round is called noise-like with probability exactly
``1 - alpha`` (``NOISE_LIKE_ALPHA = 0.001``: 0.999), and a round whose mean carries a signal of norm
``S`` with probability ``F(q^2; d, (S / s)^2)``, the noncentral chi-squared distribution function
(``noise_like_probability``): the rate at which a round with that signal is falsely called
noise-like. It falls fast with ``S``: for ``d = 19,754`` it is about 0.5 at ``S = 2.1 d^(1/4) s``
(the signal the test can just detect) and below 1e-6 at twice that.

**The warning.** ``SignalWatch`` warns when ``CONSECUTIVE_ROUNDS = 3`` released rounds in a row are
noise-like. A run of pure noise is warned about within its first 3 released rounds with probability
``0.999^3 = 0.997``; a run whose means all carry a signal of norm ``S`` gets a false alarm at a given
round with probability ``noise_like_probability(S, ...)^3`` (independent noise each round). Rounds
not released say nothing and leave the count as it is.

The likely causes of noise-like rounds: the devices' budgets are spent and they send noise only
(``after-exhaustion = noise-only``, by design indistinguishable from a report), or the noise
multiplier is too large for the number of reports averaged (``fedfilter plan``).

Examples
--------
>>> watch = SignalWatch()
>>> [watch.observe(noise_like) for noise_like in (True, True, False, True, True, True)]
[False, False, False, False, False, True]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from scipy import stats

from fedfilter.checks import positive_finite
from fedfilter.privacy.noise_norm import chi_mean

__all__ = [
    "CONSECUTIVE_ROUNDS",
    "NOISE_LIKE_ALPHA",
    "SignalWatch",
    "is_noise_like",
    "noise_like_norm",
    "noise_like_probability",
]

NOISE_LIKE_ALPHA = 0.001  # a pure-noise round is called noise-like with probability 1 - alpha
CONSECUTIVE_ROUNDS = 3  # noise-like released rounds in a row before the warning


@lru_cache(maxsize=64)
def _chi_quantile(dim: int, alpha: float) -> float:
    return float(stats.chi.ppf(1.0 - alpha, dim))


def _check(expected_noise_norm: float, dim: int, alpha: float) -> None:
    problems = []
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        problems.append(f"dim must be an integer >= 1. Found {dim!r}.")
    if not (isinstance(expected_noise_norm, (int, float)) and math.isfinite(expected_noise_norm)):
        problems.append(f"expected_noise_norm must be a finite number >= 0. Found {expected_noise_norm!r}.")
    elif expected_noise_norm < 0:
        problems.append(f"expected_noise_norm must be a finite number >= 0. Found {expected_noise_norm!r}.")
    if not (isinstance(alpha, float) and 0.0 < alpha < 1.0):
        problems.append(f"alpha must be a float in (0, 1). Found {alpha!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def noise_like_norm(expected_noise_norm: float, dim: int, alpha: float = NOISE_LIKE_ALPHA) -> float:
    """The largest norm a mean of pure noise reaches with probability ``1 - alpha``: ``s * q``.

    Parameters
    ----------
    expected_noise_norm : float
        The expected norm of the mean's noise, ``s * chi_mean(dim)`` (``RoundOutcome.expected_noise_norm``).
    dim : int
        The released coordinates.
    alpha : float, optional
        The chance that pure noise exceeds it.

    Returns
    -------
    float
        ``s`` times the ``1 - alpha`` quantile of the chi distribution with ``dim`` degrees of freedom.

    Raises
    ------
    ValueError
        Naming the bad argument and its value.

    Examples
    --------
    In one dimension the noise is ``|N(0, s^2)|``, whose 0.999 quantile is 3.29 s:

    >>> s = 2.0
    >>> round(noise_like_norm(s * chi_mean(1), 1), 3), round(s * 3.2905, 3)
    (6.581, 6.581)
    """
    _check(expected_noise_norm, dim, alpha)
    return expected_noise_norm / chi_mean(dim) * _chi_quantile(dim, alpha)


def is_noise_like(mean_norm: float, expected_noise_norm: float, dim: int, alpha: float = NOISE_LIKE_ALPHA) -> bool:
    """Whether a released mean's norm is within what pure noise reaches (``<= noise_like_norm``).

    Parameters
    ----------
    mean_norm : float
        The released mean's norm.
    expected_noise_norm : float
        The expected norm of its noise.
    dim : int
        The released coordinates.
    alpha : float, optional
        The chance that a pure-noise mean is not called noise-like.

    Returns
    -------
    bool
        True: the mean carries no signal the noise does not explain.

    Examples
    --------
    >>> is_noise_like(140.0, 140.0, 19754), is_noise_like(150.0, 140.0, 19754)
    (True, False)
    """
    return bool(mean_norm <= noise_like_norm(expected_noise_norm, dim, alpha))


def noise_like_probability(signal_norm: float, noise_std: float, dim: int, alpha: float = NOISE_LIKE_ALPHA) -> float:
    """The chance that a mean with a signal of norm ``signal_norm`` is called noise-like (a false alarm
    for that round): ``P(||signal + N(0, s^2 I)||^2 <= (s q)^2)``, the noncentral chi-squared
    distribution function with ``dim`` degrees of freedom and noncentrality ``(signal_norm / s)^2``.

    Parameters
    ----------
    signal_norm : float
        The norm of the mean's signal, >= 0.
    noise_std : float
        The noise std per coordinate of the mean, > 0.
    dim : int
        The released coordinates.
    alpha : float, optional
        The test's level.

    Returns
    -------
    float
        The probability; ``1 - alpha`` for no signal.

    Examples
    --------
    >>> round(noise_like_probability(0.0, 1.0, 100), 6)
    0.999
    >>> noise_like_probability(100.0, 1.0, 100) < 1e-12
    True
    """
    if problem := positive_finite("noise_std", noise_std):
        raise ValueError(problem)
    if not (math.isfinite(signal_norm) and signal_norm >= 0):
        raise ValueError(f"signal_norm must be a finite number >= 0. Found {signal_norm!r}.")
    _check(1.0, dim, alpha)
    q = _chi_quantile(dim, alpha)
    if signal_norm == 0:
        return float(stats.chi2.cdf(q * q, dim))
    return float(stats.ncx2.cdf(q * q, dim, (signal_norm / noise_std) ** 2))


@dataclass
class SignalWatch:
    """Counts noise-like released rounds in a row; says when to warn (once per streak).

    Attributes
    ----------
    rounds : int
        The streak that triggers the warning.
    streak : int
        Noise-like released rounds in a row so far.

    Examples
    --------
    >>> watch = SignalWatch(rounds=2)
    >>> watch.observe(True), watch.observe(True), watch.observe(True), watch.streak
    (False, True, False, 3)
    """

    rounds: int = CONSECUTIVE_ROUNDS
    streak: int = 0

    def observe(self, noise_like: bool) -> bool:
        """Count one released round; True exactly when the streak reaches ``rounds``.

        Parameters
        ----------
        noise_like : bool
            ``is_noise_like`` of the round's mean.

        Returns
        -------
        bool
            Whether to warn now.

        Examples
        --------
        >>> SignalWatch(rounds=1).observe(True)
        True
        """
        self.streak = self.streak + 1 if noise_like else 0
        return self.streak == self.rounds
