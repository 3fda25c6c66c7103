"""The device's coin: Rényi curves of Poisson-subsampled releases against independent references.

- the sampled Gaussian against the defining integral, integrated by mpmath at 40 digits (both
  directions of the neighbouring pair), and against dp_accounting's curve;
- Zhu and Wang's general bound against the theorem's formula evaluated again in mpmath, and above the
  exact sampled Gaussian when fed the Gaussian curve;
- the subsampled Skellam bound above the exact divergence of a one-coordinate Poisson mixture of
  Skellam laws, summed from scipy's own Skellam pmf;
- the allowance (admitted, largest, constant work) and the edge cases.
"""

from __future__ import annotations

import math

import mpmath as mp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.special import logsumexp
from scipy.stats import skellam

from fedfilter.privacy import subsampled as sub
from fedfilter.privacy.subsampled import (
    SUBSAMPLED_ORDERS,
    sampled_gaussian_allowance,
    sampled_gaussian_charge,
    sampled_gaussian_rdp,
    skellam_curve,
    subsampled_rdp_bound,
    subsampled_skellam_rdp,
)


def mp_sampled_gaussian(q: float, sigma: float, alpha: float, reverse: bool = False) -> mp.mpf:
    """``D_alpha`` between ``(1-q) N(0, s^2) + q N(1, s^2)`` and ``N(0, s^2)`` (``reverse``: the other
    way round), by integrating its definition at 40 digits."""
    with mp.workdps(40):
        q, s, a = mp.mpf(q), mp.mpf(sigma), mp.mpf(alpha)

        def log_ratio(x):  # log(P/Q), P the mixture, Q = N(0, s^2)
            return mp.log((1 - q) + q * mp.exp((2 * x - 1) / (2 * s * s)))

        def integrand(x):
            log_q = -x * x / (2 * s * s) - mp.log(s * mp.sqrt(2 * mp.pi))
            if reverse:  # E_P[(Q/P)^a] = int Q^a P^(1-a)
                return mp.exp(log_q + (1 - a) * log_ratio(x))
            return mp.exp(log_q + a * log_ratio(x))  # E_Q[(P/Q)^a]

        points = sorted({-40 * s, -10 * s, mp.mpf(0), mp.mpf(0.5), mp.mpf(1), a, a + 10 * s, a + 40 * s})
        total = mp.quad(integrand, [-mp.inf, *points, mp.inf])
        return mp.log(total) / (a - 1)


GAUSSIAN_CASES = [
    (0.01, 1.1, 10),
    (0.01, 1.1, 10.6),
    (0.01, 1.1, 3.8),
    (0.05, 2.0, 8),
    (0.2, 0.8, 2),
    (0.2, 0.8, 2.5),
    (0.5, 1.0, 16.3),
    (0.9, 3.0, 32),
    (0.001, 0.7, 24.7),
    (0.3, 5.0, 4.1),
]


@pytest.mark.parametrize(("q", "z", "alpha"), GAUSSIAN_CASES)
def test_sampled_gaussian_is_the_integral_rounded_up(q, z, alpha):
    ours = float(sampled_gaussian_rdp(q, 1 / z, alpha))
    exact = mp_sampled_gaussian(q, z, alpha)
    assert ours >= exact
    # exact at integer orders; at fractional ones the series' tail is bounded, not summed
    slack = 1e-9 if float(alpha).is_integer() else 1e-6
    assert ours - exact <= slack * exact + 1e-15
    # the other direction of the neighbouring pair is never larger (Mironov, Talwar and Zhang 2019)
    assert mp_sampled_gaussian(q, z, alpha, reverse=True) <= ours


@pytest.mark.parametrize(("q", "z", "alpha"), [(0.99, 1000.0, 4.5), (0.9, 100.0, 10.5), (0.7, 300.0, 2.5)])
def test_rates_above_one_half_with_little_signal_stay_above_the_integral(q, z, alpha):
    """There ``z0`` lies far below 0 and the second series' tail would start past the terms summed, so
    the noise is capped (charged as a larger norm): still above the exact value, never above the
    unsampled Gaussian."""
    ours = float(sampled_gaussian_rdp(q, 1 / z, alpha))
    assert mp_sampled_gaussian(q, z, alpha) <= ours <= alpha / (2 * z * z) * (1 + 1e-12)


