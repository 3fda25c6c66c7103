"""Distributed placement in the engine: Skellam noise on the SecAgg+ integer grid, as devices run it.

A device in ``distributed`` placement (``fedfilter.client.mechanisms.skellam.SkellamMechanism``) does,
per round, inside its ledger transaction:

1. ``a_G = tx.allowance(noise_std=sigma, clip=C)`` (the Gaussian allowance, min over every quota) and
   ``a_W = tx.worst_allowance(noise_std=sqrt(mu_share) gamma, clip=C)`` (the worst-case account's,
   ``fedfilter.client.ledger.worst_case``); ``L2_allow = skellam.l2_allowance(...)``: the largest
   integer-grid L2 norm whose worst-case Skellam charges fit both;
2. exhausted (``spend.nothing_left``, either account) when ``L2_allow * gamma <= exhausted_below * C`` or
   below ``SkellamMechanism.floor``, sqrt(dim) grid steps;
3. clip to ``L2_allow * gamma`` (a few ulps short), snap toward zero on ``gamma = grid_step(C)`` (integer ``k``), exact
   integer norms, ``charge = skellam_charge(filt, l1, l2_up(l2sq), mu_total)`` and the worst-case
   ``skellam_charge(worst, l1, l2_up(l2sq), mu_share)``, admits, spend both;
4. after the commit: ``y = k + Sk(mu_share)``, wrapped mod ``q`` for SecAgg+.

The engine runs those very steps (``fedfilter.simulations.engine.mechanisms.EngineSkellam`` in the
device's spend template), so its filter states are bitwise a device's. ``SkellamRound`` holds the public numbers of a
round, from the device's own ``skellam_grid`` (so the engine refuses what a device would).

The coordinator unmasks only ``sum_i y_i mod q`` (``fedfilter.protocol.secagg.grid.decode_sum``), and
only when at least ``min_reports`` reports are in; its mean is ``sum * gamma / n``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.client.mechanisms.skellam_noise import MAX_MU_SHARE, add_skellam_noise, skellam_noise
from fedfilter.privacy.filters import GaussianFilter, rdp_order
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.rules import accounted_noise_std
from fedfilter.protocol.secagg.grid import quantization_range

__all__ = ["SkellamRound", "wrap_centred", "aggregate_skellam"]


@dataclass(frozen=True)
class SkellamRound:
    """The public numbers of one distributed round, from the request (z, C, m), SecAgg+'s setup for
    the clients asked, and the filter's order: the device's ``skellam_grid``, plus alpha*.

    Attributes
    ----------
    sigma : float
        The accounted std of the released sum, ``z * C`` (model units).
    gamma : float
        The SecAgg+ grid step, ``grid_step(C)``.
    mu_total, mu_share : float
        The sum's Skellam variance per coordinate (rounded down) and each report's share (rounded
        up), grid units.
    q : int
        SecAgg+'s quantization range for the clients asked.
    alpha : float
        The rdp filter's order alpha*.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> r = SkellamRound.from_request(1.0, 1.0, 2, 4, make_filter("rdp", 2.0, 1e-5))
    >>> r.gamma, r.mu_share, r.q, r.alpha
    (0.000244140625, 8388608.0, 536870912, 10.2)
    """

    sigma: float  # the accounted std of the released SUM (model units): z * C
    gamma: float  # the SecAgg+ grid step, grid_step(C)
    mu_total: float  # the sum's Skellam variance per coordinate, in grid units, rounded down
    mu_share: float  # each report's share, mu_total / m rounded up (m reports carry >= mu_total)
    q: int  # SecAgg+'s quantization range for the clients asked
    alpha: float  # the rdp filter's order alpha*, where Skellam releases are charged

    @classmethod
    def from_request(
        cls, noise_multiplier: float, clip: float, min_reports: int, n_sampled: int, filt: GaussianFilter
    ) -> SkellamRound:
        """Raises ``RoundSpecError`` (a ValueError) naming the values where a device would refuse the
        round: no usable variance, a share beyond the sampler, or a sum that would wrap SecAgg+'s range.

        Parameters
        ----------
        noise_multiplier, clip : float
            The request's z and C.
        min_reports : int
            The request's m.
        n_sampled : int
            Clients asked per round (sets SecAgg+'s range).
        filt : GaussianFilter
            The rdp filter whose order alpha* the charges use.

        Returns
        -------
        SkellamRound

        Examples
        --------
        >>> from fedfilter.privacy.filters import make_filter
        >>> SkellamRound.from_request(1.0, 1.0, 2, 4, make_filter("rdp", 2.0, 1e-5)).sigma
        1.0
        """
        spec = RoundSpec("engine", 0, float(noise_multiplier), float(clip), "distributed", int(min_reports))
        q = quantization_range(int(n_sampled))
        grid = skellam_grid(spec, target_range=q, sample_num=int(n_sampled))
        sigma = accounted_noise_std(float(noise_multiplier), float(clip))
        return cls(sigma, grid.gamma, grid.mu_total, grid.mu_share, q, rdp_order(filt))


def wrap_centred(total: np.ndarray, q: int) -> np.ndarray:
    """``total mod q`` centred in ``[-q/2, q/2)``: what ``decode_sum`` returns for integer reports
    whose sum is ``total`` (SecAgg+ sums ``(y_i mod q) - q/2`` modulo a multiple of ``q``).

    Parameters
    ----------
    total : numpy.ndarray
        The integer sum.
    q : int
        The quantization range.

    Returns
    -------
    numpy.ndarray
        int64, in ``[-q/2, q/2)``.

    Examples
    --------
    >>> import numpy as np
    >>> wrap_centred(np.array([5, -5, 9]), 16)
    array([ 5, -5, -7])
    """
    half = q // 2
    return np.mod(np.asarray(total, dtype=np.int64) + half, q) - half


def aggregate_skellam(n_reports: int, mu_share: float, dim: int, stream) -> np.ndarray:
    """The noise in a sum of ``n_reports`` shares, ``Sk(n * mu_share)`` per coordinate, in as few draws
    as the sampler's cap allows (``MAX_MU_SHARE``: each draw covers at most that much variance).

    Independent Skellams add (Sk(a) + Sk(b) = Sk(a + b), Agarwal, Kairouz, Liu 2021), so this is the
    exact distribution of the sum of the reports' shares; ``k * mu_share`` rounds in float64 by at most
    half an ulp (a relative 1e-16 of the variance), the one difference from per-report draws.

    Parameters
    ----------
    n_reports : int
        Reports in the sum.
    mu_share : float
        Each report's Skellam variance, grid units.
    dim : int
        Coordinates.
    stream : NoiseStream
        The round's aggregate stream (``seeds.aggregate_noise_stream``).

    Returns
    -------
    numpy.ndarray
        int64 noise, one value per coordinate.

    Examples
    --------
    >>> from fedfilter.simulations.engine.seeds import aggregate_noise_stream
    >>> aggregate_skellam(3, 10.0, 4, aggregate_noise_stream(0, "run", 1))
    array([-3,  2,  4,  3])
    """
    n, mu = int(n_reports), float(mu_share)
    per_draw = max(1, int(MAX_MU_SHARE // mu))  # >= 1: a device refuses shares above the cap
    total = np.zeros(int(dim), dtype=np.int64)
    while n > 0:
        k = min(n, per_draw)
        total += skellam_noise(float(k) * mu, int(dim), stream)
        n -= k
    return total


def per_client_noisy(k: list[np.ndarray], mu_share: float, stream) -> list[np.ndarray]:
    """``y = k + Sk(mu_share)``: the device's integer report before its SecAgg+ encoding.

    Parameters
    ----------
    k : list of numpy.ndarray
        The client's snapped integer update.
    mu_share : float
        Its share of the Skellam variance, grid units.
    stream : NoiseStream
        The client's stream (``seeds.client_noise_stream``).

    Returns
    -------
    list of numpy.ndarray

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.simulations.engine.seeds import client_noise_stream
    >>> per_client_noisy([np.zeros(3, np.int64)], 10.0, client_noise_stream(0, 1, "run", 1))
    [array([-5, -4,  0])]
    """
    return add_skellam_noise(k, mu_share, stream)
