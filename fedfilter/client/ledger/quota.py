"""The owner's quotas, and a round's reservation that applies every cap at once.

Threat model of the quotas. The coordinator chooses run ids and can open a new Flower run whenever
it likes, so a per-run quota (``run_quota``, fixed at enrolment) bounds one run only. What a
coordinator cannot renew is set by the owner (``Quotas``, from the device's own settings): every
spend is charged to the device's ``federation`` (the name of the coordinator this device serves,
never taken from a request), which may spend at most ``coordinator`` of the lifetime budget in
total, and the device spends at most ``daily`` of it in any 24 hours (by the device's clock) across
all coordinators, which also bounds a coordinator that could pose as several. Big Bird (arXiv
2506.05290) keys budgets per querier in the same way.

Each quota caps both accounts (``fedfilter.client.ledger.worst_case``): the main one at its fraction of
the lifetime budget, the worst-case one at the same fraction of the worst-case budget, over the
worst-case charges of the same spends (the run's, the federation's, the last 24 hours'). A round's
allowance is the smallest any cap of either account admits, so a round goes ahead only if both
accounts' quotas admit it; a quota that binds is exhaustion for the device (``spend.nothing_left``).
"""

from __future__ import annotations

import math
import sqlite3
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from fedfilter.client.ledger.schema import DAY_S, STATUSES, Enrolment, WorstCase, floats, floats_json
from fedfilter.client.ledger.worst_case import past_worst_charge
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.privacy.filters import GaussianFilter, round_allowance

# A cap a round must fit: what it is (named in a refusal), its filter, and its state.
Cap = tuple[str, GaussianFilter, np.ndarray]
MAIN, WORST = "the main account", "the worst-case account"


def within_caps(allow, caps: list[Cap], *, noise_std):
    """``allow`` capped by what each cap still admits at ``noise_std``; a cap already passed (the owner
    lowered a quota) admits nothing. The device's reservation and the engine's rows both call this.

    ``filter.allowance`` assumes a state within its budget: it gets the state clamped to the budget
    (the same work either way), and its answer is then overruled.
    """
    for _, filt, state in caps:
        cap = filt.allowance(np.minimum(state, filt.budget), noise_std=noise_std)
        allow = np.minimum(allow, np.where(filt.within_budget(state), cap, 0.0))
    return allow


