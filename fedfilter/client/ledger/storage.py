"""How the budget ledger fails: its errors, and SQLite or disk errors named for what they are.

A full or read-only disk is a ``LedgerWriteError`` naming the disk; a damaged database is a
``LedgerUnavailableError`` that tells the owner what to do (fail closed: nothing is released).
Also the two context managers every write path uses (one transaction; close on failure).
"""

from __future__ import annotations

import errno
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn


class ReplayError(RuntimeError):
    """This (run, round) was already released once; a second release is refused.

    Examples
    --------
    >>> raise ReplayError("round 0 of run 'run' was already released")
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.storage.ReplayError: round 0 of run 'run' was already released
    """


class LedgerError(RuntimeError):
    """The budget ledger cannot be used; nothing was spent or released.

    Examples
    --------
    >>> LedgerError("details for the device's log").public
    "this device's budget ledger cannot be used"
    """

    # What a device may tell the coordinator (the mod's error reply): the kind of failure only, never
    # paths, spends or budget (invariant 5). The message itself stays in the device's log.
    public = "this device's budget ledger cannot be used"


class LedgerUnavailableError(LedgerError):
    """Damaged, rolled back, in an older format, or not the ledger enrolled here: refused until its owner acts.

    Examples
    --------
    >>> issubclass(LedgerUnavailableError, LedgerError)
    True
    """

    public = "this device's budget ledger is refused until its owner acts (damaged, rolled back or an older format)"


class LedgerMissingError(LedgerUnavailableError):
    """No ledger where the device's settings point (not enrolled, or its directory or database is gone).

    Examples
    --------
    >>> LedgerMissingError("no ledger at /tmp/x").public
    'this device has no budget ledger at its ledger-dir (missing or not enrolled)'
    """

    public = "this device has no budget ledger at its ledger-dir (missing or not enrolled)"


class LedgerWriteError(LedgerError):
    """The disk refused a write (full, read-only, I/O error); the round was not released.

    Examples
    --------
    >>> issubclass(LedgerWriteError, LedgerError)
    True
    """

    public = "this device's budget ledger cannot be written (read-only, full or failing disk)"


def owner_must_act(directory: Path, what: str, remedy: str | None = None) -> LedgerUnavailableError:
    """The refusal of a ledger only its owner can put right, with what the owner can do.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.
    what : str
        What is wrong, a sentence after "the budget ledger at ``directory``".
    remedy : str, optional
        What the owner can do (default: restore, reseal or replace).

    Returns
    -------
    LedgerUnavailableError

    Examples
    --------
    >>> from pathlib import Path
    >>> str(owner_must_act(Path("led"), "is damaged.", "restore it."))
    "the budget ledger at led is damaged. Every round is refused until the device's owner acts: restore it."
    """
    remedy = remedy or (
        f"restore the ledger's files, or run `fedfilter ledger enrol --dir {directory} ... --recover reseal` "
        "(accept the database as it is now) or `--recover replace` (start a new ledger, a fresh budget; "
        "the old files are kept in a lost-* folder)."
    )
    return LedgerUnavailableError(
        f"the budget ledger at {directory} {what} Every round is refused until the device's owner acts: {remedy}"
    )


def older_format(version: str) -> str:
    """What ``owner_must_act`` says of a ledger in an older schema.

    Parameters
    ----------
    version : str
        The ledger's schema version.

    Returns
    -------
    str

    Examples
    --------
    >>> older_format("3")
    'has an older format (schema 3), which only its owner migrates.'
    """
    return f"has an older format (schema {version}), which only its owner migrates."


def migrate_remedy(directory: Path) -> str:
    """The owner's remedy for a ledger in an older format: the migrate command.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.

    Returns
    -------
    str

    Examples
    --------
    >>> from pathlib import Path
    >>> migrate_remedy(Path("led")).startswith("run `fedfilter ledger migrate --dir led`")
    True
    """
    return (
        f"run `fedfilter ledger migrate --dir {directory}` once (it keeps every spend the database holds and "
        "names the budget at risk)."
    )


def rollback_remedy(directory: Path) -> str:
    """What the owner can do about a ledger its roll-back anchor refuses (``ledger_anchor``).

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.

    Returns
    -------
    str

    Examples
    --------
    >>> from pathlib import Path
    >>> "accept-restore --dir led" in rollback_remedy(Path("led"))
    True
    """
    return (
        f"put the device's latest ledger back, or accept this one with `fedfilter ledger accept-restore --dir "
        f"{directory}` (it shows the budget at risk first), or start a new ledger (a fresh budget) with "
        f"`fedfilter ledger enrol --dir {directory} ... --recover replace`."
    )


