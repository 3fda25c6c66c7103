"""The engine's books: the filter states of a set of clients of one budget group, as a device's ledger holds them.

``RowsAccount`` is the engine's ``Account`` of the spend template (``fedfilter.client.mechanisms.spend``):
the device's ledger ``Reservation`` for one client, here for many rows at once. ``allowance`` and
``worst_allowance`` are ``round_allowance`` on the rows' states (the lifetime and run-quota filters;
the worst-case account in distributed placement); ``commit`` is the one admits check over every row
(defence in depth) and then one ``spend`` per state array. The engine has no owner quotas beyond the
run quota, which caps both accounts as on the device (``fedfilter.client.ledger.quota``: one run per
engine, so the run's worst-case charges are the worst-case account's state), and keeps no spend rows.
``RoundRows`` is one round's clients across budget groups as one ``Account``: the spend template then
runs once for the whole round (each row charged with its own group's filter, committed group by
group). ``spent_epsilon`` reads the rows' states back in epsilon.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np

from fedfilter.client.ledger.quota import WORST, Cap, refusing, within_caps
from fedfilter.client.mechanisms.spend import ReleaseRecord
from fedfilter.privacy.filters import GaussianFilter, round_allowance


class RowsAccount:
    """The states of ``rows`` (clients of budget group ``group``) in ``engine``, read and spent in place.

    Parameters
    ----------
    engine : Engine
        Holds ``state``, ``run_state``, ``worst_state`` (one row per client) and the group's filters.
    rows : numpy.ndarray
        The clients (indices), all of budget group ``group``.
    group : int
        Their budget group (one distinct lifetime and worst-case budget).

    Examples
    --------
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0))
    >>> account = RowsAccount(engine, np.array([0, 3]), 0)
    >>> account.allowance(noise_std=1.0, clip=1.0).round(4)
    array([0.5016, 0.5016])
    """

    def __init__(self, engine, rows: np.ndarray, group: int):
        self._engine, self.rows = engine, rows
        self.filter: GaussianFilter = engine.filters[group]
        self.run_filter: GaussianFilter = engine.run_filters[group]
        self.worst_filter: GaussianFilter | None = None if engine.worst_filters is None else engine.worst_filters[group]
        self._group = group

    @property
    def asks_in_run(self) -> np.ndarray:
        """The rounds of this run each row was asked (what a device's ledger counts of its run).

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> RowsAccount(Engine(EngineConfig(num_clients=4)), np.arange(2), 0).asks_in_run
        array([0, 0])
        """
        return self._engine.asks_in_run[self.rows]

    def allowance(self, *, noise_std: float, clip: float) -> np.ndarray:
        """``round_allowance`` of each row: the lifetime and run-quota filters, at most ``clip``.

        Parameters
        ----------
        noise_std : float
            The accounted noise std.
        clip : float
            The cap.

        Returns
        -------
        numpy.ndarray
            One allowance per row.

        Examples
        --------
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> account = RowsAccount(Engine(EngineConfig(num_clients=4, epsilon=2.0)), np.array([0, 3]), 0)
        >>> account.allowance(noise_std=1.0, clip=0.2)
        array([0.2, 0.2])
        """
        e = self._engine
        return round_allowance(
            self.filter,
            e.state[self.rows],
            noise_std=noise_std,
            clip=clip,
            run_filter=self.run_filter,
            run_state=e.run_state[self.rows],
        )

    def worst_allowance(self, *, noise_std: float, clip: float) -> np.ndarray:
        """What each row's worst-case account still admits at the share's std (``tx.worst_allowance``).

        Parameters
        ----------
        noise_std : float
            The std of one client's share of the noise.
        clip : float
            The cap.

        Returns
        -------
        numpy.ndarray
            One allowance per row.

        Raises
        ------
        RuntimeError
            When the engine keeps no worst-case accounts (not distributed placement).

        Examples
        --------
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> RowsAccount(engine, np.array([0, 1]), 0).worst_allowance(noise_std=1.0, clip=1.0).round(4)
        array([0.8639, 0.8639])
        """
        e = self._engine
        if self.worst_filter is None or e.worst_state is None:
            raise RuntimeError("internal error: no worst-case accounts (distributed placement keeps them)")
        allow = round_allowance(self.worst_filter, e.worst_state[self.rows], noise_std=noise_std, clip=clip)
        return within_caps(allow, self._worst_quota(), noise_std=noise_std)

    def _worst_quota(self) -> list[Cap]:
        """The worst-case account's run quota, as on the device: one run per engine, so its state is the account's."""
        e = self._engine
        if e.worst_run_filters is None or e.worst_state is None or e.config.run_quota >= 1:
            return []
        return [(f"{WORST}'s run quota", e.worst_run_filters[self._group], e.worst_state[self.rows])]

    def commit(self, record: ReleaseRecord) -> None:
        """Check that every row's charge fits every account, then spend each state array once.

        Parameters
        ----------
        record : ReleaseRecord
            The rows' release, one charge per row.

        Raises
        ------
        RuntimeError
            When some row's charge does not fit (then nothing is spent).

        Examples
        --------
        >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0))
        >>> account = RowsAccount(engine, np.array([0, 3]), 0)
        >>> sens = np.array([0.5, 0.5])
        >>> charge = account.filter.charge(sensitivity=sens, noise_std=1.0)
        >>> account.commit(ReleaseRecord("contributed", "local", sens, 1.0, 1.0, 1.0, charge, None))
        >>> engine.state[:, 0]
        array([0.25, 0.  , 0.  , 0.25])
        """
        e, rows = self._engine, self.rows
        charge, worst = record.charge, record.worst_charge
        admitted = bool(np.all(self.filter.admits(e.state[rows], charge))) and bool(
            np.all(self.run_filter.admits(e.run_state[rows], charge))
        )
        worst_filter, worst_state = self.worst_filter, e.worst_state
        if worst is not None:
            if worst_filter is None or worst_state is None:
                raise RuntimeError("internal error: no worst-case accounts (distributed placement keeps them)")
            worst_caps = [(WORST, worst_filter, worst_state[rows]), *self._worst_quota()]
            admitted = admitted and not refusing(worst_caps, worst)
        if not admitted:
            raise RuntimeError("internal error: a clipped update exceeds its allowance; nothing spent")
        e.state[rows] = self.filter.spend(e.state[rows], charge)
        e.run_state[rows] = self.run_filter.spend(e.run_state[rows], charge)
        if worst is not None and worst_filter is not None and worst_state is not None:
            worst_state[rows] = worst_filter.spend(worst_state[rows], worst)


class _GroupFilters:
    """The ``filter`` of a ``RoundRows``: each row charged by its own budget group's filter."""

    def __init__(self, parts: list[tuple[np.ndarray, RowsAccount]]):
        self.parts = parts

    def charge(self, *, sensitivity, noise_std: float) -> np.ndarray:
        sensitivity = np.asarray(sensitivity, dtype=np.float64)
        out: np.ndarray | None = None
        for at, account in self.parts:
            charge = np.asarray(account.filter.charge(sensitivity=sensitivity[at], noise_std=noise_std))
            if out is None:
                out = np.zeros((len(sensitivity), *charge.shape[1:]), dtype=charge.dtype)
            out[at] = charge
        return np.zeros((0,)) if out is None else out


