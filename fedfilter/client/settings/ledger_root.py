"""One ledger per simulated device, whichever Ray node runs it.

On a Ray cluster, Flower's Simulation Engine may run partition ``p``'s ClientApp on a different node
each round. Each node reads its own device-settings file (``FEDFILTER_DEVICE_SETTINGS`` in the
environment its ``ray start`` had) and opens ``ledger-dir`` on its own disks. Unless every node
sees the same ledger there, device ``p``'s spending would be split between copies, each of which
would admit a whole budget: the guarantee would silently multiply.

The layouts that are safe: the device ledgers on storage every node mounts at the same path, or
every partition pinned to one node. This module makes a simulation refuse every other layout it
can see. A *ledger root* is the directory holding the device ledgers (the parent of each
``ledger-dir``); ``create_ledger_root`` writes a random identity into it once (``ledger-root.json``).
The first time a process uses partition ``p`` inside a Ray job, it registers what it sees in the
cluster's key-value store (Ray's GCS, shared by every node of the cluster):

* ``root:<identity>`` when the ledger root has an identity file (shared storage), or
* ``node:<Ray node id>:<ledger-dir>`` when it has none (ledgers local to one node);

and any later process of the job, on any node, that sees something else for ``p`` is refused with
``LedgerRootError`` before anything is trained or spent. So two nodes whose ledger roots differ, or
that keep node-local ledgers, cannot both serve one device. Outside Ray (a deployed device, a
single-process simulation) nothing is checked and Ray is never started or imported.

What it cannot see: a ledger root copied byte for byte to a second node has the same identity.
Copying a ledger is restoring a backup (docs/threat-model.md: a rolled-back ledger never yields
budget): do not do it; share one.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import threading
from pathlib import Path

from fedfilter.client.settings.errors import DeviceSettingsError

__all__ = ["ROOT_FILE", "LedgerRootError", "create_ledger_root", "ledger_root_id", "check_ledger_root"]

ROOT_FILE = "ledger-root.json"
_NAMESPACE = "fedfilter"

_checked: dict[tuple[str, int], str] = {}  # (Ray job, partition-id) -> what this process registered
_lock = threading.Lock()


class LedgerRootError(DeviceSettingsError):
    """A simulated device's ledger would be split between Ray nodes: the device refuses to run.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     _ = (Path(tmp) / ROOT_FILE).write_text("{}")
    ...     ledger_root_id(Path(tmp) / "dev0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.settings.ledger_root.LedgerRootError: ledger root file '...' is not one create_ledger_root wrote.
    """


def create_ledger_root(root: str | os.PathLike) -> str:
    """Give ``root`` (the directory holding the device ledgers) its identity, once; returns it.

    Parameters
    ----------
    root : str or os.PathLike
        The directory holding the device ledgers (created if needed).

    Returns
    -------
    str
        The identity, 32 hex digits (the existing one if it has one).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     identity = create_ledger_root(Path(tmp) / "ledgers")
    ...     len(identity), create_ledger_root(Path(tmp) / "ledgers") == identity
    (32, True)
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    existing = ledger_root_id(root / "any-device")
    if existing is not None:
        return existing
    identity = secrets.token_hex(16)
    tmp = root / (ROOT_FILE + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump({"ledger_root_id": identity}, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, root / ROOT_FILE)
    return identity


def ledger_root_id(ledger_dir: str | os.PathLike) -> str | None:
    """The identity of the ledger root holding ``ledger_dir`` (its parent), or None if it has none.

    Parameters
    ----------
    ledger_dir : str or os.PathLike
        A device's ledger directory.

    Returns
    -------
    str or None

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     print(ledger_root_id(Path(tmp) / "dev0"))
    ...     create_ledger_root(tmp) == ledger_root_id(Path(tmp) / "dev0")
    None
    True
    """
    path = Path(ledger_dir).absolute().parent / ROOT_FILE
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except OSError as err:
        raise LedgerRootError(f"ledger root file {str(path)!r} cannot be read: {err}.") from None
    try:
        identity = json.loads(raw)["ledger_root_id"]
    except (ValueError, KeyError, TypeError):
        identity = None
    if not (isinstance(identity, str) and len(identity) == 32 and all(c in "0123456789abcdef" for c in identity)):
        raise LedgerRootError(f"ledger root file {str(path)!r} is not one create_ledger_root wrote.")
    return identity


def check_ledger_root(partition_id: int, ledger_dir: str | os.PathLike) -> None:
    """Refuse if another Ray node of this job served ``partition_id`` from another ledger.

    A no-op outside a Ray worker (Ray is never imported here: it is looked up among the modules
    the process already loaded, as Flower's Simulation Engine has).

    Parameters
    ----------
    partition_id : int
        The simulated device.
    ledger_dir : str or os.PathLike
        Its ledger directory on this node.

    Examples
    --------
    >>> check_ledger_root(0, "ledgers/dev0")  # outside a Ray worker: nothing to check
    """
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return
    ctx = ray.get_runtime_context()
    job, node = ctx.get_job_id(), ctx.get_node_id()
    identity = ledger_root_id(ledger_dir)
    mine = f"root:{identity}" if identity else f"node:{node}:{Path(ledger_dir).absolute()}"
    key = (str(job), int(partition_id))
    with _lock:
        if _checked.get(key) == mine:
            return
        from ray.experimental import internal_kv

        name = f"ledger-root:{job}:{int(partition_id)}"
        internal_kv._internal_kv_put(name, mine, overwrite=False, namespace=_NAMESPACE)
        stored = internal_kv._internal_kv_get(name, namespace=_NAMESPACE)
        theirs = stored.decode() if isinstance(stored, bytes) else str(stored)
        if theirs != mine:
            raise LedgerRootError(
                f"partition-id {int(partition_id)} was served from another ledger in this simulation "
                f"({theirs}); on Ray node {node} its ledger-dir {str(ledger_dir)!r} is {mine}. One device's "
                "ledger would be split between nodes: put the device ledgers on storage every node "
                f"mounts at the same path, under one ledger root with {ROOT_FILE} "
                "(fedfilter.client.settings.ledger_root.create_ledger_root), or run the simulation on one node."
            )
        _checked[key] = mine
