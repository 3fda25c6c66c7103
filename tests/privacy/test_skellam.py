"""Skellam accounting (privacy/skellam.py) against independent references.

The exact divergence is checked against a brute-force sum of Bessel pmfs at 50 digits (mpmath),
the closed-form bound against the exact divergence (never below it), and the distributional facts
(sum of shares, product additivity) against scipy's pmfs.
"""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import skellam

from fedfilter.privacy.renyi import DEFAULT_ORDERS, epsilon_from_rdp
from fedfilter.privacy.skellam import (
    device_epsilon,
    device_rdp_curve,
    released_variance,
    skellam_log_pmf_table,
    skellam_rdp_bound,
    skellam_rdp_exact,
)


def _mp_divergence(k: int, mu: float, alpha: float, window: int = 160) -> float:
    """D_alpha(Sk(mu) + k || Sk(mu)) by a plain sum of exp(-mu) I_|x|(mu) at 50 digits; for mu <= 3
    the terms beyond |x| = 160 are below 1e-200 of the sum."""
    with mpmath.workdps(50):
        m, a = mpmath.mpf(mu), mpmath.mpf(alpha)

        def q(x: int):
            return mpmath.exp(-m) * mpmath.besseli(abs(x), m)

        total = mpmath.fsum(q(x - k) ** a * q(x) ** (1 - a) for x in range(-window, window + 1))
        return float(mpmath.log(total) / (a - 1))


@pytest.mark.parametrize("mu", [0.25, 1.0, 2.5])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("alpha", [1.1, 2.0, 3.7, 16.0])
def test_exact_matches_high_precision_brute_force(mu, k, alpha):
    assert skellam_rdp_exact([k], mu, alpha) == pytest.approx(_mp_divergence(k, mu, alpha), rel=1e-11, abs=1e-14)


