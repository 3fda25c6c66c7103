"""A roll-back of the ledger needs its owner (the design's invariant 6).

The attack (independent audit): back up the ledger directory (database and seal together, as an owner
would), let the device spend, restore the backup: the device had its spent budget back. The roll-back
anchor in the owner's state directory (client/ledger/anchor.py) refuses such a ledger until the owner
accepts it (``fedfilter ledger accept-restore``), naming the budget at risk.
"""

import json
import logging
import shutil
import sqlite3

import pytest
from helpers.ledger import STEP, _schema_1_ledger, assert_refused, pre_anchor, restart_device, serve, spent
from helpers.mods import Handler, context, spec, train_message

from fedfilter.cli import main as cli_main
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower import ledger_cache as device_ledgers
from fedfilter.client.ledger.anchor import AnchorError, anchor_path, read_anchor, read_anchor_file
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.owner import accept_restore, inspect, migrate
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.ledger.seal import SEAL_FILE
from fedfilter.client.ledger.storage import LedgerUnavailableError


@pytest.fixture
def device(tmp_path):
    """A device that answered three rounds, a backup of its ledger directory taken then (with the
    device running, as a file-level backup tool would), and three more rounds after the backup."""
    restart_device()  # the mod's cache of open ledgers holds this device's only
    ctx = context(tmp_path, **{"budget-epsilon": 20.0})
    ledger_dir = tmp_path / "ledger"
    serve(ctx, (1, 2, 3))
    shutil.copytree(ledger_dir, tmp_path / "backup")
    serve(ctx, (4, 5, 6))
    return ledger_dir, ctx, tmp_path / "backup"


def restore(backup, ledger_dir):
    shutil.rmtree(ledger_dir)
    shutil.copytree(backup, ledger_dir)


def test_a_restored_backup_of_the_ledger_directory_is_refused_until_the_owner_accepts(device, caplog, capsys):
    ledger_dir, ctx, backup = device
    after = spent(ledger_dir)
    restart_device()
    restore(backup, ledger_dir)  # database and seal together: they agree with each other
    assert_refused(ctx, caplog, "behind its roll-back anchor", "#6", "accept-restore")
    assert_refused(ctx, caplog, "behind its roll-back anchor")  # on every later round too
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        BudgetLedger.open(ledger_dir)
    # Neither enrolling again nor migrating lifts it: only accepting the restore does.
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        BudgetLedger.enrol(ledger_dir, client_id="alice", epsilon=20.0, delta=1e-5)
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        migrate(ledger_dir)
    # The owner looks first: nothing changes without --confirm, and the budget at risk is named.
    assert cli_main(["ledger", "accept-restore", "--dir", str(ledger_dir)]) == 2
    out = capsys.readouterr().out
    view = inspect(ledger_dir)
    assert view.at_risk_epsilon > 0 and f"{view.at_risk_epsilon:.4g}" in out and "--confirm" in out
    assert "spend #6" in out and "spend #3" in out
    assert_refused(ctx, caplog, "behind its roll-back anchor")
    assert cli_main(["ledger", "accept-restore", "--dir", str(ledger_dir), "--confirm"]) == 0
    before = spent(ledger_dir)
    assert before[0] == 3 and before[1] < after[1]  # the owner gave that budget back, knowingly
    assert view.at_risk_epsilon == pytest.approx(after[1] - before[1], rel=1e-9)
    serve(ctx, (7,))  # the device serves again
    assert list(anchor_path(ledger_dir).parent.glob("*.retired-0"))  # the old anchor is kept for the record


def write_over(backup, ledger_dir, names):
    """Restore files in place: the same inodes, written over (as ``cp`` onto existing files does)."""
    for name in names:
        with open(ledger_dir / name, "r+b") as out:
            out.write((backup / name).read_bytes())
            out.truncate()


def assert_refused_under_the_open_ledger(ctx, caplog, ledger_dir, *log_words):
    """The cached ledger passed its open-time checks long ago: the checks inside ``reserve`` refuse."""
    (entry,) = device_ledgers._ledgers.values()
    assert len(entry.ledger.records()) == 3  # the open connection sees the restored database
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply = individual_filter_mod(train_message(spec(7), message_id="late"), ctx, Handler(STEP))
    assert reply.has_error() and not reply.has_content() and "refused until its owner acts" in reply.error.reason
    for w in log_words:
        assert w in caplog.text, (w, caplog.text)
    assert (ledger_dir / LEDGER_FILE).stat().st_ino == entry.identity[1]  # still the same file
    conn = sqlite3.connect(ledger_dir / LEDGER_FILE)
    assert conn.execute("SELECT MAX(seq) FROM spends").fetchone()[0] == 3  # nothing spent
    conn.close()


