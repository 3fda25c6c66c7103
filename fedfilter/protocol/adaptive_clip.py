"""Adaptive clipping the devices pay for: the clip follows a quantile of the update norms.

Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning with Adaptive Clipping",
NeurIPS 2021 (Algorithm 1 and Section 3): each device reports one bit, ``b = 1`` when its update's
norm is at most the round's clip ``C``; the coordinator estimates the fraction ``b_bar`` of updates
under the clip from the noisy sum of those bits and steps the clip geometrically toward the target
quantile ``gamma``:

    C <- C * exp(-eta_C * (b_bar - gamma))                                  (Algorithm 1)

Here the bit is not a second release: it rides in the report as one more coordinate, centred and
scaled, ``c * (b - 1/2)`` with ``c = z C / sigma_b``, so it gets the round's own noise ``z C`` and, in
bit units, the std ``sigma_b`` (``clipped_count_stddev``) on the sum. The report is then one Gaussian
(or Skellam) release of the vector ``(update, c (b - 1/2))`` whose norm is at most
``C_aug = sqrt(C^2 + c^2 / 4)``: the device's filter charges it at its actual norm, the bit's part
included (a constant ``1 / (2 sigma_b)`` in Gaussian-DP terms, Andrew et al.'s Section 3.1), and a
device whose budget is spent clips the whole vector to zero (its bit reads as one half). The
accounted noise multiplier of that vector is

    z_eff = (z^-2 + (2 sigma_b)^-2)^(-1/2)                                  (Andrew et al., Section 3.1)

so a coordinator that plans ``z_eff`` asks for ``z = (z_eff^-2 - (2 sigma_b)^-2)^(-1/2)`` on the update,
as Flower's adaptive clipping wrappers do (``compute_adaptive_noise_params``), with the same default
``sigma_b = devices per round / 20``.

In local placement each report carries the noise ``z C``, so the sum of ``n`` bits carries
``sigma_b sqrt(n)``; in distributed placement the sum carries ``z C`` once, and ``sigma_b``. Both sides
call these functions: the coordinator to build the request and read the bit, the device to check
and charge it, the engine for both.

Examples
--------
>>> spec = AdaptiveClipping(target_clipped_quantile=0.5, clip_norm_lr=0.2, clipped_count_stddev=10.0)
>>> z = update_noise_multiplier(1.0, spec.clipped_count_stddev)
>>> round(z, 6), round(accounted_noise_multiplier(z, spec.clipped_count_stddev), 12)
(1.001252, 1.0)
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from fedfilter.checks import finite, short_repr
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.rules import accounted_noise_std

__all__ = [
    "AdaptiveClipping",
    "accounted_noise_multiplier",
    "augmented_clip",
    "bit_coordinate",
    "bit_scale",
    "bits_float32",
    "unclipped_fraction",
    "next_clip",
    "released_vector_spec",
    "update_noise_multiplier",
]

# Flower's default learning rate and target (``DifferentialPrivacyServerSideAdaptiveClipping``), and
# Andrew et al.'s recommended eta_C = 0.2 and gamma = 0.5 (Section 4).
DEFAULT_TARGET_QUANTILE = 0.5
DEFAULT_CLIP_NORM_LR = 0.2


@dataclass(frozen=True)
class AdaptiveClipping:
    """How the clip adapts, in the names of Flower's adaptive clipping wrappers.

    Parameters
    ----------
    target_clipped_quantile : float, optional
        ``gamma`` in [0, 1]: the fraction of updates the clip should leave unclipped (default 0.5).
    clip_norm_lr : float, optional
        ``eta_C`` > 0, the geometric step (default 0.2).
    clipped_count_stddev : float, optional
        ``sigma_b`` > 0, the std of the noise on the sum of the bits, in bits. ``None``: the number of
        devices asked per round / 20 (Flower's and Andrew et al.'s default), set by the strategy.

    Examples
    --------
    >>> AdaptiveClipping().problems(), AdaptiveClipping(target_clipped_quantile=1.5).problems()
    ([], ['target_clipped_quantile must be a number in [0, 1]. Found 1.5.'])
    """

    target_clipped_quantile: float = DEFAULT_TARGET_QUANTILE
    clip_norm_lr: float = DEFAULT_CLIP_NORM_LR
    clipped_count_stddev: float | None = None

    def problems(self) -> list[str]:
        """Every bad field, named with its value (empty when valid).

        Examples
        --------
        >>> AdaptiveClipping(clip_norm_lr=0.0, clipped_count_stddev=-1.0).problems()
        ... # doctest: +NORMALIZE_WHITESPACE
        ['clip_norm_lr must be a positive finite number. Found 0.0.',
         'clipped_count_stddev must be a positive finite number or None. Found -1.0.']
        """
        out = []
        gamma = finite(self.target_clipped_quantile)
        if gamma is None or not 0.0 <= gamma <= 1.0:
            out.append(
                f"target_clipped_quantile must be a number in [0, 1]. Found {short_repr(self.target_clipped_quantile)}."
            )
        lr = finite(self.clip_norm_lr)
        if lr is None or lr <= 0:
            out.append(f"clip_norm_lr must be a positive finite number. Found {short_repr(self.clip_norm_lr)}.")
        if self.clipped_count_stddev is not None:
            s = finite(self.clipped_count_stddev)
            if s is None or s <= 0:
                out.append(
                    "clipped_count_stddev must be a positive finite number or None. "
                    f"Found {short_repr(self.clipped_count_stddev)}."
                )
        return out

    def stddev_for(self, asked: int) -> float:
        """``sigma_b`` for a round that asks ``asked`` devices: the one given, or ``asked / 20``.

        The default of Andrew et al. (Section 3.1) and of Flower's adaptive clipping wrappers; the
        coordinator, the engine and the planner all take it from here.

        Parameters
        ----------
        asked : int
            The devices a round asks.

        Examples
        --------
        >>> AdaptiveClipping().stddev_for(200), AdaptiveClipping(clipped_count_stddev=3.0).stddev_for(200)
        (10.0, 3.0)
        """
        given = self.clipped_count_stddev
        return float(given) if given is not None else asked / 20.0


def update_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
    """The update's ``z`` that, with the bit, makes the report's accounted multiplier ``noise_multiplier``.

    Andrew et al. 2021, Section 3.1: ``z = (z_eff^-2 - (2 sigma_b)^-2)^(-1/2)``; it exists only when
    ``z_eff < 2 sigma_b`` (the bit alone would cost more than the whole budget per round).

    Parameters
    ----------
    noise_multiplier : float
        ``z_eff``, the multiplier the plan pays for (the report's, bit included).
    clipped_count_stddev : float
        ``sigma_b``.

    Examples
    --------
    >>> round(update_noise_multiplier(1.0, 10.0), 6)
    1.001252
    >>> update_noise_multiplier(1.0, 0.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: noise_multiplier must be below 2 * clipped_count_stddev (1.0), or the bit alone ... Found 1.0.
    """
    if not noise_multiplier < 2.0 * clipped_count_stddev:
        raise ValueError(
            f"noise_multiplier must be below 2 * clipped_count_stddev ({2.0 * clipped_count_stddev!r}), or the bit "
            f"alone costs more than a round. Found {noise_multiplier!r}."
        )
    # (z_eff^-2 - (2 s)^-2)^(-1/2) = z_eff / sqrt(1 - r^2), r = z_eff / 2s < 1: no power overflows.
    r = noise_multiplier / (2.0 * clipped_count_stddev)
    return noise_multiplier / math.sqrt((1.0 - r) * (1.0 + r))


def accounted_noise_multiplier(noise_multiplier: float, clipped_count_stddev: float) -> float:
    """The report's accounted multiplier ``z_eff = (z^-2 + (2 sigma_b)^-2)^(-1/2)`` (Andrew et al., Section 3.1).

    Equal to ``z C / C_aug`` (``augmented_clip``): the noise ``z C`` over the report's norm bound.

    Parameters
    ----------
    noise_multiplier : float
        The request's ``z`` (the update's).
    clipped_count_stddev : float
        ``sigma_b``.

    Examples
    --------
    >>> z_eff = accounted_noise_multiplier(2.0, 1.0)
    >>> round(z_eff, 12), round(2.0 * 3.0 / augmented_clip(3.0, 2.0, 1.0), 12)
    (1.414213562373, 1.414213562373)
    """
    # (z^-2 + (2 s)^-2)^(-1/2) = z / hypot(1, z / 2s): a request's extreme values cannot overflow it
    # (z / 2s = inf gives 0, which every owner's minimum refuses).
    return noise_multiplier / math.hypot(1.0, noise_multiplier / (2.0 * clipped_count_stddev))


def bit_scale(noise_multiplier: float, clip: float, clipped_count_stddev: float) -> float:
    """``c = z C / sigma_b``: the bit's coordinate is ``c (b - 1/2)``, so its noise in bits is ``sigma_b``.

    Parameters
    ----------
    noise_multiplier, clip : float
        The request's ``z`` and ``C``.
    clipped_count_stddev : float
        ``sigma_b``.

    Examples
    --------
    >>> bit_scale(2.0, 3.0, 1.5)
    4.0
    """
    return accounted_noise_std(noise_multiplier, clip) / clipped_count_stddev


def augmented_clip(clip: float, noise_multiplier: float, clipped_count_stddev: float) -> float:
    """``C_aug = sqrt(C^2 + c^2 / 4)``: the norm bound of a report that carries the bit.

    Parameters
    ----------
    clip, noise_multiplier : float
        The request's ``C`` and ``z``.
    clipped_count_stddev : float
        ``sigma_b``.

    Examples
    --------
    >>> augmented_clip(3.0, 2.0, 1.5)  # c = 4: sqrt(9 + 4)
    3.605551275463989
    """
    return math.hypot(clip, bit_scale(noise_multiplier, clip, clipped_count_stddev) / 2.0)


def bit_coordinate(norm: float, clip: float, scale: float) -> float:
    """The device's bit, centred and scaled: ``+c/2`` when ``norm <= C`` (unclipped), else ``-c/2``.

    Centred so that its norm, and so its charge, is the same whichever the bit (the coordinate's
    value is the data; its size is public).

    Parameters
    ----------
    norm : float
        The update's L2 norm before clipping.
    clip : float
        The round's ``C``.
    scale : float
        ``c`` (``bit_scale``).

    Examples
    --------
    >>> bit_coordinate(0.5, 1.0, 4.0), bit_coordinate(1.5, 1.0, 4.0), bit_coordinate(float("nan"), 1.0, 4.0)
    (2.0, -2.0, -2.0)
    """
    return scale / 2.0 if norm <= clip else -scale / 2.0  # NaN compares False: "clipped"


def unclipped_fraction(mean_coordinate: float, scale: float) -> float:
    """``b_bar``: the fraction of unclipped updates the released mean of the bit coordinate estimates.

    The mean of ``c (b_i - 1/2)`` plus noise is ``c (b_bar - 1/2)`` plus noise; a device whose budget is
    spent sends a zero vector and counts as one half. Not clamped to [0, 1] (Andrew et al. do not:
    the geometric step is bounded by ``exp(eta_C)`` anyway).

    Parameters
    ----------
    mean_coordinate : float
        The released mean's bit coordinate.
    scale : float
        ``c``.

    Examples
    --------
    >>> unclipped_fraction(1.0, 4.0)
    0.75
    """
    return mean_coordinate / scale + 0.5


def next_clip(clip: float, fraction: float, adaptive: AdaptiveClipping) -> float:
    """The geometric step ``C exp(-eta_C (b_bar - gamma))`` (Andrew et al. 2021, Algorithm 1).

    Parameters
    ----------
    clip : float
        This round's ``C``.
    fraction : float
        ``b_bar`` (``unclipped_fraction``).
    adaptive : AdaptiveClipping
        ``gamma`` and ``eta_C``.

    Examples
    --------
    >>> round(next_clip(1.0, 0.9, AdaptiveClipping(0.5, 0.2)), 6)  # too many unclipped: shrink
    0.923116
    """
    return clip * math.exp(-adaptive.clip_norm_lr * (fraction - adaptive.target_clipped_quantile))


def released_vector_spec(spec: RoundSpec) -> RoundSpec:
    """The request as the release of the report vector sees it: its norm bound and accounted multiplier.

    With adaptive clipping (``clipped_count_stddev > 0``) the report is ``(update clipped to C, c (b -
    1/2))``: norm bound ``C_aug`` (``augmented_clip``), noise ``z C = z_eff C_aug`` on every coordinate,
    so the mechanism, the filter's charge and the owner's minimum noise all use ``(z_eff, C_aug)``. A
    fixed-clip request is returned as it is.

    Parameters
    ----------
    spec : RoundSpec
        The coordinator's request.

    Returns
    -------
    RoundSpec
        ``spec`` with ``noise_multiplier = z_eff`` and ``clip = C_aug`` (the other fields unchanged).

    Examples
    --------
    >>> released = released_vector_spec(RoundSpec("run", 1, 2.0, 3.0, clipped_count_stddev=1.5))
    >>> round(released.clip, 6), round(released.noise_multiplier * released.clip, 12)
    (3.605551, 6.0)
    >>> released_vector_spec(RoundSpec("run", 1, 2.0, 3.0)).clip
    3.0
    """
    sigma_b = spec.clipped_count_stddev
    if not sigma_b:
        return spec
    return replace(
        spec,
        noise_multiplier=accounted_noise_multiplier(spec.noise_multiplier, sigma_b),
        clip=augmented_clip(spec.clip, spec.noise_multiplier, sigma_b),
    )


def bits_float32(bits: np.ndarray) -> np.ndarray:
    """The bits' coordinates as float32, rounded toward zero: a report never exceeds ``C_aug`` by rounding.

    The device (one bit) and the engine (one per row) both send the bit in float32; rounding to
    nearest could put ``|c (b - 1/2)|`` one float32 step above ``c / 2``, and with it the vector above
    its norm bound.

    Parameters
    ----------
    bits : numpy.ndarray
        ``bit_coordinate`` values, float64.

    Returns
    -------
    numpy.ndarray
        float32, each at most the float64 value in magnitude.

    Examples
    --------
    >>> bits_float32(np.array([0.1, -0.1]))  # 0.1 rounds up to 0.10000000149 in float32: one step back
    array([ 0.09999999, -0.09999999], dtype=float32)
    """
    bits = np.asarray(bits, dtype=np.float64)
    out = bits.astype(np.float32)
    over = np.abs(out.astype(np.float64)) > np.abs(bits)
    out[over] = np.nextafter(out[over], np.float32(0))
    return out
