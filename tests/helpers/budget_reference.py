"""Independent references for what a client may spend, written apart from ``client/privacy``.

Nothing here imports the code under test. The end-to-end checks read the *raw* spend rows
(sensitivity and noise std per release) or raw filter states, never ``epsilon_spent`` (which is
capped at the budget and so cannot show a budget that is too large), and convert them with:

* the exact Gaussian-DP curve ``delta(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)``
  (Dong, Roth and Su, JRSS-B 2022, arXiv 1905.02383 v3, Corollary 2.13) in mpmath at 50 digits,
  applied to the exact (``fractions.Fraction``) sum of ``(s/std)^2``: adaptive composition of
  Gaussians is ``sqrt(sum mu_t^2)``-GDP and no valid filter of any kind may let a client go past
  it (Smith and Thakurta 2022, arXiv 2210.17520, Theorem 1.1);
* Google's ``dp_accounting``: ``RdpAccountant`` (Rényi filter, and as a second opinion on the
  zCDP filter) and the optimistic PLD, a lower bound on the true delta of the composition;
* for the zCDP filter, Bun and Steinke 2016 (arXiv 1605.02065) Proposition 1.3:
  ``rho``-zCDP gives ``(rho + 2 sqrt(rho log(1/delta)), delta)``-DP (Feldman & Zrnic (2021) Theorem 4.9).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

import mpmath
from dp_accounting import GaussianDpEvent
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import RdpAccountant

_DPS = 50

# dp_accounting's RdpAccountant works in float64 (a few ulps per term); 1e-9 relative is far
# below any budget error worth catching (a 10 % larger budget moves epsilon by several %).
RDP_REL_TOL = 1e-9


def exact_mu2(sensitivity: float, noise_std: float) -> Fraction:
    """``(s / std)^2`` of one Gaussian release, exactly (the floats as stored)."""
    return (Fraction(sensitivity) / Fraction(noise_std)) ** 2


def weights(kind: str, orders: Sequence[float]) -> list[Fraction]:
    """Loss per unit of ``mu^2``, per state coordinate, from the definitions (not from filters.py).

    gdp: ``mu^2``. zcdp and rdp: ``rho = mu^2 / 2`` (Bun-Steinke Proposition 1.6; a Gaussian is
    ``(alpha, alpha rho)``-RDP at every order, Mironov 2017 Proposition 7, so one sum serves them all).
    """
    if kind == "gdp":
        return [Fraction(1)]
    if kind in ("zcdp", "rdp"):
        return [Fraction(1, 2)]
    raise ValueError(f"unknown filter kind {kind!r}")


def _mp(x: Fraction) -> mpmath.mpf:
    return mpmath.mpf(x.numerator) / mpmath.mpf(x.denominator)


def _curve(eps: mpmath.mpf, mu: mpmath.mpf) -> mpmath.mpf:
    return mpmath.ncdf(-eps / mu + mu / 2) - mpmath.exp(eps) * mpmath.ncdf(-eps / mu - mu / 2)


def gdp_delta(epsilon: float, mu2: Fraction) -> mpmath.mpf:
    """Exact delta at ``epsilon`` of ``sqrt(mu2)``-GDP (Dong-Roth-Su Corollary 2.13), 50 digits."""
    with mpmath.workdps(_DPS):
        if mu2 == 0:
            return mpmath.mpf(0)
        return _curve(mpmath.mpf(epsilon), mpmath.sqrt(_mp(mu2)))


def gdp_mu2_budget(epsilon: float, delta: float) -> mpmath.mpf:
    """The exact largest ``mu^2`` with ``delta(eps; mu) <= delta``: bisection (delta grows with mu)."""
    with mpmath.workdps(_DPS):
        eps, target = mpmath.mpf(epsilon), mpmath.mpf(delta)
        lo, hi = mpmath.mpf(0), mpmath.mpf(1)
        while _curve(eps, hi) <= target:
            lo, hi = hi, hi * 2
        for _ in range(190):  # 2**-190 relative: far below float64
            mid = (lo + hi) / 2
            if _curve(eps, mid) <= target:
                lo = mid
            else:
                hi = mid
        return lo * lo


def mp_akl(l1, l2sq, mu, order) -> mpmath.mpf:
    """The Skellam mechanism's RDP bound (Agarwal, Kairouz, Liu 2021, Theorem 3.5 / Corollary 3.6) at an
    integer order, for sensitivities ``l1`` and ``l2sq = l2**2`` and variance ``mu``, at 50 digits."""
    with mpmath.workdps(_DPS):
        l1, l2sq, mu, a = (mpmath.mpf(v) for v in (l1, l2sq, mu, order))
        return a * l2sq / (2 * mu) + min(((2 * a - 1) * l2sq + 6 * l1) / (4 * mu**2), 3 * l1 / (2 * mu))


def mp_bound(l1, l2sq, mu, alpha) -> mpmath.mpf:
    """``mp_akl`` at a real order, exactly: the bound at 2 below 2, else the convex interpolation of
    (alpha - 1) D_alpha between the integer orders around alpha (van Erven and Harremoës 2014)."""
    with mpmath.workdps(_DPS):
        alpha = mpmath.mpf(alpha)
        n = int(mpmath.floor(alpha))
        if n < 2:
            return mp_akl(l1, l2sq, mu, 2)
        t = alpha - n
        return ((1 - t) * (n - 1) * mp_akl(l1, l2sq, mu, n) + t * n * mp_akl(l1, l2sq, mu, n + 1)) / (alpha - 1)


def zcdp_epsilon(rho: Fraction, delta: float) -> mpmath.mpf:
    """Bun-Steinke Proposition 1.3: ``rho + 2 sqrt(rho log(1/delta))``, 50 digits."""
    with mpmath.workdps(_DPS):
        r = _mp(rho)
        return r + 2 * mpmath.sqrt(r * mpmath.log(1 / mpmath.mpf(delta)))


def rdp_accountant_epsilon(pairs: Iterable[tuple[float, float]], orders: Sequence[float], delta: float) -> float:
    """dp_accounting's epsilon for the composed Gaussians ``(s, std)`` over ``orders`` at ``delta``."""
    acc = RdpAccountant(orders=list(orders))
    for s, std in pairs:
        if s > 0:  # a release without data costs nothing
            acc.compose(GaussianDpEvent(noise_multiplier=std / s))
    return float(acc.get_epsilon(delta))


