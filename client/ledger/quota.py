"""The owner's quotas, and a round's reservation that applies every cap at once.

Threat model of the quotas. The coordinator chooses run ids and can open a new Flower run whenever
it likes, so a per-run quota (``run_quota``, fixed at enrolment) bounds one run only. What a
coordinator cannot renew is set by the owner (``Quotas``, from the device's own settings): every
spend is charged to the device's ``federation`` (the name of the coordinator this device serves,
never taken from a request), which may spend at most ``coordinator`` of the lifetime budget in
total, and the device spends at most ``daily`` of it in any 24 hours (by the device's clock) across
all coordinators, which also bounds a coordinator that could pose as several. Big Bird (arXiv
2506.05290) keys budgets per querier in the same way.
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedfilter.client.ledger.schema import DAY_S, STATUSES, floats, floats_json
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.privacy.filters import GaussianFilter, round_allowance


@dataclass(frozen=True)
class Quotas:
    """The owner's caps on what one coordinator, and one day, may spend (see the module doc)."""

    federation: str = "default"  # who this device serves; all its runs are charged to it
    coordinator: float = 1.0  # share of the lifetime budget that federation may ever spend
    daily: float = 1.0  # share of the lifetime budget the device spends in any 24 hours

    def __post_init__(self):
        problems = []
        if not (isinstance(self.federation, str) and 0 < len(self.federation.strip()) <= 256):
            problems.append(
                f"federation must be a non-empty name of at most 256 characters. Found {self.federation!r}."
            )
        for name in ("coordinator", "daily"):
            q = getattr(self, name)
            if not (isinstance(q, (int, float)) and not isinstance(q, bool) and math.isfinite(q) and 0 < q <= 1):
                problems.append(f"{name} quota must be a fraction in (0, 1]. Found {q!r}.")
        if problems:
            raise ValueError(" ".join(problems))


class QuotaAccounts:
    """What the quotas have used, read from the ledger: the part of ``BudgetLedger`` (which sets every
    attribute below) that the owner's quotas need. Every spend row carries its federation's state
    after it; the daily window re-adds the charges of the last 24 hours (by the device's clock)."""

    filter: GaussianFilter
    quotas: Quotas
    coordinator_filter: GaussianFilter  # the lifetime filter scaled to each quota
    daily_filter: GaussianFilter
    clock: Callable[[], float]
    _conn: sqlite3.Connection
    _lock: threading.RLock

    def _coordinator_state_locked(self, federation: str) -> np.ndarray:
        row = self._conn.execute(
            "SELECT coordinator_state_after FROM spends WHERE coordinator=? ORDER BY seq DESC LIMIT 1", (federation,)
        ).fetchone()
        return floats(row[0]) if row else self.filter.initial_state()

    def _window_state_locked(self, since: float) -> np.ndarray:
        """Every charge recorded at or after ``since``, re-added with upward rounding."""
        state = self.filter.initial_state()
        for (charge,) in self._conn.execute("SELECT charge FROM spends WHERE created_at >= ? ORDER BY seq", (since,)):
            state = self.filter.spend(state, floats(charge))
        return state

    def _quota_caps_locked(self, coordinator_state: np.ndarray) -> list[tuple[GaussianFilter, np.ndarray]]:
        """The (filter, state) pairs a round must also fit: only the quotas the owner set below 1."""
        caps = []
        if self.quotas.coordinator < 1:
            caps.append((self.coordinator_filter, coordinator_state))
        if self.quotas.daily < 1:
            caps.append((self.daily_filter, self._window_state_locked(self.clock() - DAY_S)))
        return caps

    def coordinator_state(self, federation: str | None = None) -> np.ndarray:
        """What one federation (default: this ledger's) has spent, for its quota."""
        with self._lock:
            return self._coordinator_state_locked(federation or self.quotas.federation)


class Books(Protocol):
    """What a reservation needs from its ledger (``BudgetLedger`` is one): the filters, the quotas, the
    clock and the open connection whose write transaction holds the round."""

    filter: GaussianFilter
    run_filter: GaussianFilter
    worst_filter: GaussianFilter | None
    quotas: Quotas
    clock: Callable[[], float]
    _conn: sqlite3.Connection


