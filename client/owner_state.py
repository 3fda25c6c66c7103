"""The device owner's state directory: what a device keeps outside its ledger directory.

Things that must survive a restore of the ledger directory (the roll-back anchor) or that only the owner
may write (the apps the owner approved) live here. Only the device's owner sets where it is: the
``FEDFILTER_STATE_DIR`` environment variable of the device's processes, else ``$XDG_STATE_HOME/fedfilter``,
else ``~/.local/state/fedfilter``. Nothing the coordinator sends (run config, node config in a simulation,
app bundle, messages) can name it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

STATE_DIR_ENV = "FEDFILTER_STATE_DIR"


def owner_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The owner's state directory on this device (not created here)."""
    env = os.environ if environ is None else environ
    named = env.get(STATE_DIR_ENV)
    if named:
        return Path(named).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fedfilter"