@pytest.mark.parametrize("mu", [0.5, 7.3, 120.0, 3000.0])
def test_log_pmf_table_matches_scipy(mu):
    ys = np.arange(0, 60) if mu < 1000 else np.arange(0, 400, 7)
    ref = skellam.logpmf(ys, mu / 2, mu / 2)  # scipy's Sk(mu1, mu2) has variance mu1 + mu2
    ok = np.isfinite(ref) & (ref > -600)
    assert ok.sum() > 20
    np.testing.assert_allclose(skellam_log_pmf_table(mu, int(ys[-1]))[ys][ok], ref[ok], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(("k", "mu", "alpha", "width"), [(3, 2.0, 4.0, 8), (1, 0.5, 1.5, 3), (5, 3.0, 12.0, 60)])
def test_tail_bound_covers_the_left_out_terms(k, mu, alpha, width):
    # The proof in _tail_bounds, checked against the actual tail at 50 digits.
    from fedfilter.privacy.skellam import _tail_bounds

    log_bound = _tail_bounds(k, mu, alpha, right=width, left=width)
    assert math.isfinite(log_bound)
    with mpmath.workdps(50):
        m, a = mpmath.mpf(mu), mpmath.mpf(alpha)

        def f(x: int):
            q = lambda y: mpmath.exp(-m) * mpmath.besseli(abs(y), m)  # noqa: E731
            return q(x - k) ** a * q(x) ** (1 - a)

        tail = mpmath.fsum(f(x) for x in range(width + 1, 400)) + mpmath.fsum(f(x) for x in range(-400, -width))
        assert float(mpmath.log(tail)) <= log_bound


def test_exact_is_additive_over_coordinates_and_sign_free():
    mu, alpha = 3.0, 5.0
    parts = [skellam_rdp_exact([v], mu, alpha) for v in (2, 3, 0, 2)]
    assert skellam_rdp_exact([2, -3, 0, 2], mu, alpha) == pytest.approx(sum(parts), rel=1e-13)
    assert skellam_rdp_exact([-4], mu, alpha) == skellam_rdp_exact([4], mu, alpha)
    assert skellam_rdp_exact([0, 0], mu, alpha) == 0.0


def test_exact_is_reflection_symmetric():
    # D(Q + k || Q) = D(Q || Q + k) for the even pmf q: check the other direction by brute force.
    mu, k, alpha = 1.5, 2, 4.0
    with mpmath.workdps(40):

        def q(x: int):
            return mpmath.exp(-mpmath.mpf(mu)) * mpmath.besseli(abs(x), mpmath.mpf(mu))

        total = mpmath.fsum(q(x) ** alpha * q(x - k) ** (1 - alpha) for x in range(-150, 151))
        reverse = float(mpmath.log(total) / (alpha - 1))
    assert skellam_rdp_exact([k], mu, alpha) == pytest.approx(reverse, rel=1e-11)


@pytest.mark.parametrize(("a", "b"), [(0.7, 1.9), (4.0, 11.5), (30.0, 2.0)])
def test_sum_of_shares_is_skellam_with_added_variance(a, b):
    n = 200
    xs = np.arange(-n, n + 1)
    pa = skellam.pmf(xs, a / 2, a / 2)
    pb = skellam.pmf(xs, b / 2, b / 2)
    conv = np.convolve(pa, pb)  # support -2n..2n
    zs = np.arange(-2 * n, 2 * n + 1)
    central = np.abs(zs) <= n
    np.testing.assert_allclose(conv[central], skellam.pmf(zs[central], (a + b) / 2, (a + b) / 2), atol=1e-14)
    # and not the Skellam of any other variance
    assert np.max(np.abs(conv[central] - skellam.pmf(zs[central], (a + b) / 2 * 1.01, (a + b) / 2 * 1.01))) > 1e-5


_vectors = st.lists(st.integers(min_value=-12, max_value=12), min_size=1, max_size=4)
_mus = st.floats(min_value=0.2, max_value=3000.0, allow_nan=False)
_alphas = st.one_of(st.sampled_from(DEFAULT_ORDERS[:120]), st.floats(min_value=1.02, max_value=40.0))


def _l1_l2(k):
    arr = np.abs(np.asarray(k, dtype=np.float64))
    return float(arr.sum()), float(math.sqrt(float((arr**2).sum())))


@settings(max_examples=300, deadline=None)
@given(k=_vectors, mu=_mus, alpha=_alphas)
def test_bound_is_never_below_exact(k, mu, alpha):
    l1, l2 = _l1_l2(k)
    exact = skellam_rdp_exact(k, mu, alpha)
    assert skellam_rdp_bound(l1, l2, mu, alpha) >= exact


@settings(max_examples=20, deadline=None)  # tightness, not safety (the test above): 20 draws keep CI within its time
@given(k=_vectors, alpha=st.floats(min_value=1.5, max_value=32.0), spread=st.floats(min_value=1.0, max_value=20.0))
def test_bound_is_close_when_noise_dominates(k, alpha, spread):
    # The regime that matters: variance large against the shift and the order (mu >= 200 * each).
    l1, l2 = _l1_l2(k)
    if l1 == 0:
        return
    mu = 200.0 * spread * max(l1, l2 * l2, math.ceil(alpha))
    exact = skellam_rdp_exact(k, mu, alpha)
    bound = skellam_rdp_bound(l1, l2, mu, alpha)
    # ceil(alpha) costs at most a factor ceil(alpha)/alpha; the discreteness term adds <= 1%.
    assert bound <= exact * (math.ceil(alpha) / alpha) * 1.01 + 1e-15


@pytest.mark.parametrize("k", [[1], [3, -4], [7, 1, 1]])
def test_gaussian_limit(k):
    l1, l2 = _l1_l2(k)
    alpha = 6.0
    for mu in (1e4, 1e6):
        gaussian = alpha * l2 * l2 / (2 * mu)
        assert skellam_rdp_bound(l1, l2, mu, alpha) / gaussian == pytest.approx(1.0, abs=100 / mu)
        assert skellam_rdp_exact(k, mu, alpha) / gaussian == pytest.approx(1.0, abs=100 / mu)


def test_monotone_in_alpha_and_in_shift():
    mu = 4.0
    alphas = [1.1, 1.5, 2.0, 3.0, 8.0, 32.0, 128.0]
    for k in (1, 2, 6):
        exact = [skellam_rdp_exact([k], mu, a) for a in alphas]
        bound = [skellam_rdp_bound(k, k, mu, a) for a in alphas]
        assert all(x < y for x, y in zip(exact, exact[1:]))
        assert all(x <= y for x, y in zip(bound, bound[1:]))
    for alpha in (1.3, 2.0, 10.0):
        exact = [skellam_rdp_exact([k], mu, alpha) for k in range(0, 8)]
        bound = [skellam_rdp_bound(k, k, mu, alpha) for k in range(0, 8)]
        assert all(x < y for x, y in zip(exact, exact[1:]))
        assert all(x < y for x, y in zip(bound, bound[1:]))


def test_device_curve_is_the_bound_at_each_order_and_covers_exact():
    k = np.array([3, -1, 0, 2], dtype=np.int64)
    mu = 250.0
    curve = device_rdp_curve(k, mu)
    assert curve.shape == (len(DEFAULT_ORDERS),)
    l1, l2 = 6.0, math.sqrt(14.0)
    for i in (0, 9, 50, 100, 130, len(DEFAULT_ORDERS) - 1):
        a = DEFAULT_ORDERS[i]
        assert curve[i] >= skellam_rdp_bound(l1, l2, mu, a) * (1 - 1e-15)
        if a <= 64:
            assert curve[i] >= skellam_rdp_exact(k, mu, a)
    assert np.all(np.diff(curve) >= 0)


def test_device_epsilon_uses_the_rdp_conversion_and_falls_with_noise():
    k = [4, 4, -2]
    eps = [device_epsilon(k, mu, 1e-5) for mu in (50.0, 500.0, 5000.0)]
    assert eps[0] == epsilon_from_rdp(DEFAULT_ORDERS, device_rdp_curve(k, 50.0), 1e-5)
    assert eps[0] > eps[1] > eps[2] > 0


def test_released_variance_is_threshold_times_share_rounded_down():
    v = released_variance(0.1, 30)
    assert v <= 30 * 0.1 and v == pytest.approx(3.0)
    with pytest.raises(ValueError, match="threshold"):
        released_variance(1.0, 0)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: skellam_rdp_exact([1], 0.0, 2.0), "mu"),
        (lambda: skellam_rdp_exact([1], 1.0, 1.0), "alpha"),
        (lambda: skellam_rdp_exact([1.5], 1.0, 2.0), "k must hold integers"),
        (lambda: skellam_rdp_bound(1.0, 2.0, 1.0, 2.0), "l2 <= l1"),
        (lambda: skellam_rdp_bound(1.0, 1.0, -3.0, 2.0), "mu"),
        (lambda: device_rdp_curve([1], 1.0, orders=[1.0]), "order"),
    ],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_tail_bound_refuses_a_window_it_cannot_prove():
    from fedfilter.privacy.skellam import _tail_bounds

    # Here the terms past x = 14 still grow (ratio > 1): no geometric bound, so no claim.
    assert _tail_bounds(5, 3.0, 12.0, right=14, left=14) == math.inf
