"""Rogers et al. (2016) baselines (Theorems 3.4, 5.1, Lemma 3.3): the pure-DP filters the planner compares against."""

import math

import pytest

from fedfilter.planning.rounds import plan_rounds
from fedfilter.privacy import pure_dp


def test_basic_filter_is_the_sum():
    stats = (0.0, 0.0, 0.0)
    for e in (0.1, 0.2, 0.3):
        stats = pure_dp.add_stats(stats, pure_dp.pure_step_stats(e))
    assert pure_dp.basic_admits(stats, 0.6 + 1e-12)
    assert not pure_dp.basic_admits(stats, 0.599)


def test_advanced_k_against_a_direct_evaluation_of_equation_6():
    eps = [0.05, 0.1, 0.02, 0.07]
    eps_g, delta_g = 1.0, 1e-6
    stats = (0.0, 0.0, 0.0)
    for e in eps:
        stats = pure_dp.add_stats(stats, pure_dp.pure_step_stats(e))
    L = math.log(1 / delta_g)
    x = eps_g**2 / (28.04 * L)
    s2 = sum(e * e for e in eps)
    direct = sum(e * (math.exp(e) - 1) / 2 for e in eps) + math.sqrt(
        2 * (s2 + x) * (1 + 0.5 * math.log(s2 / x + 1)) * L
    )
    k = pure_dp.advanced_k(stats, eps_g, delta_g)
    assert k >= direct and k == pytest.approx(direct, rel=1e-13)
    with pytest.raises(ValueError, match="delta"):
        pure_dp.advanced_k(stats, 1.0, 0.5)  # Theorem 5.1 needs delta_g < 1/e


def test_baseline_rounds_are_feasible_and_maximal():
    """The planner's count k satisfies Lemma 3.3 + Theorem 3.4 and k + 1 does not."""
    eps, delta, z = 1.0, 1e-5, 170
    k = plan_rounds("basic", epsilon=eps, delta=delta, noise_multiplier=z).rounds
    assert k >= 1
    mu = 1 / z

    def feasible(n):
        eps_t = eps / (2 * n)
        _, d_t = pure_dp.gaussian_as_approx_dp(mu, eps_t)
        return n * 2 * d_t / (eps_t * math.exp(eps_t)) <= delta

    assert feasible(k) and not feasible(k + 2)  # the planner leaves at most one round to rounding


def test_filters_rank_as_the_papers_say():
    """gdp >= zcdp (exact vs Theorem 4.9) and both far above the Rogers et al. (2016) baselines."""
    for eps in (0.5, 1.0, 2.0):
        r = {
            k: plan_rounds(k, epsilon=eps, delta=1e-5, noise_multiplier=170).rounds
            for k in ("gdp", "zcdp", "rdp", "basic", "advanced")
        }
        assert r["gdp"] > r["zcdp"] > r["basic"]
        assert r["gdp"] > r["rdp"] > r["advanced"]
