"""The plan the strategy takes whole, each figure against an independent reference: the abort
probability against exact rational arithmetic, z against the Gaussian-DP closed form and the device's
own filter, the asks against the Binomial tail, the clip's speed against Algorithm 1 stepped by hand."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from fedfilter.planning.dropout import abort_probability, min_reports_for_dropout
from fedfilter.planning.rounds import admits_rounds, plan_distributed_rounds
from fedfilter.planning.strategy_plan import plan_strategy, rounds_per_decade, strategy_arguments
from fedfilter.privacy.gaussian_dp import mu_for_budget
from fedfilter.protocol.adaptive_clip import AdaptiveClipping, accounted_noise_multiplier, next_clip


def _exact_cdf(k: int, q: Fraction, j: int) -> Fraction:
    """``P(X <= j)`` for ``X ~ Binomial(k, q)``, exactly."""
    return sum((math.comb(k, i) * q**i * (1 - q) ** (k - i) for i in range(j + 1)), Fraction(0))


@pytest.mark.parametrize("k,dropout", [(1, 0.3), (7, 0.5), (40, 0.1), (100, 0.1), (120, 0.25)])
def test_abort_probability_is_the_exact_binomial_tail(k, dropout):
    q = 1 - Fraction(dropout)  # a device replies with probability 1 - dropout
    for m in sorted({1, k // 3 + 1, k // 2 + 1, k}):
        exact = float(_exact_cdf(k, q, m - 1))  # aborts: fewer than m replies
        assert abort_probability(k, dropout, m) == pytest.approx(exact, rel=1e-9, abs=1e-300)


@pytest.mark.parametrize("k,dropout,target", [(10, 0.0, 0.01), (40, 0.1, 0.01), (100, 0.1, 0.01), (120, 0.3, 0.05)])
def test_min_reports_is_the_largest_whose_round_aborts_within_the_target(k, dropout, target):
    m, p = min_reports_for_dropout(k, dropout, target)
    q = 1 - Fraction(dropout)
    assert p == pytest.approx(float(_exact_cdf(k, q, m - 1)), rel=1e-9, abs=1e-300)
    assert _exact_cdf(k, q, m - 1) <= Fraction(target)
    if m < k:
        assert _exact_cdf(k, q, m) > Fraction(target)  # one more would abort too often


def test_min_reports_says_when_the_target_cannot_be_met():
    assert min_reports_for_dropout(3, 0.5, 0.01) == (1, 0.125)  # all three drop out with probability 1/8


@pytest.mark.parametrize(
    "epsilon,rounds,devices,population", [(4.0, 50, 100, 1000), (8.0, 200, 10, 100), (1.0, 10, 5, 5)]
)
def test_z_is_the_gdp_closed_form_rounded_up_to_two_decimals(epsilon, rounds, devices, population):
    plan = plan_strategy(
        devices=devices,
        population=population,
        rounds=rounds,
        dim=100,
        epsilons=[epsilon],
        delta=1e-5,
        adaptive=False,
        clip=1.0,
    )
    asks = math.ceil(rounds * devices / population)
    assert plan["participation"]["asks_planned"] == asks
    # gdp: asks rounds at z compose to sqrt(asks) / z-GDP; the least z is sqrt(asks) / mu_B.
    assert plan["noise_multiplier"] == math.ceil(100 * math.sqrt(asks) / mu_for_budget(epsilon, 1e-5)) / 100
    assert plan["budget"]["pays_for_planned_asks"] and plan["budget"]["asks_afforded"][0] >= asks


@pytest.mark.parametrize("placement", ["local", "distributed"])
def test_z_is_the_least_two_decimal_multiplier_the_devices_own_filter_admits(placement):
    plan = plan_strategy(
        devices=50,
        population=400,
        rounds=80,
        dim=500,
        epsilons=[8.0, 2.0],
        delta=1e-5,
        placement=placement,
        dropout_rate=0.05,
    )
    asks, z, m = plan["participation"]["asks_planned"], plan["noise_multiplier"], plan["min_reports"]
    kind = plan["filter"]

    def admits(z, clip=1.0):
        return admits_rounds(
            kind,
            rounds=asks,
            epsilon=2.0,
            delta=1e-5,
            noise_multiplier=z,
            placement=placement,
            clip=clip,
            min_reports=m,
            dim=501,
        )  # the bit is one more coordinate

    assert admits(z) and not admits(round(z - 0.01, 2))
    # Distributed: the Skellam charge depends on where the clip sits on the grid; a plan at a power of
    # two pays for every clip the adaptive rule may reach.
    for clip in (0.1, 0.3, 0.77, 1.0, 1.49, 3.9, 250.0):
        assert admits(z, clip)


def test_the_bit_is_inside_the_accounted_z():
    plan = plan_strategy(devices=200, population=2000, rounds=100, dim=10, epsilons=[4.0], delta=1e-5)
    ad = plan["adaptive_clipping"]
    assert ad["clipped_count_stddev"] == 200 / 20  # Andrew et al.'s and Flower's default
    z_update = plan["update_noise_multiplier"]
    assert z_update > plan["noise_multiplier"]
    assert accounted_noise_multiplier(z_update, ad["clipped_count_stddev"]) == pytest.approx(plan["noise_multiplier"])


def test_the_clip_needs_the_stated_rounds_to_move_a_decade():
    spec = AdaptiveClipping()
    clip, rounds = 1.0, 0
    while clip < 10.0:  # every update clipped: b_bar = 0, the largest step up
        clip, rounds = next_clip(clip, 0.0, spec), rounds + 1
    assert rounds == rounds_per_decade(spec) == 24
    skewed = AdaptiveClipping(target_clipped_quantile=0.9, clip_norm_lr=0.5)
    clip, rounds = 1.0, 0
    while clip > 0.1:  # none clipped: b_bar = 1, the largest step down is 0.5 * 0.1; up is 0.5 * 0.9
        clip, rounds = next_clip(clip, 1.0, skewed), rounds + 1
    assert rounds_per_decade(skewed) == math.ceil(math.log(10) / 0.45) < rounds


def test_uniform_sampling_prints_the_chance_of_more_asks_than_planned():
    plan = plan_strategy(
        devices=100,
        population=1000,
        rounds=50,
        dim=10,
        epsilons=[4.0],
        delta=1e-5,
        participation="uniform",
        plan_quantile=0.9,
    )
    part = plan["participation"]
    exact_more = 1 - _exact_cdf(50, Fraction(100, 1000), part["asks_planned"])
    assert part["p_asked_more"] == pytest.approx(float(exact_more), rel=1e-9)
    assert part["p_asked_more"] <= 0.1 < float(1 - _exact_cdf(50, Fraction(1, 10), part["asks_planned"] - 1))


def test_every_round_without_a_population():
    plan = plan_strategy(devices=10, rounds=30, dim=10, epsilons=[4.0], delta=1e-5)
    assert plan["participation"]["mode"] == "every-round" and plan["participation"]["asks_planned"] == 30


def test_adaptive_clipping_that_does_not_fit_is_said_or_refused():
    plan = plan_strategy(devices=10, rounds=50, dim=10, epsilons=[8.0], delta=1e-5)  # sigma_b 0.5 < z / 2
    assert plan["adaptive_clipping"] is None and "adaptive clipping off" in plan["notes"][0]
    with pytest.raises(ValueError, match=r"clipped_count_stddev must exceed noise_multiplier / 2 = .*Found 0.1"):
        plan_strategy(devices=10, rounds=50, dim=10, epsilons=[8.0], delta=1e-5, clipped_count_stddev=0.1)


def test_bad_input_names_every_field_and_value():
    with pytest.raises(ValueError) as err:
        plan_strategy(
            devices=0,
            rounds=5,
            dim=10,
            epsilons=[4.0, -1.0],
            delta=2.0,
            population=None,
            participation="balanced",
            dropout_rate=1.5,
            placement="somewhere",
        )
    text = str(err.value)
    for part in (
        "devices must be an integer >= 1. Found 0.",
        "epsilons must be a non-empty list",
        "delta must be a number in (0, 1). Found 2.0.",
        "placement must be one of",
        "participation 'balanced' needs the population",
        "dropout_rate must be a number in [0, 1). Found 1.5.",
    ):
        assert part in text


def test_strategy_arguments_take_the_cli_output_or_its_part_and_refuse_another_format():
    plan = plan_strategy(
        devices=100,
        population=1000,
        rounds=50,
        dim=10,
        epsilons=[4.0],
        delta=1e-5,
        placement="distributed",
        dropout_rate=0.1,
    )
    args = strategy_arguments({"mean_noise_norm": 1.0, "strategy": plan})
    assert args == strategy_arguments(plan)
    assert (args["noise_multiplier"], args["clip"], args["placement"], args["min_reports"]) == (
        plan["noise_multiplier"],
        plan["clip"],
        "distributed",
        plan["min_reports"],
    )
    assert args["adaptive_clipping"] == AdaptiveClipping(0.5, 0.2, 5.0)
    with pytest.raises(ValueError, match=r"plan format must be 1 \(fedfilter plan --json\). Found 2."):
        strategy_arguments({**plan, "format": 2})
    with pytest.raises(ValueError, match=r"the plan lacks min_reports"):
        strategy_arguments({k: v for k, v in plan.items() if k != "min_reports"})


@pytest.mark.parametrize("dim,m,z", [(11, 2, 0.3), (501, 48, 3.0), (20001, 10, 1.0)])
def test_a_power_of_two_clip_carries_the_largest_skellam_charge(dim, m, z):
    # Why a distributed plan at clip 1 pays for every clip: on the grid the clip is C / gamma in
    # [2^12, 2^13), and the Skellam bound's terms beyond the Gaussian one shrink as it grows.
    def charge(clip):
        return plan_distributed_rounds(
            epsilon=2.0, delta=1e-5, noise_multiplier=z, clip=clip, min_reports=m, dim=dim
        ).charge

    worst = charge(1.0)
    assert all(charge(c) <= worst for c in (0.5, 0.75, 1.0000001, 1.3, 1.77, 1.999, 4.0, 0.1, 37.0))
    assert charge(0.5) == charge(4.0) == worst  # the same on every power of two
