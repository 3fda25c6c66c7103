"""A coordinator that opens a new run per round cannot renew what it may spend.

The per-run quota is keyed on the run-id, which the coordinator chooses; the owner's caps are keyed
on what it cannot renew: the device's own ``federation`` setting, and the device's clock (a rolling
24-hour window).
"""

import numpy as np
import pytest
from helpers.mods import Handler, context, records, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.quota import Quotas
from fedfilter.client.ledger.schema import DAY_S
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec

RUNS = 20


def new_run_per_round(tmp_path, **node):
    """The attack: every round in a new Flower run (fresh Context state) with a new run-id."""
    node = {"budget-epsilon": 4.0, "run-quota": 0.1, **node}
    statuses = []
    for k in range(RUNS):
        ctx = context(tmp_path, **node)
        reply = individual_filter_mod(
            train_message(spec(1, run_id=f"run-{k}"), message_id=f"m{k}"), ctx, Handler(step=1.0)
        )
        assert not reply.has_error(), reply.error.reason
        statuses.append(records(tmp_path)[0][-1].status)
    ledger = BudgetLedger.open(tmp_path / "ledger")
    try:
        return ledger.state()[0], float(ledger.filter.budget[0]), statuses, ledger.coordinator_state("acme")[0]
    finally:
        ledger.close()


def test_without_a_coordinator_quota_new_runs_renew_the_run_quota(tmp_path):
    spent, budget, statuses, _ = new_run_per_round(tmp_path)
    assert spent > 0.9 * budget  # the attack of the issue: ten 10 % runs spend it all


def test_a_new_run_per_round_cannot_spend_more_than_the_coordinator_quota(tmp_path):
    spent, budget, statuses, coordinator_spent = new_run_per_round(
        tmp_path, **{"federation": "acme", "coordinator-quota": 0.25}
    )
    assert spent <= 0.25 * budget and coordinator_spent == spent
    assert spent >= 0.25 * budget * (1 - 1e-3)  # it does get its quota
    assert statuses[:3] == ["contributed"] * 3 and set(statuses[4:]) == {"noise-only"}


def test_each_federation_has_its_own_cap_and_the_lifetime_budget_covers_them_all(tmp_path):
    spent = {}
    for fed in ("acme", "globex"):
        ledger = (
            BudgetLedger.open(tmp_path, quotas=Quotas(fed, coordinator=0.3))
            if spent
            else BudgetLedger.enrol(
                tmp_path, client_id="d", epsilon=4.0, delta=1e-5, quotas=Quotas(fed, coordinator=0.3)
            )
        )
        client = FilteredClient(ledger)
        for k in range(10):
            client.release(RoundSpec(f"{fed}-{k}", 0, 1.0, 1.0), [np.ones(100)])
        spent[fed] = ledger.coordinator_state(fed)[0]
        budget = float(ledger.filter.budget[0])
        # Independent reference: this federation's charges re-added one by one.
        ref = ledger.filter.initial_state()
        for rec in ledger.records():
            if rec.coordinator == fed:
                ref = ledger.filter.spend(ref, rec.charge)
        assert np.array_equal(ledger.coordinator_state(fed), ref)
        total = ledger.state()[0]
        ledger.close()
    assert all(0.3 * budget * (1 - 1e-3) <= s <= 0.3 * budget for s in spent.values())
    assert total == pytest.approx(sum(spent.values()), rel=1e-12) and total <= budget


def test_the_daily_quota_is_a_rolling_24_hours_of_the_device_clock(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5, quotas=Quotas(daily=0.2))
    client = FilteredClient(ledger)
    budget, now = float(ledger.filter.budget[0]), [1e9]
    ledger.clock = lambda: now[0]

    def spend_day(first_round):
        statuses = [
            client.release(RoundSpec("run", first_round + k, 1.0, 1.0), [np.ones(100)]).status for k in range(8)
        ]
        # The window the daily quota caps: every charge of the last 24 hours by the device's clock.
        window = ledger.filter.initial_state()
        for rec in ledger.records():
            if rec.created_at >= now[0] - DAY_S:
                window = ledger.filter.spend(window, rec.charge)
        return statuses, window[0]

    statuses, window = spend_day(0)
    assert "noise-only" in statuses and window <= 0.2 * budget
    now[0] += DAY_S / 2  # half a day later: the morning's spends still count
    statuses, window = spend_day(100)
    assert set(statuses) == {"noise-only"} and window <= 0.2 * budget
    now[0] += DAY_S / 2 + 1  # a day after the first spends: the window has moved on
    statuses, window = spend_day(200)
    assert statuses[0] == "contributed" and window <= 0.2 * budget
    assert ledger.state()[0] <= 0.4 * budget and ledger.state()[0] >= 0.4 * budget * (1 - 1e-3)
    ledger.close()


def test_a_quota_lowered_below_what_was_spent_means_noise_only(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5)
    FilteredClient(ledger).release(RoundSpec("a", 0, 1.0, 1.0), [np.ones(100)])
    ledger.close()
    ledger = BudgetLedger.open(tmp_path, quotas=Quotas(coordinator=1e-6))
    assert FilteredClient(ledger).release(RoundSpec("b", 0, 1.0, 1.0), [np.ones(100)]).status == "noise-only"
    ledger.close()


@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(federation=""), "federation"),
        (dict(coordinator=0.0), "coordinator"),
        (dict(daily=1.5), "daily"),
        (dict(daily=float("nan")), "daily"),
    ],
)
def test_bad_quotas_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        Quotas(**bad)


def test_bad_quota_settings_are_refused_by_the_mod(tmp_path):
    handler = Handler()
    reply = individual_filter_mod(train_message(spec()), context(tmp_path, **{"coordinator-quota": 2.0}), handler)
    assert reply.has_error() and "settings" in reply.error.reason and handler.calls == 0
