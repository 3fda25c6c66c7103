"""Lower bounds on (epsilon, delta) and on mu from a distinguishing game: pure functions.

An (epsilon, delta)-DP mechanism bounds every test's TPR by ``e^eps FPR + delta`` (Kairouz, Oh and
Viswanath 2015), a mu-GDP one by ``Phi(Phi^-1(FPR) + mu)`` (Dong, Roth and Su 2019); confident
Clopper-Pearson bounds on the rates (each at level alpha/2) turn a test into lower bounds
``eps >= log((TPR_lo - delta) / FPR_hi)`` and ``mu >= Phi^-1(TPR_lo) - Phi^-1(FPR_hi)``, valid
together with probability 1 - alpha. A threshold is never evaluated on the trials that chose it:
``select_threshold`` picks it on one part, ``rates_at`` evaluates it on the rest.

Derivation and references: docs/derivations/audit.md.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy.stats import beta, norm


def _check_alpha(alpha: float) -> None:
    if not (0 < alpha < 1):
        raise ValueError(f"alpha must be in (0, 1). Found {alpha!r}.")


def cp_lower(k, n, alpha: float):
    """One-sided Clopper-Pearson lower bound at level ``1 - alpha`` for ``k`` successes in ``n``.

    Parameters
    ----------
    k, n : array_like
        Successes and trials.
    alpha : float
        In (0, 1).

    Returns
    -------
    numpy.ndarray
        The bound (0 where ``k`` is 0).

    Examples
    --------
    >>> round(float(cp_lower(90, 100, 0.05)), 4), float(cp_lower(0, 100, 0.05))
    (0.8363, 0.0)
    """
    _check_alpha(alpha)
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        lo = beta.ppf(alpha, k, n - k + 1)
    return np.where(k <= 0, 0.0, lo)


def cp_upper(k, n, alpha: float):
    """One-sided Clopper-Pearson upper bound at level ``1 - alpha`` for ``k`` successes in ``n``.

    Parameters
    ----------
    k, n : array_like
        Successes and trials.
    alpha : float
        In (0, 1).

    Returns
    -------
    numpy.ndarray
        The bound (1 where ``k`` is ``n``).

    Examples
    --------
    >>> round(float(cp_upper(10, 100, 0.05)), 4), float(cp_upper(100, 100, 0.05))
    (0.1637, 1.0)
    """
    _check_alpha(alpha)
    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        hi = beta.ppf(1 - alpha, k + 1, n - k)
    return np.where(k >= n, 1.0, hi)


def epsilon_from_rates(tpr_lo, fpr_hi, delta: float):
    """``max(0, log((TPR_lo - delta) / FPR_hi))``: 0 where the rates show nothing.

    Parameters
    ----------
    tpr_lo, fpr_hi : array_like
        Confident lower bound on the true-positive rate, upper bound on the false-positive rate.
    delta : float
        The claimed delta.

    Returns
    -------
    numpy.ndarray
        The lower bound on epsilon.

    Examples
    --------
    >>> round(float(epsilon_from_rates(0.8, 0.1, 1e-5)), 4), float(epsilon_from_rates(0.1, 0.2, 1e-5))
    (2.0794, 0.0)
    """
    tpr_lo, fpr_hi = np.asarray(tpr_lo, dtype=np.float64), np.asarray(fpr_hi, dtype=np.float64)
    num = tpr_lo - delta
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log(num / fpr_hi)
    eps = np.where(num <= 0, 0.0, eps)  # the test is no better than delta allows
    return np.maximum(eps, 0.0)  # fpr_hi = 0 (only possible with no trials) gives inf


def mu_from_rates(tpr_lo, fpr_hi):
    """``max(0, Phi^-1(TPR_lo) - Phi^-1(FPR_hi))`` (Dong-Roth-Su trade-off, inverted).

    Parameters
    ----------
    tpr_lo, fpr_hi : array_like
        Confident lower bound on the true-positive rate, upper bound on the false-positive rate.

    Returns
    -------
    numpy.ndarray
        The lower bound on mu.

    Examples
    --------
    >>> round(float(mu_from_rates(0.8, 0.1)), 4)
    2.1232
    """
    mu = norm.ppf(np.asarray(tpr_lo, dtype=np.float64)) - norm.ppf(np.asarray(fpr_hi, dtype=np.float64))
    return np.maximum(np.nan_to_num(mu, nan=0.0, posinf=np.inf, neginf=0.0), 0.0)


def gdp_total_variation(mu: float) -> float:
    """Largest advantage TPR - FPR of any test against mu-GDP: ``2 Phi(mu/2) - 1``.

    The two worlds N(0, 1) and N(mu, 1) cross at mu/2 (Dong-Roth-Su, Section 2.3).

    Parameters
    ----------
    mu : float
        The GDP parameter.

    Returns
    -------
    float
        The total variation distance of the two worlds.

    Examples
    --------
    >>> round(gdp_total_variation(1.0), 4)
    0.3829
    """
    return float(2.0 * norm.cdf(mu / 2.0) - 1.0)


def _counts_at(scores, thresholds):
    """How many scores are ``>= t`` for each threshold (scores sorted once)."""
    s = np.sort(np.asarray(scores, dtype=np.float64))
    return s.size - np.searchsorted(s, thresholds, side="left")


@dataclass(frozen=True)
class Test:
    """A threshold test: predict world 1 when ``sign * score >= sign * threshold``.

    ``sign = -1`` predicts world 1 for low scores. ``swapped`` uses the complementary event, i.e.
    the inequality with the two worlds' roles exchanged.

    Parameters
    ----------
    threshold : float
        The score threshold.
    sign : int, optional
        1 or -1.
    swapped : bool, optional
        Exchange the worlds' roles.

    Examples
    --------
    >>> rates_at(Test(0.5), [0.0, 0.0, 1.0], [1.0, 1.0, 1.0], alpha=0.05).hits0
    1
    """

    threshold: float
    sign: int = 1
    swapped: bool = False


@dataclass(frozen=True)
class Rates:
    """Counts of one test on held-out trials, and the bounds they give at level 1 - alpha.

    Parameters
    ----------
    n0, n1 : int
        Trials of world 0 and world 1.
    hits1 : int
        World-1 trials the test calls world 1 (the event S, or its complement if swapped).
    hits0 : int
        World-0 trials the test calls world 1.
    tpr, fpr : float
        The observed rates.
    tpr_lo, fpr_hi : float
        Their confident bounds (each at level alpha/2).
    epsilon_lb, mu_lb : float
        The lower bounds they give.
    advantage : float
        ``tpr - fpr``.
    advantage_lo : float
        ``tpr_lo - fpr_hi``.

    Examples
    --------
    >>> r = rates_at(Test(0.5), [0.0] * 50, [1.0] * 50, alpha=0.05)
    >>> r.tpr, r.fpr, round(r.mu_lb, 2)
    (1.0, 0.0, 2.93)
    """

    n0: int
    n1: int
    hits1: int  # world-1 trials the test calls world 1 (the event S, or its complement if swapped)
    hits0: int  # world-0 trials the test calls world 1
    tpr: float
    fpr: float
    tpr_lo: float
    fpr_hi: float
    epsilon_lb: float
    mu_lb: float
    advantage: float  # tpr - fpr
    advantage_lo: float  # tpr_lo - fpr_hi

    def as_dict(self) -> dict:
        """The rates as a plain dict (for ``audit.json``).

        Returns
        -------
        dict
            Field name -> value.

        Examples
        --------
        >>> rates_at(Test(0.5), [0.0] * 10, [1.0] * 10, alpha=0.05).as_dict()["hits1"]
        10
        """
        return asdict(self)


def rates_at(test: Test, scores0, scores1, *, alpha: float, delta: float = 0.0) -> Rates:
    """Evaluate a fixed test on scores it was not chosen on.

    Parameters
    ----------
    test : Test
        The test.
    scores0, scores1 : array_like
        The attacker's scores in world 0 and world 1.
    alpha : float
        1 - confidence of the two bounds together.
    delta : float, optional
        The claimed delta (for ``epsilon_lb``).

    Returns
    -------
    Rates
        The counts and bounds.

    Raises
    ------
    ValueError
        A world without trials.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> r = rates_at(Test(1.0), rng.normal(0, 1, 2000), rng.normal(2, 1, 2000), alpha=0.05)
    >>> r.hits1, r.hits0, round(r.mu_lb, 2)
    (1681, 310, 1.88)
    """
    s0 = test.sign * np.asarray(scores0, dtype=np.float64)
    s1 = test.sign * np.asarray(scores1, dtype=np.float64)
    t = test.sign * test.threshold
    n0, n1 = s0.size, s1.size
    if n0 == 0 or n1 == 0:
        raise ValueError(f"both worlds need trials. Found n0={n0}, n1={n1}.")
    # Event S = "s >= t" predicts world 1. Swapped roles: the event S^c predicts world 0, and the
    # inequality TNR <= e^eps FNR + delta is TPR/FPR of the mirrored test with the worlds exchanged.
    a1, a0 = int(np.sum(s1 >= t)), int(np.sum(s0 >= t))
    hits1, hits0 = (n0 - a0, n1 - a1) if test.swapped else (a1, a0)
    m1, m0 = (n0, n1) if test.swapped else (n1, n0)
    tpr_lo = float(cp_lower(hits1, m1, alpha / 2))
    fpr_hi = float(cp_upper(hits0, m0, alpha / 2))
    return Rates(
        n0=n0,
        n1=n1,
        hits1=hits1,
        hits0=hits0,
        tpr=hits1 / m1,
        fpr=hits0 / m0,
        tpr_lo=tpr_lo,
        fpr_hi=fpr_hi,
        epsilon_lb=float(epsilon_from_rates(tpr_lo, fpr_hi, delta)),
        mu_lb=float(mu_from_rates(tpr_lo, fpr_hi)),
        advantage=hits1 / m1 - hits0 / m0,
        advantage_lo=tpr_lo - fpr_hi,
    )


OBJECTIVES = ("epsilon", "mu", "advantage")


def select_threshold(scores0, scores1, *, objective: str, alpha: float, delta: float = 0.0) -> Test:
    """The test (threshold, direction, roles) that maximises ``objective`` on these scores.

    Every distinct score is a candidate threshold; the objective is the confident bound itself
    (``epsilon_lb``, ``mu_lb`` or ``advantage_lo``) so that the test chosen is one that the
    held-out trials can confirm, not one that merely looks good on few trials.

    Parameters
    ----------
    scores0, scores1 : array_like
        The selection trials' scores in world 0 and world 1.
    objective : str
        ``epsilon``, ``mu`` or ``advantage``.
    alpha : float
        1 - confidence.
    delta : float, optional
        The claimed delta.

    Returns
    -------
    Test
        The best test.

    Raises
    ------
    ValueError
        An unknown objective, or a world without trials.

    Examples
    --------
    >>> select_threshold([0.0] * 20, [1.0] * 20, objective="advantage", alpha=0.05)
    Test(threshold=1.0, sign=1, swapped=False)
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {OBJECTIVES}. Found {objective!r}.")
    s0, s1 = np.asarray(scores0, dtype=np.float64), np.asarray(scores1, dtype=np.float64)
    n0, n1 = s0.size, s1.size
    if n0 == 0 or n1 == 0:
        raise ValueError(f"both worlds need trials. Found n0={n0}, n1={n1}.")
    best, best_value = Test(float(np.median(np.concatenate([s0, s1])))), -np.inf
    for sign in (1, -1):
        cand = np.unique(sign * np.concatenate([s0, s1]))
        a1, a0 = _counts_at(sign * s1, cand), _counts_at(sign * s0, cand)
        for swapped in (False, True):
            if swapped and objective != "epsilon":
                continue  # mu and the advantage are symmetric in the roles
            hits1, hits0, m1, m0 = (n0 - a0, n1 - a1, n0, n1) if swapped else (a1, a0, n1, n0)
            tpr_lo, fpr_hi = cp_lower(hits1, m1, alpha / 2), cp_upper(hits0, m0, alpha / 2)
            if objective == "epsilon":
                value = epsilon_from_rates(tpr_lo, fpr_hi, delta)
            elif objective == "mu":
                value = mu_from_rates(tpr_lo, fpr_hi)
            else:
                value = tpr_lo - fpr_hi
            i = int(np.argmax(value))
            if value[i] > best_value:
                best_value = float(value[i])
                best = Test(float(sign * cand[i]), sign, swapped)
    return best


