"""The built-in app's run-config defaults, read from its one place: ``[tool.flwr.app.config]``.

Flower reads the same table for ``context.run_config`` (under ``flwr run``, with ``--run-config``
overrides on top); the ClientApp, the ServerApp, ``fedfilter demo`` and ``fedfilter deploy-local``
read it here and type every value with ``resolve_config``, the one coercion: a value's type is the
type of its default in the TOML (an int where a float is expected is accepted, ``"3"`` for an int
is not); an unknown key is refused with the list of known ones. Device-side settings
(``ClientPolicy``, ``reply-hold-s``, budgets) are the device owner's, not the app's, and
stay in ``fedfilter.client``.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["APP_DIR", "APP_PYPROJECT", "TRAIN_KEYS", "app_defaults", "resolve_config"]

APP_DIR = Path(__file__).resolve().parent
APP_PYPROJECT = APP_DIR / "pyproject.toml"
# The ClientApp's training settings: the ServerApp sends these run-config keys with every train message.
TRAIN_KEYS = ("task", "num-clients", "partition", "alpha", "partition-seed", "local-epochs", "lr", "batch-size")


@lru_cache(maxsize=1)
def _defaults() -> tuple[tuple[str, Any], ...]:
    with APP_PYPROJECT.open("rb") as handle:
        data = tomllib.load(handle)
    try:
        table = data["tool"]["flwr"]["app"]["config"]
    except KeyError:
        raise RuntimeError(f"{APP_PYPROJECT} has no [tool.flwr.app.config] table.") from None
    for key, value in table.items():
        if not isinstance(value, (bool, int, float, str)):
            raise RuntimeError(f"{APP_PYPROJECT}: [tool.flwr.app.config] {key!r} must be flat. Found {value!r}.")
    return tuple(table.items())


def app_defaults() -> dict[str, Any]:
    """A fresh copy of ``[tool.flwr.app.config]`` (key -> default value, TOML-typed).

    Returns
    -------
    dict
        The app's run-config defaults; the caller may change its copy.

    Examples
    --------
    >>> defaults = app_defaults()
    >>> defaults["placement"], type(defaults["noise-multiplier"]).__name__
    ('local', 'float')
    """
    return dict(_defaults())


def _coerce(key: str, value: Any, default: Any, source: str) -> Any:
    kind = type(default)
    ok = (
        isinstance(value, bool)
        if kind is bool
        else (isinstance(value, (int, float)) and not isinstance(value, bool))
        if kind is float
        else (isinstance(value, int) and not isinstance(value, bool))
        if kind is int
        else isinstance(value, str)
    )
    if not ok:
        raise ValueError(f"{source} {key!r} must be a {kind.__name__}. Found {value!r}.")
    return kind(value)


def resolve_config(
    *layers: Mapping[str, Any], keys: tuple[str, ...] | None = None, source: str = "run-config"
) -> dict[str, Any]:
    """The defaults, then each layer in order (later wins), typed like the defaults.

    A key the app does not know is refused, naming it and listing the known ones; a value of
    another type than its default's is refused (an int where a float is expected is accepted).

    Parameters
    ----------
    *layers : Mapping
        Run-config layers, lowest priority first (e.g. Flower's ``run_config``, then the train message's).
    keys : tuple of str, optional
        Restrict the result (and what the layers may hold) to a subset of the app's keys.
    source : str, optional
        How error messages name the layers.

    Returns
    -------
    dict
        Key -> typed value.

    Raises
    ------
    ValueError
        An unknown key or a value of the wrong type.

    Examples
    --------
    >>> resolve_config({"lr": 1}, {"task": "digits"}, keys=("task", "lr"))
    {'task': 'digits', 'lr': 1.0}
    >>> resolve_config({"num-rounds": "3"})
    Traceback (most recent call last):
        ...
    ValueError: run-config 'num-rounds' must be a int. Found '3'.
    """
    defaults = app_defaults()
    wanted = tuple(defaults) if keys is None else keys
    missing = sorted(set(wanted) - set(defaults))
    if missing:
        raise ValueError(f"{missing} are not in {APP_PYPROJECT} [tool.flwr.app.config].")
    out = {key: defaults[key] for key in wanted}
    for layer in layers:
        unknown = sorted(set(layer) - set(defaults))
        if unknown:
            raise ValueError(f"unknown {source} key(s) {unknown}; known: {sorted(defaults)}.")
        for key, value in layer.items():
            if key in out:
                out[key] = _coerce(key, value, defaults[key], source)
    return out
