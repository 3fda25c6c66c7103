"""Zero-concentrated DP (zCDP) and the (eps, delta) filter of Feldman and Zrnic 2021, Theorem 4.9.

A Gaussian mechanism with sensitivity ``s`` and noise std ``std`` is ``s^2 / (2 std^2)``-zCDP (Bun
and Steinke 2016, arXiv 1605.02065, Proposition 1.6); ``rho``-zCDP implies
``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP (ibid. Proposition 1.3; Feldman and Zrnic,
"Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021, Fact 2.4 with the order
optimised). Feldman and Zrnic 2021, Theorem 4.9 halts once the accumulated zCDP exceeds

    B* = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2,

which we evaluate as ``eps^2 / (sqrt(L + eps) + sqrt(L))^2`` (no cancellation), rounded down.

Examples
--------
A Gaussian round at noise multiplier z is ``1 / (2 z^2)``-zCDP: at z = 2, four rounds (rho = 0.5)
exceed the budget of (epsilon, delta) = (4, 1e-5), two fit.

>>> budget = zcdp_budget(4.0, 1e-5)
>>> 2 * 1 / (2 * 2.0**2) <= budget < 4 * 1 / (2 * 2.0**2)
True
"""

from __future__ import annotations

import math

from fedfilter.checks import positive_finite
from fedfilter.privacy.rounding import down, up


def zcdp_budget(epsilon: float, delta: float) -> float:
    """Feldman and Zrnic 2021, Theorem 4.9: the largest zCDP level B* that implies (epsilon, delta)-DP.

    Parameters
    ----------
    epsilon : float
        The budget's epsilon, finite and > 0.
    delta : float
        The budget's delta, in (0, 1).

    Returns
    -------
    float
        ``B* = (sqrt(log(1/delta) + epsilon) - sqrt(log(1/delta)))^2``, rounded down.

    Raises
    ------
    ValueError
        Naming a bad ``epsilon`` or ``delta``.

    Examples
    --------
    >>> zcdp_budget(1.0, 1e-5)
    0.02081993833953543
    >>> round((math.sqrt(math.log(1e5) + 1) - math.sqrt(math.log(1e5))) ** 2, 13)
    0.0208199383395
    >>> epsilon_from_zcdp(zcdp_budget(1.0, 1e-5), 1e-5)  # both directions rounded outward
    1.0000000000000002
    """
    if (problem := positive_finite("epsilon", epsilon)) is not None:
        raise ValueError(problem)
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1). Found {delta!r}.")
    log_inv_delta = -math.log(delta)
    denom = math.sqrt(log_inv_delta + epsilon) + math.sqrt(log_inv_delta)
    value = epsilon * epsilon / (denom * denom)
    # Five correctly rounded operations and two libm calls: 8 ulps cover them.
    return float(down(value - 8 * math.ulp(value)))


def epsilon_from_zcdp(rho: float, delta: float) -> float:
    """``rho + 2 sqrt(rho log(1/delta))`` (Feldman and Zrnic 2021, Fact 2.4, optimised order), rounded up.

    Parameters
    ----------
    rho : float
        The zCDP level, finite and >= 0.
    delta : float
        The target delta, in (0, 1).

    Returns
    -------
    float
        The epsilon at ``delta``, rounded up; 0 for ``rho == 0``.

    Raises
    ------
    ValueError
        Naming a bad ``rho`` or ``delta``.

    Examples
    --------
    >>> epsilon_from_zcdp(0.125, 1e-5)
    2.5242629560940446
    >>> round(0.125 + 2 * math.sqrt(0.125 * math.log(1e5)), 12)
    2.524262956094
    """
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite number >= 0. Found {rho!r}.")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1). Found {delta!r}.")
    if rho == 0:
        return 0.0
    value = rho + 2 * math.sqrt(rho * -math.log(delta))
    return float(up(value + 8 * math.ulp(value)))