def split_mask(n: int, fraction: float, rng: np.random.Generator) -> np.ndarray:
    """A random boolean mask choosing ``round(fraction * n)`` of ``n`` trials for selection.

    Parameters
    ----------
    n : int
        Trials.
    fraction : float
        In (0, 1); at least one trial is chosen and one left.
    rng : numpy.random.Generator
        The source of randomness.

    Returns
    -------
    numpy.ndarray of bool
        True for the selection trials.

    Examples
    --------
    >>> int(split_mask(10, 0.5, np.random.default_rng(0)).sum())
    5
    """
    if not (0 < fraction < 1):
        raise ValueError(f"the selection fraction must be in (0, 1). Found {fraction!r}.")
    k = min(max(int(round(fraction * n)), 1), n - 1)
    mask = np.zeros(n, dtype=bool)
    mask[rng.permutation(n)[:k]] = True
    return mask


def audit_scores(
    scores0, scores1, select: np.ndarray, *, objective: str, delta: float, alpha: float
) -> tuple[Test, Rates]:
    """Choose a test on the ``select`` trials, evaluate it on the others (paired trials).

    Parameters
    ----------
    scores0, scores1 : array_like
        Both worlds' scores, one pair per trial.
    select : numpy.ndarray of bool
        The selection trials (``split_mask``).
    objective : str
        ``epsilon``, ``mu`` or ``advantage``.
    delta : float
        The claimed delta.
    alpha : float
        1 - confidence.

    Returns
    -------
    tuple of (Test, Rates)
        The test chosen and its held-out rates.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> s0, s1 = rng.normal(0, 1, 2000), rng.normal(2, 1, 2000)
    >>> test, rates = audit_scores(s0, s1, split_mask(2000, 0.5, rng), objective="mu", delta=1e-5, alpha=0.05)
    >>> rates.n0, 1.5 < rates.mu_lb < 2.0
    (1000, True)
    """
    s0, s1 = np.asarray(scores0), np.asarray(scores1)
    test = select_threshold(s0[select], s1[select], objective=objective, delta=delta, alpha=alpha)
    return test, rates_at(test, s0[~select], s1[~select], delta=delta, alpha=alpha)


