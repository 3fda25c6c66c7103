"""The ledger's roll-back anchor: its latest committed spend, kept outside the ledger directory.

The seal (``fedfilter.client.ledger.seal``) lives beside the database, so a backup of the ledger
directory holds a seal that matches it: restoring that backup would give spent budget back. The
anchor names the same latest spend (sequence number and a SHA-256 digest of the whole row), but in
the owner's state directory (``fedfilter.client.ledger.owner_state``), one file per ledger directory
(keyed by its resolved path). It is bound to three things, each checked on every open and every spend
(``fedfilter.client.ledger.budget``): its ledger directory (the ``directory`` it names, so another
directory's anchor renamed to this key is refused), its enrolment (the database's random
``ledger_id``, written in the transaction that enrols it and never again), and the spend it names.
A ledger that fails any of them is refused until the owner acts.

An enrolled ledger has its anchor from enrolment on (spend #0: "enrolled, nothing spent yet"), so an
enrolled ledger without one was copied or moved here, or the owner's state directory changed; it is
refused even before its first spend (a copy taken then would be a second full budget). Ledgers
enrolled since anchors exist all got that anchor at enrolment; older ones get it when migrated.

Crash orders. The spend path is: COMMIT, seal, anchor, then the release (``BudgetLedger.reserve``);
a spend whose anchor write failed is anchored before the next spend is committed, so the database is
never more than one spend past the anchor. The anchor file has two slots, written in turn (each
write goes to the slot that does not hold the newest anchor, with a generation one higher):

* crash before the COMMIT is durable: nothing recorded, nothing released;
* crash after the COMMIT, before the anchor write starts: both slots intact, naming the previous
  spend; the database holds one spend more (never released). The device opens; restoring a copy
  that ends at the previous spend passes, and loses only that unreleased spend;
* crash during the anchor write (a torn write): the slot being written is damaged, the other names
  the previous spend, and the database holds exactly one spend past it, never released;
* crash after the anchor, before the release: the anchor names a spend never released (wasted
  budget, never lost).

A damaged slot found later cannot be told from a torn one by the file alone: bit rot, or a partly
restored state directory, can hit the slot that names the newest spend (released long ago) as well
as the older one. So a damaged slot is never read as "not released": the device opens only when the
database shows the torn case, holding exactly one spend past the readable slot (what a crash during
the write leaves). A database that ends at the readable slot's spend is refused until the owner acts
(``accept-restore``): it may be a copy one spend older, restored under an anchor whose newest slot
was damaged since. That also refuses a crash's torn write followed by a restore of a backup at the
previous spend, which loses nothing: the two cannot be told apart. A blank slot counts as damaged
unless the file's history leaves it blank (slot 1 before the file's second write).

So whatever left the device is covered by the anchor, and the anchor never names a spend the
database has not committed. Each slot is written durably (``pwrite`` + ``fdatasync``:
``write_anchor``) and only forward, under an exclusive ``flock`` so that two copies of one ledger
(two processes) cannot move it backwards; an owner's act (enrolment, migration, an accepted restore)
writes a new file.

What it cannot see: a restore of the *whole* machine (ledger and owner's state directory from the
same backup) is consistent and passes; so does a ledger directory moved together with the state
directory to the same path. A ledger restored or moved without its anchor is refused.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import sqlite3
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from fedfilter.client.ledger.owner_state import owner_state_dir
from fedfilter.client.ledger.schema import ANCHOR_ROW_SQL, floats, is_anchored
from fedfilter.client.ledger.storage import (
    LedgerWriteError,
    migrate_remedy,
    older_format,
    owner_must_act,
    rollback_remedy,
)

ANCHOR_DIR = "ledger-anchors"  # under the owner's state directory
OLDER = "older"  # anchor_problem: a ledger written before anchors
_FORMAT = 1
_SLOT = 16384  # bytes per slot (two slots per file); the anchor's JSON is far smaller


class AnchorError(ValueError):
    """The anchor file exists but cannot be read, fails its checksum, or has a damaged slot.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "a.json").write_bytes(b"x")
    ...     read_anchor(Path(tmp) / "a.json")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.anchor.AnchorError: the roll-back anchor ... is damaged (size 1, expected 32768).
    """


@dataclass(frozen=True)
class Anchor:
    """What one slot of the anchor file names: a ledger directory, its database and its latest spend.

    Attributes
    ----------
    directory : str
        The ledger directory it anchors (resolved).
    ledger_id : str
        The database's random id.
    seq : int
        The latest committed spend (0: enrolled, nothing spent yet).
    digest : str
        SHA-256 of that spend row (``row_digest``; "" for seq 0).
    state_after : str
        That row's lifetime filter state (JSON text).

    Examples
    --------
    >>> Anchor("/srv/ledger", "id", 0, "", "[]").seq
    0
    """

    directory: str  # the ledger directory it anchors (resolved); a ledger elsewhere is refused
    ledger_id: str  # random id of the anchored database and its enrolment (its meta table)
    seq: int  # latest committed spend (0: enrolled, nothing spent yet)
    digest: str  # SHA-256 of that spend row as stored ("" for seq 0)
    state_after: str  # that row's lifetime filter state (JSON text): what the owner would give back


@dataclass(frozen=True)
class AnchorRead:
    """An anchor file as read: its newest readable slot, and what damaged the other one (if any).

    Attributes
    ----------
    anchor : Anchor
        The newest readable slot.
    damaged : str or None
        The other slot's damage (None: intact).

    Examples
    --------
    >>> AnchorRead(Anchor("/srv/ledger", "id", 0, "", "[]"), None).damaged is None
    True
    """

    anchor: Anchor
    damaged: str | None  # the other slot's damage: it may have named a later spend (None: intact)


def row_digest(row: tuple) -> str:
    """SHA-256 of a spend row (every column, as SQLite returns them).

    Parameters
    ----------
    row : tuple
        The row, in ``ANCHOR_ROW_SQL``'s column order.

    Returns
    -------
    str
        The hex digest.

    Examples
    --------
    >>> row_digest((1, "run"))[:16]
    '2e8d0812d77ad8a2'
    """
    return hashlib.sha256(json.dumps(list(row), separators=(",", ":")).encode()).hexdigest()


def anchor_path(ledger_dir: Path, state_dir: Path | None = None) -> Path:
    """Where the anchor of ``ledger_dir`` lives: one file per resolved ledger directory.

    Parameters
    ----------
    ledger_dir : pathlib.Path
        The ledger directory.
    state_dir : pathlib.Path, optional
        The owner's state directory (default: ``owner_state_dir()``).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> from pathlib import Path
    >>> path = anchor_path(Path("ledger"), Path("/srv/owner"))
    >>> path.parent, path.suffix
    (PosixPath('/srv/owner/ledger-anchors'), '.json')
    """
    key = hashlib.sha256(str(Path(ledger_dir).resolve()).encode()).hexdigest()[:32]
    return Path(state_dir if state_dir is not None else owner_state_dir()) / ANCHOR_DIR / f"{key}.json"


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def _parse_slot(raw: bytes) -> tuple[int, Anchor] | None:
    """One slot: (generation, anchor); None if it is blank; ``ValueError`` if damaged."""
    if not raw.strip(b"\0 "):
        return None
    body = json.loads(raw.decode())
    checksum = body.pop("checksum")
    if body.pop("format") != _FORMAT or checksum != _checksum({**body, "format": _FORMAT}):
        raise ValueError("checksum or format mismatch")
    gen = body.pop("gen")
    anchor = Anchor(**body)
    if not (isinstance(gen, int) and gen >= 1 and isinstance(anchor.seq, int) and anchor.seq >= 0):
        raise ValueError(f"gen must be an integer >= 1 and seq >= 0. Found {gen!r}, {anchor.seq!r}.")
    return gen, anchor


_PARSE_ERRORS = (ValueError, TypeError, KeyError, AttributeError, UnicodeDecodeError)


def _slots(raw: bytes, path: Path) -> AnchorRead:
    """The newest readable slot of an anchor file and the other's damage; ``AnchorError`` if none is readable."""
    if len(raw) != 2 * _SLOT:
        raise AnchorError(f"the roll-back anchor {path} is damaged (size {len(raw)}, expected {2 * _SLOT}).")
    slots: list[tuple[int, Anchor] | None] = []
    errors: list[str | None] = []
    for i in (0, 1):
        try:
            slots.append(_parse_slot(raw[i * _SLOT : (i + 1) * _SLOT]))
            errors.append(None)
        except _PARSE_ERRORS as err:
            slots.append(None)
            errors.append(f"slot {i}: {err}")
    # Blank is "never written" only where the file's history allows it: slot 0 is written when the
    # file is created (atomically), slot 1 at its second write (generation 2).
    if slots[0] is None and errors[0] is None:
        errors[0] = "slot 0: blank, though it is written when the file is created"
    if slots[1] is None and errors[1] is None and slots[0] is not None and slots[0][0] > 1:
        errors[1] = f"slot 1: blank, though slot 0 holds write {slots[0][0]}"
    found = [slot for slot in slots if slot is not None]
    damage = "; ".join(e for e in errors if e)
    if not found:
        raise AnchorError(f"the roll-back anchor {path} is damaged ({damage}).")
    return AnchorRead(max(found, key=lambda slot: slot[0])[1], damage or None)


