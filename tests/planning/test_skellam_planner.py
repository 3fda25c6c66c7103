"""The distributed (Skellam over SecAgg+) planner counts what the device's filter admits."""

from __future__ import annotations

from fractions import Fraction

import pytest

from fedfilter.planning.rounds import (
    distributed_mu,
    plan_distributed_epsilon,
    plan_distributed_rounds,
    plan_rounds,
)
from fedfilter.privacy.filters import rdp_filter
from fedfilter.privacy.rounding import up
from fedfilter.privacy.skellam import l1_cap, released_variance, skellam_charge
from fedfilter.protocol.secagg.grid import grid_step

SETTINGS = [
    (1.0, 1e-5, 20.0, 1.0, 10, 1000),
    (1.0, 1e-5, 20.0, 0.7, 3, 10**7),
    (8.0, 1e-5, 5.0, 2.5, 1, 10**6),
    (0.3, 1e-5, 170.0, 1.0, 100, 50),
    (2.0, 1e-8, 2.0, 0.1, 7, 10**7),  # small mu against a huge model: discreteness costs rounds
]


def admitted_one_by_one(eps, delta, z, clip, t, dim):
    """Charge full-clip releases with the device's own functions until the filter refuses."""
    filt = rdp_filter(eps, delta)
    gamma = grid_step(clip)
    mu = distributed_mu(z, clip, t)  # checked on its own below
    l2 = clip / gamma
    charge = skellam_charge(filt, l1_cap(l2, dim), l2, mu)
    state, n = filt.initial_state(), 0
    while filt.admits(state, charge) and n < 100_000:
        state, n = filt.spend(state, charge), n + 1
    return n


@pytest.mark.parametrize("eps,delta,z,clip,t,dim", SETTINGS)
def test_round_count_is_what_the_filter_admits_one_by_one(eps, delta, z, clip, t, dim):
    plan = plan_distributed_rounds(epsilon=eps, delta=delta, noise_multiplier=z, clip=clip, min_reports=t, dim=dim)
    assert plan.rounds == admitted_one_by_one(eps, delta, z, clip, t, dim)
    assert plan.l2 == clip / grid_step(clip) and 4096 <= plan.l2 < 8192
    gaussian = plan_rounds("rdp", epsilon=eps, delta=delta, noise_multiplier=z).rounds
    assert plan.rounds <= gaussian  # a Skellam round never costs less than the Gaussian one here
    if plan.mu >= 1e3 * dim:  # small dim relative to mu: within a few rounds of the Gaussian count
        assert plan.rounds >= gaussian - 2


def test_discreteness_costs_rounds_when_mu_is_small_against_dim():
    gaussian = plan_rounds("rdp", epsilon=2.0, delta=1e-8, noise_multiplier=2.0).rounds
    small = plan_distributed_rounds(epsilon=2.0, delta=1e-8, noise_multiplier=2.0, clip=0.1, min_reports=7, dim=10)
    huge = plan_distributed_rounds(epsilon=2.0, delta=1e-8, noise_multiplier=2.0, clip=0.1, min_reports=7, dim=10**7)
    assert huge.rounds <= small.rounds <= gaussian and huge.charge > small.charge


def test_mu_is_the_total_rounded_down():
    for z, clip, t in [(1.0, 1.0, 1), (0.37, 3.3, 9), (170.0, 1e-3, 1000)]:
        gamma = grid_step(clip)
        mu = distributed_mu(z, clip, t)
        exact = Fraction(z) ** 2 * (Fraction(clip) / Fraction(gamma)) ** 2
        assert Fraction(mu) <= exact and mu >= float(exact) * (1 - 1e-14)
        assert Fraction(released_variance(float(up(mu / t)), t)) >= Fraction(mu)  # t shares carry it


@pytest.mark.parametrize("rounds,z,dim", [(37, 5.0, 10**6), (3, 20.0, 100), (500, 170.0, 10**7)])
def test_epsilon_plan_admits_its_rounds_and_bounds_the_fixed_plan(rounds, z, dim):
    res = plan_distributed_epsilon(rounds=rounds, delta=1e-5, noise_multiplier=z, clip=1.0, min_reports=4, dim=dim)
    back = plan_distributed_rounds(
        epsilon=res["epsilon"], delta=1e-5, noise_multiplier=z, clip=1.0, min_reports=4, dim=dim
    )
    assert back.rounds >= rounds
    assert res["fixed_composition_epsilon"] <= res["epsilon"] * (1 + 1e-9)
    assert res["epsilon"] <= res["fixed_composition_epsilon"] * 1.05  # one order fixed in advance costs little


def test_gaussian_only_filters_and_bad_settings_are_refused():
    for kind in ("gdp", "zcdp"):
        with pytest.raises(ValueError, match=f"filter='{kind}'.*needs filter='rdp'"):
            plan_distributed_rounds(
                epsilon=1.0, delta=1e-5, noise_multiplier=1.0, clip=1.0, min_reports=1, dim=5, kind=kind
            )
    with pytest.raises(ValueError, match="dim .* must be an integer >= 1. Found 0"):
        plan_distributed_rounds(epsilon=1.0, delta=1e-5, noise_multiplier=1.0, clip=1.0, min_reports=1, dim=0)
    with pytest.raises(ValueError, match="min_reports must be an integer >= 1. Found 0"):
        plan_distributed_epsilon(rounds=3, delta=1e-5, noise_multiplier=1.0, clip=1.0, min_reports=0, dim=5)
