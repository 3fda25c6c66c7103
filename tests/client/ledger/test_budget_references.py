"""A wrong budget, charge or boundary cannot pass: checks against references written apart.

``epsilon_spent`` is capped at the budget, so a check that reads it cannot see a budget that is
too large. These tests read the ledger's *raw* spend rows (``BudgetLedger.records()``: sensitivity
and noise std of every release) and convert them with ``tests/budget_reference.py`` (mpmath's
exact Gaussian-DP curve, dp_accounting's RDP and PLD accountants, exact fractions), and drive the
filters only through their public methods (``charge``, ``spend``, ``admits``, ``within_budget``,
``allowance``).
"""

from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
from helpers.budget_reference import (
    check_rounding,
    check_spends,
    exact_mu2,
    gdp_epsilon,
    gdp_mu2_budget,
    rdp_epsilon,
    weights,
    zcdp_epsilon,
)

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.privacy.filters import make_filter, rdp_order
from fedfilter.protocol.request import RoundSpec

DELTA = 1e-5
KINDS = ("gdp", "zcdp", "rdp")


def _updates(rng: np.random.Generator, rounds: int):
    """Updates whose norms spread from far below to far above the clip (1.0), in float32."""
    for _ in range(rounds):
        scale = float(rng.choice([0.05, 0.3, 0.8, 1.0, 2.5, 10.0]))
        a = rng.normal(size=(3, 4)).astype(np.float32)
        b = rng.normal(size=20).astype(np.float32)
        norm = math.sqrt(float(np.sum(a.astype(np.float64) ** 2) + np.sum(b.astype(np.float64) ** 2)))
        yield [a * np.float32(scale / norm), b * np.float32(scale / norm)]


def _run_to_exhaustion(tmp_path, kind: str, epsilon: float, *, z: float, clip: float = 1.0, seed: int = 0):
    """A client answering rounds of two runs until it has sent a few pure-noise reports."""
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=epsilon, delta=DELTA, filter_kind=kind)
    policy = ClientPolicy(min_noise_multiplier=0.5, exhausted_below=1e-3)
    client = FilteredClient(ledger, policy, noise_seed=seed)
    rng = np.random.default_rng(seed + 1)
    noise_only = 0
    for r, update in enumerate(_updates(rng, 400)):
        run = "run-a" if r % 3 else "run-b"  # the lifetime budget spans runs
        rel = client.release(RoundSpec(run, r, z, clip), update)
        noise_only += rel.status == "noise-only"
        if noise_only >= 3:
            break
    assert noise_only >= 3, "the client never ran out: the test would not bind the budget"
    return ledger


@pytest.mark.parametrize(
    "kind,epsilon,z", [("gdp", 2.0, 4.0), ("gdp", 0.5, 1.5), ("zcdp", 2.0, 2.0), ("rdp", 2.0, 2.0)]
)
def test_release_spend_rows_stay_within_the_budget_by_independent_accountants(tmp_path, kind, epsilon, z):
    ledger = _run_to_exhaustion(tmp_path, kind, epsilon, z=z)
    recs = ledger.records()
    assert all(r.placement == "local" for r in recs)
    pairs = [(r.sensitivity, r.noise_std) for r in recs]
    # Exhausted: less than (exhausted_below * C)^2 / std^2 of mu^2 was left (times the largest weight).
    check_spends(kind, epsilon, DELTA, ledger.filter.orders, pairs, exhausted=True, slack_mu2=2 * (1e-3 / z) ** 2)
    assert recs[-1].status == "noise-only" and recs[-1].sensitivity == 0.0


