"""The one order in which every release spends: allowance, clip and snap, charge, commit (Feldman & Zrnic 2021, Alg. 7).

Every path runs this template: the device in local placement (Gaussian noise), the device in
distributed placement (Skellam noise on SecAgg+'s grid), and the simulation engine (both, one row
per client). What differs between them is the ``Mechanism`` (how the allowance is turned into a norm
bound, how the update is clipped and snapped, what it is charged, what noise it gets) and the
``Account`` (the device's ledger reservation, or the engine's state rows). The order is fixed here:

1. the allowance the account admits for this mechanism (every budget and quota, and the
   worst-case account);
2. ``nothing_left``: nothing worth giving is left in EITHER account (the main one with its quotas,
   or the worst-case one): the round is then what exhaustion means for this device (``status_of``);
3. clip and snap the update to the allowance (to 0 when exhausted: the same steps run whether or
   not the budget is spent, so their time does not tell);
4. its charges at its exact (snapped) norm;
5. ``Account.commit``: the one check that every charge fits, one spend per state, stored durably.

6. noise, only AFTER the commit: a spend is on disk before anything that leaves the device is
   computed. The device draws it itself once ``spend`` returns (``fedfilter.client.release.release``);
   the engine hands its noise step to ``spend`` (``noise=``), which runs it after the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from fedfilter.privacy.filters import GaussianFilter, exhausted


@dataclass(frozen=True)
class ReleaseRecord:
    """What one release spent: stored by the ledger, accounted by the filters (one row per client in the engine).

    Parameters
    ----------
    status : str or numpy.ndarray
        ``"contributed"``, ``"noise-only"`` or ``"left"`` (the last two once the budget is spent); one
        per row in the engine.
    placement : str
        ``"local"`` or ``"distributed"``.
    sensitivity : float or numpy.ndarray
        The certified norm of the released (clipped, snapped) update, model units (0 without data).
    noise_std : float
        The standard deviation of the noise this report carries, model units.
    noise_multiplier : float
        The request's ``z``.
    clip : float
        The request's ``C``.
    charge : numpy.ndarray
        The charge to the main filters, in their units.
    worst_charge : numpy.ndarray or None
        The charge to the worst-case account (None without one: local rounds only).

    Examples
    --------
    >>> import numpy as np
    >>> r = ReleaseRecord("contributed", "local", 0.5, 1.0, 1.0, 1.0, np.array([0.125]), None)
    >>> r.status
    'contributed'
    """

    status: Any  # str; one per row (numpy.ndarray) in the engine
    placement: str
    sensitivity: Any = field(repr=False)
    noise_std: float
    noise_multiplier: float
    clip: float
    charge: np.ndarray = field(repr=False)
    worst_charge: np.ndarray | None = field(repr=False)


class Account(Protocol):
    """The books a release is spent from: a ledger ``Reservation`` (device) or ``RowsAccount`` (engine).

    Attributes
    ----------
    filter : GaussianFilter
        The main (lifetime) filter.
    worst_filter : GaussianFilter or None
        The worst-case account's filter (None without one).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.budget import BudgetLedger
    >>> tmp = tempfile.TemporaryDirectory()
    >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
    ...                             state_dir=Path(tmp.name) / "owner")
    >>> with ledger.reserve("run", 0) as account:
    ...     account.filter.epsilon, account.worst_filter
    (4.0, None)
    >>> ledger.close(); tmp.cleanup()
    """

    filter: GaussianFilter
    worst_filter: GaussianFilter | None

    def allowance(self, *, noise_std: float, clip: float) -> Any:
        """The largest sensitivity every main budget and quota admits at ``noise_std``, at most ``clip``.

        Parameters
        ----------
        noise_std : float
            The std the observer's view is charged at.
        clip : float
            The request's ``C``.

        Returns
        -------
        float or numpy.ndarray

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as account:
        ...     account.allowance(noise_std=2.0, clip=2.0)
        1.8498617953338456
        >>> ledger.close(); tmp.cleanup()
        """

    def worst_allowance(self, *, noise_std: float, clip: float) -> Any:
        """The worst-case account's allowance at the noise this report carries alone.

        Parameters
        ----------
        noise_std : float
            The std this report carries alone.
        clip : float
            The request's ``C`` (the allowance without a worst-case account).

        Returns
        -------
        float or numpy.ndarray

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as account:  # no worst-case budget: the clip
        ...     account.worst_allowance(noise_std=2.0, clip=2.0)
        2.0
        >>> ledger.close(); tmp.cleanup()
        """

    def commit(self, record: ReleaseRecord) -> None:
        """Check that every charge fits, spend each state once, store; raise before storing otherwise.

        Parameters
        ----------
        record : ReleaseRecord
            What the release spends.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> import numpy as np
        >>> with ledger.reserve("run", 0) as account:
        ...     account.commit(ReleaseRecord("contributed", "local", 1.0, 2.0, 1.0, 2.0, np.array([0.25]), None))
        >>> ledger.spent_epsilon()
        1.993091404415121
        >>> ledger.close(); tmp.cleanup()
        """


class Mechanism(Protocol):
    """The steps that differ between Gaussian and Skellam releases (``gaussian.py``, ``skellam.py``).

    Examples
    --------
    >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
    >>> from fedfilter.protocol.request import RoundSpec
    >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
    >>> m.placement, m.noise_multiplier, m.clip, m.added_std, m.floor
    ('local', 1.0, 2.0, 2.0, 0.0)
    """

    @property
    def placement(self) -> str:
        """``"local"`` or ``"distributed"``.

        Examples
        --------
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.placement
        'local'
        """

    @property
    def noise_multiplier(self) -> float:
        """The request's ``z``.

        Examples
        --------
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.noise_multiplier
        1.0
        """

    @property
    def clip(self) -> float:
        """The request's ``C``.

        Examples
        --------
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.clip
        2.0
        """

    @property
    def added_std(self) -> float:
        """The std of the noise this report carries, model units.

        Examples
        --------
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.added_std
        2.0
        """

    @property
    def floor(self) -> float:
        """The least allowance, model units, that carries data whatever the update (``nothing_left``).

        Examples
        --------
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.floor  # a Gaussian release has none
        0.0
        """

    def allowance(self, account: Account) -> Any:
        """The norm bound, model units, both the main and the worst-case account admit.

        Parameters
        ----------
        account : Account
            The books.

        Returns
        -------
        float or numpy.ndarray

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> with ledger.reserve("run", 0) as account:
        ...     m.allowance(account)
        1.8498617953338456
        >>> ledger.close(); tmp.cleanup()
        """

    def clip_and_snap(self, arrays: Any, bound: Any) -> tuple[Any, Any]:
        """The update clipped to ``bound`` and snapped to the noise grid, and its sensitivity.

        Parameters
        ----------
        arrays : Any
            The update.
        bound : float or numpy.ndarray
            The norm bound (the allowance, or 0 when exhausted).

        Returns
        -------
        tuple
            ``(payload, sensitivity)``.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> payload, sensitivity = m.clip_and_snap([np.array([3.0, 4.0])], 1.0)
        >>> sensitivity
        1.0
        """

    def charges(self, account: Account, payload: Any, sensitivity: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The main and worst-case charges of the snapped update.

        Parameters
        ----------
        account : Account
            The books.
        payload : Any
            The snapped update.
        sensitivity : float or numpy.ndarray
            Its certified norm.

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray or None)

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> with ledger.reserve("run", 0) as account:
        ...     m.charges(account, None, 1.0)
        (array([0.25]), None)
        >>> ledger.close(); tmp.cleanup()
        """


