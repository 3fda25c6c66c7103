"""A tiny dropout study end to end through the CLI: results.json, report.md, plots, and what they say."""

import json
import subprocess
import sys

import pytest
from helpers.tiny_study import TINY_STUDY

from fedfilter.privacy.filters import make_filter


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    out = tmp_path_factory.mktemp("study")
    cfg = out / "tiny.toml"
    cfg.write_text(TINY_STUDY)
    proc = subprocess.run(
        [sys.executable, "-m", "fedfilter", "study", "dropout", "--config", str(cfg), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return out, json.loads((out / "results.json").read_text()), proc.stderr


def test_results_json_has_the_documented_keys(study):
    out, results, stderr = study
    assert len(results["runs"]) == 2
    for run in results["runs"]:
        assert isinstance(run["label"], str) and run["label"]
        c, a = run["contributing_per_round"], run["accuracy_per_round"]
        assert len(c) == len(a) == run["rounds"] == 4
        assert all(isinstance(x, int) for x in c)
        assert all(isinstance(x, float) for x in a)
        for key in ("reports_seen_per_round", "sampled_per_round", "with_budget_per_round", "released_per_round"):
            assert len(run[key]) == 4
        assert set(run["groups"]["per_group"]) == set(run["groups"]["names"])
    assert "round" in stderr  # the tqdm bar


def test_clients_drop_out_and_modes_differ_in_what_the_coordinator_sees(study):
    _, results, _ = study
    by_mode = {(r["settings"]["after_exhaustion"], r["settings"]["noise"]): r for r in results["runs"]}
    for (after, _noise), run in by_mode.items():
        c, seen, asked = run["contributing_per_round"], run["reports_seen_per_round"], run["sampled_per_round"]
        assert c[-1] < c[0], f"no client ran out in {run['label']}"
        assert c[-1] > 0  # the x40 clients are still in
        if after == "noise-only":
            assert seen == asked  # exhaustion is invisible to the coordinator
        else:
            assert seen == c  # a departed client sends a marker, not a report
            assert [s + l for s, l in zip(seen, run["left_per_round"])] == asked
    # distributed + leave: a round is released only when SecAgg+ unmasks it: at least min_reports (2)
    # reports, and more than half of the clients asked, since devices require a threshold above half of
    # their neighbourhood (Flower's full graph here, every asked client a neighbour)
    run = by_mode[("leave", "distributed")]
    seen, asked = run["reports_seen_per_round"], run["sampled_per_round"]
    assert run["released_per_round"] == [s >= max(2, a // 2 + 1) for s, a in zip(seen, asked)]


def test_no_client_spends_more_than_its_budget(study):
    _, results, _ = study
    for run in results["runs"]:
        ex = run["exhaustion"]
        assert ex["all_within_budget"] is True
        assert ex["max_spent_fraction"] <= 1.0
        # epsilon spent is reported rounded up, so a client at its budget may read a few ulps above
        assert ex["max_spent_epsilon_over_budget"] <= 1.0 + 1e-12
        assert ex["clients_exhausted"] > 0
        # the budgets echoed are the stated two-level mix at level 0.5
        assert set(run["budget"]["epsilon_per_client"]) <= {0.5, 20.0}
        assert run["budget"]["distribution"] == "epsilon_i = 0.5 x two-level(1 w.p. 0.75, 40 w.p. 0.25)"
        # ground truth "with budget" agrees with the filters: a client with budget 0.5 has at most a
        # fraction of one full-norm round (mu_B < 1 at z = 1), so it is out after its first round
        small = make_filter("rdp", 0.5, 1e-5)
        assert small.allowance(small.initial_state(), noise_std=1.0) < 1.0
        n_small = sum(e == 0.5 for e in run["budget"]["epsilon_per_client"])
        assert run["with_budget_per_round"][-1] <= run["num_clients"] - n_small


def test_report_and_plots_are_written(study):
    out, results, _ = study
    report = (out / "report.md").read_text()
    for png in ("contributing.png", "accuracy.png", "groups_d.png", "disparity.png"):
        assert (out / png).stat().st_size > 5000
        assert f"]({png})" in report
    assert "epsilon_i = 0.5 x two-level(1 w.p. 0.75, 40 w.p. 0.25)" in report
    assert 'name = "tiny"' in report  # the config echoed verbatim
    assert "Disparate Impact" in report
    assert report.count("<details>") == len(results["runs"])


def test_report_can_be_redrawn_from_results_json(study):
    from fedfilter.cli import main

    out, _, _ = study
    (out / "report.md").unlink()
    assert main(["study", "report", "--out", str(out)]) == 0
    assert "## Runs" in (out / "report.md").read_text()
