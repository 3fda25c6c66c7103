"""``fedfilter ledger enrol --worst-case-epsilon``, ``ledger worst-case`` and ``ledger show``."""

import json

import numpy as np

from fedfilter.cli import main
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def test_enrol_with_a_worst_case_budget_and_show_both_guarantees(tmp_path, capsys):
    d = str(tmp_path / "phone")
    assert main(["ledger", "enrol", "--dir", d, "--client-id", "p", "--epsilon", "8", "--delta", "1e-5",
                 "--filter", "rdp", "--worst-case-epsilon", "60"]) == 0  # fmt: skip
    assert "worst-case-epsilon=60" in capsys.readouterr().out
    assert main(["ledger", "show", "--dir", d]) == 0
    text = capsys.readouterr().out
    assert "(eps_i=8, delta=1e-05) against a coordinator that may lie about SecAgg+ rounds" in text
    assert "(eps_worst=60, delta=1e-05) against any coordinator" in text
    assert main(["ledger", "show", "--dir", d, "--json"]) == 0
    worst = json.loads(capsys.readouterr().out)["worst_case"]
    assert worst["budget_epsilon"] == 60.0 and worst["spent_epsilon"] == 0.0 and worst["spends_before"] == 0


def test_an_existing_ledger_gets_it_by_the_owners_command_once(tmp_path, capsys):
    ledger = BudgetLedger.enrol(tmp_path, client_id="old", epsilon=2.0, delta=1e-5)
    for r in range(3):
        FilteredClient(ledger).release(RoundSpec("run-x", r, 3.0, 1.0), [np.ones(8) * 0.1])
    spent = ledger.spent_epsilon()
    ledger.close()
    assert main(["ledger", "show", "--dir", str(tmp_path)]) == 0
    assert "no worst-case-epsilon: this device refuses distributed rounds" in capsys.readouterr().out
    assert main(["ledger", "worst-case", "--dir", str(tmp_path), "--epsilon", "1"]) == 2  # below its epsilon 2
    assert "worst-case-epsilon=1.0 is below the budget epsilon=2.0" in capsys.readouterr().err
    assert main(["ledger", "worst-case", "--dir", str(tmp_path), "--epsilon", "4"]) == 0
    assert "its 3 earlier spends charged conservatively" in capsys.readouterr().out
    assert main(["ledger", "worst-case", "--dir", str(tmp_path), "--epsilon", "5"]) == 2
    assert "can never change" in capsys.readouterr().err
    assert main(["ledger", "show", "--dir", str(tmp_path), "--json"]) == 0
    worst = json.loads(capsys.readouterr().out)["worst_case"]
    # Local spends: the worst-case account holds their main charges (a larger budget: less of it spent).
    assert worst["spends_before"] == 3 and 0 < worst["spent_epsilon"] <= spent