class RoundRows:
    """The clients of one round across budget groups, one ``Account`` of the spend template.

    ``allowance`` is each row's ``RowsAccount.allowance`` under the engine's accounting
    (``Engine.uniform``); the charge of a row is its group's filter's; ``commit`` is each group's
    ``RowsAccount.commit`` (one admits check, one spend per state) on its rows of the record.

    Parameters
    ----------
    engine : Engine
        Holds the states, the groups' filters and ``uniform``.
    clients : numpy.ndarray
        The round's clients (indices), any budget groups.

    Examples
    --------
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> account = RoundRows(Engine(EngineConfig(num_clients=4, epsilon=2.0)), np.arange(4))
    >>> account.allowance(noise_std=1.0, clip=1.0).round(4)
    array([0.5016, 0.5016, 0.5016, 0.5016])
    """

    def __init__(self, engine, clients: np.ndarray):
        self._engine, self.rows = engine, clients
        groups = engine.group[clients]
        # (rows of the record, that group's account) per budget group among the clients
        self.parts = [
            (at, RowsAccount(engine, clients[at], g)) for g in range(len(engine.filters)) if (at := groups == g).any()
        ]
        self.filter: Any = _GroupFilters(self.parts)  # charges row by row (Account.filter's role)
        self.worst_filter: Any = None  # Gaussian rounds keep no worst-case account (accounts.py)

    def _scatter(self, ask) -> np.ndarray:
        out = np.zeros(len(self.rows))
        for at, account in self.parts:
            out[at] = ask(account)
        return out

    def allowance(self, *, noise_std: float, clip: float) -> np.ndarray:
        """Each row's allowance (its group's filters), under the engine's accounting (``Engine.uniform``).

        Parameters
        ----------
        noise_std : float
            The accounted noise std.
        clip : float
            The cap.

        Returns
        -------
        numpy.ndarray
            One allowance per row.

        Examples
        --------
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> account = RoundRows(Engine(EngineConfig(num_clients=4, epsilon=2.0)), np.arange(4))
        >>> account.allowance(noise_std=1.0, clip=0.2)
        array([0.2, 0.2, 0.2, 0.2])
        """
        allow = self._scatter(lambda account: account.allowance(noise_std=noise_std, clip=clip))
        return self._engine.uniform(self.rows, allow)

    def worst_allowance(self, *, noise_std: float, clip: float) -> np.ndarray:
        """Each row's worst-case allowance (its group's account).

        Parameters
        ----------
        noise_std : float
            The std of one client's share of the noise.
        clip : float
            The cap.

        Returns
        -------
        numpy.ndarray
            One allowance per row.

        Examples
        --------
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0, worst_case_epsilon=4.0,
        ...                              placement="distributed", filter_kind="rdp", min_reports=2))
        >>> RoundRows(engine, np.arange(4)).worst_allowance(noise_std=1.0, clip=1.0).round(4)
        array([0.8639, 0.8639, 0.8639, 0.8639])
        """
        return self._scatter(lambda account: account.worst_allowance(noise_std=noise_std, clip=clip))

    def commit(self, record: ReleaseRecord) -> None:
        """Each group's ``RowsAccount.commit`` on its rows of ``record``.

        Parameters
        ----------
        record : ReleaseRecord
            The round's release, one row per client of the round.

        Examples
        --------
        >>> from fedfilter.client.mechanisms.spend import ReleaseRecord
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0))
        >>> account = RoundRows(engine, np.arange(4))
        >>> sens = np.full(4, 0.25)
        >>> charge = account.filter.charge(sensitivity=sens, noise_std=1.0)
        >>> status = np.array(["contributed"] * 4)
        >>> account.commit(ReleaseRecord(status, "local", sens, 1.0, 1.0, 1.0, charge, None))
        >>> engine.state[:, 0]
        array([0.0625, 0.0625, 0.0625, 0.0625])
        """
        for at, account in self.parts:
            worst = None if record.worst_charge is None else np.asarray(record.worst_charge)[at]
            status = record.status[at] if isinstance(record.status, np.ndarray) else record.status
            sensitivity = np.asarray(record.sensitivity)[at]
            charge = np.asarray(record.charge)[at]
            account.commit(replace(record, status=status, sensitivity=sensitivity, charge=charge, worst_charge=worst))


