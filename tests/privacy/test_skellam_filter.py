"""Skellam releases charged to the rdp filter against independent references.

The reference is ``skellam_rdp_exact`` (the exact divergence, itself checked at 50 digits in
test_skellam.py) and the (epsilon, delta) conversion at the single order alpha* where Feldman & Zrnic (2021)
Theorem 4.3 holds for the filter's one-number state.
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.privacy import renyi
from fedfilter.privacy.filters import make_filter, rdp_filter, rdp_order
from fedfilter.privacy.skellam import (
    integer_norms,
    l1_cap,
    l2_up,
    skellam_charge,
    skellam_rdp_bound,
    skellam_rdp_exact,
    skellam_rho,
)


def norms(k):
    l1, l2sq = integer_norms([np.asarray(k)])
    return l1, l2_up(l2sq)


# --- norms and the L1 cap ---------------------------------------------------------------------------


def test_integer_norms_are_exact_for_one_device_and_per_row():
    layers = [np.array([[3, -4], [0, 1]]), np.array([-2]), np.array([], dtype=np.int64)]
    assert integer_norms(layers) == (10, 30)
    assert all(type(v) is int for v in integer_norms(layers))
    rows = np.array([[1, -2, 3], [0, 0, 0], [5, 0, -5]])
    l1, l2sq = integer_norms(rows)
    assert l1.tolist() == [6, 0, 10] and l2sq.tolist() == [14, 0, 50]
    big = np.full(1000, 2**31, dtype=np.int64)  # 1000 * 2**62 overflows int64: refused, not wrapped
    with pytest.raises(ValueError, match="too large"):
        integer_norms([big])
    with pytest.raises(ValueError, match=r"k_arrays\[0\] must hold integers"):
        integer_norms([np.array([0.5])])


def test_l2_up_is_the_root_rounded_up():
    rng = np.random.default_rng(3)
    values = [0, 1, 2, 4, 14, 2**52 - 1, 2**60 + 7, (2**31) ** 2] + rng.integers(0, 2**40, 200).tolist()
    for n in values:
        r = l2_up(int(n))
        assert math.isqrt(int(n)) <= r and int(math.ceil(r)) ** 2 >= n
        assert Fraction(r) ** 2 >= n  # never below the exact root
        if math.isqrt(int(n)) ** 2 == n:
            assert r == math.isqrt(int(n))
    arr = np.array(values[:6] + values[8:], dtype=np.int64)
    assert np.array_equal(l2_up(arr), np.array([l2_up(int(v)) for v in arr]))


@settings(max_examples=300, deadline=None)
@given(k=st.lists(st.integers(-20, 20), min_size=1, max_size=12), extra_dim=st.integers(0, 5))
def test_l1_cap_bounds_every_integer_vector(k, extra_dim):
    l1, l2 = norms(k)
    assert l1_cap(l2, len(k) + extra_dim) >= l1
    assert l1_cap(0.0, 5) == 0.0
    cap = l1_cap(np.array([0.5, 1.0, 3.0, 3.0]), np.array([10**7, 10**7, 10**7, 4]))
    exact = np.array([0.5, 1.0, 9.0, 6.0])  # max(l2, min(sqrt(dim) l2, l2^2))
    assert np.all(cap >= exact) and np.all(cap <= exact * (1 + 1e-15))


# --- the charge at an order against the exact divergence ---------------------------------------------


@pytest.mark.parametrize("mu", [0.5, 3.0, 40.0, 700.0])
@pytest.mark.parametrize("alpha", [1.1, 1.5, 2.0, 2.5, 3.9, 10.3, 18.0])
def test_rho_is_never_below_the_exact_divergence(mu, alpha):
    rng = np.random.default_rng(int(mu * 10 + alpha * 100))
    for _ in range(6):
        k = rng.integers(-4, 5, size=int(rng.integers(1, 5)))
        if not np.any(k):
            k[0] = 1
        l1, l2 = norms(k)
        rho = float(skellam_rho(l1, l2, mu, alpha))
        assert rho >= skellam_rdp_exact(k, mu, alpha) / alpha  # the exact divergence at alpha itself
        # Between integer orders the convexity bound is never above the ceil rule.
        assert rho * alpha <= skellam_rdp_bound(l1, l2, mu, alpha) * (1 + 1e-12)


def test_rho_is_zero_exactly_without_data_and_vectorised():
    assert skellam_rho(0.0, 0.0, 5.0, 3.0) == 0.0
    l1 = np.array([0.0, 3.0, 10.0])
    l2 = np.array([0.0, math.sqrt(3.0), 4.0])
    mu = np.array([[1.0], [100.0]])  # broadcasts to (2, 3)
    out = skellam_rho(l1, l2, mu, 2.5)
    assert out.shape == (2, 3) and np.all(out[:, 0] == 0) and np.all(out[:, 1:] > 0)
    assert out[1, 2] == skellam_rho(10.0, 4.0, 100.0, 2.5)
    with pytest.raises(ValueError, match="l2 <= l1"):
        skellam_rho(1.0, 2.0, 1.0, 2.0)
    with pytest.raises(ValueError, match="mu_total"):
        skellam_rho(1.0, 1.0, 0.0, 2.0)
    with pytest.raises(ValueError, match="alpha"):
        skellam_rho(1.0, 1.0, 1.0, 1.0)


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-5), (8.0, 1e-5), (0.3, 1e-5)])
def test_charge_tends_to_the_gaussian_charge_from_above(eps, delta):
    """With L1 fixed and mu growing the discreteness term vanishes: the charge decreases towards the
    Gaussian l2^2 / (2 mu) (exactly at an integer alpha*; within t(1-t)/(alpha(alpha-1)) between
    integers, the price of interpolating)."""
    filt = rdp_filter(eps, delta)
    a = rdp_order(filt)
    t = a - math.floor(a)
    limit = 1 + t * (1 - t) / (a * (a - 1))
    l1, l2 = 400.0, 20.0
    ratios = []
    for mu in (1e1, 1e2, 1e3, 1e4, 1e6, 1e8):
        gauss = float(filt.charge(sensitivity=l2, noise_std=math.sqrt(mu))[0])
        ratio = float(skellam_charge(filt, l1, l2, mu)[0]) / gauss
        assert ratio >= 1 - 1e-12
        ratios.append(ratio)
    assert all(x >= y for x, y in zip(ratios, ratios[1:]))
    assert ratios[-1] <= limit * (1 + 1e-5)
    if t == 0:
        assert ratios[-1] <= 1 + 1e-5


def test_gdp_and_zcdp_are_refused():
    for kind in ("gdp", "zcdp"):
        filt = make_filter(kind, 1.0, 1e-5)
        with pytest.raises(ValueError, match="filter='gdp'|filter='zcdp'") as err:
            skellam_charge(filt, 3.0, 2.0, 10.0)
        assert "Skellam releases need filter='rdp'" in str(err.value)
        with pytest.raises(ValueError, match=kind):
            rdp_order(filt)


def test_rdp_order_is_where_the_threshold_holds():
    for eps, delta in [(0.3, 1e-5), (1.0, 1e-8), (8.0, 1e-5), (1e-3, 1e-5)]:
        filt = rdp_filter(eps, delta)
        a = rdp_order(filt)
        rho = float(filt.budget[0])
        # alpha* rho* converts at alpha* alone (CKS 2020 Prop. 12, or the KL shortcut) to at most
        # epsilon, in exact arithmetic (50 digits); and no other order has a larger threshold.
        with mpmath.workdps(50):
            r, am, d = mpmath.mpf(a) * mpmath.mpf(rho), mpmath.mpf(a), mpmath.mpf(delta)
            converted = r + mpmath.log1p(-1 / am) - mpmath.log(d * am) / (am - 1)
            assert converted <= eps or (a == min(filt.orders) and r <= -mpmath.log1p(-d * d))
        others = renyi.rdp_budgets(filt.orders, eps, delta) / np.asarray(filt.orders)
        assert np.all(others <= rho * (1 + 1e-12))
        assert rdp_order(filt.scaled(0.25)) == a  # a run quota keeps its lifetime filter's order
    assert rdp_order(rdp_filter(1e-3, 1e-5)) == min(renyi.DEFAULT_ORDERS)  # the KL shortcut's order


# --- a whole filter run: Theorem 4.3 at alpha* against the exact divergences ---------------------------


@pytest.mark.parametrize("eps,delta,mu", [(1.0, 1e-5, 2000.0), (8.0, 1e-5, 150.0), (2.0, 1e-6, 400.0)])
def test_adaptive_skellam_run_stays_within_the_budget_at_alpha_star(eps, delta, mu):
    """Adaptive releases (random L1/L2 per round, a Gaussian one now and then, each chosen after
    seeing the state) until the filter refuses: the sum of the EXACT divergences at alpha* is within
    B_alpha*, and converts at alpha* to at most epsilon; epsilon_spent bounds it from above."""
    filt = rdp_filter(eps, delta)
    a = rdp_order(filt)
    b_alpha = float(renyi.rdp_budgets([a], eps, delta)[0])
    rng = np.random.default_rng(int(eps * 1000 + mu))
    state, exact_sum, releases, refused = filt.initial_state(), 0.0, 0, 0
    while refused < 5:
        room = float(filt.budget[0] - state[0])
        size = int(rng.integers(1, 6))
        top = 2 if room < 0.2 * float(filt.budget[0]) else 6  # adaptive: smaller vectors near the end
        if rng.random() < 0.2:  # a Gaussian release: alpha s^2 / (2 std^2) at every order
            s, std = float(rng.uniform(0.5, 3.0)), math.sqrt(mu)
            charge = filt.charge(sensitivity=s, noise_std=std)
            exact = a * s * s / (2 * std * std)
        else:
            k = rng.integers(-top, top + 1, size=size)
            l1, l2 = norms(k)
            charge = skellam_charge(filt, l1, l2, mu)
            exact = skellam_rdp_exact(k, mu, a)
        if not filt.admits(state, charge):
            refused += 1
            continue
        state = filt.spend(state, charge)
        exact_sum += exact
        releases += 1
    assert releases >= 5
    assert exact_sum <= b_alpha
    assert exact_sum >= 0.5 * b_alpha  # the run used most of its budget: the check has teeth
    assert renyi.epsilon_from_rdp([a], [exact_sum], delta) <= eps
    assert filt.epsilon_spent(state) >= renyi.epsilon_from_rdp([a], [exact_sum], delta) * (1 - 1e-12)
