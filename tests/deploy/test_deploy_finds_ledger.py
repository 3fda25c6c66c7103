"""`deploy-local --app-dir` finds the app's public ledger wherever the app writes it.

An app that passes its own ``public_ledger="public_ledger.db"`` writes it relative to the
ServerApp's working directory (under ``OUT/flwr-home/`` in deploy-local), not at
``OUT/public_ledger.sqlite``: deploy-local used to report ``rounds_completed: 0`` for a completed
round. The strategy's summary names the absolute path and the run; deploy-local follows that line.
Here the strategy runs for real (a fake grid stands in for the transport) from a working directory
elsewhere, its log lines go through ``LedgerProgress`` as ``flwr run --stream`` would show them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from flwr.common.logger import FLOWER_LOGGER  # noqa: E402
from helpers.strategy import FakeGrid, _client, _task_identity, as_record, global_arrays, wrap  # noqa: F401

from fedfilter.coordinator.public_ledger import PublicLedger  # noqa: E402
from fedfilter.coordinator.public_report import public_summary  # noqa: E402
from fedfilter.deploy.command import LedgerProgress  # noqa: E402


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"INFO :      {record.getMessage()}")  # as `flwr run --stream` prints them


def _run_app(workdir: Path, rounds: int, run_name: str) -> list[str]:
    """A run of the wrapper with a relative public_ledger, from ``workdir``; the log lines it printed."""
    handler = _Lines()
    FLOWER_LOGGER.addHandler(handler)
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        strategy = wrap(public_ledger="public_ledger.db", run_name=run_name)
        grid = FakeGrid(nodes=[11, 12, 13], client=_client())
        strategy.start(grid=grid, initial_arrays=as_record(global_arrays()), num_rounds=rounds, timeout=60)
    finally:
        os.chdir(cwd)
        FLOWER_LOGGER.removeHandler(handler)
    return handler.lines


def test_the_ledger_an_app_writes_elsewhere_is_found_and_only_its_run_counts(tmp_path):
    out, workdir = tmp_path / "out", tmp_path / "out" / "flwr-home"
    workdir.mkdir(parents=True)
    _run_app(workdir, rounds=1, run_name="earlier")  # an earlier run in the same ledger
    progress = LedgerProgress(out / "public_ledger.sqlite", echo=lambda line: None)
    shown: list[str] = []
    progress.echo = shown.append
    for line in _run_app(workdir, rounds=2, run_name="this-one"):
        progress.see(line)
    progress.tick()
    assert progress.path == workdir / "public_ledger.db" and progress.run_id == "this-one"
    assert "earlier" in progress.old_runs
    summary = public_summary(progress.path, sorted(progress.old_runs))
    assert summary["run_id"] == "this-one" and summary["rounds_completed"] == 2
    assert len(shown) == 2  # the two rounds of this run, none of the earlier one
    with PublicLedger(progress.path, read_only=True) as ledger:
        assert [run.run_id for run in ledger.runs()] == ["earlier", "this-one"]


def test_a_line_without_a_ledger_changes_nothing(tmp_path):
    progress = LedgerProgress(tmp_path / "public_ledger.sqlite", echo=print)
    for line in ("INFO :      \t│\t├── Public ledger: (none)", "Successfully started run 5", ""):
        progress.see(line)
    assert progress.path == tmp_path / "public_ledger.sqlite" and progress.run_id is None
