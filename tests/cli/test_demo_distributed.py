"""``fedfilter demo --placement distributed``: its settings (fast) and a small run through SecAgg+ (slow).

The slow test runs the built-in app through ``flwr run`` on the demo's simulation SuperLink with
distributed placement: every device masks its Skellam-noised report with SecAgg+, the coordinator
unmasks only the sum of at least ``min-reports`` reports. It checks what the demo writes
(``summary.json``), each device's own ledger (rdp filter, distributed spends, within budget) and the
coordinator's public ledger (released rounds, no per-client number).
"""

from __future__ import annotations

import argparse
import json
import math
import os

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only (before Ray starts)


def _args(*argv: str) -> argparse.Namespace:
    from fedfilter.cli.demo import placement_defaults, register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    return placement_defaults(parser.parse_args(["demo", "--out", "x", *argv]))


# --- fast: settings -------------------------------------------------------------------------------
def test_distributed_defaults_threshold_budgets_and_run_config(tmp_path):
    from fedfilter.cli.demo import DEFAULTS, DISTRIBUTED_DEFAULTS, run_config_overrides

    local = _args("--clients", "7")
    assert (local.placement, local.min_reports, local.noise_multiplier) == ("local", 1, DEFAULTS["noise_multiplier"])
    assert (local.eps_min, local.eps_max) == (DEFAULTS["eps_min"], DEFAULTS["eps_max"])
    dist = _args("--clients", "7", "--placement", "distributed")
    assert dist.min_reports == math.ceil(7 / 2) == 4
    assert dist.noise_multiplier == DISTRIBUTED_DEFAULTS["noise_multiplier"]
    assert (dist.eps_min, dist.eps_max) == (DISTRIBUTED_DEFAULTS["eps_min"], DISTRIBUTED_DEFAULTS["eps_max"])
    mine = _args("--clients", "7", "--placement", "distributed", "--min-reports", "3", "--noise-multiplier", "2")
    assert (mine.min_reports, mine.noise_multiplier) == (3, 2.0)  # the user's values win

    overrides = run_config_overrides(dist, "run-x", tmp_path / "p.sqlite")  # checked against the app's table
    assert (overrides["placement"], overrides["min-reports"]) == ("distributed", 4)
    assert run_config_overrides(local, "run-y", tmp_path / "p.sqlite")["placement"] == "local"