@pytest.mark.parametrize("kind", KINDS)
def test_release_stored_charges_and_states_round_up_exactly(tmp_path, kind):
    ledger = _run_to_exhaustion(tmp_path, kind, 1.0, z=1.0, seed=5)
    recs = ledger.records()
    check_rounding(kind, ledger.filter.orders, [(r.sensitivity, r.noise_std, r.charge, r.state_after) for r in recs])
    # The current state is the last row's, and covers the exact sum of every release.
    assert np.array_equal(ledger.state(), recs[-1].state_after)
    # Per run too: each run's state covers that run's exact sum, and the owner's summary counts
    # exactly the rows the ledger holds.
    runs = {r["run_id"]: r for r in ledger.summary()["runs"]}
    for run in ("run-a", "run-b"):
        rows = ledger.records(run)
        check_rounding(
            kind, ledger.filter.orders, [(r.sensitivity, r.noise_std, r.charge, r.run_state_after) for r in rows]
        )
        statuses = [r.status for r in rows]
        assert (runs[run]["rounds"], runs[run]["contributed"], runs[run]["noise_only"], runs[run]["left"]) == (
            len(rows),
            statuses.count("contributed"),
            statuses.count("noise-only"),
            statuses.count("left"),
        )
        # The run's current state is its last row's, and is this run's own sum: within rounding
        # (1e-9, far above a few ulps per row) of the exact sum of its stored charges, not the
        # lifetime state.
        assert np.array_equal(ledger.run_state(run), rows[-1].run_state_after)
        for j in range(len(rows[-1].charge)):
            own = sum((Fraction(float(r.charge[j])) for r in rows), Fraction(0))
            assert Fraction(float(rows[-1].run_state_after[j])) <= own * (1 + Fraction(1, 10**9)), (run, j)
        if kind == "gdp":  # the owner's figure is an upper bound on the run's exact epsilon
            run_mu2 = sum((exact_mu2(r.sensitivity, r.noise_std) for r in rows), Fraction(0))
            assert isinstance(runs[run]["spent_epsilon"], float)
            assert mpmath.mpf(runs[run]["spent_epsilon"]) >= gdp_epsilon(run_mu2, DELTA)


# --- the filters' arithmetic, through their public methods ---------------------------------------
def _random_pairs(rng, n):
    """Random (s, std), exact cases, and hard ones: ``(s/std)^2`` just below a power of two, where
    a quotient rounded to nearest (down by up to half an ulp) then squared loses up to ~2 ulps of
    the exact value, more than one upward step of a product near the top of its binade covers."""
    hard_std = rng.uniform(1, 2, 3 * n)
    hard_s = np.sqrt(2.0) * (1 - rng.uniform(0, 1e-3, 3 * n)) * hard_std
    s = np.concatenate([rng.uniform(0, 3, n), 10.0 ** rng.uniform(-8, 3, n), hard_s, [1.0, 2.0, 0.5, 3.0, 1e-300]])
    std = np.concatenate([rng.uniform(0.1, 10, n), 10.0 ** rng.uniform(-3, 3, n), hard_std, [1.0, 1.0, 0.25, 3.0, 1.0]])
    return s, std


@pytest.mark.parametrize("kind", KINDS)
def test_charge_and_spend_round_up_against_exact_fractions(kind):
    filt = make_filter(kind, 1.0, DELTA)
    w = weights(kind, filt.orders)
    rng = np.random.default_rng(11)
    s, std = _random_pairs(rng, 600)
    charge = filt.charge(sensitivity=s, noise_std=std)  # vectorised, as the engine calls it
    for i in range(len(s)):
        cost = exact_mu2(float(s[i]), float(std[i]))
        for j, wj in enumerate(w):
            assert Fraction(float(charge[i, j])) >= wj * cost, (s[i], std[i], j)
        # One row at a time (the Flower client's call) gives the same charge.
        assert np.array_equal(filt.charge(sensitivity=float(s[i]), noise_std=float(std[i])), charge[i])
    # spend: the new state is at least the exact old state plus the exact charge.
    state = np.abs(rng.normal(size=(len(s), len(w)))) * filt.budget
    after = filt.spend(state, charge)
    for i in range(len(s)):
        for j in range(len(w)):
            assert Fraction(float(after[i, j])) >= Fraction(float(state[i, j])) + Fraction(float(charge[i, j]))
    # A release without data costs exactly nothing and leaves the state exactly as it was.
    zero = filt.charge(sensitivity=0.0, noise_std=1.0)
    assert np.all(zero == 0) and np.array_equal(filt.spend(state[0], zero), state[0])


