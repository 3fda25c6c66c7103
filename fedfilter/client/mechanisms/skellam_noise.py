"""Exact integer Skellam noise from a cryptographic stream, for distributed noise over SecAgg+.

``Sk(mu)`` = Poisson(mu/2) - Poisson(mu/2) has pmf ``q(x) = exp(-mu) I_|x|(mu)`` and variance ``mu``. The
accounting (``fedfilter.privacy.skellam``) assumes the noise is EXACTLY Skellam, so, as for
``fedfilter.client.mechanisms.gaussian_noise.rounded_gaussian``, samples come by lazy inversion of the CDF from
ChaCha20 bits
and never from a floating-point sampler.

Inversion (the full CDF, folded by symmetry). Let ``S(j) = P(X >= j) = P(X <= -j)``. With ``U`` uniform on
(0, 1) and ``p = min(U, 1 - U) <= 1/2``, the sample is ``-m`` if ``U < 1/2`` and ``+m`` otherwise, where
``m >= 0`` is the unique integer with ``S(m + 1) < p <= S(m)`` (``S(0) = (1 + q(0)) / 2 > 1/2 >= p``).
For ``m >= 1`` each sign has probability ``S(m) - S(m + 1) = q(m)``; ``m = 0`` has ``2 (1/2 - S(1)) =
q(0)``: exactly Skellam (the events ``p = S(j)`` have probability 0). The 64 bits of a stream word put
``p`` in an open interval ``(p_lo, p_hi)`` (as in ``noise.py``); the sample is decided once every ``S(j)``
lies outside it.

Bounds on ``S(j)``, proven, in exact integer arithmetic (``_tail_bounds``). With ``r_v = I_{v+1}(mu) /
I_v(mu)``, the three-term recurrence ``I_{v-1} - I_{v+1} = (2 v / mu) I_v`` gives ``r_{v-1} = 1 / (2 v /
mu + r_v)``, decreasing in ``r_v``: an interval ``[lo, hi]`` for ``r_v`` maps to ``[1 / (t + hi), 1 / (t
+ lo)]`` for ``r_{v-1}``. Every value is an integer multiple of ``2**-P`` rounded outward (floor for lower
bounds, ceiling for upper ones), ``mu`` is taken as its exact rational value, so each step is rigorous and
adds at most ``2**-P`` per end; the map contracts widths by ``r_{v-1}^2 < 1`` (backward recurrence is the
stable direction for this minimal solution). Start (far out, ``v0 = n + K``): ``r_v`` decreases in ``v``
(the Turán inequality ``I_v^2 > I_{v-1} I_{v+1}``, Thiruvenkatachar and Nanjundiah 1951), so ``r_{v-1} =
1 / (t_v + r_v) >= 1 / (t_v + r_{v-1})``, i.e. ``r_{v-1} >= a(v) = mu / (v + sqrt(v^2 + mu^2))``, and
``r_{v0} <= 1 / (t_{v0+1} + a(v0 + 1))``; these two floats (a few correctly rounded IEEE operations, each
within ``2**-53`` relative) are widened by ``2**-40`` relative before use. Then the unnormalised pmf
``P(y) = q(y) / q(0) = prod_{v<y} r_v`` (products rounded outward), the tail ``sum_{y>n} P(y) <= P(n) r_n
/ (1 - r_n)`` (``r_y <= r_n`` for ``y >= n``), ``Z = 1 + 2 sum_{y>=1} P(y) = 1 / q(0)``, and ``S(j) =
sum_{y>=j} P(y) / Z``, each bound rounded outward. The result: integers ``lo_j <= 2**P S(j) <= hi_j``.
No floating-point error analysis of a pmf table is needed: the float64 table below is these exact bounds
rounded outward (``float(int)`` is correctly rounded; one ``nextafter`` covers it; scaling by ``2**-P`` is
exact above the subnormal range, and bounds below it are 0 or ``2**-P``-multiples ``>= 2**-P``).

Fast path (``skellam_noise``): the float64 bounds ``L_j <= S(j) <= H_j`` for ``j = 1..n`` at ``P = 192``
(widths below ``2**-80``, mostly the slack of the tail bound beyond ``n``; far below the ``2**-64`` of a
stream word), both non-increasing in ``j``. For
``p`` in ``(p_lo, p_hi)``: ``m = #{j: L_j >= p_hi}`` (one binary search) and ``m' = #{j: H_j > p_lo}``; if
``m = m' < n`` (checked as ``H_{m+1} <= p_lo``) then
``S(j) >= L_j >= p_hi > p`` for ``j <= m`` and ``S(j) <= H_{m+1} <= p_lo < p`` for ``j > m`` (also beyond
the table, ``S`` decreasing): the sample is ``+-m``. ``n`` is set by Bernstein's inequality ``S(j) <=
exp(-j^2 / (2 (mu + j/3)))`` (sub-gamma Poisson differences) so that ``S(n) < 2**-66 / (1 + mu)``: only the
first word ``0`` or ``2**64 - 1`` (probability ``2**-63``) or an interval meeting some ``[L_j, H_j]``
(probability ``~ n 2**-64``) goes to the exact path. ``n`` only affects speed, never the distribution.

Exact path (``_exact_magnitude``): draw 64 more bits, recompute the integer bounds at a precision ``P``
that grows with the bits and for ``n`` covering ``p``, and decide by exact integer comparisons, until
decided (terminates with probability 1). Each round rebuilds the bounds (~1 s at ``mu = 1e7``), which at
the probabilities above never shows in practice. Its time, like the fast path's, depends only on the
random bits and ``mu``, never on the data; ``add_skellam_noise`` only shifts the data by the noise.

Assumptions: the stream's words are uniform and independent (ChaCha20); IEEE float64 with correct
rounding of ``+ - * / sqrt`` (for the two start floats and the table conversion); the Turán inequality and
the Bessel recurrence (classical). ``mu`` is capped at ``2**32`` (~``4.3e9``, above the ``6.7e7 z^2`` that
distributed rounds reach for ``z <= 8`` even with ``t = 1``): the table then has ~7.6e5 entries and took 5 s and ~210 MB
to build on the development machine; larger values are refused rather than stalling a device.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np

from fedfilter.client.mechanisms.gaussian_noise import NoiseStream

# The largest share variance the exact sampler draws from: a device refuses rounds above it
# (``skellam.skellam_grid``), the engine splits larger variances into draws of at most this.
MAX_MU_SHARE = 2.0**32
_TABLE_BITS = 192  # fixed-point precision of the cached table's exact bounds
_START_WIDEN = 2.0**-40  # relative widening of the two float start values (a few ulps of error)
_TWO32, _TWO64 = 2.0**-32, 2.0**-64


def _check_mu(mu: float) -> float:
    if isinstance(mu, bool) or not isinstance(mu, (int, float, np.integer, np.floating)):
        raise ValueError(f"mu (the Skellam variance per coordinate) must be a number. Found {mu!r}.")
    value = float(mu)
    if not (math.isfinite(value) and 0.0 < value <= MAX_MU_SHARE):
        raise ValueError(f"mu (the Skellam variance per coordinate) must be finite, > 0 and <= 2**32. Found {mu!r}.")
    return value


def _table_size(mu: float, log_inv_p: float) -> int:
    """Least ``n`` with Bernstein's ``exp(-n^2 / (2 (mu + n/3))) <= exp(-log_inv_p)`` (speed only)."""
    big_l = log_inv_p
    return int(math.ceil(big_l / 3 + math.sqrt(big_l * big_l / 9 + 2 * big_l * mu))) + 2