def read_anchor_file(path: Path) -> AnchorRead | None:
    """The anchor file at ``path`` as read (its newest readable slot, and the other slot's damage);
    None if there is none; ``AnchorError`` if no slot is readable.

    Parameters
    ----------
    path : pathlib.Path
        The anchor file.

    Returns
    -------
    AnchorRead or None

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> read_anchor_file(anchor_file) is None
    True
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> read_anchor_file(anchor_file).anchor.seq
    0
    >>> conn.close(); tmp.cleanup()
    """
    try:
        raw = Path(path).read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise AnchorError(f"cannot read the roll-back anchor {path}: {err}") from err
    return _slots(raw, path)


def read_anchor(path: Path) -> Anchor | None:
    """The anchor at ``path``; None if there is none; ``AnchorError`` if any slot is damaged.

    A damaged slot may have named a later spend than the readable one, released since: it is never
    read as "not released" (the module's docstring). Only ``check_anchor``, which sees the database,
    accepts the one case a database proves to be a torn write.

    Parameters
    ----------
    path : pathlib.Path
        The anchor file.

    Returns
    -------
    Anchor or None

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> read_anchor(anchor_file).ledger_id == ledger_id
    True
    >>> conn.close(); tmp.cleanup()
    """
    read = read_anchor_file(path)
    if read is None:
        return None
    if read.damaged:
        raise AnchorError(
            f"the roll-back anchor {path} is damaged ({read.damaged}); its other slot names spend "
            f"#{read.anchor.seq}, and the damaged one may have named a later spend."
        )
    return read.anchor


