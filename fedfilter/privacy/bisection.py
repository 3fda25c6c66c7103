"""The constant-work bisection every norm allowance uses (pure math).

An allowance is the largest norm in ``[0, top]`` whose charge still fits what is left. Each charge
grows with the norm, so bisection finds it; the Skellam allowance (``skellam.skellam_allowance``) and
the sampled-Gaussian one (``subsampled.sampled_gaussian_allowance``) both call ``largest_admitted``.
It evaluates ``top`` and every one of ``ALLOWANCE_STEPS`` midpoints whatever the budget left (no early
exit), so the time a device spends does not reveal its state; every value it returns was itself
checked by ``fits``.

A sampling rate is found the same way, on ``log q`` (``largest_rate``): the loss of a subsampled
release grows with its rate, so the largest rate whose charge fits is a bisection too (a device's
rate from what it has left, ``client/mechanisms/sampled.py``; a fresh device's rate from its budget,
``planning.sampled_rounds.rate_for_budget``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

ALLOWANCE_STEPS = 64  # bisection steps: within top * 2**-64 of the largest admitted value
RATE_STEPS = 24  # bisection steps of ``largest_rate`` on log q: within 1e-6 (relative) of the largest rate
MIN_RATE = 1e-6  # the smallest rate ``largest_rate`` considers


def largest_admitted(fits: Callable[[np.ndarray], np.ndarray], top, shape: tuple[int, ...]) -> np.ndarray:
    """The largest value in ``[0, top]`` (per row of ``shape``) that ``fits`` admits, ``fits`` being
    non-decreasing in failing: once a value fails, every larger one does.

    Parameters
    ----------
    fits : callable
        ``fits(values) -> bool array``: whether each value is admitted.
    top : float or array_like
        The largest value considered, >= 0 (broadcast to ``shape``).
    shape : tuple of int
        The shape of the answer.

    Returns
    -------
    numpy.ndarray
        ``top`` where it fits, else the last admitted midpoint (0 when none is).

    Examples
    --------
    >>> float(largest_admitted(lambda x: x * x <= 2.0, 4.0, ()))  # sqrt(2), from below
    1.414213562373095
    >>> float(largest_admitted(lambda x: x <= 9.0, 4.0, ()))
    4.0
    """
    lo = np.zeros(shape)
    hi = np.broadcast_to(np.asarray(top, dtype=np.float64), shape).astype(np.float64)
    whole = fits(hi)
    for _ in range(ALLOWANCE_STEPS):
        mid = lo + (hi - lo) / 2
        ok = fits(mid)
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(whole, np.broadcast_to(np.asarray(top, dtype=np.float64), shape), lo)


def largest_rate(fits: Callable[[np.ndarray], np.ndarray], cap, shape: tuple[int, ...]) -> np.ndarray:
    """The largest rate in ``[MIN_RATE, cap]`` (per row of ``shape``) that ``fits`` admits, by bisection
    on ``log q`` (``RATE_STEPS`` steps), ``fits`` being non-decreasing in failing; 0 where not even
    ``MIN_RATE`` fits.

    Constant work: ``cap``, the smallest rate and every midpoint are evaluated whatever is admitted;
    every value returned was itself checked by ``fits``.

    Parameters
    ----------
    fits : callable
        ``fits(rates) -> bool array``: whether each rate is admitted.
    cap : float or array_like
        The largest rate considered, in ``[MIN_RATE, 1]`` (broadcast to ``shape``).
    shape : tuple of int
        The shape of the answer.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> round(float(largest_rate(lambda q: q <= 0.3, 1.0, ())), 5)
    0.3
    >>> float(largest_rate(lambda q: q <= 0.3, 0.25, ())), float(largest_rate(lambda q: q < 0, 1.0, ()))
    (0.25, 0.0)
    """
    top = np.broadcast_to(np.asarray(cap, dtype=np.float64), shape).astype(np.float64)
    if np.any(~(top >= MIN_RATE) | (top > 1)):
        raise ValueError(f"cap (the largest rate) must be in [{MIN_RATE}, 1]. Found {cap!r}.")
    hi = np.log(top)
    lo = np.full(shape, math.log(MIN_RATE))
    whole = fits(top)
    least = np.exp(lo)
    some = fits(least)
    for _ in range(RATE_STEPS):
        mid = lo + (hi - lo) / 2
        ok = fits(np.exp(mid))
        lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid)
    return np.where(whole, top, np.where(some, np.exp(lo), 0.0))
