"""The built-in ServerApp and ClientApp in distributed placement under Flower's Simulation Engine:
``flwr run`` on a SuperLink on 127.0.0.1, Ray in its own processes, 10 devices, every round through
SecAgg+ (``[secure_aggregation_mod, individual_filter_mod]`` on each device, the coordinator's
``IndividualFilterStrategy`` running Flower's SecAgg+ workflow), with Skellam noise on the grid.
About 25 s on 2 cores (not marked slow: under a minute).
"""

from __future__ import annotations

import json

import pytest

N, ROUNDS, RUN, MIN_REPORTS = 10, 2, "secagg-simulation", 6


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.deploy.command import BUILTIN_APP_DIR
    from fedfilter.deploy.simulation_link import SimulationLink

    root = tmp_path_factory.mktemp("secagg-sim")
    devices = {}
    for i in range(N):
        devices[i] = {
            "ledger-dir": str(root / "devices" / str(i)),
            "client-id": f"client-{i}",
            "budget-epsilon": 20.0,
            "worst-case-epsilon": 1000.0,  # does not bind: this test is about the main account
            "budget-delta": 1e-5,
            "filter": "rdp",  # Skellam releases are accounted by the rdp filter
            "after-exhaustion": "leave",
            "reply-hold-s": 0,  # timing protection off: one Ray actor serves many nodes
        }
        enrol_device(devices[i])
    ledger_path = root / "public.sqlite"
    run_config = {
        "run-name": RUN,
        "num-rounds": ROUNDS,
        "min-available-nodes": N,
        "placement": "distributed",
        "min-reports": MIN_REPORTS,
        "noise-multiplier": 1.0,
        "clip": 0.5,
        "local-epochs": 1,
        "num-clients": N,
        "round-timeout-s": 120.0,
        "public-ledger": str(ledger_path),
    }
    settings = write_device_settings(root / "device-settings.json", devices)
    with SimulationLink(root / "flower", num_supernodes=N, device_settings=settings) as link:
        result = link.run_app(BUILTIN_APP_DIR, run_config=run_config, timeout=400)
    assert result.ok, (result.status, result.details, result.output[-3000:])
    return devices, ledger_path


def test_every_round_is_released_from_a_secure_sum_of_all_sampled_devices(simulated):
    from fedfilter.coordinator.public_ledger import PublicLedger
    from fedfilter.protos import fedfilter_pb2

    _, ledger_path = simulated
    with PublicLedger(ledger_path, read_only=True) as ledger:
        assert ledger.is_finished(RUN)
        (run,) = ledger.runs()
        records = ledger.records(RUN)
    assert json.loads(run.config_json)["secure-aggregation"] is True
    assert [r.round_id for r in records] == list(range(1, ROUNDS + 1))
    for r in records:
        assert r.request.placement == fedfilter_pb2.DISTRIBUTED and r.request.min_reports == MIN_REPORTS
        assert (r.clients_sampled, r.reports_received, r.replies_dropped, r.markers_received) == (N, N, 0, 0)
        assert r.released and r.aggregate_norm > 0
        assert set(r.metrics) == {"accuracy", "loss"}


def test_every_device_paid_a_distributed_release_within_its_budget(simulated):
    from fedfilter.client.ledger.budget import BudgetLedger

    devices, _ = simulated
    for cfg in devices.values():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        try:
            assert ledger.filter.kind == "rdp"
            assert ledger.filter.within_budget(ledger.state()).all()
            records = ledger.records(RUN)
        finally:
            ledger.close()
        assert [r.round_id for r in records] == list(range(1, ROUNDS + 1))
        assert all(r.placement == "distributed" and r.status == "contributed" for r in records)
        assert all(float(r.charge.sum()) > 0 for r in records)