def _slot_bytes(anchor: Anchor, gen: int) -> bytes:
    body = {**asdict(anchor), "gen": gen, "format": _FORMAT}
    body["checksum"] = _checksum(body)
    raw = json.dumps(body, sort_keys=True).encode()
    if len(raw) > _SLOT:
        raise ValueError(f"the roll-back anchor holds {len(raw)} bytes, more than its slot of {_SLOT}.")
    return raw.ljust(_SLOT, b" ")


def write_anchor(path: Path, anchor: Anchor, *, new_file: bool = False) -> None:
    """Replace the anchor durably; callers hold ``locked``.

    Two fixed slots, written in turn (``pwrite`` + ``fdatasync``, one sync per spend): a write cut
    short damages only the slot being written, and the other still holds the previous anchor. The
    file itself is created atomically (temporary file, fsync, rename, fsync of the directory): the
    first time, and for an owner's act (``new_file``), which starts its history afresh.

    Parameters
    ----------
    path : pathlib.Path
        The anchor file (its folder must exist).
    anchor : Anchor
        The new anchor.
    new_file : bool, optional
        Start a new file (an owner's act).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = Path(tmp) / "a.json"
    ...     with locked(path):
    ...         write_anchor(path, Anchor(tmp, "id", 0, "", "[]"))
    ...     read_anchor(path).ledger_id
    'id'
    """
    path = Path(path)
    if new_file or not path.exists():
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_slot_bytes(anchor, 1) + b"\0" * _SLOT)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return
    fd = os.open(path, os.O_RDWR)
    try:
        raw = os.pread(fd, 2 * _SLOT + 1, 0)
        # A damaged or short file reaches here only after the checks accepted it (a torn write).
        gens = [_slot_gen(raw, i) if len(raw) == 2 * _SLOT else None for i in (0, 1)]
        gen = max((g for g in gens if g is not None), default=0)
        target = 1 if gen > 0 and gens[0] == gen else 0  # write over the slot that is not the newest
        if len(raw) != 2 * _SLOT:
            os.ftruncate(fd, 2 * _SLOT)
        os.pwrite(fd, _slot_bytes(anchor, gen + 1), target * _SLOT)
        os.fdatasync(fd)
    finally:
        os.close(fd)


