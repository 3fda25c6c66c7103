"""The owner's acts on a ledger the device refuses: migrate an older format, accept a restore.

A device never does either on its own (``BudgetLedger.open`` refuses both cases: a roll-back
needs its owner); ``fedfilter ledger migrate`` and ``fedfilter ledger accept-restore`` call these.

* ``migrate``: an older format (schema 1, or a schema 2 ledger written before roll-back anchors)
  gains the current schema, its seal and its anchor, keeping every spend the database holds. Only a
  ledger that is otherwise intact: one that its seal or anchor shows to be an older copy is refused
  here (that is a restore, not a format). Spends the device made beyond the database are out of its
  sight when no seal or anchor names them (an older ledger swapped in with both gone): ``inspect``
  names the budget at risk, as for ``accept_restore``.
* ``accept_restore``: the owner accepts the database as it is now, against its seal and its anchor
  (a restored backup, a copy moved onto this device, a lost state directory). What the anchor names
  beyond the database is budget the device will spend a second time: ``inspect`` shows it first.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from pathlib import Path

from fedfilter.client.ledger.anchor import (
    AnchorError,
    anchor_path,
    check_anchor,
    read_anchor,
    read_anchor_file,
    retire_anchor,
    state_epsilon,
)
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import (
    ANCHORED_KEY,
    LEDGER_FILE,
    SCHEMA_VERSION,
    connect,
    prepare,
    read_enrolment,
    schema_version,
)
from fedfilter.client.ledger.seal import SEAL_FILE, SealError, move_aside, read_seal
from fedfilter.client.ledger.storage import (
    LedgerMissingError,
    LedgerUnavailableError,
    closed_on_failure,
    immediate,
    owner_must_act,
    raise_storage_error,
    rollback_remedy,
)
from fedfilter.privacy.filters import make_filter


@dataclass(frozen=True)
class LedgerView:
    """What the owner is asked to accept: the database as it is, and what its anchor and seal name.

    Attributes
    ----------
    directory : pathlib.Path
        The ledger directory.
    anchor_file : pathlib.Path
        Its roll-back anchor.
    refused : str or None
        Why the device refuses this ledger now (None: it opens as it is).
    database : str
        The database's latest spend and lifetime epsilon spent.
    anchored : str
        What the anchor names ("none" or "damaged" included).
    sealed : str
        What the seal names.
    at_risk_epsilon : float or None
        The epsilon the anchor names beyond the database; None when unknown.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from pathlib import Path
    >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, owner = Path(tmp.name) / "ledger", Path(tmp.name) / "owner"
    >>> ledger = BudgetLedger.enrol(ledger_dir, client_id="a", epsilon=4.0, delta=1e-5, state_dir=owner)
    >>> with ledger.reserve("run", 0) as tx:
    ...     tx.commit(ReleaseRecord("contributed", "local", 1.0, 2.0, 1.0, 2.0, np.array([0.25]), None))
    >>> ledger.close()
    >>> view = inspect(ledger_dir, state_dir=owner)
    >>> view.refused, view.at_risk_epsilon
    (None, 0.0)
    >>> tmp.cleanup()
    """

    directory: Path
    anchor_file: Path
    refused: str | None  # why the device refuses this ledger now (None: it opens as it is)
    database: str  # the database's latest spend and lifetime epsilon spent
    anchored: str  # what the anchor names ("none" or "damaged" included)
    sealed: str  # what the seal names
    # epsilon the anchor names beyond the database (all of it if another ledger); None: unknown (no intact
    # anchor of this directory: none, damaged, or another directory's)
    at_risk_epsilon: float | None


def _connect(directory: Path) -> sqlite3.Connection:
    path = directory / LEDGER_FILE
    if not (path.exists() and path.stat().st_size > 0):
        raise LedgerMissingError(
            f"no budget ledger database at {directory}: nothing to accept or migrate. "
            f"Its owner enrols the device: `fedfilter ledger enrol --dir {directory} ...`."
        )
    try:
        return connect(path)
    except sqlite3.Error as err:
        raise_storage_error(directory, err)


def inspect(directory, *, state_dir: Path | None = None) -> LedgerView:
    """The database, its anchor and its seal side by side, and the budget accepting it gives back.

    Parameters
    ----------
    directory : str or pathlib.Path
        The ledger directory.
    state_dir : pathlib.Path, optional
        The owner's state directory (default: the owner's).

    Returns
    -------
    LedgerView

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from pathlib import Path
    >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, owner = Path(tmp.name) / "ledger", Path(tmp.name) / "owner"
    >>> ledger = BudgetLedger.enrol(ledger_dir, client_id="a", epsilon=4.0, delta=1e-5, state_dir=owner)
    >>> with ledger.reserve("run", 0) as tx:
    ...     tx.commit(ReleaseRecord("contributed", "local", 1.0, 2.0, 1.0, 2.0, np.array([0.25]), None))
    >>> ledger.close()
    >>> inspect(ledger_dir, state_dir=owner).database.endswith("spend #1, lifetime epsilon spent 1.993 of 4")
    True
    >>> tmp.cleanup()
    """
    directory = Path(directory)
    anchor_file = anchor_path(directory, state_dir)
    try:
        BudgetLedger.open(directory, state_dir=state_dir).close()
        refused = None
    except LedgerUnavailableError as err:
        refused = str(err)
    conn = _connect(directory)
    with closed_on_failure(conn, directory):
        enrolment = read_enrolment(conn, directory)
        filt = make_filter(enrolment.filter_kind, enrolment.epsilon, enrolment.delta, enrolment.orders or None)
        row = conn.execute("SELECT seq, state_after FROM spends ORDER BY seq DESC LIMIT 1").fetchone()
        ids = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()
    conn.close()
    db_spent = state_epsilon(filt, row[1]) if row else 0.0
    database = (
        f"ledger {ids[0] if ids else '(schema 1, no id)'}, spend #{row[0] if row else 0}, "
        f"lifetime epsilon spent {db_spent:.4g} of {enrolment.epsilon:g}"
    )
    at_risk: float | None = None  # unknown unless an intact anchor of this directory names what was spent
    try:
        read = read_anchor_file(anchor_file)
        if read is None:
            anchored = "none"
        else:
            anchor = read.anchor
            anchor_spent = state_epsilon(filt, anchor.state_after)
            anchored = (
                f"ledger {anchor.ledger_id}, spend #{anchor.seq}, lifetime epsilon spent {anchor_spent:.4g} "
                "(as this ledger's filter reads it)"
            )
            foreign = anchor.directory != str(directory.resolve())
            if foreign:
                anchored += f"; written for another directory, {anchor.directory}"
            if read.damaged:
                anchored += f"; its other slot is damaged ({read.damaged}) and may have named a later spend"
            elif not foreign:
                # Another ledger (a re-created or older-format database): none of the anchored spends is in it.
                same = ids is not None and ids[0] == anchor.ledger_id
                at_risk = max(0.0, anchor_spent - db_spent) if same else anchor_spent
    except AnchorError as err:
        anchored = f"damaged ({err})"
    try:
        seal = read_seal(directory)
        sealed = "none" if seal is None else f"ledger {seal.ledger_id}, spend #{seal.seq}"
    except SealError as err:
        sealed = f"damaged ({err})"
    return LedgerView(directory, anchor_file, refused, database, anchored, sealed, at_risk)


def _adopt(directory: Path, conn: sqlite3.Connection, state_dir: Path | None) -> BudgetLedger:
    """Bring ``conn``'s database to the current schema, mark it anchored, then seal and anchor it."""
    with immediate(conn):
        prepare(conn, migrate=True)
        conn.execute("INSERT OR REPLACE INTO meta VALUES (?, '1')", (ANCHORED_KEY,))
    ledger = BudgetLedger(
        directory, conn, read_enrolment(conn, directory), anchor_file=anchor_path(directory, state_dir)
    )
    try:
        ledger._seal_latest(owner=True)
    except BaseException:
        ledger.close()
        raise
    ledger.close()
    return BudgetLedger.open(directory, state_dir=state_dir)  # exactly as the device will


