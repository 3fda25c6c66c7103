"""Study files for distributed runs on SecAgg+'s graph: per-data min_reports, the graph settings,
the graph in each run's record, and resuming an interrupted study."""

from __future__ import annotations

import json

import pytest
from helpers.tiny_study import TINY_STUDY

from fedfilter.protocol.secagg.graph import choose_graph
from fedfilter.simulations.study import runner
from fedfilter.simulations.study.config import StudyConfigError, parse_study

SPARSE = (
    TINY_STUDY.replace('after_exhaustion = ["noise-only", "leave"]', 'after_exhaustion = ["noise-only"]')
    .replace("num_clients = 12", "num_clients = 12\nmin_reports = 6")
    .replace("min_reports = 2\n", 'min_reports = 2\nsecagg_graph = "sparse"\nsecagg_dropout_rate = 0.1\n')
    .replace("rounds = 4", "rounds = 2")
)


def test_min_reports_per_data_set_and_graph_settings_are_read():
    study = parse_study(SPARSE)
    assert study.data["d"].min_reports == 6
    assert study.federation["secagg_graph"] == "sparse"
    assert study.federation["secagg_dropout_rate"] == 0.1


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (("min_reports = 6", "min_reports = 13"), "data.d.min_reports = 13 exceeds the 12 clients asked"),
        (("min_reports = 6", "min_reports = 1"), "data.d.min_reports must be >= 2"),
        (('secagg_graph = "sparse"', 'secagg_graph = "ring"'), "federation.secagg_graph must be one of full, sparse"),
        (("secagg_dropout_rate = 0.1", "secagg_dropout_rate = 1.5"), "federation.secagg_dropout_rate"),
        (("secagg_dropout_rate = 0.1", "secagg_colluders = -1"), "federation.secagg_colluders"),
    ],
)
def test_bad_settings_name_the_key(edit, message):
    with pytest.raises(StudyConfigError, match=message):
        parse_study(SPARSE.replace(*edit))


def test_a_resumed_study_keeps_finished_runs_and_records_the_graph(tmp_path, monkeypatch):
    study = parse_study(SPARSE)
    first = runner.run_study(study, tmp_path, progress=False)
    (run,) = first["runs"]
    assert run["secagg_graph"] == choose_graph(12, min_reports=6, dropout_rate=0.1).__dict__
    assert "max_honest_coordinator_delta" not in run  # no graph failure term: the devices' rule is deterministic

    def no_run(*args, **kwargs):
        raise AssertionError("a finished run was run again")

    monkeypatch.setattr(runner, "run_one", no_run)
    again = runner.run_study(study, tmp_path, progress=False, resume=True)
    assert again["runs"] == json.loads((tmp_path / "results.json").read_text())["runs"] == first["runs"]
    # another study file in the same folder starts afresh
    other = parse_study(SPARSE.replace("lr = 0.5", "lr = 0.4"))
    with pytest.raises(AssertionError, match="run again"):
        runner.run_study(other, tmp_path, progress=False, resume=True)