def _slot_gen(raw: bytes, i: int) -> int | None:
    try:
        slot = _parse_slot(raw[i * _SLOT : (i + 1) * _SLOT])
    except _PARSE_ERRORS:
        return None
    return None if slot is None else slot[0]


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on the anchor of one ledger directory (its ``.lock`` file), across processes.

    Parameters
    ----------
    path : pathlib.Path
        The anchor file (its folder is created if needed).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     with locked(Path(tmp) / "anchors" / "a.json"):
    ...         print(sorted(p.name for p in (Path(tmp) / "anchors").iterdir()))
    ['a.lock']
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def retire_anchor(path: Path) -> Path | None:
    """The owner's act: keep a replaced ledger's anchor for the record (``<name>.retired-<n>``).

    Parameters
    ----------
    path : pathlib.Path
        The anchor file.

    Returns
    -------
    pathlib.Path or None
        Where it was kept; None if there was none.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> retire_anchor(anchor_file).name.endswith(".json.retired-0")
    True
    >>> conn.close(); tmp.cleanup()
    """
    path = Path(path)
    with locked(path):
        if not path.exists():
            return None
        n = 0
        while (target := path.with_name(f"{path.name}.retired-{n}")).exists():
            n += 1
        os.replace(path, target)
        return target


# --- the checks (the ledger calls these under its lock; client/ledger/budget.py) ---------------------------
def _read_or_refuse(directory: Path, anchor_file: Path) -> AnchorRead | None:
    try:
        return read_anchor_file(anchor_file)
    except AnchorError as err:
        raise owner_must_act(directory, f"has a damaged roll-back anchor ({err}).", rollback_remedy(directory)) from err


def _row(conn: sqlite3.Connection, seq: int | None = None) -> tuple | None:
    """The spend row an anchor covers: ``seq``, or the latest."""
    if seq is None:
        return conn.execute(ANCHOR_ROW_SQL + " ORDER BY seq DESC LIMIT 1").fetchone()
    return conn.execute(ANCHOR_ROW_SQL + " WHERE seq=?", (seq,)).fetchone()


def _spends_after(conn: sqlite3.Connection, seq: int) -> int:
    return conn.execute("SELECT COUNT(*) FROM spends WHERE seq > ?", (seq,)).fetchone()[0]


_STATE_AFTER = 10  # index of state_after in ANCHOR_ROW_SQL


def state_epsilon(filt, state_text: str) -> float:
    """The lifetime epsilon a stored filter state has spent; an empty state (the anchor written at
    enrolment, before any spend) has spent nothing.

    Parameters
    ----------
    filt : GaussianFilter
        The ledger's filter, which reads the state.
    state_text : str
        A state as the ledger and its anchor store it (a JSON list of floats).

    Returns
    -------
    float
        The epsilon spent, as ``filt.epsilon_spent`` reads it; 0 for an empty state.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("gdp", 1.0, 1e-5)
    >>> state_epsilon(filt, "[]")
    0.0
    >>> 0 < state_epsilon(filt, "[0.01]") < 1.0
    True
    """
    state = floats(state_text)
    return float(filt.epsilon_spent(state)) if len(state) else 0.0