def migrate(directory, *, state_dir: Path | None = None) -> tuple[BudgetLedger, bool]:
    """The owner's command: migrate an older format, keeping every spend the database holds; (ledger, migrated?).

    Refused (``LedgerUnavailableError``) when the seal or the anchor shows the database to be an
    older copy: that is for ``accept_restore``, which names the budget at risk.

    Parameters
    ----------
    directory : str or pathlib.Path
        The ledger directory.
    state_dir : pathlib.Path, optional
        The owner's state directory (default: the owner's).

    Returns
    -------
    tuple of (BudgetLedger, bool)
        The opened ledger, and whether it was migrated.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from pathlib import Path
    >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, owner = Path(tmp.name) / "ledger", Path(tmp.name) / "owner"
    >>> ledger = BudgetLedger.enrol(ledger_dir, client_id="a", epsilon=4.0, delta=1e-5, state_dir=owner)
    >>> with ledger.reserve("run", 0) as tx:
    ...     tx.commit(ReleaseRecord("contributed", "local", 1.0, 2.0, 1.0, 2.0, np.array([0.25]), None))
    >>> ledger.close()
    >>> ledger, migrated = migrate(ledger_dir, state_dir=owner)  # current format: nothing to do
    >>> migrated
    False
    >>> ledger.close(); tmp.cleanup()
    """
    directory = Path(directory)
    try:
        return BudgetLedger.open(directory, state_dir=state_dir), False  # nothing to migrate
    except LedgerUnavailableError as err:
        if "older format" not in str(err):
            raise
    anchor_file = anchor_path(directory, state_dir)
    conn = _connect(directory)
    with closed_on_failure(conn, directory):
        version = schema_version(conn)
        if version == "1":
            # Schema 1 had neither seal nor ledger id: a seal, or an anchor naming spends, belongs
            # to a newer ledger that this directory held, so this database is an older copy of it.
            try:  # a damaged seal or anchor counts as one that names spends
                anchored = (anchor := read_anchor(anchor_file)) is not None and anchor.seq > 0
            except AnchorError:
                anchored = True
            try:
                sealed = read_seal(directory) is not None
            except SealError:
                sealed = True
            if sealed or anchored:
                raise owner_must_act(
                    directory,
                    "is an older copy (schema 1) of a ledger this directory held since (its seal or its roll-back "
                    f"anchor {anchor_file} names a later ledger): migrating it would give spent budget back.",
                    rollback_remedy(directory),
                )
        elif version == str(SCHEMA_VERSION):
            # Written before anchors: everything but the anchor must check out as the device checks it.
            ledger = BudgetLedger(directory, conn, read_enrolment(conn, directory), anchor_file=anchor_file)
            with ledger._lock:
                ledger._check_seal()
                check_anchor(conn, directory, ledger._ledger_id, anchor_file, ledger.filter, allow_older=True)
        else:
            raise owner_must_act(directory, f"has schema version {version!r}, which this fedfilter cannot migrate.")
        return _adopt(directory, conn, state_dir), True