@pytest.mark.parametrize("kind,epsilon", [("gdp", 1.0), ("gdp", 0.3), ("gdp", 8.0), ("zcdp", 1.0), ("rdp", 1.0)])
def test_exact_boundary_a_state_at_the_budget_is_admitted_one_ulp_above_is_not(kind, epsilon):
    filt = make_filter(kind, epsilon, DELTA)
    budget = np.asarray(filt.budget, dtype=np.float64)
    above = np.nextafter(budget, np.inf)
    assert not filt.within_budget(above)
    for j in range(budget.size):
        if budget[j] <= 0:
            continue
        at = above.copy()
        at[j] = budget[j]  # this coordinate exactly at its budget, every other one past it
        assert filt.within_budget(at), f"coordinate {j} exactly at its budget {budget[j]!r} was refused"
        # The same boundary reached by spending: from zero, a charge whose upward-rounded sum
        # lands exactly on the budget is admitted, and the next float up is not.
        start = np.where(np.arange(budget.size) == j, 0.0, above)
        landing = np.zeros(budget.size)
        landing[j] = np.nextafter(budget[j], -np.inf)
        after = filt.spend(start, landing)
        assert Fraction(float(after[j])) <= Fraction(float(budget[j]))
        assert filt.admits(start, landing)
        landing[j] = budget[j] * (1 + 2**-40)
        assert not filt.admits(start, landing)


@pytest.mark.parametrize("epsilon", [0.1, 0.5, 1.0, 2.0, 8.0])
def test_gdp_budget_is_the_exact_curve_rounded_down(epsilon):
    # The largest mu^2 the filter admits is at most the exact one (mpmath bisection on the curve)
    # and within 1e-12 of it: a budget 1 % (let alone 10 %) off in either direction fails.
    filt = make_filter("gdp", epsilon, DELTA)
    exact = gdp_mu2_budget(epsilon, DELTA)
    b = float(filt.budget[0])
    assert mpmath.mpf(b) <= exact
    assert b >= float(exact) * (1 - 1e-12)
    # And the allowance from an empty state spends it, to within 1e-12, and no more.
    std = 3.0
    s = float(filt.allowance(filt.initial_state(), noise_std=std))
    assert exact_mu2(s, std) <= Fraction(b)
    assert float(exact_mu2(s, std)) >= b * (1 - 1e-12)


@pytest.mark.parametrize("kind", KINDS)
def test_run_quota_binds_each_run_by_the_exact_curve(tmp_path, kind):
    # run_quota 0.3: within one run, sum mu^2 (in the filter's own units) stops at 0.3 of the
    # lifetime budget; for gdp that is 0.3 of the exact curve's mu^2. A new run may spend again.
    quota, z = 0.3, 2.0
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=2.0, delta=DELTA, filter_kind=kind, run_quota=quota)
    client = FilteredClient(ledger, ClientPolicy(exhausted_below=1e-3), noise_seed=3)
    rng = np.random.default_rng(4)
    statuses = [client.release(RoundSpec("greedy", r, z, 1.0), u).status for r, u in enumerate(_updates(rng, 60))]
    assert statuses.count("noise-only") >= 3, statuses
    rows = ledger.records("greedy")
    run_mu2 = sum((exact_mu2(r.sensitivity, r.noise_std) for r in rows), Fraction(0))
    w = weights(kind, ledger.filter.orders)
    # The run's exact loss is within quota x the lifetime budget in some coordinate (the filter
    # continues while any is), and the run stopped only once every coordinate's quota was used up.
    budget = [Fraction(float(b)) for b in ledger.filter.budget]
    assert any(wj * run_mu2 <= quota * bj for wj, bj in zip(w, budget))
    assert all(wj * run_mu2 >= quota * bj - wj * Fraction(2 * (1e-3 / z) ** 2) for wj, bj in zip(w, budget))
    if kind == "gdp":
        assert run_mu2 <= quota * Fraction(float(gdp_mu2_budget(2.0, DELTA)))
    check_spends(kind, 2.0, DELTA, ledger.filter.orders, [(r.sensitivity, r.noise_std) for r in rows], exhausted=False)
    assert client.release(RoundSpec("next", 0, z, 1.0), [np.ones(4, dtype=np.float32)]).status == "contributed"


@pytest.mark.parametrize("kind", KINDS)
def test_filters_refuse_impossible_budgets_and_releases(kind):
    for eps in (0.0, -1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="epsilon"):
            make_filter(kind, eps, DELTA)
    for delta in (0.0, 1.0, 2.0, -0.5, math.nan):
        with pytest.raises(ValueError, match="delta"):
            make_filter(kind, 1.0, delta)
    filt = make_filter(kind, 1.0, DELTA)
    # A NaN or negative sensitivity must not be charged as zero: refused, even one in a batch.
    for bad in (math.nan, math.inf, -1.0, [0.5, math.nan], [0.5, -1e-300]):
        with pytest.raises(ValueError, match="sensitivity"):
            filt.charge(sensitivity=bad, noise_std=1.0)
    for bad in (0.0, -1.0, math.nan, math.inf, [1.0, 0.0]):
        with pytest.raises(ValueError, match="noise_std"):
            filt.charge(sensitivity=0.5, noise_std=bad)