def all_or_nothing(allowance: np.ndarray, full: np.ndarray | None) -> np.ndarray:
    """``accounting="worst-case"`` (simulation only): each allowance becomes its full round's, ``full``
    (what a fresh client admits: model units, or integer-grid L2 in distributed placement), while the
    accounts still admit that, else 0 (exhausted); the engine then charges this bound, not the update's
    norm. ``full=None`` (individual accounting): the allowance unchanged.

    Parameters
    ----------
    allowance : numpy.ndarray
        The individual allowances.
    full : numpy.ndarray or None
        The full round's allowance of each client, or None.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> all_or_nothing(np.array([1.0, 0.4]), np.array([0.5, 0.5]))
    array([0.5, 0. ])
    >>> all_or_nothing(np.array([1.0, 0.4]), None)
    array([1. , 0.4])
    """
    if full is None:
        return allowance
    return np.where(np.asarray(allowance) >= full, full, 0.0)


def full_round_allowance(engine) -> np.ndarray:
    """What each client of ``engine`` would admit on a fresh state, a full round of the round's release
    (``Engine.round_numbers``): its allowance (model units), or in distributed placement its
    integer-grid L2 allowance. The same code as every round's allowance, run on fresh states (the
    engine's own are put back), so with adaptive clipping it follows the clip round by round.

    Parameters
    ----------
    engine : Engine
        The engine.

    Returns
    -------
    numpy.ndarray
        One allowance per client.

    Examples
    --------
    >>> from fedfilter.simulations.engine.core import Engine
    >>> from fedfilter.simulations.engine.config import EngineConfig
    >>> full_round_allowance(Engine(EngineConfig(num_clients=4, epsilon=2.0))).round(4)
    array([0.5016, 0.5016, 0.5016, 0.5016])
    """
    everyone = np.arange(engine.n)
    fresh = engine.filters[0].initial_state(engine.n)
    held = engine.state, engine.run_state, engine.worst_state
    engine.state, engine.run_state = fresh.copy(), fresh.copy()
    engine.worst_state = None if held[2] is None else fresh.copy()
    try:
        distributed = getattr(engine, "_distributed", None)
        return engine.allowance(everyone) if distributed is None else distributed.l2_allowance(everyone)
    finally:
        engine.state, engine.run_state, engine.worst_state = held