def pld_optimistic_delta(pairs: Iterable[tuple[float, float]], epsilon: float, interval: float = 1e-4) -> float:
    """dp_accounting's *optimistic* PLD delta of the composition: a lower bound on the true delta."""
    composed = None
    for s, std in pairs:
        if s > 0:
            one = pld_lib.from_gaussian_mechanism(
                standard_deviation=std,
                sensitivity=s,
                pessimistic_estimate=False,
                use_connect_dots=False,
                value_discretization_interval=interval,
            )
            composed = one if composed is None else composed.compose(one)
    return 0.0 if composed is None else float(composed.get_delta_for_epsilon(epsilon))


def check_spends(
    kind: str,
    epsilon: float,
    delta: float,
    orders: Sequence[float],
    pairs: Sequence[tuple[float, float]],
    *,
    exhausted: bool,
    slack_mu2: float = 0.0,
    use_pld: bool = True,
) -> dict:
    """Assert that releases ``pairs = [(sensitivity, noise_std), ...]`` fit the budget, independently.

    Upper bounds (privacy): for every kind, ``sum mu^2`` stays on the exact Gaussian-DP curve; and
    per kind, the accountant its filter is built on certifies (epsilon, delta). With ``exhausted``,
    also lower bounds (the filter ran until the budget was used up, up to ``slack_mu2`` of
    ``mu^2`` left), which make sure the budget was actually binding in the test, so a budget that
    is too large cannot hide behind a client that stopped early.
    Returns the figures, for messages.
    """
    mu2 = sum((exact_mu2(s, std) for s, std in pairs), Fraction(0))
    out = {"sum_mu2": float(mu2)}
    # Any valid filter, any kind: the exact curve of the composed Gaussians.
    d = gdp_delta(epsilon, mu2)
    out["gdp_delta"] = float(d)
    assert d <= delta, f"{kind}: sum mu^2 = {float(mu2)!r} has delta {float(d)!r} > {delta} at eps {epsilon}"
    if kind == "gdp":
        if use_pld:
            low = pld_optimistic_delta(pairs, epsilon)
            out["pld_optimistic_delta"] = low
            assert low <= delta, f"PLD (optimistic) delta {low!r} > {delta}"
        if exhausted:
            budget = gdp_mu2_budget(epsilon, delta)
            assert _mp(mu2) >= budget * (1 - mpmath.mpf("1e-12")) - mpmath.mpf(slack_mu2), (
                f"gdp: exhausted at sum mu^2 = {float(mu2)!r}, exact budget {float(budget)!r}"
            )
    elif kind == "zcdp":
        rho = mu2 / 2
        eps_bs = zcdp_epsilon(rho, delta)
        eps_acc = rdp_accountant_epsilon(pairs, [1 + x / 10 for x in range(1, 100)] + list(range(11, 257)), delta)
        out.update(zcdp_epsilon=float(eps_bs), rdp_accountant_epsilon=eps_acc)
        assert eps_bs <= epsilon, f"zcdp: rho = {float(rho)!r} gives eps {float(eps_bs)!r} > {epsilon}"
        assert eps_acc <= epsilon * (1 + RDP_REL_TOL)
        if exhausted:
            assert eps_bs >= epsilon * (1 - 1e-3), f"zcdp: exhausted at eps {float(eps_bs)!r} of {epsilon}"
    elif kind == "rdp":
        # One threshold on rho = sum mu^2 / 2, at the best order, at the full delta: the composed
        # Gaussians are (alpha, alpha rho)-RDP at every order, which dp_accounting converts.
        eps_acc = rdp_accountant_epsilon(pairs, orders, delta)
        out["rdp_accountant_epsilon"] = eps_acc
        assert eps_acc <= epsilon * (1 + RDP_REL_TOL), f"rdp: dp_accounting gives eps {eps_acc!r} > {epsilon}"
        if exhausted:
            assert eps_acc >= epsilon * (1 - 1e-3), f"rdp: exhausted at eps {eps_acc!r} of {epsilon}"
    return out


