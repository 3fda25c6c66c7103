"""The federation planner: the noise norm of a released mean against an independent reference
(mpmath at 50 digits, a Monte Carlo average, the z C sqrt(d / n) rule of thumb), and
recommended settings that pass its own check (and the device's filter, through ``plan_rounds``)."""

from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest

from fedfilter.planning.federation import TARGET_NOISE_TO_CLIP, mean_noise_norm, plan_federation
from fedfilter.planning.rounds import plan_rounds
from fedfilter.privacy.noise_norm import chi_mean, expected_noise_norm

QUICKSTART_CNN = 62_006  # Flower's quickstart-pytorch CNN (CIFAR-10), the planner's worked example


@pytest.mark.parametrize("dim", [1, 2, 3, 10, 341, 1999, 2000, 19_754, QUICKSTART_CNN, 10**7, 10**12])
def test_chi_mean_matches_mpmath_at_50_digits(dim):
    with mpmath.workdps(50):
        exact = mpmath.sqrt(2) * mpmath.gamma(mpmath.mpf(dim + 1) / 2) / mpmath.gamma(mpmath.mpf(dim) / 2)
    assert chi_mean(dim) == pytest.approx(float(exact), rel=1e-11)


def test_chi_mean_small_dims_exactly_and_by_monte_carlo():
    assert chi_mean(1) == pytest.approx(math.sqrt(2 / math.pi), rel=1e-14)  # E|N(0,1)|
    assert chi_mean(2) == pytest.approx(math.sqrt(math.pi / 2), rel=1e-14)  # the Rayleigh mean
    rng = np.random.default_rng(5)
    sample = np.linalg.norm(rng.normal(0.0, 0.3, size=(20_000, 50)), axis=1)
    assert expected_noise_norm(std=0.3, dim=50) == pytest.approx(sample.mean(), rel=3e-3)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, None])
def test_chi_mean_refuses_a_bad_dim_by_name(bad):
    with pytest.raises(ValueError, match="dim"):
        chi_mean(bad)


def test_quickstart_local_noise_dominates_and_the_recommendation_does_not():
    plan = plan_federation(
        devices=10, dim=QUICKSTART_CNN, noise_multiplier=1.0, clip=1.0, epsilon=8.0, delta=1e-5, rounds=50
    )
    assert plan["mean_noise_norm"] == pytest.approx(1.0 * 1.0 * math.sqrt(QUICKSTART_CNN / 10), rel=0.05)
    assert plan["noise_dominates"] is True
    for name in ("recommended", "at_these_devices", "distributed"):
        rec = plan[name]
        again = plan_federation(
            **{k: rec[k] for k in ("devices", "dim", "noise_multiplier", "clip", "epsilon", "delta", "rounds")},
            placement=rec["placement"],
            min_reports=rec["min_reports"],
            filter=rec["filter"],
        )
        assert again["noise_dominates"] is False, name
        assert again["mean_noise_norm"] <= TARGET_NOISE_TO_CLIP * rec["clip"], name
    # The recommendation fits the typical budget: the device's own filter admits its rounds.
    rec = plan["recommended"]
    assert plan_rounds("gdp", epsilon=8.0, delta=1e-5, noise_multiplier=rec["noise_multiplier"]).rounds >= 50
    assert rec["devices"] > 10  # the budget cannot pay for a learning mean among 10 devices
    # Every remedy the issue names is offered.
    text = " ".join(plan["changes"])
    for remedy in ("more devices", "distributed placement", "larger clip", "fewer parameters", "fewer rounds"):
        assert remedy in text


def test_distributed_noise_is_split_among_min_reports():
    # n reports of std z C / sqrt(m) each: the mean's std is z C / sqrt(n m), z C / n when n = m.
    for n, m in ((10, 10), (20, 10)):
        norm = mean_noise_norm(
            noise_multiplier=2.0, clip=0.5, placement="distributed", min_reports=m, devices=n, dim=100
        )
        assert norm == pytest.approx(2.0 * 0.5 / math.sqrt(n * m) * chi_mean(100), rel=1e-12)


