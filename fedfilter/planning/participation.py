"""How often each device is asked: balanced passes when the population is known, or a quantile of chance.

A device's plan pays for a number of asks; a device asked more often than that spends its budget and
shrinks or stops its last updates. Two ways to keep the asks within the plan:

* **balanced passes** (``BalancedSchedule``): the population is shuffled and walked through in order,
  a fresh shuffle for each pass, so after any number of rounds every device has been asked within
  one of the same number of times, ``ceil(rounds * per_round / population)`` at most;
* **uniform sampling** (each round asks ``per_round`` of ``population`` at random): a device is asked
  ``Binomial(rounds, per_round / population)`` times, and the plan pays for a stated quantile of that
  (``asks_planned``).

Pure: no Flower, no I/O; the random generator is the caller's.

Examples
--------
>>> import numpy as np
>>> schedule = BalancedSchedule(population=5, per_round=2, rng=np.random.default_rng(0))
>>> counts = np.bincount(np.concatenate([schedule.next_round() for _ in range(7)]), minlength=5)
>>> int(counts.max() - counts.min()) <= 1, int(counts.sum()), balanced_asks(7, 2, 5)
(True, 14, 3)
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from fedfilter.checks import int_in, short_repr

__all__ = ["BalancedSchedule", "asks_planned", "balanced_asks"]


def balanced_asks(rounds: int, per_round: int, population: int) -> int:
    """The most times balanced passes ask any device: ``ceil(rounds * per_round / population)``.

    Parameters
    ----------
    rounds : int
        Rounds in the run.
    per_round : int
        Devices asked per round.
    population : int
        Devices in the federation.

    Examples
    --------
    >>> balanced_asks(20, 200, 1000), balanced_asks(21, 200, 1000)
    (4, 5)
    """
    return -(-rounds * per_round // population)


def asks_planned(rounds: int, per_round: int, population: int, quantile: float | None) -> int:
    """How many asks a plan pays for under uniform sampling.

    ``quantile=None``: the expected number rounded up, ``ceil(rounds * per_round / population)``;
    else the smallest ``a`` with ``P(X <= a) >= quantile`` for ``X ~ Binomial(rounds, per_round /
    population)``, in exact rational arithmetic (so a device is asked more often than planned with
    probability at most ``1 - quantile``).

    Parameters
    ----------
    rounds : int
        Rounds in the run.
    per_round : int
        Devices asked per round.
    population : int
        Devices in the federation.
    quantile : float or None
        In (0, 1).

    Examples
    --------
    >>> asks_planned(20, 200, 1000, None), asks_planned(20, 200, 1000, 0.9)
    (4, 6)
    """
    if quantile is None:
        return balanced_asks(rounds, per_round, population)
    if not 0.0 < quantile < 1.0:
        raise ValueError(f"quantile must lie in (0, 1). Found {short_repr(quantile)}.")
    p, q = Fraction(per_round, population), Fraction(quantile)
    cdf = Fraction(0)
    for a in range(rounds + 1):
        cdf += math.comb(rounds, a) * p**a * (1 - p) ** (rounds - a)
        if cdf >= q:
            return a
    return rounds


class BalancedSchedule:
    """Which devices each round asks, in balanced passes over a shuffled population.

    Round after round it takes the next ``per_round`` devices of the current pass; when a pass runs
    out, the rest of the round comes from a fresh shuffle, skipping the devices this round already
    has (they go first in the next round instead). So no round asks a device twice, and after any
    number of rounds the counts differ by at most one.

    Parameters
    ----------
    population : int
        Devices, indexed ``0 .. population - 1``.
    per_round : int
        Devices asked per round, in ``[1, population]``.
    rng : numpy.random.Generator
        The shuffles' generator.

    Examples
    --------
    >>> schedule = BalancedSchedule(population=3, per_round=2, rng=np.random.default_rng(1))
    >>> rounds = [sorted(schedule.next_round().tolist()) for _ in range(3)]
    >>> [len(set(r)) for r in rounds], sorted(sum(rounds, []))
    ([2, 2, 2], [0, 0, 1, 1, 2, 2])
    """

    def __init__(self, population: int, per_round: int, rng: np.random.Generator) -> None:
        if not int_in(population, 1, 2**62):
            raise ValueError(f"population must be a positive integer. Found {short_repr(population)}.")
        if not int_in(per_round, 1, population):
            raise ValueError(
                f"per_round must be an integer in [1, population={population}]. Found {short_repr(per_round)}."
            )
        self.population, self.per_round, self._rng = population, per_round, rng
        self._queue: list[int] = []

    def next_round(self) -> np.ndarray:
        """The indices the next round asks (``per_round`` distinct devices).

        Examples
        --------
        >>> BalancedSchedule(4, 4, np.random.default_rng(0)).next_round().size
        4
        """
        chosen: list[int] = []
        taken: set[int] = set()
        while len(chosen) < self.per_round:
            if not self._queue:
                self._queue = self._rng.permutation(self.population).tolist()
            # The first device of the queue this round does not have yet; the skipped ones keep
            # their place at the front (they are the ones furthest behind).
            for i, device in enumerate(self._queue):
                if device not in taken:
                    chosen.append(device)
                    taken.add(device)
                    del self._queue[i]
                    break
            else:
                fresh = [d for d in self._rng.permutation(self.population).tolist() if d not in self._queue]
                self._queue.extend(fresh)
        return np.asarray(chosen, dtype=np.int64)
