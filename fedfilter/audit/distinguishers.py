"""Exhaustion distinguishers: can a coordinator tell a noise-only reply from a contributing one?

An invariant of the privacy model: nothing observable of a reply (bits, bytes, timing) may depend
on the budget state except through the accounted noisy report. Each distinguisher reduces a reply
to one number per feature; on one part of the trials the best feature, threshold and direction are
chosen (``bounds.select_threshold``), on the rest the advantage TPR - FPR is measured with
Clopper-Pearson bounds. What a distinguisher is allowed:

* ``value`` (the projection onto the canary, the best test on the values) and ``bits`` (low-order
  bits): one contributing reply of norm C at noise zC is 1/z-GDP, so no test on it can beat the
  total variation ``2 Phi(1 / (2z)) - 1`` (Dong, Roth and Su, arXiv 1905.02383 v3, Section 2.3).
  Floating-point artefacts can break this (Mironov, CCS 2012; Jin et al., IEEE S&P 2022).
* ``time``, ``metadata-time`` and ``bytes``: 0; noise-only and contributing replies must not differ.

A distinguisher passes when its advantage is within the allowed value plus the confidence slack
(the measured advantage minus its lower confidence bound), i.e. when the data cannot show that
the true advantage exceeds what is allowed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from fedfilter.audit.bounds import Rates, Test, gdp_total_variation, rates_at, select_threshold

# Power-of-two grids, as bits below the leading bit of the noise std: a reply's values all on
# one of these grids, in one world only, give that world away.
DISTINGUISHER_BITS = (8, 16, 20, 23, 24, 32, 40, 48, 52)


def _mantissa_low_bits(a: np.ndarray, bits: int) -> np.ndarray:
    """The lowest ``bits`` bits of each value's stored significand, in its own dtype."""
    itype = {4: np.uint32, 8: np.uint64, 2: np.uint16}[a.dtype.itemsize]
    return (np.ascontiguousarray(a).view(itype) & itype((1 << bits) - 1)).astype(np.int64)


def bits_features(arrays, std: float) -> dict[str, float]:
    """Generic low-order-bit statistics of one reply (no knowledge of the sampler needed).

    * ``roundtrip-f64`` / ``roundtrip-native``: share of values r with fl(fl(r / std) * std) == r,
      in float64 and in the reply's dtype: noise drawn as std * z and sent as is passes always.
    * ``grid-k``: share of values that are integer multiples of 2^(e - k), e = floor(log2 std).
    * ``lsb-zero``: share of even significands; ``low4-chi2``: chi-square of the lowest 4 bits
      against uniform (the bits of a sum are uniform; the bits of a product may not be).

    Parameters
    ----------
    arrays : iterable of array_like
        The reply's arrays (non-float ones are skipped).
    std : float
        The noise std of the reply.

    Returns
    -------
    dict of str to float
        Feature name -> value.

    Examples
    --------
    >>> reply = [np.random.default_rng(0).normal(0, 0.5, 1000).astype(np.float32)]
    >>> features = bits_features(reply, std=0.5)
    >>> features["roundtrip-native"], features["grid-8"] < 0.1
    (1.0, True)
    """
    arrays = [np.asarray(a) for a in arrays if np.issubdtype(np.asarray(a).dtype, np.floating)]
    r64 = np.concatenate([a.astype(np.float64).ravel() for a in arrays])
    n = r64.size
    out = {"roundtrip-f64": float(np.mean((r64 / std) * std == r64))}
    native = sum(int(np.sum((a / a.dtype.type(std)) * a.dtype.type(std) == a)) for a in arrays)
    out["roundtrip-native"] = native / n
    e = math.floor(math.log2(std))
    for k in DISTINGUISHER_BITS:
        scaled = np.ldexp(r64, k - e)  # exact: a power-of-two scaling
        out[f"grid-{k}"] = float(np.mean(scaled == np.round(scaled)))
    low = np.concatenate([_mantissa_low_bits(a.ravel(), 4) for a in arrays])
    out["lsb-zero"] = float(np.mean(low % 2 == 0))
    counts = np.bincount(low, minlength=16)
    out["low4-chi2"] = float(np.sum((counts - n / 16) ** 2 / (n / 16)))
    return out


