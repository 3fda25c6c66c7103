"""The integer grid of distributed noise over Flower's SecAgg+, written once for both sides.

A device in ``distributed`` placement releases, per coordinate, the integer ``y = k + S`` where ``k``
is its clipped update snapped toward zero onto the grid of step ``grid_step(clip)`` and ``S`` its
Skellam share (``fedfilter.privacy.skellam``). SecAgg+ must add these integers exactly, and
the released sum must be a function of ``sum_i y_i`` alone (then the sum's noise is Skellam with the
sum of the shares' variances, and every device's loss is that of ``k + Sk(mu_total)``):

* Flower's quantization ``x -> (clip(x, -c, c) + c) * q / (2 c)`` is the exact shift ``x -> x + q/2``
  on integers in ``[-q/2, q/2)`` with ``max_weight == 1``, ``num_examples == 1`` and ``c == q / 2``;
* a device sends ``x = (y mod q) - q/2`` (``encode_report``): a modular wrap, not a clip, which keeps
  the sum modulo ``q`` (Kairouz, Liu, Steinke, ICML 2021, section 4: modular clipping is
  post-processing of the sum);
* the server's float result is inverted exactly (``decode_sum``), and is ``sum_i y_i`` whenever
  ``|sum_i y_i| < q/2``.

The argument is in docs/derivations/secagg-grid.md.

The device's side of this contract, ``check_secagg_state``, lives with the device
(``fedfilter.client.secagg.neighbourhood``): the coordinator chooses every SecAgg+ parameter in the
setup stage, so the device refuses, before it trains, any that would make Flower's map inexact, its
masking or unmasking fail, or a graph that breaks ``protocol/secagg/rule.py``. The names here are
what both sides compute: the grid (``SECAGG_GRID_BITS``, ``grid_step``), Flower's settings for it
(``quantization_range``, ``secaggplus_settings``), the report's encoding and the sum's decoding, and
the drop-out rate a coordinator's neighbourhood graph is sized for.

Constants: ``SECAGG_GRID_BITS`` (``clip / grid_step`` lies in ``[2**12, 2**13)``), ``MODULUS_RANGE``
(Flower's default and largest SecAgg+ modulus, ``2**32``), ``MAX_WEIGHT`` (1.0: Flower's weight
factor is then exactly 1), ``MAX_QUANTIZATION_RANGE`` (``2**30``: Flower casts quantized values to
int32) and ``DEFAULT_DROPOUT_RATE`` (the share of sampled devices the default graph expects to drop).

Examples
--------
Two devices' integer reports, through Flower's exact map ``x -> x + q/2``, a sum modulo ``M`` and
Flower's float rescaling, decode to the exact integer sum:

>>> q, n = quantization_range(2), 2
>>> y = [np.array([3, -2]), np.array([5, 1])]
>>> recon = sum(encode_report([yi], q)[0] + q // 2 for yi in y) % MODULUS_RANGE
>>> decode_sum([(recon - n * q / 2) * (q / (n * q))], n, q)
[array([ 8, -1])]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.privacy.rounding import down
from fedfilter.privacy.skellam import skellam_share
from fedfilter.protocol.rules import accounted_noise_std

__all__ = [
    "SECAGG_GRID_BITS",
    "MODULUS_RANGE",
    "MAX_WEIGHT",
    "grid_step",
    "quantization_range",
    "secaggplus_settings",
    "DEFAULT_DROPOUT_RATE",
    "MAX_QUANTIZATION_RANGE",
    "power_of_two",
    "encode_report",
    "decode_sum",
]

SECAGG_GRID_BITS = 12  # clip / grid_step lies in [2**12, 2**13): snapping moves a coordinate < 2**-12 C
MODULUS_RANGE = 2**32  # Flower's default and largest SecAgg+ modulus
MAX_WEIGHT = 1.0  # with num_examples = 1, Flower's weight factor is exactly 1.0
MAX_QUANTIZATION_RANGE = 2**30  # Flower casts quantized values to int32
# The released sum's noise must stay well inside SecAgg+'s range [-q/2, q/2): beyond it the sum wraps
# and the round is useless (equally private, but the device would pay for nothing).
WRAP_SIGMAS = 8.0


def power_of_two(v: Any) -> bool:
    """Whether ``v`` is an int (not a bool) that is a positive power of two.

    Parameters
    ----------
    v : Any
        The value to test.

    Returns
    -------
    bool
        True for 1, 2, 4, ...

    Examples
    --------
    >>> power_of_two(2**20), power_of_two(12), power_of_two(4.0), power_of_two(True)
    (True, False, False, False)
    """
    return isinstance(v, int) and not isinstance(v, bool) and v > 0 and v & (v - 1) == 0


def grid_step(clip: float) -> float:
    """The grid step, a power of two with ``clip / step`` in ``[2**SECAGG_GRID_BITS, 2**(SECAGG_GRID_BITS+1))``.

    Parameters
    ----------
    clip : float
        The clip norm ``C``, finite and > 0.

    Returns
    -------
    float
        The step ``gamma``; ``C / gamma`` is exact.

    Raises
    ------
    ValueError
        For a bad ``clip``.

    Examples
    --------
    >>> grid_step(1.0) == 2.0**-12, 0.3 / grid_step(0.3)
    (True, 4915.2)
    """
    if (problem := positive_finite("clip", clip)) is not None:
        raise ValueError(problem)
    _, exp = math.frexp(float(clip))  # clip = frac * 2**exp, frac in [0.5, 1)
    return math.ldexp(1.0, exp - 1 - SECAGG_GRID_BITS)


def skellam_variances(noise_multiplier: float, clip: float, min_reports: int) -> tuple[float, float]:
    """The Skellam variances of a distributed round, in grid steps squared: the sum's ``mu_total``
    (``(z C / gamma)^2``, rounded down) and each report's share ``mu_share`` (``privacy.skellam.skellam_share``
    for ``min_reports``); ``inf`` where they overflow. The numbers every device computes
    (``client.mechanisms.skellam.skellam_grid``) and the planner checks against SecAgg+'s range.

    Parameters
    ----------
    noise_multiplier : float
        ``z``.
    clip : float
        ``C``, finite and > 0.
    min_reports : int
        ``m``.

    Returns
    -------
    tuple of (float, float)

    Examples
    --------
    >>> skellam_variances(1.0, 1.0, 4)
    (16777215.999999998, 4194304.0)
    """
    gamma = grid_step(clip)
    ratio = accounted_noise_std(noise_multiplier, clip) / gamma if gamma > 0 else math.inf
    mu_total = float(down(ratio * ratio)) if math.isfinite(ratio) else math.inf
    mu_share = skellam_share(mu_total, min_reports) if math.isfinite(mu_total) else math.inf
    return mu_total, mu_share


def sum_noise_fits(mu_share: float, sample_num: int, target_range: int) -> bool:
    """Whether the noise of ``sample_num`` reports' sum, ``Sk(sample_num mu_share)``, stays ``WRAP_SIGMAS``
    standard deviations inside SecAgg+'s range ``[-q/2, q/2)``: the device refuses a round where it does not.

    Parameters
    ----------
    mu_share : float
        Each report's Skellam variance, grid steps squared.
    sample_num : int
        The reports SecAgg+ sums (the devices asked).
    target_range : int
        ``q``.

    Returns
    -------
    bool

    Examples
    --------
    >>> sum_noise_fits(1.0, 100, 161), sum_noise_fits(1.0, 100, 160)
    (True, False)
    """
    return WRAP_SIGMAS * math.sqrt(sample_num * mu_share) < target_range / 2


def largest_noise_multiplier(n_asked: int, min_reports: int, clip: float) -> float:
    """The largest ``z`` (to 1e-9 relative, from below) at which the Skellam sum of ``n_asked`` reports fits
    SecAgg+'s quantization range for that many reports (``sum_noise_fits`` at ``quantization_range(n_asked)``):
    above it every device refuses the round. A plan for that many devices a round must stay below it;
    the bound scales as about ``2**32 / (16 n_asked (C / gamma) sqrt(n_asked / m))``, so it falls
    fast with the devices asked (about 60 at 600, 1 at 60,000).

    Parameters
    ----------
    n_asked : int
        The devices asked a round.
    min_reports : int
        ``m``.
    clip : float
        ``C``.

    Returns
    -------
    float
        0.0 when no ``z`` fits.

    Examples
    --------
    >>> round(largest_noise_multiplier(600, 522, 1.0), 1), round(largest_noise_multiplier(60_000, 53_828, 1.0), 3)
    (59.7, 0.947)
    """
    target = quantization_range(n_asked)

    def fits(z: float) -> bool:
        return sum_noise_fits(skellam_variances(z, clip, min_reports)[1], n_asked, target)

    lo, hi = 0.0, 1e7
    if fits(hi):
        return hi
    for _ in range(200):  # bisection: mu_share grows with z
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        if hi - lo <= 1e-9 * hi:
            break
    return lo


def quantization_range(n_sampled: int, modulus_range: int = MODULUS_RANGE) -> int:
    """The largest power of two ``q <= 2**30`` with ``n_sampled * q < modulus_range``.

    Parameters
    ----------
    n_sampled : int
        The number of devices sampled for the round, >= 1.
    modulus_range : int, optional
        SecAgg+'s modulus ``M`` (default ``MODULUS_RANGE``).

    Returns
    -------
    int
        ``q``.

    Raises
    ------
    ValueError
        For a bad ``n_sampled``, or when no ``q >= 2`` fits.

    Examples
    --------
    >>> quantization_range(4) == 2**29, quantization_range(100) == 2**25
    (True, True)
    """
    if isinstance(n_sampled, bool) or not isinstance(n_sampled, int) or n_sampled < 1:
        raise ValueError(f"n_sampled must be an integer >= 1. Found {n_sampled!r}.")
    q = MAX_QUANTIZATION_RANGE
    while q > 1 and n_sampled * q >= modulus_range:
        q //= 2
    if n_sampled * q >= modulus_range or q < 2:
        raise ValueError(f"no quantization range fits {n_sampled} reports in modulus {modulus_range}.")
    return q


def secaggplus_settings(n_sampled: int) -> dict[str, Any]:
    """The ``SecAggPlusWorkflow`` keyword arguments that make Flower's quantization exact here.

    Parameters
    ----------
    n_sampled : int
        The number of devices sampled for the round.

    Returns
    -------
    dict
        ``max_weight``, ``clipping_range`` (``q / 2``), ``quantization_range`` (``q``) and
        ``modulus_range``.

    Examples
    --------
    >>> settings = secaggplus_settings(4)
    >>> settings["clipping_range"] == settings["quantization_range"] / 2, settings["max_weight"]
    (True, 1.0)
    """
    q = quantization_range(n_sampled)
    return {
        "max_weight": MAX_WEIGHT,
        "clipping_range": float(q // 2),
        "quantization_range": q,
        "modulus_range": MODULUS_RANGE,
    }


def encode_report(y: Sequence[np.ndarray], q: int) -> list[np.ndarray]:
    """``(y mod q) - q/2`` per array, as float64 (exact: every value is an integer below 2**30).

    Parameters
    ----------
    y : sequence of numpy.ndarray
        The device's integer release ``k + S``, one array per model array.
    q : int
        The quantization range (a power of two).

    Returns
    -------
    list of numpy.ndarray
        Values in ``[-q/2, q/2)``, which Flower's map sends to ``[0, q)`` exactly.

    Examples
    --------
    >>> encode_report([np.array([3, -2, 8])], 8)
    [array([-1.,  2., -4.])]
    """
    half = q // 2
    return [(np.mod(np.asarray(a, dtype=np.int64), q) - half).astype(np.float64) for a in y]


def decode_sum(aggregated: Sequence[np.ndarray], n_reports: int, q: int) -> list[np.ndarray]:
    """The integer ``sum_i y_i`` per coordinate, centred in ``[-q/2, q/2)``, from the float arrays
    Flower's ``SecAggPlusWorkflow`` hands its strategy after unmasking ``n_reports`` reports.

    Flower computes ``v = (recon - n q/2) * (q / (n q))`` in float64 (``recon`` the unmasked sum mod
    ``M``); ``T = recon - n q/2`` is an integer below ``2**33`` and ``v / inv`` is within
    ``|T| 2**-51 < 1/2`` of it, so ``rint`` recovers ``T`` exactly.

    Parameters
    ----------
    aggregated : sequence of numpy.ndarray
        Flower's float arrays.
    n_reports : int
        The number of reports unmasked.
    q : int
        The quantization range.

    Returns
    -------
    list of numpy.ndarray
        The int64 sum per coordinate, centred in ``[-q/2, q/2)``.

    Examples
    --------
    One report ``y = (3, -2)`` with ``q = 8`` is encoded as ``x = (-1, 2)``; Flower's sum is
    ``recon = x + q/2 = (3, 6)``, handed over as ``(recon - 4) * (8 / 8) = (-1, 2)``:

    >>> decode_sum([np.array([-1.0, 2.0])], 1, 8)
    [array([ 3, -2])]
    """
    inv = q / (n_reports * q)
    half = q // 2
    out = []
    for v in aggregated:
        t = np.rint(np.asarray(v, dtype=np.float64) / inv).astype(np.int64)
        recon = t + n_reports * half
        out.append(np.mod(recon + half, q) - half)
    return out


# The drop-out rate the coordinator's default graph is sized for (utility only: a round with more
# drop-outs may abort; privacy does not depend on it): at most 10% of the sampled devices drop out
# before their masked input arrives.
DEFAULT_DROPOUT_RATE = 0.1
