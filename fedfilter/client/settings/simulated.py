"""Per-device settings for simulated nodes, from a file only the machine running the simulation names.

Flower's Simulation Engine gives every node only ``partition-id`` and ``num-partitions`` as its
``node_config``: there is no ``--node-config``. The person running the simulation writes a
device-settings file, JSON, keyed by ``partition-id``, each entry the keys a real device passes in
``--node-config`` (``ledger-dir``, ``budget-epsilon``, ...; ``client/settings/node_config.py``)::

    {
      "0": {"ledger-dir": "/tmp/sim/devices/0", "budget-epsilon": 8.0},
      "1": {"ledger-dir": "/tmp/sim/devices/1", "budget-epsilon": 20.0}
    }

(``write_device_settings`` writes one; a file named ``*.toml`` is still read as TOML, with one
table per partition-id, because earlier docs showed that format)
and names it in the environment variable ``FEDFILTER_DEVICE_SETTINGS`` of the process that starts
the SuperLink (it reaches ``flwr-simulation`` and its Ray workers by inheritance). The coordinator
cannot set an environment variable on that machine, and ``individual_filter_mod`` consults the file
only when the node's own ``node_config`` has no ``ledger-dir``: a real device's ``--node-config``
always wins, and a deployed device reads the file only if its owner set the variable.

Each device reads only its own entry: a bad entry (an unknown key, a bad value, a repeated
partition-id) fails that device alone, with an error reply that names the file, the partition-id
and the key (never a budget value). A node with no settings at all is told which variable or
node-config key is missing. The file as a whole (unreadable, not JSON, not a mapping) fails every
device that needs it: none of them can find its entry.
"""

from __future__ import annotations

import json
import os
import threading
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fedfilter.client.settings.errors import DeviceSettingsError
from fedfilter.client.settings.node_config import NODE_CONFIG_KEYS, device_config, reply_hold_s

__all__ = ["ENV_VAR", "DeviceSettingsError", "with_device_settings", "load_device_settings", "write_device_settings"]

ENV_VAR = "FEDFILTER_DEVICE_SETTINGS"

_cache: dict[str, tuple[tuple[int, int, int], _Settings]] = {}
_cache_lock = threading.Lock()


# Values never repeated in an error reply (the reply reaches the coordinator): a mistyped budget
# is still the owner's intended budget, and a noise seed is a secret. The device's log has them.
WITHHELD_KEYS = (
    "budget-epsilon",
    "budget-delta",
    "worst-case-epsilon",
    "run-quota",
    "coordinator-quota",
    "daily-quota",
    "noise-seed",
)


def _shown(key: str, value: Any) -> str:
    return "(value withheld: see the device's log)" if key in WITHHELD_KEYS else f"(value {value!r})"


def _allowed_keys() -> tuple[str, ...]:
    return tuple(NODE_CONFIG_KEYS)


@dataclass(frozen=True)
class _Settings:
    """A parsed file: each partition-id's entry, or the problem that keeps that one device out."""

    entries: dict[int, dict[str, Any]]
    problems: dict[int, DeviceSettingsError]
    strays: tuple[str, ...]  # keys that are not partition-ids: no device's entry, named when one is missing

    def entry(self, pid: int, path: str) -> dict[str, Any]:
        if pid in self.problems:  # a fresh error each time: the cached one is shared
            problem = self.problems[pid]
            raise DeviceSettingsError(str(problem), problem.public)
        if pid not in self.entries:
            strays = f" (keys that are not partition-ids: {list(self.strays)})" if self.strays else ""
            raise DeviceSettingsError(f"device-settings file {path!r} has no entry for partition-id {pid}{strays}.")
        return self.entries[pid]


