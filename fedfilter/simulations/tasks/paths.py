"""Where the offline copies of the real data sets live."""

from __future__ import annotations

import os
from pathlib import Path

ENV_VAR = "FEDFILTER_DATA"

# fedfilter/simulations/tasks/paths.py -> parents[3] is the repository root.
_REPO_ROOT = Path(__file__).resolve().parents[3]


def data_dir() -> Path:
    """Return the root folder of the offline data sets.

    ``$FEDFILTER_DATA`` if set, else the ``shared/data`` folder beside the repository (where CI
    and the shared machines keep them).

    Returns
    -------
    Path
        The folder holding ``mnist/``, ``adult/``, ``femnist_leaf_partial/`` and ``shakespeare_tff/``.

    Raises
    ------
    FileNotFoundError
        If the folder does not exist; the message names it and the env var.

    Examples
    --------
    >>> import tempfile
    >>> from unittest import mock
    >>> with tempfile.TemporaryDirectory() as d, mock.patch.dict(os.environ, {ENV_VAR: d}):
    ...     data_dir() == Path(d)
    True
    """
    override = os.environ.get(ENV_VAR)
    path = Path(override) if override else _REPO_ROOT.parent / "shared" / "data"
    if not path.is_dir():
        raise FileNotFoundError(
            f"data directory {str(path)!r} does not exist; "
            f"set {ENV_VAR} to the folder holding mnist/, adult/, "
            "femnist_leaf_partial/ and shakespeare_tff/"
        )
    return path


def dataset_dir(root: str | os.PathLike | None, subdir: str) -> Path:
    """Return ``<root or data_dir()>/<subdir>``, raising if it is missing.

    Parameters
    ----------
    root : str or PathLike or None
        The data root; None: ``data_dir()``.
    subdir : str
        The data set's folder, e.g. ``mnist``.

    Returns
    -------
    Path
        The data set's folder.

    Raises
    ------
    FileNotFoundError
        If the folder does not exist.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     (Path(d) / "mnist").mkdir()
    ...     dataset_dir(d, "mnist") == Path(d) / "mnist"
    True
    """
    base = data_dir() if root is None else Path(root)
    path = base / subdir
    if not path.is_dir():
        raise FileNotFoundError(
            f"data folder {str(path)!r} does not exist (data root comes from the data_dir argument or {ENV_VAR})"
        )
    return path