def test_a_backup_restored_in_place_under_the_open_ledger_is_refused(device, caplog):
    ledger_dir, ctx, backup = device
    write_over(backup, ledger_dir, [LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm", SEAL_FILE])
    assert_refused_under_the_open_ledger(ctx, caplog, ledger_dir, "behind its roll-back anchor", "#6")
    restart_device()
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        BudgetLedger.open(ledger_dir)


def test_a_database_restored_in_place_without_its_seal_is_refused_by_the_seal_recheck(device, caplog):
    # The seal re-check inside reserve (not only the one on open) refuses a database written over
    # under the open ledger while its seal still names the latest spend.
    ledger_dir, ctx, backup = device
    write_over(backup, ledger_dir, [LEDGER_FILE, LEDGER_FILE + "-wal", LEDGER_FILE + "-shm"])
    assert_refused_under_the_open_ledger(ctx, caplog, ledger_dir, "lost spends", "seal names spend #6")


def test_a_ledger_without_its_anchor_is_refused_also_before_its_first_spend(device, caplog, tmp_path):
    ledger_dir, ctx, _ = device
    restart_device()
    anchor_path(ledger_dir).unlink()  # moved onto another device, or the state directory was lost
    assert_refused(ctx, caplog, "no roll-back anchor", "accept-restore")
    accept_restore(ledger_dir)
    assert spent(ledger_dir)[0] == 6  # accepted as it is: every spend kept
    # A ledger has its anchor from enrolment on: one that never spent is refused without it as well
    # (a copy of it elsewhere would be a second full budget), until the owner accepts it.
    fresh = tmp_path / "fresh"
    BudgetLedger.enrol(fresh, client_id="f", epsilon=1.0, delta=1e-5).close()
    assert read_anchor(anchor_path(fresh)).seq == 0
    anchor_path(fresh).unlink()
    with pytest.raises(LedgerUnavailableError, match="no roll-back anchor"):
        BudgetLedger.open(fresh)
    assert inspect(fresh).at_risk_epsilon is None  # unknown: nothing names what a copy spent
    accept_restore(fresh)
    BudgetLedger.open(fresh).close()


def test_a_copy_of_the_ledger_in_another_directory_has_no_anchor_and_is_refused(device, tmp_path):
    ledger_dir, _, _ = device
    shutil.copytree(ledger_dir, tmp_path / "copy")  # two devices from one budget
    with pytest.raises(LedgerUnavailableError, match="no roll-back anchor"):
        BudgetLedger.open(tmp_path / "copy")


def test_a_deleted_ledger_directory_is_not_a_fresh_budget_without_replace(device, capsys):
    ledger_dir, _, _ = device
    restart_device()
    shutil.rmtree(ledger_dir)  # seal gone too: only the anchor remembers
    args = ["ledger", "enrol", "--dir", str(ledger_dir), "--client-id", "alice", "--epsilon", "20", "--delta", "1e-5"]
    assert cli_main(args) == 2
    err = capsys.readouterr().err
    assert "roll-back anchor" in err and "--recover replace" in err
    assert not (ledger_dir / LEDGER_FILE).exists()
    assert cli_main(args + ["--recover", "replace"]) == 0  # the owner's explicit choice
    assert spent(ledger_dir)[0] == 0


def test_reseal_accepts_a_lost_seal_but_never_a_roll_back(device):
    ledger_dir, _, backup = device
    restart_device()
    restore(backup, ledger_dir)
    (ledger_dir / SEAL_FILE).unlink()
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        BudgetLedger.enrol(ledger_dir, client_id="alice", epsilon=20.0, delta=1e-5, recover="reseal")
    assert not (ledger_dir / SEAL_FILE).exists()  # refused before anything was written


def test_a_damaged_anchor_is_refused(device, caplog):
    ledger_dir, ctx, _ = device
    restart_device()
    path = anchor_path(ledger_dir)
    path.write_bytes(path.read_bytes().replace(b'"seq": ', b'"seq": 1'))  # both slots
    assert_refused(ctx, caplog, "damaged roll-back anchor")


def test_a_torn_anchor_write_opens_when_the_database_holds_exactly_the_spend_it_was_writing(device):
    # A crash in the middle of writing the newest slot: that spend was never released (the release
    # follows the write), the other slot still names the previous one, and the database holds the
    # spend being anchored (the COMMIT precedes the anchor write): only that case opens.
    ledger_dir, ctx, _ = device
    restart_device()
    path = anchor_path(ledger_dir)
    raw = bytearray(path.read_bytes())
    newest = raw.index(b'"seq": 6')
    raw[newest : newest + 8] = b"\0" * 8
    path.write_bytes(bytes(raw))
    read = read_anchor_file(path)
    assert read.anchor.seq == 5 and read.damaged
    with pytest.raises(AnchorError, match="damaged"):  # never read as "#6 was not released"
        read_anchor(path)
    BudgetLedger.open(ledger_dir).close()
    serve(ctx, (7,))  # #6 is anchored again (over the damaged slot) before #7 is spent
    assert read_anchor(path).seq == 7


def test_another_copy_that_spent_on_its_own_is_refused(device, tmp_path):
    # A fork: a copy of the ledger spends the same sequence number differently.
    ledger_dir, ctx, backup = device
    restart_device()
    good = tmp_path / "latest"
    shutil.copytree(ledger_dir, good)
    restore(backup, ledger_dir)
    accept_restore(ledger_dir)  # the owner accepts the backup (at #3) ...
    serve(ctx, (10, 11, 12))  # ... which spends #4-#6 again
    restart_device()
    restore(good, ledger_dir)  # then the other copy comes back: #6 differs from the anchor's #6
    with pytest.raises(LedgerUnavailableError, match="differently from its roll-back anchor"):
        BudgetLedger.open(ledger_dir)


def test_a_ledger_from_before_anchors_is_migrated_only_by_its_owner(device, caplog):
    ledger_dir, ctx, _ = device
    restart_device()
    pre_anchor(ledger_dir)
    assert_refused(ctx, caplog, "older format", "fedfilter ledger migrate")
    assert cli_main(["ledger", "migrate", "--dir", str(ledger_dir)]) == 0
    assert read_anchor(anchor_path(ledger_dir)).seq == 6
    assert spent(ledger_dir)[0] == 6
    assert migrate(ledger_dir)[1] is False  # nothing left to migrate
    serve(ctx, (7,))


def test_migrate_refuses_apre_anchor_ledger_that_its_seal_shows_to_be_an_older_copy(device):
    ledger_dir, _, backup = device
    restart_device()
    seal = (ledger_dir / SEAL_FILE).read_bytes()
    restore(backup, ledger_dir)
    (ledger_dir / SEAL_FILE).write_bytes(seal)  # the seal of the newer state
    pre_anchor(ledger_dir)
    with pytest.raises(LedgerUnavailableError, match="lost spends"):
        migrate(ledger_dir)
    assert json.loads((ledger_dir / SEAL_FILE).read_text())["seq"] == 6  # nothing changed


def test_the_anchor_is_written_outside_the_ledger_directory(device, owner_state):
    ledger_dir, _, _ = device
    path = anchor_path(ledger_dir)
    assert path.parent.parent == owner_state and not path.is_relative_to(ledger_dir)
    anchor = read_anchor(path)
    assert (anchor.seq, anchor.directory) == (6, str(ledger_dir.resolve()))


@pytest.fixture
def owner_state():
    from fedfilter.client.ledger.owner_state import owner_state_dir

    return owner_state_dir()


def test_a_schema_1_ledger_put_in_place_of_a_deleted_one_is_not_migrated_over_its_anchor(device, caplog):
    # The audit's attack: the ledger and its seal are gone and an old-format ledger takes their place.
    ledger_dir, ctx, _ = device
    restart_device()
    shutil.rmtree(ledger_dir)
    _schema_1_ledger(ledger_dir)
    assert_refused(ctx, caplog, "older format")
    with pytest.raises(LedgerUnavailableError, match="older copy.*accept-restore"):
        migrate(ledger_dir)
    view = accept_restore(ledger_dir)  # only the owner's explicit acceptance lifts it
    assert "spend #6" in view.anchored and view.at_risk_epsilon > 0
    assert spent(ledger_dir)[0] == 1


def test_a_local_trial_may_reuse_a_deleted_output_folder_an_owner_may_not(device, tmp_path):
    # The demo and deploy-local simulate their devices' owners in their own output folder: a folder
    # deleted and used again holds new devices. A real owner's deleted ledger stays refused.
    from fedfilter.client.settings.node_config import enrol_device, enrol_simulated_device

    ledger_dir, ctx, _ = device
    restart_device()
    shutil.rmtree(ledger_dir)
    with pytest.raises(LedgerUnavailableError, match="roll-back anchor"):
        enrol_device(ctx.node_config)
    enrol_simulated_device(ctx.node_config)
    assert spent(ledger_dir)[0] == 0
    # An existing folder whose ledger was lost is no new device, for a trial either.
    (ledger_dir / LEDGER_FILE).unlink()
    with pytest.raises(LedgerUnavailableError):
        enrol_simulated_device(ctx.node_config)


def test_throw_away_devices_keep_their_anchors_in_their_own_folder(tmp_path, owner_state):
    from fedfilter.client.ledger.owner_state import owner_state_at

    with owner_state_at(tmp_path / "owner") as state:
        BudgetLedger.enrol(tmp_path / "canary", client_id="c", epsilon=1.0, delta=1e-5).close()
        assert anchor_path(tmp_path / "canary").parent.parent == state
    assert owner_state_dir_now() == owner_state and not anchor_path(tmp_path / "canary").exists()


def owner_state_dir_now():
    from fedfilter.client.ledger.owner_state import owner_state_dir

    return owner_state_dir()
