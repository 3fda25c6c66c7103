"""The device's own coin: a Gaussian or Skellam release made with probability ``q`` the device chooses.

When the request carries the plan's asks per device (``RoundSpec.planned_asks``), a device whose
filter can account it wraps the round's mechanism (``GaussianMechanism`` in local placement,
``SkellamMechanism`` over SecAgg+) in ``SampledMechanism``. Inside the ledger's reservation, in the
one spend template (``mechanisms/spend.py``):

1. **Its rate.** What every budget, quota and the worst-case account still admit is turned into a
   charge (the Gaussian allowance at the round's std, uncapped, charged as a Gaussian release: the
   largest charge every cap admits). ``privacy.sampling_rate.spread_rate`` spreads that room over the
   asks the plan still expects of this run (``planned_asks`` minus the asks the ledger already holds
   for it, at least one) and takes the largest rate, at most the owner's cap, whose full-clip charge
   fits that share in every account (constant work). Asked as planned, a device ends near its budget
   at the planned horizon; a larger budget buys a larger rate.
2. **Its allowance.** The full clip, behind the coin, at that rate raised to the owner's
   ``exhausted_below`` (the floor) where the whole room pays for it (else what the whole room pays for,
   possibly 0: a reply of noise, of the same form); nothing once the device is spent (``spent``:
   some account's Gaussian allowance at the owner's smallest noise multiplier is at most
   ``exhausted_below`` of the clip). Being spent reads neither the coordinator's ``planned_asks`` nor
   its ``z`` (``privacy.sampling_rate``), so a ``leave`` marker cannot be made to probe the budget: the
   device varies its rate, not its norm.
3. **Its charge**, at the clipped (snapped) update's exact norms and that rate: the exact sampled
   Gaussian (``privacy.subsampled.sampled_gaussian_charge``) or Zhu and Wang's bound on subsampled
   Skellam (``sampled_skellam_charge``), at the main filter's order and, for the worst-case account,
   at the noise the report carries alone. It does not depend on the coin.
4. **The coin**, only after the commit (``noise``): one 64-bit word of the round's noise stream,
   ``keep = word < q 2^64``; the snapped update is multiplied by ``keep`` (0 or 1: the same work either
   way) and the inner mechanism adds the round's noise. A kept and a dropped update give replies of the
   same form, size and dtype, after the same steps; the coin is stored nowhere.

Why this is a Poisson-subsampled mechanism whatever the coordinator does, why the filter stays valid
over a lifetime with rates that change from round to round, and how the order is chosen:
docs/derivations/amplification.md.

A filter that cannot account a subsampled release (gdp, zcdp, or an rdp order outside
``[2, MAX_SUBSAMPLED_ORDER]``) does not sample: the rate is 1 and every step is the inner mechanism's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

import numpy as np

from fedfilter.client.mechanisms.gaussian import GaussianMechanism
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
from fedfilter.client.mechanisms.skellam import SkellamMechanism, SkellamPayload
from fedfilter.client.mechanisms.spend import Account
from fedfilter.privacy.filters import GaussianFilter
from fedfilter.privacy.sampling_rate import sampled_bound, spent, spread_rate
from fedfilter.privacy.skellam import l1_cap, skellam_charge
from fedfilter.privacy.subsampled import sampled_gaussian_charge, sampled_skellam_charge, sampling_order

__all__ = ["SampledMechanism", "coin", "self_sampling"]


def coin(stream: NoiseStream, rate: float) -> int:
    """1 with probability at most ``rate`` (exactly ``rate`` when ``rate * 2**64`` is whole), else 0.

    One 64-bit word of the stream is drawn whatever the rate, so the stream that follows (the round's
    noise) is the same length either way.

    Parameters
    ----------
    stream : NoiseStream
        The round's random bytes.
    rate : float
        ``q`` in [0, 1].

    Returns
    -------
    int

    Examples
    --------
    >>> coin(NoiseStream.from_seed(0), 1.0), coin(NoiseStream.from_seed(0), 0.0)
    (1, 0)
    >>> draws = [coin(NoiseStream.from_seed(i), 0.25) for i in range(4000)]
    >>> 0.23 < sum(draws) / len(draws) < 0.27
    True
    """
    word = int(stream.uint64(1)[0])
    # q 2^64 is exact for a double (a power-of-two scaling); truncating it never raises the rate.
    return int(word < int(rate * 2.0**64)) if rate < 1 else 1


@dataclass
class SampledMechanism:
    """A Gaussian or Skellam mechanism whose update is in the reply with the device's own probability.

    One object per round: ``allowance`` fixes the round's rate (``rate``), ``charges`` and ``noise``
    read it.

    Parameters
    ----------
    inner : GaussianMechanism or SkellamMechanism
        The round's mechanism.
    planned_asks : int
        The asks per device the plan expects over the run (the request's ``planned_asks``, >= 1).
    max_rate : float
        The owner's cap on the rate, in ``[MIN_RATE, 1]``.
    exhausted_below : float
        The owner's threshold: the least rate worth an ask while the room pays for it, and the fraction
        of the clip below which the device is spent (``sampling_rate.spent``).
    min_noise_multiplier : float
        The owner's smallest noise multiplier: whether the device is spent is read at it, never at the
        request's (``sampling_rate.spent``).
    rate : float, numpy.ndarray or None
        The round's rate (one per row in an engine round), once ``allowance`` has run; the engine sets
        it beforehand for its distributed rounds (computed by the same rule).

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec
    >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 10, 1.0, 1e-3, 0.5)
    >>> m.placement, m.clip, m.rate
    ('local', 2.0, None)
    """

    inner: GaussianMechanism | SkellamMechanism
    planned_asks: int
    max_rate: float
    exhausted_below: float
    min_noise_multiplier: float
    rate: Any = field(default=None)

    @property
    def placement(self) -> str:
        """The inner mechanism's placement.

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5).placement
        'local'
        """
        return self.inner.placement

    @property
    def noise_multiplier(self) -> float:
        """The request's ``z``.

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.5, 2.0)), 1, 1.0, 0.0, 0.5)
        >>> m.noise_multiplier
        1.5
        """
        return self.inner.noise_multiplier

    @property
    def clip(self) -> float:
        """The request's ``C``.

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5).clip
        2.0
        """
        return self.inner.clip

    @property
    def added_std(self) -> float:
        """The std of the noise this report carries (the coin does not change it).

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5).added_std
        2.0
        """
        return self.inner.added_std

    @property
    def floor(self) -> float:
        """The inner mechanism's floor (``spend.nothing_left``).

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5).floor
        0.0
        """
        return self.inner.floor

    def check(self, update: Sequence[np.ndarray], filt: GaussianFilter) -> list[np.ndarray]:
        """The inner mechanism's check of the update, before anything is spent.

        Parameters
        ----------
        update : sequence of numpy.ndarray
            The update.
        filt : GaussianFilter
            The device's filter.

        Returns
        -------
        list of numpy.ndarray

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5)
        >>> m.check([np.ones(2)], None)
        [array([1., 1.])]
        """
        return self.inner.check(update, filt)

    # --- the accounts this round is charged to --------------------------------------------------------

    def _samples(self, account: Account) -> bool:
        # The main filter must account a subsampled release; the worst-case account is charged the
        # unsampled release where its order cannot (``_charge``).
        return all(sampling_order(acc.filter) is not None for _, acc in _parts(account))

    def _stds(self) -> tuple[tuple[float, Any], tuple[float, Any]]:
        """``(std, mu)`` the main account is charged at (the released sum's), and the worst-case one's."""
        inner = self.inner
        if isinstance(inner, SkellamMechanism):
            return (inner.sigma, inner.grid.mu_total), (inner.grid.noise_std, inner.grid.mu_share)
        return (inner.accounted_std, None), (inner.added_std, None)

    def _charge(self, filt: GaussianFilter, rate, std: float, mu, l1, l2, norm) -> np.ndarray:
        """The charge to ``filt`` at ``rate``: the subsampled curve at its order, or, at an order the
        subsampled curves do not reach (the worst-case account's own best may be below 2), the unsampled
        release's charge, whatever the rate: an upper bound (the subsampled pair is a mixture of the
        unsampled one and equal laws; the Rényi divergence is jointly quasi-convex)."""
        plain = sampling_order(filt) is None
        if isinstance(self.inner, SkellamMechanism):
            if plain:
                out = skellam_charge(filt, l1, l2, mu)
                return np.broadcast_to(out, np.broadcast_shapes(np.shape(out), (*np.shape(rate), 1)))
            return sampled_skellam_charge(filt, rate=rate, l1=l1, l2=l2, mu_total=mu)
        if plain:
            out = filt.charge(sensitivity=norm, noise_std=std)
            return np.broadcast_to(out, np.broadcast_shapes(np.shape(out), (*np.shape(rate), 1)))
        return sampled_gaussian_charge(filt, rate=rate, sensitivity=norm, noise_std=std)

    def _accounts(self, acc: Account) -> list[tuple[GaussianFilter, float, Any, Any]]:
        """Each account of ``acc`` this round is charged to: its filter, std, mu, and (for the rate) its room."""
        (main_std, main_mu), (worst_std, worst_mu) = self._stds()
        # The Gaussian allowance every cap admits (uncapped), charged as a Gaussian release: the largest
        # charge all of them admit, in the filter's units.
        main_allow = acc.allowance(noise_std=main_std, clip=math.inf)
        out = [(acc.filter, main_std, main_mu, acc.filter.charge(sensitivity=main_allow, noise_std=main_std)[..., 0])]
        if acc.worst_filter is not None:
            worst_allow = acc.worst_allowance(noise_std=worst_std, clip=math.inf)
            room = acc.worst_filter.charge(sensitivity=worst_allow, noise_std=worst_std)[..., 0]
            out.append((acc.worst_filter, worst_std, worst_mu, room))
        return out

    def _full_norms(self) -> tuple[Any, Any, float]:
        """``(l1, l2, norm)`` of a full-clip release (the grid's L1 cap and L2 in Skellam's case)."""
        full = self.clip
        if isinstance(self.inner, SkellamMechanism):
            l2 = full / self.inner.grid.gamma
            return float(l1_cap(l2, self.inner.dim)), l2, full
        return None, None, full

    # --- the spend template's steps --------------------------------------------------------------

    def allowance(self, account: Account) -> Any:
        """Fix the round's rate (module docstring, step 1) and return the full clip, or 0 where none fits.

        One rate per row of the account: a float on the device, an array over an engine round's rows
        (``RoundRows``: each budget group with its own filters). A rate already set (the engine computes
        the distributed rounds' rates with the rest of the round, by the same rule) is used as is.

        Parameters
        ----------
        account : Account
            The books (``asks_in_run``: the asks this run already recorded, per row).

        Returns
        -------
        float or numpy.ndarray

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> from fedfilter.protocol.request import RoundSpec
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=1.0, delta=1e-5,
        ...                             filter_kind="rdp", orders=[10.6], state_dir=Path(tmp.name) / "owner")
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.1, 1.0)), 141, 1.0, 1e-3, 0.5)
        >>> with ledger.reserve("run", 0) as account:
        ...     print(m.allowance(account), round(m.rate, 4))
        1.0 0.01
        >>> ledger.close(); tmp.cleanup()
        """
        if self.rate is None:
            if not self._samples(account):
                self.rate = 1.0
                return self.inner.allowance(account)
            self.rate = self.rates(account)
        gone = np.asarray(self.spent(account), dtype=bool)
        if np.ndim(self.rate) == 0:  # one rate: a device, or engine rows spent as one account (one bound)
            if gone.size and gone.min() != gone.max():
                raise RuntimeError("internal error: rows spent as one account disagree on being spent")
            gone = np.asarray(bool(gone.size and gone.flat[0]))
        bound = sampled_bound(gone, clip=self.clip)
        return float(bound) if np.ndim(bound) == 0 else bound

    def spent(self, account: Account) -> Any:
        """Where the device is spent (module docstring, step 2): from what its accounts hold and its owner's
        settings alone, never the request (``sampling_rate.spent``). A bool on the device, an array over an
        engine's rows.

        Parameters
        ----------
        account : Account
            The books.

        Returns
        -------
        bool or numpy.ndarray

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> from fedfilter.protocol.request import RoundSpec
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=1.0, delta=1e-5,
        ...                             filter_kind="rdp", orders=[10.6], state_dir=Path(tmp.name) / "owner")
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.1, 1.0)), 141, 1.0, 1e-3, 0.5)
        >>> with ledger.reserve("run", 0) as account:
        ...     print(m.spent(account))
        False
        >>> ledger.close(); tmp.cleanup()
        """
        z = self.min_noise_multiplier

        def spent_rows(acc):
            allowances = [acc.allowance(noise_std=z, clip=math.inf)]
            if acc.worst_filter is not None:
                allowances.append(acc.worst_allowance(noise_std=z, clip=math.inf))
            return spent(allowances, exhausted_below=self.exhausted_below)

        return _per_row(account, spent_rows, bool)

    def rates(self, account: Account) -> Any:
        """The round's rate for each row of ``account`` (module docstring, step 1): a float for one
        device's reservation, an array for an engine's rows.

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
        >>> from fedfilter.protocol.request import RoundSpec
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=1.0, delta=1e-5,
        ...                             filter_kind="rdp", orders=[10.6], state_dir=Path(tmp.name) / "owner")
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.1, 1.0)), 141, 1.0, 1e-3, 0.5)
        >>> with ledger.reserve("run", 0) as account:
        ...     print(round(m.rates(account), 4), m.rate)
        0.01 None
        >>> ledger.close(); tmp.cleanup()
        """
        l1, l2, norm = self._full_norms()

        def rates_rows(acc):
            books = [
                (room, lambda rate, f=filt, s=std, m=mu: self._charge(f, rate, s, m, l1, l2, norm)[..., 0])
                for filt, std, mu, room in self._accounts(acc)
            ]
            asks_left = np.maximum(int(self.planned_asks) - np.asarray(getattr(acc, "asks_in_run", 0)), 1)
            shape = np.shape(books[0][0])
            return spread_rate(books, asks_left=asks_left, cap=self.max_rate, floor=self.exhausted_below, shape=shape)

        return _per_row(account, rates_rows, float)

    def clip_and_snap(self, arrays: Any, bound: Any) -> tuple[Any, Any]:
        """The inner mechanism's clip and snap.

        Parameters
        ----------
        arrays : Any
            The update.
        bound : float
            The allowance (0 when exhausted).

        Returns
        -------
        tuple

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)), 1, 1.0, 0.0, 0.5)
        >>> m.clip_and_snap([np.array([3.0, 4.0])], 1.0)[1]
        1.0
        """
        return self.inner.clip_and_snap(arrays, bound)

    def charges(self, account: Account, payload: Any, sensitivity: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """The charges at the round's rate and the update's exact norms (module docstring, step 3).

        Parameters
        ----------
        account : Account
            The books.
        payload : Any
            The snapped update.
        sensitivity : float
            Its certified norm, model units.

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray or None)

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> from fedfilter.protocol.request import RoundSpec
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=1.0, delta=1e-5,
        ...                             filter_kind="rdp", orders=[10.6], state_dir=Path(tmp.name) / "owner")
        >>> m = SampledMechanism(GaussianMechanism.for_request(RoundSpec("run", 0, 1.1, 1.0)), 141, 1.0, 1e-3, 0.5)
        >>> with ledger.reserve("run", 0) as account:
        ...     bound = m.allowance(account)
        ...     charge, worst = m.charges(account, None, bound)
        >>> bool(charge[0] < account.filter.charge(sensitivity=1.0, noise_std=1.1)[0] / 100), worst
        (True, None)
        >>> ledger.close(); tmp.cleanup()
        """
        if self.rate is None:
            raise RuntimeError("internal error: a sampled release charged before its rate was fixed; nothing spent")
        if not self._samples(account):
            return self.inner.charges(account, payload, sensitivity)
        l1, l2 = (payload.l1, payload.l2) if isinstance(self.inner, SkellamMechanism) else (None, None)
        (main_std, main_mu), (worst_std, worst_mu) = self._stds()
        parts = _parts(account)
        if parts[0][0] is None:  # one account: the device, or one engine client
            acc = parts[0][1]
            worst = acc.worst_filter
            main = self._charge(acc.filter, self.rate, main_std, main_mu, l1, l2, sensitivity)
            alone = None if worst is None else self._charge(worst, self.rate, worst_std, worst_mu, l1, l2, sensitivity)
            return main, alone
        sens, rates = np.asarray(sensitivity, dtype=np.float64), np.asarray(self.rate)
        charge = np.zeros((len(cast(Any, account).rows), 1))  # an engine round (RoundRows)
        for at, acc in parts:  # an engine round's rows: each group's own filter (no worst-case account)
            charge[at] = self._charge(acc.filter, rates[at], main_std, main_mu, l1, l2, sens[at])
        return charge, None

    def noise(self, payload: Any, stream: NoiseStream) -> list[np.ndarray]:
        """The coin, then the inner mechanism's noise (only after the commit; module docstring, step 4).

        Parameters
        ----------
        payload : list of numpy.ndarray or SkellamPayload
            The snapped update.
        stream : NoiseStream
            The round's random bytes (the coin is its first word).

        Returns
        -------
        list of numpy.ndarray
            The report, of the same form whatever the coin.

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> inner = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m = SampledMechanism(inner, 1, 1.0, 0.0, 0.5, rate=0.0)
        >>> kept = m.noise([np.array([5000, 0])], NoiseStream.from_seed(1))
        >>> plain = m.inner.noise([np.array([0, 0])], _after_coin(NoiseStream.from_seed(1)))
        >>> bool(np.array_equal(kept[0], plain[0]))  # rate 0: the noise alone
        True
        """
        if self.rate is None:
            raise RuntimeError("internal error: a sampled release noised before its rate was fixed")
        keep = coin(stream, self.rate)
        return self.inner.noise(_scaled(payload, keep), stream)


def self_sampling(spec, policy, for_arrays):
    """The round's mechanism behind the device's coin when the request carries a plan's asks, else as is.

    Every path that builds a device's mechanism from a request calls this (``Placement.admit_request``,
    ``FilteredClient.release``).

    Parameters
    ----------
    spec : RoundSpec
        The (checked) request.
    policy : ClientPolicy
        The owner's rules (``max_sampling_rate``, ``exhausted_below``, ``min_noise_multiplier``).
    for_arrays : callable
        Arrays to the round's mechanism.

    Returns
    -------
    callable
        Arrays to the mechanism the round runs.

    Examples
    --------
    >>> from fedfilter.client.settings.policy import ClientPolicy
    >>> from fedfilter.protocol.request import RoundSpec
    >>> plain = lambda arrays: GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
    >>> type(self_sampling(RoundSpec("run", 0, 1.0, 2.0), ClientPolicy(), plain)(None)).__name__
    'GaussianMechanism'
    >>> type(self_sampling(RoundSpec("run", 0, 1.0, 2.0, planned_asks=5), ClientPolicy(), plain)(None)).__name__
    'SampledMechanism'
    """
    if not spec.planned_asks:
        return for_arrays

    def sampled(arrays):
        return SampledMechanism(
            for_arrays(arrays),
            int(spec.planned_asks),
            policy.max_sampling_rate,
            policy.exhausted_below,
            policy.min_noise_multiplier,
        )

    return sampled


def _parts(account: Account) -> list[tuple[Any, Account]]:
    # An engine round (``RoundRows``) spans budget groups, each its own account; anything else is one.
    parts = getattr(account, "parts", None)
    return [(None, account)] if parts is None else parts


def _per_row(account: Account, of_account, kind: type) -> Any:
    # ``of_account`` on one account (a scalar stays a Python scalar), or on each budget group of an engine
    # round (``RoundRows``), gathered into one array over the round's rows.
    out: Any = None
    for at, acc in _parts(account):
        value = of_account(acc)
        if at is None:
            return kind(value) if np.ndim(value) == 0 else value
        if out is None:
            out = np.zeros(len(cast(Any, account).rows), dtype=kind)
        out[at] = value
    return out


def _scaled(payload: Any, keep: int) -> Any:
    # The same multiplication whatever the coin: the time does not tell which way it fell.
    if isinstance(payload, SkellamPayload):
        return replace(payload, k=[k * keep for k in payload.k])
    return [k * keep for k in payload]


def _after_coin(stream: NoiseStream) -> NoiseStream:
    # For the examples: the stream as the inner mechanism sees it, its first word spent on the coin.
    stream.uint64(1)
    return stream