def anchor_problem(
    conn: sqlite3.Connection, directory: Path, ledger_id: str, anchor_file: Path, filt, read: AnchorRead | None
):
    """Why this database is not (a continuation of) the ledger its anchor names; None if it is;
    ``OLDER`` for a ledger written before anchors (the owner migrates it).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger directory.
    ledger_id : str
        The database's id.
    anchor_file : pathlib.Path
        The anchor file (named in the problem).
    filt : GaussianFilter
        The lifetime filter (for the epsilon the problem names).
    read : AnchorRead or None
        The anchor file as read.

    Returns
    -------
    str or None

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> anchor_problem(conn, ledger_dir, ledger_id, anchor_file, filt, None)  # never anchored
    'older'
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> read = read_anchor_file(anchor_file)
    >>> anchor_problem(conn, ledger_dir, ledger_id, anchor_file, filt, read) is None
    True
    >>> problem = anchor_problem(conn, Path(tmp.name) / "elsewhere", ledger_id, anchor_file, filt, read)
    >>> print(problem)  # doctest: +ELLIPSIS
    has a roll-back anchor (...) written for another ledger directory, ...
    >>> conn.close(); tmp.cleanup()
    """

    def spent(state_text: str) -> str:
        return f"lifetime epsilon spent {state_epsilon(filt, state_text):.4g}"

    latest = _row(conn)

    def ends() -> str:  # only when a problem is named: a ledger this version cannot read fails later, by name
        return f"#{latest[0]}, {spent(latest[_STATE_AFTER])}" if latest else "#0, nothing spent"

    if read is None:
        if not is_anchored(conn):
            return OLDER
        return (
            f"has no roll-back anchor at {anchor_file}, though a ledger has one from its enrolment on (the "
            f"database ends at {ends()}): it was copied or moved here from another directory, or restored, or the "
            "owner's state directory (FEDFILTER_STATE_DIR) changed."
        )
    anchor, here = read.anchor, str(Path(directory).resolve())
    if anchor.directory != here:
        return (
            f"has a roll-back anchor ({anchor_file}) written for another ledger directory, {anchor.directory}, "
            f"not for {here}: that directory's ledger and its anchor were brought here."
        )
    if anchor.ledger_id != ledger_id:
        return (
            f"is not the ledger its roll-back anchor ({anchor_file}) names (ledger {anchor.ledger_id}, "
            f"spend #{anchor.seq}, {spent(anchor.state_after)}): it was replaced or re-created."
        )
    if read.damaged and _spends_after(conn, anchor.seq) != 1:
        # Only a crash during the write leaves the database exactly one spend past the readable slot.
        return (
            f"has a damaged roll-back anchor ({anchor_file}: {read.damaged}). Its readable slot names spend "
            f"#{anchor.seq} ({spent(anchor.state_after)}), the database ends at {ends()}; the damaged slot may "
            "have named a later spend, released already, so this may be an older copy that would give "
            "spent budget back."
        )
    if anchor.seq == 0:
        return None
    row = _row(conn, anchor.seq)
    if row is None:
        return (
            f"is behind its roll-back anchor ({anchor_file}): the anchor names spend #{anchor.seq} "
            f"({spent(anchor.state_after)}), the database ends at {ends()}. A restored backup or an older "
            "copy, which would give spent budget back."
        )
    if row_digest(row) != anchor.digest:
        return (
            f"holds spend #{anchor.seq} differently from its roll-back anchor ({anchor_file}): another copy "
            "of this ledger spent on its own."
        )
    return None


