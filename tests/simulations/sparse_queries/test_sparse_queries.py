"""Sparse counting queries (Feldman & Zrnic (2021) Theorem 1.2): answers, budgets and the error bound."""

import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fedfilter.privacy import zcdp
from fedfilter.privacy.filters import make_filter
from fedfilter.simulations.sparse_queries import (
    SparseQueryConfig,
    exact_exceed_probability,
    gaussian_bound,
    kappa_of,
    noise_for_sparsity,
    simulate,
    theorem_bound,
)

ROOT = Path(__file__).resolve().parents[3]
SMALL = SparseQueryConfig(n_users=400, days=120, sparsity=4, light_rate=0.02, heavy_rate=0.2, heavy_share=0.1)


def test_config_errors_name_every_field_and_value():
    bad = SparseQueryConfig(n_users=0, days=-1, sparsity=1.5, heavy_share=2.0, filter="pld", failure_prob=0.9)
    with pytest.raises(ValueError) as err:
        simulate(bad)
    msg = str(err.value)
    for piece in (
        "n_users",
        "0",
        "days",
        "-1",
        "sparsity",
        "1.5",
        "heavy_share",
        "2.0",
        "filter",
        "'pld'",
        "failure_prob",
        "0.9",
    ):
        assert piece in msg


def test_kappa_matches_the_zcdp_budget_of_theorem_4_9():
    filt = make_filter("zcdp", 1.0, 1e-6)
    assert kappa_of(filt) == zcdp.zcdp_budget(1.0, 1e-6)


@pytest.mark.parametrize("kind", ["zcdp", "gdp", "rdp"])
@pytest.mark.parametrize("s", [1, 7, 30])
def test_noise_admits_exactly_s_unit_releases(kind, s):
    filt = make_filter(kind, 2.0, 1e-5)
    sigma = noise_for_sparsity(filt, s)
    charge = filt.charge(sensitivity=1.0, noise_std=sigma)
    state = filt.initial_state()
    for _ in range(s):
        assert filt.admits(state, charge)
        state = filt.spend(state, charge)
    assert not filt.admits(state, charge)
    if kind != "rdp":  # Corollary 4.7: sigma^2 = s / (2 kappa), up to the ulp-level nudge
        assert sigma == pytest.approx(math.sqrt(s / (2 * kappa_of(filt))), rel=1e-9)


def test_gaussian_form_equals_theorem_form():
    # sigma^2 = s / (2 kappa)  =>  sigma sqrt(2 log(1/beta)) = sqrt(s log(1/beta) / kappa)
    s, kappa, beta = 10, 0.0175, 0.05
    sigma = math.sqrt(s / (2 * kappa))
    assert gaussian_bound(sigma=sigma, failure_prob=beta) == pytest.approx(
        theorem_bound(sparsity=s, kappa=kappa, failure_prob=beta), rel=1e-12
    )
    # and the exact Gaussian tail there is below beta (Mills ratio), e.g. 0.0144 at beta = 0.05
    assert exact_exceed_probability(beta) == pytest.approx(0.014375, abs=1e-5)
    assert all(exact_exceed_probability(b) <= b for b in (0.5, 0.1, 0.01, 1e-6))


def test_individual_answers_at_least_as_many_queries_and_nobody_overspends():
    res = simulate(SMALL)
    s = SMALL.sparsity
    assert res.worst_case.answered == s  # k0 = s when sigma^2 = s / (2 kappa) (remark after Cor. 4.7)
    assert res.individual.answered == SMALL.days >= res.worst_case.answered
    filt = make_filter(SMALL.filter, SMALL.epsilon, SMALL.delta)
    assert np.all(filt.within_budget(res.individual.state))
    assert np.all(filt.within_budget(res.worst_case.state))
    assert res.max_spent_fraction <= 1.0
    assert res.max_epsilon_spent <= SMALL.epsilon
    # Independently of the filter: a user is counted on at most s of its active days ...
    assert res.paid_days.max() <= s
    assert np.all(res.paid_days == np.minimum(res.active_days, s))
    # ... and the set sums the analyst saw contain exactly those days.
    assert res.individual.truth_active.sum() == res.paid_days.sum()


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 60),
    days=st.integers(1, 40),
    s=st.integers(1, 6),
    light=st.floats(0, 1),
    heavy=st.floats(0, 1),
    share=st.floats(0, 1),
    eps=st.floats(0.05, 20),
    kind=st.sampled_from(["zcdp", "gdp", "rdp"]),
    seed=st.integers(0, 10**6),
)
def test_no_user_ever_exceeds_the_budget(n, days, s, light, heavy, share, eps, kind, seed):
    cfg = SparseQueryConfig(
        n_users=n,
        days=days,
        sparsity=s,
        light_rate=light,
        heavy_rate=heavy,
        heavy_share=share,
        epsilon=eps,
        filter=kind,
        seed=seed,
    )
    res = simulate(cfg)
    filt = make_filter(kind, eps, cfg.delta)
    assert np.all(filt.within_budget(res.individual.state))
    assert res.individual.answered >= res.worst_case.answered
    assert res.paid_days.max(initial=0) <= s
    assert res.max_epsilon_spent <= eps


def test_error_against_active_set_stays_within_theorem_1_2_bound():
    """P(|a_t - sum_{S_t} q_t| > sqrt(s log(1/beta)/kappa)) <= beta, checked over 6,000 days.

    The exact rate is erfc(sqrt(log 20)) = 0.0144 at beta = 0.05; the test fails if the rate exceeds
    beta (a 9-sigma binomial margin above 0.0144), e.g. if the noise were twice too large or the
    error were measured against a set other than S_t.
    """
    cfg = replace(SMALL, days=2000, n_users=200, failure_prob=0.05)
    rates, answered = [], 0
    for seed in range(3):
        res = simulate(replace(cfg, seed=seed))
        ind = res.individual
        err = np.abs(ind.answers - ind.truth_active)
        rates.append(np.sum(err > res.bound))
        answered += ind.answered
        # the worst-case answers (the first k0 days) are exact-in-law sums over everyone
        wc = res.worst_case
        ok = ~np.isnan(wc.answers)
        assert np.all(wc.truth_active[ok] == wc.truth_all[ok])
    rate = sum(rates) / answered
    assert rate <= cfg.failure_prob
    # and the noise is not simply absent: the rate is near the exact Gaussian tail
    assert rate >= exact_exceed_probability(cfg.failure_prob) / 3


def test_heavy_users_drop_out_and_bias_the_full_count():
    res = simulate(SMALL)
    ind = res.individual
    # the heavy users exceed s active days, so later S_t misses their contributions
    assert np.any(ind.truth_active < ind.truth_all)
    assert ind.users_admitted[-1] < SMALL.n_users
    assert res.summary()["individual"]["days_with_everyone"] >= res.worst_case.answered
