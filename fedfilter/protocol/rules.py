"""The public rules of one round, written once: the device, the strategy and the engine call these.

* the noise std every observer's view carries, ``z * C`` (Feldman and Zrnic, "Individual Privacy
  Accounting via a Rényi Filter", NeurIPS 2021, Algorithm 7, with the Gaussian mechanism's std
  ``sigma = z * C``), and the share one client adds: all of it in ``local`` placement,
  ``z * C / sqrt(m)`` in ``distributed`` placement, where the sum of ``m`` reports carries
  ``N(0, (z C)^2 I)`` (variances of independent noises add: ``m (z C)^2 / m``);
* how many reports a round needs before its aggregate may be released (``m`` if distributed: fewer
  reports carry less than the accounted noise; 1 otherwise);
* the run id devices account under when the coordinator names none (``flwr-<Flower run id>``), and
  the message lifetime a round needs (longer than the round timeout);
* the coordinator's model step ``w <- w + server_lr * mean(reports)``, in float64, cast back to the
  model's dtype.

The filter's own rules (allowance, charge, admits, spend) live in ``fedfilter.privacy.filters``.

Examples
--------
Four reports of ``z C / 2`` each sum to the accounted ``z C``:

>>> added = added_noise_std(2.0, 0.5, "distributed", 4)
>>> added, math.sqrt(4 * added**2) == accounted_noise_std(2.0, 0.5)
(0.5, True)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

__all__ = [
    "accounted_noise_std",
    "added_noise_std",
    "check_message_ttl",
    "DEFAULT_MAX_MIN_REPORTS",
    "default_min_reports",
    "model_step",
    "reconstruction_threshold",
    "released_mean_noise_std",
    "reports_needed",
    "run_id_for",
]


def accounted_noise_std(noise_multiplier: float, clip: float) -> float:
    """The std of the noise every observer's view carries (the sum's, in distributed placement).

    Parameters
    ----------
    noise_multiplier : float
        ``z``.
    clip : float
        The clip norm ``C``.

    Returns
    -------
    float
        ``z * C``: the std the filters charge at.

    Examples
    --------
    >>> accounted_noise_std(2.0, 0.5)
    1.0
    """
    return noise_multiplier * clip


def added_noise_std(noise_multiplier: float, clip: float, placement: str, min_reports: int) -> float:
    """The std one client adds: ``z C``, or ``z C / sqrt(m)`` in distributed placement.

    Parameters
    ----------
    noise_multiplier : float
        ``z``.
    clip : float
        The clip norm ``C``.
    placement : {"local", "distributed"}
        Where the noise is added.
    min_reports : int
        ``m``, the fewest reports in a released sum (used in distributed placement only).

    Returns
    -------
    float
        The std of the noise one report carries.

    Examples
    --------
    >>> added_noise_std(2.0, 0.5, "local", 4), added_noise_std(2.0, 0.5, "distributed", 4)
    (1.0, 0.5)
    """
    std = accounted_noise_std(noise_multiplier, clip)
    return std / math.sqrt(min_reports) if placement == "distributed" else std


def reports_needed(placement: str, min_reports: int) -> int:
    """Reports a round needs before its aggregate may be released.

    Parameters
    ----------
    placement : {"local", "distributed"}
        Where the noise is added.
    min_reports : int
        The run's ``min-reports``.

    Returns
    -------
    int
        ``min_reports`` in distributed placement (fewer reports carry less than the accounted
        noise), else 1.

    Examples
    --------
    >>> reports_needed("distributed", 5), reports_needed("local", 5)
    (5, 1)
    """
    return min_reports if placement == "distributed" else 1


def model_step(weights: Sequence[np.ndarray], mean: Sequence[np.ndarray], server_lr: float) -> list[np.ndarray]:
    """``w + server_lr * mean`` per array, in float64, cast back to each weight's dtype.

    Parameters
    ----------
    weights : sequence of numpy.ndarray
        The model's arrays.
    mean : sequence of numpy.ndarray
        The released mean update, one array per weight.
    server_lr : float
        The coordinator's learning rate.

    Returns
    -------
    list of numpy.ndarray
        The new weights, each in its old dtype.

    Examples
    --------
    >>> model_step([np.array([1.0, 2.0], dtype=np.float32)], [np.array([0.5, -0.5])], 2.0)
    [array([2., 1.], dtype=float32)]
    """
    return [
        (np.asarray(w).astype(np.float64) + server_lr * np.asarray(m).astype(np.float64)).astype(np.asarray(w).dtype)
        for w, m in zip(weights, mean)
    ]


def released_mean_noise_std(
    noise_multiplier: float, clip: float, placement: str, min_reports: int, reports: int
) -> float:
    """The noise std per coordinate of the released mean of ``reports`` reports: each carries
    ``added_noise_std`` independently, so the mean carries ``added_noise_std / sqrt(reports)``
    (``z C / sqrt(n)`` local; ``z C / sqrt(n m)`` distributed, ``z C / n`` when ``n = m``).

    Parameters
    ----------
    noise_multiplier : float
        ``z``.
    clip : float
        The clip norm ``C``.
    placement : {"local", "distributed"}
        Where the noise is added.
    min_reports : int
        ``m``.
    reports : int
        ``n``, the number of reports averaged, >= 1.

    Returns
    -------
    float
        The std per coordinate of the mean.

    Raises
    ------
    ValueError
        If ``reports`` is not an integer >= 1.

    Examples
    --------
    >>> released_mean_noise_std(2.0, 0.5, "local", 1, 4), released_mean_noise_std(2.0, 0.5, "distributed", 4, 4)
    (0.5, 0.25)
    """
    if isinstance(reports, bool) or not isinstance(reports, int) or reports < 1:
        raise ValueError(f"reports must be an integer >= 1. Found {reports!r}.")
    return added_noise_std(noise_multiplier, clip, placement, min_reports) / math.sqrt(reports)


#: The largest ``min-reports`` a device accepts unless its owner says otherwise (``max-min-reports``).
#: ``default_min_reports`` never asks for more.
DEFAULT_MAX_MIN_REPORTS = 100


def default_min_reports(clients: int, placement: str) -> int:
    """The ``min-reports`` a run asks for when its operator does not choose: in distributed placement
    ``ceil(clients / 2)``, at most ``DEFAULT_MAX_MIN_REPORTS`` (what a default device accepts; the
    SecAgg+ threshold, and so each device's work, grows with it: docs/results.md, "What the
    device-checked SecAgg+ rule costs"); 1 in local placement (each report carries all its noise).

    Parameters
    ----------
    clients : int
        The number of clients sampled per round.
    placement : {"local", "distributed"}
        Where the noise is added.

    Returns
    -------
    int
        The default ``min-reports``.

    Examples
    --------
    >>> default_min_reports(9, "distributed"), default_min_reports(1000, "distributed"), default_min_reports(9, "local")
    (5, 100, 1)
    """
    return min(-(-int(clients) // 2), DEFAULT_MAX_MIN_REPORTS) if placement == "distributed" else 1


def reconstruction_threshold(min_reports: int) -> int:
    """The smallest SecAgg+ threshold a release of ``min_reports`` reports can use, ``max(m, 2)`` (Flower
    reads an int 1 as 'all'); the graph rule adds the colluders the devices allow
    (``protocol/secagg/rule.py``).

    Parameters
    ----------
    min_reports : int
        The run's ``min-reports``.

    Returns
    -------
    int
        ``max(min_reports, 2)``.

    Examples
    --------
    >>> reconstruction_threshold(1), reconstruction_threshold(5)
    (2, 5)
    """
    return max(int(min_reports), 2)


def run_id_for(flower_run_id: int | str) -> str:
    """The run id devices account under when the coordinator names none: ``flwr-<Flower run id>``.

    Parameters
    ----------
    flower_run_id : int or str
        Flower's run id.

    Returns
    -------
    str
        ``"flwr-<flower_run_id>"``.

    Examples
    --------
    >>> run_id_for(42)
    'flwr-42'
    """
    return f"flwr-{flower_run_id}"


def check_message_ttl(ttl: float, timeout: float) -> None:
    """Raise ``ValueError`` unless a train message's TTL exceeds the round timeout: Flower discards a
    reply that arrives after its message's TTL, and a device that replies late has already spent.

    Parameters
    ----------
    ttl : float
        The message's time to live, in seconds.
    timeout : float
        The round timeout, in seconds.

    Raises
    ------
    ValueError
        If ``ttl <= timeout``.

    Examples
    --------
    >>> check_message_ttl(600.0, 300.0)
    >>> check_message_ttl(300.0, 300.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: message TTL 300.0 s must exceed the round timeout 300.0 s: ...
    """
    if ttl <= timeout:
        raise ValueError(
            f"message TTL {ttl} s must exceed the round timeout {timeout} s: a shorter TTL discards "
            "replies whose clients have already spent budget."
        )
