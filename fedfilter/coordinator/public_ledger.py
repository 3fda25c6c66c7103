"""The coordinator's public ledger: one row per round of public, round-level facts.

The ledger is an embedded SQLite database in WAL mode: one coordinator appends while any number of
readers (the report service, a notebook, another process opened with ``read_only=True``) read it.
It holds only what the privacy model calls public: the round's request, counts of replies, the
norm of the noisy aggregate and evaluation on held-out data. Nothing per-client is ever stored:
run configs and metric names that look per-client (budget, epsilon, spent, examples, client or
node ids) are refused, and the record schema (``protos/fedfilter.proto``) has no such field.

Typical use by the coordinator::

    ledger = PublicLedger("runs/ledger.sqlite")
    ledger.start_run("run-1", {"rounds": 50, "clients_per_round": 10, "task": "mnist"})
    ledger.append(record)          # a fedfilter_pb2.PublicRoundRecord, once per round
    ledger.finish_run("run-1")
    ledger.close()
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedfilter.protos import fedfilter_pb2

__all__ = ["PublicLedger", "looks_per_client", "check_public_name", "SCHEMA_VERSION"]

SCHEMA_VERSION = 1

# Substrings (after lower-casing and dropping "_", "-", "." and spaces) that mark a name as
# per-client. "example" also catches num_examples / n_examples; "clientid" catches client_id,
# clientId, client-id.
_PER_CLIENT_MARKERS = ("budget", "epsilon", "spent", "example", "clientid", "nodeid")
_SEPARATORS = re.compile(r"[\s_\-.]+")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    seq              INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id           TEXT NOT NULL UNIQUE,
    created_at_unix  REAL NOT NULL,
    config_json      TEXT NOT NULL,
    finished_at_unix REAL
);
CREATE TABLE IF NOT EXISTS records (
    run_id           TEXT NOT NULL REFERENCES runs(run_id),
    round_id         INTEGER NOT NULL,
    clients_sampled  INTEGER NOT NULL,
    reports_received INTEGER NOT NULL,
    markers_received INTEGER NOT NULL,
    replies_dropped  INTEGER NOT NULL,
    released         INTEGER NOT NULL,
    aggregate_norm   REAL NOT NULL,
    finished_at_unix REAL NOT NULL,
    record           BLOB NOT NULL,
    PRIMARY KEY (run_id, round_id)
) WITHOUT ROWID;
"""
# Columns added after a schema version was released: (name, declaration). Added to an existing file
# when a writer opens it (old readers ignore them; the record blob holds every field anyway).
_ADDED_COLUMNS = (("expected_noise_norm", "REAL NOT NULL DEFAULT 0"),)


def looks_per_client(name: str) -> bool:
    """True if ``name`` reads like a per-client quantity (budget, epsilon, examples, ids...).

    Parameters
    ----------
    name : str
        A config key or metric name (case, ``_``, ``-``, ``.`` and spaces are ignored).

    Returns
    -------
    bool
        Whether the name looks per-client.

    Examples
    --------
    >>> looks_per_client("num-examples"), looks_per_client("Client_Id"), looks_per_client("accuracy")
    (True, True, False)
    """
    flat = _SEPARATORS.sub("", name.lower())
    return any(marker in flat for marker in _PER_CLIENT_MARKERS)


def check_public_name(name: str, where: str) -> None:
    """Raise ``ValueError`` if ``name`` (found in ``where``) looks per-client.

    Parameters
    ----------
    name : str
        The name to check.
    where : str
        What the name is, for the message (e.g. ``"metrics key"``).

    Examples
    --------
    >>> check_public_name("accuracy", "metrics key")
    >>> check_public_name("spent_eps", "metrics key")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: metrics key 'spent_eps' looks per-client (budget, epsilon, spent, examples, client or node id)...
    """
    if looks_per_client(name):
        raise ValueError(
            f"{where} {name!r} looks per-client (budget, epsilon, spent, examples, client or node "
            "id); the coordinator keeps only public, round-level facts"
        )


