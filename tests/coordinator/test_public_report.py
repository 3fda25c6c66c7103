"""Readable views of the public ledger: one line per round, and the newest new run's summary."""

from __future__ import annotations

import math

from helpers.reports import make_record  # the same record the ledger tests write

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.public_report import format_record, public_run_ids, public_summary


def test_a_round_line_shows_the_public_counts_and_accuracy():
    line = format_record(make_record("run-a", 3, reports_received=7, markers_received=2, released=False))
    assert line.split() == ("round 3 reports 7 markers 2 dropped 1 released no accuracy 0.5300 wall 0.50 s".split())


def test_a_round_line_survives_non_finite_values_and_other_accuracy_names():
    record = make_record("run-a", 1, wall_time_s=math.inf)
    del record.metrics["accuracy"]
    record.metrics["val_accuracy"] = math.nan
    assert "accuracy    nan" in format_record(record) and "wall inf s" in format_record(record)


def test_summary_is_of_the_newest_run_not_seen_before(tmp_path):
    path = tmp_path / "ledger.sqlite"
    assert public_run_ids(path) == [] and public_summary(path)["run_id"] is None
    with PublicLedger(path) as ledger:
        for run_id, rounds in (("old", 3), ("new", 2)):
            ledger.start_run(run_id, {"rounds": rounds})
            for r in range(1, rounds + 1):
                ledger.append(make_record(run_id, r))
    assert public_run_ids(path) == ["old", "new"]
    assert public_summary(path) == {"run_id": "new", "rounds_completed": 2, "final_accuracy": 0.52}
    assert public_summary(path, old_runs=["new"])["run_id"] == "old"
    assert public_summary(path, old_runs=["old", "new"]) == {
        "run_id": None,
        "rounds_completed": 0,
        "final_accuracy": None,
    }
