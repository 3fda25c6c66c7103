"""The worst-case account as the budget ledger keeps it: its budget and its state, on the ledger's database.

What the account is and what it charges is ``fedfilter.client.ledger.worst_case``; this module keeps it
on the device's ledger, an object ``BudgetLedger`` (``fedfilter.client.ledger.budget``) holds and calls
under its own lock and transaction discipline: the owner sets the budget once (``create_locked``, inside
the ledger's ``BEGIN IMMEDIATE`` transaction that also charges the spends already recorded), the device
re-reads it every round (the owner may set it while the device runs), and each spend row carries the
account's state after it (``worst_state_after``, written by ``ledger.quota.Reservation.commit``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from fedfilter.client.ledger.schema import SpendRecord, WorstCase, floats, floats_json, read_worst_case
from fedfilter.client.ledger.worst_case import past_worst_charge, worst_case_filter
from fedfilter.privacy.filters import GaussianFilter


class WorstCaseAccount:
    """The worst-case account on a ledger's database: the owner's budget against any coordinator (set
    once) and what the reports have cost against it.

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger's open database.
    lock : threading.RLock
        The ledger's lock: every read and write of the database holds it.
    main_filter : GaussianFilter
        The lifetime (main) filter; the account's filter is it, rescaled to the worst-case budget.
    directory : pathlib.Path
        The ledger's folder (named in errors).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.budget import BudgetLedger
    >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
    ...                             state_dir=tempfile.mkdtemp(), worst_case_epsilon=8.0)
    >>> ledger.worst_account.worst_case.epsilon, ledger.worst_account.filter is ledger.worst_filter
    (8.0, True)
    >>> ledger.close()
    """

    def __init__(self, conn: sqlite3.Connection, lock: threading.RLock, main_filter: GaussianFilter, directory: Path):
        self._conn, self._lock, self._main, self._directory = conn, lock, main_filter, directory
        self.worst_case: WorstCase | None = None  # the owner's budget as stored (None: not set)
        self.filter: GaussianFilter | None = None  # None: no worst-case budget (local rounds only)
        self.load()

    def load(self) -> None:
        """(Re)read the owner's worst-case budget: the owner may set it while the device runs.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.worst_account.load()
        >>> ledger.worst_account.worst_case is None
        True
        >>> ledger.close()
        """
        with self._lock:
            wc = read_worst_case(self._conn)
        if wc != self.worst_case:
            self.filter = None if wc is None else worst_case_filter(self._main, wc.epsilon)
            self.worst_case = wc

    def create_locked(self, epsilon: float, records: Sequence[SpendRecord], set_at: float) -> None:
        """Store the owner's worst-case budget ``epsilon``, charging the spends already recorded
        conservatively (``worst_case.past_worst_charge``); the caller holds the ledger's write
        transaction and commits it. Refused if the ledger already has one (it can never change).

        Parameters
        ----------
        epsilon : float
            The budget, already checked (``worst_case.check_worst_case_epsilon``).
        records : sequence of SpendRecord
            Every spend recorded so far, in order, read inside the same transaction.
        set_at : float
            The device's clock.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.set_worst_case(8.0).epsilon  # the ledger's transaction around create_locked
        8.0
        >>> ledger.close()
        """
        if read_worst_case(self._conn) is not None:
            raise ValueError(
                f"the ledger at {self._directory} already has a worst-case budget, which can never change."
            )
        worst = worst_case_filter(self._main, epsilon)
        state, last = worst.initial_state(), 0
        for rec in records:
            charge = past_worst_charge(
                worst, placement=rec.placement, sensitivity=rec.sensitivity, noise_std=rec.noise_std, clip=rec.clip
            )
            state, last = worst.spend(state, charge), rec.seq
        self._conn.execute("INSERT INTO worst_case VALUES (1,?,?,?,?)", (epsilon, set_at, last, floats_json(state)))

    def state_locked(self) -> np.ndarray | None:
        """The account's state as of the latest spend (None without a worst-case budget); the caller
        holds the ledger's lock.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp(), worst_case_epsilon=8.0)
        >>> float(ledger.worst_account.state_locked().sum())
        0.0
        >>> ledger.close()
        """
        wc = self.worst_case
        if wc is None:
            return None
        row = self._conn.execute(
            "SELECT worst_state_after FROM spends WHERE seq > ? ORDER BY seq DESC LIMIT 1", (wc.after_seq,)
        ).fetchone()
        return floats(row[0]) if row else wc.initial_state

    def summary(self, state: np.ndarray | None, delta: float) -> dict | None:
        """The owner's view of the account at ``state`` (None without one).

        Parameters
        ----------
        state : numpy.ndarray or None
            The account's state (``state_locked``).
        delta : float
            The enrolment's delta (the account shares it).

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp(), worst_case_epsilon=8.0)
        >>> ledger.worst_account.summary(ledger.worst_state(), 1e-5)["budget_epsilon"]
        8.0
        >>> ledger.close()
        """
        wc, wf = self.worst_case, self.filter
        if wc is None or wf is None or state is None:
            return None
        return {
            "budget_epsilon": wc.epsilon,
            "budget_delta": delta,
            "spent_epsilon": wf.epsilon_spent(state),
            "remaining_fraction": float(wf.remaining_fraction(state)),
            "set_at": wc.set_at,
            "spends_before": wc.after_seq,  # spends recorded before it was set, charged conservatively
        }
