"""The worst-case account's storage on the budget ledger (issue 22): its budget and its state.

What the account is and what it charges is ``fedfilter.client.ledger.worst_case``; this module keeps it on
the device's ledger, as a mixin of ``BudgetLedger`` (``fedfilter.client.ledger.budget``), under the same
lock and transaction discipline: the owner sets the budget once (``set_worst_case``, in one
``BEGIN IMMEDIATE`` transaction that also charges the spends already recorded), the device re-reads it
every round (the owner may set it while the device runs), and each spend row carries the account's
state after it (``worst_state_after``, written by ``ledger.quota.Reservation.commit``).
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from fedfilter.client.ledger.schema import Enrolment, SpendRecord, WorstCase, floats, floats_json, read_worst_case
from fedfilter.client.ledger.seal import Seal
from fedfilter.client.ledger.storage import raise_storage_error
from fedfilter.client.ledger.worst_case import check_worst_case_epsilon, past_worst_charge, worst_case_filter
from fedfilter.privacy.filters import GaussianFilter


class WorstCaseAccount:
    """The worst-case account's part of ``BudgetLedger`` (which sets every attribute below)."""

    directory: Path
    enrolment: Enrolment
    filter: GaussianFilter
    clock: Callable[[], float]
    _conn: sqlite3.Connection
    _lock: threading.RLock
    worst_case: WorstCase | None
    worst_filter: GaussianFilter | None  # None: no worst-case budget (local rounds only)

    if TYPE_CHECKING:  # the ledger's own methods this part calls

        def _check_seal(self, seal: Seal | None = None) -> None: ...

        def records(self, run_id: str | None = None) -> list[SpendRecord]: ...

        def close(self) -> None: ...

    def _load_worst_case(self) -> None:
        """(Re)read the owner's worst-case budget: the owner may set it while the device runs."""
        with self._lock:
            wc = read_worst_case(self._conn)
        if wc != self.worst_case:
            self.worst_filter = None if wc is None else worst_case_filter(self.filter, wc.epsilon)
            self.worst_case = wc

    def _enrol_worst_case(self, worst_case_epsilon: float | None) -> None:
        """At enrolment: set the worst-case budget if the ledger has none; refuse a different one."""
        if worst_case_epsilon is None:
            return
        stored = self.worst_case
        if stored is None:
            try:
                self.set_worst_case(worst_case_epsilon)
            except BaseException:
                self.close()
                raise
        elif stored.epsilon != float(worst_case_epsilon):
            self.close()
            raise ValueError(
                f"the ledger at {self.directory} has worst-case-epsilon {stored.epsilon!r}, which can never "
                f"change; requested {float(worst_case_epsilon)!r}."
            )

    def set_worst_case(self, worst_case_epsilon: float) -> WorstCase:
        """The owner's act, once: the budget against any coordinator (``fedfilter.client.ledger.worst_case``).

        Spends already recorded are charged to it conservatively (``worst_case.past_worst_charge``),
        in the same transaction; if they exceed it, the account starts spent and the device
        contributes no more data. Immutable afterwards (a trigger aborts any change).
        """
        eps = check_worst_case_epsilon(worst_case_epsilon, self.enrolment.epsilon)
        worst = worst_case_filter(self.filter, eps)
        with self._lock:
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                self._check_seal()
                if read_worst_case(self._conn) is not None:
                    raise ValueError(
                        f"the ledger at {self.directory} already has a worst-case budget, which can never change."
                    )
                state, last = worst.initial_state(), 0
                for rec in self.records():
                    charge = past_worst_charge(
                        worst,
                        placement=rec.placement,
                        charge=rec.charge,
                        sensitivity=rec.sensitivity,
                        noise_std=rec.noise_std,
                        clip=rec.clip,
                    )
                    state, last = worst.spend(state, charge), rec.seq
                self._conn.execute(
                    "INSERT INTO worst_case VALUES (1,?,?,?,?)", (eps, self.clock(), last, floats_json(state))
                )
                self._conn.execute("COMMIT")
            except BaseException as err:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                if isinstance(err, sqlite3.Error):
                    raise_storage_error(self.directory, err)
                raise
        self._load_worst_case()
        if self.worst_case is None:
            raise RuntimeError("internal error: the worst-case budget was not stored")
        return self.worst_case

    # --- reading ------------------------------------------------------------------------------
    def _worst_state_locked(self) -> np.ndarray | None:
        """The worst-case account's state (None without a worst-case budget)."""
        wc = self.worst_case
        if wc is None:
            return None
        row = self._conn.execute(
            "SELECT worst_state_after FROM spends WHERE seq > ? ORDER BY seq DESC LIMIT 1", (wc.after_seq,)
        ).fetchone()
        return floats(row[0]) if row else wc.initial_state

    def current_worst_filter(self) -> GaussianFilter | None:
        """The worst-case account's filter as the ledger holds it now (the owner may have just set it)."""
        self._load_worst_case()
        return self.worst_filter

    def worst_state(self) -> np.ndarray | None:
        """The worst-case account's state: what the reports cost against any coordinator."""
        with self._lock:
            self._load_worst_case()
            return self._worst_state_locked()

    def worst_summary(self) -> dict | None:
        """The owner's view of the account (``BudgetLedger.summary``'s ``worst_case``); None without one."""
        worst_state, wc, wf = self.worst_state(), self.worst_case, self.worst_filter
        if wc is None or wf is None or worst_state is None:
            return None
        return {
            "budget_epsilon": wc.epsilon,
            "budget_delta": self.enrolment.delta,
            "spent_epsilon": wf.epsilon_spent(worst_state),
            "remaining_fraction": float(wf.remaining_fraction(worst_state)),
            "set_at": wc.set_at,
            "spends_before": wc.after_seq,  # spends recorded before it was set, charged conservatively
        }
