"""A self-sampling device's rate for one round, from what its accounts have left (pure math).

The rule, in one place for the device (``client/mechanisms/sampled.py``) and the engine (one row per
client): each account the round is charged to (the main one with its quotas, and the worst-case one)
has a ``room``, the largest charge it still admits, in its filter's units. The device spreads each room
over the asks its plan still expects of the run (``asks_left >= 1``) and takes the largest rate, at most
the owner's cap, whose full-clip charge fits every account's share (``spread_rate``; the charge grows
with the rate, so this is ``bisection.largest_rate``, constant work). Asked as planned, a device whose
updates reach the clip ends near its budget at the planned horizon; a larger budget buys a larger
rate. Its norm bound is then the full clip, or nothing once it is exhausted (``sampled_bound``): the
device varies its rate, not its norm.

**Exhaustion does not read the plan.** A device is exhausted when its whole room (not its share) no
longer admits a full-clip ask at the floor rate, the owner's ``exhausted_below`` (the same fraction
of the clip's signal the unsampled rule stops at; ``MIN_RATE`` at least); otherwise its rate is at
least that floor. Were exhaustion read from the share, a coordinator choosing ``planned_asks`` could
make a ``leave`` device leave or stay at will, and from which it did learn whether its budget left
(which its data decided) was above a threshold of its choosing, round after round. As it is, the
status depends on what the accounts hold alone, falls once and stays, as without sampling.

Any rate is valid: each round is charged at its own rate (docs/derivations/amplification.md), so this
rule decides only how a budget is spread, never whether it holds.

Examples
--------
One account with room for 10 full-rate rounds and 20 asks left: the largest rate whose charge (here
``rate**2``) fits half a full round's room:

>>> rate = spread_rate([(np.array(10.0), lambda q: q**2)], asks_left=20, cap=1.0, floor=1e-3, shape=())
>>> round(float(rate), 4), float(sampled_bound(rate, clip=2.0))
(0.7071, 2.0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from fedfilter.privacy.bisection import MIN_RATE, largest_rate
from fedfilter.privacy.rounding import down

__all__ = ["spread_rate", "sampled_bound"]


def spread_rate(
    books: Sequence[tuple[np.ndarray, Callable[[np.ndarray], np.ndarray]]],
    *,
    asks_left,
    cap,
    floor: float = MIN_RATE,
    shape: tuple[int, ...],
) -> np.ndarray:
    """The largest rate in ``[MIN_RATE, cap]`` whose full-clip charge fits each account's room over
    ``asks_left``, raised to ``floor`` (per row); 0 (exhausted) where the whole room does not admit
    ``floor`` (module docstring: exhaustion does not read the plan).

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
        The least rate worth an ask (the owner's ``exhausted_below``; at most ``cap``).
    shape : tuple of int
        The rows' shape.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> rooms = (np.array([10.0, 1.0, 1e-8]), lambda q: q**2)
    >>> spread_rate([rooms], asks_left=np.array([10, 10, 10]), cap=1.0, floor=1e-3, shape=(3,)).round(4)
    array([1.    , 0.3162, 0.    ])
    >>> float(spread_rate([(np.array(1e-5), lambda q: q**2)], asks_left=1000, cap=1.0, floor=1e-3, shape=()))
    0.001
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
    alive = fits(np.broadcast_to(least, shape), rooms)  # the whole room, not the share: the plan is not read
    return np.where(alive, np.maximum(largest_rate(fits, cap, shape), least), 0.0)


def sampled_bound(rate, *, clip) -> np.ndarray:
    """The round's norm bound at ``rate``: the clip, or 0 where the device is exhausted (rate 0).

    Parameters
    ----------
    rate : float or numpy.ndarray
        The round's rate (``spread_rate``).
    clip : float
        The request's ``C``.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> sampled_bound(np.array([0.5, 1e-3, 0.0]), clip=1.0)
    array([1., 1., 0.])
    """
    return np.where(np.asarray(rate, dtype=np.float64) > 0, float(clip), 0.0)
