"""Exact Skellam sampler: its CDF bounds against mpmath's Bessel functions, its samples against scipy's
Skellam distribution, its exact path on intervals the fast path cannot decide, its tails, and its input
checks. References are independent of the sampler's own recurrence: mpmath ``besseli`` and
``scipy.stats.skellam`` (which goes through the noncentral chi-square)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy.stats import chi2, skellam

from fedfilter.client.mechanisms import skellam_noise as sn
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, rounded_gaussian

MUS = [0.5, 3.0, 50.0, 1e4, 1e7]


class WordStream:
    """A stand-in for ``NoiseStream`` that returns the given 64-bit words, then fresh random ones."""

    def __init__(self, words, seed=0):
        self.words = [int(w) for w in words]
        self.rng = np.random.default_rng(seed)

    def uint64(self, n):
        out = [self.words.pop(0) if self.words else int(self.rng.integers(0, 2**64, dtype=np.uint64)) for _ in range(n)]
        return np.array(out, dtype=np.uint64)


def _pmf_mp(mu, y):
    return mpmath.exp(-mpmath.mpf(mu)) * mpmath.besseli(y, mpmath.mpf(mu))


def _tail_mp(mu, j):
    """``S(j) = P(Sk(mu) >= j)`` in mpmath: ``(1 - q(0)) / 2 - sum_{0<y<j} q(y)`` for small ``j``, the
    direct sum of the tail (until the terms are negligible) for large ``j``."""
    if j <= 0:
        return (1 + _pmf_mp(mu, 0)) / 2
    if j < 30:
        return (1 - _pmf_mp(mu, 0)) / 2 - mpmath.fsum(_pmf_mp(mu, y) for y in range(1, j))
    total, y = mpmath.mpf(0), j
    while True:
        term = _pmf_mp(mu, y)
        total += term
        if term < total * mpmath.mpf(2) ** -200:
            return total
        y += 1


def _brackets_pmf(lower, upper, prec, mu, js):
    """Whether every ``q(j) = S(j) - S(j+1)`` lies between what the bounds allow."""
    scale = mpmath.mpf(2) ** prec
    for j in js:
        q = _pmf_mp(mu, j) * scale
        if not (lower[j] - upper[j + 1] <= q <= upper[j] - lower[j + 1]):
            return False
    return True


@pytest.mark.parametrize("mu", MUS)
def test_integer_bounds_bracket_bessel_pmf_and_are_tight(mu):
    mpmath.mp.dps = 80
    n = sn._table_size(mu, 66 * math.log(2) + math.log1p(mu))
    lower, upper = sn._tail_bounds(mu, n, 192)
    sd = math.sqrt(mu)
    far = n - 2 if mu <= 1e4 else int(8 * sd)  # mpmath's besseli does not converge at (35198, 1e7)
    js = sorted({0, 1, 2, int(sd), int(2 * sd), int(5 * sd), far})
    assert _brackets_pmf(lower, upper, 192, mu, js)
    s1 = _tail_mp(mu, 1) * mpmath.mpf(2) ** 192
    assert lower[1] <= s1 <= upper[1]
    assert all(lo <= hi for lo, hi in zip(lower, upper, strict=True))
    # Tight: every width far below the 2**-64 of a stream word (the slack is the tail bound beyond n).
    assert all(hi - lo < 2 ** (192 - 80) for lo, hi in zip(lower, upper, strict=True))


def test_an_off_by_one_table_is_caught():
    mpmath.mp.dps = 50
    lower, upper = sn._tail_bounds(50.0, 90, 192)
    js = [0, 1, 3, 7, 20]
    assert _brackets_pmf(lower, upper, 192, 50.0, js)
    assert not _brackets_pmf(lower[1:], upper[1:], 192, 50.0, js)
    assert not _brackets_pmf([0] + lower, [0] + upper, 192, 50.0, js)


def _chi_square_pvalue(samples, mu):
    """Pearson's test of the samples against scipy's Skellam(mu/2, mu/2), bins of expected count >= 50."""
    ref = skellam(mu / 2, mu / 2)
    n = samples.size
    sd = math.sqrt(mu)
    step = max(1, int(sd / 8))
    edges = np.arange(-int(8 * sd) - 12, int(8 * sd) + 13, step)  # bin i: (edges[i], edges[i+1]]
    cdf = ref.cdf(edges)
    keep = [0]
    for i in range(1, len(edges)):  # merge bins until each holds >= 50 expected samples
        if (cdf[i] - cdf[keep[-1]]) * n >= 50:
            keep.append(i)
    e = edges[keep]
    expected = np.diff(np.concatenate([[0.0], ref.cdf(e[1:-1]), [1.0]])) * n
    counts = np.histogram(samples, bins=np.concatenate([[-np.inf], e[1:-1] + 0.5, [np.inf]]))[0]
    stat = float(np.sum((counts - expected) ** 2 / expected))
    return float(chi2.sf(stat, len(expected) - 1))


@pytest.mark.parametrize("mu", MUS)
def test_samples_follow_skellam_mean_variance_and_chi_square(mu):
    size = 200_000
    x = sn.skellam_noise(mu, size, NoiseStream.from_seed("skellam-test", mu))
    assert x.dtype == np.int64 and x.shape == (size,)
    assert abs(x.mean()) < 5 * math.sqrt(mu / size)
    # var of the sample variance: (mu_4 - mu^2) / n with mu_4 = 3 mu^2 + mu (Skellam excess kurtosis 1/mu).
    assert abs(x.var() - mu) < 5 * math.sqrt((2 * mu * mu + mu) / size)
    assert _chi_square_pvalue(x, mu) > 1e-4


@pytest.mark.parametrize("mu", [3.0, 50.0])
def test_chi_square_rejects_a_table_shifted_by_one(mu, monkeypatch):
    low, high, n = sn._fast_table(mu)
    monkeypatch.setattr(sn, "_fast_table", lambda _mu: (low[:-1], high[:-1], n - 1))  # S(j+1) taken for S(j)
    x = sn.skellam_noise(mu, 200_000, NoiseStream.from_seed("shifted", mu))
    assert _chi_square_pvalue(x, mu) < 1e-6


def _word_below(s):
    """The first word ``w`` with ``S`` in ``(w, w + 1) * 2**-64`` (an interval the fast path cannot decide)."""
    return int(mpmath.floor(s * mpmath.mpf(2) ** 64))


@pytest.mark.parametrize("mu", [0.5, 3.0, 50.0, 1e4])
@pytest.mark.parametrize("j", [1, 2, 5])
def test_exact_path_decides_intervals_holding_a_cell_boundary(mu, j):
    mpmath.mp.dps = 80
    s = _tail_mp(mu, j)
    w = _word_below(s)
    assert 0 < w < 2**63
    for second, sign_word in [(0, False), (2**64 - 1, False), (0, True), (2**64 - 1, True)]:
        p_lo = (mpmath.mpf(w) * 2**64 + second) / mpmath.mpf(2) ** 128
        p_hi = p_lo + mpmath.mpf(2) ** -128
        assert p_hi < s or p_lo > s  # the second word decides against the mpmath boundary
        expected = j if p_hi <= s else j - 1  # S(j+1) < p <= S(j) gives m = j
        first = (2**64 - 1 - w) if sign_word else w  # ~w: U > 1/2, the same p, a positive sample
        x = sn.skellam_noise(mu, 1, WordStream([first, second]))
        assert int(x[0]) == (expected if sign_word else -expected)


@pytest.mark.parametrize(("mu", "count"), [(3.0, 60), (1e4, 60), (1e7, 6)])  # the exact path: ~1 s at 1e7
def test_fast_path_agrees_with_exact_path(mu, count):
    rng = np.random.default_rng(7)
    words = [int(w) for w in rng.integers(0, 2**63, size=count, dtype=np.uint64)]
    fast = sn.skellam_noise(mu, len(words), WordStream(words))
    for w, f in zip(words, fast, strict=True):
        assert sn._exact_magnitude(mu, w, WordStream([], seed=w)) == -int(f)


@pytest.mark.parametrize("mu", [0.5, 3.0, 50.0])
def test_far_tails_come_from_the_exact_path(mu):
    mpmath.mp.dps = 80
    # First word 0 (U < 2**-64) or 2**64 - 1 (1 - U < 2**-64), then 2**62: p in (2**-66, 2**-66 + 2**-128).
    lo = sn.skellam_noise(mu, 1, WordStream([0, 2**62]))[0]
    hi = sn.skellam_noise(mu, 1, WordStream([2**64 - 1, 2**62]))[0]
    assert hi == -lo > 0
    m = int(hi)
    p = mpmath.mpf(2) ** -66
    assert _tail_mp(mu, m + 1) < p and p + mpmath.mpf(2) ** -128 <= _tail_mp(mu, m)


def test_reproducible_from_seed_and_different_across_seeds():
    a = sn.skellam_noise(1e4, 1000, NoiseStream.from_seed("r", 1))
    b = sn.skellam_noise(1e4, 1000, NoiseStream.from_seed("r", 1))
    c = sn.skellam_noise(1e4, 1000, NoiseStream.from_seed("r", 2))
    assert np.array_equal(a, b) and not np.array_equal(a, c)


def test_add_skellam_noise_only_shifts_the_data():
    shapes = [(3, 4), (7,), (0,)]
    k1 = [np.zeros(s, dtype=np.int64) for s in shapes]
    k2 = [np.arange(np.prod(s), dtype=np.int64).reshape(s) * 1000 - 5 for s in shapes]
    out1 = sn.add_skellam_noise(k1, 50.0, NoiseStream.from_seed("add", 1))
    out2 = sn.add_skellam_noise(k2, 50.0, NoiseStream.from_seed("add", 1))
    for a, b, k in zip(out1, out2, k2, strict=True):
        assert a.dtype == np.int64 and b.shape == k.shape
        assert np.array_equal(b - k, a)  # the same noise whatever the data
    flat = sn.skellam_noise(50.0, 19, NoiseStream.from_seed("add", 1))
    assert np.array_equal(np.concatenate([a.ravel() for a in out1]), flat)


@pytest.mark.parametrize("bad", [0.0, -1.0, math.nan, math.inf, -math.inf, 2.0**32 * 2, 1e300, "3", True])
def test_bad_mu_is_refused_naming_mu(bad):
    with pytest.raises(ValueError, match=r"mu .*Found"):
        sn.skellam_noise(bad, 10, NoiseStream.from_seed("bad"))
    with pytest.raises(ValueError, match=r"mu .*Found"):
        sn.add_skellam_noise([np.zeros(3, dtype=np.int64)], bad, NoiseStream.from_seed("bad"))


def test_float_data_is_refused():
    with pytest.raises(ValueError, match=r"k\[0\].*float64"):
        sn.add_skellam_noise([np.zeros(3)], 3.0, NoiseStream.from_seed("bad"))


def test_speed_is_within_a_few_times_the_rounded_gaussian():
    size = 10**6
    sn._fast_table(1e7)  # the table is built once per mu (cached)
    import time

    start = time.perf_counter()
    sn.skellam_noise(1e7, size, NoiseStream.from_seed("speed"))
    skellam_s = time.perf_counter() - start
    start = time.perf_counter()
    rounded_gaussian(math.sqrt(1e7), size, NoiseStream.from_seed("speed"))
    gaussian_s = time.perf_counter() - start
    assert skellam_s < 10 * gaussian_s  # loose (a shared machine); the benchmark reports the ratio


def test_benchmark_prints_a_ratio_per_mu():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    args = ["--mus", "3", "50", "--size", "2000", "--repeats", "1"]
    proc = subprocess.run(
        [sys.executable, str(root / "benchmarks/skellam_speed.py"), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = [line.split() for line in proc.stdout.splitlines()[1:]]
    assert [row[0] for row in rows] == ["3", "50"]
    assert all(float(row[4]) > 0 and row[5] == "0" for row in rows)  # a ratio; no exact path at this size
