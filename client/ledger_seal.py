"""The ledger's seal: a small file beside the database naming its latest committed spend.

The database alone cannot tell that it lost something: a main file whose ``-wal`` was lost, a file
truncated after a checkpoint, or an older copy all open as valid ledgers with a smaller spend,
which would be a fresh budget. The seal is written (fsync'd, atomic rename) after every commit and
before the release, so whatever has left the device is covered by it; a database that no longer
holds the sealed spend is refused (``fedfilter.client.ledger``). A seal that lags the database (a crash
between the commit and the seal) is harmless: nothing was released after that commit.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

SEAL_FILE = "budget_ledger.seal"
_FORMAT = 1


class SealError(ValueError):
    """The seal file exists but cannot be read or fails its checksum."""


@dataclass(frozen=True)
class Seal:
    ledger_id: str  # random id of the database, kept in its meta table
    seq: int  # latest committed spend (0: none yet)
    run_id: str
    round_id: int
    created_at: float
    state_after: str  # the row's state_after, as stored (exact JSON text)


def _checksum(body: dict) -> str:
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def read_seal(directory: Path) -> Seal | None:
    """The seal in ``directory``; None if there is none; ``SealError`` if it is damaged."""
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


def move_aside(directory: Path, names: list[str]) -> Path | None:
    """Move the named files (those that exist) into ``directory/lost-<UTC time>/``; return it."""
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