def test_a_federation_that_learns_gets_the_same_settings_back():
    plan = plan_federation(devices=10_000, dim=1_000, noise_multiplier=1.0, clip=1.0, epsilon=8.0, delta=1e-5, rounds=2)
    assert plan["noise_dominates"] is False and plan["fits_budget"] is True
    assert plan["changes"] == [] and plan["verdict"].startswith("learns")
    assert plan["recommended_why"] == "the settings given"
    assert (plan["recommended"]["devices"], plan["recommended"]["noise_multiplier"]) == (10_000, 1.0)


def test_bad_settings_are_all_named_at_once():
    with pytest.raises(ValueError) as err:
        plan_federation(devices=0, dim=-3, noise_multiplier=float("nan"), clip=1.0, epsilon=8.0, delta=2.0, rounds=1)
    for field in ("devices", "dim", "noise_multiplier", "delta"):
        assert field in str(err.value)
    with pytest.raises(ValueError, match="min_reports=11 exceeds devices=10"):
        plan_federation(
            devices=10,
            dim=5,
            noise_multiplier=1.0,
            clip=1.0,
            epsilon=8.0,
            delta=1e-5,
            rounds=1,
            placement="distributed",
            min_reports=11,
        )
    with pytest.raises(ValueError, match="rdp"):
        plan_federation(
            devices=10,
            dim=5,
            noise_multiplier=1.0,
            clip=1.0,
            epsilon=8.0,
            delta=1e-5,
            rounds=1,
            placement="distributed",
            min_reports=10,
            filter="gdp",
        )


def test_a_distributed_plan_never_recommends_noise_every_device_refuses():
    """60,000 devices a round: the budget's multiplier (about 77) overflows SecAgg+'s range for that many
    reports (at most about 1), so each device's own check (``skellam_grid``) would refuse every round: the
    planner says the plan releases nothing, names the limit, and does not pass the settings off as learning."""
    from helpers.secagg_range import device_admits

    n = 60_000
    plan = plan_federation(
        devices=n,
        dim=26_010,
        noise_multiplier=77.0,
        clip=1.0,
        epsilon=0.5,
        delta=1e-5,
        rounds=100,
        placement="distributed",
        min_reports=n,
    )
    limit = plan["secagg_noise_limit"]
    assert 0.9 < limit < 1.1 and not plan["fits_secagg_range"]
    assert (
        plan["verdict"].startswith("releases nothing")
        and f"at most {math.floor(limit * 1000) / 1000:g}" in plan["verdict"]
    )
    assert "fewer devices a round" in plan["changes"][0]
    assert not plan["recommended"]["fits_secagg_range"] and "every device refuses it" in plan["recommended_why"]
    # The limit is the device's own: at it the device accepts the round, 1% above it refuses.
    assert device_admits(limit, asked=n, min_reports=n) and not device_admits(limit * 1.01, asked=n, min_reports=n)
    # 600 a round fit the same budget's multiplier.
    small = plan_federation(
        devices=600,
        dim=26_010,
        noise_multiplier=7.0,
        clip=1.0,
        epsilon=2.0,
        delta=1e-5,
        rounds=10,
        placement="distributed",
        min_reports=522,
    )
    assert small["fits_secagg_range"] and not small["verdict"].startswith("releases nothing")


def _mpmath_chi_mean(dim: int) -> float:
    """E||N(0, I_dim)|| = sqrt(2) Gamma((d + 1) / 2) / Gamma(d / 2), at 50 digits (independent of chi_mean)."""
    with mpmath.workdps(50):
        return float(mpmath.sqrt(2) * mpmath.gamma(mpmath.mpf(dim + 1) / 2) / mpmath.gamma(mpmath.mpf(dim) / 2))


