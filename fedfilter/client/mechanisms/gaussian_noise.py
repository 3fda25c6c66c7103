"""Float-safe Gaussian noise: integer noise from a cryptographic stream, sampled exactly.

Floating-point Gaussian samplers leave their mark in the low-order bits of ``x + noise`` (Mironov,
CCS 2012; Jin et al., IEEE S&P 2022, arXiv 2112.05307): the bits of a report then tell a
contributing device from one without data. So no float noise ever touches the update here:

* the update is snapped toward zero onto a grid of step ``gamma`` (a power of two), giving an
  integer vector ``k`` (``fedfilter.client.mechanisms.gaussian.snap_toward_zero``);
* the noise is the integer ``R = round(sigma_g * G)`` per coordinate, ``G ~ N(0, 1)``, with
  ``sigma_g = std / gamma``: the continuous Gaussian rounded to the grid, sampled *exactly*
  (below);
* the report is ``(k + R) * gamma``, a deterministic function of the integer vector ``k + R``.

Privacy. ``k + R = round(k + sigma_g G)`` because ``k`` is an integer vector, so the report is a
post-processing of the continuous Gaussian mechanism ``k + sigma_g G`` applied to the snapped
update. Every guarantee of the Gaussian mechanism carries over unchanged (post-processing: Dong,
Roth and Su 2022, Proposition 4 for f-DP/Gaussian DP; Mironov 2017 Proposition 2 for RDP), with
sensitivity ``gamma ||k|| <= ||clipped update||`` (snapping toward zero never grows a coordinate),
so the filter's charge ``(||clipped|| / std)^2`` stays a valid upper bound. Whatever the report's
bits are, they are a function of ``k + R`` and the public ``gamma``.

Exact sampling by lazy inversion. With ``U`` uniform on (0, 1), ``sigma_g Phi^-1(U)`` is
``N(0, sigma_g^2)``. The stream gives the first 64 bits of ``U``, so ``U`` is known to lie in an
interval; by symmetry we work with ``p = min(U, 1 - U) <= 1/2`` and ``t(p) = -Phi^-1(p) >= 0``
(decreasing). If every point of the interval rounds to the same integer ``m`` the sample is
``+-m``, whatever the further bits of ``U``. Deciding that in float64 needs a bound on the error of
``scipy.special.ndtri`` (Cephes; documented peak relative error below 5e-16): the fast path widens
its interval by a relative ``2**-40`` (about 2,000 times that, checked against mpmath by
``tests/client/mechanisms/test_noise.py``). An interval it cannot decide (about 2 in 10^7 coordinates) goes to the
exact path: more random bits, and the cell boundaries ``Phi(-(m +- 1/2) / sigma_g)`` compared with
the interval in mpmath at a precision that grows with the bits, until they decide. The result is
the exact rounded Gaussian; the time it takes depends only on the random bits, never on the data.
"""

from __future__ import annotations

import hashlib
import math
import os

import mpmath
import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from scipy.special import ndtri

_KEY_BYTES = 32
_FAST_REL = 2.0**-40  # relative widening of the fast path (>> ndtri's error and the products')
_FAST_ABS = 2.0**-40  # absolute widening, for values near 0
_TWO32, _TWO64 = 2.0**-32, 2.0**-64


class NoiseStream:
    """Random bytes from ChaCha20 (RFC 8439) keyed from ``os.urandom`` or from a test seed.

    A stream is used by one release and then dropped: it holds no state another thread could share.

    Parameters
    ----------
    key : bytes, optional
        A 32-byte ChaCha20 key (default: fresh from ``os.urandom``).

    Examples
    --------
    >>> len(NoiseStream().uint64(3))
    3
    """

    def __init__(self, key: bytes | None = None):
        key = os.urandom(_KEY_BYTES) if key is None else key
        if not (isinstance(key, bytes) and len(key) == _KEY_BYTES):
            raise ValueError(f"a noise key must be {_KEY_BYTES} bytes. Found {key!r}.")
        self._cipher = Cipher(algorithms.ChaCha20(key, bytes(16)), mode=None).encryptor()

    @classmethod
    def from_seed(cls, *parts) -> NoiseStream:
        """A reproducible stream for tests and the engine's conformance runs ONLY: whoever knows
        the seed can subtract the noise.

        Parameters
        ----------
        *parts
            Anything with a ``str``; joined and hashed into the key.

        Returns
        -------
        NoiseStream

        Examples
        --------
        >>> NoiseStream.from_seed("doc").uint64(2)
        array([ 4661060918872516330, 14013047268065875604], dtype=uint64)
        """
        return cls(seed_key(*parts))

    def uint64(self, n: int) -> np.ndarray:
        """The stream's next ``n`` 64-bit words.

        Parameters
        ----------
        n : int
            How many words.

        Returns
        -------
        numpy.ndarray
            ``n`` uint64 values.

        Examples
        --------
        >>> NoiseStream.from_seed("doc").uint64(1)
        array([4661060918872516330], dtype=uint64)
        """
        return np.frombuffer(self._cipher.update(bytes(8 * n)), dtype="<u8").astype(np.uint64)


