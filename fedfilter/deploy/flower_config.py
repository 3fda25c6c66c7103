"""Flower's configuration files: flat TOML values, an app's run config, the CLI's connections.

``write_flat_toml`` writes what ``--node-config FILE`` and ``--run-config FILE`` read (no quoting
pitfalls for paths), ``app_run_config`` reads an app's ``[tool.flwr.app.config]`` (the keys
``--run-config`` may override), and ``write_connection`` writes a ``[superlink.NAME]`` connection
into ``FLWR_HOME/config.toml``, where ``flwr`` looks for it.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any


def toml_value(value: Any) -> str:
    r"""One TOML value for a flat Flower config (bool, int, float or str).

    Parameters
    ----------
    value : bool, int, float or str
        The value.

    Returns
    -------
    str
        Its TOML spelling.

    Raises
    ------
    ValueError
        Any other type.

    Examples
    --------
    >>> toml_value(True), toml_value(0.5), toml_value(float("inf")), toml_value('C:\\dir')
    ('true', '0.5', 'inf', '"C:\\\\dir"')
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    raise ValueError(f"config values must be bool, int, float or str. Found {value!r}.")


def write_flat_toml(path: Path, values: Mapping[str, Any]) -> Path:
    """A flat ``key = value`` TOML file (what ``--node-config``/``--run-config FILE.toml`` read).

    Parameters
    ----------
    path : Path
        The file to write (its folder is created).
    values : Mapping
        Key -> bool, int, float or str.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     print(write_flat_toml(Path(d) / "node.toml", {"partition-id": 0, "ledger-dir": "/var/ff"}).read_text())
    "partition-id" = 0
    "ledger-dir" = "/var/ff"
    <BLANKLINE>
    """
    lines = [f"{json.dumps(key)} = {toml_value(val)}" for key, val in values.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def app_run_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults (the keys ``--run-config`` may override).

    Nested tables are flattened to dotted keys.

    Parameters
    ----------
    app_dir : Path
        A Flower app directory.

    Returns
    -------
    dict
        Key -> default value.

    Raises
    ------
    ValueError
        ``app_dir`` is not a Flower app.

    Examples
    --------
    >>> from fedfilter.app.config import APP_DIR
    >>> app_run_config(APP_DIR)["placement"]
    'local'
    """
    pyproject = Path(app_dir) / "pyproject.toml"
    if not pyproject.is_file():
        raise ValueError(f"{pyproject} not found: APP_DIR must be a Flower app directory.")
    with pyproject.open("rb") as handle:
        data = tomllib.load(handle)
    try:
        app = data["tool"]["flwr"]["app"]
    except KeyError:
        raise ValueError(f"{pyproject} has no [tool.flwr.app] section: not a Flower app.") from None
    return _flatten(app.get("config", {}))


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def write_connection(home: Path, name: str, address: str, *, root_certificates: Path | None) -> Path:
    """``[superlink.NAME]`` in ``home/config.toml``, made the default connection.

    With ``root_certificates`` the CLI verifies the SuperLink's certificate against that CA;
    without, the connection is ``insecure = true`` (a SuperLink started with ``--insecure``).

    Parameters
    ----------
    home : Path
        The ``FLWR_HOME`` folder.
    name : str
        The connection's name.
    address : str
        The SuperLink's Control API address.
    root_certificates : Path or None
        The CA certificate, or None for an insecure connection.

    Returns
    -------
    Path
        ``home/config.toml``.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     print(write_connection(Path(d), "local", "127.0.0.1:9093", root_certificates=None).read_text())
    [superlink]
    default = "local"
    <BLANKLINE>
    [superlink.local]
    address = "127.0.0.1:9093"
    insecure = true
    <BLANKLINE>
    """
    config = Path(home) / "config.toml"
    security = (
        f"root-certificates = {toml_value(str(root_certificates))}\n"
        if root_certificates is not None
        else "insecure = true\n"
    )
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        f"[superlink]\ndefault = {toml_value(name)}\n\n[superlink.{name}]\naddress = {toml_value(address)}\n{security}",
        encoding="utf-8",
    )
    return config
