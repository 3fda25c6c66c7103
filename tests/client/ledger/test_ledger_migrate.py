"""``fedfilter ledger migrate`` tells the owner what it cannot see and refuses what the seal shows to be a fork.

Migrating keeps the spends the database holds; spends the device made beyond it (a ledger swapped for
an older one, with its seal and anchor gone) are out of its sight, so it names the budget at risk as
``accept-restore`` does, and never says every spend was kept.
"""

import json
import shutil
import sqlite3

from helpers.ledger import _schema_1_ledger, pre_anchor, restart_device, serve, spend_rows, spent
from helpers.mods import context

from fedfilter.cli import main as cli_main
from fedfilter.client.ledger.anchor import anchor_path
from fedfilter.client.ledger.owner import accept_restore
from fedfilter.client.ledger.schema import ANCHORED_KEY, LEDGER_FILE
from fedfilter.client.ledger.seal import SEAL_FILE

BUDGET = {"budget-epsilon": 20.0}


def test_migrating_a_schema_1_ledger_swapped_in_without_seal_or_anchor_names_the_budget_at_risk(tmp_path, capsys):
    restart_device()
    ledger_dir = tmp_path / "ledger"
    serve(context(tmp_path, **BUDGET), range(1, 41))  # 40 spends
    restart_device()
    shutil.rmtree(ledger_dir)  # ledger and seal gone ...
    anchor_path(ledger_dir).unlink()  # ... and the anchor too
    _schema_1_ledger(ledger_dir)  # an old-format ledger with one spend takes their place
    assert cli_main(["ledger", "migrate", "--dir", str(ledger_dir)]) == 0
    out = capsys.readouterr().out
    assert "every spend kept" not in out
    assert "budget at risk" in out and "unknown" in out
    assert "spend #1" in out  # what the database holds, and all it keeps
    assert spent(ledger_dir)[0] == 1


def test_migrating_an_intactpre_anchor_ledger_claims_only_the_spends_it_holds(tmp_path, capsys):
    restart_device()
    ledger_dir = tmp_path / "ledger"
    serve(context(tmp_path, **BUDGET), range(1, 4))
    restart_device()
    pre_anchor(ledger_dir)
    assert cli_main(["ledger", "migrate", "--dir", str(ledger_dir)]) == 0
    out = capsys.readouterr().out
    assert "every spend kept" not in out and "budget at risk" in out and "spend #3" in out
    assert spent(ledger_dir)[0] == 3


def test_migrate_refuses_apre_anchor_ledger_whose_sealed_spend_differs_from_its_seal(tmp_path, capsys):
    # A fork: the database holds spend #6, but not the #6 its seal names (another copy spent it).
    restart_device()
    ledger_dir = tmp_path / "ledger"
    ctx = context(tmp_path, **BUDGET)
    serve(ctx, range(1, 4))
    shutil.copytree(ledger_dir, tmp_path / "at-3")
    serve(ctx, range(4, 7))
    seal = (ledger_dir / SEAL_FILE).read_bytes()  # names #6 as first spent
    restart_device()
    shutil.rmtree(ledger_dir)
    shutil.copytree(tmp_path / "at-3", ledger_dir)
    accept_restore(ledger_dir)
    serve(ctx, range(10, 13))  # #4-#6 again, other rounds
    restart_device()
    (ledger_dir / SEAL_FILE).write_bytes(seal)
    pre_anchor(ledger_dir)
    assert spend_rows(ledger_dir) == 6  # the row is there: only its contents differ
    assert cli_main(["ledger", "migrate", "--dir", str(ledger_dir)]) == 2
    err = capsys.readouterr().err
    assert "holds differently" in err and "#6" in err
    # Nothing changed: the seal, no anchor, and no anchored flag.
    assert json.loads((ledger_dir / SEAL_FILE).read_bytes()) == json.loads(seal)
    assert not anchor_path(ledger_dir).exists()
    conn = sqlite3.connect(ledger_dir / LEDGER_FILE)
    assert conn.execute("SELECT 1 FROM meta WHERE key=?", (ANCHORED_KEY,)).fetchone() is None
    conn.close()
