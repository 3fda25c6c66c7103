"""Dropout-study config: every problem reported at once, budgets drawn as stated."""

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from fedfilter.cli import main
from fedfilter.simulations.study.config import StudyConfigError, parse_study

GOOD = """
[study]
name = "t"
rounds = 3
seeds = [0, 1]
filter = "rdp"

[federation]
noise_multiplier = 1.0
fraction = 0.5
min_reports = 4
worst_case_factor = 4.0

[sweep]
budget_level = [1.0, 4.0]
heterogeneity = ["fixed", "logn", "two", "unif"]
after_exhaustion = ["noise-only", "leave"]
noise = ["local", "distributed"]
data = ["iid", "dir", "fem"]

[heterogeneity.fixed]
distribution = "fixed"

[heterogeneity.logn]
distribution = "lognormal"
sigma = 0.8

[heterogeneity.two]
distribution = "two-level"
low = 0.25
high = 4.0
share_high = 0.3

[heterogeneity.unif]
distribution = "uniform"
low = 0.5
high = 1.5

[data.iid]
task = "digits"
partition = "iid"
num_clients = 50

[data.dir]
task = "digits"
partition = "dirichlet"
alpha = 0.3
num_clients = 50

[data.fem]
task = "femnist"
num_clients = 20
"""

BAD = """
[study]
rounds = 0
seeds = []
filter = "pld"
colour = "red"

[federation]
noise_multiplier = -1
fraction = 1.5
client_mode = "fast"
min_reports = 1

[sweep]
budget_level = [1.0, -2]
heterogeneity = ["logn", "nope"]
after_exhaustion = ["vanish"]
noise = ["distributed"]
data = ["fem", "dig"]

[heterogeneity.logn]
distribution = "lognormal"

[heterogeneity.weird]
distribution = "pareto"

[data.fem]
task = "femnist"
partition = "iid"
num_clients = 10

[data.dig]
task = "digits"
partition = "natural"
num_clients = 0
alpha = -1
"""


def test_good_config_expands_into_every_combination():
    study = parse_study(GOOD)
    runs = study.runs()
    assert len(runs) == 2 * 4 * 2 * 2 * 3 * 2
    assert len({r.label for r in runs}) == len(runs)
    assert study.data["fem"].partition == "natural" and study.data["fem"].groups == "size"
    assert study.data["iid"].groups == "label"


def test_every_problem_is_reported_at_once_with_key_and_value():
    with pytest.raises(StudyConfigError) as err:
        parse_study(BAD, "bad.toml")
    msg = str(err.value)
    expected = [
        ("study.colour", "'red'"),
        ("study.rounds", "0"),
        ("study.seeds", "[]"),
        ("study.filter", "'pld'"),
        ("federation.noise_multiplier", "-1"),
        ("federation.fraction", "1.5"),
        ("federation.client_mode", "'fast'"),
        ("heterogeneity.logn.sigma is missing", ""),
        ("heterogeneity.weird.distribution", "'pareto'"),
        ("data.fem.partition", "'iid'"),
        ("data.dig.partition", "'natural'"),
        ("data.dig.num_clients", "0"),
        ("data.dig.alpha", "-1"),
        ("sweep.budget_level[1]", "-2"),
        ("sweep.heterogeneity[1]", "'nope'"),
        ("sweep.after_exhaustion[0]", "'vanish'"),
        ("federation.min_reports", "1"),
    ]
    for key, value in expected:
        line = next((ln for ln in err.value.problems if key in ln), None)
        assert line is not None, f"no problem reported for {key}:\n{msg}"
        assert value in line, line
    assert msg.startswith("bad.toml: ")
    assert len(err.value.problems) >= len(expected)


