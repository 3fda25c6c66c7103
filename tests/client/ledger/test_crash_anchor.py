"""Crash orders of a spend and its roll-back anchor (client/ledger/anchor.py): a crash between the
COMMIT and the anchor, or during the anchor's write, never locks the owner out, and never lets a
restore of a released spend pass."""

import shutil
import signal

import numpy as np
import pytest
from harness.crash import CRASH_POINTS, audit, crash_once

from fedfilter.client.ledger.anchor import anchor_path, read_anchor, read_anchor_file
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import LedgerUnavailableError
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def released_rounds(directory, rounds):
    ledger = BudgetLedger.enrol(directory, client_id="crash", epsilon=50.0, delta=1e-5)
    client = FilteredClient(ledger)
    for r in rounds:
        client.release(RoundSpec("before", r, 1.0, 1.0), [np.full(4, 0.01)])
    ledger.close()


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_a_crash_at_each_point_of_a_spend(tmp_path, point):
    live, backup = tmp_path / "ledger", tmp_path / "backup"
    released_rounds(live, range(2))  # spends #1 and #2 released
    shutil.copytree(live, backup)  # the owner's backup, at #2
    assert crash_once(live, point) == signal.SIGKILL  # spend #3 committed, then the power went
    assert audit(live) == (0, 3)  # not locked out: it opens, and every release is covered
    read = read_anchor_file(anchor_path(live))
    # Before the anchor moved, #3 was never released: the anchor may still name #2, and a backup at
    # #2 loses only that unreleased spend. Once the anchor names #3, the backup is refused.
    assert read.anchor.seq == (3 if point == "after-anchor" else 2)
    assert bool(read.damaged) == (point == "mid-anchor")  # the slot being written is torn
    shutil.move(live, tmp_path / "crashed")
    shutil.copytree(backup, live)
    if point == "after-anchor":
        with pytest.raises(LedgerUnavailableError, match="behind its roll-back anchor"):
            BudgetLedger.open(live)
    elif point == "mid-anchor":
        # A torn slot cannot be told from a slot that named #3 and was damaged later: a database at #2
        # beside it is refused (the owner accepts it), though here #3 was never released.
        with pytest.raises(LedgerUnavailableError, match="damaged roll-back anchor"):
            BudgetLedger.open(live)
    else:
        BudgetLedger.open(live).close()
    # And the crashed ledger itself serves on: the next spend moves seal and anchor past #3.
    shutil.rmtree(live)
    shutil.move(tmp_path / "crashed", live)
    released_rounds(live, range(10, 11))
    assert read_anchor(anchor_path(live)).seq == 4