# Above this many distinct 1-d states, spent epsilon is read off a grid of actual states (see
# ``spent_epsilon``); each epsilon costs an mpmath solve (~30 ms) for the Gaussian-DP filter.
_EXACT_SPENT_LIMIT = 256


def spent_epsilon(filt: GaussianFilter, states: np.ndarray, exact_limit: int = _EXACT_SPENT_LIMIT) -> np.ndarray:
    """``filt.epsilon_spent`` for every row, never below the exact value.

    Distinct rows are solved once. With more than ``exact_limit`` distinct one-coordinate states,
    each state gets the epsilon of the smallest *actual* state at or above it among
    ``exact_limit`` quantiles (epsilon grows with the state): an upper bound, rounded up.

    Parameters
    ----------
    filt : GaussianFilter
        The rows' filter.
    states : numpy.ndarray
        Their states, one row each.
    exact_limit : int, optional
        Distinct one-coordinate states solved exactly at most.

    Returns
    -------
    numpy.ndarray
        Spent epsilon per row.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> spent_epsilon(make_filter("gdp", 2.0, 1e-5), np.array([[0.0], [0.25], [0.25]])).round(3)
    array([0.   , 1.993, 1.993])
    """
    states = np.asarray(states, dtype=np.float64).reshape(len(states), -1)
    if len(states) == 0:
        return np.zeros(0)
    uniq, inverse = np.unique(states, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    if len(uniq) <= exact_limit or uniq.shape[1] != 1:
        values = np.array([filt.epsilon_spent(u) for u in uniq])
        return values[inverse]
    grid = np.unique(np.quantile(uniq[:, 0], np.linspace(0, 1, exact_limit), method="higher"))
    values = np.array([filt.epsilon_spent(np.array([g])) for g in grid])
    return values[np.searchsorted(grid, states[:, 0], side="left")]
