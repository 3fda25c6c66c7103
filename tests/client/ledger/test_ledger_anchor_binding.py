"""What the roll-back anchor is bound to: its ledger directory, its enrolment, and both of its slots.

Attacks from an audit of client/ledger/anchor.py (the design's invariant 6): another directory's ledger
brought in with its anchor renamed to this directory's key; a damaged newest anchor slot together with
a ledger copy one spend older; a copy of a ledger taken after enrolment, before its first spend. Each
gave budget back without the owner; each is refused now, with nothing spent.
"""

import shutil

import pytest
from helpers.ledger import assert_refused, restart_device, serve, spend_rows, spent
from helpers.mods import context

from fedfilter.client.ledger.anchor import anchor_path
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.owner import inspect
from fedfilter.client.ledger.storage import LedgerUnavailableError

BUDGET = {"budget-epsilon": 20.0}


def replace_dir(source, target):
    shutil.rmtree(target)
    shutil.copytree(source, target)


def test_another_directorys_ledger_with_its_anchor_renamed_to_this_directorys_key_is_refused(tmp_path, caplog):
    restart_device()
    here, there = tmp_path / "here" / "ledger", tmp_path / "there" / "ledger"
    ctx = context(tmp_path / "here", **BUDGET)
    serve(ctx, range(1, 7))  # this device spent six rounds here
    serve(context(tmp_path / "there", **BUDGET), (1,))  # another ledger, one spend
    restart_device()
    replace_dir(there, here)
    shutil.copyfile(anchor_path(there), anchor_path(here))  # the other anchor, under this directory's name
    with pytest.raises(LedgerUnavailableError, match="another ledger directory") as err:
        BudgetLedger.open(here)
    assert str(here.resolve()) in str(err.value) and str(there.resolve()) in str(err.value)
    assert "accept-restore" in str(err.value)  # the owner acts
    assert_refused(ctx, caplog, "another ledger directory", str(there.resolve()))
    assert spend_rows(here) == 1  # nothing spent
    view = inspect(here)  # what accept-restore shows: that anchor says nothing about this directory
    assert str(there.resolve()) in view.anchored and view.at_risk_epsilon is None


def _slot_naming(raw: bytes, seq: int) -> int:
    half = len(raw) // 2
    (slot,) = [i for i in (0, 1) if f'"seq": {seq},'.encode() in raw[i * half : (i + 1) * half]]
    return slot


@pytest.mark.parametrize("damage", ["bit rot", "zeroed"])
def test_a_damaged_newest_anchor_slot_and_a_copy_one_spend_older_are_refused(tmp_path, caplog, damage):
    # Spend #6 was released, so its anchor slot was written in full; later damage to that slot must not
    # let a copy of the ledger at #5 spend #6's budget again.
    restart_device()
    ledger_dir = tmp_path / "ledger"
    ctx = context(tmp_path, **BUDGET)
    serve(ctx, range(1, 6))
    shutil.copytree(ledger_dir, tmp_path / "at-5")
    serve(ctx, (6,))
    restart_device()
    path = anchor_path(ledger_dir)
    raw = bytearray(path.read_bytes())
    half, slot = len(raw) // 2, _slot_naming(raw, 6)
    if damage == "bit rot":
        raw[raw.index(b'"digest": "', slot * half) + 11] ^= 1  # one bit of the slot
    else:
        raw[slot * half : (slot + 1) * half] = bytes(half)  # a hole, e.g. a partly restored state directory
    path.write_bytes(bytes(raw))
    replace_dir(tmp_path / "at-5", ledger_dir)
    with pytest.raises(LedgerUnavailableError, match="damaged roll-back anchor") as err:
        BudgetLedger.open(ledger_dir)
    assert "#5" in str(err.value) and "accept-restore" in str(err.value)
    assert_refused(ctx, caplog, "damaged roll-back anchor")
    assert spend_rows(ledger_dir) == 5  # nothing spent
    view = inspect(ledger_dir)  # what accept-restore shows
    assert "damaged" in view.anchored and view.at_risk_epsilon is None