def nothing_left(allowance, *, clip, floor, exhausted_below: float) -> np.ndarray:
    """Where a release has nothing left to give: the one exhaustion rule of every path.

    ``allowance`` is the smaller of what the main account (lifetime budget and every quota) and the
    worst-case account admit, so this is True when EITHER account is spent: the allowance is at most
    ``exhausted_below`` of the clip (``privacy.filters.exhausted``), or below the mechanism's
    ``floor``, the least allowance that carries data whatever the update (``Mechanism.floor``).

    Why a floor. A Skellam release is snapped toward zero onto SecAgg+'s grid and charged at the
    snapped norms. An update clipped to an allowance of L grid steps over d coordinates can snap to
    zero (one of equal coordinates does below ``sqrt(d)`` steps): it is then charged 0, so neither
    account moves, and the next round finds the same allowance. Without the floor, a device whose
    worst-case account bound a few steps above ``exhausted_below`` of the clip recorded
    "contributed" rounds of sensitivity 0 for ever, and a ``leave`` device never left. From the floor
    on, an update clipped to the allowance keeps a coordinate of at least one step, so each round
    spends and the allowance falls to the floor. The device (``spend``) and the engine (local and
    distributed rounds) both call this; it is the same arithmetic whichever account binds.

    Parameters
    ----------
    allowance : float or numpy.ndarray
        The release's norm bound, model units (one per row in the engine).
    clip : float
        The request's ``C``.
    floor : float
        The mechanism's ``floor``, model units.
    exhausted_below : float
        The owner's threshold, a fraction of the clip.

    Examples
    --------
    >>> bool(nothing_left(0.5, clip=1.0, floor=0.01, exhausted_below=1e-3))
    False
    >>> bool(nothing_left(0.005, clip=1.0, floor=0.01, exhausted_below=1e-3))
    True
    """
    return exhausted(allowance, clip, exhausted_below) | (np.asarray(allowance) < floor)


