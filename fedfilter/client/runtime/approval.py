"""The apps a device's owner approved: the only code the device runs for a coordinator.

In Flower's Deployment Engine the coordinator ships the app bundle (FAB) and would choose the code
a device runs, mods included. A device of fedfilter runs a FAB only if its owner approved it here,
on the device, in one of two ways:

* **by hash**: the SHA-256 of the FAB's bytes, as Flower computes it (``flwr.cli.build``; the build
  is deterministic: sorted paths, a fixed zip date, ``pyproject.toml`` re-rendered). ``approve`` on
  an app directory builds the FAB exactly as ``flwr run`` does and records its hash; on a ``.fab``
  file it hashes the file. The device installs such a FAB and imports its ``clientapp`` component.
* **by component**, for an app whose ``clientapp`` component lives in an installed package rather
  than in the FAB (the built-in app: ``fedfilter.app.client_app:app``): the owner approves that
  component, and the device imports it from its own installed packages. The FAB's files are then
  neither installed nor put on ``sys.path`` (so a file in it cannot shadow a module), whatever else
  the FAB carries.

The list is a JSON file in the owner's state directory (``owner_state.owner_state_dir()``), written
only by ``fedfilter apps approve/revoke``. Nothing the coordinator sends (run config, node config, FAB
metadata or ``pyproject.toml``, messages) is read when deciding, except the FAB's bytes (hashed here)
and, for a component approval, the component the FAB names (which must match the owner's entry).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fedfilter.client.ledger.owner_state import owner_state_dir
from fedfilter.protocol.refusals import refusal_reason

APPROVED_FILE = "approved_apps.json"
FORMAT_VERSION = 1
APPROVE_HINT = "fedfilter apps approve APP_DIR_OR_FAB"
# The shortest hash prefix `revoke` accepts (64 hex digits in full).
MIN_PREFIX = 8
MAX_PYPROJECT_BYTES = 1 << 20

# What every guarantee the CLI prints says the device trusts: one place.
TRUST_TEXT = (
    "a device trusts only the code of the apps its owner approved (fedfilter apps approve) "
    "and nothing the coordinator sends"
)


class ApprovalError(ValueError):
    """A path, hash or approvals file that cannot be used; the message names it.

    Examples
    --------
    >>> try:
    ...     revoke("abc")
    ... except ApprovalError as err:
    ...     print(err)
    HASH must be at least 8 hex digits of an approved hash. Found 'abc'.
    """


@dataclass(frozen=True)
class ApprovedApp:
    """One entry of the owner's list.

    Attributes
    ----------
    hash : str
        SHA-256 of the FAB's bytes.
    clientapp : str or None
        Set: approved by this component (imported from the device's installed packages).
    source : str
        What the owner approved (a path), for ``fedfilter apps list``.
    approved_at : str
        When (ISO 8601, UTC).

    Examples
    --------
    >>> app = ApprovedApp("ab" * 32, "fedfilter.app.client_app:app", "/srv/app", "2026-01-01T00:00:00+00:00")
    >>> app.clientapp
    'fedfilter.app.client_app:app'
    """

    hash: str  # SHA-256 of the FAB's bytes
    clientapp: str | None  # set: approved by this component (imported from installed packages)
    source: str  # what the owner approved (a path), for `apps list`
    approved_at: str

    def to_json(self) -> dict[str, Any]:
        """The entry as the approvals file stores it.

        Returns
        -------
        dict
            ``hash``, ``clientapp``, ``source`` and ``approved_at``.

        Examples
        --------
        >>> ApprovedApp("ab" * 32, None, "/srv/app.fab", "2026-01-01T00:00:00+00:00").to_json()["source"]
        '/srv/app.fab'
        """
        return {"hash": self.hash, "clientapp": self.clientapp, "source": self.source, "approved_at": self.approved_at}


@dataclass(frozen=True)
class Decision:
    """What the device does with one FAB.

    Attributes
    ----------
    fab_hash : str
        SHA-256 of the FAB's bytes, computed on the device.
    approved : bool
        Whether the device runs it.
    by : str
        ``"hash"``, ``"component"`` or ``""`` (refused).
    clientapp : str or None
        The component to import (by component: from the installed packages).

    Examples
    --------
    >>> Decision("ab" * 32, False, "", None).approved
    False
    """

    fab_hash: str
    approved: bool
    by: str  # "hash", "component" or "" (refused)
    clientapp: str | None  # the component to import (by component: from installed packages)

    def refusal(self) -> str:
        """The reason sent back when refused: names the hash and the owner's command.

        Returns
        -------
        str
            The reason.

        Examples
        --------
        >>> Decision("ab" * 32, False, "", None).refusal()[:78]
        "fedfilter[app-not-approved]: this device's owner has not approved app abababab"
        """
        return refusal_reason(
            "app-not-approved",
            f"this device's owner has not approved app {self.fab_hash} (SHA-256 of the FAB); "
            f"nothing was installed, imported, trained or spent. The owner approves an app on the device "
            f"with `{APPROVE_HINT}`.",
        )


def fab_hash(fab: bytes) -> str:
    """Flower's FAB hash: SHA-256 of the FAB's bytes (``flwr.cli.build``).

    Parameters
    ----------
    fab : bytes
        The FAB.

    Returns
    -------
    str
        64 hex digits.

    Examples
    --------
    >>> fab_hash(b"")[:16]
    'e3b0c44298fc1c14'
    """
    return hashlib.sha256(fab).hexdigest()


def fab_components(fab: bytes) -> dict[str, str]:
    """``[tool.flwr.app.components]`` of a FAB's ``pyproject.toml``, read in memory (nothing extracted).

    Parameters
    ----------
    fab : bytes
        The FAB (``ApprovalError`` when it has no readable ``pyproject.toml``).

    Returns
    -------
    dict of str to str
        Component name to ``module:attribute``.

    Examples
    --------
    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr(zipfile.ZipInfo("pyproject.toml"), '[tool.flwr.app.components]\\nclientapp = "myapp.client:app"')
    ...     z.writestr(zipfile.ZipInfo("myapp/client.py"), "app = None")
    >>> fab = buf.getvalue()
    >>> fab_components(fab)
    {'clientapp': 'myapp.client:app'}
    """
    import tomllib

    try:
        with zipfile.ZipFile(io.BytesIO(fab)) as archive:
            size = archive.getinfo("pyproject.toml").file_size
            if size > MAX_PYPROJECT_BYTES:  # read before approval: no decompression bomb
                raise ApprovalError(f"the FAB's pyproject.toml is {size} bytes, above {MAX_PYPROJECT_BYTES}")
            config = tomllib.loads(archive.read("pyproject.toml").decode("utf-8"))
    except (zipfile.BadZipFile, KeyError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ApprovalError(f"the FAB has no readable pyproject.toml: {err}") from None
    components = config.get("tool", {}).get("flwr", {}).get("app", {}).get("components", {})
    if not isinstance(components, dict):
        return {}
    return {str(k): str(v) for k, v in components.items() if isinstance(v, str)}


def fab_files(fab: bytes) -> list[str]:
    """The names of the files a FAB holds.

    Parameters
    ----------
    fab : bytes
        The FAB.

    Returns
    -------
    list of str
        The archive's names, in order.

    Examples
    --------
    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr(zipfile.ZipInfo("pyproject.toml"), '[tool.flwr.app.components]\\nclientapp = "myapp.client:app"')
    ...     z.writestr(zipfile.ZipInfo("myapp/client.py"), "app = None")
    >>> fab = buf.getvalue()
    >>> fab_files(fab)
    ['pyproject.toml', 'myapp/client.py']
    """
    with zipfile.ZipFile(io.BytesIO(fab)) as archive:
        return archive.namelist()


def carries_component(files: list[str], component: str) -> bool:
    """Whether the FAB's own files hold the component's top-level module (``pkg/`` or ``pkg.py``).

    Parameters
    ----------
    files : list of str
        The FAB's files (``fab_files``).
    component : str
        ``module:attribute``.

    Returns
    -------
    bool
        True when the FAB carries it; False: it comes from the installed packages.

    Examples
    --------
    >>> carries_component(["pyproject.toml", "myapp/client.py"], "myapp.client:app")
    True
    >>> carries_component(["pyproject.toml"], "fedfilter.app.client_app:app")
    False
    """
    top = component.split(":", 1)[0].split(".", 1)[0]
    return any(name == f"{top}.py" or name.startswith(f"{top}/") for name in files)


def build_fab(app_dir: Path) -> bytes:
    """The FAB ``flwr run APP_DIR`` builds and sends (Flower's own builder).

    Parameters
    ----------
    app_dir : Path
        The app directory (with its ``pyproject.toml``).

    Returns
    -------
    bytes
        The FAB; ``ApprovalError`` when it cannot be built.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     try:
    ...         build_fab(Path(d))
    ...     except ApprovalError as err:
    ...         print("pyproject.toml not found" in str(err))
    True
    """
    from fedfilter.protocol.flower_api import build_fab_from_disk

    try:
        return build_fab_from_disk(app_dir)
    except (ValueError, OSError) as err:
        raise ApprovalError(f"cannot build a FAB from app directory {str(app_dir)!r}: {err}") from None


# --- the owner's list ------------------------------------------------------------------------
def approvals_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the owner's list lives: ``approved_apps.json`` in the owner's state directory.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read (``os.environ`` when None).

    Returns
    -------
    Path
        The file (not created here).

    Examples
    --------
    >>> approvals_path({"FEDFILTER_STATE_DIR": "/srv/owner"}).as_posix()
    '/srv/owner/approved_apps.json'
    """
    return owner_state_dir(environ) / APPROVED_FILE


def load_approved(path: Path | None = None) -> list[ApprovedApp]:
    """The owner's approved apps; none when the file does not exist. A damaged file approves nothing.

    Parameters
    ----------
    path : Path, optional
        The approvals file (``approvals_path()`` when None).

    Returns
    -------
    list of ApprovedApp
        The entries; ``ApprovalError`` when the file is damaged or unreadable.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     print(load_approved(Path(d) / "approved_apps.json"))
    ...     _ = (Path(d) / "damaged.json").write_text("{")
    ...     try:
    ...         load_approved(Path(d) / "damaged.json")
    ...     except ApprovalError as err:
    ...         print(str(err).endswith("nothing is approved"))
    []
    True
    """
    path = approvals_path() if path is None else path
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    except OSError as err:
        raise ApprovalError(f"cannot read the approved-apps file {str(path)!r}: {err}") from None
    try:
        data = json.loads(raw)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"version {data.get('version')!r}, expected {FORMAT_VERSION}")
        apps = [
            ApprovedApp(str(e["hash"]), e.get("clientapp"), str(e.get("source", "")), str(e.get("approved_at", "")))
            for e in data["apps"]
        ]
    except (ValueError, KeyError, TypeError, AttributeError) as err:
        raise ApprovalError(f"the approved-apps file {str(path)!r} is damaged ({err}): nothing is approved") from None
    return apps


def _save(apps: list[ApprovedApp], path: Path) -> None:
    """Atomically replace the list (temporary file, fsync, rename), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    payload = json.dumps({"version": FORMAT_VERSION, "apps": [a.to_json() for a in apps]}, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=".approved_apps.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def approve(app_path: Path, path: Path | None = None) -> ApprovedApp:
    """Approve an app directory (the FAB ``flwr run`` builds from it) or a ``.fab`` file.

    Parameters
    ----------
    app_path : Path
        An app directory or a ``.fab`` file.
    path : Path, optional
        The approvals file (``approvals_path()`` when None).

    Returns
    -------
    ApprovedApp
        The new entry (by component when the FAB does not carry its ``clientapp``).

    Examples
    --------
    >>> import tempfile
    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr(zipfile.ZipInfo("pyproject.toml"), '[tool.flwr.app.components]\\nclientapp = "myapp.client:app"')
    ...     z.writestr(zipfile.ZipInfo("myapp/client.py"), "app = None")
    >>> fab = buf.getvalue()
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "app.fab").write_bytes(fab)
    ...     entry = approve(Path(d) / "app.fab", Path(d) / "approved_apps.json")
    >>> entry.hash == fab_hash(fab), entry.clientapp  # the FAB carries myapp: approved by hash
    (True, None)
    """
    path = approvals_path() if path is None else path
    app_path = Path(app_path).expanduser().resolve()
    if app_path.is_dir():
        fab = build_fab(app_path)
    elif app_path.is_file() and app_path.suffix == ".fab":
        fab = app_path.read_bytes()
    else:
        raise ApprovalError(f"PATH must be an app directory or a .fab file. Found {str(app_path)!r}.")
    component = fab_components(fab).get("clientapp")
    if component is None:
        raise ApprovalError(f"{str(app_path)!r} names no [tool.flwr.app.components] clientapp.")
    # A component the FAB does not carry is imported from the device's installed packages: approve it
    # by name too, so the same app keeps running when its pyproject changes around it.
    by_component = component if not carries_component(fab_files(fab), component) else None
    entry = ApprovedApp(fab_hash(fab), by_component, str(app_path), datetime.now(UTC).isoformat(timespec="seconds"))
    apps = [a for a in load_approved(path) if a.hash != entry.hash]
    _save(apps + [entry], path)
    return entry


def revoke(hash_or_prefix: str, path: Path | None = None) -> list[ApprovedApp]:
    """Remove the approvals whose hash starts with ``hash_or_prefix`` (at least 8 hex digits).

    Parameters
    ----------
    hash_or_prefix : str
        A hash or a prefix naming exactly one approved hash.
    path : Path, optional
        The approvals file (``approvals_path()`` when None).

    Returns
    -------
    list of ApprovedApp
        The entries removed.

    Examples
    --------
    >>> import tempfile
    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr(zipfile.ZipInfo("pyproject.toml"), '[tool.flwr.app.components]\\nclientapp = "myapp.client:app"')
    ...     z.writestr(zipfile.ZipInfo("myapp/client.py"), "app = None")
    >>> fab = buf.getvalue()
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "app.fab").write_bytes(fab)
    ...     entry = approve(Path(d) / "app.fab", Path(d) / "approved_apps.json")
    ...     gone = revoke(entry.hash[:8], Path(d) / "approved_apps.json")
    ...     print(gone == [entry], load_approved(Path(d) / "approved_apps.json"))
    True []
    """
    path = approvals_path() if path is None else path
    key = hash_or_prefix.strip().lower()
    if len(key) < MIN_PREFIX or any(c not in "0123456789abcdef" for c in key):
        raise ApprovalError(f"HASH must be at least {MIN_PREFIX} hex digits of an approved hash. Found {key!r}.")
    apps = load_approved(path)
    gone = [a for a in apps if a.hash.startswith(key)]
    if not gone:
        raise ApprovalError(f"no approved app has a hash starting with {key!r} (see `fedfilter apps list`).")
    if len({a.hash for a in gone}) > 1:
        raise ApprovalError(f"hash prefix {key!r} matches {len(gone)} approved apps: give more digits.")
    _save([a for a in apps if a not in gone], path)
    return gone


def decide(fab: bytes, approved: list[ApprovedApp]) -> Decision:
    """Whether the device runs this FAB, and how: the hash computed here, never the one sent.

    Parameters
    ----------
    fab : bytes
        The FAB the coordinator sent.
    approved : list of ApprovedApp
        The owner's list (``load_approved``).

    Returns
    -------
    Decision
        Approved by component (preferred), by hash, or refused.

    Examples
    --------
    >>> import io, zipfile
    >>> buf = io.BytesIO()
    >>> with zipfile.ZipFile(buf, "w") as z:
    ...     z.writestr(zipfile.ZipInfo("pyproject.toml"), '[tool.flwr.app.components]\\nclientapp = "myapp.client:app"')
    ...     z.writestr(zipfile.ZipInfo("myapp/client.py"), "app = None")
    >>> fab = buf.getvalue()
    >>> decide(fab, []).approved
    False
    >>> entry = ApprovedApp(fab_hash(fab), None, "app.fab", "2026-01-01T00:00:00+00:00")
    >>> decision = decide(fab, [entry])
    >>> decision.approved, decision.by, decision.clientapp
    (True, 'hash', 'myapp.client:app')
    """
    digest = fab_hash(fab)
    by_hash = next((a for a in approved if a.hash == digest), None)
    try:
        component = fab_components(fab).get("clientapp")
    except ApprovalError:
        component = None
    if component is None:
        return Decision(digest, False, "", None)
    # A component approval never installs the FAB: preferred whenever the owner's entry allows it.
    if any(a.clientapp == component for a in approved):
        return Decision(digest, True, "component", component)
    if by_hash is not None:
        return Decision(digest, True, "hash", component)
    return Decision(digest, False, "", None)
