"""The device's durable, lifelong budget ledger: one SQLite database per device.

* The personal budget is written once, at enrolment, and can never change: the enrolment row and
  every spend row are append-only (SQLite triggers abort any UPDATE or DELETE).
* Write-ahead: a spend is committed (WAL, ``synchronous=FULL``: on disk before COMMIT returns)
  before the caller adds noise and releases anything. A crash between the two wastes a spend,
  never loses one.
* One release per (run, round): a replayed or repeated request finds the row and is refused, so
  it never gets a second release (for a noise-only client as well, so that refusals do not reveal
  exhaustion).
* ``BEGIN IMMEDIATE`` takes the write lock before reading the state, so concurrent rounds (threads
  or processes) see each other's spends: no two releases can both fit into the same remainder.
* Safe to share between threads without any outside lock: one connection per ledger object, and
  every transaction and read holds the object's own lock (a second ``BEGIN`` on a connection
  already in a transaction would fail, and its ``ROLLBACK`` would undo the other thread's round).

Each row stores the filter state after it (lifetime and per run), so the current state is one
read; ``recomputed_state`` re-adds every charge with upward rounding, for audits and tests.
"""

from __future__ import annotations

import json
import math
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from client.privacy.filters import FILTER_KINDS, GaussianFilter, make_filter

LEDGER_FILE = "budget_ledger.sqlite"
SCHEMA_VERSION = 1
STATUSES = ("contributed", "noise-only", "left")
INT64_MAX = 2**63 - 1  # SQLite's integers are int64: a larger round id would raise OverflowError

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS enrolment (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    client_id TEXT NOT NULL, filter_kind TEXT NOT NULL,
    epsilon REAL NOT NULL, delta REAL NOT NULL, orders TEXT NOT NULL,
    run_quota REAL NOT NULL, enrolled_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS spends (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id TEXT NOT NULL, round_id INTEGER NOT NULL, status TEXT NOT NULL,
    sensitivity REAL NOT NULL, noise_std REAL NOT NULL, noise_multiplier REAL NOT NULL,
    clip REAL NOT NULL, placement TEXT NOT NULL,
    charge TEXT NOT NULL, state_after TEXT NOT NULL, run_state_after TEXT NOT NULL,
    created_at REAL NOT NULL,
    UNIQUE (run_id, round_id));
CREATE TRIGGER IF NOT EXISTS enrolment_no_update BEFORE UPDATE ON enrolment
    BEGIN SELECT RAISE(ABORT, 'the enrolment (personal budget) is immutable'); END;
CREATE TRIGGER IF NOT EXISTS enrolment_no_delete BEFORE DELETE ON enrolment
    BEGIN SELECT RAISE(ABORT, 'the enrolment (personal budget) is immutable'); END;
CREATE TRIGGER IF NOT EXISTS spends_no_update BEFORE UPDATE ON spends
    BEGIN SELECT RAISE(ABORT, 'spends are append-only'); END;
CREATE TRIGGER IF NOT EXISTS spends_no_delete BEFORE DELETE ON spends
    BEGIN SELECT RAISE(ABORT, 'spends are append-only'); END;
"""


class ReplayError(RuntimeError):
    """This (run, round) was already released once; a second release is refused."""


@dataclass(frozen=True)
class Enrolment:
    client_id: str
    filter_kind: str
    epsilon: float
    delta: float
    orders: tuple[float, ...]
    run_quota: float  # share of the lifetime budget one run may spend, in (0, 1]
    enrolled_at: float


@dataclass(frozen=True)
class SpendRecord:
    seq: int
    run_id: str
    round_id: int
    status: str
    sensitivity: float
    noise_std: float
    noise_multiplier: float
    clip: float
    placement: str
    charge: np.ndarray
    state_after: np.ndarray
    run_state_after: np.ndarray
    created_at: float


def _floats_json(values) -> str:
    # repr round-trips a float64 exactly.
    return json.dumps([float(v) for v in np.atleast_1d(values)])


def _floats(text: str) -> np.ndarray:
    return np.array(json.loads(text), dtype=np.float64)


def _check_enrolment_args(client_id, epsilon, delta, filter_kind, run_quota) -> None:
    problems = []
    if not (isinstance(client_id, str) and client_id.strip()):
        problems.append(f"client_id must be a non-empty string. Found {client_id!r}.")
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        problems.append(f"epsilon must be a finite number > 0. Found {epsilon!r}.")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(f"delta must be a number in (0, 1). Found {delta!r}.")
    if filter_kind not in FILTER_KINDS:
        problems.append(f"filter must be one of {', '.join(FILTER_KINDS)}. Found {filter_kind!r}.")
    if not (isinstance(run_quota, (int, float)) and math.isfinite(run_quota) and 0 < run_quota <= 1):
        problems.append(f"run_quota must be a fraction in (0, 1]. Found {run_quota!r}.")
    if problems:
        raise ValueError(" ".join(problems))


class Reservation:
    """A round in progress inside the ledger's write transaction (see ``BudgetLedger.reserve``)."""

    def __init__(self, conn: sqlite3.Connection, run_id: str, round_id: int, state, run_state):
        self._conn, self.run_id, self.round_id = conn, run_id, round_id
        self.state, self.run_state = state, run_state
        self.recorded = False

    def record(self, *, status: str, charge: np.ndarray, state_after: np.ndarray,
               run_state_after: np.ndarray, sensitivity: float, noise_std: float,
               noise_multiplier: float, clip: float, placement: str) -> None:
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}. Found {status!r}.")
        if self.recorded:
            raise RuntimeError("a reservation records exactly one release")
        self._conn.execute(
            "INSERT INTO spends (run_id, round_id, status, sensitivity, noise_std, noise_multiplier,"
            " clip, placement, charge, state_after, run_state_after, created_at)"
            " VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            (self.run_id, self.round_id, status, float(sensitivity), float(noise_std),
             float(noise_multiplier), float(clip), placement, _floats_json(charge),
             _floats_json(state_after), _floats_json(run_state_after), time.time()),
        )
        self.recorded = True


