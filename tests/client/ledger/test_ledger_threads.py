"""Threads sharing one BudgetLedger / FilteredClient, without the mod's lock.

Two threads release rounds at once through the core API. Before the ledger held its own lock they
shared one SQLite connection: one thread's ``BEGIN IMMEDIATE`` failed inside the other's
transaction, its ``ROLLBACK`` undid the other's reservation, and the budget was overspent.
"""

import threading

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import ReplayError
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec

TRIALS = 60
ROUNDS = 8  # per thread; the budget admits about 7 full rounds of norm 0.1 in all


def _race(client: FilteredClient, run_id: str, barrier: threading.Barrier, out: list, errors: list) -> None:
    try:
        barrier.wait()
        for r in range(ROUNDS):
            rel = client.release(RoundSpec(run_id, r, 1.0, 1.0), [np.full(4, 0.05)])  # norm 0.1
            out.append((rel.status, rel.sensitivity))
    except BaseException as err:  # noqa: BLE001 - reported by the main thread
        errors.append(err)


def _trial(directory, shared_run: bool) -> tuple[float, np.ndarray, np.ndarray, int, int, float]:
    ledger = BudgetLedger.enrol(directory, client_id="t", epsilon=1.0, delta=1e-5)
    client = FilteredClient(ledger)
    barrier, out, errors = threading.Barrier(2), [], []
    runs = ("run", "run") if shared_run else ("run-a", "run-b")
    threads = [threading.Thread(target=_race, args=(client, run, barrier, out, errors)) for run in runs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    # Same (run, round) from both threads: exactly one gets it, the other a ReplayError.
    unexpected = [e for e in errors if not isinstance(e, ReplayError)]
    assert not unexpected, unexpected
    released = sum(s * s for _, s in out)  # mu_t^2 with accounted noise std z*C = 1
    result = (
        released,
        ledger.state(),
        ledger.recomputed_state(),
        len(ledger.records()),
        len(out),
        float(ledger.filter.budget[0]),
    )
    ledger.close()
    return result


def test_two_threads_on_one_ledger_never_overspend_or_break_the_chain(tmp_path):
    for trial in range(TRIALS):
        released, state, recomputed, n_records, n_released, budget = _trial(tmp_path / str(trial), trial % 2 == 1)
        assert released <= budget * (1 + 1e-12), (trial, released, budget)
        assert state[0] <= budget, (trial, state, budget)
        assert np.array_equal(state, recomputed), (trial, state, recomputed)
        assert state[0] >= released * (1 - 1e-12), (trial, state, released)
        assert n_records == n_released, trial  # every release has its row, and no row lacks one


def test_reads_during_concurrent_spends_never_fail(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="t", epsilon=50.0, delta=1e-5)
    client = FilteredClient(ledger)
    stop, errors = threading.Event(), []

    def reader():
        try:
            while not stop.is_set():
                ledger.state(), ledger.records(), ledger.has_release("run", 0), ledger.summary()
        except BaseException as err:  # noqa: BLE001
            errors.append(err)

    t = threading.Thread(target=reader)
    t.start()
    try:
        for r in range(30):
            client.release(RoundSpec("run", r, 1.0, 1.0), [np.full(4, 0.05)])
    finally:
        stop.set()
        t.join(30)
    assert not errors, errors
    assert np.array_equal(ledger.state(), ledger.recomputed_state())
    ledger.close()