def rounded_gaussian(sigma_g: float, size: int, stream: NoiseStream) -> np.ndarray:
    """``round(sigma_g * G)`` for ``size`` independent ``G ~ N(0, 1)``, exactly; int64.

    Parameters
    ----------
    sigma_g : float
        The std in grid steps, in ``[1, 2**40]``.
    size : int
        How many samples.
    stream : NoiseStream
        The random bytes.

    Returns
    -------
    numpy.ndarray
        ``size`` int64 samples.

    Examples
    --------
    >>> rounded_gaussian(4.0, 5, NoiseStream.from_seed("doc"))
    array([-3,  3, -2, -2, -7])
    """
    if not (math.isfinite(sigma_g) and 1.0 <= sigma_g <= 2.0**40):
        raise ValueError(f"sigma_g must be a finite number in [1, 2**40]. Found {sigma_g!r}.")
    u = stream.uint64(size)
    lower = u < np.uint64(2**63)  # U < 1/2: the sample is negative
    w = np.where(lower, u, ~u)  # p = min(U, 1 - U) lies in (w, w + 1) * 2**-64, w < 2**63
    hi, lo = (w >> np.uint64(32)).astype(np.float64), (w & np.uint64(0xFFFFFFFF)).astype(np.float64)
    # hi * 2**-32 and lo * 2**-64 are exact; one ulp outward covers the rounding of their sum.
    p_lo = np.nextafter(hi * _TWO32 + lo * _TWO64, 0.0)
    p_hi = np.nextafter(hi * _TWO32 + (lo + 1.0) * _TWO64, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_big = sigma_g * -ndtri(p_lo)  # t is decreasing: the largest |x| comes from the smallest p
        x_small = sigma_g * -ndtri(p_hi)
    m_big = np.floor(x_big * (1 + _FAST_REL) + _FAST_ABS + 0.5)
    m_small = np.floor(np.maximum(x_small * (1 - _FAST_REL) - _FAST_ABS, 0.0) + 0.5)
    decided = np.isfinite(m_big) & (m_big == m_small)
    m = np.where(decided, m_small, 0.0).astype(np.int64)
    for i in np.flatnonzero(~decided):
        m[i] = _exact_magnitude(sigma_g, int(w[i]), stream)
    return np.where(lower, -m, m)


def _exact_magnitude(sigma_g: float, w: int, stream: NoiseStream) -> int:
    """``round(sigma_g * t(p))`` for ``p`` uniform in ``(w, w + 1) * 2**-64``, drawing more bits."""
    numer, bits = w, 64
    while True:
        numer, bits = (numer << 64) | int(stream.uint64(1)[0]), bits + 64
        prec = bits + 64
        with mpmath.workprec(prec):
            p_lo, p_hi = mpmath.ldexp(numer, -bits), mpmath.ldexp(numer + 1, -bits)
            mid = (p_lo + p_hi) / 2
            m = int(mpmath.floor(sigma_g * -_ndtri_mp(mid) + mpmath.mpf(0.5)))
            # |x| rounds to m iff p in (Phi(-(m + 1/2)/sigma_g), Phi(-(m - 1/2)/sigma_g)].
            below = mpmath.ncdf(-(m + mpmath.mpf(0.5)) / sigma_g)
            above = mpmath.ncdf(-(m - mpmath.mpf(0.5)) / sigma_g)
            guard = mpmath.ldexp(1, 24 - prec)  # relative slack for mpmath's own rounding
            if p_lo > below * (1 + guard) and p_hi < above * (1 - guard):
                return m


def _ndtri_mp(p):
    """``Phi^-1(p)`` for ``0 < p <= 1/2`` at the working precision (Newton on ``ncdf``)."""
    x = mpmath.mpf(float(ndtri(float(p)))) if float(p) > 0 else -mpmath.sqrt(-2 * mpmath.log(p))
    for _ in range(200):
        step = (mpmath.ncdf(x) - p) / mpmath.npdf(x)
        x -= step
        if abs(step) <= mpmath.ldexp(abs(x) + 1, -mpmath.mp.prec + 8):
            break
    return x


def seed_key(*parts) -> bytes:
    """The 32-byte ChaCha20 key ``NoiseStream.from_seed(*parts)`` uses: SHA-256 of the parts' ``str``,
    joined by NUL (tests and the engine's conformance runs ONLY).

    Parameters
    ----------
    *parts
        Anything with a ``str``.

    Returns
    -------
    bytes

    Examples
    --------
    >>> len(seed_key("a", 1))
    32
    """
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def round_noise_key(noise_seed: int, run_id: str, round_id: int) -> bytes:
    """The key of ``round_noise_stream(noise_seed, run_id, round_id)`` (the engine computes many at once).

    Parameters
    ----------
    noise_seed : int
        The device's test ``noise-seed``.
    run_id : str
        The run.
    round_id : int
        The round.

    Returns
    -------
    bytes

    Examples
    --------
    >>> NoiseStream(round_noise_key(7, "run", 0)).uint64(1)
    array([16671923865967405132], dtype=uint64)
    """
    return seed_key("fedfilter.noise", int(noise_seed), run_id, int(round_id))


def round_noise_stream(noise_seed: int, run_id: str, round_id: int) -> NoiseStream:
    """The stream a device with a test ``noise-seed`` uses for one round (and the engine, to match).

    Each Deployment-Engine message runs in a fresh process, so a plain seed would repeat the same
    noise every round (and let differences of reports cancel it): the round enters the key.

    Parameters
    ----------
    noise_seed : int
        The device's test ``noise-seed``.
    run_id : str
        The run.
    round_id : int
        The round.

    Returns
    -------
    NoiseStream

    Examples
    --------
    >>> round_noise_stream(7, "run", 0).uint64(1)
    array([16671923865967405132], dtype=uint64)
    """
    return NoiseStream(round_noise_key(noise_seed, run_id, round_id))
