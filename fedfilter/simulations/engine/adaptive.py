"""The public numbers of an engine round, and the clip that adapts to the updates' norms round by round.

With ``EngineConfig.adaptive_clipping`` set, the engine runs the clipping the devices and the
coordinator run (Andrew, Thakkar, McMahan and Ramaswamy, NeurIPS 2021, Algorithm 1), with every rule
from ``fedfilter.protocol.adaptive_clip``: ``noise_multiplier`` is the accounted ``z_eff`` (Flower's
convention), the update's ``z`` is ``update_noise_multiplier(z_eff, sigma_b)``, and each asked client

1. takes its update's norm before clipping, clips the update to the round's ``C``,
2. appends one coordinate ``bit_coordinate(norm, C, c)``, ``c = bit_scale(z, C, sigma_b)``;

that augmented row is the release: the spend template clips it to the client's allowance, charges it
at its actual norm with the clip ``augmented_clip(C, z, sigma_b)`` and the multiplier
``accounted_noise_multiplier(z, sigma_b)`` (``RoundNumbers``), and noises it as one Gaussian (local,
central) or Skellam (distributed) release. A client whose budget is spent releases a zero row: its
bit reads one half. The coordinator reads ``unclipped_fraction`` off the released mean's last
coordinate and sets the next round's clip with ``next_clip``; only the model part steps the model.

In ``central`` placement (the trusted curator) the one draw ``N(0, (z C)^2)`` on the sum's bit
coordinate is, in bits, ``N(0, sigma_b^2)`` on the count of unclipped updates: the noise Flower's
``DifferentialPrivacyServerSideAdaptiveClipping`` adds to that count (``_noisy_fraction``).

Examples
--------
>>> from fedfilter.protocol.adaptive_clip import AdaptiveClipping
>>> clip = AdaptiveClip(AdaptiveClipping(clipped_count_stddev=10.0), noise_multiplier=1.0, clip=2.0, asked=40)
>>> numbers = clip.numbers()
>>> round(numbers.noise_multiplier, 12), round(numbers.clip, 6), round(numbers.bit_scale, 6)
(1.0, 2.002505, 0.20025)
>>> round(clip.observe(numbers.bit_scale * 0.4), 6), round(clip.clip, 6)  # 90 % unclipped: shrink
(0.9, 1.846233)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedfilter.protocol.adaptive_clip import (
    AdaptiveClipping,
    accounted_noise_multiplier,
    augmented_clip,
    bit_coordinate,
    bit_scale,
    bits_float32,
    next_clip,
    unclipped_fraction,
    update_noise_multiplier,
)
from fedfilter.protocol.rules import accounted_noise_std, added_noise_std

__all__ = ["AdaptiveClip", "RoundNumbers"]


@dataclass(frozen=True)
class RoundNumbers:
    """What one round's release is, as a device's mechanism is built from a request.

    Parameters
    ----------
    noise_multiplier : float
        The release's accounted multiplier: the request's ``z`` with a fixed clip, ``z_eff`` with an
        adaptive one.
    clip : float
        The release's norm bound: ``C``, or ``C_aug`` (``augmented_clip``) when the release carries the bit.
    request_clip : float
        The round's ``C`` (the updates are clipped to it).
    bit_scale : float or None
        ``c`` when the release carries the bit, else None.

    Examples
    --------
    >>> n = RoundNumbers(2.0, 0.5, 0.5)
    >>> n.accounted_std, n.added_std("local", 1), n.adaptive
    (1.0, 1.0, False)
    """

    noise_multiplier: float
    clip: float
    request_clip: float
    bit_scale: float | None = None

    @property
    def adaptive(self) -> bool:
        """Whether the release carries the bit.

        Examples
        --------
        >>> RoundNumbers(1.0, 1.5, 1.0, 2.0).adaptive
        True
        """
        return self.bit_scale is not None

    @property
    def accounted_std(self) -> float:
        """The noise std the filters charge against: ``noise_multiplier * clip``.

        Examples
        --------
        >>> RoundNumbers(2.0, 0.5, 0.5).accounted_std
        1.0
        """
        return accounted_noise_std(float(self.noise_multiplier), float(self.clip))

    def added_std(self, placement: str, min_reports: int) -> float:
        """The Gaussian std a report carries (local), or the coordinator's one draw (central).

        Parameters
        ----------
        placement : str
            ``local`` or ``central``.
        min_reports : int
            The request's ``m``.

        Examples
        --------
        >>> RoundNumbers(2.0, 0.5, 0.5).added_std("central", 1)
        1.0
        """
        if placement == "central":
            return self.accounted_std
        return added_noise_std(float(self.noise_multiplier), float(self.clip), placement, min_reports)


class AdaptiveClip:
    """The clip of the next round, and how each client's update becomes its augmented row.

    Parameters
    ----------
    spec : AdaptiveClipping
        ``gamma``, ``eta_C`` and ``sigma_b`` (None: ``asked / 20``).
    noise_multiplier : float
        ``z_eff``, the accounted multiplier (the engine's ``noise_multiplier``).
    clip : float
        The first round's ``C``.
    asked : int
        Clients asked per round.

    Raises
    ------
    ValueError
        When ``z_eff >= 2 sigma_b`` (the bit alone would cost more than a round).

    Examples
    --------
    >>> from fedfilter.protocol.adaptive_clip import AdaptiveClipping
    >>> clip = AdaptiveClip(AdaptiveClipping(), noise_multiplier=1.0, clip=1.0, asked=100)
    >>> clip.clipped_count_stddev, round(clip.update_noise_multiplier, 6)
    (5.0, 1.005038)
    """

    def __init__(self, spec: AdaptiveClipping, *, noise_multiplier: float, clip: float, asked: int):
        self.spec = spec
        self.clipped_count_stddev = spec.stddev_for(asked)
        self.update_noise_multiplier = update_noise_multiplier(float(noise_multiplier), self.clipped_count_stddev)
        self.clip = float(clip)

    def numbers(self) -> RoundNumbers:
        """This round's release: multiplier ``z_eff``, bound ``C_aug``, clip ``C`` and bit scale ``c``.

        Returns
        -------
        RoundNumbers

        Examples
        --------
        >>> from fedfilter.protocol.adaptive_clip import AdaptiveClipping
        >>> clip = AdaptiveClip(AdaptiveClipping(clipped_count_stddev=1.0), noise_multiplier=1.0, clip=1.0, asked=4)
        >>> n = clip.numbers()
        >>> round(n.noise_multiplier, 12), round(n.accounted_std, 6), round(n.bit_scale, 6)
        (1.0, 1.154701, 1.154701)
        """
        z, sigma_b, c = self.update_noise_multiplier, self.clipped_count_stddev, self.clip
        return RoundNumbers(
            noise_multiplier=accounted_noise_multiplier(z, sigma_b),
            clip=augmented_clip(c, z, sigma_b),
            request_clip=c,
            bit_scale=bit_scale(z, c, sigma_b),
        )

    def augment(self, updates: np.ndarray, clip_rows: Callable[..., np.ndarray]) -> np.ndarray:
        """Each row clipped to ``C`` with ``clip_rows`` and its bit appended: ``(k, dim + 1)`` float32.

        Parameters
        ----------
        updates : numpy.ndarray
            ``(k, dim)`` float32 updates before clipping; clipped in place.
        clip_rows : callable
            ``clip_rows(updates, bounds, before=norms)``: clips each row to its bound and writes each
            row's norm before clipping (NaN for a non-finite row) into ``norms``
            (``Engine._clip_rows``: the device's functions, or the vectorised ones).

        Returns
        -------
        numpy.ndarray
            The augmented rows; the bit is ``bit_coordinate`` rounded toward zero in float32 (so no row
            exceeds ``C_aug`` by rounding).

        Examples
        --------
        >>> from fedfilter.protocol.adaptive_clip import AdaptiveClipping
        >>> from fedfilter.simulations.engine.norms import certified_row_norms, clip_rows
        >>> def rows(updates, bounds, before):
        ...     before[:] = certified_row_norms(updates)
        ...     return clip_rows(updates, bounds)
        >>> clip = AdaptiveClip(AdaptiveClipping(clipped_count_stddev=1.0), noise_multiplier=1.0, clip=1.0, asked=4)
        >>> out = clip.augment(np.array([[0.3, 0.4], [3.0, 4.0]], np.float32), rows)
        >>> out[:, 2] / clip.numbers().bit_scale, bool(np.linalg.norm(out[1, :2]) <= 1.0)
        (array([ 0.5, -0.5], dtype=float32), True)
        """
        numbers = self.numbers()
        scale = float(numbers.bit_scale or 0.0)
        before = np.empty(len(updates))
        clip_rows(updates, np.full(len(updates), numbers.request_clip), before=before)
        bits = np.array([bit_coordinate(float(n), numbers.request_clip, scale) for n in before])
        return np.concatenate([updates, bits_float32(bits)[:, None]], axis=1)

    def observe(self, mean_bit: float) -> float:
        """Read the released mean's bit coordinate, step the clip (``next_clip``); returns ``b_bar``.

        Parameters
        ----------
        mean_bit : float
            The released mean's last coordinate.

        Returns
        -------
        float
            ``unclipped_fraction``: the estimated fraction of unclipped updates.

        Examples
        --------
        >>> from fedfilter.protocol.adaptive_clip import AdaptiveClipping
        >>> clip = AdaptiveClip(AdaptiveClipping(clipped_count_stddev=1.0), noise_multiplier=1.0, clip=1.0, asked=4)
        >>> clip.observe(0.0), clip.clip  # one half unclipped, on target: unchanged
        (0.5, 1.0)
        """
        scale = self.numbers().bit_scale
        fraction = unclipped_fraction(float(mean_bit), float(scale or 0.0))
        self.clip = next_clip(self.clip, fraction, self.spec)
        return fraction