def test_unknown_filter_kind_is_refused():
    with pytest.raises(ValueError, match="filter must be one of"):
        make_filter("pld", 1.0, DELTA)


@pytest.mark.parametrize("kind", KINDS)
def test_a_run_quota_budget_rounds_down_and_remaining_fraction_is_exact(kind):
    filt = make_filter(kind, 2.0, DELTA)
    rng = np.random.default_rng(9)
    for fraction in np.concatenate([rng.uniform(0.01, 1.0, 200), [1.0, 0.5, 0.1]]):
        run = filt.scaled(float(fraction))
        for b, rb in zip(filt.budget, run.budget):
            assert Fraction(float(rb)) <= Fraction(float(b)) * Fraction(float(fraction)), (fraction, b, rb)
            if b > 0:  # (an rdp order with no budget stays at or below zero: it admits nothing)
                assert float(rb) >= float(b) * fraction * (1 - 1e-15)
    # remaining_fraction: (B - S) / B of the coordinate with the most room, against fractions.
    for t in (0.0, 0.25, 0.5, 0.999, 1.0, 1.5):
        state = filt.budget * t
        expect = max(
            max(Fraction(0), (Fraction(float(b)) - Fraction(float(s))) / Fraction(float(b)))
            for b, s in zip(filt.budget, state)
            if b > 0
        )
        assert abs(Fraction(float(filt.remaining_fraction(state))) - expect) <= Fraction(1, 10**12)


def test_gdp_budget_never_exceeds_the_exact_curve_over_many_budgets():
    # mu_B is rounded down; its square must be rounded down too: to nearest it lands above the
    # exact mu^2 for a few percent of budgets, so 40 random ones catch it.
    rng = np.random.default_rng(17)
    for eps, log_delta in zip(10.0 ** rng.uniform(-1.3, 1.0, 40), rng.uniform(-10, -3, 40)):
        delta = float(10.0**log_delta)
        b = float(make_filter("gdp", float(eps), delta).budget[0])
        exact = gdp_mu2_budget(float(eps), delta)
        assert mpmath.mpf(b) <= exact, (eps, delta, b)


@pytest.mark.parametrize("kind", KINDS)
def test_epsilon_spent_below_the_budget_is_an_upper_bound_on_the_exact_epsilon(kind):
    # What a client is told it spent must never be below the exact epsilon of its state (it is
    # capped at the budget only at the budget). Exact: the GDP curve, Bun-Steinke, CKS 2020 at 50
    # digits; and within 1e-9 of it (the rounding is a few ulps, not a looser bound).
    filt = make_filter(kind, 2.0, DELTA)
    full = float(filt.allowance(filt.initial_state(), noise_std=1.0))  # spends the whole budget
    rng = np.random.default_rng(21)
    # Tiny states too (t down to 1e-3: an RDP value between delta^2 and delta), where a looser KL
    # shortcut would print epsilon 0 although the exact epsilon is positive.
    for t in np.concatenate([rng.uniform(1e-2, 0.999, 25), [0.5, 0.9, 3e-3, 1e-3]]):
        # A state a client can reach: one release of sensitivity t * full at noise std 1.
        state = filt.spend(filt.initial_state(), filt.charge(sensitivity=t * full, noise_std=1.0))
        spent = filt.epsilon_spent(state)
        if kind == "gdp":
            exact = gdp_epsilon(Fraction(float(state[0])), DELTA)
        elif kind == "zcdp":
            exact = zcdp_epsilon(Fraction(float(state[0])), DELTA)
        else:
            # Order alpha*'s Renyi loss is alpha* rho, at the full delta: the state is RDP at alpha* only
            # once it may hold Skellam charges (the best order over all of them, compared
            # here before, is valid for Gaussian-only states alone, and is never above this one).
            rho, a = Fraction(float(state[0])), rdp_order(filt)
            exact = rdp_epsilon([rho * Fraction(a)], [a], DELTA)
            assert exact >= rdp_epsilon([rho * Fraction(b) for b in filt.orders], filt.orders, DELTA)
        assert mpmath.mpf(spent) >= exact, (t, spent, float(exact))
        assert spent <= float(exact) * (1 + 1e-9) + 1e-12, (t, spent, float(exact))


