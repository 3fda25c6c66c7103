"""The owner's quotas cap the worst-case account too (``client/ledger/quota.py``): per run, per
coordinator (federation) and per day, each the same fraction of the worst-case budget as of the
lifetime one. A round goes ahead only if both accounts' quotas admit it; a commit that does not fit
names the account and the quota, and spends nothing.

The reference is the ledger's own rows: every worst-case charge re-added one by one with the worst-case
filter (never the quota code's sums).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.skellam_release import release_skellam

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.quota import Quotas
from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import secaggplus_settings

N_SAMPLED, M, FRACTION = 10, 10, 0.25
Q = secaggplus_settings(N_SAMPLED)["quantization_range"]
POLICY = ClientPolicy(allow_distributed=True)


def enrol(tmp_path, cap: str) -> BudgetLedger:
    """Epsilon 8 and worst-case-epsilon 8 at m = 10: the worst-case account binds long before the main
    one, so only a quota on it can stop this device at FRACTION of it."""
    return BudgetLedger.enrol(
        tmp_path,
        client_id="d",
        epsilon=8.0,
        delta=1e-5,
        filter_kind="rdp",
        worst_case_epsilon=8.0,
        run_quota=FRACTION if cap == "run" else 1.0,
        quotas=Quotas(
            federation="acme",
            coordinator=FRACTION if cap == "coordinator" else 1.0,
            daily=FRACTION if cap == "daily" else 1.0,
        ),
    )


def worst_spent(ledger: BudgetLedger) -> float:
    """The worst-case charges of every row, re-added one by one (all rows: one run, one federation, one day)."""
    worst = ledger.worst_filter
    assert worst is not None
    state = worst.initial_state()
    for rec in ledger.records():
        assert rec.worst_charge is not None
        state = worst.spend(state, rec.worst_charge)
    return float(state[0])


@pytest.mark.parametrize("cap", ["run", "coordinator", "daily"])
def test_each_quota_caps_the_worst_case_account_at_its_fraction(tmp_path, cap):
    ledger = enrol(tmp_path, cap)
    rng = np.random.default_rng(1)
    statuses = []
    for r in range(30):
        spec = RoundSpec("run-q", r, 1.0, 1.0, placement="distributed", min_reports=M)
        grid = skellam_grid(spec, target_range=Q, sample_num=N_SAMPLED)
        update = [(rng.normal(size=500) * 0.1).astype(np.float32)]
        statuses.append(release_skellam(ledger, POLICY, spec, update, grid).status)
    worst = ledger.worst_filter
    assert worst is not None
    budget = float(worst.budget[0])
    spent = worst_spent(ledger)
    # Within its quota of the worst-case budget, and it did get most of it before it stopped.
    assert 0.8 * FRACTION * budget <= spent <= FRACTION * budget
    assert statuses[0] == "contributed" and statuses[-1] == "noise-only"
    # The main account spent far less than its own quota: the worst-case account's quota bound.
    assert float(ledger.state()[0]) < 0.2 * FRACTION * float(ledger.filter.budget[0])
    ledger.close()


def test_the_daily_worst_case_quota_frees_up_a_day_later(tmp_path):
    ledger = enrol(tmp_path, "daily")
    now = [1e9]
    ledger.clock = lambda: now[0]
    rng = np.random.default_rng(2)

    def day(first_round: int) -> list[str]:
        out = []
        for r in range(first_round, first_round + 20):
            spec = RoundSpec("run-d", r, 1.0, 1.0, placement="distributed", min_reports=M)
            grid = skellam_grid(spec, target_range=Q, sample_num=N_SAMPLED)
            update = [(rng.normal(size=500) * 0.1).astype(np.float32)]
            out.append(release_skellam(ledger, POLICY, spec, update, grid).status)
        return out

    assert day(0)[-1] == "noise-only"
    now[0] += 86_400 + 1
    assert day(100)[0] == "contributed"  # the window has moved on
    worst = ledger.worst_filter
    assert worst is not None
    assert worst_spent(ledger) <= 2 * FRACTION * float(worst.budget[0])
    ledger.close()


@pytest.mark.parametrize(
    "which, named",
    [("worst", "the worst-case account's coordinator quota"), ("main", "the main account's coordinator quota")],
)
def test_a_charge_over_either_accounts_quota_is_refused_naming_it_and_nothing_is_spent(tmp_path, which, named):
    ledger = enrol(tmp_path, "coordinator")
    worst = ledger.worst_filter
    assert worst is not None
    small = np.array([1e-6])
    # Half of a budget: within the budget, over the 25 % quota.
    main_charge = ledger.filter.budget * 0.5 if which == "main" else small
    worst_charge = worst.budget * 0.5 if which == "worst" else small
    record = ReleaseRecord("contributed", "distributed", 0.1, 0.1, 1.0, 1.0, main_charge, worst_charge)
    with pytest.raises(RuntimeError, match=named):
        with ledger.reserve("run-r", 0) as tx:
            assert tx.worst_admits(small) and tx.admits(small)
            assert tx.worst_admits(worst_charge) == (which != "worst")
            assert tx.admits(main_charge) == (which != "main")
            tx.commit(record)
    assert ledger.records() == [] and float(ledger.state()[0]) == 0.0
    ledger.close()