def _read(path: Path) -> Any:
    """The file's contents: JSON, or TOML for a ``.toml`` file (what earlier docs showed)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DeviceSettingsError(f"device-settings file {str(path)!r} ({ENV_VAR}) does not exist.") from None
    except OSError as err:
        raise DeviceSettingsError(f"device-settings file {str(path)!r} ({ENV_VAR}) cannot be read: {err}.") from None
    toml = path.suffix.lower() == ".toml"
    try:
        if toml:
            return tomllib.loads(raw.decode("utf-8"))
        return json.loads(raw, object_pairs_hook=_pairs)
    except (ValueError, UnicodeDecodeError) as err:
        kind = "TOML" if toml else "JSON (TOML only in a file named *.toml)"
        raise DeviceSettingsError(f"device-settings file {str(path)!r} is not valid {kind}: {err}.") from None


class _Pairs(list):
    """A JSON object kept as its (key, value) pairs, so that a repeated partition-id is seen."""


def _pairs(pairs: list[tuple[str, Any]]) -> Any:
    return _Pairs(pairs)


def _items(value: Any) -> list[tuple[str, Any]] | None:
    if isinstance(value, _Pairs):
        return list(value)
    if isinstance(value, dict):
        return list(value.items())
    return None


def _parse(path: Path) -> _Settings:
    """Check the file; a problem inside one device's entry keeps out that device only."""
    where_file = f"device-settings file {str(path)!r}"
    top = _items(_read(path))
    if top is None:
        raise DeviceSettingsError(f"{where_file} must map partition-id to settings.")
    allowed = _allowed_keys()
    entries: dict[int, dict[str, Any]] = {}
    problems: dict[int, DeviceSettingsError] = {}
    strays: list[str] = []
    for key, value in top:
        try:
            pid = int(key)
        except ValueError:
            strays.append(key)
            continue
        where = f"{where_file}: partition-id {pid}"
        if pid in entries or pid in problems:
            problems[pid] = DeviceSettingsError(f"{where} has more than one entry (key {key!r} repeats it).")
            entries.pop(pid, None)
            continue
        fields = _items(value)
        if fields is None:
            problems[pid] = DeviceSettingsError(
                f"{where} must hold a table of settings. Found {value!r}.", f"{where} must hold a table of settings."
            )
            continue
        try:
            entries[pid] = _entry(where, fields, allowed)
        except DeviceSettingsError as err:
            problems[pid] = err
    return _Settings(entries, problems, tuple(strays))


def _entry(where: str, fields: list[tuple[str, Any]], allowed: tuple[str, ...]) -> dict[str, Any]:
    entry: dict[str, Any] = {}
    for name, value in fields:
        if name not in allowed:  # a mistyped key may hold a budget: its value stays in the log
            known = f"known: {sorted(allowed)}."
            raise DeviceSettingsError(
                f"{where} has an unknown key {name!r} (value {value!r}); {known}",
                f"{where} has an unknown key {name!r} (value withheld: see the device's log); {known}",
            )
        if name in entry:
            raise DeviceSettingsError(f"{where} sets key {name!r} twice.")
        if not isinstance(value, (bool, int, float, str)):
            raise DeviceSettingsError(
                f"{where} key {name!r} must be a bool, int, float or str. Found {value!r}.",
                f"{where} key {name!r} must be a bool, int, float or str.",
            )
        entry[name] = value
    return entry


def _settings(path: str | os.PathLike) -> _Settings:
    """The parsed file, cached per process while the file is unchanged."""
    path = Path(path)
    try:
        st = path.stat()
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = None
    key = str(path.resolve())
    with _cache_lock:
        hit = _cache.get(key)
        if stamp is not None and hit is not None and hit[0] == stamp:
            return hit[1]
    settings = _parse(path)
    if stamp is not None:
        with _cache_lock:
            _cache[key] = (stamp, settings)
    return settings


