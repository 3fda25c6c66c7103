"""The expected norm of Gaussian noise: what a released mean carries besides the signal.

The norm of ``N(0, s^2 I_d)`` is ``s`` times a chi-distributed variable with ``d`` degrees of
freedom, whose mean is ``sqrt(2) Gamma((d + 1) / 2) / Gamma(d / 2)`` (the chi distribution;
Johnson, Kotz & Balakrishnan, *Continuous Univariate Distributions* vol. 1, 2nd ed., ch. 18). It lies just below
``sqrt(d)`` (``sqrt(d - 1/2)`` asymptotically), so the noise of a 62,006-parameter model's mean is
about ``249 s``. The ratio of the gamma functions overflows a float for d above about 340:
``chi_mean`` uses log-gamma, and an asymptotic series for large d.

Pure functions: no torch, no Flower, no I/O.

Examples
--------
>>> round(expected_noise_norm(std=1.0, dim=62006), 2)
249.01
"""

from __future__ import annotations

import math

__all__ = ["chi_mean", "expected_noise_norm"]


def _check_dim(dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"dim (the number of noised coordinates) must be an integer >= 1. Found {dim!r}.")


def chi_mean(dim: int) -> float:
    """``E ||N(0, I_dim)||_2 = sqrt(2) Gamma((dim + 1) / 2) / Gamma(dim / 2)``.

    Below ``dim = 2000`` through ``lgamma`` (its absolute error of a few ulps of about 6,600 keeps
    the relative error near 1e-12); above, through the asymptotic series ``Gamma(x + 1/2) /
    Gamma(x) = sqrt(x) (1 - 1/(8x) + 1/(128x^2) + 5/(1024x^3) - 21/(32768x^4) + O(x^-5))`` (DLMF
    5.11.13 with Stirling's coefficients), whose truncation error is below 1e-17 there: a
    difference of two large ``lgamma`` values would lose digits (1e-9 relative at dim = 1e7).

    Parameters
    ----------
    dim : int
        The number of coordinates, >= 1.

    Returns
    -------
    float
        The mean of the chi distribution with ``dim`` degrees of freedom.

    Raises
    ------
    ValueError
        If ``dim`` is not an integer >= 1.

    Examples
    --------
    In one and two dimensions the mean is ``sqrt(2 / pi)`` and ``sqrt(pi / 2)``; for large ``dim``
    it approaches ``sqrt(dim - 1/2)``:

    >>> round(chi_mean(1), 12), round(math.sqrt(2 / math.pi), 12)
    (0.797884560803, 0.797884560803)
    >>> round(chi_mean(2), 12), round(math.sqrt(math.pi / 2), 12)
    (1.253314137316, 1.253314137316)
    >>> round(chi_mean(5000), 6), round(math.sqrt(4999.5), 6)
    (70.707143, 70.707142)
    """
    _check_dim(dim)
    x = dim / 2.0
    if dim < 2000:
        return math.sqrt(2.0) * math.exp(math.lgamma(x + 0.5) - math.lgamma(x))
    series = 1.0 - 1.0 / (8 * x) + 1.0 / (128 * x**2) + 5.0 / (1024 * x**3) - 21.0 / (32768 * x**4)
    return math.sqrt(2.0 * x) * series


def expected_noise_norm(*, std: float, dim: int) -> float:
    """The mean L2 norm of ``dim`` independent Gaussian coordinates of standard deviation ``std``.

    Parameters
    ----------
    std : float
        The noise std per coordinate, finite and >= 0.
    dim : int
        The number of coordinates, >= 1.

    Returns
    -------
    float
        ``std * chi_mean(dim)``.

    Raises
    ------
    ValueError
        For a bad ``std`` or ``dim``.

    Examples
    --------
    >>> round(expected_noise_norm(std=2.0, dim=2), 12), round(2.0 * math.sqrt(math.pi / 2), 12)
    (2.506628274631, 2.506628274631)
    """
    if isinstance(std, bool) or not (isinstance(std, (int, float)) and math.isfinite(std) and std >= 0):
        raise ValueError(f"std must be a finite number >= 0. Found {std!r}.")
    return float(std) * chi_mean(dim)
