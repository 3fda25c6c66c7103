"""A self-sampling device's rate for one round, and whether it is spent, from what its accounts have
left (pure math).

The rule, in one place for the device (``client/mechanisms/sampled.py``) and the engine (one row per
client): each account the round is charged to (the main one with its quotas, and the worst-case one)
has a ``room``, the largest charge it still admits, in its filter's units. The device spreads each room
over the asks its plan still expects of the run (``asks_left >= 1``) and takes the largest rate, at most
the owner's cap, whose full-clip charge fits every account's share (``spread_rate``; the charge grows
with the rate, so this is ``bisection.largest_rate``, constant work), raised to the owner's floor rate
where the whole room pays for it; where it does not, the largest rate the whole room pays for (what is
left, spent at once), 0 where not even the least rate fits (the ask is then pure noise). Asked as
planned, a device whose updates reach the clip ends near its budget at the planned horizon; a larger
budget buys a larger rate.

**Whether the device is spent reads neither the plan nor the request** (``spent``). The coordinator
sees it (a ``leave`` device answers with a marker), and the budget left is a function of the device's
data, so it is a test of what the accounts hold against the owner's settings alone: the Gaussian
allowance at the owner's smallest noise multiplier is at most ``exhausted_below`` of the clip (the
unsampled rule, ``filters.exhausted``, at the most expensive request the owner accepts). Read from the
share, a coordinator choosing ``planned_asks`` could make a ``leave`` device leave or stay at will;
read from the request's ``z`` (at small ``z`` a full-clip ask at the floor rate costs most of a budget,
at large ``z`` almost nothing), it could set the threshold anywhere in the budget and ask round after
round. As it is, the status falls once, at a threshold the coordinator does not choose, and stays (as
without sampling); the rate, which the request does move, is accounted, and a rate of 0 gives a reply
of the same form as any other.

Any rate is valid: each round is charged at its own rate (docs/derivations/amplification.md), so this
rule decides only how a budget is spread, never whether it holds.

Examples
--------
One account with room for 10 full-rate rounds and 20 asks left: the largest rate whose charge (here
``rate**2``) fits half a full round's room:

>>> rate = spread_rate([(np.array(10.0), lambda q: q**2)], asks_left=20, cap=1.0, floor=1e-3, shape=())
>>> round(float(rate), 4), float(sampled_bound(spent([np.array(0.5)], exhausted_below=1e-3), clip=2.0))
(0.7071, 2.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedfilter.privacy.bisection import MIN_RATE, largest_rate
from fedfilter.privacy.filters import exhausted
from fedfilter.privacy.rounding import down

__all__ = ["spread_rate", "spent", "sampled_bound"]


def spread_rate(
    books: Sequence[tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]],
    *,
    asks_left,
    cap,
    floor: float = MIN_RATE,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The largest rate in ``[MIN_RATE, cap]`` whose full-clip charge fits each account's room over
    ``asks_left``, raised to ``floor`` (per row) where the whole rooms admit it; where they do not, the
    largest rate the whole rooms admit, 0 where none does (module docstring).

    Parameters
    ----------
    books : sequence of (numpy.ndarray, callable)
        Per account: its room per row (filter units, >= 0), and ``charge(rates)``, the full-clip charge
        per row at those rates, in the same units (shape ``shape``).
    asks_left : int or numpy.ndarray
        The asks the plan still expects, >= 1 (per row).
    cap : float or numpy.ndarray
        The owner's largest rate.
    floor : float, optional
        The least rate worth an ask while the whole room pays for it (the owner's ``exhausted_below``;
        at most ``cap``).
    shape : tuple of int
        The rows' shape.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    The share's rate, the floor, and (a room below the floor's charge) what the whole room pays for:

    >>> rooms = (np.array([10.0, 1e-5, 1e-8]), lambda q: q**2)
    >>> spread_rate([rooms], asks_left=np.array([10, 1000, 10]), cap=1.0, floor=1e-3, shape=(3,)).round(4)
    array([1.e+00, 1.e-03, 1.e-04])
    """
    asks = np.asarray(asks_left)
    if np.any(asks < 1):
        raise ValueError(f"asks_left must be >= 1. Found {asks_left!r}.")
    rooms = [np.asarray(room, dtype=np.float64) for room, _ in books]
    shares = [down(room / asks) for room in rooms]
    charges = [charge for _, charge in books]

    def fits(rates, limits=shares):
        ok = np.ones(shape, dtype=bool)
        for limit, charge in zip(limits, charges):
            ok &= np.asarray(charge(rates)) <= limit
        return ok

    least = np.minimum(max(float(floor), MIN_RATE), np.asarray(cap, dtype=np.float64))
    spread = largest_rate(fits, cap, shape)
    whole = largest_rate(lambda rates: fits(rates, rooms), cap, shape)  # >= spread: a share is within its room
    return np.minimum(np.maximum(spread, least), whole)


def spent(allowances: Sequence[np.ndarray], *, exhausted_below: float) -> np.ndarray:
    """Where a self-sampling device is spent: some account's Gaussian allowance at the owner's smallest
    noise multiplier, in units of the clip, is at most ``exhausted_below`` (module docstring: it reads
    neither the plan nor the request).

    Parameters
    ----------
    allowances : sequence of numpy.ndarray
        Per account (the main one with every quota, and the worst-case one), the largest norm it admits
        at noise std ``min_noise_multiplier`` (the clip is 1), per row.
    exhausted_below : float
        The owner's threshold, a fraction of the clip.

    Returns
    -------
    numpy.ndarray of bool

    Examples
    --------
    >>> spent([np.array([0.5, 0.5, 1e-4]), np.array([0.5, 1e-4, 0.5])], exhausted_below=1e-3)
    array([False,  True,  True])
    """
    out = np.zeros(np.broadcast_shapes(*(np.shape(a) for a in allowances)), dtype=bool)
    for allowance in allowances:
        out |= exhausted(allowance, 1.0, exhausted_below)
    return out


def sampled_bound(spent, *, clip) -> np.ndarray:
    """The round's norm bound: the clip, or 0 where the device is spent (``spent``). A device that is not
    spent puts the full clip behind its coin whatever its rate (at rate 0 the coin always drops it).

    Parameters
    ----------
    spent : bool or numpy.ndarray
        Where the device is spent.
    clip : float
        The request's ``C``.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> sampled_bound(np.array([False, True]), clip=1.0)
    array([1., 0.])
    """
    return np.where(np.asarray(spent, dtype=bool), 0.0, float(clip))
