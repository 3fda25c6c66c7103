"""Zero-concentrated DP (zCDP) and the (eps, delta) filter of papers/004 Theorem 4.9.

A Gaussian mechanism with sensitivity ``s`` and noise std ``std`` is ``s^2 / (2 std^2)``-zCDP (Bun
and Steinke 2016, arXiv 1605.02065, Proposition 1.6); ``rho``-zCDP implies
``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP (ibid. Proposition 1.3; papers/004 Fact 2.4 with
the order optimised). papers/004 Theorem 4.9 halts once the accumulated zCDP exceeds

    B* = (sqrt(log(1/delta) + eps) - sqrt(log(1/delta)))^2,

which we evaluate as ``eps^2 / (sqrt(L + eps) + sqrt(L))^2`` (no cancellation), rounded down.
"""

from __future__ import annotations

import math

from fedfilter.checks import positive_finite
from fedfilter.privacy.rounding import down, up


def zcdp_budget(epsilon: float, delta: float) -> float:
    """papers/004 Theorem 4.9: the largest zCDP level B* that implies (epsilon, delta)-DP (down)."""
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
    """``rho + 2 sqrt(rho log(1/delta))`` (papers/004 Fact 2.4, optimised order), rounded up."""
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be a finite number >= 0. Found {rho!r}.")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1). Found {delta!r}.")
    if rho == 0:
        return 0.0
    value = rho + 2 * math.sqrt(rho * -math.log(delta))
    return float(up(value + 8 * math.ulp(value)))
