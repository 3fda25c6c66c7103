"""The ledger's SQLite schema and its rows: tables, append-only triggers, migration, and reading them.

The enrolment row and every spend row are append-only (the triggers abort any UPDATE or DELETE);
floats are stored as JSON text that round-trips a float64 exactly. ``connect`` opens a database
in WAL mode with ``synchronous=FULL`` (a COMMIT is on disk when it returns).
"""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.client.ledger.seal import SEAL_FILE, Seal
from fedfilter.client.ledger.storage import (
    LedgerUnavailableError,
    migrate_remedy,
    older_format,
    owner_must_act,
    rollback_remedy,
)
from fedfilter.privacy.filters import FILTER_KINDS

LEDGER_FILE = "budget_ledger.sqlite"
LEDGER_FILES = (LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm", SEAL_FILE)
SCHEMA_VERSION = 2  # 2: coordinator columns, ledger id and seal
STATUSES = ("contributed", "noise-only", "left")
DAY_S = 86400.0
RECOVER = ("reseal", "replace")
# meta key: '1' once the ledger keeps a roll-back anchor outside its directory (client/ledger/anchor.py).
# A row, not a schema change: ledgers written before anchors lack it and are migrated by the owner.
ANCHORED_KEY = "anchored"

SCHEMA_TABLES = """
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
    coordinator TEXT NOT NULL DEFAULT '', coordinator_state_after TEXT NOT NULL DEFAULT '[]',
    UNIQUE (run_id, round_id));
CREATE TRIGGER IF NOT EXISTS enrolment_no_update BEFORE UPDATE ON enrolment
    BEGIN SELECT RAISE(ABORT, 'the enrolment (personal budget) is immutable'); END;
CREATE TRIGGER IF NOT EXISTS enrolment_no_delete BEFORE DELETE ON enrolment
    BEGIN SELECT RAISE(ABORT, 'the enrolment (personal budget) is immutable'); END;
CREATE TRIGGER IF NOT EXISTS spends_no_update BEFORE UPDATE ON spends
    BEGIN SELECT RAISE(ABORT, 'spends are append-only'); END;
CREATE TRIGGER IF NOT EXISTS spends_no_delete BEFORE DELETE ON spends
    BEGIN SELECT RAISE(ABORT, 'spends are append-only'); END;
CREATE TABLE IF NOT EXISTS worst_case (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    epsilon REAL NOT NULL, set_at REAL NOT NULL, after_seq INTEGER NOT NULL, initial_state TEXT NOT NULL);
CREATE TRIGGER IF NOT EXISTS worst_case_no_update BEFORE UPDATE ON worst_case
    BEGIN SELECT RAISE(ABORT, 'the worst-case budget is immutable'); END;
CREATE TRIGGER IF NOT EXISTS worst_case_no_delete BEFORE DELETE ON worst_case
    BEGIN SELECT RAISE(ABORT, 'the worst-case budget is immutable'); END;
"""
# The worst-case account (``fedfilter.client.ledger.worst_case``), added to schema 2 without a new
# version: each spend's charge against it and its state after ('[]' for spends written before it was
# set, which ``worst_case.initial_state`` covers, recomputed conservatively when the owner set it).
WORST_CASE_COLUMNS = (
    ("worst_charge", "ALTER TABLE spends ADD COLUMN worst_charge TEXT NOT NULL DEFAULT '[]'"),
    ("worst_state_after", "ALTER TABLE spends ADD COLUMN worst_state_after TEXT NOT NULL DEFAULT '[]'"),
)
# Schema 1 ledgers gain the coordinator columns (their old spends count for no coordinator, and
# in full for the lifetime budget).
MIGRATE_1_TO_2 = (
    "ALTER TABLE spends ADD COLUMN coordinator TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE spends ADD COLUMN coordinator_state_after TEXT NOT NULL DEFAULT '[]'",
)
SCHEMA_INDEXES = """
CREATE INDEX IF NOT EXISTS spends_by_coordinator ON spends (coordinator);
CREATE INDEX IF NOT EXISTS spends_by_time ON spends (created_at);
"""


@dataclass(frozen=True)
class Enrolment:
    """The owner's budget, as the ledger's enrolment row holds it (immutable).

    Attributes
    ----------
    client_id : str
        The device's name in its records.
    filter_kind : str
        The filter's accounting (``privacy.filters.FILTER_KINDS``).
    epsilon, delta : float
        The lifetime budget.
    orders : tuple of float
        RDP orders (empty for the kinds without them).
    run_quota : float
        The share of the lifetime budget one run may spend, in (0, 1].
    enrolled_at : float
        When the owner enrolled the device (Unix time).

    Examples
    --------
    >>> Enrolment("a", "gdp", 4.0, 1e-5, (), 1.0, 0.0).epsilon
    4.0
    """

    client_id: str
    filter_kind: str
    epsilon: float
    delta: float
    orders: tuple[float, ...]
    run_quota: float  # share of the lifetime budget one run may spend, in (0, 1]
    enrolled_at: float


@dataclass(frozen=True)
class WorstCase:
    """The owner's budget against any coordinator (``fedfilter.client.ledger.worst_case``).

    Attributes
    ----------
    epsilon : float
        The budget, at the enrolment's delta.
    set_at : float
        When the owner set it (Unix time).
    after_seq : int
        The last spend that predates it.
    initial_state : numpy.ndarray
        The conservative charge of those earlier spends.

    Examples
    --------
    >>> import numpy as np
    >>> WorstCase(8.0, 0.0, 0, np.zeros(1))
    WorstCase(epsilon=8.0, set_at=0.0, after_seq=0, initial_state=array([0.]))
    """

    epsilon: float  # at the enrolment's delta
    set_at: float
    after_seq: int  # spends up to this one predate it: ``initial_state`` accounts them
    initial_state: np.ndarray


@dataclass(frozen=True)
class SpendRecord:
    """One row of the ledger's ``spends`` table: a round's release and its charges.

    Attributes
    ----------
    seq : int
        The spend's number (from 1).
    run_id : str
        The run.
    round_id : int
        The round.
    status : str
        ``"contributed"``, ``"noise-only"`` or ``"left"``.
    sensitivity, noise_std, noise_multiplier, clip : float
        What the release was charged for, model units, and the request's ``z`` and ``C``.
    placement : str
        ``"local"`` or ``"distributed"``.
    charge, state_after, run_state_after : numpy.ndarray
        The charge and the lifetime and run states after it.
    created_at : float
        When it was written (Unix time).
    coordinator : str
        The federation charged ("" for spends written before schema 2).
    worst_charge : numpy.ndarray or None
        The worst-case account's charge (None: written before it was set).

    Examples
    --------
    >>> import numpy as np
    >>> one = np.array([0.25])
    >>> SpendRecord(1, "run", 0, "contributed", 1.0, 2.0, 1.0, 2.0, "local", one, one, one, 0.0).status
    'contributed'
    """

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
    coordinator: str = ""  # the federation charged ("" for spends written before schema 2)
    worst_charge: np.ndarray | None = None  # the worst-case account's charge (None: written before it was set)


SPEND_RECORD_SQL = (
    "SELECT seq, run_id, round_id, status, sensitivity, noise_std, noise_multiplier, clip,"
    " placement, charge, state_after, run_state_after, created_at, coordinator, worst_charge FROM spends"
)

# Every schema-2 column of a spend row, in a fixed order: what the roll-back anchor's digest covers
# (listed, not ``*``, so that a column added later does not change the digest of older rows).
ANCHOR_ROW_SQL = (
    "SELECT seq, run_id, round_id, status, sensitivity, noise_std, noise_multiplier, clip, placement, charge,"
    " state_after, run_state_after, created_at, coordinator, coordinator_state_after FROM spends"
)


def spend_record(row: tuple) -> SpendRecord:
    """A row of ``SPEND_RECORD_SQL`` as a ``SpendRecord`` (float vectors decoded from JSON).

    Parameters
    ----------
    row : tuple
        The row, in ``SPEND_RECORD_SQL``'s column order.

    Returns
    -------
    SpendRecord

    Examples
    --------
    >>> row = (1, "run", 0, "contributed", 1.0, 2.0, 1.0, 2.0, "local", "[0.25]", "[0.25]", "[0.25]",
    ...        0.0, "default", "[]")
    >>> rec = spend_record(row)
    >>> rec.charge, rec.worst_charge
    (array([0.25]), None)
    """
    (
        seq,
        run,
        round_id,
        status,
        sensitivity,
        noise_std,
        z,
        clip,
        placement,
        charge,
        state,
        run_state,
        created,
        fed,
        worst,
    ) = row
    return SpendRecord(
        seq=seq,
        run_id=run,
        round_id=round_id,
        status=status,
        sensitivity=sensitivity,
        noise_std=noise_std,
        noise_multiplier=z,
        clip=clip,
        placement=placement,
        charge=floats(charge),
        state_after=floats(state),
        run_state_after=floats(run_state),
        created_at=created,
        coordinator=fed,
        worst_charge=None if worst == "[]" else floats(worst),
    )


def floats_json(values) -> str:
    """Float values as JSON text that round-trips each float64 exactly.

    Parameters
    ----------
    values : float or array_like
        One value or a vector.

    Returns
    -------
    str

    Examples
    --------
    >>> floats_json([0.1, 2])
    '[0.1, 2.0]'
    """
    # repr round-trips a float64 exactly.
    return json.dumps([float(v) for v in np.atleast_1d(values)])


def floats(text: str) -> np.ndarray:
    """The float64 vector ``floats_json`` wrote.

    Parameters
    ----------
    text : str
        A JSON list of numbers.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> floats("[0.1, 2.0]")
    array([0.1, 2. ])
    """
    return np.array(json.loads(text), dtype=np.float64)


def check_enrolment_args(client_id, epsilon, delta, filter_kind, run_quota) -> None:
    """Refuse (``ValueError``, naming every problem) an enrolment's arguments before anything is written.

    Parameters
    ----------
    client_id : str
        Non-empty.
    epsilon : float
        Positive and finite.
    delta : float
        In (0, 1).
    filter_kind : str
        One of ``privacy.filters.FILTER_KINDS``.
    run_quota : float
        In (0, 1].

    Examples
    --------
    >>> check_enrolment_args("a", 4.0, 1e-5, "gdp", 1.0)
    >>> check_enrolment_args("", 4.0, 2.0, "gdp", 1.0)
    Traceback (most recent call last):
    ...
    ValueError: client_id must be a non-empty string. Found ''. delta must be a number in (0, 1). Found 2.0.
    """
    problems = []
    if not (isinstance(client_id, str) and client_id.strip()):
        problems.append(f"client_id must be a non-empty string. Found {client_id!r}.")
    if (problem := positive_finite("epsilon", epsilon)) is not None:
        problems.append(problem)
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        problems.append(f"delta must be a number in (0, 1). Found {delta!r}.")
    if filter_kind not in FILTER_KINDS:
        problems.append(f"filter must be one of {', '.join(FILTER_KINDS)}. Found {filter_kind!r}.")
    if not (isinstance(run_quota, (int, float)) and math.isfinite(run_quota) and 0 < run_quota <= 1):
        problems.append(f"run_quota must be a fraction in (0, 1]. Found {run_quota!r}.")
    if problems:
        raise ValueError(" ".join(problems))


def connect(path: Path) -> sqlite3.Connection:
    """Open the database at ``path`` in WAL mode with ``synchronous=FULL``, in autocommit.

    Parameters
    ----------
    path : pathlib.Path
        The database file (created if missing).

    Returns
    -------
    sqlite3.Connection

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     conn = connect(Path(tmp) / LEDGER_FILE)
    ...     print(conn.execute("PRAGMA journal_mode").fetchone())
    ...     conn.close()
    ('wal',)
    """
    conn = sqlite3.connect(path, isolation_level=None, timeout=60.0, check_same_thread=False)
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=60000")
    except BaseException:
        conn.close()
        raise
    return conn


def schema_version(conn: sqlite3.Connection) -> str | None:
    """The database's schema version as stored (None: no meta table or no version: not a ledger yet).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.

    Returns
    -------
    str or None

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> schema_version(conn) is None
    True
    >>> _ = prepare(conn)
    >>> schema_version(conn)
    '2'
    >>> conn.close()
    """
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name='meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
    return None if row is None else str(row[0])


def is_anchored(conn: sqlite3.Connection) -> bool:
    """Whether this ledger keeps a roll-back anchor (``ledger_anchor``); older ledgers are migrated first.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database (its schema prepared).

    Returns
    -------
    bool

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> is_anchored(conn)  # the enrolment marks it
    False
    >>> conn.close()
    """
    return conn.execute("SELECT 1 FROM meta WHERE key=? AND value='1'", (ANCHORED_KEY,)).fetchone() is not None


def prepare(conn: sqlite3.Connection, *, migrate: bool = False) -> bool:
    """Create the schema, or migrate an older one when ``migrate`` (the owner's command only),
    inside the caller's transaction; True if migrated from 1. An older schema without ``migrate``
    raises ``LedgerUnavailableError``: a ledger is never migrated implicitly.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    migrate : bool, optional
        Whether a schema 1 ledger may be migrated (the owner's command).

    Returns
    -------
    bool
        True if migrated from schema 1.

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> prepare(conn)
    False
    >>> conn.close()
    """
    version = schema_version(conn)
    migrated = version == "1"
    if migrated and not migrate:
        raise LedgerUnavailableError(
            "the budget ledger has an older format (schema 1); only its owner migrates it "
            "(`fedfilter ledger migrate --dir DIR`)."
        )
    for stmt in SCHEMA_TABLES.split(";\n"):
        if stmt.strip():
            conn.execute(stmt)
    if migrated:
        for stmt in MIGRATE_1_TO_2:
            conn.execute(stmt)
        conn.execute("UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),))
    elif version is not None and version != str(SCHEMA_VERSION):
        raise LedgerUnavailableError(
            f"the budget ledger has schema version {version!r}, which this "
            f"fedfilter (schema {SCHEMA_VERSION}) does not know."
        )
    add_worst_case_columns(conn)
    for stmt in SCHEMA_INDEXES.split(";\n"):
        if stmt.strip():
            conn.execute(stmt)
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
    conn.execute("INSERT OR IGNORE INTO meta VALUES ('ledger_id', ?)", (uuid.uuid4().hex,))
    return migrated


def read_enrolment(conn: sqlite3.Connection, directory: Path | None = None, seal: Seal | None = None) -> Enrolment:
    """The enrolment row; ``LedgerUnavailableError`` if there is none.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database (its schema prepared).
    directory : pathlib.Path, optional
        The ledger's folder (for the error).
    seal : Seal, optional
        The seal as read (the error then says the device was enrolled).

    Returns
    -------
    Enrolment

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> read_enrolment(conn)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.storage.LedgerUnavailableError: the budget ledger at . holds no enrolment. ...
    >>> conn.close()
    """
    row = conn.execute(
        "SELECT client_id, filter_kind, epsilon, delta, orders, run_quota, enrolled_at FROM enrolment"
    ).fetchone()
    if row is None:
        raise owner_must_act(
            directory or Path("."),
            "holds no enrolment"
            + (f", but this device was enrolled (its seal names spend #{seal.seq})." if seal else "."),
        )
    return Enrolment(row[0], row[1], row[2], row[3], tuple(json.loads(row[4])), row[5], row[6])


def add_worst_case_columns(conn: sqlite3.Connection) -> bool:
    """Add the worst-case account's columns and table where missing (inside the caller's write
    transaction); True if anything was added. Additive: older rows keep '[]'.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.

    Returns
    -------
    bool

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> add_worst_case_columns(conn)  # prepare added them
    False
    >>> conn.close()
    """
    have = {row[1] for row in conn.execute("PRAGMA table_info(spends)")}
    added = False
    for name, stmt in WORST_CASE_COLUMNS:
        if name not in have:
            conn.execute(stmt)
            added = True
    if conn.execute("SELECT 1 FROM sqlite_master WHERE name='worst_case'").fetchone() is None:
        for stmt in SCHEMA_TABLES.split(";\n"):
            if "worst_case" in stmt:
                conn.execute(stmt)
        added = True
    return added


def needs_worst_case_columns(conn: sqlite3.Connection) -> bool:
    """Whether the worst-case account's columns or table are missing (an older format).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.

    Returns
    -------
    bool

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> needs_worst_case_columns(conn)
    False
    >>> conn.close()
    """
    have = {row[1] for row in conn.execute("PRAGMA table_info(spends)")}
    table = conn.execute("SELECT 1 FROM sqlite_master WHERE name='worst_case'").fetchone()
    return table is None or any(name not in have for name, _ in WORST_CASE_COLUMNS)


def read_worst_case(conn: sqlite3.Connection) -> WorstCase | None:
    """The owner's worst-case budget as stored (None: not set).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.

    Returns
    -------
    WorstCase or None

    Examples
    --------
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> read_worst_case(conn) is None
    True
    >>> conn.close()
    """
    row = conn.execute("SELECT epsilon, set_at, after_seq, initial_state FROM worst_case WHERE id=1").fetchone()
    return None if row is None else WorstCase(row[0], row[1], row[2], floats(row[3]))


def check_device_opens(conn: sqlite3.Connection, directory: Path, seal: Seal | None) -> None:
    """Refuse a database the device does not open as it is (``BudgetLedger.open``): no enrolment, or an
    older format, which only its owner migrates (``ledger_owner.migrate``).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger's folder (for the error).
    seal : Seal or None
        The seal as read.

    Examples
    --------
    >>> from pathlib import Path
    >>> conn = connect(":memory:")
    >>> check_device_opens(conn, Path("led"), None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.storage.LedgerUnavailableError: the budget ledger at led holds no enrolment. ...
    >>> conn.close()
    """
    version = schema_version(conn)
    if version is None or conn.execute("SELECT 1 FROM sqlite_master WHERE name='enrolment'").fetchone() is None:
        raise owner_must_act(
            directory,
            "holds no enrolment"
            + (f", but this device was enrolled (its seal names spend #{seal.seq})." if seal else "."),
        )
    if version != str(SCHEMA_VERSION):  # migrated only by the owner (ledger_owner.migrate)
        if version == "1" and seal is not None:  # a schema 2 ledger rolled back to before its migration
            raise owner_must_act(
                directory,
                f"is an older copy (schema 1) of a sealed ledger (its seal names spend #{seal.seq}).",
                rollback_remedy(directory),
            )
        raise owner_must_act(directory, older_format(version), migrate_remedy(directory))
    if needs_worst_case_columns(conn):  # an older format: only its owner migrates it (prepare adds them)
        raise owner_must_act(directory, older_format(version), migrate_remedy(directory))


def spends_by_run(records: list[SpendRecord], filt) -> tuple[list[dict], dict[str, int]]:
    """The owner's view of its spends: per run, its rounds by status and the epsilon it spent (from its
    last ``run_state_after``); and the rounds served per coordinator (federation).

    Parameters
    ----------
    records : list of SpendRecord
        The ledger's spends.
    filt : GaussianFilter
        The lifetime filter (for the epsilon spent).

    Returns
    -------
    tuple of (list of dict, dict)
        Per run, its counts and ``spent_epsilon``; rounds per coordinator.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> row = (1, "run", 0, "contributed", 1.0, 2.0, 1.0, 2.0, "local", "[0.25]", "[0.25]", "[0.25]",
    ...        0.0, "default", "[]")
    >>> runs, coordinators = spends_by_run([spend_record(row)], make_filter("gdp", 4.0, 1e-5))
    >>> runs[0]["spent_epsilon"], coordinators
    (1.993091404415121, {'default': 1})
    """
    runs: dict[str, dict] = {}
    coordinators: dict[str, int] = {}
    for rec in records:
        run = runs.setdefault(
            rec.run_id, {"run_id": rec.run_id, "rounds": 0, "contributed": 0, "noise_only": 0, "left": 0}
        )
        run["rounds"] += 1
        run[rec.status.replace("-", "_")] += 1
        run["state"] = rec.run_state_after
        coordinators[rec.coordinator] = coordinators.get(rec.coordinator, 0) + 1
    for run in runs.values():
        run["spent_epsilon"] = filt.epsilon_spent(run.pop("state"))
    return list(runs.values()), coordinators
