"""The claimed-population attack through Flower's Simulation Engine (Ray, a simulation SuperLink on
127.0.0.1, ``flwr run`` of the test app ``tests/apps/secagg_sum``).

Six genuine devices and a coordinator that asks for ``min-reports`` 10 while running SecAgg+ with
``k = 5, t = 4`` and telling every device that 20 nodes were sampled (the test app's attack mode,
``FEDFILTER_TEST_SECAGG_CLAIM``). A device that bounded the sum by the claimed population
(``ceil(20 * 4 / 5) = 16 >= 10``) trained, paid for a sum of 10 and let the coordinator unmask the sum
of 6. A device that bounds it by its own threshold refuses before training: no sum is unmasked and
no ledger records a spend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "secagg_sum"
PROBE_DIR_ENV = "FEDFILTER_TEST_SECAGG_PROBE_DIR"
CLAIM_ENV = "FEDFILTER_TEST_SECAGG_CLAIM"  # tests/apps/secagg_sum/secagg_sum_app/server_app.py
N, MIN_REPORTS, RUN = 6, 10, "secagg-claimed"


def test_a_coordinator_claiming_a_larger_population_unmasks_nothing(tmp_path):
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.deploy.simulation_link import SimulationLink

    probes = tmp_path / "probes"
    probes.mkdir()
    devices = {}
    for i in range(N):
        devices[i] = {
            "ledger-dir": str(tmp_path / "devices" / str(i)),
            "client-id": f"client-{i}",
            "budget-epsilon": 20.0,
            "worst-case-epsilon": 1000.0,
            "budget-delta": 1e-5,
            "filter": "rdp",
            "reply-hold-s": 0,
        }
        enrol_device(devices[i])
    run_config = {
        "run-name": RUN,
        "num-rounds": 1,
        "num-nodes": N,
        "min-reports": MIN_REPORTS,
        "public-ledger": str(tmp_path / "public.sqlite"),
    }
    settings = write_device_settings(tmp_path / "device-settings.json", devices)
    link = SimulationLink(tmp_path / "flower", num_supernodes=N, device_settings=settings)
    link.superlink_env[PROBE_DIR_ENV] = str(probes)
    link.superlink_env[CLAIM_ENV] = "20,5,4"
    with link:
        result = link.run_app(APP_DIR, run_config=run_config, timeout=300)
    # The run ends without a release (the strategy raises NothingReleasedError): what matters is what the
    # coordinator could read and what the devices paid.
    (unmasked,) = [json.loads(p.read_text()) for p in probes.glob("unmasked-r*.json")]
    assert unmasked["reports"] == 0, f"the coordinator unmasked the sum of {unmasked['reports']} reports"
    reports = sorted(probes.glob("report-r*.npz"))
    assert reports == [], "a device handed SecAgg+ a report"
    for cfg in devices.values():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        try:
            assert ledger.records() == []
        finally:
            ledger.close()
    assert "threshold 4 with 0 colluders leaves 4 honest reports" in result.output  # the devices' refusal
