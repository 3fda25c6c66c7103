"""The asks a device that samples itself is admitted, against dp_accounting's RdpAccountant.

dp_accounting composes ``PoissonSampledDpEvent(q, GaussianDpEvent(z))`` n times and converts at the
best of its orders after the fact; the device's filter must fix its order before its first charge. The
count may never exceed dp_accounting's and must reach at least 97% of it.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys

import numpy as np
import pytest

from fedfilter.planning.rounds import plan_distributed_rounds, plan_rounds
from fedfilter.planning.sampled_rounds import full_ask_charge, plan_sampled_rounds, plan_sampling
from fedfilter.privacy.skellam import l1_cap, skellam_rho
from fedfilter.privacy.subsampled import SUBSAMPLED_ORDERS


def dp_accounting_count(epsilon: float, delta: float, z: float, q: float, orders=None) -> int:
    """The most compositions dp_accounting's RdpAccountant certifies within (epsilon, delta), at its
    default orders or at ``orders``: its per-event curve once, then its own conversion of n times it
    (what ``RdpAccountant.compose(event, n).get_epsilon(delta)`` computes)."""
    from dp_accounting.rdp import rdp_privacy_accountant as acc

    logging.getLogger("absl").setLevel(logging.ERROR)  # its fractional series warns below order 2
    grid = list(acc.RdpAccountant()._orders if orders is None else orders)
    curve = acc._compute_rdp_poisson_subsampled_gaussian(q, z, grid)

    def fits(n: int) -> bool:
        return acc.compute_epsilon(grid, n * curve, delta)[0] <= epsilon

    lo, hi = 0, 1
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def test_the_shortcut_is_the_accountant():
    """``dp_accounting_count``'s shortcut agrees with composing the event in an RdpAccountant."""
    import dp_accounting

    n = dp_accounting_count(1.0, 1e-5, 1.1, 0.01)
    for count, fits in ((n, True), (n + 1, False)):
        accountant = dp_accounting.rdp.RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(1.1)), count)
        assert bool(accountant.get_epsilon(1e-5) <= 1.0) is fits


# The derivation page's six rows are checked too (test_the_derivations_table_is_what_the_code_and_dp_accounting_say).
CASES = [
    (1.0, 1e-6, 5.0, 0.5),
    (0.5, 1e-5, 1.5, 0.002),
    (3.0, 1e-5, 1.0, 0.1),
]


@pytest.mark.parametrize(("epsilon", "delta", "z", "q"), CASES)
def test_asks_are_within_three_percent_of_dp_accounting_and_never_above(epsilon, delta, z, q):
    """At least 97% of dp_accounting's count at its own orders; never above its count at the orders
    the device may choose from (a finer grid than dp_accounting's default can certify a few more)."""
    ours = plan_sampled_rounds(epsilon=epsilon, delta=delta, noise_multiplier=z, sampling_rate=q).rounds
    theirs = dp_accounting_count(epsilon, delta, z, q)
    assert theirs > 0
    assert ours >= 0.97 * theirs, (ours, theirs)
    assert ours <= dp_accounting_count(epsilon, delta, z, q, orders=SUBSAMPLED_ORDERS), ours


def test_the_documented_command_prints_dp_accountings_count():
    cmd = [sys.executable, "-m", "fedfilter", "rounds", "--epsilon", "1", "--delta", "1e-5"]
    cmd += ["--noise-multiplier", "1.1", "--sampling-rate", "0.01", "--filter", "rdp", "--json"]
    out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    theirs = dp_accounting_count(1.0, 1e-5, 1.1, 0.01)
    assert 0.97 * theirs <= out["rounds"] <= theirs  # 141 of 141
    assert out["sampling_rate"] == 0.01 and out["filter"] == "rdp"
    assert out["expected_contributions"] == pytest.approx(out["rounds"] * 0.01)


def test_rate_one_is_the_unsampled_filter_at_that_order():
    plan = plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=3.0, sampling_rate=1.0)
    same = plan_rounds("rdp", epsilon=4.0, delta=1e-5, noise_multiplier=3.0, orders=[float(plan.order)])
    assert plan.rounds == same.rounds


def test_a_smaller_rate_buys_more_asks_but_no_more_contributions_than_a_full_rate_plan_allows():
    counts = [
        plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=1.5, sampling_rate=q).rounds
        for q in (1.0, 0.5, 0.1, 0.02)
    ]
    assert counts == sorted(counts)
    assert counts[-1] > 20 * counts[0]


def test_distributed_ask_at_rate_one_is_the_skellam_charge():
    l2 = 1.0 / 2**-12  # clip 1 on its grid
    dim, mu_setting = 1000, dict(noise_multiplier=4.0, clip=1.0, min_reports=4, dim=1000)
    plan = plan_distributed_rounds(epsilon=4.0, delta=1e-5, **mu_setting)
    charge = full_ask_charge(order=8, sampling_rate=1.0, placement="distributed", **mu_setting)
    reference = float(skellam_rho(float(l1_cap(l2, dim)), l2, plan.mu, 8.0))
    assert reference <= charge <= reference * (1 + 1e-12)
    sampled = full_ask_charge(order=8, sampling_rate=0.05, placement="distributed", **mu_setting)
    assert sampled < charge / 5