def test_sampled_gaussian_against_dp_accounting_on_its_orders():
    """The same sum at integer orders; at fractional ones dp_accounting adds every term of the series
    by its magnitude (dropping the signs past alpha), an upper bound that ours never exceeds."""
    from dp_accounting.rdp.rdp_privacy_accountant import _compute_rdp_poisson_subsampled_gaussian

    orders = [a for a in SUBSAMPLED_ORDERS if a <= 64][::7]
    for q, z in [(0.01, 1.1), (0.004, 0.9), (0.1, 2.5), (0.5, 1.0), (0.02, 8.0)]:
        theirs = _compute_rdp_poisson_subsampled_gaussian(q, z, orders)
        ours = np.array([float(sampled_gaussian_rdp(q, 1 / z, sub._as_order(a))) for a in orders])
        whole = np.array([float(a).is_integer() for a in orders]) & np.isfinite(theirs)
        assert np.all(np.abs(ours[whole] - theirs[whole]) <= 1e-9 * theirs[whole] + 1e-14), (q, z)
        assert np.all(ours[np.isfinite(theirs)] <= theirs[np.isfinite(theirs)] * (1 + 1e-9) + 1e-14), (q, z)


def test_sampled_gaussian_ends():
    assert float(sampled_gaussian_rdp(0.0, 3.0, 8)) == 0.0
    assert float(sampled_gaussian_rdp(0.3, 0.0, 8.5)) == 0.0
    for alpha in (8, 8.5):
        whole = float(sampled_gaussian_rdp(1.0, 0.5, alpha))
        assert alpha * 0.25 / 2 <= whole <= alpha * 0.25 / 2 * (1 + 1e-12)
    rows = sampled_gaussian_rdp(np.array([0.01, 0.1, 1.0]), np.array([[0.5], [1.0]]), 10.6)
    assert rows.shape == (2, 3)
    assert rows[0, 0] == float(sampled_gaussian_rdp(0.01, 0.5, 10.6))


@pytest.mark.parametrize("alpha", [10, 10.6])
def test_a_charge_whose_loss_overflows_fails_closed(alpha):
    """At a norm over 1e154 of the noise std, ``mu * mu`` overflows and the series is not a number; the
    charge is then infinite (no filter admits it), never the 0 a NaN compared below 0 would give."""
    from fedfilter.privacy.filters import make_filter

    filt = make_filter("rdp", 1.0, 1e-5, [alpha])
    charge = sampled_gaussian_charge(filt, rate=0.5, sensitivity=1.0, noise_std=1e-200)
    assert np.all(charge == np.inf)
    assert float(sampled_gaussian_charge(filt, rate=0.0, sensitivity=1.0, noise_std=1e-200)[0]) == 0.0


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((1.5, 1.0, 8), "rate"),
        ((-0.1, 1.0, 8), "rate"),
        ((0.1, -1.0, 8), "mu"),
        ((0.1, math.nan, 8), "mu"),
        ((0.1, 1.0, 1.5), "alpha"),
        ((0.1, 1.0, 300), "alpha"),
        ((0.1, 1.0, True), "alpha"),
    ],
)
def test_bad_input_is_named(args, field):
    with pytest.raises(ValueError, match=field):
        sampled_gaussian_rdp(*args)


@settings(max_examples=60, deadline=None)
@given(
    q=st.floats(1e-4, 1.0),
    mu=st.floats(0.0, 3.0),
    grow=st.floats(1.0, 2.0),
    alpha=st.sampled_from([2, 3, 4.5, 7, 10.6, 31.2, 64]),
)
def test_sampled_gaussian_grows_with_the_norm_and_the_rate(q, mu, grow, alpha):
    base = float(sampled_gaussian_rdp(q, mu, alpha))  # within 1e-13 (the rounding margins' scale)
    assert float(sampled_gaussian_rdp(q, mu * grow, alpha)) >= base * (1 - 1e-9) - 1e-13
    assert float(sampled_gaussian_rdp(min(1.0, q * grow), mu, alpha)) >= base * (1 - 1e-9) - 1e-13
    assert base <= alpha * mu * mu / 2 * (1 + 1e-12) + 1e-300  # never above the unsampled Gaussian


