"""The planner and ledger commands, run as a user would (``python -m fedfilter``)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def run(*args):
    return subprocess.run([sys.executable, "-m", "fedfilter", *args], capture_output=True, text=True, timeout=120)


def test_rounds_json():
    out = run(
        "rounds", "--epsilon", "0.3", "--delta", "1e-5", "--noise-multiplier", "170", "--filter", "zcdp", "--json"
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["rounds"] == 111  # 112 steps cost 0.3007 > 0.3 (Feldman & Zrnic (2021) App. A)


def test_epsilon_json_round_trips_with_rounds():
    for kind in ("gdp", "rdp", "zcdp"):
        out = run(
            "epsilon", "--noise-multiplier", "20", "--rounds", "37", "--delta", "1e-5", "--filter", kind, "--json"
        )
        eps = json.loads(out.stdout)["epsilon"]
        back = run(
            "rounds", "--epsilon", repr(eps), "--delta", "1e-5", "--noise-multiplier", "20", "--filter", kind, "--json"
        )
        assert json.loads(back.stdout)["rounds"] == 37


def test_bad_input_is_one_clear_line():
    out = run("rounds", "--epsilon", "-1", "--delta", "2", "--noise-multiplier", "1")
    assert out.returncode == 2
    assert "epsilon must be" in out.stderr and "delta must be" in out.stderr and "Traceback" not in out.stderr


def test_ledger_show(tmp_path):
    client = FilteredClient(BudgetLedger.enrol(tmp_path, client_id="phone-7", epsilon=2.0, delta=1e-5))
    for r in range(4):
        client.release(RoundSpec("run-x", r, 3.0, 1.0), [np.ones(8) * 0.1])
    text = run("ledger", "show", "--dir", str(tmp_path))
    assert text.returncode == 0 and "phone-7" in text.stdout and "run-x" in text.stdout
    data = json.loads(run("ledger", "show", "--dir", str(tmp_path), "--json").stdout)
    assert data["budget_epsilon"] == 2.0 and 0 < data["spent_epsilon"] <= 2.0
    assert data["runs"][0]["contributed"] == 4
    missing = run("ledger", "show", "--dir", str(tmp_path / "nope"))
    assert missing.returncode == 2 and "no budget ledger" in missing.stderr and "Traceback" not in missing.stderr


def test_docs_rounds_table_is_the_commands_output():
    """The device owner's page's `fedfilter rounds` block (moved from the README) is what the command prints today."""
    readme = (Path(__file__).resolve().parents[2] / "docs" / "device-owner.md").read_text()
    cmd = "$ fedfilter rounds --epsilon 1 --delta 1e-5 --noise-multiplier 10 --filter all\n"
    assert cmd in readme
    shown = readme.split(cmd, 1)[1].split("```", 1)[0]
    out = run(*cmd.split()[2:])
    assert out.returncode == 0, out.stderr
    assert shown.strip() == out.stdout.strip()


def test_distributed_rounds_and_epsilon_round_trip():
    """--placement distributed plans Skellam rounds with the rdp filter (its default there)."""
    common = ("--delta", "1e-5", "--noise-multiplier", "20", "--placement", "distributed", "--dim", "1000000")
    out = run("rounds", "--epsilon", "1", *common, "--min-reports", "10", "--json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    assert plan["filter"] == "rdp" and plan["placement"] == "distributed" and plan["order"] == 18.0
    assert 0 < plan["rounds"] <= plan["gaussian_rounds"]
    eps = json.loads(run("epsilon", "--rounds", str(plan["rounds"]), *common, "--min-reports", "10", "--json").stdout)
    assert eps["epsilon"] <= 1.0
    back = run("rounds", "--epsilon", repr(eps["epsilon"]), *common, "--min-reports", "10", "--json")
    assert json.loads(back.stdout)["rounds"] == plan["rounds"]
    text = run("rounds", "--epsilon", "1", *common)
    assert text.returncode == 0 and "Skellam" in text.stdout
    assert re.search(rf"^rounds +{plan['rounds']} ", text.stdout, flags=re.MULTILINE)  # the table's column width


def test_distributed_refuses_gaussian_only_filters_and_needs_dim():
    for kind in ("gdp", "zcdp"):
        out = run("rounds", "--epsilon", "1", "--delta", "1e-5", "--noise-multiplier", "20",
                  "--placement", "distributed", "--dim", "10", "--filter", kind)  # fmt: skip
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"filter='{kind}'" in out.stderr and "needs filter='rdp'" in out.stderr
    out = run("epsilon", "--rounds", "3", "--delta", "1e-5", "--noise-multiplier", "20", "--placement", "distributed")
    assert out.returncode == 2 and "needs --dim" in out.stderr and "Traceback" not in out.stderr
