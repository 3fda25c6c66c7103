"""Losing the ledger is never a fresh budget, and a full disk says so.

Driven through the real mod (``individual_filter_mod``) as a device would be: the owner enrols
once, rounds are served, then the ledger's files are lost in the ways a disk loses them.
"""

import logging
import shutil
import sqlite3

import numpy as np
import pytest
from helpers.ledger import _schema_1_ledger, assert_refused, restart_device
from helpers.mods import Handler, context, spec, train_message

from fedfilter.cli import main as cli_main
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower import ledger_cache as device_ledgers
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.owner import migrate
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.ledger.seal import SEAL_FILE
from fedfilter.client.ledger.storage import LedgerUnavailableError, LedgerWriteError
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def serve(ctx, rounds, run_id="run-a", handler=None):
    handler = handler or Handler()
    replies = [
        individual_filter_mod(train_message(spec(r, run_id=run_id), message_id=f"{run_id}{r}"), ctx, handler)
        for r in rounds
    ]
    assert not any(r.has_error() for r in replies), [r.error.reason for r in replies if r.has_error()]
    return replies


@pytest.fixture
def served(tmp_path):
    """A device enrolled by its owner that has answered three rounds."""
    ctx = context(tmp_path, **{"budget-epsilon": 4.0})
    serve(ctx, (1, 2, 3))
    return tmp_path / "ledger", ctx


def test_the_mod_never_enrols(tmp_path, caplog):
    ctx = context(tmp_path, enrol=False)  # budget-epsilon is in the node config, but no enrolment
    assert_refused(ctx, caplog, "not enrolled", "fedfilter ledger enrol")
    assert not (tmp_path / "ledger" / LEDGER_FILE).exists()


