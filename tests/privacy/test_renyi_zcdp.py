"""Rényi and zCDP conversions against Google's dp_accounting and the numbers printed in Feldman & Zrnic (2021)."""

import math

import mpmath
import pytest
from dp_accounting import dp_event
from dp_accounting.rdp import rdp_privacy_accountant as rdp_acc

from fedfilter.planning.rounds import plan_epsilon, plan_rounds
from fedfilter.privacy import renyi, zcdp
from fedfilter.privacy.filters import rdp_filter, rdp_order

SEQUENCES = [[1.0], [2.0, 3.0, 3.0], [0.7, 5.0, 1.5, 10.0], [170.0] * 112, [4.0] * 50 + [1.2] * 3]


def google_epsilon(orders, noise, delta):
    acc = rdp_acc.RdpAccountant(orders=list(orders))
    for z in noise:
        acc.compose(dp_event.GaussianDpEvent(z))
    return acc.get_epsilon(delta)


SHORT_GRID = (1.5, 2, 3, 4, 6, 8, 12, 16, 32, 64, 128, 256)


def test_default_orders_are_dp_accounting_orders():
    assert renyi.DEFAULT_ORDERS == tuple(rdp_acc.DEFAULT_RDP_ORDERS)


@pytest.mark.parametrize("noise", SEQUENCES)
@pytest.mark.parametrize("orders", [renyi.DEFAULT_ORDERS, SHORT_GRID, (2.0,), (32.0, 64.0)])
def test_rdp_epsilon_equals_dp_accounting(noise, orders):
    delta = 1e-5
    filt = rdp_filter(1.0, delta, orders)
    state = filt.initial_state()
    for z in noise:
        state = filt.spend(state, filt.charge(sensitivity=1.0, noise_std=z))
    ours = renyi.epsilon_from_rdp(filt.orders, [a * state[0] for a in filt.orders], delta)
    google = google_epsilon(orders, noise, delta)
    assert ours == pytest.approx(google, rel=1e-9)
    # The filter's own readout: the full delta, no union bound, at its order alpha* only (a state may
    # hold Skellam charges, valid at alpha* alone): never below the accountant, and exactly the
    # accountant's conversion at that one order. (Before Skellam charges a state past the budget read the
    # best order, equal to ``google``; valid for Gaussian-only states only.)
    spent = filt.epsilon_spent(state)
    assert spent >= google * (1 - 1e-9)
    if filt.within_budget(state):
        assert spent <= filt.epsilon
    else:
        a = rdp_order(filt)
        assert spent == pytest.approx(google_epsilon((a,), noise, delta), rel=1e-9)


def test_rdp_budget_converts_back_to_the_budget():
    for eps in (0.3, 1.0, 8.0):
        budgets = renyi.rdp_budgets(renyi.DEFAULT_ORDERS, eps, 1e-5)
        for a, b in zip(renyi.DEFAULT_ORDERS, budgets):
            if b > 0:
                assert renyi.epsilon_from_rdp([a], [b], 1e-5) <= eps + 1e-12


def test_theorem_4_9_budget_matches_the_paper_form():
    """Feldman & Zrnic (2021) Theorem 4.9: B* = (-sqrt(log 1/delta) + sqrt(log 1/delta + eps))^2."""
    for eps in (0.3, 0.5, 1.0, 8.0):
        for delta in (1e-5, 1e-8):
            L = math.log(1 / delta)
            paper = (-math.sqrt(L) + math.sqrt(L + eps)) ** 2
            ours = zcdp.zcdp_budget(eps, delta)
            assert ours <= paper * (1 + 1e-15) and ours == pytest.approx(paper, rel=1e-12)
            assert zcdp.epsilon_from_zcdp(ours, delta) == pytest.approx(eps, rel=1e-12)


def test_seed_run_is_0_3007_under_theorem_4_9():
    """Feldman & Zrnic (2021) Appendix A calls noise 170, 112 full-batch steps, delta 1e-5 'epsilon = 0.3'."""
    res = plan_epsilon("zcdp", noise_multiplier=170, rounds=112, delta=1e-5)
    assert round(res["epsilon"], 4) == 0.3007
    # Proposition 5.1: k / (2 sigma^2)-zCDP, converted with Fact 2.4.
    rho = 112 / (2 * 170**2)
    assert res["epsilon"] == pytest.approx(rho + 2 * math.sqrt(rho * math.log(1e5)), rel=1e-12)
    # So at a budget of exactly 0.3 the Theorem 4.9 filter stops one round earlier.
    assert plan_rounds("zcdp", epsilon=0.3, delta=1e-5, noise_multiplier=170).rounds == 111


def test_theorem_4_9_fixed_eps_rate():
    """Feldman & Zrnic (2021) after Theorem 4.9: k eps-DP steps give (k eps^2/2 + sqrt(2 k log(1/delta)) eps, delta)."""
    eps_t, k, delta = 0.01, 400, 1e-6
    rho = k * eps_t**2 / 2
    assert zcdp.epsilon_from_zcdp(rho, delta) == pytest.approx(
        k * eps_t**2 / 2 + math.sqrt(2 * k * math.log(1 / delta)) * eps_t, rel=1e-12
    )


def _exact_conversion(a, r, delta):
    a, r, d = mpmath.mpf(a), mpmath.mpf(r), mpmath.mpf(delta)
    return r + mpmath.log1p(-1 / a) - mpmath.log(d * a) / (a - 1)


@pytest.mark.parametrize("delta", [1e-5, 1e-9, 0.3])
def test_rdp_conversion_rounds_the_safe_way_against_60_digits(delta):
    """Budgets convert (exactly, at 60 digits) to at most epsilon and readouts are never below the
    exact value, also where epsilon nearly cancels the conversion's offset (ulps of the result do
    not cover the terms' rounding there)."""
    mpmath.mp.dps = 60
    orders = list(renyi.DEFAULT_ORDERS[::5]) + [1.011, 1.05, 1024.0, 1e5]
    offsets = [float(_exact_conversion(a, 0, delta)) for a in orders]
    for a, off in zip(orders, offsets):
        for f in (1 + 1e-15, 1 + 1e-12, 1.001, 3.0):
            eps = off * f if off > 0 else 1e-3 * f
            b = renyi.rdp_budgets([a], eps, delta)[0]
            if b > 0:
                assert _exact_conversion(a, b, delta) <= eps
            for r in (b, eps):
                got = renyi.epsilon_from_rdp([a], [r], delta)
                assert got == 0.0 or got >= _exact_conversion(a, r, delta)
    # The KL shortcut's threshold, where it is all that admits: alpha_min * rho <= -log(1 - delta^2).
    if renyi.rdp_budgets([2.0], 1e-300, delta)[0] == 0:
        rho = renyi.gaussian_rho_budget([2.0], 1e-300, delta)
        assert 0 < rho and 2 * mpmath.mpf(rho) <= -mpmath.log1p(-(mpmath.mpf(delta) ** 2))