def load_device_settings(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """The whole file, every entry checked: raises on the first problem (for whoever writes the file).

    A device reads only its own entry (``with_device_settings``): a bad entry fails that device only.

    Parameters
    ----------
    path : str or os.PathLike
        The device-settings file.

    Returns
    -------
    dict of int to dict
        Every partition-id's settings.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = write_device_settings(Path(tmp) / "devices.json", {0: {"ledger-dir": "ledgers/dev0"}})
    ...     load_device_settings(path)
    {0: {'ledger-dir': 'ledgers/dev0'}}
    """
    settings = _settings(path)
    for pid in sorted(settings.problems):
        raise settings.problems[pid]
    if settings.strays:
        raise DeviceSettingsError(
            f"device-settings file {str(path)!r}: key {settings.strays[0]!r} is not a partition-id (an integer)."
        )
    for pid, entry in settings.entries.items():
        _checked(str(path), pid, entry, {"partition-id": pid})
    return settings.entries


def with_device_settings(node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """``node_config`` with this node's entry of the device-settings file, if it applies.

    Unchanged when the node has its own ``ledger-dir``. Otherwise the entry for ``partition-id``
    of the file ``FEDFILTER_DEVICE_SETTINGS`` names is checked with the same parser the mod uses;
    ``DeviceSettingsError`` names the variable, the file, the partition-id and the key of the problem.
    Only this node's entry matters: a bad entry for another partition-id does not fail this one.

    Parameters
    ----------
    node_config : Mapping[str, Any]
        The node's own settings (a simulated node has only ``partition-id``).
    environ : Mapping[str, str], optional
        The environment to read ``FEDFILTER_DEVICE_SETTINGS`` from (default: ``os.environ``).

    Returns
    -------
    Mapping[str, Any]

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = write_device_settings(Path(tmp) / "devices.json", {0: {"ledger-dir": "ledgers/dev0"}})
    ...     with_device_settings({"partition-id": 0}, {ENV_VAR: str(path)})
    {'ledger-dir': 'ledgers/dev0', 'partition-id': 0}
    >>> with_device_settings({"ledger-dir": "mine"}, {})  # a node with its own settings
    {'ledger-dir': 'mine'}
    """
    environ = os.environ if environ is None else environ
    path = environ.get(ENV_VAR, "")
    if "ledger-dir" in node_config:
        return node_config
    if not path:
        raise DeviceSettingsError(_no_settings(node_config))
    settings = _settings(path)
    if "partition-id" not in node_config:
        raise DeviceSettingsError(
            f"device-settings file {path!r} ({ENV_VAR}) is keyed by partition-id, but this node has none "
            f"(node-config keys: {sorted(node_config)})."
        )
    raw_pid = node_config["partition-id"]
    try:
        pid = int(raw_pid)
    except (TypeError, ValueError):
        raise DeviceSettingsError(f"node-config 'partition-id' must be an integer. Found {raw_pid!r}.") from None
    return _checked(path, pid, settings.entry(pid, path), node_config)


def _no_settings(node_config: Mapping[str, Any]) -> str:
    """Why a node has no settings at all, and the fix for its engine."""
    if "partition-id" in node_config:  # the Simulation Engine's nodes have only these keys
        return (
            f"this simulated node (partition-id {node_config['partition-id']}) has no device settings: "
            f"{ENV_VAR} is not set in the environment of the process that started the simulation (the "
            "SuperLink, or run_simulation). Set it to a device-settings file keyed by partition-id."
        )
    return (
        "this node has no 'ledger-dir' in its node-config: start the SuperNode with "
        "--node-config \"ledger-dir='DIR' ...\" (the directory its owner enrolled with `fedfilter ledger enrol`)."
    )


def _checked(path: str, pid: int, entry: Mapping[str, Any], node_config: Mapping[str, Any]) -> dict[str, Any]:
    merged = {**entry, **node_config}  # whatever the node has itself wins
    try:
        _check(merged)
    except ValueError as err:
        where = f"device-settings file {path!r}, partition-id {pid}"
        bad = _bad_keys(entry)
        public = (
            "; ".join(f"key {key!r} {_shown(key, entry[key])} is invalid" for key in bad)
            if bad
            else "the settings do not fit together (see the device's log)"
        )
        raise DeviceSettingsError(f"{where}: {err}", f"{where}: {public}.") from None
    # On a Ray cluster a partition may run on another node each round: one ledger for it, or none.
    from fedfilter.client.settings.ledger_root import check_ledger_root

    check_ledger_root(pid, merged["ledger-dir"])
    return merged


def _check(node_config: Mapping[str, Any]) -> None:
    device_config(node_config)
    reply_hold_s(node_config)


def _bad_keys(entry: Mapping[str, Any]) -> list[str]:
    """The keys of ``entry`` that are invalid on their own (each checked next to a valid ledger-dir)."""
    bad = []
    for key, value in entry.items():
        try:
            _check({"ledger-dir": "ledger", key: value})
        except ValueError:
            bad.append(key)
    return bad


def write_device_settings(path: str | os.PathLike, devices: Mapping[int, Mapping[str, Any]]) -> Path:
    """Write a device-settings file (JSON) for ``devices`` (partition-id -> settings); private (0600).

    Parameters
    ----------
    path : str or os.PathLike
        Where to write it (its folder is created).
    devices : Mapping[int, Mapping[str, Any]]
        Each partition-id's settings (checked as the devices will check them).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     path = write_device_settings(Path(tmp) / "devices.json", {0: {"ledger-dir": "ledgers/dev0"}})
    ...     oct(path.stat().st_mode & 0o777)
    '0o600'
    """
    path = Path(path)
    table = {str(int(pid)): dict(entry) for pid, entry in devices.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=2)
        handle.write("\n")
    load_device_settings(path)  # refuse to hand over a file the devices would refuse
    return path
