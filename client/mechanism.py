"""The per-round Gaussian mechanism on the client: certified norms, clipping, and noise.

Norms are computed in float64 and then inflated by a bound on their rounding error, so the
sensitivity the filter is charged for is never below the true norm of the array actually
released (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. (3.5): a sum of
n terms has relative error at most (n-1)u/(1-(n-1)u); squaring and the square root add a few u).
"""

from __future__ import annotations

import math
import secrets
from typing import Sequence

import numpy as np

_U = 2.0**-53  # unit roundoff of float64


class NonFiniteUpdateError(ValueError):
    """The update holds NaN or inf: refused before anything is spent."""


def as_float_arrays(update: Sequence[np.ndarray]) -> list[np.ndarray]:
    arrays = [np.asarray(a) for a in update]
    for i, a in enumerate(arrays):
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"update[{i}] must be a floating-point array. Found dtype {a.dtype}.")
    return arrays


def check_finite(arrays: Sequence[np.ndarray]) -> None:
    """Raise ``NonFiniteUpdateError`` naming the first array holding NaN or inf, and the value."""
    for i, a in enumerate(arrays):
        bad = ~np.isfinite(a)
        if bad.any():
            raise NonFiniteUpdateError(
                f"update[{i}] (shape {a.shape}) contains {int(bad.sum())} non-finite value(s), "
                f"e.g. {a[bad].flat[0]!r}; nothing was spent."
            )


def certified_norm(arrays: Sequence[np.ndarray]) -> float:
    """An upper bound on the exact L2 norm of all arrays together, as stored.

    Entries are first scaled by an exact power of two so that the largest lies in [0.5, 1):
    squares then neither overflow nor lose the total to underflow, and the relative error bound
    holds (an entry whose square underflows contributes less than 2**-1074 to a total >= 0.25).
    """
    n = sum(a.size for a in arrays)
    peak = max((float(np.max(np.abs(a))) for a in arrays if a.size), default=0.0)
    if peak == 0.0:
        return 0.0
    exponent = math.frexp(peak)[1]
    # 2**-exponent in two exact halves: a single factor overflows for subnormal peaks.
    half_a, half_b = math.ldexp(1.0, -(exponent // 2)), math.ldexp(1.0, -(exponent - exponent // 2))
    total = 0.0
    for a in arrays:
        flat = a.astype(np.float64, copy=False).ravel() * half_a * half_b  # exact: powers of two
        total += float(np.dot(flat, flat))
    norm = math.ldexp(math.sqrt(total), exponent)
    return float(np.nextafter(norm * (1.0 + (n + 8) * 2 * _U), np.inf))


def clip_to_norm(arrays: Sequence[np.ndarray], max_norm: float) -> tuple[list[np.ndarray], float]:
    """Scale the update so its certified norm is at most ``max_norm``; returns (arrays, norm).

    The arrays keep their dtypes. Rounding in the cast can push a norm up by a few ulps of the
    dtype, so the result is re-certified and shrunk again if needed.
    """
    if not (np.isfinite(max_norm) and max_norm >= 0):
        raise ValueError(f"max_norm must be finite and >= 0. Found {max_norm!r}.")
    norm = certified_norm(arrays)
    if norm <= max_norm:
        return [a.copy() for a in arrays], norm
    scale = max_norm / norm
    for _ in range(8):
        clipped = [(a.astype(np.float64) * scale).astype(a.dtype) for a in arrays]
        norm = certified_norm(clipped)
        if norm <= max_norm:
            return clipped, norm
        scale *= 1 - 2.0**-20  # float32 casts move norms by ~2**-24; shrink a little more
    zeros = [np.zeros_like(a) for a in arrays]
    return zeros, 0.0


def make_rng(seed: int | None = None) -> np.random.Generator:
    """A noise generator: seeded from the OS's cryptographic source unless a seed is given."""
    if seed is None:
        seed = secrets.randbits(128)
    return np.random.Generator(np.random.PCG64(seed))


def add_gaussian_noise(arrays: Sequence[np.ndarray], std: float, rng: np.random.Generator) -> list[np.ndarray]:
    """``a + N(0, std^2 I)`` per array, drawn in float64 and returned in each array's dtype."""
    if not (np.isfinite(std) and std > 0):
        raise ValueError(f"noise std must be finite and > 0. Found {std!r}.")
    return [(a.astype(np.float64) + rng.normal(0.0, std, size=a.shape)).astype(a.dtype) for a in arrays]
