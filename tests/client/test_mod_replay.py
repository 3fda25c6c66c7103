"""Concurrent replays of one (run, round): exactly one release, the other copy an error Message.

A coordinator may send the same round twice at once, to one device process (two threads) or to
two processes sharing the device's ledger (e.g. a restarted SuperNode next to the old one). The
processes meet at a barrier *inside* the training handler, after the mod's fast "already
answered?" lookup, so both reach the ledger's write transaction and only its own replay rule
(``BudgetLedger.reserve``) stands between them and a second release.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from helpers.flower_messages import delivered

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import ReplayError
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record

KEYS = ["w", "b"]
SHAPES = [(6, 5), (5,)]
SPEC = RoundSpec(run_id="run-a", round_id=3, noise_multiplier=1.0, clip=1.0)


def _message(message_id: str) -> Message:
    content = RecordDict(
        {
            ARRAYS_RECORD: ArrayRecord({k: Array(np.zeros(s, dtype=np.float32)) for k, s in zip(KEYS, SHAPES)}),
            REQUEST_RECORD: request_record(SPEC),
        }
    )
    return delivered(content, message_id=message_id)


def _context(ledger_dir: Path) -> Context:
    # reply-hold-s 0: the replay, not the timing, is under test (test_reply_timing.py holds replies).
    config = {
        "ledger-dir": str(ledger_dir),
        "client-id": "alice",
        "budget-epsilon": 4.0,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
    }
    return Context(run_id=7, node_id=42, node_config=config, state=RecordDict(), run_config={})


class _Handler:
    """Adds 0.1 to every weight; optionally waits at a barrier first (with a timeout, so a mod
    that serialises whole messages across processes still finishes)."""

    def __init__(self, barrier=None):
        self.barrier = barrier

    def __call__(self, msg: Message, ctx: Context) -> Message:
        if self.barrier is not None:
            try:
                self.barrier.wait(timeout=10)
            except threading.BrokenBarrierError:
                pass
        record = next(iter(msg.content.array_records.values()))
        new = {k: Array(record[k].numpy() + np.float32(0.1)) for k in record.keys()}
        return Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)


def _summary(reply: Message) -> tuple[bool, str, bool]:
    if reply.has_error():
        return True, reply.error.reason, False
    return False, "", len(reply.content.array_records) > 0


def _mod_worker(ledger_dir: str, name: str, barrier, queue) -> None:
    try:
        reply = individual_filter_mod(_message(name), _context(Path(ledger_dir)), _Handler(barrier))
        queue.put((name, _summary(reply)))
    except BaseException as err:  # noqa: BLE001 - a crash is a result the test reports
        queue.put((name, ("crash", f"{type(err).__name__}: {err}", False)))


def _assert_exactly_one_release(results, ledger_dir: Path) -> None:
    released = [r for r in results if r[0] is False and r[2]]
    refused = [r for r in results if r[0] is True]
    assert len(released) == 1, f"expected exactly one release, got {results}"
    assert len(refused) == len(results) - 1, f"the duplicate must be an error Message, not {results}"
    for _, reason, _ in refused:
        assert "refused" in reason, reason
    ledger = BudgetLedger.open(ledger_dir)
    try:
        recs = ledger.records()
    finally:
        ledger.close()
    assert [(r.run_id, r.round_id) for r in recs] == [(SPEC.run_id, SPEC.round_id)]


def test_two_processes_replaying_one_round_get_exactly_one_release(tmp_path):
    ledger_dir = tmp_path / "ledger"
    enrol_device(_context(ledger_dir).node_config)
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_mod_worker, args=(str(ledger_dir), f"p{i}", barrier, queue)) for i in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=120)[1] for _ in procs]
    for p in procs:
        p.join(timeout=60)
    _assert_exactly_one_release(results, ledger_dir)


def test_two_threads_replaying_one_round_get_exactly_one_release(tmp_path):
    ledger_dir = tmp_path / "ledger"
    # Enrolled first: this test is about the replay, not about two first enrolments racing.
    enrol_device(_context(ledger_dir).node_config)
    results, start = [], threading.Barrier(2)

    def worker(name):
        start.wait(timeout=10)
        try:
            results.append(_summary(individual_filter_mod(_message(name), _context(ledger_dir), _Handler())))
        except BaseException as err:  # noqa: BLE001
            results.append(("crash", f"{type(err).__name__}: {err}", False))

    threads = [threading.Thread(target=worker, args=(f"t{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    _assert_exactly_one_release(results, ledger_dir)


def test_ledger_reserve_refuses_a_concurrent_duplicate_with_a_replay_error(tmp_path):
    # Two connections (as two processes would have): the second reserve waits for the first's
    # write lock, then must see its row and refuse; nothing of its own is written.
    BudgetLedger.enrol(tmp_path, client_id="alice", epsilon=4.0, delta=1e-5).close()
    first, second = BudgetLedger.open(tmp_path), BudgetLedger.open(tmp_path)
    holding, outcome = threading.Event(), []

    def duplicate():
        holding.wait(timeout=10)
        try:
            with second.reserve("run-a", 3):
                outcome.append("reserved")
        except ReplayError:
            outcome.append("replay")
        except BaseException as err:  # noqa: BLE001
            outcome.append(type(err).__name__)

    t = threading.Thread(target=duplicate)
    t.start()
    filt = first.filter
    with first.reserve("run-a", 3) as tx:
        holding.set()
        time.sleep(0.3)  # the duplicate is now blocked on the write lock
        charge = filt.charge(sensitivity=0.5, noise_std=1.0)
        tx.commit(ReleaseRecord("contributed", "local", 0.5, 1.0, 1.0, 1.0, charge, None))
    t.join(timeout=60)
    assert outcome == ["replay"]
    assert len(first.records()) == 1 and len(second.records()) == 1
    first.close()
    second.close()


def test_a_reservation_records_exactly_one_release_with_a_known_status(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="alice", epsilon=4.0, delta=1e-5)
    filt = ledger.filter
    charge = filt.charge(sensitivity=0.5, noise_std=1.0)

    def record(tx, status="contributed"):
        tx.commit(ReleaseRecord(status, "local", 0.5, 1.0, 1.0, 1.0, charge, None))

    with pytest.raises(ValueError, match="status"):
        with ledger.reserve("run-a", 1) as tx:
            record(tx, status="spent-nothing")
    assert ledger.records() == []  # the failed round rolled back: nothing spent
    with ledger.reserve("run-a", 1) as tx:
        record(tx)
        with pytest.raises(RuntimeError, match="exactly one"):
            record(tx)
    assert [(r.run_id, r.round_id) for r in ledger.records()] == [("run-a", 1)]
    ledger.close()
