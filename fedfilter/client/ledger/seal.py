"""The ledger's seal: a small file beside the database naming its latest committed spend.

The database alone cannot tell that it lost something: a main file whose ``-wal`` was lost, a file
truncated after a checkpoint, or an older copy all open as valid ledgers with a smaller spend,
which would be a fresh budget. The seal is written (fsync'd, atomic rename) after every commit and
before the release, so whatever has left the device is covered by it; a database that no longer
holds the sealed spend is refused (``fedfilter.client.ledger.budget``). A seal that lags the database (a crash
between the commit and the seal) is harmless: nothing was released after that commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from fedfilter.client.ledger.storage import owner_must_act

SEAL_FILE = "budget_ledger.seal"
_FORMAT = 1


class SealError(ValueError):
    """The seal file exists but cannot be read or fails its checksum.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / SEAL_FILE).write_text("{}")
    ...     read_seal(Path(tmp))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.seal.SealError: the ledger seal ... is damaged ('checksum').
    """


@dataclass(frozen=True)
class Seal:
    """What the seal file names: the database and its latest committed spend.

    Attributes
    ----------
    ledger_id : str
        The database's random id (its meta table).
    seq : int
        The latest committed spend (0: none yet).
    run_id : str
        Its run.
    round_id : int
        Its round.
    created_at : float
        Its time.
    state_after : str
        Its ``state_after``, as stored (exact JSON text).

    Examples
    --------
    >>> Seal("id", 0, "", 0, 0.0, "[]").seq
    0
    """

    ledger_id: str  # random id of the database, kept in its meta table
    seq: int  # latest committed spend (0: none yet)
    run_id: str
    round_id: int
    created_at: float
    state_after: str  # the row's state_after, as stored (exact JSON text)


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_seal(directory: Path) -> Seal | None:
    """The seal in ``directory``; None if there is none; ``SealError`` if it is damaged.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.

    Returns
    -------
    Seal or None

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     print(read_seal(Path(tmp)))
    None
    """
    path = Path(directory) / SEAL_FILE
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise SealError(f"cannot read the ledger seal {path}: {err}") from err
    try:
        body = json.loads(text)
        checksum = body.pop("checksum")
        if body.pop("format") != _FORMAT or checksum != _checksum({**body, "format": _FORMAT}):
            raise ValueError("checksum or format mismatch")
        return Seal(**body)
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        raise SealError(f"the ledger seal {path} is damaged ({err}).") from err


def write_seal(directory: Path, seal: Seal) -> None:
    """Replace the seal atomically and durably (file and directory fsync'd).

    Callers hold the database's write lock, so one temporary name suffices.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.
    seal : Seal
        The new seal.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     write_seal(Path(tmp), Seal("id", 0, "", 0, 0.0, "[]"))
    ...     read_seal(Path(tmp))
    Seal(ledger_id='id', seq=0, run_id='', round_id=0, created_at=0.0, state_after='[]')
    """
    directory = Path(directory)
    body = {**asdict(seal), "format": _FORMAT}
    body["checksum"] = _checksum(body)
    tmp = directory / (SEAL_FILE + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(body, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / SEAL_FILE)
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_seal(conn: sqlite3.Connection, directory: Path, ledger_id: str, seal: Seal | None = None) -> None:
    """Refuse (``LedgerUnavailableError``) a database that no longer holds the spend its seal names
    (``seal``: as read already, or None to read it now). The ledger calls this under its lock.

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger's folder.
    ledger_id : str
        The database's id (its meta table).
    seal : Seal, optional
        The seal as read (default: read it now).

    Examples
    --------
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> check_seal(conn, Path("led"), "id", Seal("id", 0, "", 0, 0.0, "[]"))
    >>> check_seal(conn, Path("led"), "other", Seal("id", 0, "", 0, 0.0, "[]"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.storage.LedgerUnavailableError: the budget ledger at led is not the database ...
    >>> conn.close()
    """
    if seal is None:
        try:
            seal = read_seal(directory)
        except SealError as err:
            raise owner_must_act(directory, f"has a damaged seal ({err}).") from err
        if seal is None:
            raise owner_must_act(directory, f"has lost its seal ({SEAL_FILE}).")
    if seal.ledger_id != ledger_id:
        raise owner_must_act(directory, "is not the database its seal was written for (it was replaced or re-created).")
    if seal.seq == 0:
        return
    row = conn.execute(
        "SELECT run_id, round_id, created_at, state_after FROM spends WHERE seq=?", (seal.seq,)
    ).fetchone()
    if row is None or tuple(row) != (seal.run_id, seal.round_id, seal.created_at, seal.state_after):
        last = conn.execute("SELECT MAX(seq) FROM spends").fetchone()[0] or 0
        raise owner_must_act(
            directory,
            (
                f"has lost spends it had committed: its seal names spend #{seal.seq} (run {seal.run_id!r}, "
                f"round {seal.round_id}), which the database "
                f"{'does not hold' if row is None else 'holds differently'} "
                f"(it ends at #{last}). A lost -wal file, a truncated database or an older copy."
            ),
        )


def advance_seal(conn: sqlite3.Connection, directory: Path, ledger_id: str) -> None:
    """Seal the latest committed spend if it is newer (caller holds the write lock: seals only move forward).

    Parameters
    ----------
    conn : sqlite3.Connection
        The database.
    directory : pathlib.Path
        The ledger's folder.
    ledger_id : str
        The database's id.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.schema import connect, prepare
    >>> conn = connect(":memory:")
    >>> _ = prepare(conn)
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     advance_seal(conn, Path(tmp), "id")
    ...     read_seal(Path(tmp)).seq
    0
    >>> conn.close()
    """
    row = conn.execute(
        "SELECT seq, run_id, round_id, created_at, state_after FROM spends ORDER BY seq DESC LIMIT 1"
    ).fetchone()
    seal = Seal(ledger_id, *row) if row else Seal(ledger_id, 0, "", 0, 0.0, "[]")
    try:
        current = read_seal(directory)
    except SealError:
        current = None
    if current is None or current.ledger_id != seal.ledger_id or seal.seq > current.seq:
        write_seal(directory, seal)


def move_aside(directory: Path, names: list[str]) -> Path | None:
    """Move the named files (those that exist) into ``directory/lost-<UTC time>/``; return it.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.
    names : list of str
        File names in it.

    Returns
    -------
    pathlib.Path or None
        The new folder; None when none of the files exists.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / "x").write_text("1")
    ...     lost = move_aside(Path(tmp), ["x", "y"])
    ...     lost.name.startswith("lost-"), [p.name for p in lost.iterdir()]
    (True, ['x'])
    """
    directory = Path(directory)
    present = [n for n in names if (directory / n).exists()]
    if not present:
        return None
    target = directory / time.strftime("lost-%Y%m%dT%H%M%SZ", time.gmtime())
    suffix = 0
    while target.exists():
        suffix += 1
        target = target.with_name(target.name.split(".")[0] + f".{suffix}")
    target.mkdir()
    for n in present:
        os.replace(directory / n, target / n)
    return target