def check_rounding(
    kind: str,
    orders: Sequence[float],
    rows: Sequence[tuple[float, float, Sequence[float], Sequence[float]]],
    initial: Sequence[float] | None = None,
) -> None:
    """Rows ``(s, std, charge, state_after)`` in order: each stored charge is at least the exact
    ``w (s/std)^2`` and each stored state at least the exact running sum (exact fractions)."""
    w = weights(kind, orders)
    running = [Fraction(x) for x in initial] if initial is not None else [Fraction(0)] * len(w)
    previous = list(running)
    for i, (s, std, charge, state) in enumerate(rows):
        cost = exact_mu2(s, std)
        assert len(charge) == len(w) and len(state) == len(w), f"row {i}: {len(charge)} coordinates, expected {len(w)}"
        for j, wj in enumerate(w):
            exact = wj * cost
            assert Fraction(float(charge[j])) >= exact, (
                f"row {i} coord {j}: charge {float(charge[j])!r} < exact {float(exact)!r} (rounded down)"
            )
            running[j] += exact
            assert Fraction(float(state[j])) >= running[j], (
                f"row {i} coord {j}: state {float(state[j])!r} < exact sum {float(running[j])!r}"
            )
            # The stored state also covers the previous stored state plus the stored charge.
            assert Fraction(float(state[j])) >= previous[j] + Fraction(float(charge[j]))
            previous[j] = Fraction(float(state[j]))


def gdp_epsilon(mu2: Fraction, delta: float) -> mpmath.mpf:
    """The exact smallest epsilon with ``delta(eps; sqrt(mu2)) <= delta``: bisection (delta falls with eps)."""
    with mpmath.workdps(_DPS):
        mu, target = mpmath.sqrt(_mp(mu2)), mpmath.mpf(delta)
        if mu2 == 0 or _curve(mpmath.mpf(0), mu) <= target:
            return mpmath.mpf(0)
        lo, hi = mpmath.mpf(0), mpmath.mpf(1)
        while _curve(hi, mu) > target:
            lo, hi = hi, hi * 2
        for _ in range(190):
            mid = (lo + hi) / 2
            if _curve(mid, mu) > target:
                lo = mid
            else:
                hi = mid
        return hi


def rdp_epsilon(rdp: Sequence[Fraction], orders: Sequence[float], delta: float) -> mpmath.mpf:
    """``min_alpha r_alpha + log1p(-1/alpha) - log(delta alpha)/(alpha - 1)`` at 50 digits (Canonne,
    Kamath and Steinke 2020, arXiv 2004.00010 v4, Proposition 12)."""
    with mpmath.workdps(_DPS):
        d = mpmath.mpf(delta)
        return min(
            _mp(r) + mpmath.log1p(-1 / mpmath.mpf(a)) - mpmath.log(d * a) / (mpmath.mpf(a) - 1)
            for r, a in zip(rdp, orders)
        )


def mp_skellam_divergence(k: list[int], mu: float, alpha: float) -> mpmath.mpf:
    """The exact D_alpha(Sk(mu) + k || Sk(mu)) at 50 digits: pmf exp(-mu) I_|x|(mu) by mpmath's Bessel
    functions, summed over a window 40 standard deviations past the largest shift."""
    mpmath.mp.dps = 50
    mu_, a = mpmath.mpf(mu), mpmath.mpf(alpha)
    shifts = sorted({abs(v) for v in k if v})
    width = (shifts[-1] if shifts else 0) + int(40 * math.sqrt(mu)) + 40
    pmf = [mpmath.exp(-mu_) * mpmath.besseli(x, mu_) for x in range(2 * width + 1)]
    total = mpmath.mpf(0)
    for shift in shifts:
        s = mpmath.fsum(pmf[abs(x - shift)] ** a * pmf[abs(x)] ** (1 - a) for x in range(-width, width + 1))
        total += sum(1 for v in k if abs(v) == shift) * mpmath.log(s) / (a - 1)
    return total
