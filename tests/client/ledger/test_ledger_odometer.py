"""``fedfilter ledger show`` carries the odometer for the device and for each federation."""

from __future__ import annotations

import json

import numpy as np
import pytest

from fedfilter.cli import main
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.privacy.filters import make_filter, rdp_order
from fedfilter.privacy.odometer import filter_odometer, gdp_odometer, rdp_odometer
from fedfilter.protocol.request import RoundSpec


@pytest.mark.parametrize("kind", ["gdp", "rdp", "zcdp"])
def test_ledger_show_json_has_the_odometer_of_the_ledgers_state(tmp_path, capsys, kind):
    client = FilteredClient(
        BudgetLedger.enrol(tmp_path, client_id="phone-7", epsilon=2.0, delta=1e-5, filter_kind=kind)
    )
    for r in range(4):
        client.release(RoundSpec("run-x", r, 3.0, 1.0), [np.ones(8) * 0.1])
    state = client.ledger.state()
    client.ledger.close()
    assert main(["ledger", "show", "--dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    odo = data["odometer"]
    filt = make_filter(kind, 2.0, 1e-5)
    if kind == "gdp":
        assert odo["epsilon"] == gdp_odometer(float(state[0]), delta_g=1e-5)
    elif kind == "zcdp":
        assert odo["epsilon"] >= gdp_odometer(2 * float(state[0]), delta_g=1e-5)
    else:
        alpha = rdp_order(filt)
        assert odo["epsilon"] >= rdp_odometer(alpha * float(state[0]), order=alpha, delta_g=1e-5)
    assert odo["delta"] == 1e-5 and odo["epsilon"] >= data["spent_epsilon"] > 0
    # one federation ("default"), which spent everything: its odometer is the device's
    assert odo["coordinators"] == {"default": odo["epsilon"]}
    assert main(["ledger", "show", "--dir", str(tmp_path)]) == 0
    assert f"odometer         epsilon={odo['epsilon']:.4f}" in capsys.readouterr().out


def test_filter_odometer_reads_each_kind_at_or_above_the_filter():
    for kind in ("gdp", "rdp", "zcdp"):
        filt = make_filter(kind, 3.0, 1e-6)
        state = filt.spend(filt.initial_state(), filt.charge(sensitivity=0.8, noise_std=1.0))
        assert filter_odometer(filt, state) >= filt.epsilon_spent(state)
    with pytest.raises(ValueError, match="state"):
        filter_odometer(make_filter("gdp", 1.0, 1e-5), np.zeros(2))


def test_device_report_carries_the_odometer_and_the_summary_says_which_is_the_guarantee(tmp_path):
    from fedfilter.client.ledger.report import device_report, odometer_text

    client = FilteredClient(BudgetLedger.enrol(tmp_path, client_id="d", epsilon=1.0, delta=1e-6))
    for r in range(30):  # past its budget: the filter stops it, the odometer keeps the honest total
        client.release(RoundSpec("run-y", r, 2.0, 1.0), [np.ones(8) * 0.2])
    state = client.ledger.state()
    client.ledger.close()
    rep = device_report(tmp_path, "run-y")
    assert rep["spent_epsilon"] <= 1.0 < rep["odometer_epsilon"] == gdp_odometer(float(state[0]), delta_g=1e-6)
    assert rep["exhausted_round"] is not None
    text = odometer_text(1e-6)
    assert "1e-06" in text and "valid at every moment" in text and "guarantee is budget_epsilon" in text


def test_ledger_show_labels_an_odometer_above_the_budget_as_no_overspend(tmp_path, capsys):
    """An exhausted gdp ledger: the filter held the budget, the odometer (a looser, every-moment
    bound) reads above it, and `ledger show` says which is which instead of hiding either number."""
    client = FilteredClient(BudgetLedger.enrol(tmp_path, client_id="d", epsilon=2.0, delta=1e-5))
    for r in range(30):
        client.release(RoundSpec("run-z", r, 2.0, 1.0), [np.ones(8) * 0.2])
    client.ledger.close()
    assert main(["ledger", "show", "--dir", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["spent_epsilon"] <= data["budget_epsilon"] < data["odometer"]["epsilon"]
    assert main(["ledger", "show", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    spent = next(line for line in out.splitlines() if line.strip().startswith("spent "))
    odometer = next(line for line in out.splitlines() if line.strip().startswith("odometer "))
    assert f"epsilon={data['spent_epsilon']:.4f}" in spent and "at most the budget" in spent
    assert f"epsilon={data['odometer']['epsilon']:.4f}" in odometer  # shown, not hidden
    assert "not a spend" in odometer and "looser accountant" in odometer and "above the budget" in odometer
    assert "odometer*" in out and "* odometer: not a spend" in out
