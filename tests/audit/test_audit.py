"""``fedfilter audit``: the lower-bound math against exact references, and small audits through the
real ClientApp and filter mod (each under ~30 s on one core)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from scipy import integrate, optimize
from scipy.stats import binom, norm

from fedfilter.audit import bounds
from fedfilter.audit.distinguishers import bits_features, distinguish, single_reply_tv
from fedfilter.audit.run import run_audit
from fedfilter.privacy.gaussian_dp import epsilon_for_mu, mu_for_budget


# --- Clopper-Pearson ------------------------------------------------------------------------------
def test_clopper_pearson_matches_r_binom_test_and_the_closed_forms():
    # R 4.x: binom.test(5, 10)$conf.int = 0.1870860 0.8129140 (two-sided 95%: alpha/2 per side).
    assert float(bounds.cp_lower(5, 10, 0.025)) == pytest.approx(0.1870860, abs=5e-7)
    assert float(bounds.cp_upper(5, 10, 0.025)) == pytest.approx(0.8129140, abs=5e-7)
    # k = 0 and k = n have closed forms: P(Bin(n, p) = 0) = (1 - p)^n = alpha.
    for n in (1, 7, 50, 1000):
        assert float(bounds.cp_upper(0, n, 0.05)) == pytest.approx(1 - 0.05 ** (1 / n), rel=1e-12)
        assert float(bounds.cp_lower(n, n, 0.05)) == pytest.approx(0.05 ** (1 / n), rel=1e-12)
        assert float(bounds.cp_lower(0, n, 0.05)) == 0.0 and float(bounds.cp_upper(n, n, 0.05)) == 1.0


@pytest.mark.parametrize("k, n", [(1, 10), (3, 40), (17, 100), (480, 1000), (9990, 10000)])
def test_clopper_pearson_inverts_the_binomial_tail(k, n):
    # The definition (Clopper and Pearson 1934), solved by root finding instead of beta.ppf:
    # P(Bin(n, lo) >= k) = alpha and P(Bin(n, hi) <= k) = alpha.
    alpha = 0.025
    lo = optimize.brentq(lambda p: binom.sf(k - 1, n, p) - alpha, 1e-15, 1 - 1e-15, xtol=1e-15)
    hi = optimize.brentq(lambda p: binom.cdf(k, n, p) - alpha, 1e-15, 1 - 1e-15, xtol=1e-15)
    assert float(bounds.cp_lower(k, n, alpha)) == pytest.approx(lo, rel=1e-8)
    assert float(bounds.cp_upper(k, n, alpha)) == pytest.approx(hi, rel=1e-8)


# --- from rates to epsilon and mu --------------------------------------------------------------------
@pytest.mark.parametrize("mu", [0.268, 1.0, 2.5])
def test_the_best_test_on_an_exact_gaussian_reaches_the_exact_curve_and_never_passes_it(mu):
    # On the exact trade-off of mu-GDP, sup_t log((TPR(t) - delta) / FPR(t)) is the exact epsilon
    # of the Gaussian curve at delta (privacy/gaussian_dp.py, solved at 60 digits).
    delta = 1e-5
    t = np.linspace(-3, 12, 200001)
    eps = bounds.epsilon_from_rates(norm.sf(t - mu), norm.sf(t), delta)
    exact = epsilon_for_mu(mu, delta)
    assert eps.max() <= exact * (1 + 1e-9)
    assert eps.max() >= exact * (1 - 1e-4)


def test_mu_from_rates_inverts_the_gaussian_trade_off():
    for mu in (0.1, 0.268, 1.0, 3.0):
        fpr = np.array([1e-4, 0.1, 0.3, 0.5, 0.9])
        tpr = norm.cdf(norm.ppf(fpr) + mu)  # Dong-Roth-Su Definition 2.7
        np.testing.assert_allclose(bounds.mu_from_rates(tpr, fpr), mu, rtol=1e-9)
    assert float(bounds.mu_from_rates(0.4, 0.6)) == 0.0  # worse than chance shows nothing


def test_epsilon_from_rates_shows_nothing_below_delta():
    assert float(bounds.epsilon_from_rates(0.5, 0.5, 1e-5)) == 0.0
    assert float(bounds.epsilon_from_rates(1e-6, 1e-9, 1e-5)) == 0.0  # TPR below delta
    assert float(bounds.epsilon_from_rates(0.5, 0.25, 0.0)) == pytest.approx(math.log(2))


def test_gdp_total_variation_is_half_the_l1_distance_of_the_two_gaussians():
    for mu in (0.05, 0.155, 1.0, 4.0):
        l1, _ = integrate.quad(lambda x: abs(norm.pdf(x - mu) - norm.pdf(x)), -20, 20 + mu, points=[mu / 2])
        assert bounds.gdp_total_variation(mu) == pytest.approx(l1 / 2, abs=1e-10)


def test_rates_at_counts_both_roles_by_hand():
    s0, s1 = [0.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]
    r = bounds.rates_at(bounds.Test(1.0), s0, s1, alpha=0.05)
    assert (r.hits1, r.hits0, r.tpr, r.fpr) == (3, 1, 0.75, 0.25)
    # Swapped: the event "score < 1" for world 0 (TNR) against the same event for world 1 (FNR).
    r = bounds.rates_at(bounds.Test(1.0, swapped=True), s0, s1, alpha=0.05)
    assert (r.hits1, r.hits0, r.tpr, r.fpr) == (3, 1, 0.75, 0.25)
    r = bounds.rates_at(bounds.Test(0.5, sign=-1), s0, s1, alpha=0.05)  # scores <= 0.5 say world 1
    assert (r.tpr, r.fpr) == (0.25, 0.75)


def test_held_out_thresholds_are_not_biased_but_reusing_the_data_is():
    # Both worlds identical: a valid procedure claims eps > 0 in at most about alpha of the runs.
    alpha, reps, n = 0.05, 300, 200
    rng = np.random.default_rng(0)
    held_out = reused = 0
    for _ in range(reps):
        s0, s1 = rng.normal(size=n), rng.normal(size=n)
        select = bounds.split_mask(n, 0.5, rng)
        held_out += bounds.audit_scores(s0, s1, select, objective="mu", delta=1e-5, alpha=alpha)[1].mu_lb > 0
        test = bounds.select_threshold(s0, s1, objective="mu", delta=1e-5, alpha=alpha)
        reused += bounds.rates_at(test, s0, s1, delta=1e-5, alpha=alpha).mu_lb > 0
    limit = binom.ppf(0.999, reps, alpha)  # a 1-in-1000 tolerance on the false-alarm count
    assert held_out <= limit
    assert reused > held_out  # the bias the split avoids


def test_planned_tests_sit_where_the_claim_says():
    mu = mu_for_budget(1.0, 1e-5)
    tests = bounds.planned_tests(mu, 10_000, 10_000, delta=1e-5, alpha=0.05)
    assert abs(tests["mu"].threshold - mu / 2) < 0.02  # rates most precise at the crossing point
    assert tests["epsilon"].threshold > 1.0  # the likelihood ratio grows into the tail
    # With too few trials nothing can be shown; the midpoint is kept.
    assert bounds.planned_tests(mu, 20, 20, delta=1e-5, alpha=0.05)["mu"].threshold == mu / 2


def test_gaussian_scores_give_bounds_below_the_truth_and_near_it_at_large_n():
    # The whole pipeline on synthetic scores from exact mu-GDP: the bound is valid and tight.
    mu, delta, n = 1.0, 1e-5, 20_000
    rng = np.random.default_rng(5)
    s0, s1 = rng.normal(size=n), rng.normal(mu, size=n)
    tests = bounds.planned_tests(mu, n, n, delta=delta, alpha=0.05)
    r = bounds.rates_at(tests["mu"], s0, s1, delta=delta, alpha=0.05)
    assert 0.9 * mu < r.mu_lb <= mu
    r = bounds.rates_at(tests["epsilon"], s0, s1, delta=delta, alpha=0.05)
    assert 0 < r.epsilon_lb <= epsilon_for_mu(mu, delta)


# --- the low-order-bit distinguisher on a known artefact (numpy, not the project's mechanism) -------------
def test_bits_features_see_the_float64_gaussian_artefact_and_not_through_float32():
    # Mironov (CCS 2012): noise drawn as std * z and sent unrounded keeps a fingerprint of the
    # sampler that adding an update destroys. Round trip fl(fl(r / std) * std) == r always holds for
    # r = fl(std * z) (here) and for only a part of the values of fl(u + std * z).
    rng = np.random.default_rng(0)
    std, n, d = 6.46, 200, 1056
    u = rng.normal(size=d)
    u /= np.linalg.norm(u)
    noise = [{**bits_features([rng.normal(0.0, std, d)], std)} for _ in range(n)]
    contrib = [{**bits_features([u + rng.normal(0.0, std, d)], std)} for _ in range(n)]
    assert all(f["roundtrip-f64"] == 1.0 for f in noise)
    assert max(f["roundtrip-f64"] for f in contrib) < 0.95
    table = lambda rows: {k: np.array([r[k] for r in rows]) for k in rows[0]}  # noqa: E731
    select = bounds.split_mask(n, 0.5, rng)
    found = distinguish("bits", table(noise), table(contrib), select, theory=single_reply_tv(6.46), alpha=0.05)
    assert found.advantage > 0.95 and not found.within
    # The same draws rounded to float32 (both worlds alike) leave nothing to find.
    noise32 = [bits_features([rng.normal(0.0, std, d).astype(np.float32)], std) for _ in range(n)]
    contrib32 = [bits_features([(u + rng.normal(0.0, std, d)).astype(np.float32)], std) for _ in range(n)]
    found = distinguish("bits", table(noise32), table(contrib32), select, theory=single_reply_tv(6.46), alpha=0.05)
    assert found.within


# --- small audits through the real ClientApp and filter mod -----------------------------------------
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_lower_bounds_never_exceed_the_claim(tmp_path, seed):
    result = run_audit(
        epsilon=1.0,
        delta=1e-5,
        trials=50,
        seed=seed,
        tmp_dir=str(tmp_path),
        threshold="split" if seed == 2 else "planned",
    )
    assert result["epsilon_lower_bound"] <= 1.0
    assert result["gdp_epsilon_lower_bound"] <= 1.0
    played = {d: g for d, g in result["games"].items() if "refused" not in g}  # a device may refuse float64
    assert "float32" in played
    for dtype, game in played.items():
        assert game["rounds_to_exhaust"] in (3, 4)  # 3 full rounds, maybe a sliver (game.py docstring)
        assert game["attack_mu"] == pytest.approx(game["claimed_mu"], rel=1e-6)
        assert game["ledgers_verified"] >= 1
        for name in ("value", "bytes"):  # these must hold before and after the float-safe noise
            assert result["exhaustion"][dtype][name]["within_bound"], (dtype, name)


def test_the_audit_catches_a_device_that_spends_more_than_the_claim(tmp_path):
    # Devices enrolled with epsilon 12 audited against a claim of 4: the attacker (who knows the
    # devices' settings) follows them for all their rounds, and the bound must exceed the claim.
    # A large claim needs few trials to be refuted (mu 0.92 claimed, 2.32 spent, 7 rounds).
    result = run_audit(
        epsilon=4.0,
        delta=1e-5,
        trials=60,
        seed=7,
        rounds=1,
        dtypes=["float32"],
        device_epsilon=12.0,
        tmp_dir=str(tmp_path),
    )
    assert result["gdp_epsilon_lower_bound"] > 4.0
    assert not result["within_claim"] and not result["passed"]
    assert result["gdp_epsilon_lower_bound"] <= 12.0  # and it still respects the devices' budget


def test_cli_prints_one_json_object_and_writes_the_plot(tmp_path, capsys):
    from fedfilter.cli import main

    out = tmp_path / "out"
    code = main(
        [
            "audit",
            "--epsilon",
            "1",
            "--delta",
            "1e-5",
            "--trials",
            "20",
            "--out",
            str(out),
            "--json",
            "--seed",
            "0",
            "--dtype",
            "float32",
            "--no-progress",
            "--tmp-dir",
            str(tmp_path),
        ]
    )
    assert code == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("claimed_epsilon", "epsilon_lower_bound", "gdp_epsilon_lower_bound", "exhaustion"):
        assert key in result
    assert set(result["exhaustion"]["float32"]) == {"value", "bits", "time", "metadata-time", "bytes"}
    for finding in result["exhaustion"]["float32"].values():
        assert {"advantage", "allowed", "within_bound"} <= set(finding)
    assert (out / "audit.png").stat().st_size > 10_000
    assert json.loads((out / "audit.json").read_text())["claimed_epsilon"] == 1.0