def status_of(spent, after_exhaustion: str):
    """The release's status: ``"contributed"``, or, once spent, ``"left"``/``"noise-only"`` as the owner chose.

    One string for one release, an array of them for the engine's rows.

    Parameters
    ----------
    spent : bool or numpy.ndarray
        Whether either account is spent (``nothing_left``), per row in the engine.
    after_exhaustion : str
        The owner's choice: ``"leave"`` or ``"noise-only"``.

    Examples
    --------
    >>> status_of(False, "leave"), status_of(True, "leave"), status_of(True, "noise-only")
    ('contributed', 'left', 'noise-only')
    """
    statuses = np.where(spent, "left" if after_exhaustion == "leave" else "noise-only", "contributed")
    return str(statuses) if statuses.ndim == 0 else statuses


def spend(
    account: Account,
    mechanism: Mechanism,
    arrays: Any,
    *,
    exhausted_below: float,
    after_exhaustion: str,
    noise: Callable[[ReleaseRecord, Any], Any] | None = None,
) -> tuple[ReleaseRecord, Any]:
    """Allowance, clip and snap, charge, commit, then noise (module docstring); returns ``(record, payload)``.

    ``account.commit`` raises, storing nothing, if a charge does not fit (an exhausted release is
    charged 0). Without ``noise`` the caller (the device, holding the ledger's reservation) adds noise
    to ``payload`` only after this returns; with it, ``payload`` is ``noise(record, payload)``,
    computed after the commit (the engine's rounds).

    Parameters
    ----------
    account : Account
        The books (``Reservation`` on the device).
    mechanism : Mechanism
        ``GaussianMechanism`` or ``SkellamMechanism``.
    arrays : sequence of numpy.ndarray, or what the mechanism clips
        The update's floating-point arrays (checked finite by the caller); the engine's mechanisms
        take a whole round's updates (``simulations.engine.gaussian_round.GaussianReports``).
    exhausted_below : float
        The owner's threshold: exhausted when the allowance is at most this fraction of the clip.
    after_exhaustion : str
        ``"leave"`` or ``"noise-only"``.
    noise : callable, optional
        ``noise(record, payload)``: the release's noise step, run after the commit; its result is
        returned as the payload.

    Examples
    --------
    >>> from fedfilter.client.mechanisms.spend import spend  # doctest: +SKIP
    >>> record, payload = spend(tx, mechanism, arrays, exhausted_below=0.0, after_exhaustion="leave")  # doctest: +SKIP
    """
    allowance = mechanism.allowance(account)
    # One per row in the engine. Which account bound is not recorded and changes nothing below.
    spent = nothing_left(allowance, clip=mechanism.clip, floor=mechanism.floor, exhausted_below=exhausted_below)
    # The same steps whether or not the budget is spent (their time must not tell): an exhausted
    # release clips to 0, so its snapped update is zero and its charge 0.
    payload, sensitivity = mechanism.clip_and_snap(arrays, np.where(spent, 0.0, allowance))
    charge, worst_charge = mechanism.charges(account, payload, sensitivity)
    record = ReleaseRecord(
        status=status_of(spent, after_exhaustion),
        placement=mechanism.placement,
        sensitivity=sensitivity,
        noise_std=mechanism.added_std,
        noise_multiplier=mechanism.noise_multiplier,
        clip=mechanism.clip,
        charge=charge,
        worst_charge=worst_charge,
    )
    account.commit(record)
    return record, payload if noise is None else noise(record, payload)
