"""Per-device settings for simulated nodes, from a file only the machine running the simulation names.

Flower's Simulation Engine gives every node only ``partition-id`` and ``num-partitions`` as its
``node_config``: there is no ``--node-config``. The person running the simulation writes a
device-settings file (TOML or JSON) keyed by ``partition-id``, each entry the keys a real device
passes in ``--node-config`` (``ledger-dir``, ``budget-epsilon``, ...; ``client/flower_mod.py``)::

    [0]
    ledger-dir = "/tmp/sim/devices/0"
    budget-epsilon = 8.0

    [1]
    ledger-dir = "/tmp/sim/devices/1"
    budget-epsilon = 20.0

and names it in the environment variable ``FEDFILTER_DEVICE_SETTINGS`` of the process that starts
the SuperLink (it reaches ``flwr-simulation`` and its Ray workers by inheritance). The coordinator
cannot set an environment variable on that machine, and ``individual_filter_mod`` consults the file
only when the node's own ``node_config`` has no ``ledger-dir``: a real device's ``--node-config``
always wins, and a deployed device reads the file only if its owner set the variable.
"""

from __future__ import annotations

import json
import os
import threading
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from fedfilter.client.device_config import NODE_CONFIG_KEYS, device_config
from fedfilter.client.reply_timing import reply_hold_s

__all__ = ["ENV_VAR", "DeviceSettingsError", "with_device_settings", "load_device_settings", "write_device_settings"]

ENV_VAR = "FEDFILTER_DEVICE_SETTINGS"

_cache: dict[str, tuple[tuple[int, int, int], dict[int, dict[str, Any]]]] = {}
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


class DeviceSettingsError(ValueError):
    """The device-settings file is missing, unreadable, or has no valid entry for this node.

    ``str(err)`` is the whole story (for the device's log); ``err.public`` is what the error reply
    may say: the file, the partition-id, the key, and the value unless it is in ``WITHHELD_KEYS``.
    """

    def __init__(self, detail: str, public: str | None = None):
        super().__init__(detail)
        self.public = detail if public is None else public


def _shown(key: str, value: Any) -> str:
    return "(value withheld: see the device's log)" if key in WITHHELD_KEYS else f"(value {value!r})"


def _allowed_keys() -> tuple[str, ...]:
    return tuple(NODE_CONFIG_KEYS)


def _parse(path: Path) -> dict[int, dict[str, Any]]:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise DeviceSettingsError(f"device-settings file {str(path)!r} ({ENV_VAR}) does not exist.") from None
    except OSError as err:
        raise DeviceSettingsError(f"device-settings file {str(path)!r} ({ENV_VAR}) cannot be read: {err}.") from None
    try:
        data = json.loads(raw) if path.suffix.lower() == ".json" else tomllib.loads(raw.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise DeviceSettingsError(f"device-settings file {str(path)!r} is not valid TOML/JSON: {err}.") from None
    if not isinstance(data, dict):
        raise DeviceSettingsError(f"device-settings file {str(path)!r} must map partition-id to settings.")
    allowed = _allowed_keys()
    table: dict[int, dict[str, Any]] = {}
    for key, entry in data.items():
        try:
            pid = int(key)
        except ValueError:
            raise DeviceSettingsError(
                f"device-settings file {str(path)!r}: key {key!r} is not a partition-id (an integer)."
            ) from None
        if not isinstance(entry, dict):
            raise DeviceSettingsError(
                f"device-settings file {str(path)!r}: partition-id {pid} must hold a table of settings. "
                f"Found {entry!r}."
            )
        for name, value in entry.items():
            where = f"device-settings file {str(path)!r}: partition-id {pid}"
            if name not in allowed:  # a mistyped key may hold a budget: its value stays in the log
                known = f"known: {sorted(allowed)}."
                raise DeviceSettingsError(
                    f"{where} has an unknown key {name!r} (value {value!r}); {known}",
                    f"{where} has an unknown key {name!r} (value withheld: see the device's log); {known}",
                )
            if not isinstance(value, (bool, int, float, str)):
                raise DeviceSettingsError(
                    f"{where} key {name!r} must be a bool, int, float or str. Found {value!r}.",
                    f"{where} key {name!r} must be a bool, int, float or str.",
                )
        table[pid] = dict(entry)
    return table


def load_device_settings(path: str | os.PathLike) -> dict[int, dict[str, Any]]:
    """The whole file, checked (cached per process while the file is unchanged)."""
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
    table = _parse(path)
    if stamp is not None:
        with _cache_lock:
            _cache[key] = (stamp, table)
    return table


def with_device_settings(node_config: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> Mapping[str, Any]:
    """``node_config`` with this node's entry of the device-settings file, if it applies.

    Unchanged when the node has its own ``ledger-dir`` or ``FEDFILTER_DEVICE_SETTINGS`` is not set.
    Otherwise the entry for ``partition-id`` is checked with the same parser the mod uses, and
    ``DeviceSettingsError`` names the file, the key and the value of the first problem.
    """
    environ = os.environ if environ is None else environ
    path = environ.get(ENV_VAR, "")
    if "ledger-dir" in node_config or not path:
        return node_config
    table = load_device_settings(path)
    if "partition-id" not in node_config:
        raise DeviceSettingsError(
            f"device-settings file {path!r} is keyed by partition-id, but this node has none "
            f"(node-config keys: {sorted(node_config)})."
        )
    raw_pid = node_config["partition-id"]
    try:
        pid = int(raw_pid)
    except (TypeError, ValueError):
        raise DeviceSettingsError(f"node-config 'partition-id' must be an integer. Found {raw_pid!r}.") from None
    if pid not in table:
        raise DeviceSettingsError(f"device-settings file {path!r} has no entry for partition-id {pid}.")
    merged = {**table[pid], **node_config}  # whatever the node has itself wins
    try:
        _check(merged)
    except ValueError as err:
        where = f"device-settings file {path!r}, partition-id {pid}"
        bad = _bad_keys(table[pid])
        public = (
            "; ".join(f"key {key!r} {_shown(key, table[pid][key])} is invalid" for key in bad)
            if bad
            else "the settings do not fit together (see the device's log)"
        )
        raise DeviceSettingsError(f"{where}: {err}", f"{where}: {public}.") from None
    # On a Ray cluster a partition may run on another node each round: one ledger for it, or none.
    from fedfilter.client.ledger_root import check_ledger_root

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
    """Write a device-settings file (JSON) for ``devices`` (partition-id -> settings); private (0600)."""
    path = Path(path)
    table = {str(int(pid)): dict(entry) for pid, entry in devices.items()}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        json.dump(table, handle, indent=2)
        handle.write("\n")
    load_device_settings(path)  # refuse to hand over a file the devices would refuse
    return path
