"""The coordinator's public ledger: SQLite, WAL, append-only, public facts only."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from helpers.reports import make_record

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.protos import fedfilter_pb2


@pytest.fixture()
def ledger(tmp_path: Path):
    with PublicLedger(tmp_path / "ledger.sqlite") as ledger:
        yield ledger


def test_round_trip(ledger: PublicLedger, tmp_path: Path) -> None:
    ledger.start_run("run-a", {"rounds": 3, "task": "digits", "strategy": {"lr": 1.0}})
    written = [make_record("run-a", r) for r in (1, 2, 3)]
    for record in written:
        ledger.append(record)
    assert ledger.records("run-a") == written
    assert ledger.records_after("run-a", 1) == written[1:]
    assert ledger.records_after("run-a", 3) == []
    assert not ledger.is_finished("run-a")
    ledger.finish_run("run-a")
    assert ledger.is_finished("run-a")
    ledger.finish_run("run-a")  # idempotent

    (run,) = ledger.runs()
    assert run.run_id == "run-a" and run.finished_at_unix >= run.created_at_unix > 0
    assert json.loads(run.config_json) == {"rounds": 3, "task": "digits", "strategy": {"lr": 1.0}}

    # The queryable columns agree with the stored proto.
    conn = sqlite3.connect(tmp_path / "ledger.sqlite")
    rows = conn.execute(
        "SELECT round_id, reports_received, markers_received, replies_dropped, released "
        "FROM records WHERE run_id = 'run-a' ORDER BY round_id"
    ).fetchall()
    conn.close()
    assert rows == [(r, 8, 1, 1, 1) for r in (1, 2, 3)]


def test_wal_mode_and_reopen(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.sqlite"
    with PublicLedger(path) as ledger:
        ledger.start_run("r", {})
        ledger.append(make_record("r", 1))
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.close()
    with PublicLedger(path) as again:  # reopening keeps everything
        assert [r.round_id for r in again.records("r")] == [1]
        again.append(make_record("r", 2))


def test_duplicate_and_out_of_order_rounds_refused(ledger: PublicLedger) -> None:
    ledger.start_run("r", {})
    ledger.append(make_record("r", 1))
    ledger.append(make_record("r", 5))
    with pytest.raises(ValueError, match=r"duplicate record: round_id 5 of run_id 'r'"):
        ledger.append(make_record("r", 5))
    with pytest.raises(ValueError, match=r"duplicate record: round_id 1"):
        ledger.append(make_record("r", 1))
    with pytest.raises(ValueError, match=r"out-of-order record: round_id 3"):
        ledger.append(make_record("r", 3))
    assert [r.round_id for r in ledger.records("r")] == [1, 5]


def test_run_lifecycle_errors(ledger: PublicLedger) -> None:
    with pytest.raises(ValueError, match=r"run_id 'nope' was never started"):
        ledger.append(make_record("nope", 1))
    ledger.start_run("r", {})
    with pytest.raises(ValueError, match=r"run_id 'r' already exists"):
        ledger.start_run("r", {})
    ledger.finish_run("r")
    with pytest.raises(ValueError, match=r"run_id 'r' is finished"):
        ledger.append(make_record("r", 1))
    with pytest.raises(ValueError, match=r"unknown run_id 'x'"):
        ledger.finish_run("x")
    with pytest.raises(ValueError, match=r"unknown run_id 'x'"):
        ledger.records("x")
    with pytest.raises(ValueError, match=r"unknown run_id 'x'"):
        ledger.is_finished("x")
    with pytest.raises(ValueError, match=r"run_id must be a non-empty string"):
        ledger.start_run("", {})


@pytest.mark.parametrize(
    "config, key",
    [
        ({"client_budgets": [1.0, 2.0]}, "client_budgets"),
        ({"target_epsilon": 8.0}, "target_epsilon"),
        ({"clients": [{"node_id": 3}]}, "node_id"),
        ({"data": {"num_examples": 600}}, "num_examples"),
        ({"eps_spent": 0.1}, "eps_spent"),
        ({"clientId": "a"}, "clientId"),
    ],
)
def test_per_client_config_keys_refused(ledger: PublicLedger, config: dict, key: str) -> None:
    with pytest.raises(ValueError, match=rf"config key .*'{key}' looks per-client"):
        ledger.start_run("r", config)
    assert ledger.runs() == []


def test_config_must_be_plain_json(ledger: PublicLedger) -> None:
    with pytest.raises(ValueError, match=r"not plain JSON"):
        ledger.start_run("r", {"sigma": float("nan")})
    with pytest.raises(ValueError, match=r"not plain JSON"):
        ledger.start_run("r", {"path": Path("/x")})


@pytest.mark.parametrize(
    "overrides, message",
    [
        ({"reports_received": 11}, r"exceeds clients_sampled 10"),
        ({"aggregate_norm": float("nan")}, r"aggregate_norm must be finite"),
        ({"released": False}, r"aggregate_norm 3.25 given for a round that was not released"),
        ({"wall_time_s": -1.0}, r"wall_time_s must be finite and >= 0, got -1.0"),
        (
            {"request": fedfilter_pb2.RoundRequest(run_id="r", round_id=2)},
            r"request.round_id 2 differs from round_id 1",
        ),
        (
            {"request": fedfilter_pb2.RoundRequest(run_id="q", round_id=1)},
            r"request.run_id 'q' differs from run_id 'r'",
        ),
    ],
)
def test_inconsistent_records_refused(ledger: PublicLedger, overrides: dict, message: str) -> None:
    ledger.start_run("r", {})
    with pytest.raises(ValueError, match=message):
        ledger.append(make_record("r", 1, **overrides))
    assert ledger.records("r") == []


def test_distributed_round_below_min_reports_cannot_be_released(ledger: PublicLedger) -> None:
    ledger.start_run("r", {"placement": "distributed"})
    request = fedfilter_pb2.RoundRequest(
        run_id="r",
        round_id=1,
        noise_multiplier=1.0,
        clip=1.0,
        placement=fedfilter_pb2.DISTRIBUTED,
        min_reports=9,
    )
    with pytest.raises(ValueError, match=r"reports_received 8 < request.min_reports 9"):
        ledger.append(make_record("r", 1, request=request))
    dropped = make_record("r", 1, request=request, released=False, aggregate_norm=0.0)
    ledger.append(dropped)
    assert ledger.records("r") == [dropped]


def test_per_client_metric_refused(ledger: PublicLedger) -> None:
    ledger.start_run("r", {})
    record = make_record("r", 1)
    record.metrics["mean_budget_left"] = 0.3
    with pytest.raises(ValueError, match=r"metrics key 'mean_budget_left' looks per-client"):
        ledger.append(record)


def test_read_only_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    with pytest.raises(FileNotFoundError):
        PublicLedger(path, read_only=True)
    sqlite3.connect(path).close()  # exists, but no schema yet: reads as empty
    with PublicLedger(path, read_only=True) as early:
        assert early.runs() == [] and not early.has_run("r")
        writer = PublicLedger(path)
        writer.start_run("r", {})
        writer.append(make_record("r", 1))
        assert [r.round_id for r in early.records("r")] == [1]  # sees the writer's rows
        with pytest.raises(PermissionError, match="read-only"):
            early.append(make_record("r", 2))
        writer.close()
    # Reopened after the writer has gone: still readable, still read-only.
    with PublicLedger(path, read_only=True) as late:
        assert [r.round_id for r in late.records("r")] == [1]


def test_reader_in_another_process_while_writing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    writer = PublicLedger(path)
    writer.start_run("r", {})
    stop = threading.Event()
    errors: list[BaseException] = []

    def write() -> None:
        try:
            for round_id in range(1, 200):
                if stop.is_set():
                    return
                writer.append(make_record("r", round_id))
        except BaseException as err:  # pragma: no cover - reported below
            errors.append(err)

    thread = threading.Thread(target=write)
    thread.start()
    reader = (
        "import sys\n"
        "from fedfilter.coordinator.public_ledger import PublicLedger\n"
        "ledger = PublicLedger(sys.argv[1], read_only=True)\n"
        "seen = [len(ledger.records('r')) for _ in range(20)]\n"
        "assert seen == sorted(seen), seen\n"
        "print(seen[-1])\n"
    )
    try:
        out = subprocess.run(
            [sys.executable, "-c", reader, str(path)],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        )
    finally:
        stop.set()
        thread.join(10)
    writer.close()
    assert not errors, errors
    assert int(out.stdout.strip()) >= 0
