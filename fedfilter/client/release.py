"""One round on the client: filter, clip, record durably, add noise (both placements).

This is Feldman & Zrnic (2021) Algorithm 7 in the local form of Remark 4.6: the client clips its update to
``min(C, allowance)`` where the allowance is the largest norm its own filter still admits at the
noise it will add, pays ``(norm / (z C))^2`` (in the filter's units), and once nothing is left
answers with pure noise (``noise-only``) or an explicit marker (``leave``). The coordinator is not
trusted: its request is validated against the device owner's policy before anything is spent
(``FilteredClient.release``; the mod validates once at its entry and calls ``release``).

``release`` runs the one spend template (``fedfilter.client.mechanisms.spend``) inside the ledger's
reservation for either mechanism: Gaussian noise (``GaussianMechanism``; local placement, or Gaussian
shares for direct callers) or Skellam noise on SecAgg+'s grid (``SkellamMechanism``). The worst-case
account (``fedfilter.client.ledger.worst_case``) is charged what the report costs alone, at the noise
this device adds: in local placement exactly the main charge; a distributed round needs a
worst-case budget. The allowance is the smaller of the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.worst_case import WorstCaseMissingError, require_worst_case
from fedfilter.client.mechanisms.gaussian import GaussianMechanism
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.mechanisms.sampled import SampledMechanism, self_sampling
from fedfilter.client.mechanisms.skellam import SkellamMechanism
from fedfilter.client.mechanisms.spend import spend
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.privacy.filters import GaussianFilter
from fedfilter.protocol.request import RoundSpec, RoundSpecError


@dataclass(frozen=True)
class Release:
    """What leaves the device this round, and the (private, local) bookkeeping behind it.

    Attributes
    ----------
    status : str
        ``"contributed"``, ``"noise-only"`` or ``"left"``.
    arrays : list of numpy.ndarray or None
        The report: noisy arrays (Gaussian) or the encoded Skellam report; None when ``"left"``.
    sensitivity : float
        Certified norm of the clipped update (0 when no data contributed).
    noise_std : float
        Standard deviation of the noise this client added.
    charge : numpy.ndarray
        What the round cost the main filters.
    state_after : numpy.ndarray
        The lifetime filter state after the round.
    filter : GaussianFilter
        The filter that reads ``state_after``.

    Examples
    --------
    >>> import tempfile
    >>> import numpy as np
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> from fedfilter.client.settings.node_config import enrol_device
    >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
    ...     _ = enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "budget-delta": 1e-5})
    ...     ledger = BudgetLedger.open(root + "/dev")
    ...     rel = FilteredClient(ledger, noise_seed=0).release(RoundSpec("run", 1, 5.0, 1.0), [np.ones(4)])
    ...     ledger.close()
    >>> rel.status, rel.noise_std, len(rel.arrays)
    ('contributed', 5.0, 1)
    """

    status: str  # "contributed", "noise-only" or "left"
    # The report: noisy arrays (Gaussian) or encode_report(y, q) per model array (Skellam); None for "left".
    arrays: list[np.ndarray] | None = field(repr=False)
    sensitivity: float  # certified norm of the clipped update (0 when no data contributed)
    noise_std: float  # standard deviation actually added by this client
    charge: np.ndarray = field(repr=False)  # what this round cost the main filters
    state_after: np.ndarray = field(repr=False)  # lifetime filter state after this round
    filter: GaussianFilter = field(repr=False)

    @cached_property
    def spent_epsilon(self) -> float:
        """Lifetime epsilon spent after this round (computed on demand: it costs a root solve).

        Returns
        -------
        float
            The epsilon of the owner's filter at ``state_after``.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> from fedfilter.client.settings.node_config import enrol_device
        >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
        ...     _ = enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "budget-delta": 1e-5})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     rel = FilteredClient(ledger, noise_seed=0).release(RoundSpec("run", 1, 5.0, 1.0), [np.ones(4)])
        ...     ledger.close()
        >>> round(rel.spent_epsilon, 3)
        0.726
        """
        return self.filter.epsilon_spent(self.state_after)

    @property
    def remaining_fraction(self) -> float:
        """Share of the lifetime budget left, in [0, 1].

        Returns
        -------
        float
            1 before any spend, 0 once the filter is exhausted.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> from fedfilter.client.settings.node_config import enrol_device
        >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
        ...     _ = enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "budget-delta": 1e-5})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     rel = FilteredClient(ledger, noise_seed=0).release(RoundSpec("run", 1, 5.0, 1.0), [np.ones(4)])
        ...     ledger.close()
        >>> round(rel.remaining_fraction, 3)
        0.953
        """
        return float(self.filter.remaining_fraction(self.state_after))


def noise_stream(noise_seed: int | None, spec: RoundSpec) -> NoiseStream:
    """The round's noise: a fresh OS-keyed stream, or with a seed a reproducible one (tests ONLY).

    Parameters
    ----------
    noise_seed : int or None
        None in production: whoever knows a seed can subtract the noise.
    spec : RoundSpec
        The round (the seeded stream is keyed by its run and round).

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec
    >>> a = noise_stream(7, RoundSpec("run", 3, 1.0, 1.0))
    """
    return NoiseStream() if noise_seed is None else round_noise_stream(noise_seed, spec.run_id, spec.round_id)


def require_worst_case_budget(ledger: BudgetLedger) -> None:
    """The one check of a distributed round against the worst-case account: it must exist.

    Called before training (the SecAgg+ placement) and again by ``release`` before spending; the
    ``RoundSpecError`` (code ``request-refused``) says how the owner sets the budget.

    Parameters
    ----------
    ledger : BudgetLedger
        The device's ledger.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.settings.node_config import enrol_device
    >>> root = tempfile.mkdtemp()
    >>> _ = enrol_device({"ledger-dir": root, "client-id": "a", "budget-epsilon": 4.0, "budget-delta": 1e-5})
    >>> ledger = BudgetLedger.open(root)
    >>> try:
    ...     require_worst_case_budget(ledger)
    ... except RoundSpecError as err:
    ...     print(err.code)
    request-refused
    >>> ledger.close()
    """
    try:
        require_worst_case(ledger.current_worst_filter())
    except WorstCaseMissingError as err:
        raise RoundSpecError(str(err)) from None


def release(
    ledger: BudgetLedger,
    mechanism: GaussianMechanism | SkellamMechanism | SampledMechanism,
    update: Sequence[np.ndarray],
    *,
    run_id: str,
    round_id: int,
    exhausted_below: float,
    after_exhaustion: str,
    stream: NoiseStream,
) -> Release:
    """Spend one round from ``ledger`` and only then add noise (the request is validated by the caller).

    Raises before spending on bad input (``ValueError``; ``RoundSpecError`` for a distributed round
    without a worst-case budget, or a Skellam round on a filter other than rdp), ``ReplayError`` for a
    round already recorded.

    Parameters
    ----------
    ledger : BudgetLedger
        The device's ledger.
    mechanism : GaussianMechanism, SkellamMechanism or SampledMechanism
        The round's noise (``GaussianMechanism.for_request`` or ``SkellamMechanism.for_update``; behind
        the device's coin, ``mechanisms.sampled.self_sampling``).
    update : sequence of numpy.ndarray
        The update's arrays (for a Skellam release every model array in order: integer buffers go as 0).
    run_id, round_id : str, int
        The round, recorded once (a replay is refused).
    exhausted_below, after_exhaustion : float, str
        The owner's policy (``ClientPolicy``).
    stream : NoiseStream
        Where the noise comes from (a fresh OS-keyed stream unless a test seeds it).

    Examples
    --------
    >>> rel = release(ledger, GaussianMechanism.for_request(spec), update, run_id=spec.run_id,
    ...               round_id=spec.round_id, exhausted_below=0.0, after_exhaustion="leave",
    ...               stream=NoiseStream())  # doctest: +SKIP
    """
    arrays = mechanism.check(update, ledger.filter)
    if mechanism.placement != "local":
        require_worst_case_budget(ledger)
    with ledger.reserve(run_id, int(round_id)) as tx:
        record, payload = spend(
            tx, mechanism, arrays, exhausted_below=exhausted_below, after_exhaustion=after_exhaustion
        )
        state_after = tx.state_after
    if state_after is None:  # spend() returns only after the commit stored the round
        raise RuntimeError("internal error: a round left the reservation without its commit")
    # Committed: the spend is on disk. Only now is anything computed that leaves the device.
    out = None if record.status == "left" else mechanism.noise(payload, stream)
    return Release(record.status, out, record.sensitivity, record.noise_std, record.charge, state_after, ledger.filter)


class FilteredClient:
    """Applies a device's individual filter to the updates it releases.

    Parameters
    ----------
    ledger : BudgetLedger
        The device's open ledger.
    policy : ClientPolicy, optional
        The owner's policy (the default ``ClientPolicy()`` when None).
    noise_seed : int, optional
        None in production; a seed makes the noise reproducible (tests only).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> from fedfilter.client.settings.node_config import enrol_device
    >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
    ...     _ = enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "budget-delta": 1e-5})
    ...     ledger = BudgetLedger.open(root + "/dev")
    ...     client = FilteredClient(ledger)
    ...     print(client.policy == ClientPolicy(), client.noise_seed)
    ...     ledger.close()
    True None
    """

    def __init__(self, ledger: BudgetLedger, policy: ClientPolicy | None = None, noise_seed: int | None = None):
        self.ledger = ledger
        self.policy = policy or ClientPolicy()
        # None (the default): every release draws from a fresh OS-keyed stream. A seed makes the
        # noise reproducible for tests ONLY: whoever knows it can subtract the noise.
        self.noise_seed = noise_seed

    def release(self, spec: RoundSpec, update: Sequence[np.ndarray]) -> Release:
        """Validate the request against the owner's policy, then ``release`` one Gaussian round.

        Parameters
        ----------
        spec : RoundSpec
            The coordinator's request (refused with ``RoundSpecError`` if the policy forbids it).
        update : sequence of numpy.ndarray
            The model update's arrays.

        Returns
        -------
        Release
            The report and the round's bookkeeping.

        Examples
        --------
        >>> import tempfile
        >>> import numpy as np
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.owner_state import owner_state_at
        >>> from fedfilter.client.settings.node_config import enrol_device
        >>> with tempfile.TemporaryDirectory() as root, owner_state_at(Path(root) / "owner"):
        ...     _ = enrol_device({"ledger-dir": root + "/dev", "budget-epsilon": 4.0, "budget-delta": 1e-5})
        ...     ledger = BudgetLedger.open(root + "/dev")
        ...     rel = FilteredClient(ledger, noise_seed=0).release(RoundSpec("run", 1, 5.0, 1.0), [np.ones(4)])
        ...     ledger.close()
        >>> rel.status, round(rel.sensitivity, 6)
        ('contributed', 1.0)
        """
        check_request(spec, self.policy)
        return release(
            self.ledger,
            self_sampling(spec, self.policy, lambda arrays: GaussianMechanism.for_request(spec))(update),
            update,
            run_id=spec.run_id,
            round_id=int(spec.round_id),
            exhausted_below=self.policy.exhausted_below,
            after_exhaustion=self.policy.after_exhaustion,
            stream=noise_stream(self.noise_seed, spec),
        )
