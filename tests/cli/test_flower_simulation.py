"""End-to-end tests on Flower's Simulation Engine (Ray on 127.0.0.1): slow, three simulations.

1. A probe coordinator (a ServerApp written here, which keeps every reply it gets) drives the
   built-in ClientApp (``fedfilter.app.client_app:app``, its device settings from the file that
   FEDFILTER_DEVICE_SETTINGS names, as under ``flwr run``) on 10 simulated devices with mixed
   budgets and after-exhaustion modes for 4 rounds, then sends malicious requests: too little
   noise, NaN, a replayed round id.
2. The same devices in a new run (new Flower run, same ledger directories): spends carry over.
3. ``fedfilter demo`` with 10 clients x 3 rounds through ``flwr run`` and its own simulation
   SuperLink: summary, plot, public ledger, and no process of it left afterwards.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only (before Ray starts)

pytestmark = pytest.mark.slow

N = 10
Z, CLIP = 1.0, 0.5
NOISE_ONLY_SMALL = (0, 1, 2, 3)  # tiny budget, noise-only: exhausted during round 1 or 2
LEAVE_SMALL = (4, 5, 6)  # tiny budget, leave mode
BACKEND = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}}


def _devices(root):
    from fedfilter.client.settings.node_config import enrol_device

    table = {}
    for i in range(N):
        small = i in NOISE_ONLY_SMALL or i in LEAVE_SMALL
        table[i] = {
            "ledger-dir": str(root / "devices" / str(i)),
            "client-id": f"client-{i}",
            "budget-epsilon": 0.3 if small else 50.0,
            "budget-delta": 1e-5,
            "after-exhaustion": "leave" if i in LEAVE_SMALL else "noise-only",
            "reply-hold-s": 0,
        }  # timing protection off: one Ray actor serves many nodes
        enrol_device(table[i])  # the owner's act, up front: the mod never enrols
    return table


def _probe_server(captured: dict, run_id: str, rounds: int, malicious: bool):
    """A ServerApp that keeps every reply (for the test only; the real one keeps none)."""
    from flwr.serverapp import ServerApp
    from harness.probe_coordinator import FilteredMeanStrategy

    from fedfilter.protocol.wire import STATUS_RECORD

    app = ServerApp()

    def summarise(reply):
        if reply.has_error():
            return {"error": reply.error.reason}
        content = reply.content
        arrays = [a for rec in content.array_records.values() for a in rec.to_numpy_ndarrays()]
        return {
            "status": content[STATUS_RECORD]["status"],
            "keys": sorted(content.keys()),
            "metrics": len(content.metric_records),
            "arrays": arrays,
        }

    @app.main()
    def main(grid, context):
        import torch

        from fedfilter.simulations.tasks.models import DigitsMLP
        from fedfilter.simulations.tasks.training import get_weights

        deadline = time.monotonic() + 60
        while len(list(grid.get_node_ids())) < N and time.monotonic() < deadline:
            time.sleep(0.2)
        nodes = sorted(grid.get_node_ids())
        torch.manual_seed(0)
        model = DigitsMLP()
        keys, weights = list(model.state_dict().keys()), get_weights(model)
        captured["template"] = [(w.dtype, w.shape) for w in weights]
        strategy = FilteredMeanStrategy(noise_multiplier=Z, clip=CLIP, ttl_s=600)
        config = {"task": "digits", "num-clients": N, "local-epochs": 1, "lr": 0.1}
        for r in range(1, rounds + 1):
            spec = strategy.spec(run_id, r)
            replies = list(
                grid.send_and_receive(
                    strategy.train_messages(spec, nodes, keys, weights, {**config, "server-round": r}), timeout=120
                )
            )
            captured.setdefault("rounds", []).append([summarise(m) for m in replies])
            tally = strategy.tally(replies, nodes, keys, weights)
            captured.setdefault("tallies", []).append((len(tally.reports), tally.markers, tally.dropped))
            weights, _ = strategy.step(weights, tally)
        if not malicious:
            return
        good = strategy.spec(run_id, rounds + 1)
        attacks = {
            "tiny noise": replace(good, noise_multiplier=1e-9),
            "nan noise": replace(good, noise_multiplier=float("nan")),
            "nan clip": replace(good, clip=float("nan")),
            "replay": strategy.spec(run_id, 1),
        }
        for name, spec in attacks.items():
            messages = strategy.train_messages(spec, nodes, keys, weights, config)
            captured.setdefault("attacks", {})[name] = [
                summarise(m) for m in grid.send_and_receive(messages, timeout=120)
            ]

    return app


def _simulate(server_app):
    """The probe coordinator against the built-in ClientApp as ``flwr run`` loads it (no simulated
    device mod): each Ray worker finds its device through FEDFILTER_DEVICE_SETTINGS, inherited."""
    from flwr.simulation import run_simulation

    from fedfilter.app.client_app import app

    run_simulation(server_app=server_app, client_app=app, num_supernodes=N, backend_config=BACKEND)


def _ledgers(devices):
    from fedfilter.client.ledger.budget import BudgetLedger

    out = {}
    for i, cfg in devices.items():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        out[i] = {
            "records": ledger.records(),
            "spent": ledger.spent_epsilon(),
            "within": bool(ledger.filter.within_budget(ledger.state())),
            "budget": ledger.enrolment.epsilon,
        }
        ledger.close()
    return out


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    from fedfilter.client.settings.simulated import ENV_VAR, write_device_settings

    root = tmp_path_factory.mktemp("probe")
    devices = _devices(root)
    settings_file = write_device_settings(root / "device-settings.json", devices)
    first, second = {}, {}
    started = time.monotonic()
    with pytest.MonkeyPatch.context() as env:
        env.setenv(ENV_VAR, str(settings_file))  # before Ray starts: its workers inherit it
        _simulate(_probe_server(first, "probe-1", rounds=4, malicious=True))
        after_first = _ledgers(devices)
        _simulate(_probe_server(second, "probe-2", rounds=1, malicious=False))
    after_second = _ledgers(devices)
    return {
        "first": first,
        "second": second,
        "ledgers1": after_first,
        "ledgers2": after_second,
        "wall": time.monotonic() - started,
    }


def test_every_round_gets_a_reply_from_every_node(probe):
    rounds = probe["first"]["rounds"]
    assert len(rounds) == 4
    assert all(len(replies) == N for replies in rounds)
    assert not any("error" in r for replies in rounds for r in replies)


def test_replies_carry_only_the_noisy_update_and_a_status(probe):
    template = probe["first"]["template"]
    for replies in probe["first"]["rounds"]:
        for r in replies:
            assert r["metrics"] == 0  # num-examples dropped
            if r["status"] == "report":
                assert r["keys"] == ["arrays", "fedfilter.status"]
                assert [(a.dtype, a.shape) for a in r["arrays"]] == template
            else:
                assert r["status"] == "left" and r["keys"] == ["fedfilter.status"] and r["arrays"] == []


def test_exhausted_noise_only_devices_keep_sending_pure_noise_reports(probe):
    ledgers = probe["ledgers1"]
    for i in NOISE_ONLY_SMALL:
        statuses = [rec.status for rec in ledgers[i]["records"]]
        assert statuses[0] == "contributed" and statuses[-1] == "noise-only", statuses
        assert ledgers[i]["records"][-1].sensitivity == 0.0
    last = probe["first"]["rounds"][-1]
    reports = [r for r in last if r["status"] == "report"]
    assert len(reports) == N - len(LEAVE_SMALL)  # the 4 exhausted noise-only devices included
    for r in reports:  # every report, data or not, carries noise of std z * C
        flat = np.concatenate([a.ravel().astype(np.float64) for a in r["arrays"]])
        assert abs(flat.std() / (Z * CLIP) - 1) < 0.1


def test_exhausted_leave_devices_send_the_left_marker(probe):
    ledgers = probe["ledgers1"]
    for i in LEAVE_SMALL:
        assert ledgers[i]["records"][-1].status == "left"
    last = probe["first"]["rounds"][-1]
    assert sum(r["status"] == "left" for r in last) == len(LEAVE_SMALL)
    assert probe["first"]["tallies"][-1] == (N - len(LEAVE_SMALL), len(LEAVE_SMALL), 0)


def test_malicious_requests_get_error_replies_and_spend_nothing(probe):
    attacks = probe["first"]["attacks"]
    words = {"tiny noise": "noise_multiplier", "nan noise": "nan", "nan clip": "clip", "replay": "already"}
    for name, replies in attacks.items():
        assert len(replies) == N, name
        assert all("error" in r and words[name] in r["error"] for r in replies), (name, replies[:1])
    for _i, led in probe["ledgers1"].items():
        assert [rec.round_id for rec in led["records"]] == [1, 2, 3, 4]  # nothing after the attacks


def test_no_device_ever_spends_beyond_its_budget(probe):
    for which in ("ledgers1", "ledgers2"):
        for i, led in probe[which].items():
            assert led["within"], (which, i)
            assert led["spent"] <= led["budget"] * (1 + 1e-12), (which, i)


def test_a_restarted_device_keeps_its_spent_budget(probe):
    for i in range(N):
        before, after = probe["ledgers1"][i], probe["ledgers2"][i]
        assert [r.run_id for r in after["records"]] == ["probe-1"] * 4 + ["probe-2"]
        assert after["spent"] >= before["spent"]
        status = after["records"][-1].status
        if i in NOISE_ONLY_SMALL:
            assert status == "noise-only"
        elif i in LEAVE_SMALL:
            assert status == "left"
        else:
            assert status == "contributed"
    last = probe["second"]["rounds"][-1]
    assert sum(r.get("status") == "left" for r in last) == len(LEAVE_SMALL)


# --- the demo -------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from fedfilter.cli import main

    out = tmp_path_factory.mktemp("demo")
    started = time.monotonic()
    assert main(["demo", "--clients", str(N), "--rounds", "3", "--out", str(out)]) == 0
    return out, time.monotonic() - started


def _processes_inside(folder, settle_s: float = 15.0) -> list[str]:
    """Live processes whose working directory is under ``folder`` (Linux /proc), as ``pid: cmdline``.

    Waits up to ``settle_s`` for processes that were already killed to finish exiting (on a loaded
    machine that takes a moment); whatever is still there then is a leak.
    """
    deadline = time.monotonic() + settle_s
    while True:
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cwd = os.readlink(f"/proc/{entry}/cwd")
                with open(f"/proc/{entry}/stat") as handle:
                    state = handle.read().rsplit(")", 1)[1].split()[0]
                with open(f"/proc/{entry}/cmdline", "rb") as handle:
                    cmdline = handle.read().replace(b"\0", b" ").decode(errors="replace")[:160]
            except OSError:
                continue
            if state != "Z" and (cwd == str(folder) or cwd.startswith(str(folder) + os.sep)):
                found.append(f"{entry}: {cmdline}")
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.5)


def test_demo_runs_through_flwr_run_and_stops_every_process_it_started(demo):
    out, _ = demo
    logs = out / "flower" / "logs"
    superlink = (logs / "superlink.log").read_text()
    assert "Starting the SuperLink Control HTTP API on 127.0.0.1:" in superlink  # loopback only
    run_log = (logs / "flwr-run.log").read_text()
    assert "Successfully started run" in run_log and f"({N} simulated SuperNodes)" in run_log
    assert _processes_inside(out) == []
    # The devices' settings reached every Ray worker: each device spent from its own ledger.
    settings = json.loads((out / "device-settings.json").read_text())
    assert sorted(int(k) for k in settings) == list(range(N))
    assert (out / "device-settings.json").stat().st_mode & 0o077 == 0


def test_demo_summary_every_client_within_its_budget(demo):
    out, wall = demo
    summary = json.loads((out / "summary.json").read_text())
    assert summary["rounds_completed"] == 3
    assert isinstance(summary["final_accuracy"], float) and 0 <= summary["final_accuracy"] <= 1
    assert len(summary["clients"]) == N
    for c in summary["clients"]:
        assert set(c) == {
            "client_id",
            "budget_epsilon",
            "spent_epsilon",
            "odometer_epsilon",
            "worst_case_epsilon",
            "worst_case_spent_epsilon",
            "exhausted_round",
        }
        assert c["worst_case_epsilon"] is None  # local placement: no worst-case budget needed (none enrolled)
        assert 0 < c["spent_epsilon"] <= c["budget_epsilon"]
        assert c["odometer_epsilon"] >= c["spent_epsilon"]  # valid at any moment, so never below the readout
        assert c["exhausted_round"] is None or 1 <= c["exhausted_round"] <= 3
    assert (out / "rounds.png").stat().st_size > 1000
    assert wall < 120
    # The demo runs without the reply hold (fast), and says so where a reader looks.
    assert summary["timing_protection"].startswith("off") and summary["settings"]["reply_hold_s"] == 0
    assert "timing is not covered" in summary["guarantee"]
    assert "valid at every moment" in summary["odometer"] and "not a guarantee" in summary["odometer"]


def test_public_ledger_has_no_per_client_budget_or_example_count(demo):
    from fedfilter.coordinator.public_ledger import PublicLedger, looks_per_client
    from fedfilter.protos import fedfilter_pb2

    out, _ = demo
    summary = json.loads((out / "summary.json").read_text())
    budgets = {c["budget_epsilon"] for c in summary["clients"]}
    for message in (fedfilter_pb2.PublicRoundRecord, fedfilter_pb2.RoundRequest):
        assert not [f.name for f in message.DESCRIPTOR.fields if looks_per_client(f.name)]
    with PublicLedger(summary["public_ledger"], read_only=True) as ledger:
        run = [r for r in ledger.runs() if r.run_id == summary["run_id"]][0]
        config = json.loads(run.config_json)
        records = ledger.records(summary["run_id"])
    assert not [k for k in config if looks_per_client(k)]
    assert not budgets & {v for v in config.values() if isinstance(v, float)}
    assert len(records) == 3
    for rec in records:
        assert set(rec.metrics) == {"accuracy", "loss"}
        assert rec.clients_sampled == N and rec.reports_received + rec.markers_received <= N
        assert math.isfinite(rec.aggregate_norm)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_demo_stops_every_process_it_started(tmp_path, sig):
    out = tmp_path / "demo"
    demo = subprocess.Popen(
        [sys.executable, "-m", "fedfilter", "demo", "--clients", "3", "--rounds", "50", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as at a terminal
    )
    run_log = out / "flower" / "logs" / "flwr-run.log"
    try:
        deadline = time.monotonic() + 120
        while not (run_log.exists() and "Starting Flower Simulation" in run_log.read_text()):
            assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read() if demo.poll() else ""
            time.sleep(0.5)
        assert len(_processes_inside(out, settle_s=0)) >= 3  # SuperLink, SuperExec, flwr run, flwr-simulation...
        demo.send_signal(sig)
        output, _ = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 130, output
    assert "every process it started was stopped" in output
    assert _processes_inside(out) == []
