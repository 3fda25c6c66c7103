"""The device owner's state directory: what a device keeps outside its ledger directory.

Things that must survive a restore of the ledger directory (the roll-back anchor) or that only the owner
may write (the apps the owner approved) live here. Only the device's owner sets where it is: the
``FEDFILTER_STATE_DIR`` environment variable of the device's processes, else ``$XDG_STATE_HOME/fedfilter``,
else ``~/.local/state/fedfilter``. Nothing the coordinator sends (run config, node config in a simulation,
app bundle, messages) can name it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

STATE_DIR_ENV = "FEDFILTER_STATE_DIR"


def owner_state_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The owner's state directory on this device (not created here).

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (default: ``os.environ``).

    Returns
    -------
    pathlib.Path

    Examples
    --------
    >>> owner_state_dir({"FEDFILTER_STATE_DIR": "/srv/owner"})
    PosixPath('/srv/owner')
    >>> owner_state_dir({"XDG_STATE_HOME": "/var/state"})
    PosixPath('/var/state/fedfilter')
    """
    env = os.environ if environ is None else environ
    named = env.get(STATE_DIR_ENV)
    if named:
        return Path(named).expanduser()
    base = env.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "fedfilter"


@contextmanager
def owner_state_at(path: Path) -> Iterator[Path]:
    """Throw-away devices of one process (the audit's canaries): their owner's state lives at ``path``
    for the duration, not in the user's state directory; restored afterwards.

    Parameters
    ----------
    path : pathlib.Path
        The throw-away owner's state directory.

    Yields
    ------
    pathlib.Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp, owner_state_at(Path(tmp)) as state:
    ...     owner_state_dir() == state
    True
    """
    before = os.environ.get(STATE_DIR_ENV)
    os.environ[STATE_DIR_ENV] = str(path)
    try:
        yield Path(path)
    finally:
        if before is None:
            os.environ.pop(STATE_DIR_ENV, None)
        else:
            os.environ[STATE_DIR_ENV] = before
