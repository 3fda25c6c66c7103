"""Gaussian-DP conversions against independent references: mpmath at 100 digits, scipy, and
Google's dp_accounting (its exact Gaussian privacy loss and its PLD accountant)."""

import math

import mpmath
import pytest
from dp_accounting import dp_event
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from scipy.stats import norm

from fedfilter.privacy.gaussian_dp import delta_for_epsilon, epsilon_for_mu, mu_for_budget


def exact_delta(eps, mu, dps=100):
    """Dong-Roth-Su Corollary 2.13 at 100 digits (twice the library's precision)."""
    with mpmath.workdps(dps):
        e, m = mpmath.mpf(eps), mpmath.mpf(mu)
        return mpmath.ncdf(-e / m + m / 2) - mpmath.exp(e) * mpmath.ncdf(-e / m - m / 2)


EPS_DELTA = [(e, d) for e in (0.05, 0.3, 0.5, 1.0, 2.0, 8.0, 20.0) for d in (1e-3, 1e-5, 1e-9)]


@pytest.mark.parametrize("eps,delta", EPS_DELTA)
def test_mu_budget_is_never_larger_than_the_true_one_and_tight(eps, delta):
    mu = mu_for_budget(eps, delta)
    assert exact_delta(eps, mu) <= delta  # conservative: never more than the budget
    # ... and within 1e-13 relative of the exact solution: rounding costs nothing measurable.
    assert exact_delta(eps, mu * (1 + 1e-13)) > delta


@pytest.mark.parametrize("eps,delta", EPS_DELTA)
def test_epsilon_for_mu_inverts_the_budget_conservatively(eps, delta):
    mu = mu_for_budget(eps, delta)
    back = epsilon_for_mu(mu, delta)
    assert back <= eps + 1e-12
    for m in (mu, mu * 0.7, mu * 1.3):
        e = epsilon_for_mu(m, delta)
        assert exact_delta(e, m) <= delta  # the epsilon we print holds
        if e > 0:
            assert exact_delta(e * (1 - 1e-12), m) > delta  # and is tight


def test_delta_matches_scipy_and_dp_accounting_exact_gaussian():
    for eps in (0.1, 1.0, 3.0):
        for mu in (0.2, 0.5, 1.0, 2.0):
            ours = delta_for_epsilon(eps, mu)
            scipy_value = norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2)
            # GaussianPrivacyLoss(std, sensitivity) is mu = sensitivity / std.
            google = GaussianPrivacyLoss(1.0 / mu, sensitivity=1.0).get_delta_for_epsilon(eps)
            assert ours == pytest.approx(scipy_value, rel=1e-9)
            assert ours == pytest.approx(google, rel=1e-7)
            assert ours >= float(exact_delta(eps, mu))


@pytest.mark.parametrize("noise", [[2.0, 3.0, 3.0], [0.8, 5.0, 1.5, 10.0], [1.5] * 8, [50.0] * 7 + [3.0]])
def test_composed_gaussians_agree_with_the_pld_accountant(noise):
    """A fixed sequence of Gaussians with different noise is exactly sqrt(sum mu_t^2)-GDP."""
    delta = 1e-5
    mu = math.sqrt(sum(1 / z**2 for z in noise))
    ours = epsilon_for_mu(mu, delta)
    acc = pld_privacy_accountant.PLDAccountant()
    for z in noise:
        acc.compose(dp_event.GaussianDpEvent(z))
    pld = acc.get_epsilon(delta)
    assert exact_delta(ours, mu) <= delta  # never below the exact value
    assert ours <= pld + 1e-12  # the PLD is a pessimistic discretisation of the same curve
    assert ours == pytest.approx(pld, rel=2e-3, abs=1e-6)  # within its discretisation (1e-4 default)


def test_seed_run_exact_gdp_epsilon():
    """Feldman & Zrnic (2021) Appendix A: noise multiplier 170, 112 full-batch steps, delta 1e-5."""
    mu = math.sqrt(112) / 170
    eps = epsilon_for_mu(mu, 1e-5)
    assert exact_delta(eps, mu) <= 1e-5
    assert eps == pytest.approx(0.20327, abs=5e-6)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_arguments_name_the_field(bad):
    with pytest.raises(ValueError, match="epsilon"):
        mu_for_budget(bad, 1e-5)
    with pytest.raises(ValueError, match="delta"):
        mu_for_budget(1.0, bad if bad != 0.0 else 1.5)