def test_distributed_asks_are_counted_with_the_sum_or_the_single_report():
    setting = dict(epsilon=8.0, delta=1e-5, noise_multiplier=1.1, sampling_rate=0.05, clip=0.5, dim=10_000)
    whole = plan_sampled_rounds(placement="distributed", min_reports=100, **setting)
    alone = plan_sampled_rounds(placement="distributed", min_reports=100, alone=True, **setting)
    assert alone.rounds < whole.rounds
    local = plan_sampled_rounds(**{k: v for k, v in setting.items() if k not in ("clip", "dim")})
    assert whole.rounds <= local.rounds  # the general bound pays for not knowing the Skellam law exactly


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (dict(sampling_rate=0.0), "sampling_rate"),
        (dict(sampling_rate=1.5), "sampling_rate"),
        (dict(sampling_rate=math.nan), "sampling_rate"),
        (dict(kind="gdp"), "filter='gdp'"),
        (dict(order=3.05), "order"),
        (dict(noise_multiplier=-1.0), "noise_multiplier"),
        (dict(placement="central"), "placement"),
    ],
)
def test_bad_settings_are_named(change, field):
    setting = {**dict(epsilon=1.0, delta=1e-5, noise_multiplier=1.1, sampling_rate=0.01), **change}
    with pytest.raises(ValueError, match=field):
        plan_sampled_rounds(**setting)


def test_the_command_refuses_a_gaussian_only_filter(capsys):
    from fedfilter.cli import main

    with pytest.raises(SystemExit, match="needs --filter rdp"):
        main(
            [
                "rounds",
                "--epsilon",
                "1",
                "--delta",
                "1e-5",
                "--noise-multiplier",
                "1",
                "--sampling-rate",
                "0.1",
                "--filter",
                "gdp",
            ]
        )