def accept_restore(directory, *, state_dir: Path | None = None) -> LedgerView:
    """The owner's command: accept the database as it is now, against its seal and anchor.

    Returns what was accepted (``inspect`` before the change). The old seal goes into a ``lost-*``
    folder and the old anchor is kept beside the new one (``.retired-N``). A ledger that opens as it
    is is left untouched.

    Parameters
    ----------
    directory : str or pathlib.Path
        The ledger directory.
    state_dir : pathlib.Path, optional
        The owner's state directory (default: the owner's).

    Returns
    -------
    LedgerView

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from pathlib import Path
    >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, owner = Path(tmp.name) / "ledger", Path(tmp.name) / "owner"
    >>> ledger = BudgetLedger.enrol(ledger_dir, client_id="a", epsilon=4.0, delta=1e-5, state_dir=owner)
    >>> with ledger.reserve("run", 0) as tx:
    ...     tx.commit(ReleaseRecord("contributed", "local", 1.0, 2.0, 1.0, 2.0, np.array([0.25]), None))
    >>> ledger.close()
    >>> (ledger_dir / "budget_ledger.seal").unlink()  # the device now refuses the ledger
    >>> view = accept_restore(ledger_dir, state_dir=owner)
    >>> "has no seal" in view.refused, view.at_risk_epsilon
    (True, 0.0)
    >>> BudgetLedger.open(ledger_dir, state_dir=owner).close()
    >>> tmp.cleanup()
    """
    directory = Path(directory)
    view = inspect(directory, state_dir=state_dir)
    if view.refused is None:
        return view
    conn = _connect(directory)
    with closed_on_failure(conn, directory):
        version = schema_version(conn)
        if version not in ("1", str(SCHEMA_VERSION)):
            raise owner_must_act(directory, f"has schema version {version!r}, which this fedfilter cannot read.")
        move_aside(directory, [SEAL_FILE])
        retire_anchor(view.anchor_file)
        ledger = _adopt(directory, conn, state_dir)
    ledger.close()
    return view
