"""Open device ledgers, kept per process so a round does not pay for opening one.

In the Simulation Engine one Ray actor serves many nodes and many rounds: building a filter (an
exact mpmath solve) and opening SQLite for every message cost about 40 ms, more than the round's
own durable commit. A cached ledger is only a connection: its state is re-read inside every write
transaction, so other processes' spends are always seen. The entry is dropped if the ledger file
was replaced (a new inode) or the settings changed.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.settings.node_config import DeviceConfig

_LEDGER_CACHE_SIZE = 256
_ledgers: OrderedDict[tuple, _OpenLedger] = OrderedDict()
_ledgers_lock = threading.Lock()


def _file_identity(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino


class NestedFilterError(RuntimeError):
    """A thread asked for the ledger it already holds: a second copy of the filter inside the first.

    Examples
    --------
    >>> raise NestedFilterError("the budget ledger is held by this thread")
    Traceback (most recent call last):
    ...
    fedfilter.client.flower.ledger_cache.NestedFilterError: the budget ledger is held by this thread
    """


@dataclass
class _OpenLedger:
    ledger: BudgetLedger
    identity: tuple[int, int] | None
    lock: threading.Lock  # not re-entrant: held() refuses the thread that holds it instead of waiting forever
    closed: bool = False
    holder: int | None = None  # the thread inside held()

    @contextmanager
    def held(self) -> Iterator[_OpenLedger]:
        """The lock, for one message at a time."""
        with self.lock:
            self.holder = threading.get_ident()
            try:
                yield self
            finally:
                self.holder = None

    def close(self) -> None:
        with self.lock:
            self.closed = True
            self.ledger.close()


def cached_ledger(device: DeviceConfig) -> tuple[tuple, _OpenLedger]:
    """The device's ledger, opened once per process; raises ``LedgerError``/``ValueError`` on failure.

    Parameters
    ----------
    device : DeviceConfig
        The device's settings; the cache key holds its ledger directory and budget settings.

    Returns
    -------
    tuple
        The cache key and the open entry (its ``held()`` lock serves one message at a time).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> from fedfilter.client.settings.node_config import device_config, enrol_device
    >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
    ...     settings = {"ledger-dir": root + "/dev", "budget-epsilon": 4.0}
    ...     enrol_device(settings)
    ...     key, entry = cached_ledger(device_config(settings))
    ...     print(cached_ledger(device_config(settings))[1] is entry)
    ...     forget_ledger(key, entry)
    True
    """
    key = (
        str(device.ledger_dir.resolve()),
        device.client_id,
        device.budget_epsilon,
        device.budget_delta,
        device.worst_case_epsilon,
        device.filter_kind,
        device.run_quota,
        device.quotas,
    )
    path = device.ledger_dir / LEDGER_FILE
    stale = []
    with _ledgers_lock:
        entry = _ledgers.get(key)
        if entry is not None and entry.holder == threading.get_ident():
            raise NestedFilterError(
                f"the budget ledger at {device.ledger_dir} is held by this thread: individual_filter_mod runs "
                "inside another copy of itself (past once_per_message); list it once around the app."
            )
        entry = _ledgers.pop(key, None)
        if entry is not None and _file_identity(path) != entry.identity:
            stale.append(entry)
            entry = None
        if entry is None:
            ledger = device.open_ledger()
            entry = _OpenLedger(ledger, _file_identity(path), threading.Lock())
        _ledgers[key] = entry
        while len(_ledgers) > _LEDGER_CACHE_SIZE:
            stale.append(_ledgers.popitem(last=False)[1])
    for old in stale:  # outside the global lock: closing waits for a message still using it
        old.close()
    return key, entry


def forget_ledger(key: tuple, entry: _OpenLedger) -> None:
    """Drop a connection after an unexpected (e.g. SQLite) failure; the next message reopens.

    Parameters
    ----------
    key : tuple
        The cache key ``cached_ledger`` returned.
    entry : _OpenLedger
        The entry it returned (closed here).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> from fedfilter.client.settings.node_config import device_config, enrol_device
    >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
    ...     settings = {"ledger-dir": root + "/dev", "budget-epsilon": 4.0}
    ...     enrol_device(settings)
    ...     key, entry = cached_ledger(device_config(settings))
    ...     forget_ledger(key, entry)
    ...     again = cached_ledger(device_config(settings))[1]
    ...     print(entry.closed, again is entry)
    ...     forget_all()
    True False
    """
    with _ledgers_lock:
        if _ledgers.get(key) is entry:
            del _ledgers[key]
    entry.close()


def forget_all() -> None:
    """Close every cached ledger, as a device restart would; the next message reopens its own.

    Examples
    --------
    >>> forget_all()
    """
    with _ledgers_lock:
        entries = list(_ledgers.values())
        _ledgers.clear()
    for entry in entries:  # outside the global lock, as in cached_ledger
        entry.close()