def mp_zhu_wang(q: float, base: list[float], alpha: int) -> mp.mpf:
    """Zhu and Wang 2019, Theorem 6, evaluated term by term in mpmath."""
    with mp.workdps(40):
        q = mp.mpf(q)
        total = (1 - q) ** (alpha - 1) * (1 + (alpha - 1) * q)
        total += mp.binomial(alpha, 2) * q**2 * (1 - q) ** (alpha - 2) * mp.exp(base[0])
        for ell in range(3, alpha + 1):
            total += 3 * mp.binomial(alpha, ell) * q**ell * (1 - q) ** (alpha - ell) * mp.exp((ell - 1) * base[ell - 2])
        return min(mp.log(total) / (alpha - 1), mp.mpf(base[-1]))


@pytest.mark.parametrize("alpha", [2, 3, 8, 17, 64])
@pytest.mark.parametrize("q", [0.001, 0.05, 0.5, 0.99])
def test_zhu_wang_bound_is_the_theorem(q, alpha):
    base = [ell * 0.7**2 / 2 + 0.01 * ell**0.5 for ell in range(2, alpha + 1)]
    ours = float(subsampled_rdp_bound(q, base, alpha))
    ref = mp_zhu_wang(q, base, alpha)
    assert ref <= ours <= ref * (1 + 1e-9) + 1e-14


@pytest.mark.parametrize(("q", "z", "alpha"), [(0.01, 1.1, 10), (0.05, 2.0, 8), (0.5, 1.0, 16), (0.2, 0.8, 2)])
def test_zhu_wang_bound_lies_above_the_exact_sampled_gaussian(q, z, alpha):
    """Fed the Gaussian curve, a valid general bound cannot fall below the exact value, and Theorem 6
    says it is within log(3) / (alpha - 1) of it."""
    base = [ell / (2 * z * z) for ell in range(2, alpha + 1)]
    general = float(subsampled_rdp_bound(q, base, alpha))
    exact = float(mp_sampled_gaussian(q, z, alpha))
    assert exact <= general <= exact + math.log(3) / (alpha - 1) + 1e-12


def test_zhu_wang_bound_ends_and_shapes():
    base = [ell * 0.5 for ell in range(2, 9)]
    assert float(subsampled_rdp_bound(1.0, base, 8)) == pytest.approx(base[-1], rel=1e-12)
    assert float(subsampled_rdp_bound(0.0, base, 8)) == 0.0
    with pytest.raises(ValueError, match="base_rdp"):
        subsampled_rdp_bound(0.1, base[:-1], 8)
    with pytest.raises(ValueError, match="base_rdp"):
        subsampled_rdp_bound(0.1, [*base[:-1], -1.0], 8)
    rows = subsampled_rdp_bound(np.array([0.01, 0.1]), np.array([base, base]), 8)
    assert rows.shape == (2,)


def exact_subsampled_skellam(q: float, k: int, mu: float, alpha: float) -> float:
    """``D_alpha`` between ``(1-q) Sk(mu) + q (k + Sk(mu))`` and ``Sk(mu)``, both directions, the larger,
    summed over the integers from scipy's Skellam pmf (``Sk(mu)``: variance mu, Poisson(mu/2) each side)."""
    width = int(k + 60 * math.sqrt(mu) + 60)
    x = np.arange(-width, width + 1)
    log_q = skellam.logpmf(x, mu / 2, mu / 2)
    log_p = (
        np.logaddexp(math.log1p(-q) + log_q, math.log(q) + skellam.logpmf(x - k, mu / 2, mu / 2))
        if q < 1
        else skellam.logpmf(x - k, mu / 2, mu / 2)
    )
    ok = np.isfinite(log_q) & np.isfinite(log_p)
    forward = logsumexp(alpha * log_p[ok] + (1 - alpha) * log_q[ok]) / (alpha - 1)
    backward = logsumexp(alpha * log_q[ok] + (1 - alpha) * log_p[ok]) / (alpha - 1)
    return max(forward, backward)


