"""The report service over a real gRPC server on 127.0.0.1, and `fedfilter reports` as processes."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import pytest
from helpers.reports import make_record

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.report_service import start_server, watch
from fedfilter.protos import fedfilter_pb2, fedfilter_pb2_grpc

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def ledger_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.sqlite"


@pytest.fixture()
def server(ledger_path: Path):
    server, port = start_server(ledger_path, 0, poll_interval_s=0.05, run_wait_s=3.0)
    yield f"127.0.0.1:{port}"
    server.stop(grace=None).wait(5)


def write_rounds(
    ledger: PublicLedger, run_id: str, rounds: range, delay_s: float, finish: bool = True
) -> threading.Thread:
    def run() -> None:
        for round_id in rounds:
            time.sleep(delay_s)
            ledger.append(make_record(run_id, round_id))
        if finish:
            ledger.finish_run(run_id)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_watch_follows_a_live_run_until_finished(ledger_path: Path, server: str) -> None:
    ledger = PublicLedger(ledger_path)
    ledger.start_run("live", {"rounds": 12})
    ledger.append(make_record("live", 1))
    writer = write_rounds(ledger, "live", range(2, 13), delay_s=0.03)
    started = time.monotonic()
    got = [r.round_id for r in watch(server, "live", timeout_s=15)]
    writer.join(5)
    assert got == list(range(1, 13))  # every round, in order, then the stream ended
    assert time.monotonic() - started < 10

    stub = fedfilter_pb2_grpc.ReportServiceStub(grpc.insecure_channel(server))
    records = stub.GetRecords(fedfilter_pb2.GetRecordsRequest(run_id="live"), timeout=5).records
    assert list(records) == ledger.records("live")
    assert [r.round_id for r in watch(server, "live", from_round=10, timeout_s=5)] == [10, 11, 12]
    ledger.close()


def test_run_that_does_not_exist_yet(ledger_path: Path, server: str) -> None:
    # The server started before the ledger file existed; the stream waits for the run.
    received: list[int] = []
    reader = threading.Thread(target=lambda: received.extend(r.round_id for r in watch(server, "later", timeout_s=10)))
    reader.start()
    time.sleep(0.3)
    assert not ledger_path.exists() and reader.is_alive()
    ledger = PublicLedger(ledger_path)
    ledger.start_run("later", {})
    write_rounds(ledger, "later", range(1, 4), delay_s=0.02).join(5)
    reader.join(10)
    assert received == [1, 2, 3]
    ledger.close()


def test_bounded_wait_and_not_found(ledger_path: Path) -> None:
    server, port = start_server(ledger_path, 0, poll_interval_s=0.05, run_wait_s=0.3)
    target = f"127.0.0.1:{port}"
    try:
        with pytest.raises(grpc.RpcError) as err:
            list(watch(target, "never", timeout_s=5))
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        stub = fedfilter_pb2_grpc.ReportServiceStub(grpc.insecure_channel(target))
        with pytest.raises(grpc.RpcError) as err:
            stub.GetRecords(fedfilter_pb2.GetRecordsRequest(run_id="never"), timeout=5)
        assert err.value.code() == grpc.StatusCode.NOT_FOUND
        assert list(stub.ListRuns(fedfilter_pb2.ListRunsRequest(), timeout=5).runs) == []
        with pytest.raises(LookupError):
            next(watch(target, None, wait_s=0.2))
    finally:
        server.stop(None).wait(5)


def test_newest_run_list_runs_and_cancel(ledger_path: Path, server: str) -> None:
    ledger = PublicLedger(ledger_path)
    ledger.start_run("old", {"n": 1})
    ledger.append(make_record("old", 1))
    ledger.finish_run("old")
    ledger.start_run("new", {"n": 2})
    ledger.append(make_record("new", 7))
    stub = fedfilter_pb2_grpc.ReportServiceStub(grpc.insecure_channel(server))
    runs = stub.ListRuns(fedfilter_pb2.ListRunsRequest(), timeout=5).runs
    assert [(r.run_id, json.loads(r.config_json), r.finished_at_unix > 0) for r in runs] == [
        ("old", {"n": 1}, True),
        ("new", {"n": 2}, False),
    ]
    stream = watch(server)  # the newest run, which never finishes: cancelled by closing
    first = next(stream)
    assert (first.run_id, first.round_id) == ("new", 7)
    stream.close()
    ledger.close()


def test_port_in_use_is_an_error(ledger_path: Path) -> None:
    server, port = start_server(ledger_path, 0)
    try:
        with pytest.raises(ValueError, match=f"127.0.0.1:{port}"):
            start_server(ledger_path, port)
    finally:
        server.stop(None).wait(5)


# -- the CLI as real processes ----------------------------------------------------------------

CLI = [sys.executable, "-m", "fedfilter"]


def test_reports_command_is_registered() -> None:
    from fedfilter import cli

    assert "fedfilter.cli.reports" in cli.COMMAND_MODULES


def _lines(stream) -> queue.Queue:
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        with stream:  # closed at the process's end of output
            for line in stream:
                lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    return lines


def _stop(proc: subprocess.Popen) -> int | None:
    try:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
            try:
                return proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(5)
                return None
        return proc.returncode
    finally:
        if proc.stderr is not None:  # stdout, where read, is closed by its reader (_lines)
            proc.stderr.close()


def test_cli_serve_and_watch(ledger_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    ledger = PublicLedger(ledger_path)
    ledger.start_run("cli-run", {"rounds": 6})
    ledger.append(make_record("cli-run", 1))

    serve = subprocess.Popen(
        CLI + ["reports", "serve", "--ledger", str(ledger_path), "--port", "0", "--run-wait", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    procs = [serve]
    try:
        first = _lines(serve.stdout).get(timeout=15)
        match = re.search(r" on (127\.0\.0\.1:\d+) ", first or "")
        assert match, (first, serve.stderr.read() if serve.poll() is not None else "")
        target = match.group(1)

        def start_watch(*extra: str) -> subprocess.Popen:
            proc = subprocess.Popen(
                CLI + ["reports", "watch", "--target", target, *extra],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            procs.append(proc)
            return proc

        as_json = start_watch("--run", "cli-run", "--json")
        as_text = start_watch("--from-round", "2")  # newest run
        time.sleep(0.5)
        write_rounds(ledger, "cli-run", range(2, 7), delay_s=0.05).join(10)

        out, err = as_json.communicate(timeout=15)
        assert as_json.returncode == 0, err
        rows = [json.loads(line) for line in out.splitlines()]
        assert [row["round_id"] for row in rows] == [1, 2, 3, 4, 5, 6]
        assert rows[0]["reports_received"] == 8 and rows[0]["released"] is True
        assert rows[0]["request"]["placement"] == "LOCAL"
        assert rows[0]["metrics"]["accuracy"] == pytest.approx(0.51)

        out, err = as_text.communicate(timeout=15)
        assert as_text.returncode == 0, err
        lines = out.splitlines()
        assert lines[0] == "run cli-run"
        assert [int(line.split()[1]) for line in lines[1:]] == [2, 3, 4, 5, 6]
        assert "reports    8" in lines[1] and "released yes" in lines[1]
        assert "accuracy 0.5200" in lines[1] and "wall 0.50 s" in lines[1]

        missing = start_watch("--run", "no-such-run")
        _, err = missing.communicate(timeout=15)
        assert missing.returncode == 1 and "NOT_FOUND" in err
    finally:
        codes = [_stop(proc) for proc in procs]
        ledger.close()
    assert codes[0] == 0  # serve exits cleanly on SIGTERM
