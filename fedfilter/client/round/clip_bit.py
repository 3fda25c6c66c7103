"""Adaptive clipping on the device: the update clipped to the round's ``C`` with the clip bit appended.

The bit says whether the update's norm, before clipping, was within ``C`` (Andrew et al.,
"Differentially Private Learning with Adaptive Clipping", NeurIPS 2021, Algorithm 1). It rides in the
report as one more coordinate, ``c (b - 1/2)`` (``protocol/adaptive_clip.py``), so the release that
follows (allowance, clip, charge, commit, then noise: ``client/release.py``) treats the pair as one
vector with the norm bound ``C_aug``: the filter charges the bit at its actual size, and a device whose
budget is spent clips the whole vector, bit included, to zero. Clipping the update to ``C`` here first
keeps the bit's coordinate whole whenever the allowance covers the round. The norm and the clip are
the release's own (``certified_norm``, ``clip_to_norm``: the same passes whether or not the update is
clipped), as the engine computes them for its rows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np

from fedfilter.client.mechanisms.gaussian import certified_norm, clip_to_norm
from fedfilter.protocol.adaptive_clip import bit_coordinate, bit_scale, bits_float32
from fedfilter.protocol.request import RoundSpec

__all__ = ["with_clip_bit"]

log = logging.getLogger("fedfilter.client")


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
        The arrays clipped to norm ``C``, then a ``(1,)`` float32 array ``c (b - 1/2)`` (rounded toward
        zero). An update holding NaN or inf goes as zeros, its bit "clipped".

    Examples
    --------
    >>> spec = RoundSpec("run", 1, noise_multiplier=2.0, clip=1.0, clipped_count_stddev=1.0)  # c = 2
    >>> out = with_clip_bit([np.array([3.0, 4.0], np.float32)], spec)  # norm 5 > C: clipped, bit -c/2
    >>> [round(float(x), 6) for x in out[0]], out[1]
    ([0.6, 0.8], array([-1.], dtype=float32))
    >>> with_clip_bit([np.array([0.3, 0.4], np.float32)], spec)[1]  # within C: +c/2
    array([1.], dtype=float32)
    >>> len(with_clip_bit([np.zeros(2)], RoundSpec("run", 1, 2.0, 1.0)))  # a fixed clip: no bit
    1
    """
    if not spec.clipped_count_stddev:
        return list(arrays)
    clip = float(spec.clip)
    norm = certified_norm(arrays)  # NaN or inf for a non-finite update
    clipped, _ = clip_to_norm(arrays, clip)  # a non-finite update comes out as zeros
    if not math.isfinite(norm):
        log.error("fedfilter mod: the update holds NaN or inf; releasing a zero update, its clip bit 'clipped'")
    scale = bit_scale(float(spec.noise_multiplier), clip, float(spec.clipped_count_stddev))
    return [*clipped, bits_float32(np.array([bit_coordinate(norm, clip, scale)]))]
