"""The device's durable, lifelong budget ledger: one SQLite database per device.

* The personal budget is written once, at enrolment, and can never change: the enrolment row and
  every spend row are append-only (SQLite triggers abort any UPDATE or DELETE).
* Write-ahead: a spend is committed (WAL, ``synchronous=FULL``: on disk before COMMIT returns),
  then sealed (``fedfilter.client.ledger.seal``), before the caller adds noise and releases anything. A
  crash in between wastes a spend, never loses one.
* One release per (run, round): a replayed or repeated request finds the row and is refused, so
  it never gets a second release (for a noise-only client as well, so that refusals do not reveal
  exhaustion).
* ``BEGIN IMMEDIATE`` takes the write lock before reading the state, so concurrent rounds (threads
  or processes) see each other's spends: no two releases can both fit into the same remainder.
* Safe to share between threads without any outside lock: one connection per ledger object, and
  every transaction and read holds the object's own lock (a second ``BEGIN`` on a connection
  already in a transaction would fail, and its ``ROLLBACK`` would undo the other thread's round).
* Fails closed. Only ``enrol`` (the owner: ``fedfilter ledger enrol``) creates a budget; ``open``
  (what a device does every round) refuses a missing, empty, damaged or rolled-back ledger (one
  that no longer holds the spend its seal names: a lost ``-wal``, a truncation, an older copy; or
  the spend its roll-back anchor outside the directory names: a restored backup of the whole
  directory, ``fedfilter.client.ledger.anchor``) and an older format, with ``LedgerUnavailableError``
  until the owner acts (``fedfilter.client.ledger.owner``: migrate, accept a restore). A full or
  read-only disk is reported as ``LedgerWriteError`` naming the disk; nothing is released.

The owner's quotas (per coordinator, per day) and what they have used are in
``fedfilter.client.ledger.quota``; the schema (and which formats the device opens) in
``fedfilter.client.ledger.schema``; how failures are reported in ``fedfilter.client.ledger.storage``.
Beside the budget, the owner's worst-case budget (``worst-case-epsilon``) and its account,
what each report costs against a coordinator that breaks SecAgg+: ``fedfilter.client.ledger.worst_case``,
kept on this ledger by ``fedfilter.client.ledger.worst_case_storage``.

Each row stores the filter states after it (lifetime, per run, per coordinator), so the current
state is one read; ``recomputed_state`` re-adds every charge with upward rounding, for audits.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from fedfilter.client.ledger.anchor import (
    advance_anchor,
    anchor_path,
    check_anchor,
    refuse_if_spent_here,
    retire_anchor,
)
from fedfilter.client.ledger.quota import QuotaAccounts, Quotas, Reservation
from fedfilter.client.ledger.schema import (
    ANCHORED_KEY,
    LEDGER_FILE,
    LEDGER_FILES,
    RECOVER,
    SCHEMA_VERSION,
    SPEND_RECORD_SQL,
    Enrolment,
    SpendRecord,
    WorstCase,
    check_device_opens,
    check_enrolment_args,
    connect,
    floats,
    prepare,
    read_enrolment,
    schema_version,
    spend_record,
    spends_by_run,
)
from fedfilter.client.ledger.seal import SEAL_FILE, Seal, SealError, advance_seal, check_seal, move_aside, read_seal
from fedfilter.client.ledger.storage import (
    LedgerMissingError,
    ReplayError,
    closed_on_failure,
    immediate,
    migrate_remedy,
    older_format,
    owner_must_act,
    raise_storage_error,
)
from fedfilter.client.ledger.worst_case import check_worst_case_epsilon
from fedfilter.client.ledger.worst_case_storage import WorstCaseAccount
from fedfilter.privacy.filters import GaussianFilter, make_filter
from fedfilter.protocol.request import INT64_MAX

# The ledger's public names, importable from here as before the split (the CLI, the demo, tests).
__all__ = [
    "BudgetLedger",
]


class BudgetLedger:
    """A device's lifetime budget and every spend against it: a durable, sealed SQLite ledger.

    Created by the owner (``enrol``) and opened by the device (``open``); every round is spent inside
    ``reserve`` (one write transaction: replay refusal, every budget and quota, committed and sealed
    before anything leaves the device). Fails closed: a missing, damaged or rolled-back ledger is
    refused, never re-created. Build it with ``enrol`` or ``open``, not with the constructor.

    The ledger holds two accounts beside its main one, objects that work on its database under its
    lock: ``quota_accounts`` (what the owner's coordinator and daily quotas have used,
    ``fedfilter.client.ledger.quota``) and ``worst_account`` (the worst-case budget and its state,
    ``fedfilter.client.ledger.worst_case_storage``).

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder (``ledger.sqlite`` and its seal).
    conn : sqlite3.Connection
        The open database (``enrol``/``open`` make it).
    enrolment : Enrolment
        The owner's budget: client id, epsilon, delta, filter kind, run quota.
    quotas : Quotas, optional
        The owner's coordinator and daily caps (default: none below 1).
    anchor_file : pathlib.Path, optional
        The roll-back anchor, in the owner's state directory.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.budget import BudgetLedger
    >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="alice", epsilon=4.0, delta=1e-5,
    ...                             state_dir=tempfile.mkdtemp())
    >>> ledger.spent_epsilon()
    0.0
    >>> ledger.close()
    """

    def __init__(
        self,
        directory: Path,
        conn: sqlite3.Connection,
        enrolment: Enrolment,
        quotas: Quotas | None = None,
        anchor_file: Path | None = None,
    ):
        self.directory, self._conn, self.enrolment = directory, conn, enrolment
        self.anchor_file = anchor_file or anchor_path(directory)  # in the owner's state directory
        quotas = quotas or Quotas()
        self.clock = time.time  # the device's clock (created_at, the daily window); tests may set it
        # Reentrant: reads inside a reservation (same thread) go through the same lock.
        self._lock = threading.RLock()
        self.filter: GaussianFilter = make_filter(
            enrolment.filter_kind, enrolment.epsilon, enrolment.delta, enrolment.orders or None
        )
        self.run_filter: GaussianFilter = self.filter.scaled(enrolment.run_quota)
        self._ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
        self.quota_accounts = QuotaAccounts(conn, self.filter, quotas, enrolment.run_quota)
        self.worst_account = WorstCaseAccount(conn, self._lock, self.filter, directory)

    # --- the accounts it holds, under the names the ledger always had ---------------------------------
    @property
    def quotas(self) -> Quotas:
        """The owner's coordinator and daily quotas (``Quotas``).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.quota import Quotas
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner", quotas=Quotas(coordinator=0.5, daily=0.25))
        >>> ledger.quotas
        Quotas(federation='default', coordinator=0.5, daily=0.25)
        >>> ledger.close(); tmp.cleanup()
        """
        return self.quota_accounts.quotas

    @property
    def coordinator_filter(self) -> GaussianFilter:
        """The lifetime filter scaled to the coordinator quota.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.quota import Quotas
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner", quotas=Quotas(coordinator=0.5, daily=0.25))
        >>> ledger.filter.budget, ledger.coordinator_filter.budget
        (array([0.85549717]), array([0.42774858]))
        >>> ledger.close(); tmp.cleanup()
        """
        return self.quota_accounts.coordinator_filter

    @property
    def daily_filter(self) -> GaussianFilter:
        """The lifetime filter scaled to the daily quota.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.quota import Quotas
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner", quotas=Quotas(coordinator=0.5, daily=0.25))
        >>> ledger.daily_filter.budget
        array([0.21387429])
        >>> ledger.close(); tmp.cleanup()
        """
        return self.quota_accounts.daily_filter

    @property
    def worst_case(self) -> WorstCase | None:
        """The owner's worst-case budget as last read (None: not set).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> ledger.worst_case is None
        True
        >>> _ = ledger.set_worst_case(8.0)
        >>> ledger.worst_case.epsilon
        8.0
        >>> ledger.close(); tmp.cleanup()
        """
        return self.worst_account.worst_case

    @property
    def worst_filter(self) -> GaussianFilter | None:
        """The worst-case account's filter as last read (None: no worst-case budget, local rounds only).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> _ = ledger.set_worst_case(8.0)
        >>> ledger.worst_filter
        GaussianFilter(kind='gdp', epsilon=8.0, delta=1e-05, orders=())
        >>> ledger.close(); tmp.cleanup()
        """
        return self.worst_account.filter

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def enrol(
        cls,
        directory,
        *,
        client_id: str,
        epsilon: float,
        delta: float,
        filter_kind: str = "gdp",
        orders: Sequence[float] | None = None,
        run_quota: float = 1.0,
        quotas: Quotas | None = None,
        recover: str | None = None,
        state_dir: Path | None = None,
        worst_case_epsilon: float | None = None,
    ) -> BudgetLedger:
        """The owner's act: create the ledger with its personal budget, or open it if enrolled
        with the same one. A different budget for an existing ledger is refused.

        A device enrolled before (a seal, or an anchor naming spends) whose ledger is missing, damaged
        or rolled back is refused as in ``open``, unless ``recover`` says what the owner chose:
        ``"reseal"`` accepts the database against its seal (never its anchor: ``ledger_owner``),
        ``"replace"`` moves the ledger files to a ``lost-*`` folder, retires the anchor and enrols
        afresh (a new budget). Never migrates. ``state_dir`` holds the anchor (default: the owner's).

        ``worst_case_epsilon``: the owner's budget against any coordinator (``worst_case``), set
        with the ledger, or added to an enrolled ledger that has none (``set_worst_case``).

        Parameters
        ----------
        directory : str or pathlib.Path
            The ledger's folder (created if needed).
        client_id : str
            The device's name in its records.
        epsilon, delta : float
            The lifetime budget.
        filter_kind : str, optional
            The filter's accounting (default ``"gdp"``).
        orders : sequence of float, optional
            RDP orders, for the filter kinds that use them.
        run_quota : float, optional
            The share of the budget any one run may spend, in (0, 1].
        quotas : Quotas, optional
            The coordinator and daily quotas.
        recover : str, optional
            ``"reseal"`` or ``"replace"``: the owner's recovery of a damaged or lost ledger.
        state_dir : pathlib.Path, optional
            The owner's state directory (the anchor).
        worst_case_epsilon : float, optional
            The budget against any coordinator.

        Returns
        -------
        BudgetLedger

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> ledger.enrolment.epsilon
        4.0
        >>> ledger.close()
        >>> BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=8.0, delta=1e-5,
        ...                    state_dir=Path(tmp.name) / "owner")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: ...
        >>> tmp.cleanup()
        """
        check_enrolment_args(client_id, epsilon, delta, filter_kind, run_quota)
        if worst_case_epsilon is not None:
            check_worst_case_epsilon(worst_case_epsilon, epsilon)
        if recover not in (None, *RECOVER):
            raise ValueError(f"recover must be one of {RECOVER} or None. Found {recover!r}.")
        quotas = quotas or Quotas()
        # Build the filter first: an impossible budget fails before anything is written.
        filt = make_filter(filter_kind, float(epsilon), float(delta), orders)
        directory = Path(directory)
        anchor_file = anchor_path(directory, state_dir)
        path = directory / LEDGER_FILE
        if recover == "replace":
            move_aside(directory, list(LEDGER_FILES))
            retire_anchor(anchor_file)  # kept beside, for the record
        try:
            seal = read_seal(directory)
        except SealError as err:
            if recover != "reseal":
                raise owner_must_act(directory, f"has a damaged seal ({err}).") from err
            seal = None
        if seal is not None and recover is None:
            # Enrolled before: open it exactly as the device does (fail closed), writing nothing.
            ledger = cls.open(directory, quotas=quotas, state_dir=state_dir)
            ledger._check_same_budget(client_id, filter_kind, epsilon, delta, filt.orders, run_quota)
            ledger._enrol_worst_case(worst_case_epsilon)
            return ledger
        # From here on there is no seal: a new device, or the owner's recovery.
        has_db = path.exists() and path.stat().st_size > 0
        if recover == "reseal" and not has_db:
            raise owner_must_act(directory, "has no database to reseal.")
        if not has_db:
            refuse_if_spent_here(directory, anchor_file)  # deleting a ledger is no fresh budget
        try:
            directory.mkdir(parents=True, exist_ok=True)  # only now: a refused enrolment leaves nothing
            conn = connect(path)
        except (OSError, sqlite3.Error) as err:
            raise_storage_error(directory, err)
        with closed_on_failure(conn, directory):
            version = schema_version(conn)
            if version is not None and version != str(SCHEMA_VERSION):
                raise owner_must_act(directory, older_format(version), migrate_remedy(directory))
            with immediate(conn):
                prepare(conn)
                if recover is None and conn.execute("SELECT 1 FROM enrolment").fetchone() is None:
                    refuse_if_spent_here(directory, anchor_file)  # a re-created database, likewise
                created = (
                    conn.execute(
                        "INSERT OR IGNORE INTO enrolment VALUES (1,?,?,?,?,?,?,?)",
                        (
                            client_id,
                            filter_kind,
                            float(epsilon),
                            float(delta),
                            json.dumps(list(filt.orders)),
                            float(run_quota),
                            time.time(),
                        ),
                    ).rowcount
                    == 1
                )
                if created:  # a new ledger keeps a roll-back anchor from its first day
                    conn.execute("INSERT OR REPLACE INTO meta VALUES (?, '1')", (ANCHORED_KEY,))
            ledger = cls(directory, conn, read_enrolment(conn), quotas, anchor_file)
        try:
            ledger._check_same_budget(client_id, filter_kind, epsilon, delta, filt.orders, run_quota)
            if recover == "reseal":
                with ledger._lock:  # resealing accepts a lost seal, never a roll-back (an older format may follow)
                    check_anchor(conn, directory, ledger._ledger_id, anchor_file, ledger.filter, allow_older=True)
                move_aside(directory, [SEAL_FILE])  # kept for the record
                ledger._seal_latest()
            elif not created:
                raise owner_must_act(
                    directory, f"has no seal ({SEAL_FILE}): it may be a copy or a restore that lacks spends."
                )
            else:
                ledger._seal_latest(owner=True)
            ledger._enrol_worst_case(worst_case_epsilon)
        except BaseException:
            ledger.close()
            raise
        return ledger

    def _check_same_budget(self, client_id, filter_kind, epsilon, delta, orders, run_quota) -> None:
        requested = (client_id, filter_kind, float(epsilon), float(delta), tuple(orders), float(run_quota))
        e = self.enrolment
        stored = (e.client_id, e.filter_kind, e.epsilon, e.delta, e.orders, e.run_quota)
        if stored != requested:
            names = ("client_id", "filter", "epsilon", "delta", "orders", "run_quota")
            diffs = [f"{n}: enrolled {s!r}, requested {r!r}" for n, s, r in zip(names, stored, requested) if s != r]
            self.close()
            raise ValueError(
                f"the ledger at {self.directory} is enrolled with a different budget, which can never "
                f"change ({'; '.join(diffs)})."
            )

    @classmethod
    def open(cls, directory, *, quotas: Quotas | None = None, state_dir: Path | None = None) -> BudgetLedger:
        """Open an enrolled ledger; ``LedgerUnavailableError`` (fail closed) if it is missing,
        never enrolled, damaged, in an older format, or no longer holds the spend its seal or its
        roll-back anchor (in ``state_dir``, default the owner's state directory) names.

        Parameters
        ----------
        directory : str or pathlib.Path
            The ledger's folder.
        quotas : Quotas, optional
            The owner's coordinator and daily quotas (default: none below 1).
        state_dir : pathlib.Path, optional
            Where the roll-back anchor is (default: the owner's state directory).

        Examples
        --------
        >>> import tempfile
        >>> home, owner = tempfile.mkdtemp(), tempfile.mkdtemp()
        >>> BudgetLedger.enrol(home, client_id="a", epsilon=4.0, delta=1e-5, state_dir=owner).close()
        >>> again = BudgetLedger.open(home, state_dir=owner)
        >>> again.enrolment.client_id
        'a'
        >>> again.close()
        """
        directory = Path(directory)
        path = directory / LEDGER_FILE
        anchor_file = anchor_path(directory, state_dir)
        try:
            seal = read_seal(directory)
        except SealError as err:
            raise owner_must_act(directory, f"has a damaged seal ({err}).") from err
        if not (path.exists() and path.stat().st_size > 0):
            if seal is not None:
                raise owner_must_act(
                    directory,
                    f"is missing or empty, but this device was enrolled "
                    f"(its seal {SEAL_FILE} names spend #{seal.seq}).",
                )
            refuse_if_spent_here(directory, anchor_file)
            raise LedgerMissingError(
                f"no budget ledger at {directory}: the device is not enrolled. "
                f"Its owner enrols it once: `fedfilter ledger enrol --dir {directory} ...`."
            )
        try:
            conn = connect(path)
        except sqlite3.Error as err:
            raise_storage_error(directory, err)
        with closed_on_failure(conn, directory):
            check_device_opens(conn, directory, seal)
            enrolment = read_enrolment(conn, directory, seal)
            ledger = cls(directory, conn, enrolment, quotas, anchor_file)
            try:
                if seal is None:
                    raise owner_must_act(
                        directory, f"has no seal ({SEAL_FILE}): it may be a copy or a restore that lacks spends."
                    )
                with ledger._lock:
                    ledger._check_seal(seal)
                    ledger._check_anchor()
            except BaseException:
                ledger.close()
                raise
        return ledger

    def close(self) -> None:
        """Close the database (the ledger is unusable afterwards).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())

        >>> ledger.close()
        """
        with self._lock:
            self._conn.close()

    # --- the seal -----------------------------------------------------------------------------
    def _check_seal(self, seal: Seal | None = None) -> None:
        """Refuse a database that no longer holds the spend its seal names (caller holds the lock)."""
        check_seal(self._conn, self.directory, self._ledger_id, seal)

    def _seal_latest(self, *, owner: bool = False) -> None:
        """Seal and anchor the latest committed spend, under the write lock so that both only move
        forward. ``owner``: an owner's act (enrolment, migration, an accepted restore) that sets the
        anchor to this database whatever it named before."""
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                self._advance_locked(owner=owner)
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")

    def _advance_locked(self, *, owner: bool = False) -> None:
        """Seal, then anchor, the latest committed spend (caller holds the write transaction)."""
        advance_seal(self._conn, self.directory, self._ledger_id)
        # After the seal, before the caller releases anything (client/ledger/anchor.py: the crash orders).
        advance_anchor(self._conn, self.directory, self._ledger_id, self.anchor_file, self.filter, owner=owner)

    # --- the roll-back anchor (client/ledger/anchor.py: what it is, and the crash orders) ----------
    def _check_anchor(self) -> bool:
        """Refuse a ledger behind or beside its roll-back anchor (caller holds the lock); True if the
        database holds a spend the anchor does not name yet (never released)."""
        return check_anchor(self._conn, self.directory, self._ledger_id, self.anchor_file, self.filter)

    # --- reading ------------------------------------------------------------------------------
    def _last_state(self, run_id: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        with self._lock:
            return self._last_state_locked(run_id)

    def _last_state_locked(self, run_id: str | None) -> tuple[np.ndarray, np.ndarray]:
        life = self._conn.execute("SELECT state_after FROM spends ORDER BY seq DESC LIMIT 1").fetchone()
        state = floats(life[0]) if life else self.filter.initial_state()
        run_state = self.filter.initial_state()
        if run_id is not None:
            run = self._conn.execute(
                "SELECT run_state_after FROM spends WHERE run_id=? ORDER BY seq DESC LIMIT 1", (run_id,)
            ).fetchone()
            if run:
                run_state = floats(run[0])
        return state, run_state

    def state(self) -> np.ndarray:
        """The lifetime filter state (sum of every charge, rounded up).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> float(ledger.state().sum())
        0.0
        >>> ledger.close()
        """
        return self._last_state()[0]

    def run_state(self, run_id: str) -> np.ndarray:
        """The filter state of one run (its quota's account).

        Parameters
        ----------
        run_id : str
            The run.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> float(ledger.run_state("run").sum())
        0.0
        >>> ledger.close()
        """
        return self._last_state(run_id)[1]

    def records(self, run_id: str | None = None) -> list[SpendRecord]:
        """Every spend, in order (of one run when ``run_id`` is given).

        Parameters
        ----------
        run_id : str, optional
            Only this run's spends.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.records()
        []
        >>> ledger.close()
        """
        where = " WHERE run_id=? ORDER BY seq" if run_id else " ORDER BY seq"
        with self._lock:
            rows = self._conn.execute(SPEND_RECORD_SQL + where, (run_id,) if run_id else ()).fetchall()
        return [spend_record(row) for row in rows]

    def has_release(self, run_id: str, round_id: int) -> bool:
        """Whether this (run, round) was already answered (one indexed lookup).

        Parameters
        ----------
        run_id : str
            The run.
        round_id : int
            The round.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.has_release("run", 0)
        False
        >>> ledger.close()
        """
        with self._lock:
            return (
                self._conn.execute(
                    "SELECT 1 FROM spends WHERE run_id=? AND round_id=?", (run_id, int(round_id))
                ).fetchone()
                is not None
            )

    def recomputed_state(self) -> np.ndarray:
        """Every charge re-added from scratch with the filter's rounding (an audit of ``state``).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> bool((ledger.recomputed_state() == ledger.state()).all())
        True
        >>> ledger.close()
        """
        state = self.filter.initial_state()
        for rec in self.records():
            state = self.filter.spend(state, rec.charge)
        return state

    def spent_epsilon(self) -> float:
        """The epsilon the lifetime state has spent.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.spent_epsilon()
        0.0
        >>> ledger.close()
        """
        return self.filter.epsilon_spent(self.state())

    def summary(self) -> dict:
        """The owner's view: budget, spent, remaining, and spending per run and per coordinator
        (never sent anywhere).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.summary()["budget_epsilon"]
        4.0
        >>> ledger.close()
        """
        e = self.enrolment
        runs, rounds_by_coordinator = spends_by_run(self.records(), self.filter)
        spent = self.filter.epsilon_spent
        coordinators = [
            {"federation": n, "rounds": r, "spent_epsilon": spent(self.coordinator_state(n)) if n else None}
            for n, r in rounds_by_coordinator.items()
        ]
        state = self.state()
        worst = self.worst_summary()
        return {
            "client_id": e.client_id,
            "filter": e.filter_kind,
            "budget_epsilon": e.epsilon,
            "budget_delta": e.delta,
            "run_quota": e.run_quota,
            "spent_epsilon": self.filter.epsilon_spent(state),
            "remaining_fraction": float(self.filter.remaining_fraction(state)),
            "runs": runs,
            "coordinators": coordinators,
            "worst_case": worst,  # None: no worst-case-epsilon set (the device refuses distributed rounds)
        }

    def coordinator_state(self, federation: str | None = None) -> np.ndarray:
        """What one federation (default: this ledger's) has spent, for its quota.

        Parameters
        ----------
        federation : str, optional
            The coordinator's name (default: the owner's ``Quotas.federation``).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> float(ledger.coordinator_state().sum())
        0.0
        >>> ledger.close()
        """
        with self._lock:
            return self.quota_accounts.coordinator_state_locked(federation or self.quotas.federation)

    # --- the worst-case account (fedfilter.client.ledger.worst_case) ---------------------------
    def _enrol_worst_case(self, worst_case_epsilon: float | None) -> None:
        """At enrolment: set the worst-case budget if the ledger has none; refuse a different one."""
        if worst_case_epsilon is None:
            return
        stored = self.worst_case
        if stored is None:
            try:
                self.set_worst_case(worst_case_epsilon)
            except BaseException:
                self.close()
                raise
        elif stored.epsilon != float(worst_case_epsilon):
            self.close()
            raise ValueError(
                f"the ledger at {self.directory} has worst-case-epsilon {stored.epsilon!r}, which can never "
                f"change; requested {float(worst_case_epsilon)!r}."
            )

    def set_worst_case(self, worst_case_epsilon: float) -> WorstCase:
        """The owner's act, once: the budget against any coordinator (``fedfilter.client.ledger.worst_case``).

        Spends already recorded are charged to it conservatively (``worst_case.past_worst_charge``),
        in the same transaction; if they exceed it, the account starts spent and the device
        contributes no more data. Immutable afterwards (a trigger aborts any change).

        Parameters
        ----------
        worst_case_epsilon : float
            The budget against any coordinator.

        Returns
        -------
        WorstCase
            The stored budget.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> ledger.set_worst_case(8.0).epsilon
        8.0
        >>> ledger.close(); tmp.cleanup()
        """
        eps = check_worst_case_epsilon(worst_case_epsilon, self.enrolment.epsilon)
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                self._check_seal()
                self.worst_account.create_locked(eps, self.records(), self.clock())
                self._conn.execute("COMMIT")
            except BaseException as err:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(err, sqlite3.Error):
                    raise_storage_error(self.directory, err)
                raise
        self.worst_account.load()
        if self.worst_case is None:
            raise RuntimeError("internal error: the worst-case budget was not stored")
        return self.worst_case

    def current_worst_filter(self) -> GaussianFilter | None:
        """The worst-case account's filter as the ledger holds it now (the owner may have just set it).

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.current_worst_filter() is None
        True
        >>> ledger.close()
        """
        self.worst_account.load()
        return self.worst_filter

    def worst_state(self) -> np.ndarray | None:
        """The worst-case account's state: what the reports cost against any coordinator.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.worst_state() is None  # no worst-case budget set
        True
        >>> ledger.close()
        """
        with self._lock:
            self.worst_account.load()
            return self.worst_account.state_locked()

    def worst_summary(self) -> dict | None:
        """The owner's view of the account (``summary``'s ``worst_case``); None without one.

        Examples
        --------
        >>> import tempfile
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.worst_summary() is None
        True
        >>> ledger.close()
        """
        return self.worst_account.summary(self.worst_state(), self.enrolment.delta)

    # --- spending -----------------------------------------------------------------------------
    @contextmanager
    def reserve(self, run_id: str, round_id: int) -> Iterator[Reservation]:
        """Hold the write lock for one round; what is recorded is durable and sealed when the
        block exits, before the caller releases anything.

        Raises ``ReplayError`` (nothing written) when this (run, round) was released before,
        ``LedgerUnavailableError`` when the ledger lost spends it had committed (its seal or its
        roll-back anchor names a spend it does not hold), and
        ``LedgerWriteError`` when the disk refuses the write. An exception inside the block rolls
        back: nothing is spent.

        Parameters
        ----------
        run_id : str
            The run.
        round_id : int
            The round, in [0, 2**63-1].

        Yields
        ------
        Reservation
            The round's ``Account`` (``fedfilter.client.mechanisms.spend``).

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as tx:
        ...     tx.allowance(noise_std=2.0, clip=2.0)
        1.8498617953338456
        >>> ledger.close(); tmp.cleanup()
        """
        if not (isinstance(run_id, str) and run_id):
            raise ValueError(f"run_id must be a non-empty string. Found {run_id!r}.")
        if isinstance(round_id, bool) or not isinstance(round_id, int) or not 0 <= round_id <= INT64_MAX:
            raise ValueError(f"round_id must be an integer in [0, 2**63-1]. Found {round_id!r}.")
        with self._lock:  # held for the whole transaction: threads take turns, processes too (below)
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                # Both re-read every round: a cached connection (the mod keeps one) must see a
                # restore in place (same inode) as well as one that replaced the files.
                self._check_seal()
                if self._check_anchor():
                    # A spend whose seal or anchor write failed or tore (never released) is anchored
                    # before the next: the database stays at most one spend past the anchor, which is
                    # what lets a damaged anchor slot be told from a torn write (client/ledger/anchor.py).
                    try:
                        self._advance_locked()
                    except OSError as err:
                        raise_storage_error(self.directory, err)
                seen = self._conn.execute(
                    "SELECT status FROM spends WHERE run_id=? AND round_id=?", (run_id, round_id)
                ).fetchone()
                if seen is not None:
                    raise ReplayError(
                        f"round {round_id} of run {run_id!r} was already released; "
                        "a repeated request gets no second release."
                    )
                state, run_state = self._last_state_locked(run_id)
                # The asks this run has recorded: a device that samples itself spreads what is left
                # over the asks its plan still expects (client/mechanisms/sampled.py).
                (asks_in_run,) = self._conn.execute("SELECT COUNT(*) FROM spends WHERE run_id=?", (run_id,)).fetchone()
                coordinator_state = self.quota_accounts.coordinator_state_locked(self.quotas.federation)
                self.worst_account.load()
                worst_filter = self.worst_filter
                caps, worst_caps = self.quota_accounts.caps_locked(
                    run_id, coordinator_state, now=self.clock(), worst_filter=worst_filter
                )
                reservation = Reservation(
                    self._conn,
                    (self.filter, self.run_filter, worst_filter),
                    self.quotas.federation,
                    self.clock,
                    run_id,
                    round_id,
                    state,
                    run_state,
                    coordinator_state,
                    caps,
                    self.worst_account.state_locked(),
                    worst_caps,
                    asks_in_run=int(asks_in_run),
                )
                try:
                    yield reservation
                finally:
                    reservation.open = False
                self._conn.execute("COMMIT")  # synchronous=FULL: durable before the release
            except BaseException as err:
                if self._conn.in_transaction:  # SQLite may have rolled back already (e.g. disk full)
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the original error says more
                if isinstance(err, sqlite3.Error):
                    raise_storage_error(self.directory, err)
                raise
            if reservation.recorded:
                try:
                    self._seal_latest()
                except (OSError, sqlite3.Error) as err:
                    raise_storage_error(self.directory, err)
