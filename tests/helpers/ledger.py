"""A device that restarts, serves rounds, and what a ledger refusal looks like through the mod.

Shared by the fail-closed, roll-back, anchor and migrate tests (tests/client/ledger/test_ledger_fail_closed.py,
test_ledger_rollback.py, test_ledger_anchor_binding.py, test_ledger_migrate.py, test_mod_errors.py);
``_schema_1_ledger`` writes a ledger as fedfilter did before seals (schema 1).
"""

import json
import logging
import sqlite3

import numpy as np

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower import ledger_cache as device_ledgers
from fedfilter.client.ledger.anchor import anchor_path
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import ANCHORED_KEY, LEDGER_FILE
from fedfilter.privacy.filters import make_filter
from helpers.mods import Handler, spec, train_message


def restart_device() -> None:
    """A device restart: the mod's process-wide cache of open ledgers is gone."""
    for key, entry in list(device_ledgers._ledgers.items()):
        device_ledgers.forget_ledger(key, entry)


STEP = 0.002  # a small update: each round spends a little of the budget, never all of it


def serve(ctx, rounds, run_id="run-a"):
    """The device answers these rounds through the mod; each must be answered."""
    for r in rounds:
        reply = individual_filter_mod(
            train_message(spec(r, run_id=run_id), message_id=f"{run_id}{r}"), ctx, Handler(STEP)
        )
        assert not reply.has_error(), reply.error.reason


def spent(ledger_dir):
    """(spends, lifetime epsilon spent) of the ledger at ``ledger_dir``, opened as the device does."""
    ledger = BudgetLedger.open(ledger_dir)
    try:
        return len(ledger.records()), ledger.spent_epsilon()
    finally:
        ledger.close()


def spend_rows(ledger_dir) -> int:
    """How many spends the database holds, read with plain SQLite (also when the device refuses it)."""
    conn = sqlite3.connect(ledger_dir / LEDGER_FILE)
    try:
        return conn.execute("SELECT COUNT(*) FROM spends").fetchone()[0]
    finally:
        conn.close()


def assert_refused(ctx, caplog, *log_words):
    handler = Handler()
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply = individual_filter_mod(train_message(spec(99), message_id="late"), ctx, handler)
    assert reply.has_error() and "ledger" in reply.error.reason
    assert not reply.has_content()  # an error, no arrays
    assert handler.calls == 0  # refused before training: nothing trained, spent or released
    for w in log_words:
        assert w in caplog.text, (w, caplog.text)


def _schema_1_ledger(directory):
    """A ledger as fedfilter wrote it before seals and coordinators (schema 1), with one spend."""
    directory.mkdir()
    state = json.dumps([float(make_filter("gdp", 4.0, 1e-5).spend(np.zeros(1), np.array([0.25]))[0])])
    conn = sqlite3.connect(directory / LEDGER_FILE)
    conn.executescript(
        """
        PRAGMA journal_mode=WAL;
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE enrolment (id INTEGER PRIMARY KEY CHECK (id = 1), client_id TEXT NOT NULL,
            filter_kind TEXT NOT NULL, epsilon REAL NOT NULL, delta REAL NOT NULL, orders TEXT NOT NULL,
            run_quota REAL NOT NULL, enrolled_at REAL NOT NULL);
        CREATE TABLE spends (seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL,
            round_id INTEGER NOT NULL, status TEXT NOT NULL, sensitivity REAL NOT NULL,
            noise_std REAL NOT NULL, noise_multiplier REAL NOT NULL, clip REAL NOT NULL,
            placement TEXT NOT NULL, charge TEXT NOT NULL, state_after TEXT NOT NULL,
            run_state_after TEXT NOT NULL, created_at REAL NOT NULL, UNIQUE (run_id, round_id));
        INSERT INTO meta VALUES ('schema_version', '1');
        INSERT INTO enrolment VALUES (1, 'old', 'gdp', 4.0, 1e-5, '[]', 1.0, 0.0);
        INSERT INTO spends (run_id, round_id, status, sensitivity, noise_std, noise_multiplier, clip,
            placement, charge, state_after, run_state_after, created_at)
            VALUES ('r', 0, 'contributed', 0.5, 1.0, 1.0, 1.0, 'local', '[0.25]', 'STATE', 'STATE', 1.0);
    """.replace("'STATE'", repr(state))
    )
    conn.close()


def pre_anchor(ledger_dir):
    """The ledger as fedfilter wrote it before roll-back anchors: no meta flag, no anchor."""
    conn = sqlite3.connect(ledger_dir / LEDGER_FILE)
    conn.execute("DELETE FROM meta WHERE key=?", (ANCHORED_KEY,))
    conn.commit()
    conn.close()
    anchor_path(ledger_dir).unlink()