def _check_config_keys(value: Any, path: str) -> None:
    if isinstance(value, Mapping):
        for key, child in value.items():
            if not isinstance(key, str):
                raise ValueError(f"config key {key!r} at {path or 'top level'} is not a string")
            check_public_name(key, "config key" + (f" under {path}" if path else ""))
            _check_config_keys(child, f"{path}.{key}" if path else key)
    elif isinstance(value, (list, tuple)):
        for index, child in enumerate(value):
            _check_config_keys(child, f"{path}[{index}]")


def _check_run_id(run_id: str) -> None:
    if not isinstance(run_id, str) or not run_id.strip():
        raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")


class PublicLedger:
    """The public ledger in the SQLite file ``path``.

    ``read_only=True`` opens an existing file without ever writing to it (safe next to a running
    coordinator in another process); a file whose schema the writer has not created yet reads as
    empty. One connection is shared by the threads of this process behind a lock; other
    processes get their own connections, and SQLite's WAL mode lets them read while one writes.

    Parameters
    ----------
    path : str or pathlib.Path
        The SQLite file (created, with its folder, by a writer).
    read_only : bool, optional
        Open an existing file for reading only.
    timeout_s : float, optional
        How long to wait for another process's lock, in seconds.

    Examples
    --------
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
    >>> ledger.start_run("run-1", {"rounds": 2})
    >>> reader = PublicLedger(f"{tmp.name}/ledger.sqlite", read_only=True)
    >>> [run.run_id for run in reader.runs()]
    ['run-1']
    >>> reader.close()
    >>> ledger.close(); tmp.cleanup()
    """

    def __init__(self, path: str | Path, *, read_only: bool = False, timeout_s: float = 10.0):
        self.path = Path(path)
        self.read_only = read_only
        self._lock = threading.RLock()
        if read_only:
            if not self.path.is_file():
                raise FileNotFoundError(f"ledger {str(self.path)!r} does not exist")
            uri = f"{self.path.resolve().as_uri()}?mode=ro"
            self._conn = sqlite3.connect(
                uri, uri=True, timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
            self._schema_seen = False
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = sqlite3.connect(
                str(self.path), timeout=timeout_s, isolation_level=None, check_same_thread=False
            )
            self._create_schema()
            self._schema_seen = True

    # -- lifecycle ---------------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection; the ledger object is unusable afterwards.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.close(); tmp.cleanup()
        """
        with self._lock:
            self._conn.close()

    def __enter__(self) -> PublicLedger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _create_schema(self) -> None:
        with self._lock:
            mode = self._conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise RuntimeError(f"could not put ledger {str(self.path)!r} in WAL mode: {mode}")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                version = self._conn.execute("PRAGMA user_version").fetchone()[0]
                if version not in (0, SCHEMA_VERSION):
                    raise ValueError(
                        f"ledger {str(self.path)!r} has schema version {version}, "
                        f"this code reads version {SCHEMA_VERSION}"
                    )
                for statement in filter(str.strip, _SCHEMA.split(";")):
                    self._conn.execute(statement)
                have = {row[1] for row in self._conn.execute("PRAGMA table_info(records)")}
                for name, declaration in _ADDED_COLUMNS:
                    if name not in have:
                        self._conn.execute(f"ALTER TABLE records ADD COLUMN {name} {declaration}")
                self._conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def _ready(self) -> bool:
        """Whether the schema exists (always, for a writer; once created, for a reader)."""
        if not self._schema_seen:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            if version == 0:
                return False
            if version != SCHEMA_VERSION:
                raise ValueError(
                    f"ledger {str(self.path)!r} has schema version {version}, this code reads version {SCHEMA_VERSION}"
                )
            self._schema_seen = True
        return True

    def _require_writable(self, operation: str) -> None:
        if self.read_only:
            raise PermissionError(f"ledger {str(self.path)!r} is open read-only; cannot {operation}")

    # -- writing -----------------------------------------------------------------------------

    def start_run(self, run_id: str, config: Mapping[str, Any]) -> None:
        """Register a new run with its public configuration (stored as JSON).

        Raises ``ValueError`` if the run exists already, if ``config`` is not JSON-serialisable
        (NaN and infinity included) or if any key, at any depth, looks per-client.

        Parameters
        ----------
        run_id : str
            The run's id (non-empty, new to this ledger).
        config : Mapping
            The run's public configuration (plain JSON).

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {"rounds": 2, "task": "mnist"})
        >>> ledger.runs()[0].config_json
        '{"rounds": 2, "task": "mnist"}'
        >>> ledger.start_run("run-2", {"budget": 1.0})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: config key 'budget' looks per-client (budget, epsilon, spent, examples, client or node id)...
        >>> ledger.close(); tmp.cleanup()
        """
        self._require_writable("start_run")
        _check_run_id(run_id)
        if not isinstance(config, Mapping):
            raise ValueError(f"config for run_id {run_id!r} must be a mapping, got {type(config)}")
        _check_config_keys(config, "")
        try:
            config_json = json.dumps(config, sort_keys=True, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"config for run_id {run_id!r} is not plain JSON: {err}") from None
        with self._lock:
            try:
                self._conn.execute(
                    "INSERT INTO runs (run_id, created_at_unix, config_json) VALUES (?, ?, ?)",
                    (run_id, time.time(), config_json),
                )
            except sqlite3.IntegrityError:
                raise ValueError(f"run_id {run_id!r} already exists in the ledger") from None

    def append(self, record: fedfilter_pb2.PublicRoundRecord) -> None:
        """Append one round's public record.

        The run must have been started and not finished, and ``record.round_id`` must be larger
        than every round already in the run (a repeated round is a ``ValueError``). The record is
        checked for consistency before it is stored; in particular a DISTRIBUTED round with fewer
        than ``min_reports`` reports cannot be marked released.

        Parameters
        ----------
        record : fedfilter_pb2.PublicRoundRecord
            The round's public record.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {"rounds": 2})
        >>> ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4,
        ...                                               reports_received=3, released=True, aggregate_norm=0.5))
        >>> [r.reports_received for r in ledger.records("run-1")]
        [3]
        >>> ledger.close(); tmp.cleanup()
        """
        self._require_writable("append")
        if not isinstance(record, fedfilter_pb2.PublicRoundRecord):
            raise ValueError(f"record must be a PublicRoundRecord, got {type(record).__name__}")
        _validate_record(record)
        blob = record.SerializeToString(deterministic=True)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                run = self._conn.execute(
                    "SELECT finished_at_unix FROM runs WHERE run_id = ?", (record.run_id,)
                ).fetchone()
                if run is None:
                    raise ValueError(f"run_id {record.run_id!r} was never started (start_run)")
                if run[0] is not None:
                    raise ValueError(f"run_id {record.run_id!r} is finished; cannot append")
                last = self._conn.execute(
                    "SELECT MAX(round_id) FROM records WHERE run_id = ?", (record.run_id,)
                ).fetchone()[0]
                if last is not None and record.round_id == last:
                    raise ValueError(
                        f"duplicate record: round_id {record.round_id} of run_id "
                        f"{record.run_id!r} is already in the ledger"
                    )
                if last is not None and record.round_id < last:
                    exists = self._conn.execute(
                        "SELECT 1 FROM records WHERE run_id = ? AND round_id = ?",
                        (record.run_id, record.round_id),
                    ).fetchone()
                    what = "duplicate record" if exists else "out-of-order record"
                    raise ValueError(
                        f"{what}: round_id {record.round_id} of run_id {record.run_id!r} "
                        f"is not after the last round {last}"
                    )
                self._conn.execute(
                    "INSERT INTO records (run_id, round_id, clients_sampled, reports_received, "
                    "markers_received, replies_dropped, released, aggregate_norm, "
                    "finished_at_unix, record, expected_noise_norm) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        record.run_id,
                        record.round_id,
                        record.clients_sampled,
                        record.reports_received,
                        record.markers_received,
                        record.replies_dropped,
                        int(record.released),
                        record.aggregate_norm,
                        record.finished_at_unix,
                        blob,
                        record.expected_noise_norm,
                    ),
                )
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise

    def finish_run(self, run_id: str) -> None:
        """Mark a run finished: no more records; live streams of it end.

        Finishing a finished run changes nothing; an unknown run is a ``ValueError``.

        Parameters
        ----------
        run_id : str
            The run to finish.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {})
        >>> ledger.finish_run("run-1")
        >>> ledger.is_finished("run-1")
        True
        >>> ledger.close(); tmp.cleanup()
        """
        self._require_writable("finish_run")
        with self._lock:
            cursor = self._conn.execute(
                "UPDATE runs SET finished_at_unix = COALESCE(finished_at_unix, ?) WHERE run_id = ?",
                (time.time(), run_id),
            )
            if cursor.rowcount == 0:
                raise ValueError(f"unknown run_id {run_id!r}")

    # -- reading -----------------------------------------------------------------------------

    def has_run(self, run_id: str) -> bool:
        """Whether ``run_id`` has been started in this ledger.

        Parameters
        ----------
        run_id : str
            The run to look for.

        Returns
        -------
        bool
            Whether the run exists.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {})
        >>> ledger.has_run("run-1"), ledger.has_run("run-2")
        (True, False)
        >>> ledger.close(); tmp.cleanup()
        """
        with self._lock:
            if not self._ready():
                return False
            row = self._conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            return row is not None

    def is_finished(self, run_id: str) -> bool:
        """Whether ``run_id`` has been marked finished; an unknown run is a ``ValueError``.

        Parameters
        ----------
        run_id : str
            A run of this ledger.

        Returns
        -------
        bool
            Whether ``finish_run`` was called for it.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {})
        >>> ledger.is_finished("run-1")
        False
        >>> ledger.close(); tmp.cleanup()
        """
        with self._lock:
            row = None
            if self._ready():
                row = self._conn.execute("SELECT finished_at_unix FROM runs WHERE run_id = ?", (run_id,)).fetchone()
            if row is None:
                raise ValueError(f"unknown run_id {run_id!r}")
            return row[0] is not None

    def runs(self) -> list[fedfilter_pb2.RunInfo]:
        """Every run, oldest first (the last one is the newest).

        Returns
        -------
        list of fedfilter_pb2.RunInfo
            Each run's id, times and public config.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {})
        >>> ledger.start_run("run-2", {})
        >>> [run.run_id for run in ledger.runs()]
        ['run-1', 'run-2']
        >>> ledger.close(); tmp.cleanup()
        """
        with self._lock:
            if not self._ready():
                return []
            rows = self._conn.execute(
                "SELECT run_id, created_at_unix, config_json, finished_at_unix FROM runs ORDER BY seq"
            ).fetchall()
        return [
            fedfilter_pb2.RunInfo(
                run_id=run_id,
                created_at_unix=created,
                config_json=config_json,
                finished_at_unix=finished or 0.0,
            )
            for run_id, created, config_json, finished in rows
        ]

    def records(self, run_id: str) -> list[fedfilter_pb2.PublicRoundRecord]:
        """Every record of ``run_id`` in round order; an unknown run is a ``ValueError``.

        Parameters
        ----------
        run_id : str
            A run of this ledger.

        Returns
        -------
        list of fedfilter_pb2.PublicRoundRecord
            Its records, by round.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {"rounds": 2})
        >>> ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4,
        ...                                               reports_received=3, released=True, aggregate_norm=0.5))
        >>> [(r.round_id, r.released, r.aggregate_norm) for r in ledger.records("run-1")]
        [(1, True, 0.5)]
        >>> ledger.close(); tmp.cleanup()
        """
        return self._select(run_id, None)

    def records_after(self, run_id: str, round_id: int) -> list[fedfilter_pb2.PublicRoundRecord]:
        """The records of ``run_id`` whose round is strictly greater than ``round_id``.

        Parameters
        ----------
        run_id : str
            A run of this ledger.
        round_id : int
            The last round already seen.

        Returns
        -------
        list of fedfilter_pb2.PublicRoundRecord
            The later records, by round.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = PublicLedger(f"{tmp.name}/ledger.sqlite")
        >>> ledger.start_run("run-1", {"rounds": 2})
        >>> ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4,
        ...                                               reports_received=3, released=True, aggregate_norm=0.5))
        >>> len(ledger.records_after("run-1", 0)), len(ledger.records_after("run-1", 1))
        (1, 0)
        >>> ledger.close(); tmp.cleanup()
        """
        return self._select(run_id, round_id)

    def _select(self, run_id: str, after: int | None) -> list[fedfilter_pb2.PublicRoundRecord]:
        with self._lock:
            if not self.has_run(run_id):
                raise ValueError(f"unknown run_id {run_id!r}")
            if after is None:
                rows = self._conn.execute(
                    "SELECT record FROM records WHERE run_id = ? ORDER BY round_id", (run_id,)
                ).fetchall()
            else:
                rows = self._conn.execute(
                    "SELECT record FROM records WHERE run_id = ? AND round_id > ? ORDER BY round_id",
                    (run_id, int(after)),
                ).fetchall()
        return [fedfilter_pb2.PublicRoundRecord.FromString(row[0]) for row in rows]


def _validate_record(record: fedfilter_pb2.PublicRoundRecord) -> None:
    """Check one record for consistency; every error names the field and its value."""
    _check_run_id(record.run_id)
    if record.round_id >= 2**63:
        raise ValueError(f"round_id {record.round_id} does not fit the ledger (max 2**63 - 1)")
    if record.HasField("request"):
        request = record.request
        if request.run_id != record.run_id:
            raise ValueError(f"request.run_id {request.run_id!r} differs from run_id {record.run_id!r}")
        if request.round_id != record.round_id:
            raise ValueError(f"request.round_id {request.round_id} differs from round_id {record.round_id}")
        for name in ("noise_multiplier", "clip", "learning_rate"):
            value = getattr(request, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"request.{name} must be finite and >= 0, got {value}")
        if (
            request.placement == fedfilter_pb2.DISTRIBUTED
            and record.released
            and record.reports_received < request.min_reports
        ):
            raise ValueError(
                f"released is true but reports_received {record.reports_received} < "
                f"request.min_reports {request.min_reports} in a DISTRIBUTED round: the round "
                "must be dropped (released = false)"
            )
    replies = record.reports_received + record.markers_received + record.replies_dropped
    if replies > record.clients_sampled:
        raise ValueError(
            f"reports_received {record.reports_received} + markers_received "
            f"{record.markers_received} + replies_dropped {record.replies_dropped} exceeds "
            f"clients_sampled {record.clients_sampled}"
        )
    if not math.isfinite(record.aggregate_norm) or record.aggregate_norm < 0:
        raise ValueError(f"aggregate_norm must be finite and >= 0, got {record.aggregate_norm}")
    if not math.isfinite(record.expected_noise_norm) or record.expected_noise_norm < 0:
        raise ValueError(f"expected_noise_norm must be finite and >= 0, got {record.expected_noise_norm}")
    if not record.released and record.aggregate_norm != 0:
        raise ValueError(
            f"aggregate_norm {record.aggregate_norm} given for a round that was not released; "
            "nothing derived from a dropped round's reports may be stored"
        )
    for name in ("started_at_unix", "finished_at_unix", "wall_time_s"):
        value = getattr(record, name)
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be finite and >= 0, got {value}")
    for key in record.metrics:
        if not key:
            raise ValueError("metrics key '' is empty")
        check_public_name(key, "metrics key")
