"""The constant-work bisection every norm allowance uses (pure math).

An allowance is the largest norm in ``[0, top]`` whose charge still fits what is left. Each charge
grows with the norm, so bisection finds it; the Skellam allowance (``skellam.skellam_allowance``) and
the sampled-Gaussian one (``subsampled.sampled_gaussian_allowance``) both call ``largest_admitted``.
It evaluates ``top`` and every one of ``ALLOWANCE_STEPS`` midpoints whatever the budget left (no early
exit), so the time a device spends does not reveal its state; every value it returns was itself
checked by ``fits``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

ALLOWANCE_STEPS = 64  # bisection steps: within top * 2**-64 of the largest admitted value


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