def _turan_lower(v: int, mu: float) -> float:
    """A float ``<= mu / (v + sqrt(v^2 + mu^2)) <= r_{v-1}``, widened down."""
    return mu / (v + math.sqrt(float(v) * v + mu * mu)) * (1 - _START_WIDEN)


def _tail_bounds(mu: float, n: int, prec: int) -> tuple[list[int], list[int]]:
    """Integers ``lo[j] <= 2**prec * S(j) <= hi[j]`` for ``j = 0..n`` (``S(j) = P(Sk(mu) >= j)``), proven
    as the module docstring explains."""
    one = 1 << prec
    num, den = float(mu).as_integer_ratio()  # mu = num / den exactly
    c = den << (prec + 1)  # 2**prec * t_v = v * c / num, t_v = 2 v / mu
    # Contraction: for v >= n, r_v <= r_hat; K steps shrink a start width <= 1 below 2**-prec.
    # (Speed only: the bounds are rigorous whatever the number of steps.)
    r_hat = min(max(1.0 / (2.0 * n / mu + _turan_lower(n + 1, mu)), 2.0**-30), 1 - 2.0**-30)
    steps = int(math.ceil((prec + 2) * math.log(2) / (-2 * math.log(r_hat)))) + 4
    v0 = n + steps
    lo_num, lo_den = _turan_lower(v0 + 1, mu).as_integer_ratio()  # a lower bound of r_{v0}, exactly
    hi_f = 1.0 / (2.0 * (v0 + 1) / mu + _turan_lower(v0 + 2, mu)) * (1 + _START_WIDEN)
    hi_num, hi_den = hi_f.as_integer_ratio()
    lo, hi = (lo_num << prec) // lo_den, -(-(hi_num << prec) // hi_den)
    two_p = one * one
    r_lo, r_hi = [0] * (n + 1), [0] * (n + 1)
    for v in range(v0, 0, -1):  # (lo, hi) brackets r_v; compute r_{v-1}
        t_lo = v * c // num
        t_hi = -(-v * c // num)
        lo, hi = two_p // (t_hi + hi), -(-two_p // (t_lo + lo))
        if v - 1 <= n:
            r_lo[v - 1], r_hi[v - 1] = lo, hi
    r_n_hi = r_hi[n]
    if r_n_hi >= one:
        raise ValueError(f"mu={mu!r}: the tail bound needs r_n < 1; found an upper bound >= 1 (n={n}).")
    # In place (memory: two lists of n + 1 integers), each list becomes in turn 2**prec times
    # P(y) = prod_{v<y} r_v, then sum_{y=j}^{n} P(y), then S(j): lower bounds in ``lo_list``, upper in ``hi_list``.
    lo_list, hi_list = r_lo, r_hi
    prod_lo = prod_hi = one
    for y in range(n + 1):
        r_y_lo, r_y_hi = lo_list[y], hi_list[y]
        lo_list[y], hi_list[y] = prod_lo, prod_hi
        prod_lo, prod_hi = prod_lo * r_y_lo >> prec, -(-prod_hi * r_y_hi >> prec)
    tail_hi = -(-hi_list[n] * r_n_hi // (one - r_n_hi))  # >= 2**prec sum_{y>n} P(y), as r_y <= r_n
    acc_lo = acc_hi = 0
    for y in range(n, -1, -1):
        acc_lo, acc_hi = acc_lo + lo_list[y], acc_hi + hi_list[y]
        lo_list[y], hi_list[y] = acc_lo, acc_hi
    z_lo = 2 * lo_list[0] - one  # 2**prec Z, Z = 1 + 2 sum_{y>=1} P(y) = 2 sum_{y>=0} P(y) - 1
    z_hi = 2 * (hi_list[0] + tail_hi) - one
    for j in range(n + 1):
        lo_list[j] = (lo_list[j] << prec) // z_hi
        hi_list[j] = -(-((hi_list[j] + tail_hi) << prec) // z_lo)
    return lo_list, hi_list


def _to_float_down(values: list[int], prec: int) -> np.ndarray:
    arr = np.array([float(x) for x in values], dtype=np.float64) * 2.0**-prec
    return np.maximum(np.nextafter(arr, 0.0), 0.0)


def _to_float_up(values: list[int], prec: int) -> np.ndarray:
    arr = np.array([float(x) for x in values], dtype=np.float64) * 2.0**-prec
    return np.nextafter(arr, np.inf)


@lru_cache(maxsize=4)
def _fast_table(mu: float) -> tuple[np.ndarray, np.ndarray, int]:
    """``(L, H, n)``: float bounds on ``S(1..n)`` reversed (ascending, for ``searchsorted``)."""
    n = _table_size(mu, 66 * math.log(2) + math.log1p(mu))
    lower, upper = _tail_bounds(mu, n, _TABLE_BITS)
    low = _to_float_down(lower[1:], _TABLE_BITS)[::-1].copy()
    high = _to_float_up(upper[1:], _TABLE_BITS)[::-1].copy()
    low.setflags(write=False)
    high.setflags(write=False)
    return low, high, n


def skellam_noise(mu: float, size: int, stream: NoiseStream) -> np.ndarray:
    """``size`` independent ``Sk(mu)`` samples (variance ``mu``), exactly; int64.

    Parameters
    ----------
    mu : float
        The variance of each sample.
    size : int
        How many samples (>= 0).
    stream : NoiseStream
        The random bytes.

    Returns
    -------
    numpy.ndarray
        ``size`` int64 samples.

    Examples
    --------
    >>> from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
    >>> skellam_noise(4.0, 5, NoiseStream.from_seed("doc"))
    array([-1,  1, -1, -1, -3])
    """
    mu = _check_mu(mu)
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be a non-negative integer. Found {size!r}.")
    low, high, n = _fast_table(mu)
    u = stream.uint64(int(size))
    lower = u < np.uint64(2**63)  # U < 1/2: the sample is -m
    w = np.where(lower, u, ~u)  # p = min(U, 1 - U) lies in (w, w + 1) * 2**-64, w < 2**63
    hi32, lo32 = (w >> np.uint64(32)).astype(np.float64), (w & np.uint64(0xFFFFFFFF)).astype(np.float64)
    p_lo = np.nextafter(hi32 * _TWO32 + lo32 * _TWO64, 0.0)
    p_hi = np.nextafter(hi32 * _TWO32 + (lo32 + 1.0) * _TWO64, 1.0)
    m = n - np.searchsorted(low, p_hi, side="left")  # #{j: L_j >= p_hi}
    # m' = #{j: H_j > p_lo} >= m (H_j >= L_j >= p_hi > p_lo for j <= m); m' = m < n iff H_{m+1} <= p_lo
    # (H non-increasing in j). high is reversed: H_{m+1} is high[n - m - 1].
    decided = m < n
    decided[decided] = high[n - 1 - m[decided]] <= p_lo[decided]
    m = np.where(decided, m, 0).astype(np.int64)
    for i in np.flatnonzero(~decided):
        m[i] = _exact_magnitude(mu, int(w[i]), stream)
    return np.where(lower, -m, m)


def _decide(lower: list[int], upper: list[int], n: int, p_lo: int, p_hi: int) -> tuple[int, int]:
    """``(m, m')`` for ``p`` in ``(p_lo, p_hi)`` (all scaled by ``2**prec``): decided iff ``m = m' < n``."""
    m = sum(1 for j in range(1, n + 1) if lower[j] >= p_hi)
    m_prime = sum(1 for j in range(1, n + 1) if upper[j] > p_lo)
    return m, m_prime


def _exact_magnitude(mu: float, w: int, stream: NoiseStream) -> int:
    """``m`` for ``p`` uniform in ``(w, w + 1) * 2**-64``, drawing more bits until the bounds decide."""
    numer, bits = w, 64
    while True:
        numer, bits = (numer << 64) | int(stream.uint64(1)[0]), bits + 64
        if numer == 0:
            continue  # p < 2**-bits: below every S(j) we could resolve yet
        # n with S(n) (Bernstein) and so the tail slack (~ S(n) mu / n) far below the 2**-bits of the
        # interval; the decision itself checks m' < n, and a table ending above p is extended.
        n = _table_size(mu, (bits + 8) * math.log(2) + math.log1p(mu))
        while True:
            prec = bits + 64 + 2 * n.bit_length()
            lower, upper = _tail_bounds(mu, n, prec)
            shift = prec - bits
            m, m_prime = _decide(lower, upper, n, numer << shift, (numer + 1) << shift)
            if m_prime < n:
                break
            n *= 2
        if m == m_prime:
            return m


def add_skellam_noise(k: list[np.ndarray], mu: float, stream: NoiseStream) -> list[np.ndarray]:
    """``k_i + Sk(mu)`` per coordinate of each int64 array; the noise depends on the shapes only.

    Parameters
    ----------
    k : list of numpy.ndarray
        Integer arrays (points of the grid).
    mu : float
        The variance of each coordinate's noise.
    stream : NoiseStream
        The random bytes.

    Returns
    -------
    list of numpy.ndarray
        The noisy int64 arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
    >>> add_skellam_noise([np.array([10, -3])], 4.0, NoiseStream.from_seed("doc"))
    [array([ 9, -2])]
    """
    mu = _check_mu(mu)
    out = []
    for index, arr in enumerate(k):
        arr = np.asarray(arr)
        if not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"k[{index}] must be an integer array (points of the grid). Found dtype {arr.dtype}.")
        noise = skellam_noise(mu, arr.size, stream).reshape(arr.shape)
        out.append(arr.astype(np.int64) + noise)
    return out
