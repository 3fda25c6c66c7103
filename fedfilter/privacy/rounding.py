"""Directed rounding for budgets: every computed loss rounds up, every allowance rounds down.

Floating-point addition and multiplication are correctly rounded (IEEE 754, round to nearest), so
the exact result lies within half a unit in the last place of the computed one; stepping one ulp
outward therefore gives a bound in the safe direction. All helpers accept scalars or numpy arrays.

Examples
--------
``0.1 + 0.2`` rounds to a float above the exact 0.3; ``add_up`` steps one float further:

>>> float(add_up(0.1, 0.2)) > 0.1 + 0.2
True
"""

from __future__ import annotations

import numpy as np

_INF = np.inf


def up(x):
    """The next float above ``x``: an upper bound on any exact value ``x`` was rounded from.

    Parameters
    ----------
    x : float or array_like
        A correctly rounded result.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``nextafter(x, +inf)``.

    Examples
    --------
    >>> float(up(1.0)) == 1.0 + 2.0**-52
    True
    """
    return np.nextafter(x, _INF)


def down(x):
    """The next float below ``x``: a lower bound on any exact value ``x`` was rounded from.

    Parameters
    ----------
    x : float or array_like
        A correctly rounded result.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``nextafter(x, -inf)``.

    Examples
    --------
    >>> float(down(1.0)) == 1.0 - 2.0**-53
    True
    """
    return np.nextafter(x, -_INF)


def add_up(a, b):
    """An upper bound on the exact ``a + b``.

    Parameters
    ----------
    a, b : float or array_like
        The operands.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``up(a + b)``.

    Examples
    --------
    >>> float(add_up(0.5, 0.25))
    0.7500000000000001
    """
    return up(np.add(a, b))


def sub_down(a, b):
    """A lower bound on the exact ``a - b``.

    Parameters
    ----------
    a, b : float or array_like
        The operands.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``down(a - b)``.

    Examples
    --------
    >>> float(sub_down(1.0, 0.25))
    0.7499999999999999
    """
    return down(np.subtract(a, b))


def mul_up(a, b):
    """An upper bound on the exact ``a * b`` for non-negative operands.

    Parameters
    ----------
    a, b : float or array_like
        Non-negative operands.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``up(a * b)``.

    Examples
    --------
    >>> mul_up(np.array([0.5, 2.0]), 3.0)
    array([1.5, 6. ])
    >>> bool(mul_up(0.5, 3.0) > 1.5)
    True
    """
    return up(np.multiply(a, b))


def div_up(a, b):
    """An upper bound on the exact ``a / b`` for non-negative ``a`` and positive ``b``.

    Parameters
    ----------
    a : float or array_like
        The dividend, >= 0.
    b : float or array_like
        The divisor, > 0.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``up(a / b)``.

    Examples
    --------
    >>> float(div_up(1.0, 3.0)) > 1.0 / 3.0
    True
    """
    return up(np.divide(a, b))


def square_up(a):
    """An upper bound on the exact ``a * a``.

    Parameters
    ----------
    a : float or array_like
        The operand.

    Returns
    -------
    numpy.float64 or numpy.ndarray
        ``up(a * a)``.

    Examples
    --------
    >>> float(square_up(0.1)) > 0.1 * 0.1
    True
    """
    return up(np.multiply(a, a))
