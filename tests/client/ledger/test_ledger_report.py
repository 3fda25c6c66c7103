"""The device owner's report: "exhausted" is what the device itself recorded, nothing else.

The round a device ran out is the first round of the run whose ledger record is not
``contributed`` (the release's own verdict, from ``ClientPolicy.exhausted_below``), and a device
that never ran out reports none.
"""

import subprocess
import sys

import numpy as np
import pytest

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.report import device_report
from fedfilter.client.release import FilteredClient
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.request import RoundSpec

# Norm 0.18 at clip 1 and noise multiplier 0.5: a budget of epsilon 3 pays for a few such rounds.
UPDATE = [np.full((3, 4), 0.05, dtype=np.float32), np.full(5, -0.025, dtype=np.float32)]


def _device(path, epsilon, after_exhaustion="noise-only"):
    ledger = BudgetLedger.enrol(path, client_id="dev", epsilon=epsilon, delta=1e-5)
    return FilteredClient(ledger, ClientPolicy(min_noise_multiplier=0.5, after_exhaustion=after_exhaustion), 7)


def _play(client, run_id, rounds, first_round=1):
    rounds_played = range(first_round, first_round + rounds)
    return [client.release(RoundSpec(run_id, r, 0.5, 1.0), UPDATE).status for r in rounds_played]


@pytest.mark.parametrize("mode,stopped", [("noise-only", "noise-only"), ("leave", "left")])
def test_exhausted_round_is_the_ledgers_first_non_contributing_record(tmp_path, mode, stopped):
    client = _device(tmp_path, 3.0, mode)
    statuses = _play(client, "run-a", 8)
    client.ledger.close()
    assert statuses.count("contributed") >= 2 and stopped in statuses  # it ran out within the run

    report = device_report(tmp_path, "run-a")
    ledger = BudgetLedger.open(tmp_path)
    try:
        records = ledger.records("run-a")
        first_stop = next(r.round_id for r in records if r.status != "contributed")
        assert report["exhausted_round"] == first_stop
        assert report["contributed_rounds"] == [r.round_id for r in records if r.status == "contributed"]
        # The round that spent the budget down to almost nothing (less than 1e-6 of it left) still
        # contributed: the device's verdict, not a share-of-budget threshold, says when it ran out.
        last = records[first_stop - 2]
        assert last.status == "contributed" and ledger.filter.remaining_fraction(last.state_after) < 1e-6
        assert report["spent_epsilon"] <= report["budget_epsilon"] == 3.0
    finally:
        ledger.close()


def test_a_device_that_never_ran_out_reports_no_exhausted_round(tmp_path):
    client = _device(tmp_path, 50.0)
    assert _play(client, "run-a", 3) == ["contributed"] * 3
    client.ledger.close()
    report = device_report(tmp_path, "run-a")
    assert report["exhausted_round"] is None
    assert report["contributed_rounds"] == [1, 2, 3]
    assert report["client_id"] == "dev" and 0 < report["spent_epsilon"] < 50.0


def test_a_device_spent_in_an_earlier_run_is_exhausted_from_the_first_round_of_the_next(tmp_path):
    client = _device(tmp_path, 3.0)
    _play(client, "run-a", 8)
    assert _play(client, "run-b", 3, first_round=4) == ["noise-only"] * 3
    client.ledger.close()
    report = device_report(tmp_path, "run-b")
    assert report["exhausted_round"] == 4 and report["contributed_rounds"] == []


def test_a_run_the_device_never_answered_reports_no_rounds(tmp_path):
    client = _device(tmp_path, 3.0)
    _play(client, "run-a", 8)
    client.ledger.close()
    for run_id in ("other-run", None):
        report = device_report(tmp_path, run_id)
        assert report["exhausted_round"] is None and report["contributed_rounds"] == []


def test_the_report_imports_neither_torch_nor_flower():
    code = (
        "import sys, fedfilter.client.ledger.report; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'flwr', 'grpc'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]"
