"""The built-in ServerApp (IndividualFilterStrategy around FedAvg) and ClientApp under Flower's
Simulation Engine through ``flwr run`` (a SuperLink on 127.0.0.1, Ray in its own processes, devices
from a device-settings file): slow, one simulation of 5 devices x 3 rounds.

One device has a tiny budget and leaves once it is spent, so the public ledger must show a marker
and the devices' own ledgers must stay within their budgets.
"""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow

N, ROUNDS, RUN = 5, 3, "server-app-e2e"


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.deploy.command import BUILTIN_APP_DIR
    from fedfilter.deploy.simulation_link import SimulationLink

    root = tmp_path_factory.mktemp("e2e")
    devices = {}
    for i in range(N):
        devices[i] = {
            "ledger-dir": str(root / "devices" / str(i)),
            "client-id": f"client-{i}",
            "budget-epsilon": 0.3 if i == 0 else 50.0,
            "budget-delta": 1e-5,
            "after-exhaustion": "leave",
            "reply-hold-s": 0,  # timing protection off: one Ray actor serves many nodes
        }
        enrol_device(devices[i])
    ledger_path = root / "public.sqlite"
    run_config = {
        "run-name": RUN,
        "num-rounds": ROUNDS,
        "min-available-nodes": N,
        "noise-multiplier": 1.0,
        "clip": 0.5,
        "local-epochs": 1,
        "num-clients": N,
        "round-timeout-s": 120.0,
        "public-ledger": str(ledger_path),
    }
    settings = write_device_settings(root / "device-settings.json", devices)
    # Ray runs in the SuperLink's processes, not in this one: a fresh Ray for this run.
    with SimulationLink(root / "flower", num_supernodes=N, device_settings=settings) as link:
        result = link.run_app(BUILTIN_APP_DIR, run_config=run_config, timeout=300)
    assert result.ok, (result.status, result.details, result.output[-2000:])
    return devices, ledger_path


def test_every_round_is_recorded_with_public_counts_and_server_side_metrics(simulated):
    from fedfilter.coordinator.public_ledger import PublicLedger

    _, ledger_path = simulated
    with PublicLedger(ledger_path, read_only=True) as ledger:
        assert ledger.is_finished(RUN)
        config = ledger.runs()[0]
        records = ledger.records(RUN)
    assert RUN == config.run_id
    assert [r.round_id for r in records] == list(range(1, ROUNDS + 1))
    for r in records:
        assert r.clients_sampled == N and r.replies_dropped == 0
        assert r.reports_received + r.markers_received == N
        assert r.released and r.aggregate_norm > 0
        assert set(r.metrics) == {"accuracy", "loss"} and 0 <= r.metrics["accuracy"] <= 1
        assert r.request.run_id == RUN and r.request.noise_multiplier == 1.0 and r.request.local_epochs == 1
    # The tiny-budget device left: a marker in a later round.
    assert sum(r.markers_received for r in records) >= 1


def test_devices_spent_within_their_budgets(simulated):
    from fedfilter.client.ledger.budget import BudgetLedger

    devices, _ = simulated
    for i, cfg in devices.items():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        try:
            assert ledger.filter.within_budget(ledger.state())
            assert ledger.spent_epsilon() > 0
            statuses = [rec.status for rec in ledger.records(RUN)]
        finally:
            ledger.close()
        if i == 0:
            assert "left" in statuses, statuses
        else:
            assert statuses == ["contributed"] * ROUNDS, statuses
