"""Directed rounding for budgets: every computed loss rounds up, every allowance rounds down.

Floating-point addition and multiplication are correctly rounded (IEEE 754, round to nearest), so
the exact result lies within half a unit in the last place of the computed one; stepping one ulp
outward therefore gives a bound in the safe direction. All helpers accept scalars or numpy arrays.
"""

from __future__ import annotations

import numpy as np

_INF = np.inf


def up(x):
    """The next float above ``x``: an upper bound on any exact value ``x`` was rounded from."""
    return np.nextafter(x, _INF)


def down(x):
    """The next float below ``x``: a lower bound on any exact value ``x`` was rounded from."""
    return np.nextafter(x, -_INF)


def add_up(a, b):
    """An upper bound on the exact ``a + b``."""
    return up(np.add(a, b))


def sub_down(a, b):
    """A lower bound on the exact ``a - b``."""
    return down(np.subtract(a, b))


def mul_up(a, b):
    """An upper bound on the exact ``a * b`` for non-negative operands."""
    return up(np.multiply(a, b))


def div_up(a, b):
    """An upper bound on the exact ``a / b`` for non-negative ``a`` and positive ``b``."""
    return up(np.divide(a, b))


def square_up(a):
    """An upper bound on the exact ``a * a``."""
    return up(np.multiply(a, a))
