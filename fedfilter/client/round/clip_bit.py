"""Adaptive clipping on the device: the update clipped to the round's ``C`` with the clip bit appended.

The bit says whether the update's norm, before clipping, was within ``C`` (Andrew et al.,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1). It rides in the
report as one more coordinate, ``c (b - 1/2)`` (``protocol/adaptive_clip.py``), so the release that
follows (allowance, clip, charge, commit, then noise: ``client/release.py``) treats the pair as one
vector with the norm bound ``C_aug``: the filter charges the bit at its actual size, and a device whose
budget is spent clips the whole vector, bit included, to zero. Clipping the update to ``C`` here first
keeps the bit's coordinate whole whenever the allowance covers the round.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from fedfilter.protocol.adaptive_clip import bit_coordinate, bit_scale
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import REPLY_DTYPE

__all__ = ["with_clip_bit"]


def with_clip_bit(arrays: Sequence[np.ndarray], spec: RoundSpec) -> list[np.ndarray]:
    """``arrays`` clipped to ``spec.clip`` with the bit's array appended; unchanged for a fixed clip.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The update's released arrays (``Placement.released``).
    spec : RoundSpec
        The coordinator's request (its ``clip``, ``noise_multiplier`` and ``clipped_count_stddev``).

    Returns
    -------
    list of numpy.ndarray
        The arrays (scaled to norm ``C`` if longer), then a ``(1,)`` float32 array ``c (b - 1/2)``. An
        update holding NaN or inf is left as it is (the release refuses it and sends a zero update).

    Examples
    --------
    >>> spec = RoundSpec("run", 1, noise_multiplier=2.0, clip=1.0, clipped_count_stddev=1.0)  # c = 2
    >>> with_clip_bit([np.array([3.0, 4.0], np.float32)], spec)  # norm 5 > C: clipped, bit -c/2
    [array([0.6, 0.8], dtype=float32), array([-1.], dtype=float32)]
    >>> with_clip_bit([np.array([0.3, 0.4], np.float32)], spec)[1]  # within C: +c/2
    array([1.], dtype=float32)
    >>> len(with_clip_bit([np.zeros(2)], RoundSpec("run", 1, 2.0, 1.0)))  # a fixed clip: no bit
    1
    """
    if not spec.clipped_count_stddev:
        return list(arrays)
    clip = float(spec.clip)
    norm = float(np.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays)))
    out = list(arrays)
    if np.isfinite(norm) and norm > clip:
        out = [(a.astype(np.float64) * (clip / norm)).astype(a.dtype) for a in arrays]
    scale = bit_scale(float(spec.noise_multiplier), clip, float(spec.clipped_count_stddev))
    out.append(np.array([bit_coordinate(norm, clip, scale)], dtype=REPLY_DTYPE))
    return out