class BudgetLedger:
    """A device's lifetime budget and every spend against it."""

    def __init__(self, directory: Path, conn: sqlite3.Connection, enrolment: Enrolment):
        self.directory, self._conn, self.enrolment = directory, conn, enrolment
        # Reentrant: reads inside a reservation (same thread) go through the same lock.
        self._lock = threading.RLock()
        self.filter: GaussianFilter = make_filter(
            enrolment.filter_kind, enrolment.epsilon, enrolment.delta, enrolment.orders or None)
        self.run_filter: GaussianFilter = self.filter.scaled(enrolment.run_quota)

    # --- opening ------------------------------------------------------------------------------
    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=60000")
        return conn

    @classmethod
    def enrol(cls, directory, *, client_id: str, epsilon: float, delta: float,
              filter_kind: str = "gdp", orders: Sequence[float] | None = None,
              run_quota: float = 1.0) -> "BudgetLedger":
        """Create the ledger with its personal budget, or open it if enrolled with the same one.

        A different budget for an existing ledger is refused: no request can raise or reset it.
        """
        _check_enrolment_args(client_id, epsilon, delta, filter_kind, run_quota)
        # Build the filter first: an impossible budget fails before anything is written.
        filt = make_filter(filter_kind, float(epsilon), float(delta), orders)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        conn = cls._connect(directory / LEDGER_FILE)
        conn.executescript(_SCHEMA)
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            conn.execute(
                "INSERT OR IGNORE INTO enrolment VALUES (1,?,?,?,?,?,?,?)",
                (client_id, filter_kind, float(epsilon), float(delta),
                 json.dumps(list(filt.orders)), float(run_quota), time.time()),
            )
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        ledger = cls(directory, conn, cls._read_enrolment(conn))
        requested = (client_id, filter_kind, float(epsilon), float(delta), filt.orders, float(run_quota))
        e = ledger.enrolment
        stored = (e.client_id, e.filter_kind, e.epsilon, e.delta, e.orders, e.run_quota)
        if stored != requested:
            names = ("client_id", "filter", "epsilon", "delta", "orders", "run_quota")
            diffs = [f"{n}: enrolled {s!r}, requested {r!r}" for n, s, r in zip(names, stored, requested) if s != r]
            conn.close()
            raise ValueError(
                f"the ledger at {directory} is enrolled with a different budget, which can never "
                f"change ({'; '.join(diffs)})."
            )
        return ledger

    @classmethod
    def open(cls, directory) -> "BudgetLedger":
        directory = Path(directory)
        path = directory / LEDGER_FILE
        if not path.exists():
            raise FileNotFoundError(f"no budget ledger at {directory} (enrol the device first).")
        conn = cls._connect(path)
        return cls(directory, conn, cls._read_enrolment(conn))

    @staticmethod
    def _read_enrolment(conn: sqlite3.Connection) -> Enrolment:
        row = conn.execute(
            "SELECT client_id, filter_kind, epsilon, delta, orders, run_quota, enrolled_at FROM enrolment"
        ).fetchone()
        if row is None:
            raise ValueError("the budget ledger has no enrolment.")
        return Enrolment(row[0], row[1], row[2], row[3], tuple(json.loads(row[4])), row[5], row[6])

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    # --- reading ------------------------------------------------------------------------------
    def _last_state(self, run_id: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return self._last_state_locked(run_id)

    def _last_state_locked(self, run_id: str | None) -> tuple[np.ndarray, np.ndarray]:
        life = self._conn.execute("SELECT state_after FROM spends ORDER BY seq DESC LIMIT 1").fetchone()
        state = _floats(life[0]) if life else self.filter.initial_state()
        run_state = self.filter.initial_state()
        if run_id is not None:
            run = self._conn.execute(
                "SELECT run_state_after FROM spends WHERE run_id=? ORDER BY seq DESC LIMIT 1", (run_id,)
            ).fetchone()
            if run:
                run_state = _floats(run[0])
        return state, run_state

    def state(self) -> np.ndarray:
        """The lifetime filter state (sum of every charge, rounded up)."""
        return self._last_state()[0]

    def run_state(self, run_id: str) -> np.ndarray:
        return self._last_state(run_id)[1]

    def records(self, run_id: str | None = None) -> list[SpendRecord]:
        sql = ("SELECT seq, run_id, round_id, status, sensitivity, noise_std, noise_multiplier, clip,"
               " placement, charge, state_after, run_state_after, created_at FROM spends")
        with self._lock:
            rows = self._conn.execute(sql + (" WHERE run_id=? ORDER BY seq" if run_id else " ORDER BY seq"),
                                      (run_id,) if run_id else ()).fetchall()
        return [SpendRecord(*r[:9], _floats(r[9]), _floats(r[10]), _floats(r[11]), r[12]) for r in rows]

    def has_release(self, run_id: str, round_id: int) -> bool:
        """Whether this (run, round) was already answered (one indexed lookup)."""
        with self._lock:
            return self._conn.execute(
                "SELECT 1 FROM spends WHERE run_id=? AND round_id=?", (run_id, int(round_id))).fetchone() is not None

    def recomputed_state(self) -> np.ndarray:
        """Every charge re-added from scratch with the filter's rounding (an audit of ``state``)."""
        state = self.filter.initial_state()
        for rec in self.records():
            state = self.filter.spend(state, rec.charge)
        return state

    def spent_epsilon(self) -> float:
        return self.filter.epsilon_spent(self.state())

    def summary(self) -> dict:
        """The owner's view: budget, spent, remaining, and spending per run (never sent anywhere)."""
        e = self.enrolment
        runs: dict[str, dict] = {}
        for rec in self.records():
            run = runs.setdefault(rec.run_id, {"run_id": rec.run_id, "rounds": 0, "contributed": 0,
                                               "noise_only": 0, "left": 0})
            run["rounds"] += 1
            run[rec.status.replace("-", "_")] += 1
            run["state"] = rec.run_state_after
        for run in runs.values():
            run["spent_epsilon"] = self.filter.epsilon_spent(run.pop("state"))
        state = self.state()
        return {
            "client_id": e.client_id, "filter": e.filter_kind, "budget_epsilon": e.epsilon,
            "budget_delta": e.delta, "run_quota": e.run_quota,
            "spent_epsilon": self.filter.epsilon_spent(state),
            "remaining_fraction": float(self.filter.remaining_fraction(state)),
            "runs": list(runs.values()),
        }

    # --- spending -----------------------------------------------------------------------------
    @contextmanager
    def reserve(self, run_id: str, round_id: int) -> Iterator[Reservation]:
        """Hold the write lock for one round; what is recorded is durable when the block exits.

        Raises ``ReplayError`` (nothing written) when this (run, round) was released before.
        An exception inside the block rolls back: nothing is spent.
        """
        if not (isinstance(run_id, str) and run_id):
            raise ValueError(f"run_id must be a non-empty string. Found {run_id!r}.")
        if isinstance(round_id, bool) or not isinstance(round_id, int) or not 0 <= round_id <= INT64_MAX:
            raise ValueError(f"round_id must be an integer in [0, 2**63-1]. Found {round_id!r}.")
        with self._lock:  # held for the whole transaction: threads take turns, processes too (below)
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                seen = self._conn.execute(
                    "SELECT status FROM spends WHERE run_id=? AND round_id=?", (run_id, round_id)).fetchone()
                if seen is not None:
                    raise ReplayError(f"round {round_id} of run {run_id!r} was already released; "
                                      "a repeated request gets no second release.")
                state, run_state = self._last_state_locked(run_id)
                reservation = Reservation(self._conn, run_id, round_id, state, run_state)
                yield reservation
                self._conn.execute("COMMIT")  # synchronous=FULL: durable before the release
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