def check_anchor(
    conn: sqlite3.Connection, directory: Path, ledger_id: str, anchor_file: Path, filt, *, allow_older: bool = False
) -> bool:
    """Refuse (``LedgerUnavailableError``) a ledger behind or beside its anchor, or written before anchors.

    Returns whether the database holds a spend the anchor does not name yet (its anchor write failed
    or tore; never released): the ledger anchors it before committing another (``BudgetLedger.reserve``).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger directory.
    ledger_id : str
        The database's id.
    anchor_file : pathlib.Path
        The anchor file.
    filt : GaussianFilter
        The lifetime filter.
    allow_older : bool, optional
        Accept a ledger written before anchors (the owner's reseal).

    Returns
    -------
    bool

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> check_anchor(conn, ledger_dir, ledger_id, anchor_file, filt)
    False
    >>> conn.close(); tmp.cleanup()
    """
    read = _read_or_refuse(directory, anchor_file)
    problem = anchor_problem(conn, directory, ledger_id, anchor_file, filt, read)
    if problem == OLDER:
        if allow_older:
            return False
        raise owner_must_act(directory, older_format("2 (written before roll-back anchors)"), migrate_remedy(directory))
    if problem is not None:
        raise owner_must_act(directory, problem, rollback_remedy(directory))
    return read is not None and _spends_after(conn, read.anchor.seq) > 0


def advance_anchor(
    conn: sqlite3.Connection, directory: Path, ledger_id: str, anchor_file: Path, filt, *, owner: bool
) -> None:
    """Move the anchor to the latest committed spend (caller holds the database's write transaction).

    Re-checked under the anchor's own lock, so a second copy of this ledger in another process (its
    own SQLite lock) cannot move it backwards or sideways. ``owner``: an owner's act (enrolment,
    migration, an accepted restore) that sets the anchor to this database whatever it named before,
    in a new file.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger directory.
    ledger_id : str
        The database's id.
    anchor_file : pathlib.Path
        The anchor file.
    filt : GaussianFilter
        The lifetime filter.
    owner : bool
        Whether this is an owner's act.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> read_anchor(anchor_file).seq
    0
    >>> conn.close(); tmp.cleanup()
    """
    latest = _row(conn)
    where = str(Path(directory).resolve())
    anchor = (
        Anchor(where, ledger_id, latest[0], row_digest(latest), latest[_STATE_AFTER])
        if latest
        else Anchor(where, ledger_id, 0, "", "[]")
    )
    try:
        with locked(anchor_file):
            current = None if owner else _read_or_refuse(directory, anchor_file)
            if current is not None:
                problem = anchor_problem(conn, directory, ledger_id, anchor_file, filt, current)
                if problem is not None:  # (OLDER cannot happen: the checks before a spend refuse it)
                    raise owner_must_act(directory, problem, rollback_remedy(directory))
            if current is None or anchor.seq > current.anchor.seq:
                write_anchor(anchor_file, anchor, new_file=owner)
    except OSError as err:
        raise LedgerWriteError(
            f"cannot write the budget ledger's roll-back anchor {anchor_file} (the owner's state directory): "
            f"{err}. Nothing was released this round."
        ) from err


def refuse_if_spent_here(directory: Path, anchor_file: Path) -> None:
    """A directory that holds no enrolled ledger, but whose anchor names spends: no fresh budget.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger directory.
    anchor_file : pathlib.Path
        Its anchor file.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> from fedfilter.privacy.filters import make_filter
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger_dir, filt = Path(tmp.name) / "ledger", make_filter("gdp", 4.0, 1e-5)
    >>> anchor_file = anchor_path(ledger_dir, Path(tmp.name) / "owner")
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> ledger_id = conn.execute("SELECT value FROM meta WHERE key='ledger_id'").fetchone()[0]
    >>> advance_anchor(conn, ledger_dir, ledger_id, anchor_file, filt, owner=True)
    >>> refuse_if_spent_here(ledger_dir, anchor_file)  # enrolled, nothing spent: no refusal
    >>> conn.close(); tmp.cleanup()
    """
    read = _read_or_refuse(directory, anchor_file)
    if read is not None and (read.anchor.seq > 0 or read.damaged):
        damaged = f" (its other slot is damaged: {read.damaged})" if read.damaged else ""
        raise owner_must_act(
            directory,
            f"holds no enrolled ledger, but its roll-back anchor ({anchor_file}) names spend #{read.anchor.seq} "
            f"of ledger {read.anchor.ledger_id}{damaged}: this device {'had' if read.anchor.seq else 'may have'} "
            "spent budget here.",
            f"put the ledger's files back, or start a new ledger (a fresh budget) with "
            f"`fedfilter ledger enrol --dir {directory} ... --recover replace`.",
        )
