"""``benchmarks/fl_vs_flower_dp.py --smoke --json``: the eight arms run, and every arm's
guarantee holds by a reference that is not the code under test.

(a) Flower's central DP: its accountant's spent epsilon is within the population budget (the smallest
tier), and so is Google's dp_accounting on the same releases. (b)-(d), (f) fedfilter: every device's
epsilon recomputed from its final filter state (mpmath: the RDP conversion at the filter's order, the
exact Gaussian-DP curve; ``helpers.budget_reference``) is within its own budget, and so for (h), the
devices that sample themselves, charged the subsampled loss at their filter's order. (g) the trusted
amplified baseline: dp_accounting's Poisson-sampled account is within the smallest budget, at the
smallest such z.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import pytest
from dp_accounting import dp_event, rdp
from helpers.budget_reference import gdp_delta, rdp_epsilon

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def smoke() -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "fl_vs_flower_dp.py"), "--smoke", "--json", "--no-progress"]
        + ["--arms", "abcdefgh"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "runs at the smallest" in proc.stderr  # the smoke size has budget tiers, and says what (a) does
    return json.loads(proc.stdout)


def test_every_arm_reports_finite_accuracy_and_its_rounds(smoke):
    rounds = smoke["settings"]["rounds"]
    assert smoke["results"]
    for entry in smoke["results"]:
        assert sorted(entry["arms"]) == list("abcdefgh")
        for key, arm in entry["arms"].items():
            assert math.isfinite(arm["accuracy"]) and 0 <= arm["accuracy"] <= 1
            assert len(arm["accuracy_per_round"]) == len(arm["contributing_per_round"]) == rounds
            assert 0 <= arm["rounds_run"] <= rounds
            # (g): Poisson sampling by the server; (h): every device asked, each with its own coin
            most = smoke["settings"]["num_clients" if key in "gh" else "clients_per_round"]
            assert all(0 <= c <= most for c in arm["contributing_per_round"])
        assert entry["arms"]["a"]["trusted_server"] and not entry["arms"]["b"]["trusted_server"]
        # (f), the diagnostic: (a)'s mechanism (central Gaussian noise, trusted server) at (a)'s z
        f = entry["arms"]["f"]
        assert f["trusted_server"] and f["placement"] == "central"
        assert f["noise_multiplier"] == entry["noise_multiplier"]


def test_the_trusted_amplified_baseline_is_what_dp_accounting_certifies(smoke):
    """(g): Poisson-sampled DP-FedAvg at the smallest z dp_accounting certifies within the smallest budget
    (amplification lets it run below (a)'s z)."""
    settings = smoke["settings"]
    rate = settings["clients_per_round"] / settings["num_clients"]
    for entry in smoke["results"]:
        g = entry["arms"]["g"]
        assert g["trusted_server"] and g["placement"] == "central"
        assert g["accountant_epsilon"] <= entry["smallest_epsilon"]
        reference = rdp.RdpAccountant()
        event = dp_event.PoissonSampledDpEvent(rate, dp_event.GaussianDpEvent(g["noise_multiplier"] * (1 - 1e-3)))
        reference.compose(event, settings["rounds"])
        assert reference.get_epsilon(settings["delta"]) > entry["smallest_epsilon"]  # the smallest such z
        assert g["noise_multiplier"] < entry["noise_multiplier"]


def test_flower_central_dp_stays_within_the_smallest_budget(smoke):
    delta = smoke["settings"]["delta"]
    for entry in smoke["results"]:
        a = entry["arms"]["a"]
        smallest = min(d["epsilon"] for d in entry["arms"]["b"]["devices"])
        assert a["epsilon_budget"] == smallest == entry["smallest_epsilon"]
        assert a["releases"] == a["rounds_run"] == smoke["settings"]["rounds"]  # z was planned for every round
        assert a["spent_epsilon"] <= a["epsilon_budget"]
        reference = rdp.RdpAccountant()
        reference.compose(dp_event.GaussianDpEvent(a["noise_multiplier"]), a["releases"])
        assert reference.get_epsilon(delta) <= a["epsilon_budget"]
        assert reference.get_epsilon(delta) == pytest.approx(a["spent_epsilon"], rel=1e-9)


def test_every_fedfilter_device_stays_within_its_own_budget(smoke):
    delta = smoke["settings"]["delta"]
    for entry in smoke["results"]:
        for key in "bcdfh":
            devices = entry["arms"][key]["devices"]
            assert len(devices) == smoke["settings"]["num_clients"]
            assert any(d["state"][0] > 0 for d in devices)  # something was spent
            for d in devices:
                state = Fraction(d["state"][0])
                if d["filter"] == "rdp":  # Rényi loss alpha * rho at the filter's one order (privacy/filters.py)
                    alpha = d["alpha"]
                    assert rdp_epsilon([Fraction(alpha) * state], [alpha], delta) <= d["epsilon"]
                else:  # the Gaussian-DP filter's state is mu^2
                    assert d["filter"] == "gdp" and gdp_delta(d["epsilon"], state) <= delta
                assert d["spent_epsilon"] <= d["epsilon"]


def test_devices_that_sample_themselves_run_at_rates_their_budgets_buy(smoke):
    """(h): no trusted server, every device asked every round, each tier at the plan's rate (a larger budget
    contributes more often), the coordinator dividing by their mean; the kept updates are the coins'."""
    for entry in smoke["results"]:
        h = entry["arms"]["h"]
        plan = h["sampling_plan"]
        assert not h["trusted_server"] and h["placement"] == "distributed"
        assert plan["per_round"] == smoke["settings"]["num_clients"] and plan["asks"] == smoke["settings"]["rounds"]
        rates = [plan["rates"][e] for e in sorted(plan["rates"], key=float)]
        assert all(0 < q <= 1 for q in rates) and rates == sorted(rates) and rates[0] < rates[-1]
        tiers = [d["epsilon"] for d in h["devices"]]
        mean = sum(plan["rates"][repr(float(e))] for e in tiers) / len(tiers)
        assert plan["expected_rate"] == pytest.approx(mean)
        assert all(0 <= k <= plan["per_round"] for k in h["kept_per_round"]) and sum(h["kept_per_round"]) > 0
        assert all(d["spent_epsilon"] > 0 and d["exhausted_round"] == -1 for d in h["devices"])


def _benchmark():
    """The benchmark script as a module (its report module sits beside it)."""
    import importlib

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module("fl_vs_flower_dp")
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_planned_noise_multipliers_pay_for_the_rounds_a_device_is_asked_and_no_fewer():
    """``--fedfilter-z plan``: (d)'s z is the smallest (to 2 decimals) whose exact Gaussian-DP curve
    (mpmath, not the code under test) pays ``ceil(rounds k / n)`` full-clip rounds at the smallest
    budget; (b) and (c) share one z, the smallest the device's rdp filter admits for those rounds."""
    from fedfilter.planning.rounds import admits_rounds

    bench = _benchmark()
    args = bench.parse_args(["--smoke", "--fedfilter-z", "plan"])
    task = bench.load(args)
    epsilon = float(bench.budgets(task.num_clients, args.epsilon[0], args.budgets, args.seed).min())
    z = bench.fedfilter_noise_multipliers(task, args, epsilon, flower_z=2.0)
    asked = math.ceil(args.rounds * args.clients_per_round / task.num_clients)
    assert z["b"] == z["c"] and z["b"] != z["d"]
    # (d): k full-clip Gaussian rounds are sqrt(k) / z -GDP (Feldman & Zrnic (2021) Section 3; mu^2 adds up).
    assert gdp_delta(epsilon, Fraction(asked) / Fraction(z["d"]) ** 2) <= args.delta
    assert gdp_delta(epsilon, Fraction(asked) / Fraction(z["d"] - 0.01) ** 2) > args.delta
    dim = sum(p.numel() for p in task.model_fn().parameters())
    common = dict(epsilon=epsilon, delta=args.delta, clip=args.clip, dim=dim, rounds=asked)
    m = bench.min_reports(args)
    assert admits_rounds("rdp", noise_multiplier=z["b"], placement="distributed", min_reports=m, **common)
    assert not admits_rounds("rdp", noise_multiplier=z["b"] - 0.01, placement="distributed", min_reports=m, **common)
    # Without --fedfilter-z every arm runs at (a)'s z; with a number, at that number.
    assert bench.fedfilter_noise_multipliers(task, bench.parse_args(["--smoke"]), epsilon, 2.0) == dict.fromkeys(
        "bcd", 2.0
    )


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_a_bad_fedfilter_z_is_refused_by_name_and_value(value, capsys):
    with pytest.raises(SystemExit) as exc:
        _benchmark().parse_args(["--smoke", "--fedfilter-z", value])
    assert exc.value.code == 2
    assert f"--fedfilter-z must be 'plan' or a finite number > 0. Found {value!r}." in capsys.readouterr().err


@pytest.mark.parametrize(
    ("rounds", "asked", "devices", "quantile"),
    [(20, 200, 1000, 0.9), (20, 200, 1000, 0.5), (30, 100, 643, 0.95), (20, 105, 105, 0.99), (5, 1, 7, 0.2)],
)
def test_the_planned_asks_are_the_binomial_quantile(rounds, asked, devices, quantile):
    """``--plan-quantile``: the plan pays for the quantile of Binomial(rounds, asked / devices) (scipy's
    ppf, the smallest a with P(X <= a) >= q); without it, the expected number rounded up."""
    from scipy.stats import binom

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from fl_vs_flower_dp_plan import asks_planned
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    assert asks_planned(rounds, asked, devices, quantile) == int(binom.ppf(quantile, rounds, asked / devices))
    assert asks_planned(rounds, asked, devices, None) == math.ceil(rounds * asked / devices)


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.1"])
def test_a_bad_plan_quantile_is_refused_by_name_and_value(value, capsys):
    with pytest.raises(SystemExit) as exc:
        _benchmark().parse_args(["--smoke", "--fedfilter-z", "plan", "--plan-quantile", value])
    assert exc.value.code == 2
    assert (
        f"--plan-quantile must lie in (0, 1), with --fedfilter-z plan. Found {float(value)!r}."
        in capsys.readouterr().err
    )


def test_seed_table_pairs_each_arm_with_flowers_run_of_the_same_seed():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import fl_vs_flower_dp_report as report
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def doc(seed: int, a: float, b: float, **extra) -> dict:
        arm = lambda name, acc: {"name": name, "accuracy_per_round": [None, acc]}  # noqa: E731
        settings = {"task": "femnist", "rounds": 2, "seed": seed, **extra}
        return {"settings": settings, "results": [{"epsilon": 8.0, "arms": {"a": arm("x", a), "b": arm("y", b)}}]}

    table = report.seeds_markdown([doc(0, 0.5, 0.4), doc(1, 0.3, 0.4)])
    # (b) - (a) per seed: -0.1 and +0.1: mean 0, sample sd sqrt(0.02) = 0.141
    assert "| (b) y | 0.400 | 0.400 | 0.400 | +0.000 (0.141) |" in table
    assert "| (a) x | 0.500 | 0.300 | 0.400 | - |" in table
    with pytest.raises(ValueError, match="more than their seed"):
        report.seeds_markdown([doc(0, 0.5, 0.4), doc(1, 0.3, 0.4, rounds=3)])
    with pytest.raises(ValueError, match="appears twice"):
        report.seeds_markdown([doc(0, 0.5, 0.4), doc(0, 0.3, 0.4)])


def test_the_no_privacy_run_copied_to_a_later_epsilon_is_checkpointed(tmp_path):
    """(e) runs once and is copied to every other epsilon; the copy is written to results.json too
    (it was not when (e) was an epsilon's last arm, so a finished run's file lacked it)."""
    import logging
    import random

    import numpy as np

    bench = _benchmark()
    args = bench.parse_args(["--smoke", "--epsilon", "4,8", "--arms", "e", "--no-progress", "--out", str(tmp_path)])
    import flwr.clientapp
    import flwr.serverapp  # noqa: F401  (Flower sets its logger's level when first imported: before the snapshot)

    level, py_state, np_state = logging.getLogger("flwr").level, random.getstate(), np.random.get_state()
    bench.run(args, log=lambda *_: None)
    stored = json.loads((tmp_path / "results.json").read_text())
    assert [sorted(e["arms"]) for e in stored["results"]] == [["e"], ["e"]]
    # An in-process run leaves the process as it found it: Flower's log level (later tests read its INFO
    # lines) and the global generators it seeds.
    assert logging.getLogger("flwr").level == level and random.getstate() == py_state
    assert all(
        np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b for a, b in zip(np.random.get_state(), np_state)
    )