def test_invalid_toml_and_missing_tables():
    with pytest.raises(StudyConfigError, match="not valid TOML"):
        parse_study("[study\nname=1")
    with pytest.raises(StudyConfigError) as err:
        parse_study("[study]\nname = 'x'\n")
    text = str(err.value)
    for piece in ("study.rounds is missing", "[sweep] is missing", "[data] is missing", "[heterogeneity] is missing"):
        assert piece in text


def test_min_reports_must_be_reachable():
    text = GOOD.replace("min_reports = 4", "min_reports = 30")  # 0.5 x 20 femnist clients = 10 asked
    with pytest.raises(StudyConfigError, match=r"min_reports = 30 exceeds the 10 clients .*\[data.fem\]"):
        parse_study(text)
    # a data set may ask a larger share of its clients than [federation].fraction
    text = (
        text.replace('task = "femnist"', 'task = "femnist"\nfraction = 1.0')
        .replace("num_clients = 20", "num_clients = 40")
        .replace("num_clients = 50", "num_clients = 60")
    )
    assert parse_study(text).data["fem"].fraction == 1.0


def test_budgets_follow_the_stated_distributions():
    study = replace(parse_study(GOOD), budget_grid=0)
    by = {(r.heterogeneity.name, r.budget_level, r.seed, r.data.name): r for r in study.runs()}
    n = 20_000
    fixed = study.budgets(by[("fixed", 4.0, 0, "iid")], n)
    assert np.all(fixed == 4.0)
    logn = study.budgets(by[("logn", 4.0, 0, "iid")], n)
    assert np.median(logn) == pytest.approx(4.0, rel=0.03)
    assert np.std(np.log(logn)) == pytest.approx(0.8, rel=0.03)
    two = study.budgets(by[("two", 1.0, 0, "iid")], n)
    assert set(np.unique(two)) == {0.25, 4.0}
    assert np.mean(two == 4.0) == pytest.approx(0.3, abs=0.015)
    unif = study.budgets(by[("unif", 1.0, 0, "iid")], n)
    assert unif.min() >= 0.5 and unif.max() <= 1.5
    # the same draws at every level (paired comparisons), different ones for another seed
    assert np.allclose(study.budgets(by[("logn", 1.0, 0, "iid")], n) * 4.0, logn)
    assert not np.allclose(study.budgets(by[("logn", 4.0, 1, "iid")], n), logn)


def test_budget_grid_rounds_down_only():
    exact = replace(parse_study(GOOD), budget_grid=0)
    grid = replace(exact, budget_grid=8)
    for run in exact.runs()[:40]:
        a, b = exact.budgets(run, 500), grid.budgets(run, 500)
        assert np.all(b <= a)
        assert np.all(b > a / 2 ** (1 / 8) * (1 - 1e-12))
        assert len(np.unique(b)) <= 64
    fixed = next(r for r in grid.runs() if r.heterogeneity.name == "fixed" and r.budget_level == 4.0)
    assert np.all(grid.budgets(fixed, 10) == 4.0)


def test_cli_reports_config_errors_and_dry_run(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text(BAD)
    assert main(["study", "dropout", "--config", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "study.filter must be one of gdp, rdp, zcdp. Found 'pld'." in err
    assert "federation.fraction must be a number in (0, 1]. Found 1.5." in err
    good = tmp_path / "good.toml"
    good.write_text(GOOD)
    assert main(["study", "dropout", "--config", str(good), "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "valid; 192 runs x 3 rounds" in out
    assert "epsilon_i = 4 x lognormal(median 1, sigma 0.8)" in out
    assert main(["study", "dropout", "--config", str(tmp_path / "missing.toml"), "--dry-run"]) == 2
    assert "is neither a" in capsys.readouterr().err


@pytest.mark.parametrize(
    "path", sorted(Path(__file__).parents[3].joinpath("fedfilter", "simulations", "configs").glob("*.toml"))
)
def test_the_shipped_study_configs_parse(path):
    study = parse_study(path.read_text())
    assert study.filter == "rdp" or "distributed" not in study.sweep["noise"]
