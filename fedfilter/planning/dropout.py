"""How many reports a round may wait for, given the drop-out rate the operator expects.

Each of the ``k`` devices asked replies independently with probability ``1 - dropout``, so the
replies are ``X ~ Binomial(k, 1 - dropout)``. A distributed round with ``min_reports = m`` aborts
(is not released) when ``X < m``. A larger ``m`` puts less noise in the sum (each report carries
``1 / sqrt(m)`` of it: ``m`` at half the asked devices doubles the sum's noise variance), a smaller
one aborts less often; ``min_reports_for_dropout`` takes the largest ``m`` whose abort probability
is at most a stated target. The probabilities are scipy's Binomial distribution (its regularised
incomplete beta, accurate to a few ulps), tested against exact rational arithmetic.

Pure: no Flower, no I/O.

Examples
--------
>>> m, p = min_reports_for_dropout(100, 0.1, 0.01)
>>> m, round(p, 4), abort_probability(100, 0.1, m + 1) > 0.01
(82, 0.0046, True)
"""

from __future__ import annotations

from scipy import stats

from fedfilter.checks import finite, int_in, short_repr

__all__ = ["abort_probability", "check_rate", "expected_reports", "min_reports_for_dropout"]


def check_rate(name: str, value: object, *, low_open: bool = False) -> float:
    """``value`` as a float in ``[0, 1)`` (``(0, 1)`` with ``low_open``), or a ``ValueError`` naming it.

    Parameters
    ----------
    name : str
        The field's name, for the message.
    value : object
        The value given.
    low_open : bool, optional
        Refuse 0 too.

    Examples
    --------
    >>> check_rate("dropout_rate", 0.1)
    0.1
    >>> check_rate("dropout_rate", 1.0)
    Traceback (most recent call last):
    ...
    ValueError: dropout_rate must be a number in [0, 1). Found 1.0.
    """
    x = finite(value)
    if x is None or not (0.0 < x < 1.0 if low_open else 0.0 <= x < 1.0):
        interval = "(0, 1)" if low_open else "[0, 1)"
        raise ValueError(f"{name} must be a number in {interval}. Found {short_repr(value)}.")
    return x


def abort_probability(asked: int, dropout_rate: float, min_reports: int) -> float:
    """``P(X < min_reports)`` for ``X ~ Binomial(asked, 1 - dropout_rate)``: the chance a round aborts.

    Parameters
    ----------
    asked : int
        ``k``, the devices asked per round.
    dropout_rate : float
        The chance a device asked does not reply, in [0, 1).
    min_reports : int
        ``m``, in ``[1, asked]``.

    Examples
    --------
    >>> abort_probability(2, 0.5, 1), abort_probability(2, 0.5, 2)  # no reply; fewer than two
    (0.25, 0.75)
    """
    if not int_in(asked, 1, 2**62):
        raise ValueError(f"asked must be an integer >= 1. Found {short_repr(asked)}.")
    d = check_rate("dropout_rate", dropout_rate)
    if not int_in(min_reports, 1, asked):
        raise ValueError(f"min_reports must be an integer in [1, asked={asked}]. Found {short_repr(min_reports)}.")
    return float(stats.binom.cdf(min_reports - 1, asked, 1.0 - d))


def min_reports_for_dropout(asked: int, dropout_rate: float, target: float) -> tuple[int, float]:
    """The largest ``m`` whose round aborts (``X < m``) with probability at most ``target``, and that probability.

    When even ``m = 1`` aborts more often (every device asked drops out with probability
    ``dropout_rate ** asked > target``), ``m = 1`` and its probability, above the target, are returned.

    Parameters
    ----------
    asked : int
        ``k``, the devices asked per round.
    dropout_rate : float
        In [0, 1).
    target : float
        The abort probability allowed, in (0, 1).

    Examples
    --------
    >>> min_reports_for_dropout(10, 0.0, 0.01)  # nobody drops out: wait for all ten
    (10, 0.0)
    >>> min_reports_for_dropout(1, 0.5, 0.01)  # the target cannot be met: one report, and its chance
    (1, 0.5)
    """
    t = check_rate("abort_probability", target, low_open=True)
    lo, hi = 1, asked  # abort_probability is non-decreasing in m: the largest m with P <= t
    if abort_probability(asked, dropout_rate, lo) > t:
        return 1, abort_probability(asked, dropout_rate, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if abort_probability(asked, dropout_rate, mid) <= t else (lo, mid - 1)
    return lo, abort_probability(asked, dropout_rate, lo)


def expected_reports(asked: int, dropout_rate: float) -> float:
    """``k (1 - dropout)``: the replies a round expects.

    Parameters
    ----------
    asked : int
        ``k``.
    dropout_rate : float
        In [0, 1).

    Examples
    --------
    >>> expected_reports(100, 0.1)
    90.0
    """
    return asked * (1.0 - check_rate("dropout_rate", dropout_rate))
