"""The checks every layer uses on values it did not choose: numbers, integers, short reprs for errors.

Stdlib and numpy only (the bottom of the import graph: ``tests/test_layering.py``). An error names the
field and the value (``short_repr``: a hostile value may be a huge int or a long string).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["finite", "int_in", "is_int", "is_number", "positive_finite", "short_repr"]


def is_number(x: Any) -> bool:
    """A real number (Python or numpy), not a bool."""
    return isinstance(x, (int, float, np.floating, np.integer)) and not isinstance(x, bool)


def is_int(x: Any) -> bool:
    """An integer (Python or numpy), not a bool."""
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def finite(x: Any) -> float | None:
    """``float(x)`` if x is a finite number, else None (a huge int overflows float: None too)."""
    if not is_number(x):
        return None
    try:
        value = float(x)
    except (OverflowError, ValueError):
        return None
    return value if math.isfinite(value) else None


def short_repr(value: Any) -> str:
    """A short repr for error messages (a hostile value may be a huge int or a long string)."""
    if is_int(value) and int(value).bit_length() > 64:
        return f"an integer of {int(value).bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def int_in(x: Any, low: int, high: int) -> bool:
    """An integer (not a bool) in ``[low, high]``."""
    return is_int(x) and low <= int(x) <= high


def positive_finite(name: str, value: Any) -> str | None:
    """The one wording of "``name`` must be a finite number > 0", or None when ``value`` is one."""
    v = finite(value)
    if v is None or v <= 0:
        return f"{name} must be a finite number > 0. Found {short_repr(value)}."
    return None