@pytest.mark.parametrize("placement", ["local", "distributed"])
def test_with_devices_that_sample_themselves_the_mean_divides_every_asked_devices_noise_by_the_contributions(
    placement,
):
    # Every asked device adds its noise; the coordinator divides the sum by devices x mean rate. The
    # figures, the devices the fix needs and the verdict are that mean's, from the closed form.
    n, m, z, clip, dim, q = 100, (80 if placement == "distributed" else 1), 3.0, 0.5, 5_000, 0.4
    sampling = {"expected_rate": q, "budgets": [2.0, 6.0], "rates": [0.2, 0.6], "spends_every_budget": True}
    kw = dict(devices=n, dim=dim, noise_multiplier=z, clip=clip, epsilon=2.0, delta=1e-5, rounds=3)
    plan = plan_federation(**kw, placement=placement, min_reports=m, filter="rdp", sampling=sampling)
    # local: n reports of std z C, sum std z C sqrt(n); distributed: std z C / sqrt(m) each.
    sum_std = z * clip * math.sqrt(n) / (1.0 if placement == "local" else math.sqrt(m))
    want = sum_std / (n * q) * _mpmath_chi_mean(dim)
    assert plan["mean_noise_norm"] == pytest.approx(want, rel=1e-12)
    assert plan["expected_rate"] == q and plan["expected_contributions"] == pytest.approx(n * q)
    assert plan["noise_dominates"] is True and "over the 40 contributions expected" in plan["verdict"]
    # "more devices": the fewest n' (m' = n' when distributed) whose sampled mean's noise is at most the clip.
    (more,) = [c for c in plan["changes"] if c.startswith("more devices per round")]
    need = int(more.split()[4].replace(",", ""))

    def sampled_norm(k: int) -> float:
        per = z * clip * math.sqrt(k) / (1.0 if placement == "local" else math.sqrt(k))
        return per / (k * q) * _mpmath_chi_mean(dim)

    assert sampled_norm(need) <= clip < sampled_norm(need - 1)
    # The unsampled plan asks for fewer devices, and offers a smaller z, which sampling does not.
    plain = plan_federation(**kw, placement=placement, min_reports=m, filter="rdp")
    assert plain["mean_noise_norm"] == pytest.approx(plan["mean_noise_norm"] * q, rel=1e-12)
    assert any(c.startswith("a smaller noise multiplier") for c in plain["changes"])
    assert not any(c.startswith("a smaller noise multiplier") for c in plan["changes"])
    # The settings that learn stay those of devices that contribute at every ask.
    assert plan["recommended"] == plain["recommended"]
    assert plan["at_these_devices"] == plain["at_these_devices"]


def test_a_sampled_federation_that_learns_says_so_and_a_budget_that_buys_nothing_is_named():
    kw = dict(devices=10_000, dim=1_000, noise_multiplier=1.0, clip=1.0, epsilon=8.0, delta=1e-5, rounds=2)
    sampling = {"expected_rate": 0.5, "budgets": [8.0], "rates": [0.5], "spends_every_budget": True}
    plan = plan_federation(**kw, filter="rdp", sampling=sampling)
    assert (
        plan["verdict"].startswith("learns")
        and "each budget pays for the 2 planned asks at its own rate" in (plan["verdict"])
    )
    unspent = {**sampling, "spends_every_budget": False, "spending_limit": 0.8}
    assert (
        "at noise multiplier 1, above 0.8, the largest budgets end with budget unspent"
        in plan_federation(**kw, filter="rdp", sampling=unspent)["verdict"]
    )
    nothing = {"expected_rate": 0.5, "budgets": [0.01, 8.0], "rates": [0.0, 1.0], "spends_every_budget": True}
    plan = plan_federation(**kw, filter="rdp", sampling=nothing)
    assert plan["fits_budget"] is False and "budget of epsilon 0.01 buys no contribution" in plan["verdict"]
    assert any("epsilon 0.01 buys no contribution over the 2 planned asks" in c for c in plan["changes"])
    for bad in (0.0, 1.5, float("nan"), "0.5", True):
        with pytest.raises(ValueError, match="sampling expected_rate must be a number in \\(0, 1\\]. Found"):
            plan_federation(**kw, filter="rdp", sampling={**sampling, "expected_rate": bad})