def _exact_rho_budget(filt) -> mpmath.mpf:
    """``max_alpha B_alpha / alpha`` at 50 digits, ``B_alpha = eps - log1p(-1/alpha) + log(delta alpha) /
    (alpha - 1)`` at the full delta (CKS 2020 Proposition 12 per order; one threshold on rho)."""
    with mpmath.workdps(50):
        d = mpmath.mpf(filt.delta)
        return max(
            max(
                mpmath.mpf(filt.epsilon) - mpmath.log1p(-1 / mpmath.mpf(a)) + mpmath.log(d * a) / (mpmath.mpf(a) - 1),
                mpmath.mpf(0),
            )
            / mpmath.mpf(a)
            for a in filt.orders
        )


def test_zcdp_budget_never_exceeds_theorem_4_9_exactly():
    rng = np.random.default_rng(23)
    for eps, log_delta in zip(10.0 ** rng.uniform(-1.5, 1.3, 300), rng.uniform(-10, -3, 300)):
        filt = make_filter("zcdp", float(eps), float(10.0**log_delta))
        with mpmath.workdps(50):
            ln = -mpmath.log(mpmath.mpf(filt.delta))
            exact = (mpmath.sqrt(ln + mpmath.mpf(filt.epsilon)) - mpmath.sqrt(ln)) ** 2
        assert mpmath.mpf(float(filt.budget[0])) <= exact, (eps, filt.delta)


def test_rdp_budget_never_exceeds_the_exact_conversion():
    # The mutation run found order budgets above the exact conversion (the slack was taken from the
    # result, which cancels); the single-threshold filter's rho* must stay at or below the exact one.
    rng = np.random.default_rng(0)
    for eps in 10.0 ** rng.uniform(-1.5, 1.3, 300):
        for delta in (1e-5, 1e-9, 1e-3):
            filt = make_filter("rdp", float(eps), delta)
            assert mpmath.mpf(float(filt.budget[0])) <= _exact_rho_budget(filt), (float(eps), delta)


def _exact_sq_norm(arrays) -> Fraction:
    return sum((Fraction(float(x)) ** 2 for a in arrays for x in np.asarray(a).ravel()), Fraction(0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_certified_norm_and_clip_bound_the_exact_norm(dtype):
    # The sensitivity a client is charged for is certified_norm of what it releases: it must be
    # at least the exact norm (exact fractions; a float norm has the same rounding as the code).
    from fedfilter.client.mechanisms.gaussian import certified_norm, clip_to_norm

    rng = np.random.default_rng(31)
    for size in (1, 7, 300, 2000):
        for scale in (1.0, 1e-30, 1e30):
            arrays = [(rng.normal(size=size) * scale).astype(dtype), (rng.normal(size=(3, 5)) * scale).astype(dtype)]
            if not all(np.all(np.isfinite(a)) for a in arrays):
                continue
            exact = _exact_sq_norm(arrays)
            norm = certified_norm(arrays)
            assert Fraction(norm) ** 2 >= exact, (size, scale)
            # Tiny targets too (a coordinator may ask for any clip): there float32 casts round to
            # subnormals, re-certification can fail, and the fallback must release zeros.
            for target in (norm / 3, norm * 0.999, 1e-42, 1.2e-45, 3e-300):
                clipped, cnorm = clip_to_norm(arrays, target)
                assert cnorm <= target and Fraction(cnorm) ** 2 >= _exact_sq_norm(clipped), (size, scale, target)


def test_a_noise_only_release_carries_none_of_the_update(tmp_path):
    # Exhausted and charged nothing, so nothing of the update may be in the report: with an update
    # of 5.0 everywhere and noise std 1, the report's mean over 20,000 entries is 0 +- 0.03.
    ledger = BudgetLedger.enrol(tmp_path, client_id="dev", epsilon=0.5, delta=DELTA)
    client = FilteredClient(ledger, ClientPolicy(), noise_seed=8)
    update = [np.full(20_000, 5.0, dtype=np.float32)]
    first = client.release(RoundSpec("run", 0, 1.0, 1.0), update)
    assert first.status == "contributed"
    rel = client.release(RoundSpec("run", 1, 1.0, 1.0), update)
    assert rel.status == "noise-only" and rel.sensitivity == 0.0
    assert np.all(ledger.records()[-1].charge == 0)
    report = rel.arrays[0].astype(np.float64)
    assert abs(report.mean()) < 0.03 and abs(report.std() - 1.0) < 0.03
