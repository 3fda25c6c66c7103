"""The durable budget ledger: immutable enrolment, append-only spends, replay refusal, quotas,
and concurrent rounds from several processes never overspending."""

import multiprocessing as mp
import sqlite3

import numpy as np
import pytest

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.ledger.storage import ReplayError
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def enrol(tmp_path, **kw):
    args = dict(client_id="dev-1", epsilon=1.0, delta=1e-5)
    args.update(kw)
    return BudgetLedger.enrol(tmp_path, **args)


def test_enrolment_is_set_once(tmp_path):
    enrol(tmp_path).close()
    again = enrol(tmp_path)  # same budget: opens
    assert again.enrolment.epsilon == 1.0
    again.close()
    with pytest.raises(ValueError, match="epsilon: enrolled 1.0, requested 5.0"):
        enrol(tmp_path, epsilon=5.0)
    with pytest.raises(ValueError, match="filter"):
        enrol(tmp_path, filter_kind="rdp")


def test_sql_cannot_raise_or_reset_the_budget(tmp_path):
    ledger = enrol(tmp_path)
    FilteredClient(ledger).release(RoundSpec("r", 0, 1.0, 1.0), [np.ones(3)])
    conn = sqlite3.connect(tmp_path / LEDGER_FILE)
    for sql in (
        "UPDATE enrolment SET epsilon = 100",
        "DELETE FROM enrolment",
        "UPDATE spends SET charge = '[0.0]'",
        "DELETE FROM spends",
    ):
        with pytest.raises(sqlite3.IntegrityError):
            conn.execute(sql)
    conn.close()


def test_bad_enrolment_names_every_field_and_writes_nothing(tmp_path):
    with pytest.raises(ValueError) as err:
        BudgetLedger.enrol(tmp_path / "x", client_id="", epsilon=float("nan"), delta=2.0, filter_kind="pld")
    msg = str(err.value)
    for field in ("client_id", "epsilon", "delta", "filter"):
        assert field in msg
    assert not (tmp_path / "x").exists()


def test_replay_gets_no_second_release(tmp_path):
    client = FilteredClient(enrol(tmp_path))
    client.release(RoundSpec("run", 3, 1.0, 1.0), [np.ones(3)])
    before = client.ledger.state().copy()
    with pytest.raises(ReplayError):
        client.release(RoundSpec("run", 3, 1.0, 1.0), [np.ones(3)])
    assert np.array_equal(client.ledger.state(), before)
    assert len(client.ledger.records()) == 1


def test_spent_survives_reopen_and_new_runs(tmp_path):
    client = FilteredClient(enrol(tmp_path))
    for r in range(3):
        client.release(RoundSpec("run-a", r, 2.0, 1.0), [np.full(4, 0.02)])
    state = client.ledger.state().copy()
    client.ledger.close()
    reopened = BudgetLedger.open(tmp_path)
    assert np.array_equal(reopened.state(), state)
    assert np.array_equal(reopened.recomputed_state(), state)
    FilteredClient(reopened).release(RoundSpec("run-b", 0, 2.0, 1.0), [np.full(4, 0.02)])
    assert reopened.state()[0] > state[0]
    s = reopened.summary()
    assert [r["run_id"] for r in s["runs"]] == ["run-a", "run-b"]


def test_run_quota_caps_one_run(tmp_path):
    client = FilteredClient(enrol(tmp_path, run_quota=0.25))
    statuses = [client.release(RoundSpec("greedy", r, 1.0, 10.0), [np.ones(10)]).status for r in range(20)]
    assert "noise-only" in statuses
    ledger = client.ledger
    assert ledger.run_state("greedy")[0] <= 0.25 * ledger.filter.budget[0]
    # A new run may spend again, up to its own quota.
    assert client.release(RoundSpec("next", 0, 1.0, 10.0), [np.ones(10)]).status == "contributed"


def _spend_worker(directory, worker, rounds, queue):
    ledger = BudgetLedger.open(directory)
    client = FilteredClient(ledger, noise_seed=worker)
    released = 0.0
    for r in range(rounds):
        rel = client.release(RoundSpec(f"run-{worker}", r, 1.0, 1.0), [np.full(5, 0.2)])
        released += rel.sensitivity**2
    queue.put(released)


def test_concurrent_processes_never_overspend(tmp_path):
    ledger = enrol(tmp_path, epsilon=2.0)
    budget = ledger.filter.budget[0]
    ledger.close()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_spend_worker, args=(tmp_path, w, 30, queue)) for w in range(4)]
    for p in procs:
        p.start()
    total = sum(queue.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    # Released sensitivities (mu_t^2 with noise std 1) add up to at most the budget.
    assert total <= budget * (1 + 1e-12)
    final = BudgetLedger.open(tmp_path)
    assert final.state()[0] <= budget
    assert final.state()[0] >= total * (1 - 1e-12)
    assert len(final.records()) == 120


def test_the_ledger_composes_its_accounts_and_they_read_what_it_wrote(tmp_path):
    """The quota and worst-case accounts are objects the ledger holds (no mixins): each reads the ledger's
    own database, so what a round recorded is what the accounts see, also after the ledger is reopened."""
    from fedfilter.client.ledger.quota import QuotaAccounts, Quotas
    from fedfilter.client.ledger.worst_case_storage import WorstCaseAccount
    from fedfilter.client.mechanisms.spend import ReleaseRecord

    assert BudgetLedger.__bases__ == (object,)
    state_dir = tmp_path / "owner"
    quotas = Quotas(federation="f", coordinator=0.5, daily=0.5)
    ledger = BudgetLedger.enrol(
        tmp_path / "d",
        client_id="a",
        epsilon=4.0,
        delta=1e-5,
        quotas=quotas,
        state_dir=state_dir,
        worst_case_epsilon=8.0,
    )
    assert isinstance(ledger.quota_accounts, QuotaAccounts) and isinstance(ledger.worst_account, WorstCaseAccount)
    assert ledger.quotas is quotas and ledger.worst_filter is ledger.worst_account.filter is not None
    with ledger.reserve("run", 0) as r:
        sens = r.allowance(noise_std=2.0, clip=1.0)
        charge = r.filter.charge(sensitivity=sens, noise_std=2.0)
        worst = r.worst_filter.charge(sensitivity=sens, noise_std=2.0)
        record = ReleaseRecord("contributed", "distributed", sens, 2.0, 2.0, 1.0, charge, worst)
        r.commit(record)
    spent = ledger.coordinator_state("f")
    assert np.array_equal(spent, ledger.state()) and np.any(spent > 0)
    worst_state = ledger.worst_state()
    ledger.close()
    again = BudgetLedger.open(tmp_path / "d", quotas=quotas, state_dir=state_dir)
    assert np.array_equal(again.coordinator_state("f"), spent)
    assert np.array_equal(again.worst_state(), worst_state)
    assert again.worst_case is not None and again.worst_case.epsilon == 8.0
    again.close()
