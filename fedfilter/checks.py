"""The checks every layer uses on values it did not choose: numbers, integers, short reprs for errors.

Stdlib and numpy only (the bottom of the import graph: ``tests/test_layering.py``). An error names the
field and the value (``short_repr``: a hostile value may be a huge int or a long string).

Examples
--------
>>> positive_finite("clip", 10**400)
'clip must be a finite number > 0. Found an integer of 1329 bits.'
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["finite", "int_in", "is_int", "is_number", "positive_finite", "short_repr"]


def is_number(x: Any) -> bool:
    """A real number (Python or numpy), not a bool.

    Parameters
    ----------
    x : Any
        The value.

    Returns
    -------
    bool
        True for an int or float (Python or numpy) that is not a bool.

    Examples
    --------
    >>> is_number(1.5), is_number(np.int32(2)), is_number(True), is_number("1")
    (True, True, False, False)
    """
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool)


def is_int(x: Any) -> bool:
    """An integer (Python or numpy), not a bool.

    Parameters
    ----------
    x : Any
        The value.

    Returns
    -------
    bool
        True for an int (Python or numpy) that is not a bool.

    Examples
    --------
    >>> is_int(3), is_int(np.int64(3)), is_int(3.0), is_int(False)
    (True, True, False, False)
    """
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def finite(x: Any) -> float | None:
    """``float(x)`` if x is a finite number, else None (a huge int overflows float: None too).

    Parameters
    ----------
    x : Any
        The value.

    Returns
    -------
    float or None
        The value as a float, or None.

    Examples
    --------
    >>> finite(2), finite(float("nan")), finite(10**400), finite("2")
    (2.0, None, None, None)
    """
    if not is_number(x):
        return None
    try:
        value = float(x)
    except (OverflowError, ValueError):
        return None
    return value if math.isfinite(value) else None


def short_repr(value: Any) -> str:
    """A short repr for error messages (a hostile value may be a huge int or a long string).

    Parameters
    ----------
    value : Any
        The value found.

    Returns
    -------
    str
        Its repr, cut to 80 characters; an integer above 64 bits is described by its size.

    Examples
    --------
    >>> short_repr("run-1"), short_repr(2**100)
    ("'run-1'", 'an integer of 101 bits')
    >>> len(short_repr("x" * 1000))
    80
    """
    if is_int(value) and int(value).bit_length() > 64:
        return f"an integer of {int(value).bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def int_in(x: Any, low: int, high: int) -> bool:
    """An integer (not a bool) in ``[low, high]``.

    Parameters
    ----------
    x : Any
        The value.
    low : int
        The smallest allowed.
    high : int
        The largest allowed.

    Returns
    -------
    bool
        Whether ``x`` is such an integer.

    Examples
    --------
    >>> int_in(5, 1, 10), int_in(11, 1, 10), int_in(5.0, 1, 10)
    (True, False, False)
    """
    return is_int(x) and low <= int(x) <= high


def positive_finite(name: str, value: Any) -> str | None:
    """The one wording of "``name`` must be a finite number > 0", or None when ``value`` is one.

    Parameters
    ----------
    name : str
        The field's name.
    value : Any
        The value found.

    Returns
    -------
    str or None
        The problem, naming the field and the value; None when the value is fine.

    Examples
    --------
    >>> positive_finite("clip", 0.5) is None
    True
    >>> positive_finite("clip", -1)
    'clip must be a finite number > 0. Found -1.'
    """
    v = finite(value)
    if v is None or v <= 0:
        return f"{name} must be a finite number > 0. Found {short_repr(value)}."
    return None
