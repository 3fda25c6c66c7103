"""A self-sampling device's rate for one round, from what its accounts have left (pure math).

The rule, in one place for the device (``client/mechanisms/sampled.py``) and the engine (one row per
client): each account the round is charged to (the main one with its quotas, and the worst-case one)
has a ``room``, the largest charge it still admits, in its filter's units. The device spreads each room
over the asks its plan still expects of the run (``asks_left >= 1``) and takes the largest rate, at most
the owner's cap, whose full-clip charge fits every account's share (``spread_rate``; the charge grows
with the rate, so this is ``bisection.largest_rate``, constant work). Asked as planned, a device whose
updates reach the clip ends near its budget at the planned horizon; a larger budget buys a larger
rate. Its norm bound is then the full clip, or nothing when ``rate * C`` is at most the owner's
``exhausted_below`` share of ``C`` (``sampled_bound``): the device varies its rate, not its norm.

Any rate is valid: each round is charged at its own rate (docs/derivations/amplification.md), so this
rule decides only how a budget is spread, never whether it holds.

Examples
--------
One account with room for 10 full-rate rounds and 20 asks left: the largest rate whose charge (here
``rate**2``) fits half a full round's room:

>>> rate = spread_rate([(np.array(10.0), lambda q: q**2)], asks_left=20, cap=1.0, shape=())
>>> round(float(rate), 4), float(sampled_bound(rate, clip=2.0, exhausted_below=1e-3))
(0.7071, 2.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedfilter.privacy.bisection import largest_rate
from fedfilter.privacy.rounding import down

__all__ = ["spread_rate", "sampled_bound"]


def spread_rate(
    books: Sequence[tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]],
    *,
    asks_left,
    cap,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The largest rate in ``[MIN_RATE, cap]`` whose full-clip charge fits each account's room over
    ``asks_left`` (per row); 0 where not even ``MIN_RATE`` fits.

    Parameters
    ----------
    books : sequence of (numpy.ndarray, callable)
        Per account: its room per row (filter units, >= 0), and ``charge(rates)``, the full-clip charge
        per row at those rates, in the same units (shape ``shape``).
    asks_left : int or numpy.ndarray
        The asks the plan still expects, >= 1 (per row).
    cap : float or numpy.ndarray
        The owner's largest rate.
    shape : tuple of int
        The rows' shape.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> rooms = (np.array([10.0, 1.0]), lambda q: q**2)
    >>> spread_rate([rooms], asks_left=np.array([10, 10]), cap=1.0, shape=(2,)).round(4)
    array([1.    , 0.3162])
    """
    asks = np.asarray(asks_left)
    if np.any(asks < 1):
        raise ValueError(f"asks_left must be >= 1. Found {asks_left!r}.")
    shares = [(down(np.asarray(room, dtype=np.float64) / asks), charge) for room, charge in books]

    def fits(rates):
        ok = np.ones(shape, dtype=bool)
        for share, charge in shares:
            ok &= np.asarray(charge(rates)) <= share
        return ok

    return largest_rate(fits, cap, shape)


def sampled_bound(rate, *, clip, exhausted_below: float) -> np.ndarray:
    """The round's norm bound at ``rate``: the clip, or 0 where ``rate * clip <= exhausted_below * clip``.

    Parameters
    ----------
    rate : float or numpy.ndarray
        The round's rate (``spread_rate``).
    clip : float
        The request's ``C``.
    exhausted_below : float
        The owner's threshold, a fraction of the clip.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> sampled_bound(np.array([0.5, 1e-4, 0.0]), clip=1.0, exhausted_below=1e-3)
    array([1., 0., 0.])
    """
    r = np.asarray(rate, dtype=np.float64)
    return np.where(r * clip > exhausted_below * clip, float(clip), 0.0)