class Reservation:
    """A round in progress inside the ledger's write transaction (see ``BudgetLedger.reserve``).

    ``allowance`` and ``admits`` apply every cap at once: the lifetime budget, the run quota,
    and the owner's coordinator and daily quotas (``Quotas``). The worst-case account
    (``fedfilter.client.ledger.worst_case``) is charged differently (what the report costs alone), so it
    has its own ``worst_allowance`` and ``worst_admits``. ``commit`` stores the one release (an
    ``Account`` of ``fedfilter.client.mechanisms.spend``).
    """

    def __init__(
        self,
        books: Books,
        run_id: str,
        round_id: int,
        state,
        run_state,
        coordinator_state,
        caps: list[tuple[GaussianFilter, np.ndarray]],
        worst_state: np.ndarray | None = None,
    ):
        self._books, self.run_id, self.round_id = books, run_id, round_id
        self.filter: GaussianFilter = books.filter
        self.worst_filter: GaussianFilter | None = books.worst_filter
        self.worst_state = worst_state
        self.state, self.run_state, self.coordinator_state = state, run_state, coordinator_state
        self.state_after: np.ndarray | None = None  # the lifetime state once committed
        self._caps = caps  # (filter, state) pairs beyond the lifetime and run filters
        self.recorded = False
        self.open = True

    def allowance(self, *, noise_std: float, clip: float) -> float:
        """The largest sensitivity every cap still admits at this noise, at most ``clip``."""
        books = self._books
        allow = round_allowance(
            books.filter,
            self.state,
            noise_std=noise_std,
            clip=clip,
            run_filter=books.run_filter,
            run_state=self.run_state,
        )
        for filt, state in self._caps:
            # A cap already passed (the owner lowered a quota) admits nothing. filter.allowance
            # assumes a state within its budget: it gets the state clamped to the budget (the
            # same work either way), and its answer is then overruled.
            cap = filt.allowance(np.minimum(state, filt.budget), noise_std=noise_std)
            allow = np.minimum(allow, np.where(filt.within_budget(state), cap, 0.0))
        return float(allow)

    def admits(self, charge: np.ndarray) -> bool:
        """Whether ``charge`` fits every main cap (lifetime, run, and the owner's quotas)."""
        books = self._books
        pairs = [(books.filter, self.state), (books.run_filter, self.run_state), *self._caps]
        return all(bool(f.admits(s, charge)) for f, s in pairs)

    def worst_allowance(self, *, noise_std: float, clip: float) -> float:
        """The largest sensitivity the worst-case account still admits at the noise this device adds,
        at most ``clip``; ``clip`` without a worst-case budget (local rounds only: nothing to cap)."""
        if self.worst_filter is None or self.worst_state is None:
            return float(clip)
        return float(round_allowance(self.worst_filter, self.worst_state, noise_std=noise_std, clip=clip))

    def worst_admits(self, worst_charge: np.ndarray | None) -> bool:
        """Whether ``worst_charge`` fits the worst-case account (None exactly when there is none)."""
        if self.worst_filter is None or self.worst_state is None:
            return worst_charge is None
        return worst_charge is not None and bool(self.worst_filter.admits(self.worst_state, worst_charge))

    def commit(self, record: ReleaseRecord) -> None:
        """Store the round's release: the one check that every charge fits, one spend per state.

        Raises ``RuntimeError`` (nothing stored; the transaction rolls back) when a positive charge
        does not fit a budget or quota, or the worst-case charge and account do not match. An
        exhausted release is charged 0: it is stored even when a cap the owner lowered is passed.
        """
        if record.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}. Found {record.status!r}.")
        if self.recorded or not self.open:
            raise RuntimeError("a reservation records exactly one release, inside its transaction")
        books = self._books
        charge = np.asarray(record.charge, dtype=np.float64)
        if np.any(charge > 0) and not self.admits(charge):
            raise RuntimeError("internal error: the charge exceeds a budget or quota; nothing spent")
        worst_charge, worst_after = "[]", "[]"
        if self.worst_filter is not None and self.worst_state is not None:
            if record.worst_charge is None:
                raise RuntimeError("internal error: a round without its worst-case charge; nothing spent")
            worst = np.asarray(record.worst_charge, dtype=np.float64)
            if np.any(worst > 0) and not self.worst_admits(worst):
                raise RuntimeError("internal error: the worst-case charge exceeds its budget; nothing spent")
            worst_charge, worst_after = (
                floats_json(worst),
                floats_json(self.worst_filter.spend(self.worst_state, worst)),
            )
        elif record.placement != "local" or record.worst_charge is not None:
            raise RuntimeError("internal error: a distributed round without a worst-case budget; nothing spent")
        state_after = books.filter.spend(self.state, charge)
        books._conn.execute(
            "INSERT INTO spends (run_id, round_id, status, sensitivity, noise_std, noise_multiplier,"
            " clip, placement, charge, state_after, run_state_after, created_at, coordinator,"
            " coordinator_state_after, worst_charge, worst_state_after) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
            (
                self.run_id,
                self.round_id,
                record.status,
                float(record.sensitivity),
                float(record.noise_std),
                float(record.noise_multiplier),
                float(record.clip),
                record.placement,
                floats_json(charge),
                floats_json(state_after),
                floats_json(books.run_filter.spend(self.run_state, charge)),
                books.clock(),
                books.quotas.federation,
                floats_json(books.filter.spend(self.coordinator_state, charge)),
                worst_charge,
                worst_after,
            ),
        )
        self.state_after = state_after
        self.recorded = True