def test_a_copy_taken_after_enrolment_before_any_spend_is_no_second_budget(tmp_path, caplog):
    restart_device()
    ledger_dir, copy = tmp_path / "ledger", tmp_path / "copy" / "ledger"
    ctx = context(tmp_path, **BUDGET)  # enrolled, nothing spent yet
    shutil.copytree(ledger_dir, copy)
    copy_ctx = context(tmp_path / "copy", **BUDGET)  # a second device from the copy
    serve(ctx, range(1, 4))
    with pytest.raises(LedgerUnavailableError, match="no roll-back anchor") as err:
        BudgetLedger.open(copy)
    assert "enrol" in str(err.value) and "accept-restore" in str(err.value)
    assert_refused(copy_ctx, caplog, "no roll-back anchor")
    assert spend_rows(copy) == 0  # nothing spent
    assert spent(ledger_dir)[0] == 3  # the original serves on


def test_a_copy_taken_after_enrolment_restored_over_the_spent_original_is_refused(tmp_path, caplog):
    restart_device()
    ledger_dir = tmp_path / "ledger"
    ctx = context(tmp_path, **BUDGET)
    shutil.copytree(ledger_dir, tmp_path / "enrolled")
    serve(ctx, range(1, 4))
    restart_device()
    replace_dir(tmp_path / "enrolled", ledger_dir)
    with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
        BudgetLedger.open(ledger_dir)
    assert_refused(ctx, caplog, "behind its roll-back anchor", "#3")
    assert spend_rows(ledger_dir) == 0


def test_a_spend_whose_anchor_write_failed_is_anchored_before_the_next_so_damage_cannot_hide_two(
    tmp_path, caplog, monkeypatch
):
    # If #3 were anchored straight over #1 (skipping #2, whose anchor write failed), damage to #3's slot
    # plus a copy at #2 would look like a torn write of #2 and give #3, released, back.
    from fedfilter.client.ledger import anchor as anchor_module

    restart_device()
    ledger_dir = tmp_path / "ledger"
    ctx = context(tmp_path, **BUDGET)
    serve(ctx, (1,))
    write = anchor_module.write_anchor

    def disk_error(*args, **kwargs):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(anchor_module, "write_anchor", disk_error)
    with pytest.raises(AssertionError, match="cannot be written"):
        serve(ctx, (2,))  # #2 committed, its anchor write failed: not released
    monkeypatch.setattr(anchor_module, "write_anchor", write)
    assert spend_rows(ledger_dir) == 2
    shutil.copytree(ledger_dir, tmp_path / "at-2")
    serve(ctx, (3,))
    restart_device()
    path = anchor_path(ledger_dir)
    raw = bytearray(path.read_bytes())
    half = len(raw) // 2
    assert {_slot_naming(raw, 2), _slot_naming(raw, 3)} == {0, 1}  # #2 anchored before #3
    slot = _slot_naming(raw, 3)
    raw[raw.index(b'"digest": "', slot * half) + 11] ^= 1
    path.write_bytes(bytes(raw))
    replace_dir(tmp_path / "at-2", ledger_dir)
    with pytest.raises(LedgerUnavailableError, match="damaged roll-back anchor"):
        BudgetLedger.open(ledger_dir)
    assert spend_rows(ledger_dir) == 2


def test_the_owner_can_inspect_a_ledger_enrolled_with_nothing_spent(tmp_path):
    # The anchor written at enrolment holds an empty state: what it names must read as nothing spent
    # (inspect used to fail on it, so `fedfilter ledger accept-restore` could not show such a ledger).
    restart_device()
    context(tmp_path, **BUDGET)  # enrolled, nothing spent yet
    view = inspect(tmp_path / "ledger")
    assert view.refused is None
    assert "spend #0, lifetime epsilon spent 0 " in view.database
    assert "spend #0, lifetime epsilon spent 0 " in view.anchored
    assert view.at_risk_epsilon == 0.0
