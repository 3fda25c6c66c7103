"""What the roll-back anchor is bound to: its ledger directory and its enrolment.

Attacks from an audit of client/ledger/anchor.py (DESIGN.md invariant 6): another directory's ledger
brought in with its anchor renamed to this directory's key; a copy of a ledger taken after enrolment,
before its first spend. Each gave budget back without the owner; each is refused now, with nothing spent.
"""

import shutil

import pytest
from helpers.ledger import assert_refused, restart_device, serve, spend_rows, spent
from helpers.mods import context

from fedfilter.client.ledger.anchor import anchor_path
from fedfilter.client.ledger.budget import BudgetLedger
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