@pytest.mark.parametrize("alpha", [2, 3, 5, 8.5, 16])
@pytest.mark.parametrize(
    ("q", "k", "mu"), [(0.01, 1, 10.0), (0.1, 3, 50.0), (0.5, 10, 400.0), (0.9, 2, 20.0), (0.05, 30, 900.0)]
)
def test_subsampled_skellam_bound_holds_on_one_coordinate(q, k, mu, alpha):
    exact = exact_subsampled_skellam(q, k, mu, alpha)
    ours = float(subsampled_skellam_rdp(q, float(k), float(k), mu, alpha))
    assert exact <= ours
    assert float(subsampled_skellam_rdp(q, 0.0, 0.0, mu, alpha)) == 0.0


def test_skellam_curve_is_the_closed_form_per_order():
    from fedfilter.privacy.skellam_curve import skellam_rdp_bound

    curve = skellam_curve(7.0, 5.0, 80.0, 12)
    for ell, value in zip(range(2, 13), curve):
        assert skellam_rdp_bound(7.0, 5.0, 80.0, ell) <= value <= skellam_rdp_bound(7.0, 5.0, 80.0, ell) * (1 + 1e-12)


def test_allowance_is_admitted_and_largest():
    rooms = np.array([0.0, 1e-6, 2e-4, 1e-3, 1.0])
    s = sampled_gaussian_allowance(rooms, rate=0.02, noise_std=1.5, alpha=10.6, max_norm=1.0)
    loss = sampled_gaussian_rdp(0.02, s / 1.5, 10.6)
    assert np.all(loss <= rooms)
    assert s[0] == 0.0 and s[-1] == 1.0
    above = sampled_gaussian_rdp(0.02, np.minimum(s * (1 + 1e-9) + 1e-12, 1.0) / 1.5, 10.6)
    assert np.all((above > rooms) | (s == 1.0))


def test_allowance_does_the_same_work_whatever_the_room(monkeypatch):
    calls = []
    real = sub.sampled_gaussian_rdp

    def counting(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(sub, "sampled_gaussian_rdp", counting)
    counts = []
    for room in (0.0, 1e-5, 1.0):
        calls.clear()
        sampled_gaussian_allowance(room, rate=0.02, noise_std=1.5, alpha=8, max_norm=1.0)
        counts.append(len(calls))
    assert counts == [sub.ALLOWANCE_STEPS + 1] * 3


def test_order_for_rate_is_the_best_of_the_grid():
    eps, delta, q, z = 2.0, 1e-5, 0.02, 1.0
    chosen = sub.order_for_rate(eps, delta, rate=q, noise_multiplier=z)
    from fedfilter.privacy.renyi import rdp_budgets

    def share(a):
        return rdp_budgets([float(a)], eps, delta)[0] / float(sampled_gaussian_rdp(q, 1 / z, sub._as_order(a)))

    best = share(chosen)
    assert all(share(a) <= best for a in SUBSAMPLED_ORDERS[::5])
    with pytest.raises(ValueError, match="rate"):
        sub.order_for_rate(eps, delta, rate=0.0, noise_multiplier=z)


@pytest.mark.parametrize(("q", "mu"), [(0.01, 1 / 1.1), (0.3, 2.0), (1.0, 0.5), (0.0, 1.0), (0.2, 0.0)])
def test_the_order_searchs_fast_path_is_the_one_order_curve(q, mu):
    orders = np.arange(2, 257)
    fast = sub._integer_orders_rdp(q, mu, orders)
    each = np.array([float(sampled_gaussian_rdp(q, mu, int(a))) for a in orders])
    assert np.allclose(fast, each, rtol=1e-11, atol=1e-300)