def test_the_derivations_table_is_what_the_code_and_dp_accounting_say():
    """Every row of docs/derivations/amplification.md's table, recomputed."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "derivations" / "amplification.md").read_text()
    rows = [line for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 6
    for row in rows:
        eps, delta, z, q, ours, theirs, order = (c.strip().replace(",", "") for c in row.strip("|").split("|"))
        plan = plan_sampled_rounds(
            epsilon=float(eps), delta=float(delta), noise_multiplier=float(z), sampling_rate=float(q)
        )
        assert (plan.rounds, plan.order) == (int(ours), float(order)), row
        assert dp_accounting_count(float(eps), float(delta), float(z), float(q)) == int(theirs), row


def test_the_rate_for_a_budget_spends_it_over_the_planned_asks():
    from fedfilter.planning.sampled_rounds import rate_for_budget

    setting = dict(delta=1e-5, noise_multiplier=1.1)
    rates = [rate_for_budget(epsilon=e, asks=60, **setting) for e in (2.0, 4.0, 6.0)]
    assert 0 < rates[0] < rates[1] < rates[2] < 1  # larger budgets contribute more often
    for e, q in zip((2.0, 4.0, 6.0), rates):
        assert plan_sampled_rounds(epsilon=e, sampling_rate=q, **setting).rounds >= 60
        assert plan_sampled_rounds(epsilon=e, sampling_rate=q * 1.01, **setting).rounds < 60
    assert rate_for_budget(epsilon=6.0, asks=60, cap=0.05, **setting) == 0.05  # the owner's cap
    assert rate_for_budget(epsilon=6.0, asks=1, **setting) == 1.0  # the budget pays for every ask
    assert rate_for_budget(epsilon=0.01, asks=10**6, **setting) == 0.0
    with pytest.raises(ValueError, match="asks"):
        rate_for_budget(epsilon=1.0, asks=0, **setting)


def _spent_fraction(epsilon: float, z: float, q: float, asks: int, setting: dict | None = None) -> float:
    """The share of its epsilon a fresh device has spent after ``asks`` asks at rate ``q``: its own filter
    at the order it enrols at, each ask charged the full-clip sampled loss (as the ledger charges it)."""
    from fedfilter.planning.sampled_rounds import enrolment_order
    from fedfilter.privacy.filters import make_filter

    order = enrolment_order(epsilon=epsilon, delta=1e-5, noise_multiplier=z, asks=asks)
    filt = make_filter("rdp", epsilon, 1e-5, [float(order)])
    charge = full_ask_charge(order=order, noise_multiplier=z, sampling_rate=q, **(setting or {}))
    state = filt.initial_state()
    for _ in range(asks):
        state = filt.spend(state, np.array([charge]))
    assert filt.within_budget(state).all()
    return filt.epsilon_spent(state) / epsilon


def test_the_sampling_plan_takes_the_z_with_the_most_signal_over_noise_among_those_that_spend_every_budget():
    from fedfilter.planning.sampled_rounds import plan_sampling, rate_for_budget

    grid, budgets, shares = [1.2, 1.6, 2.4], (2.0, 4.0, 6.0), (0.5, 0.3, 0.2)
    plan = plan_sampling(budgets=list(budgets), shares=list(shares), delta=1e-5, asks=6, noise_multipliers=grid)
    limit = plan.spending_limit
    assert 1.6 < limit < 2.4  # the largest budget's rate reaches 1 at about z 1.99
    scores = {}
    for z in grid:
        rates = [rate_for_budget(epsilon=e, delta=1e-5, noise_multiplier=z, asks=6) for e in budgets]
        scores[z] = sum(s * q for s, q in zip(shares, rates)) / z
    spending = {z: v for z, v in scores.items() if z <= limit}
    assert plan.noise_multiplier == max(spending, key=spending.get) and plan.spends_every_budget
    assert plan.signal_per_noise == pytest.approx(max(spending.values()))
    assert plan.rates[0] < plan.rates[1] < plan.rates[2] < 1  # larger budgets contribute more often
    # Asked as planned, every tier ends with at least 90% of its budget spent...
    for e, q in zip(budgets, plan.rates):
        assert 0.9 <= _spent_fraction(e, plan.noise_multiplier, q, 6) <= 1.0
    # ...which the z with the most signal over noise would not give: there the largest budget runs at
    # rate 1 and ends with more than a tenth of it unspent.
    best = max(scores, key=scores.get)
    assert best > limit and scores[best] > plan.signal_per_noise
    assert _spent_fraction(6.0, best, 1.0, 6) < 0.9
    # A z the caller fixes stays theirs, and the plan says it leaves budget unspent.
    fixed = plan_sampling(budgets=[2.0, 6.0], delta=1e-5, asks=6, noise_multipliers=[2.4])
    assert fixed.noise_multiplier == 2.4 and not fixed.spends_every_budget
    with pytest.raises(ValueError, match="shares"):
        plan_sampling(budgets=[2.0, 4.0], shares=[0.5, 0.6], delta=1e-5, asks=6)
    with pytest.raises(ValueError, match="budgets"):
        plan_sampling(budgets=[], delta=1e-5, asks=6)


def test_the_sampling_plan_stays_within_the_noise_the_devices_accept():
    """Distributed placement: above SecAgg+'s range for the devices asked every device refuses the round,
    so a plan there would release nothing; the limit joins the grid and bounds it."""
    from fedfilter.planning.sampled_rounds import plan_sampling

    plan = plan_sampling(budgets=[1.0], delta=1e-5, asks=3, noise_multipliers=[0.8, 1.6], noise_limit=1.2)
    assert plan.noise_multiplier == 0.8
    unlimited = plan_sampling(budgets=[1.0], delta=1e-5, asks=3, noise_multipliers=[0.8, 1.6])
    assert unlimited.noise_multiplier == 1.6  # the limit is what moved it
    with pytest.raises(ValueError, match="noise_limit 0.5"):
        plan_sampling(budgets=[1.0], delta=1e-5, asks=3, noise_multipliers=[0.8, 1.6], noise_limit=0.5)
    with pytest.raises(ValueError, match="noise_limit"):
        plan_sampling(budgets=[1.0], delta=1e-5, asks=3, noise_limit=float("nan"))


def test_without_a_grid_the_plan_finds_the_z_where_a_budget_saturates_its_rate():
    """Asked as often as the run is long, a self-sampling device gains nothing over contributing every time
    (the subsampled loss is about q^2 the unsampled one, so q / z stays put below the cap): the plan's z
    is the least at which rate 1 pays for every ask, which a grid alone could miss by 13%."""
    from fedfilter.planning.sampled_rounds import plan_sampling

    plan = plan_sampling(budgets=[4.0], delta=1e-5, asks=10)
    z = plan.noise_multiplier
    assert plan.rates == (1.0,)
    rounds = plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=z, sampling_rate=1.0).rounds
    fewer = plan_sampled_rounds(epsilon=4.0, delta=1e-5, noise_multiplier=z * (1 - 1e-5), sampling_rate=1.0).rounds
    assert rounds >= 10 > fewer


def test_the_sampling_plan_reports_its_progress_once_per_rate_and_plans_the_same():
    calls = []
    kw = dict(budgets=[2.0, 6.0], delta=1e-5, asks=6, noise_multipliers=[1.0, 1.5, 2.5])
    plan = plan_sampling(**kw, progress=lambda done, total: calls.append((done, total)))
    # z 2.5 is above the spending limit (1.99): two z's, two budgets, four rates.
    assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]
    assert plan == plan_sampling(**kw)