@pytest.mark.parametrize(
    "argv, words",
    [
        (("--clients", "4", "--placement", "distributed", "--min-reports", "5"), ["--min-reports", "5"]),
        (("--clients", "4", "--placement", "distributed", "--min-reports", "0"), ["--min-reports", "0"]),
        (("--clients", "4", "--min-reports", "2"), ["distributed only", "2"]),
        (("--clients", "1", "--placement", "distributed"), ["--clients >= 2", "1"]),
        (("--clients", "4", "--placement", "distributed", "--noise-multiplier", "0"), ["--noise-multiplier"]),
    ],
)
def test_bad_distributed_settings_are_refused_naming_the_flag(argv, words, tmp_path, capsys):
    from fedfilter.cli import main

    out = tmp_path / "run"
    assert main(["demo", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("fedfilter: error: ")
    for word in words:
        assert word in err
    assert not out.exists()  # refused before anything ran


def test_distributed_devices_are_enrolled_with_the_rdp_filter_and_old_gdp_devices_refused(tmp_path):
    from fedfilter.cli.demo import FILTER_OF_PLACEMENT, check_device_filters, device_configs
    from fedfilter.client.ledger.budget import BudgetLedger

    devices = device_configs(tmp_path / "a", [2.0, 3.0], after_exhaustion="noise-only", filter_kind="rdp")
    check_device_filters(devices, "distributed")
    for cfg in devices.values():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        try:
            assert ledger.enrolment.filter_kind == cfg["filter"] == FILTER_OF_PLACEMENT["distributed"] == "rdp"
        finally:
            ledger.close()
    # A folder whose devices were enrolled for local noise (gdp) keeps them so; distributed refuses it.
    old = device_configs(tmp_path / "b", [2.0, 3.0], after_exhaustion="noise-only", filter_kind="gdp")
    again = device_configs(tmp_path / "b", [9.0, 9.0], after_exhaustion="noise-only", filter_kind="rdp")
    assert [d["filter"] for d in again.values()] == ["gdp", "gdp"]
    assert [d["budget-epsilon"] for d in again.values()] == [d["budget-epsilon"] for d in old.values()]
    check_device_filters(again, "local")
    with pytest.raises(ValueError, match="filter 'rdp'"):
        check_device_filters(again, "distributed")


def test_the_guarantee_names_secure_aggregation_and_the_threshold_only_when_distributed():
    from fedfilter.cli.demo_report import guarantee_text

    dist = guarantee_text(_args("--clients", "6", "--placement", "distributed"))
    assert "SecAgg+" in dist and ">= 3 reports" in dist and "rdp filter" in dist
    # Both guarantees, each with what it trusts: the main one trusts SecAgg+ and genuine
    # peers, the worst-case one (min_reports x the budget, enforced by each device) nothing.
    assert "against a coordinator that may lie about SecAgg+ rounds" in dist
    assert "(worst_case_epsilon = 3 x budget_epsilon, 1e-05)-DP against any coordinator" in dist
    local = guarantee_text(_args("--clients", "6"))
    assert "SecAgg+" not in local and "local Gaussian noise" in local


# --- slow: a small distributed demo through SecAgg+ ----------------------------------------------
N, ROUNDS = 5, 2


@pytest.fixture(scope="module")
def distributed_demo(tmp_path_factory):
    from fedfilter.cli import main

    out = tmp_path_factory.mktemp("demo-distributed")
    argv = ["demo", "--placement", "distributed", "--clients", str(N), "--rounds", str(ROUNDS), "--out", str(out)]
    assert main(argv) == 0
    return out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distributed_demo_runs_through_secagg_and_keeps_every_device_within_budget(distributed_demo):
    from fedfilter.client.ledger.budget import BudgetLedger

    out = distributed_demo
    summary = json.loads((out / "summary.json").read_text())
    assert summary["placement"] == "distributed" and summary["secure_aggregation"] is True
    assert summary["settings"]["placement"] == "distributed" and summary["settings"]["filter"] == "rdp"
    assert summary["settings"]["min_reports"] == math.ceil(N / 2)
    assert summary["rounds_completed"] == ROUNDS
    assert summary["released_rounds"] > 0 and summary["released_rounds"] == sum(summary["released_per_round"])
    assert isinstance(summary["final_accuracy"], float) and 0 <= summary["final_accuracy"] <= 1
    assert "SecAgg+" in summary["guarantee"]
    assert len(summary["clients"]) == N
    put_in = [0.0] * ROUNDS  # the norms the devices put in, per round, read here from their ledgers
    for index, client in enumerate(summary["clients"]):
        assert 0 < client["spent_epsilon"] <= client["budget_epsilon"]
        assert client["worst_case_epsilon"] >= math.ceil(N / 2) * client["budget_epsilon"] * (1 - 1e-12)
        assert 0 < client["worst_case_spent_epsilon"] <= client["worst_case_epsilon"]
        ledger = BudgetLedger.open(out / "devices" / str(index))
        try:
            assert ledger.enrolment.filter_kind == "rdp"
            assert bool(ledger.filter.within_budget(ledger.recomputed_state()))
            records = ledger.records(summary["run_id"])
            assert [r.round_id for r in records] == list(range(1, ROUNDS + 1))
            assert {r.placement for r in records} == {"distributed"}
            for r in records:
                put_in[r.round_id - 1] += r.sensitivity if r.status == "contributed" else 0.0
        finally:
            ledger.close()
    clip = summary["settings"]["clip"]
    assert summary["clip_share_per_round"] == pytest.approx([p / (N * clip) for p in put_in], rel=1e-12)
    assert all(0 <= share <= 1 for share in summary["clip_share_per_round"])
    assert summary["clip_share_per_round"][0] > 0  # round 1: every device had budget for data
    assert (out / "rounds.png").stat().st_size > 1000


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_distributed_demo_public_ledger_holds_released_sums_only(distributed_demo):
    from fedfilter.coordinator.public_ledger import PublicLedger, looks_per_client

    out = distributed_demo
    summary = json.loads((out / "summary.json").read_text())
    with PublicLedger(summary["public_ledger"], read_only=True) as ledger:
        run = [r for r in ledger.runs() if r.run_id == summary["run_id"]][0]
        config = json.loads(run.config_json)
        records = ledger.records(summary["run_id"])
    assert config["placement"] == "distributed" and config["min-reports"] == math.ceil(N / 2)
    assert not [k for k in config if looks_per_client(k)]
    assert [bool(r.released) for r in records] == summary["released_per_round"]
    for rec in records:
        assert rec.clients_sampled == N
        if rec.released:  # released only from at least the threshold's reports
            assert rec.reports_received >= math.ceil(N / 2) and math.isfinite(rec.aggregate_norm)
        else:
            assert rec.aggregate_norm == 0