@dataclass(frozen=True)
class Finding:
    """One distinguisher's result on held-out trials.

    Parameters
    ----------
    name : str
        The distinguisher (``value``, ``bits``, ``time``, ...).
    feature : str
        The feature its test was chosen on.
    rates : Rates
        The test's held-out rates.
    theory : float
        The advantage the privacy model allows.
    mean_noise_only, mean_contributing : float
        The feature's mean over all trials, for the reader.

    Examples
    --------
    >>> rates = rates_at(Test(0.5), [0.0] * 50 + [1.0] * 50, [0.0] * 50 + [1.0] * 50, alpha=0.05)
    >>> finding = Finding("bytes", "size", rates, theory=0.0, mean_noise_only=0.5, mean_contributing=0.5)
    >>> finding.advantage, finding.within
    (0.0, True)
    """

    name: str
    feature: str
    rates: Rates
    theory: float  # the advantage the privacy model allows
    mean_noise_only: float  # the feature's mean over all trials, for the reader
    mean_contributing: float

    @property
    def advantage(self) -> float:
        """The measured advantage TPR - FPR.

        Returns
        -------
        float
            The advantage.

        Examples
        --------
        >>> rates = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
        >>> Finding("bits", "lsb-zero", rates, 0.1, 0.0, 1.0).advantage
        1.0
        """
        return self.rates.advantage

    @property
    def slack(self) -> float:
        """The confidence slack: the measured advantage minus its lower confidence bound.

        Returns
        -------
        float
            The slack.

        Examples
        --------
        >>> rates = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
        >>> round(Finding("bits", "lsb-zero", rates, 0.1, 0.0, 1.0).slack, 3)
        0.142
        """
        return self.rates.advantage - self.rates.advantage_lo

    @property
    def allowed(self) -> float:
        """The advantage the data may show: ``theory`` plus the confidence slack.

        Returns
        -------
        float
            The allowed advantage.

        Examples
        --------
        >>> rates = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
        >>> round(Finding("bits", "lsb-zero", rates, 0.1, 0.0, 1.0).allowed, 3)
        0.242
        """
        return self.theory + self.slack

    @property
    def within(self) -> bool:
        """Whether the data cannot show that the true advantage exceeds ``theory``.

        Returns
        -------
        bool
            ``advantage_lo <= theory``.

        Examples
        --------
        >>> rates = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
        >>> Finding("bits", "lsb-zero", rates, 0.1, 0.0, 1.0).within  # a perfect distinguisher
        False
        """
        return self.rates.advantage_lo <= self.theory

    def as_dict(self) -> dict:
        """The finding as ``audit.json`` keeps it.

        Returns
        -------
        dict
            Advantage, its bound, what is allowed, the feature and the means.

        Examples
        --------
        >>> rates = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
        >>> Finding("bits", "lsb-zero", rates, 0.1, 0.0, 1.0).as_dict()["within_bound"]
        False
        """
        return {
            "advantage": self.advantage,
            "advantage_lo": self.rates.advantage_lo,
            "allowed": self.allowed,
            "theory": self.theory,
            "slack": self.slack,
            "within_bound": self.within,
            "feature": self.feature,
            "n_eval": self.rates.n0,
            "mean_noise_only": self.mean_noise_only,
            "mean_contributing": self.mean_contributing,
        }


def distinguish(
    name: str,
    noise_only: dict[str, np.ndarray],
    contributing: dict[str, np.ndarray],
    select: np.ndarray,
    *,
    theory: float,
    alpha: float,
) -> Finding:
    """Pick the feature and test on ``select`` trials; measure the advantage on the others.

    ``noise_only[f][i]`` and ``contributing[f][i]`` are feature ``f`` of trial ``i``'s two probe
    replies. World 1 of the test is "contributing".

    Parameters
    ----------
    name : str
        The distinguisher's name.
    noise_only, contributing : dict of str to numpy.ndarray
        Per feature, one value per trial, for the noise-only and the contributing reply.
    select : numpy.ndarray of bool
        The selection trials.
    theory : float
        The advantage the privacy model allows.
    alpha : float
        1 - confidence.

    Returns
    -------
    Finding
        The best feature's held-out result.

    Raises
    ------
    ValueError
        No feature.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> same = {"bytes": np.full(200, 1024.0)}
    >>> finding = distinguish("bytes", same, same, rng.random(200) < 0.5, theory=0.0, alpha=0.05)
    >>> finding.advantage, finding.within
    (0.0, True)
    """
    best: tuple[str, Test, float] | None = None
    for feature in noise_only:
        a0, a1 = np.asarray(noise_only[feature]), np.asarray(contributing[feature])
        test = select_threshold(a0[select], a1[select], objective="advantage", alpha=alpha)
        chosen = rates_at(test, a0[select], a1[select], alpha=alpha)
        if best is None or chosen.advantage_lo > best[2]:
            best = (feature, test, chosen.advantage_lo)
    if best is None:
        raise ValueError(f"{name}: noise_only must hold at least one feature. Found {noise_only!r}.")
    feature, test, _ = best
    a0, a1 = np.asarray(noise_only[feature]), np.asarray(contributing[feature])
    rates = rates_at(test, a0[~select], a1[~select], alpha=alpha)
    return Finding(name, feature, rates, theory, float(np.mean(a0)), float(np.mean(a1)))


def single_reply_tv(noise_multiplier: float) -> float:
    """What one reply of norm C at noise z C allows any test: TV of (1/z)-GDP.

    Parameters
    ----------
    noise_multiplier : float
        z.

    Returns
    -------
    float
        ``2 Phi(1 / (2z)) - 1``.

    Examples
    --------
    >>> round(single_reply_tv(1.0), 4)
    0.3829
    """
    return gdp_total_variation(1.0 / noise_multiplier)
