"""``fedfilter demo``'s budgets and plan, and its population part at a tiny size.

The population part runs the vectorised engine (the devices' privacy code) on a federation large
enough to learn, with the noise multiplier the planner chooses for the smallest budget; here it runs
on scikit-learn's digits at a size that takes seconds, and its numbers are checked against what they
claim: the private model beats chance, every device's spent epsilon (read back from its filter state)
is within its budget, no budget exceeds 8, and the plan's z is the least the smallest budget pays for.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import optimize, stats

ROOT = Path(__file__).resolve().parents[2]


def _gdp_mu(epsilon: float, delta: float) -> float:
    """mu with delta(epsilon) = delta for mu-GDP (Dong, Roth and Su 2022, Corollary 2.13), by root finding."""

    def excess(mu: float) -> float:
        return (
            stats.norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * stats.norm.cdf(-epsilon / mu - mu / 2) - delta
        )

    return optimize.brentq(excess, 1e-3, 50.0, xtol=1e-14)


def _demo_args(*argv: str) -> argparse.Namespace:
    from fedfilter.cli.demo import placement_defaults, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return placement_defaults(parser.parse_args(["demo", "--out", "x", *argv]))


# --- budgets and the plan --------------------------------------------------------------------------
def test_no_device_budget_in_the_demo_exceeds_8():
    from fedfilter.cli.demo import DEFAULTS, DISTRIBUTED_DEFAULTS, draw_budgets
    from fedfilter.simulations.population.settings import PopulationSettings

    for table in (DEFAULTS, DISTRIBUTED_DEFAULTS):
        assert table["eps_max"] <= 8
    for placement in ("local", "distributed"):
        args = _demo_args("--placement", placement, "--clients", "200")
        budgets = draw_budgets(args.clients, args.eps_min, args.eps_max, seed=0)
        assert max(budgets) <= 8 and min(budgets) >= 1
    assert max(PopulationSettings().budgets) <= 8
    with pytest.raises(ValueError, match=r"budgets must be numbers in \(0, 8\]. Found \(4.0, 8.5\)"):
        PopulationSettings(budgets=(4.0, 8.5))
    # `make demo` uses the defaults: no budget flag overrides them.
    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "fedfilter demo" in recipe and "--population" in recipe and "--eps" not in recipe


def test_the_default_noise_multipliers_are_the_planners_for_the_smallest_budget():
    from fedfilter.cli.demo import DEFAULTS, DISTRIBUTED_DEFAULTS
    from fedfilter.planning.rounds import admits_rounds

    # gdp filter, local noise: 5 full-clip rounds cost 5 / z^2 in mu^2, so z = sqrt(5) / mu(epsilon 1).
    reference = math.ceil(math.sqrt(5) / _gdp_mu(1.0, 1e-5) * 100) / 100
    assert DEFAULTS["noise_multiplier"] == reference == _demo_args().noise_multiplier
    # rdp filter, Skellam on the SecAgg+ grid: the least (two decimals) whose 5 rounds the filter admits.
    args = _demo_args("--placement", "distributed")
    z = DISTRIBUTED_DEFAULTS["noise_multiplier"]
    assert args.noise_multiplier == z
    setting = dict(epsilon=1.0, delta=1e-5, placement="distributed", clip=args.clip, min_reports=5, dim=2410)
    assert admits_rounds("rdp", rounds=5, noise_multiplier=z, **setting)
    assert not admits_rounds("rdp", rounds=5, noise_multiplier=z - 0.01, **setting)
    # Another number of rounds is planned again, not taken from the table.
    assert _demo_args("--rounds", "20").noise_multiplier == math.ceil(math.sqrt(20) / _gdp_mu(1.0, 1e-5) * 100) / 100


def test_the_population_plan_pays_for_the_planned_asks_at_the_smallest_budget():
    from fedfilter.planning.rounds import admits_rounds
    from fedfilter.simulations.population.settings import PopulationSettings, plan_population

    s = PopulationSettings()
    plan = plan_population(s, dim=26010)
    # Uniform sampling: the smallest a with P(Binomial(20, 500 / 6000) <= a) >= 0.9.
    assert plan["asks_planned"] == int(stats.binom.ppf(0.9, 20, 500 / 6000)) == 3
    setting = dict(epsilon=1.0, delta=1e-5, placement="distributed", clip=s.clip, min_reports=100, dim=26010)
    z = plan["noise_multiplier"]
    assert admits_rounds("rdp", rounds=3, noise_multiplier=z, **setting)
    assert not admits_rounds("rdp", rounds=3, noise_multiplier=z - 0.01, **setting)
    # The released mean of 500 reports, each with 1/100 of the sum's variance: std z C / sqrt(500 * 100).
    std = z * s.clip / math.sqrt(500 * 100)
    assert plan["mean_noise_norm"] == pytest.approx(std * math.sqrt(26010), rel=1e-4)


@pytest.mark.parametrize(
    "argv, words",
    [
        (("--clients", "0"), ["--clients 0", "--population"]),
        (("--population", "100", "--population-per-round", "500"), ["--population-per-round", "500"]),
        (("--population", "100", "--population-rounds", "0"), ["--population-rounds", "0"]),
        (
            (
                "--population",
                "-1",
            ),
            ["--population", "-1"],
        ),
    ],
)
def test_bad_population_settings_are_refused_naming_the_flag(argv, words, tmp_path, capsys):
    from fedfilter.cli import main

    out = tmp_path / "run"
    assert main(["demo", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    for word in words:
        assert word in err
    assert not out.exists()


# --- the population part at a tiny size ------------------------------------------------------------
def test_no_privacy_with_one_device_is_that_devices_own_training():
    import torch

    from fedfilter.simulations.engine.updates import local_seed
    from fedfilter.simulations.population.no_privacy import no_privacy_accuracy
    from fedfilter.simulations.tasks.registry import load_task
    from fedfilter.simulations.tasks.training import evaluate, local_update

    task = load_task("digits", num_clients=1)
    accuracy = no_privacy_accuracy(
        task, per_round=1, rounds=1, local_epochs=2, lr=0.1, batch_size=32, server_lr=1.0, seed=3, run_id="t"
    )
    torch.manual_seed(3)
    model = task.model_fn()
    x, y = task.train_data[0]
    local_update(model, x, y, epochs=2, lr=0.1, batch_size=32, seed=local_seed(1, 0), loss_fn=task.loss)
    assert accuracy == [pytest.approx(evaluate(model, *task.test_data, loss_fn=task.loss)[1], abs=1e-9)]


TINY = dict(devices=400, per_round=200, rounds=6, budgets=(4.0, 8.0), min_reports=100, task="digits", lr=0.5)


@pytest.fixture(scope="module")
def tiny_run():
    from fedfilter.simulations.population.run import run_population
    from fedfilter.simulations.population.settings import PopulationSettings

    return run_population(PopulationSettings(**TINY))


def test_the_tiny_population_learns_privately_and_every_device_stays_within_its_budget(tiny_run):
    run = tiny_run
    assert run.task == "digits" and run.fallback is None and run.devices == 400 and run.dim == 2410
    assert run.plan["planned_epsilon"] == 4.0 and run.engine.config.noise_multiplier == run.plan["noise_multiplier"]
    records = run.engine.rounds
    assert [r.sampled for r in records] == [200] * 6 and all(r.released for r in records)
    # Real numbers: the private model beats chance (0.1) by far (0.58 here), and the same federation
    # without privacy learns too (0.70).
    assert run.private_accuracy[-1] > 0.3, run.private_accuracy
    assert run.no_privacy_accuracy[-1] > 0.5, run.no_privacy_accuracy
    # Every device's spend, read back from its filter state, within its budget (at most 8).
    assert run.budgets.max() <= 8 and set(run.budgets.tolist()) == {4.0, 8.0}
    assert np.all(run.engine.spent_epsilon <= run.budgets)
    assert run.engine.spent_epsilon.max() > 0
    # The worst-case budgets are the Flower demo's: min_reports x the budget, rounded up.
    from fedfilter.deploy.devices import simulated_worst_case_epsilon

    worst = [simulated_worst_case_epsilon(e, 100) for e in run.budgets]
    assert run.engine.config.worst_case_epsilon.tolist() == worst
    asked = run.engine.graph_rounds
    assert asked.sum() == 200 * 6 and np.all(run.engine.spent_epsilon[asked == 0] == 0)


def test_population_part_end_to_end_writes_its_numbers_and_plot(tmp_path, capsys):
    from fedfilter.cli import main

    argv = ["demo", "--clients", "0", "--population", "60", "--population-per-round", "30"]
    argv += ["--population-rounds", "2", "--population-task", "digits", "--out", str(tmp_path)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    summary = json.loads((tmp_path / "population.json").read_text())
    assert summary["devices"] == 60 and summary["max_budget_epsilon"] == 8.0
    assert len(summary["private_accuracy_per_round"]) == len(summary["no_privacy_accuracy_per_round"]) == 2
    assert [t["budget_epsilon"] for t in summary["tiers"]] == [1.0, 2.0, 4.0, 8.0]
    assert all(t["spent_max"] <= t["budget_epsilon"] for t in summary["tiers"])
    assert summary["plan"]["planned_epsilon"] == 1.0 and summary["settings"]["min_reports"] == 15
    assert (
        ">= 15 reports" in summary["guarantee"] and "worst_case_epsilon = 15 x budget_epsilon" in summary["guarantee"]
    )
    assert (tmp_path / "population.png").stat().st_size > 1000
    assert "guarantee:" in out and "no-privacy acc" in out
    assert not (tmp_path / "summary.json").exists()  # --clients 0: no Flower part


def test_without_mnist_the_population_part_falls_back_to_digits_and_says_so(tmp_path, monkeypatch):
    from fedfilter.simulations.population.run import load_population_task
    from fedfilter.simulations.population.settings import PopulationSettings

    monkeypatch.setenv("FEDFILTER_DATA", str(tmp_path))  # an empty data folder
    task, fallback = load_population_task(PopulationSettings(devices=3000, task="mnist"))
    assert task.name == "digits" and task.num_clients == 1437
    assert fallback.startswith("MNIST not found") and "1437 devices instead of 3000" in fallback


def test_balanced_passes_and_adaptive_clipping_are_one_field_each_and_refused_clearly_without_engine_support():
    import dataclasses

    from fedfilter.protocol.adaptive_clip import AdaptiveClipping
    from fedfilter.simulations.engine import EngineConfig
    from fedfilter.simulations.population.run import engine_config
    from fedfilter.simulations.population.settings import PopulationSettings, plan_population

    fields = {f.name for f in dataclasses.fields(EngineConfig)}
    s = PopulationSettings(devices=40, per_round=20, rounds=4, min_reports=10, task="digits", participation="balanced")
    plan = plan_population(s, dim=2410)
    assert plan["asks_planned"] == 2 and plan["plan_quantile"] is None  # ceil(4 * 20 / 40)
    for settings, field in (
        (s, "participation"),
        (PopulationSettings(adaptive_clipping=AdaptiveClipping()), "adaptive_clipping"),
    ):
        if field in fields:
            assert getattr(engine_config(settings, plan, np.full(settings.devices, 8.0)), field) is not None
        else:
            with pytest.raises(ValueError, match=f"this engine has no {field}"):
                engine_config(settings, plan, np.full(settings.devices, 8.0))


def test_the_learning_text_says_the_noise_was_planned_only_when_it_was():
    from fedfilter.cli.demo_report import learning_text

    plan = {"noise_dominates": True, "noise_to_clip": 20.0, "recommended": {"devices": 5000}}
    args = argparse.Namespace(clients=10, placement="distributed", noise_multiplier=2.0, eps_min=1.0, rounds=5)
    given = learning_text(args, plan, [0.1], [0.9])
    assert "cannot learn privately" in given and "5,000 devices per round" in given and "the least whose" not in given
    args.noise_planned = True
    assert "the least whose 5 rounds the smallest budget, epsilon 1, pays for" in learning_text(
        args, plan, [0.1], [0.9]
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_population_part_stops_its_second_process(tmp_path, sig):
    argv = [sys.executable, "-m", "fedfilter", "demo", "--clients", "0", "--population", "400"]
    argv += ["--population-per-round", "200", "--population-rounds", "50", "--population-task", "digits"]
    demo = subprocess.Popen(
        [*argv, "--out", str(tmp_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a terminal
    )
    try:
        deadline, children = time.monotonic() + 120, []
        while len(children) < 2:  # the resource tracker and the run without privacy
            assert demo.poll() is None and time.monotonic() < deadline
            time.sleep(0.5)
            children = Path(f"/proc/{demo.pid}/task/{demo.pid}/children").read_text().split()
        time.sleep(2)
        demo.send_signal(sig)
        output, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert b"interrupted during the population part" in output
    deadline = time.monotonic() + 15
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not [pid for pid in children if Path(f"/proc/{pid}").exists()]
    # The demo returns 130; now and then the interpreter still ends by SIGINT after that (-2), not yet understood.
    assert demo.returncode in (130, -signal.SIGINT), output