def round_down(x: float) -> float:
    """The float just below ``x``: a lower bound converted by a routine that rounds up.

    Parameters
    ----------
    x : float
        A lower bound.

    Returns
    -------
    float
        The next float towards minus infinity (``x`` itself if it is not positive).

    Examples
    --------
    >>> round_down(1.0) < 1.0, round_down(0.0)
    (True, 0.0)
    """
    return float(np.nextafter(x, -math.inf)) if x > 0 else x


def planned_tests(mu: float, n0: int, n1: int, *, delta: float, alpha: float) -> dict[str, Test]:
    """Tests fixed before any trial runs, from the claimed model alone (no data, so no bias).

    Under the claim the attacker's normalised score is N(0, 1) without the canary and N(mu, 1)
    with it. For each route the threshold maximises the bound the expected counts would give at
    these trial numbers (a grid search over the claimed model): near mu/2 for the Gaussian-DP
    route, further out for the epsilon route, where the likelihood ratio is larger.

    Parameters
    ----------
    mu : float
        The claimed mu (finite, >= 0).
    n0, n1 : int
        Trials per world.
    delta : float
        The claimed delta.
    alpha : float
        1 - confidence.

    Returns
    -------
    dict of str to Test
        ``epsilon`` and ``mu`` -> the planned test.

    Examples
    --------
    >>> tests = planned_tests(2.0, 1000, 1000, delta=1e-5, alpha=0.05)
    >>> round(tests["mu"].threshold, 3), round(tests["epsilon"].threshold, 2)
    (0.998, 2.81)
    """
    if not (math.isfinite(mu) and mu >= 0):
        raise ValueError(f"mu must be a finite number >= 0. Found {mu!r}.")
    grid = np.linspace(-4.0, mu + 6.0, 2001)
    tpr, fpr = norm.sf(grid - mu), norm.sf(grid)
    tpr_lo, fpr_hi = cp_lower(tpr * n1, n1, alpha / 2), cp_upper(fpr * n0, n0, alpha / 2)
    out = {}
    for route, value in (("epsilon", epsilon_from_rates(tpr_lo, fpr_hi, delta)), ("mu", mu_from_rates(tpr_lo, fpr_hi))):
        # Too few trials to show anything: keep the midpoint, where the rates are most informative.
        out[route] = Test(float(grid[int(np.argmax(value))]) if np.max(value) > 0 else mu / 2)
    return out