def raise_storage_error(directory: Path, err: BaseException) -> NoReturn:
    """Re-raise ``err`` as what the disk said, if it is about the disk; else as it is.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.
    err : BaseException
        The error caught.

    Examples
    --------
    >>> import errno
    >>> from pathlib import Path
    >>> raise_storage_error(Path("."), OSError(errno.ENOSPC, "No space left on device"))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.storage.LedgerWriteError: cannot write the budget ledger at .: the disk holding it ...
    """
    translated = storage_error(directory, err)
    if translated is err:
        raise err
    raise translated from err


def storage_error(directory: Path, err: BaseException) -> BaseException:
    """Name what the disk said; a full or read-only disk must not look like a logic error.

    Parameters
    ----------
    directory : pathlib.Path
        The ledger's folder.
    err : BaseException
        The error caught.

    Returns
    -------
    BaseException
        A ``LedgerWriteError`` or ``LedgerUnavailableError``, or ``err`` itself when it is not about the disk.

    Examples
    --------
    >>> import sqlite3
    >>> from pathlib import Path
    >>> type(storage_error(Path("."), sqlite3.DatabaseError("file is not a database"))).__name__
    'LedgerUnavailableError'
    >>> storage_error(Path("."), KeyError("x"))
    KeyError('x')
    """
    code = getattr(err, "sqlite_errorcode", None)  # SQLite's result code (Python >= 3.11)
    primary = code & 0xFF if isinstance(code, int) else None
    text, errno_ = str(err).lower(), getattr(err, "errno", None)
    if primary in (11, 26) or "malformed" in text or "not a database" in text:  # CORRUPT, NOTADB
        return owner_must_act(directory, f"is damaged ({err}).")
    if primary == 13 or errno_ in (errno.ENOSPC, errno.EDQUOT) or "disk is full" in text:  # SQLITE_FULL
        kind = "the disk holding it is full"
    elif primary == 8 or errno_ in (errno.EROFS, errno.EACCES, errno.EPERM) or "readonly" in text:
        kind = "it is on a read-only disk or lacks write permission"  # SQLITE_READONLY
    elif primary == 10 or "disk i/o" in text:  # SQLITE_IOERR
        kind = "the disk reported an I/O error"
    elif isinstance(err, OSError):
        kind = "the disk refused the write"
    else:
        return err
    try:
        free = f"; {shutil.disk_usage(directory).free} bytes free there"
    except OSError:
        free = ""
    return LedgerWriteError(
        f"cannot write the budget ledger at {directory}: {kind} ({err}{free}). Nothing was released this round."
    )


@contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[None]:
    """One write transaction: committed if the block completes, rolled back if it raises.

    Parameters
    ----------
    conn : sqlite3.Connection
        An open connection, not in a transaction.

    Examples
    --------
    >>> import sqlite3
    >>> conn = sqlite3.connect(":memory:", isolation_level=None)
    >>> with immediate(conn):
    ...     _ = conn.execute("CREATE TABLE t (x)")
    >>> conn.execute("SELECT count(*) FROM t").fetchone()
    (0,)
    >>> conn.close()
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextmanager
def closed_on_failure(conn: sqlite3.Connection, directory: Path) -> Iterator[None]:
    """Close ``conn`` if the block raises; an SQLite error is reported as the storage error it is.

    Parameters
    ----------
    conn : sqlite3.Connection
        The connection to close on failure.
    directory : pathlib.Path
        The ledger's folder (for the error).

    Examples
    --------
    >>> import sqlite3
    >>> from pathlib import Path
    >>> conn = sqlite3.connect(":memory:")
    >>> with closed_on_failure(conn, Path("led")):
    ...     raise KeyError("x")
    Traceback (most recent call last):
    ...
    KeyError: 'x'
    >>> conn.execute("SELECT 1")
    Traceback (most recent call last):
    ...
    sqlite3.ProgrammingError: Cannot operate on a closed database.
    """
    try:
        yield
    except sqlite3.Error as err:
        conn.close()
        raise_storage_error(directory, err)
    except BaseException:
        conn.close()
        raise
