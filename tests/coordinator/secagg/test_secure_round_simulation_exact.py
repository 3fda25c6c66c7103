"""The exact SecAgg+ sum inside Flower's Simulation Engine: 10 devices, distributed noise.

``flwr run`` of the test app ``tests/apps/secagg_sum`` on a simulation SuperLink on 127.0.0.1 (Ray in
its own processes): every device is ``ClientApp(mods=[secure_aggregation_mod, probe_mod,
individual_filter_mod])``, the coordinator ``IndividualFilterStrategy(FedAvg, placement="distributed")``.
Test hooks, all in the test app, none in the package: on each device a probe inside SecAgg+ saves the
integer report it hands SecAgg+ (``encode_report(y, q)``) before masking; on the coordinator a
recording Grid saves every reply it received, and a wrapper around ``decode_sum`` the integer sum it
unmasked. Checked: per round, that sum equals the sum of the devices' integer reports exactly; what
the coordinator received is masked vectors (and SecAgg+'s protocol messages) only; every round is
released; every device stays within its budget. About 30 s on 2 cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

APP_DIR = Path(__file__).resolve().parents[2] / "apps" / "secagg_sum"
PROBE_DIR_ENV = "FEDFILTER_TEST_SECAGG_PROBE_DIR"  # tests/apps/secagg_sum/secagg_sum_app/__init__.py
N, ROUNDS, RUN, MIN_REPORTS = 10, 2, "secagg-sum", 6
# Flower's four SecAgg+ stages and fedfilter's consistency round (client/secagg/consistency.py).
SECAGG_STAGES = {"setup", "share_keys", "collect_masked_vectors", "fedfilter_consistency_check", "unmask"}


@pytest.fixture(scope="module")
def simulated(tmp_path_factory):
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.deploy.simulation_link import SimulationLink

    root = tmp_path_factory.mktemp("secagg-sum")
    probes = root / "probes"
    probes.mkdir()
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
        "num-nodes": N,
        "min-reports": MIN_REPORTS,
        "public-ledger": str(ledger_path),
    }
    settings = write_device_settings(root / "device-settings.json", devices)
    link = SimulationLink(root / "flower", num_supernodes=N, device_settings=settings)
    link.superlink_env[PROBE_DIR_ENV] = str(probes)  # inherited by flwr-simulation and its Ray workers
    with link:
        result = link.run_app(APP_DIR, run_config=run_config, timeout=300)
    assert result.ok, (result.status, result.details, result.output[-3000:])
    return devices, ledger_path, probes


def _arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(sum(1 for k in data.files if k.startswith("arr_")))]


def _reports(probes: Path, round_id: int) -> dict[int, list[np.ndarray]]:
    """node id -> the float64 report that device handed SecAgg+ in ``round_id`` (its probe's file)."""
    out = {}
    for path in sorted(probes.glob(f"report-r{round_id}-n*.npz")):
        out[int(path.stem.split("-n")[1])] = _arrays(path)
    return out


def _quantization_range() -> int:
    from fedfilter.protocol.secagg.grid import secaggplus_settings

    return int(secaggplus_settings(N)["quantization_range"])


def test_the_unmasked_integer_sum_is_exactly_the_sum_of_the_devices_integer_reports(simulated):
    _, _, probes = simulated
    q = _quantization_range()
    for round_id in range(1, ROUNDS + 1):
        reports = _reports(probes, round_id)
        assert len(reports) == N
        with np.load(probes / f"sum-r{round_id}.npz") as data:
            n_reports, q_used = int(data["n_reports"]), int(data["q"])
        sums = _arrays(probes / f"sum-r{round_id}.npz")
        assert (n_reports, q_used) == (N, q)
        assert len(sums) == 2 and all(len(r) == len(sums) for r in reports.values())
        for index, got in enumerate(sums):
            xs = [r[index] for r in reports.values()]
            for x in xs:  # an integer report in [-q/2, q/2), as encode_report makes it
                assert x.dtype == np.float64 and np.array_equal(x, np.rint(x))
                assert x.min() >= -q // 2 and x.max() < q // 2
            residues = [x.astype(np.int64) + q // 2 for x in xs]  # y mod q (encode_report sends it minus q/2)
            # The sum mod q, centred, from the reports alone, as SecAgg+ defines it...
            np.testing.assert_array_equal(got, np.mod(sum(residues) + q // 2, q) - q // 2)
            # ...and the plain sum of the devices' integers y (each the centred residue: |y| << q/2 here),
            # coordinate by coordinate: no wrap anywhere, the coordinator got exactly sum_i y_i.
            ys = [np.mod(r + q // 2, q) - q // 2 for r in residues]
            assert max(int(np.abs(y).max()) for y in ys) < q // 2**10
            np.testing.assert_array_equal(got, sum(ys))
            assert np.count_nonzero(got) > got.size // 2  # a real sum of noisy reports, not zeros


def test_the_coordinator_received_masked_vectors_and_protocol_messages_only(simulated):
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key

    _, _, probes = simulated
    q = _quantization_range()
    calls = json.loads((probes / "replies.json").read_text())
    stages_per_round: dict[str, set[str]] = {}
    collected = 0
    for call in calls:
        if not call["stages"]:  # nothing sent (Flower may call with no message): nothing received
            assert not call["replies"]
            continue
        (group,) = call["groups"]
        (stage,) = call["stages"]  # every reply answered a SecAgg+ stage: no train reply in the clear
        stages_per_round.setdefault(group, set()).add(stage)
        assert len(call["replies"]) == N
        for reply in call["replies"]:
            assert "error" not in reply, reply
            assert all(sum(sizes) == 0 for sizes in reply["arrays"].values()), reply  # every array cleared
            for name, metrics in reply["metrics"].items():
                assert (name, metrics) == ("fitres.num_examples", {"num_examples": 1})
            allowed = {RECORD_KEY_CONFIGS, "fedfilter.secagg", "fitres.metrics", "fitres.status"}
            assert set(reply["configs"]) <= allowed, reply  # fedfilter.secagg: sealed certificates (pinning)
            assert reply["configs"].get("fitres.metrics", {}) == {}  # no metric of the device's
            if Key.MASKED_PARAMETERS in reply["configs"].get(RECORD_KEY_CONFIGS, {}):
                assert stage == "collect_masked_vectors"
                collected += 1
    assert stages_per_round == {str(r): SECAGG_STAGES for r in range(1, ROUNDS + 1)}
    assert collected == N * ROUNDS
    for round_id in range(1, ROUNDS + 1):
        reports = _reports(probes, round_id)
        masked_files = sorted(probes.glob(f"masked-r{round_id}-n*.npz"))
        assert {int(p.stem.split("-n")[1]) for p in masked_files} == set(reports)
        for path in masked_files:
            weight, *masked = _arrays(path)  # Flower's masked vector: the weight factor, then the arrays
            report = reports[int(path.stem.split("-n")[1])]
            assert [m.shape for m in masked] == [x.shape for x in report]
            for m, x in zip(masked, report):
                quantized = x.astype(np.int64) + q // 2  # the report as Flower quantizes it
                m = m.astype(np.int64)
                assert np.mean(m == quantized) < 0.01 and np.mean(m >= q) > 0.5  # uniform on [0, 2**32)


def test_every_round_is_released_and_every_device_stays_within_its_budget(simulated):
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.coordinator.public_ledger import PublicLedger

    devices, ledger_path, _ = simulated
    with PublicLedger(ledger_path, read_only=True) as ledger:
        assert ledger.is_finished(RUN)
        records = ledger.records(RUN)
    assert [r.round_id for r in records] == list(range(1, ROUNDS + 1))
    for r in records:
        assert (r.clients_sampled, r.reports_received, r.replies_dropped) == (N, N, 0)
        assert r.released and r.aggregate_norm > 0
    for cfg in devices.values():
        ledger = BudgetLedger.open(cfg["ledger-dir"])
        try:
            assert ledger.filter.within_budget(ledger.state()).all()
            spends = ledger.records(RUN)
        finally:
            ledger.close()
        assert [s.round_id for s in spends] == list(range(1, ROUNDS + 1))
        assert all(s.placement == "distributed" and s.status == "contributed" for s in spends)
        assert all(float(s.charge.sum()) > 0 for s in spends)
