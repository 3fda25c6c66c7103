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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from fedfilter.client.ledger.schema import DAY_S, STATUSES, floats, floats_json
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

    Parameters
    ----------
    allow : float or numpy.ndarray
        The allowance before these caps (one per row in the engine).
    caps : list of Cap
        ``(name, filter, state)`` of each cap.
    noise_std : float
        The noise std of the release.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("gdp", 1.0, 1e-5, None)
    >>> float(within_caps(1.0, [("spent", filt, filt.budget * 2)], noise_std=1.0))  # a passed cap admits 0
    0.0
    """
    for _, filt, state in caps:
        cap = filt.allowance(np.minimum(state, filt.budget), noise_std=noise_std)
        allow = np.minimum(allow, np.where(filt.within_budget(state), cap, 0.0))
    return allow


def refusing(caps: list[Cap], charge) -> list[str]:
    """The names of the caps ``charge`` does not fit (every row, in the engine).

    Parameters
    ----------
    caps : list of Cap
        ``(name, filter, state)`` of each cap.
    charge : numpy.ndarray
        The charge of the release.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> filt = make_filter("gdp", 1.0, 1e-5, None)
    >>> refusing([("fresh", filt, filt.initial_state())], filt.budget * 2)
    ['fresh']
    """
    return [name for name, filt, state in caps if not bool(np.all(filt.admits(state, charge)))]


@dataclass(frozen=True)
class Quotas:
    """The owner's caps on what one coordinator, and one day, may spend (see the module doc).

    Parameters
    ----------
    federation : str, optional
        Who this device serves; all its runs are charged to it.
    coordinator : float, optional
        The share of the lifetime budget that federation may ever spend, in (0, 1].
    daily : float, optional
        The share of the lifetime budget the device spends in any 24 hours, in (0, 1].

    Examples
    --------
    >>> Quotas(federation="hospital-a", daily=0.1).coordinator
    1.0
    >>> Quotas(daily=0.0)
    Traceback (most recent call last):
    ...
    ValueError: daily quota must be a fraction in (0, 1]. Found 0.0.
    """

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
    """What the owner's quotas have used, read from the ledger's database: the federation's spending,
    the last 24 hours', and the worst-case account's under the same quotas. Every spend row carries its
    federation's state after it; the daily window re-adds the charges of the last 24 hours.

    Held by ``BudgetLedger``; every ``*_locked`` method runs inside the ledger's lock (and, for a
    round, its write transaction), on the ledger's connection.

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger's open database.
    main_filter : GaussianFilter
        The lifetime (main) filter; each quota is a fraction of it.
    quotas : Quotas
        The owner's coordinator and daily quotas, and the federation this device serves.
    run_quota : float
        The enrolment's per-run quota (the worst-case account applies it too).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.budget import BudgetLedger
    >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
    ...                             quotas=Quotas(daily=0.5), state_dir=tempfile.mkdtemp())
    >>> accounts = ledger.quota_accounts
    >>> caps, worst_caps = accounts.caps_locked("run", accounts.coordinator_state_locked("default"),
    ...                                         now=0.0, worst_filter=None)
    >>> [name for name, _, _ in caps], worst_caps
    (["the main account's daily quota"], [])
    >>> ledger.close()
    """

    def __init__(self, conn: sqlite3.Connection, main_filter: GaussianFilter, quotas: Quotas, run_quota: float):
        self._conn, self.filter, self.quotas, self.run_quota = conn, main_filter, quotas, run_quota
        self.coordinator_filter: GaussianFilter = main_filter.scaled(quotas.coordinator)
        self.daily_filter: GaussianFilter = main_filter.scaled(quotas.daily)

    def coordinator_state_locked(self, federation: str) -> np.ndarray:
        """What ``federation`` has spent: the state its latest spend row carries.

        Parameters
        ----------
        federation : str
            The coordinator's name as the device records it.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> float(ledger.quota_accounts.coordinator_state_locked("default").sum())
        0.0
        >>> ledger.close()
        """
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

    def caps_locked(
        self, run_id: str, coordinator_state: np.ndarray, *, now: float, worst_filter: GaussianFilter | None
    ) -> tuple[list[Cap], list[Cap]]:
        """The caps a round must also fit, only the quotas the owner set below 1: the main account's
        (coordinator, daily; its run quota is the ledger's ``run_filter``) and the worst-case account's
        (run, coordinator, daily: the same fractions of its budget).

        Parameters
        ----------
        run_id : str
            The round's run.
        coordinator_state : numpy.ndarray
            The federation's state (``coordinator_state_locked``), read once for the round.
        now : float
            The device's clock, read once for the round: the daily window is the 24 hours before it.
        worst_filter : GaussianFilter or None
            The worst-case account's filter (None: no worst-case budget, no worst-case caps).

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> ledger.quota_accounts.caps_locked("run", ledger.state(), now=0.0, worst_filter=None)
        ([], [])
        >>> ledger.close()
        """
        since = now - DAY_S
        caps: list[Cap] = []
        if self.quotas.coordinator < 1:
            caps.append((f"{MAIN}'s coordinator quota", self.coordinator_filter, coordinator_state))
        if self.quotas.daily < 1:
            caps.append((f"{MAIN}'s daily quota", self.daily_filter, self._window_state_locked(since)))
        worst_caps: list[Cap] = []
        if worst_filter is None:
            return caps, worst_caps
        for name, fraction, where, params in (
            ("run quota", self.run_quota, "run_id=?", (run_id,)),
            ("coordinator quota", self.quotas.coordinator, "coordinator=?", (self.quotas.federation,)),
            ("daily quota", self.quotas.daily, "created_at >= ?", (since,)),
        ):
            if fraction < 1:
                state = self._worst_sum_locked(worst_filter, where, params)
                worst_caps.append((f"{WORST}'s {name}", worst_filter.scaled(fraction), state))
        return caps, worst_caps

    def _worst_sum_locked(self, worst: GaussianFilter, where: str, params: tuple) -> np.ndarray:
        """The worst-case charges of the spends ``where`` selects, re-added in order with the account's own
        rounding; a spend recorded before the account existed counts its conservative charge
        (``worst_case.past_worst_charge``), as the account itself did when it was set."""
        state = worst.initial_state()
        rows = self._conn.execute(
            "SELECT placement, sensitivity, noise_std, clip, worst_charge FROM spends WHERE "
            + where  # one of three constant clauses (caps_locked); the values are bound
            + " ORDER BY seq",
            params,
        )
        for placement, sensitivity, noise_std, clip, worst_charge in rows:
            if worst_charge != "[]":
                cost = floats(worst_charge)
            else:
                cost = past_worst_charge(
                    worst, placement=placement, sensitivity=sensitivity, noise_std=noise_std, clip=clip
                )
            state = worst.spend(state, cost)
        return state


class Reservation:
    """A round in progress inside the ledger's write transaction (see ``BudgetLedger.reserve``).

    ``allowance`` and ``admits`` apply every cap of the main account at once: the lifetime budget, the
    run quota, and the owner's coordinator and daily quotas (``Quotas``). The worst-case account
    (``fedfilter.client.ledger.worst_case``) is charged differently (what the report costs alone), so it
    has its own ``worst_allowance`` and ``worst_admits``, under the same quotas of its own budget.
    ``commit`` stores the one release (an ``Account`` of ``fedfilter.client.mechanisms.spend``).
    Made by ``BudgetLedger.reserve`` only.

    Parameters
    ----------
    conn : sqlite3.Connection
        The ledger's database, inside the round's write transaction.
    filters : tuple
        The main (lifetime) filter, the run filter, and the worst-case filter (None without one).
    federation : str
        The coordinator the spend is charged to (the owner's ``Quotas.federation``).
    clock : callable
        The device's clock (``created_at`` of the spend row).
    run_id, round_id : str, int
        The round.
    state, run_state, coordinator_state : numpy.ndarray
        The main account's states before the round: lifetime, run, federation.
    caps : list
        The main account's caps beyond the lifetime and run filters (``QuotaAccounts.caps_locked``).
    worst_state : numpy.ndarray, optional
        The worst-case account's state (None without one).
    worst_caps : list, optional
        The worst-case account's quota caps.
    asks_in_run : int, optional
        The rounds of this run the ledger already holds (every status).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.ledger.budget import BudgetLedger
    >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
    ...                             state_dir=tempfile.mkdtemp())
    >>> with ledger.reserve("run", 0) as reservation:
    ...     print(0 < reservation.allowance(noise_std=1.0, clip=1.0) <= 1.0)
    True
    >>> ledger.close()
    """

    def __init__(
        self,
        conn: sqlite3.Connection,
        filters: tuple[GaussianFilter, GaussianFilter, GaussianFilter | None],
        federation: str,
        clock: Callable[[], float],
        run_id: str,
        round_id: int,
        state,
        run_state,
        coordinator_state,
        caps: list[Cap],
        worst_state: np.ndarray | None = None,
        worst_caps: list[Cap] | None = None,
        *,
        asks_in_run: int = 0,
    ):
        self._conn, self._federation, self._clock = conn, federation, clock
        self.run_id, self.round_id = run_id, round_id
        self.filter, self.run_filter, self.worst_filter = filters
        self.worst_state = worst_state
        self.state, self.run_state, self.coordinator_state = state, run_state, coordinator_state
        self.state_after: np.ndarray | None = None  # the lifetime state once committed
        self._caps = caps  # the main account's caps beyond the lifetime and run filters
        self._worst_caps = worst_caps or []  # the worst-case account's quotas
        self.asks_in_run = asks_in_run
        self.recorded = False
        self.open = True

    def allowance(self, *, noise_std: float, clip: float) -> float:
        """The largest sensitivity every cap still admits at this noise, at most ``clip``.

        Parameters
        ----------
        noise_std : float
            The noise std of the release.
        clip : float
            The largest sensitivity the round asks for.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> with ledger.reserve("run", 0) as reservation:
        ...     print(reservation.allowance(noise_std=1.0, clip=0.5))
        0.5
        >>> ledger.close()
        """
        allow = round_allowance(
            self.filter,
            self.state,
            noise_std=noise_std,
            clip=clip,
            run_filter=self.run_filter,
            run_state=self.run_state,
        )
        return float(within_caps(allow, self._caps, noise_std=noise_std))

    def _main_caps(self) -> list[Cap]:
        return [
            (f"{MAIN}'s lifetime budget", self.filter, self.state),
            (f"{MAIN}'s run quota", self.run_filter, self.run_state),
            *self._caps,
        ]

    def _all_worst_caps(self) -> list[Cap]:
        if self.worst_filter is None or self.worst_state is None:
            return []
        return [(f"{WORST}'s budget", self.worst_filter, self.worst_state), *self._worst_caps]

    def admits(self, charge: np.ndarray) -> bool:
        """Whether ``charge`` fits every main cap (lifetime, run, and the owner's quotas).

        Parameters
        ----------
        charge : numpy.ndarray
            The release's charge to the main account.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> with ledger.reserve("run", 0) as reservation:
        ...     print(reservation.admits(reservation.filter.budget * 2))
        False
        >>> ledger.close()
        """
        return not refusing(self._main_caps(), charge)

    def worst_allowance(self, *, noise_std: float, clip: float) -> float:
        """The largest sensitivity the worst-case account and its quotas still admit at the noise this
        device adds, at most ``clip``; ``clip`` without a worst-case budget (local rounds only: nothing
        to cap).

        Parameters
        ----------
        noise_std : float
            The noise std this device adds.
        clip : float
            The largest sensitivity the round asks for.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> with ledger.reserve("run", 0) as reservation:
        ...     print(reservation.worst_allowance(noise_std=1.0, clip=0.5))
        0.5
        >>> ledger.close()
        """
        if self.worst_filter is None or self.worst_state is None:
            return float(clip)
        allow = round_allowance(self.worst_filter, self.worst_state, noise_std=noise_std, clip=clip)
        return float(within_caps(allow, self._worst_caps, noise_std=noise_std))

    def worst_admits(self, worst_charge: np.ndarray | None) -> bool:
        """Whether ``worst_charge`` fits the worst-case account and its quotas (None exactly when there is none).

        Parameters
        ----------
        worst_charge : numpy.ndarray or None
            The release's worst-case charge.

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> with ledger.reserve("run", 0) as reservation:
        ...     print(reservation.worst_admits(None))
        True
        >>> ledger.close()
        """
        if self.worst_filter is None or self.worst_state is None:
            return worst_charge is None
        return worst_charge is not None and not refusing(self._all_worst_caps(), worst_charge)

    def commit(self, record: ReleaseRecord) -> None:
        """Store the round's release: the one check that every charge fits, one spend per state.

        Raises ``RuntimeError`` (nothing stored; the transaction rolls back) naming the account and
        the budget or quota a positive charge does not fit, or when the worst-case charge and account
        do not match. An exhausted release is charged 0: it is stored even when a cap the owner
        lowered is passed.

        Parameters
        ----------
        record : ReleaseRecord
            What the round released and its charges (``fedfilter.client.mechanisms.spend``).

        Examples
        --------
        >>> import tempfile
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> ledger = BudgetLedger.enrol(tempfile.mkdtemp(), client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=tempfile.mkdtemp())
        >>> with ledger.reserve("run", 0) as reservation:
        ...     print(reservation.recorded)
        False
        >>> ledger.close()
        """
        if record.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}. Found {record.status!r}.")
        if self.recorded or not self.open:
            raise RuntimeError("a reservation records exactly one release, inside its transaction")
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
        state_after = self.filter.spend(self.state, charge)
        self._conn.execute(
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
                floats_json(self.run_filter.spend(self.run_state, charge)),
                self._clock(),
                self._federation,
                floats_json(self.filter.spend(self.coordinator_state, charge)),
                worst_charge,
                worst_after,
            ),
        )
        self.state_after = state_after
        self.recorded = True
