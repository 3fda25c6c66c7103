"""The noise-like test of a released mean (``coordinator/signal_check.py``) against the chi
distribution: its threshold against closed forms, and its decisions on seeded means of pure noise and
of noise plus a signal, at the rates the chi and noncentral chi-squared distributions give."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from scipy import stats

from fedfilter.coordinator.signal_check import (
    CONSECUTIVE_ROUNDS,
    NOISE_LIKE_ALPHA,
    SignalWatch,
    is_noise_like,
    noise_like_norm,
    noise_like_probability,
)
from fedfilter.privacy.noise_norm import chi_mean

TRIALS = 20_000


def _binomial_ok(count: int, n: int, p: float, sds: float = 4.5) -> bool:
    """``count`` successes of ``n`` trials at rate ``p``, within ``sds`` standard deviations (a seeded draw)."""
    return abs(count - n * p) <= sds * math.sqrt(n * p * (1 - p)) + 1


@pytest.mark.parametrize("alpha", [0.001, 0.05])
def test_the_threshold_is_the_chi_quantile_in_closed_form(alpha):
    s = 0.7
    # d = 1: |N(0, s^2)| exceeds s * Phi^-1(1 - alpha / 2) with probability alpha.
    assert noise_like_norm(s * chi_mean(1), 1, alpha) == pytest.approx(s * stats.norm.ppf(1 - alpha / 2), rel=1e-9)
    # d = 2: the Rayleigh distribution, P(R > r) = exp(-r^2 / 2).
    assert noise_like_norm(s * chi_mean(2), 2, alpha) == pytest.approx(s * math.sqrt(-2 * math.log(alpha)), rel=1e-9)
    # Large d: the square root of the chi-squared quantile.
    d = 19_754
    assert noise_like_norm(s * chi_mean(d), d, alpha) == pytest.approx(s * math.sqrt(stats.chi2.ppf(1 - alpha, d)))


@pytest.mark.parametrize("alpha", [NOISE_LIKE_ALPHA, 0.05])
def test_means_of_pure_noise_are_called_noise_like_at_rate_one_minus_alpha(alpha):
    rng = np.random.default_rng(20261129)
    d, s = 200, 0.3
    expected = s * chi_mean(d)
    norms = np.linalg.norm(rng.normal(0.0, s, size=(TRIALS, d)), axis=1)
    called_signal = sum(not is_noise_like(float(n), expected, d, alpha) for n in norms)
    assert _binomial_ok(called_signal, TRIALS, alpha), (called_signal, TRIALS * alpha)


def test_means_with_signal_are_called_noise_like_at_the_noncentral_rate():
    rng = np.random.default_rng(7)
    d, s = 200, 0.3
    expected = s * chi_mean(d)
    # The signal the test detects half the time (the noncentral chi-squared median at the threshold),
    # and one twice as large, which it almost never misses.
    half = next(k * 0.01 for k in range(1, 10_000) if noise_like_probability(k * 0.01, s, d) < 0.5)
    for signal, lowest in ((half, None), (2 * half, 1e-9)):
        p = noise_like_probability(signal, s, d)
        if lowest is not None:
            assert p < lowest, p
        direction = rng.normal(size=d)
        mean_signal = signal * direction / np.linalg.norm(direction)
        norms = np.linalg.norm(mean_signal + rng.normal(0.0, s, size=(TRIALS, d)), axis=1)
        called_noise = sum(is_noise_like(float(n), expected, d) for n in norms)
        assert _binomial_ok(called_noise, TRIALS, p), (signal, called_noise, TRIALS * p)


def test_no_signal_is_the_central_rate_and_the_rate_falls_with_the_signal():
    d, s = 19_754, 1.0
    assert noise_like_probability(0.0, s, d) == pytest.approx(1 - NOISE_LIKE_ALPHA, abs=1e-12)
    rates = [noise_like_probability(k * d**0.25, s, d) for k in (1.0, 2.1, 4.2)]
    assert rates[0] > rates[1] > rates[2]
    assert rates[1] == pytest.approx(0.5, abs=0.01) and rates[2] < 1e-6  # the module docstring's figures


def test_the_warning_comes_after_three_noise_like_rounds_in_a_row_once_per_streak():
    watch = SignalWatch()
    assert watch.rounds == CONSECUTIVE_ROUNDS == 3
    seen = [watch.observe(x) for x in (True, True, False, True, True, True, True, False, True, True, True)]
    assert [i for i, warn in enumerate(seen) if warn] == [5, 10]


def test_a_pure_noise_run_is_warned_about_at_the_stated_rate():
    # Three released rounds of pure noise: warned with probability (1 - alpha)^3 (independent noise).
    rng = np.random.default_rng(11)
    d, s, runs = 100, 1.0, 4_000
    expected = s * chi_mean(d)
    alpha = 0.05  # large enough for the rate of runs left unwarned to be measured
    warned = 0
    for _ in range(runs):
        watch = SignalWatch()
        norms = np.linalg.norm(rng.normal(0.0, s, size=(3, d)), axis=1)
        warned += any(watch.observe(is_noise_like(float(n), expected, d, alpha)) for n in norms)
    assert _binomial_ok(warned, runs, (1 - alpha) ** 3), (warned, runs * (1 - alpha) ** 3)


@pytest.mark.parametrize(
    ("args", "named"),
    [
        ((1.0, 0), "dim must be an integer >= 1. Found 0."),
        ((-1.0, 10), "expected_noise_norm must be a finite number >= 0. Found -1.0."),
        ((float("nan"), 10), "expected_noise_norm must be a finite number >= 0. Found nan."),
        ((1.0, 10, 1.5), "alpha must be a float in (0, 1). Found 1.5."),
    ],
)
def test_bad_input_is_named(args, named):
    with pytest.raises(ValueError, match=re.escape(named)):
        noise_like_norm(*args)


def test_bad_noise_or_signal_is_named():
    with pytest.raises(ValueError, match=re.escape("noise_std must be a finite number > 0. Found -1.0.")):
        noise_like_probability(1.0, -1.0, 5)
    with pytest.raises(ValueError, match=re.escape("signal_norm must be a finite number >= 0. Found -2.0.")):
        noise_like_probability(-2.0, 1.0, 5)