def refusing(caps: list[Cap], charge) -> list[str]:
    """The names of the caps ``charge`` does not fit (every row, in the engine)."""
    return [name for name, filt, state in caps if not bool(np.all(filt.admits(state, charge)))]


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
    enrolment: Enrolment
    coordinator_filter: GaussianFilter  # the lifetime filter scaled to each quota
    daily_filter: GaussianFilter
    worst_case: WorstCase | None
    worst_filter: GaussianFilter | None
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

    def _quota_caps_locked(self, run_id: str, coordinator_state: np.ndarray) -> tuple[list[Cap], list[Cap]]:
        """The caps a round must also fit, only the quotas the owner set below 1: the main account's
        (coordinator, daily; its run quota is ``run_filter``) and the worst-case account's (run,
        coordinator, daily: the same fractions of its budget). The device's clock is read once."""
        since = self.clock() - DAY_S
        caps: list[Cap] = []
        if self.quotas.coordinator < 1:
            caps.append((f"{MAIN}'s coordinator quota", self.coordinator_filter, coordinator_state))
        if self.quotas.daily < 1:
            caps.append((f"{MAIN}'s daily quota", self.daily_filter, self._window_state_locked(since)))
        worst_caps: list[Cap] = []
        if self.worst_filter is None or self.worst_case is None:
            return caps, worst_caps
        for name, fraction, where, params in (
            ("run quota", self.enrolment.run_quota, "run_id=?", (run_id,)),
            ("coordinator quota", self.quotas.coordinator, "coordinator=?", (self.quotas.federation,)),
            ("daily quota", self.quotas.daily, "created_at >= ?", (since,)),
        ):
            if fraction < 1:
                worst_caps.append(
                    (f"{WORST}'s {name}", self.worst_filter.scaled(fraction), self._worst_sum_locked(where, params))
                )
        return caps, worst_caps

    def _worst_sum_locked(self, where: str, params: tuple) -> np.ndarray:
        """The worst-case charges of the spends ``where`` selects, re-added in order with the account's own
        rounding; a spend recorded before the account existed counts its conservative charge
        (``worst_case.past_worst_charge``), as the account itself did when it was set."""
        worst = self.worst_filter
        if worst is None:
            raise RuntimeError("internal error: worst-case quotas without a worst-case account")
        state = worst.initial_state()
        rows = self._conn.execute(
            "SELECT placement, charge, sensitivity, noise_std, clip, worst_charge FROM spends WHERE "
            + where  # one of three constant clauses (_quota_caps_locked); the values are bound
            + " ORDER BY seq",
            params,
        )
        for placement, charge, sensitivity, noise_std, clip, worst_charge in rows:
            if worst_charge != "[]":
                cost = floats(worst_charge)
            else:
                cost = past_worst_charge(
                    worst,
                    placement=placement,
                    charge=floats(charge),
                    sensitivity=sensitivity,
                    noise_std=noise_std,
                    clip=clip,
                )
            state = worst.spend(state, cost)
        return state

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

    ``allowance`` and ``admits`` apply every cap of the main account at once: the lifetime budget, the
    run quota, and the owner's coordinator and daily quotas (``Quotas``). The worst-case account
    (``fedfilter.client.ledger.worst_case``) is charged differently (what the report costs alone), so it
    has its own ``worst_allowance`` and ``worst_admits``, under the same quotas of its own budget.
    ``commit`` stores the one release (an ``Account`` of ``fedfilter.client.mechanisms.spend``).
    """

    def __init__(
        self,
        books: Books,
        run_id: str,
        round_id: int,
        state,
        run_state,
        coordinator_state,
        caps: list[Cap],
        worst_state: np.ndarray | None = None,
        worst_caps: list[Cap] | None = None,
    ):
        self._books, self.run_id, self.round_id = books, run_id, round_id
        self.filter: GaussianFilter = books.filter
        self.worst_filter: GaussianFilter | None = books.worst_filter
        self.worst_state = worst_state
        self.state, self.run_state, self.coordinator_state = state, run_state, coordinator_state
        self.state_after: np.ndarray | None = None  # the lifetime state once committed
        self._caps = caps  # the main account's caps beyond the lifetime and run filters
        self._worst_caps = worst_caps or []  # the worst-case account's quotas
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
        return float(within_caps(allow, self._caps, noise_std=noise_std))

    def _main_caps(self) -> list[Cap]:
        books = self._books
        return [
            (f"{MAIN}'s lifetime budget", books.filter, self.state),
            (f"{MAIN}'s run quota", books.run_filter, self.run_state),
            *self._caps,
        ]

    def _all_worst_caps(self) -> list[Cap]:
        if self.worst_filter is None or self.worst_state is None:
            return []
        return [(f"{WORST}'s budget", self.worst_filter, self.worst_state), *self._worst_caps]

    def admits(self, charge: np.ndarray) -> bool:
        """Whether ``charge`` fits every main cap (lifetime, run, and the owner's quotas)."""
        return not refusing(self._main_caps(), charge)

    def worst_allowance(self, *, noise_std: float, clip: float) -> float:
        """The largest sensitivity the worst-case account and its quotas still admit at the noise this
        device adds, at most ``clip``; ``clip`` without a worst-case budget (local rounds only: nothing
        to cap)."""
        if self.worst_filter is None or self.worst_state is None:
            return float(clip)
        allow = round_allowance(self.worst_filter, self.worst_state, noise_std=noise_std, clip=clip)
        return float(within_caps(allow, self._worst_caps, noise_std=noise_std))

    def worst_admits(self, worst_charge: np.ndarray | None) -> bool:
        """Whether ``worst_charge`` fits the worst-case account and its quotas (None exactly when there is none)."""
        if self.worst_filter is None or self.worst_state is None:
            return worst_charge is None
        return worst_charge is not None and not refusing(self._all_worst_caps(), worst_charge)

    def commit(self, record: ReleaseRecord) -> None:
        """Store the round's release: the one check that every charge fits, one spend per state.

        Raises ``RuntimeError`` (nothing stored; the transaction rolls back) naming the account and
        the budget or quota a positive charge does not fit, or when the worst-case charge and account
        do not match. An exhausted release is charged 0: it is stored even when a cap the owner
        lowered is passed.
        """
        if record.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}. Found {record.status!r}.")
        if self.recorded or not self.open:
            raise RuntimeError("a reservation records exactly one release, inside its transaction")
        books = self._books
        charge = np.asarray(record.charge, dtype=np.float64)
        if np.any(charge > 0) and (over := refusing(self._main_caps(), charge)):
            raise RuntimeError(f"internal error: the charge exceeds {' and '.join(over)}; nothing spent")
        worst_charge, worst_after = "[]", "[]"
        if self.worst_filter is not None and self.worst_state is not None:
            if record.worst_charge is None:
                raise RuntimeError("internal error: a round without its worst-case charge; nothing spent")
            worst = np.asarray(record.worst_charge, dtype=np.float64)
            if np.any(worst > 0) and (over := refusing(self._all_worst_caps(), worst)):
                raise RuntimeError(f"internal error: the worst-case charge exceeds {' and '.join(over)}; nothing spent")
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