@pytest.mark.parametrize("lose", ["directory", "database", "empty"])
def test_a_deleted_or_emptied_ledger_is_refused(served, caplog, lose):
    ledger_dir, ctx = served
    restart_device()
    if lose == "directory":
        shutil.rmtree(ledger_dir)
    elif lose == "database":
        for name in (LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm"):
            (ledger_dir / name).unlink(missing_ok=True)
    else:
        (ledger_dir / LEDGER_FILE).write_bytes(b"")
    assert_refused(ctx, caplog, "ledger")
    # Still refused on every later round, and nothing was re-created behind the owner's back.
    assert_refused(ctx, caplog, "ledger")
    if lose != "empty":
        assert not (ledger_dir / LEDGER_FILE).exists()


def _checkpointed(ledger_dir):
    restart_device()  # closing the last connection checkpoints the WAL into the main file
    assert not (ledger_dir / (LEDGER_FILE + "-wal")).exists()
    return (ledger_dir / LEDGER_FILE).stat().st_size


def test_a_truncated_ledger_is_refused(served, caplog):
    ledger_dir, ctx = served
    serve(ctx, range(4, 40))  # enough rows to span several pages
    size = _checkpointed(ledger_dir)
    with open(ledger_dir / LEDGER_FILE, "r+b") as f:
        f.truncate(size // 2)
    assert_refused(ctx, caplog, "ledger")


def test_a_truncation_that_keeps_a_valid_older_database_is_caught_by_the_seal(served, caplog):
    ledger_dir, ctx = served
    size = _checkpointed(ledger_dir)
    old = (ledger_dir / LEDGER_FILE).read_bytes()  # a valid older state: three spends
    serve(ctx, (4, 5, 6))
    _checkpointed(ledger_dir)
    (ledger_dir / LEDGER_FILE).write_bytes(old)  # rolled back to it (same size, older content)
    assert (ledger_dir / LEDGER_FILE).stat().st_size == size
    assert_refused(ctx, caplog, "lost spends", "#6")


def test_a_ledger_whose_wal_was_lost_is_refused(served, caplog, tmp_path):
    ledger_dir, ctx = served  # the three spends are in the -wal; the mod's connection is still open
    assert (ledger_dir / (LEDGER_FILE + "-wal")).stat().st_size > 0
    restored = tmp_path / "restored"
    restored.mkdir()
    for name in (LEDGER_FILE, SEAL_FILE):  # the -wal is lost (e.g. a crash of the disk cache)
        shutil.copy2(ledger_dir / name, restored / name)
    conn = sqlite3.connect(restored / LEDGER_FILE)  # what the attack exploited: a fresh budget
    assert conn.execute("SELECT COUNT(*) FROM spends").fetchone()[0] == 0
    conn.close()
    ctx2 = context(tmp_path, enrol=False, **{"ledger-dir": str(restored)})
    assert_refused(ctx2, caplog, "lost spends", "#3")
    conn = sqlite3.connect(restored / LEDGER_FILE)
    assert conn.execute("SELECT COUNT(*) FROM spends").fetchone()[0] == 0  # nothing written
    conn.close()


def test_a_lost_seal_is_refused(served, caplog):
    ledger_dir, ctx = served
    restart_device()
    (ledger_dir / SEAL_FILE).unlink()
    assert_refused(ctx, caplog, "no seal")


def test_a_damaged_seal_is_refused(served, caplog):
    ledger_dir, ctx = served
    restart_device()
    text = (ledger_dir / SEAL_FILE).read_text()
    (ledger_dir / SEAL_FILE).write_text(text.replace('"seq": 3', '"seq": 2'))
    assert_refused(ctx, caplog, "damaged seal")


def test_enrol_refuses_a_lost_ledger_until_the_owner_chooses(served, capsys):
    ledger_dir, _ = served
    restart_device()
    (ledger_dir / LEDGER_FILE).unlink()
    args = ["ledger", "enrol", "--dir", str(ledger_dir), "--client-id", "alice", "--epsilon", "4", "--delta", "1e-5"]
    assert cli_main(args) != 0
    assert "--recover" in capsys.readouterr().err
    assert cli_main(args + ["--recover", "replace"]) == 0
    lost = list(ledger_dir.glob("lost-*"))
    assert len(lost) == 1 and (lost[0] / SEAL_FILE).exists()  # the old seal is kept for the record
    ledger = BudgetLedger.open(ledger_dir)
    assert ledger.records() == []
    ledger.close()


def test_enrol_refuses_a_database_that_lost_its_seal_until_the_owner_chooses(served, capsys):
    # A restored copy arrives without its seal: re-enrolling with the same budget must not quietly
    # seal whatever the copy holds (a mutant without this refusal survived the mutation run).
    ledger_dir, _ = served
    restart_device()
    (ledger_dir / SEAL_FILE).unlink()
    args = ["ledger", "enrol", "--dir", str(ledger_dir), "--client-id", "alice", "--epsilon", "4", "--delta", "1e-5"]
    assert cli_main(args) != 0
    assert "--recover" in capsys.readouterr().err
    assert not (ledger_dir / SEAL_FILE).exists()  # nothing was sealed by the refused enrolment


def test_reseal_accepts_the_database_as_it_is(served):
    ledger_dir, _ = served
    restart_device()
    (ledger_dir / SEAL_FILE).unlink()
    with pytest.raises(LedgerUnavailableError, match="no seal"):
        BudgetLedger.open(ledger_dir)
    BudgetLedger.enrol(ledger_dir, client_id="alice", epsilon=4.0, delta=1e-5, recover="reseal").close()
    ledger = BudgetLedger.open(ledger_dir)
    assert len(ledger.records()) == 3
    ledger.close()


def test_a_crash_between_commit_and_seal_is_not_a_loss(tmp_path):
    # The seal may lag the database by a commit (nothing was released after it): still opens.
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5)
    client = FilteredClient(ledger)
    client.release(RoundSpec("r", 0, 1.0, 1.0), [np.ones(3)])
    seal_before = (tmp_path / SEAL_FILE).read_bytes()
    client.release(RoundSpec("r", 1, 1.0, 1.0), [np.ones(3)])
    ledger.close()
    (tmp_path / SEAL_FILE).write_bytes(seal_before)
    reopened = BudgetLedger.open(tmp_path)
    assert len(reopened.records()) == 2
    reopened.close()


def test_a_full_disk_is_reported_as_a_full_disk_and_nothing_is_released(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=1e3, delta=1e-5)
    client = FilteredClient(ledger)
    pages = ledger._conn.execute("PRAGMA page_count").fetchone()[0]
    ledger._conn.execute(f"PRAGMA max_page_count={pages}")  # SQLite's own "disk full" (SQLITE_FULL)
    released = 0
    with pytest.raises(LedgerWriteError) as err:
        for r in range(10_000):
            client.release(RoundSpec("r", r, 1.0, 1.0), [np.ones(200)])
            released += 1
    text = str(err.value)
    assert "full" in text and str(tmp_path) in text and "bytes free" in text
    assert "cannot rollback" not in text
    # The ledger is intact and holds exactly the rounds that were released.
    assert len(ledger.records()) == released
    assert np.array_equal(ledger.state(), ledger.recomputed_state())
    ledger.close()


def test_a_failed_seal_write_releases_nothing(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5)
    client = FilteredClient(ledger)
    (tmp_path / (SEAL_FILE + ".tmp")).mkdir()  # the seal cannot be written
    with pytest.raises(LedgerWriteError, match="budget ledger"):
        client.release(RoundSpec("r", 0, 1.0, 1.0), [np.ones(3)])
    assert len(ledger.records()) == 1  # the spend is committed (wasted, never lost)
    ledger.close()


def test_a_schema_1_ledger_is_refused_until_its_owner_migrates_it_keeping_its_spends(tmp_path):
    _schema_1_ledger(tmp_path / "old")
    with pytest.raises(LedgerUnavailableError, match="older format.*fedfilter ledger migrate"):
        BudgetLedger.open(tmp_path / "old")
    with pytest.raises(LedgerUnavailableError, match="fedfilter ledger migrate"):  # enrol does not migrate either
        BudgetLedger.enrol(tmp_path / "old", client_id="old", epsilon=4.0, delta=1e-5)
    assert not (tmp_path / "old" / SEAL_FILE).exists()  # nothing was sealed behind the owner's back
    ledger, migrated = migrate(tmp_path / "old")
    assert migrated
    assert ledger.state()[0] >= 0.25 and (tmp_path / "old" / SEAL_FILE).exists()
    FilteredClient(ledger).release(RoundSpec("r2", 0, 1.0, 1.0), [np.ones(3)])
    assert ledger.state()[0] > 0.25 and np.array_equal(ledger.state(), ledger.recomputed_state())
    ledger.close()
    BudgetLedger.open(tmp_path / "old").close()  # sealed and anchored from now on


def test_a_schema_1_copy_of_a_sealed_ledger_is_refused(tmp_path):
    _schema_1_ledger(tmp_path / "old")
    migrate(tmp_path / "old")[0].close()
    seal = (tmp_path / "old" / SEAL_FILE).read_bytes()
    shutil.rmtree(tmp_path / "old")
    _schema_1_ledger(tmp_path / "old")  # the migration (and what followed) was lost
    (tmp_path / "old" / SEAL_FILE).write_bytes(seal)
    with pytest.raises(LedgerUnavailableError, match="older copy"):
        BudgetLedger.open(tmp_path / "old")
    with pytest.raises(LedgerUnavailableError, match="older copy.*accept-restore"):
        migrate(tmp_path / "old")


def test_a_full_disk_through_the_mod_is_logged_as_such_and_releases_nothing(served, caplog):
    ledger_dir, ctx = served
    (entry,) = device_ledgers._ledgers.values()  # the device's open ledger
    conn = entry.ledger._conn
    conn.execute(f"PRAGMA max_page_count={conn.execute('PRAGMA page_count').fetchone()[0]}")
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        for r in range(4, 10_000):
            reply = individual_filter_mod(train_message(spec(r), message_id=f"f{r}"), ctx, Handler())
            if reply.has_error():
                break
    assert reply.has_error() and not reply.has_content() and "ledger" in reply.error.reason
    assert "full" in caplog.text and str(ledger_dir) in caplog.text and "cannot rollback" not in caplog.text
    restart_device()
    ledger = BudgetLedger.open(ledger_dir)  # intact, and it holds every round that was answered
    assert len(ledger.records()) == r - 1
    ledger.close()


def test_a_read_only_ledger_is_reported_as_read_only_and_nothing_is_released(tmp_path):
    ledger = BudgetLedger.enrol(tmp_path, client_id="d", epsilon=4.0, delta=1e-5)
    ledger._conn.execute("PRAGMA query_only=1")  # SQLite's own SQLITE_READONLY, as on a read-only mount
    with pytest.raises(LedgerWriteError, match="read-only") as err:
        FilteredClient(ledger).release(RoundSpec("r", 0, 1.0, 1.0), [np.ones(3)])
    assert str(tmp_path) in str(err.value)
    ledger._conn.execute("PRAGMA query_only=0")
    assert ledger.records() == []
    ledger.close()
