"""One round on the client: validate the request, filter, clip, record durably, add noise.

This is papers/004 Algorithm 7 in the local form of Remark 4.6: the client clips its update to
``min(C, allowance)`` where the allowance is the largest norm its own filter still admits at the
noise it will add, pays ``(norm / (z C))^2`` (in the filter's units), and once nothing is left
answers with pure noise (``noise-only``) or an explicit marker (``leave``). The coordinator is not
trusted: its request is validated against the device owner's policy before anything is spent.

The worst-case account (``fedfilter.client.ledger.worst_case``) is charged what the report costs alone, at
the noise this device adds: in local placement exactly the main charge; a distributed round (Gaussian
shares, for direct callers) needs a worst-case budget. The allowance is the smaller of the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.worst_case import WorstCaseMissingError, require_worst_case
from fedfilter.client.mechanisms.gaussian import (
    add_grid_noise,
    as_float_arrays,
    check_finite,
    clip_to_norm,
    noise_grid,
    snap_toward_zero,
)
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.privacy.filters import GaussianFilter, exhausted
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.rules import accounted_noise_std, added_noise_std


@dataclass(frozen=True)
class Release:
    """What leaves the device this round, and the (private, local) bookkeeping behind it."""

    status: str  # "contributed", "noise-only" or "left"
    arrays: list[np.ndarray] | None = field(repr=False)  # None only for "left"
    sensitivity: float  # certified norm of the clipped update (0 when no data contributed)
    noise_std: float  # standard deviation actually added by this client
    state_after: np.ndarray = field(repr=False)  # lifetime filter state after this round
    filter: GaussianFilter = field(repr=False)

    @cached_property
    def spent_epsilon(self) -> float:
        """Lifetime epsilon spent after this round (computed on demand: it costs a root solve)."""
        return self.filter.epsilon_spent(self.state_after)

    @property
    def remaining_fraction(self) -> float:
        """Share of the lifetime budget left, in [0, 1]."""
        return float(self.filter.remaining_fraction(self.state_after))


class FilteredClient:
    """Applies a device's individual filter to the updates it releases."""

    def __init__(self, ledger: BudgetLedger, policy: ClientPolicy | None = None, noise_seed: int | None = None):
        self.ledger = ledger
        self.policy = policy or ClientPolicy()
        # None (the default): every release draws from a fresh OS-keyed stream. A seed makes the
        # noise reproducible for tests ONLY: whoever knows it can subtract the noise.
        self.noise_seed = noise_seed

    def _stream(self, spec: RoundSpec) -> NoiseStream:
        return (
            NoiseStream()
            if self.noise_seed is None
            else round_noise_stream(self.noise_seed, spec.run_id, spec.round_id)
        )

    def release(self, spec: RoundSpec, update: Sequence[np.ndarray]) -> Release:
        """Filter, clip, record and noise one round's update. Raises before spending on bad input."""
        check_request(spec, self.policy)
        arrays = as_float_arrays(update)
        check_finite(arrays)
        z, clip = float(spec.noise_multiplier), float(spec.clip)
        accounted_std = accounted_noise_std(z, clip)  # the observer's view (the sum's, if distributed)
        added_std = added_noise_std(z, clip, spec.placement, spec.min_reports)
        gamma, _ = noise_grid(added_std)  # before anything is spent: an impossible std is refused here
        filt, run_filt = self.ledger.filter, self.ledger.run_filter
        if spec.placement != "local":
            try:
                require_worst_case(self.ledger.current_worst_filter())
            except WorstCaseMissingError as err:
                raise RoundSpecError(str(err)) from None

        with self.ledger.reserve(spec.run_id, int(spec.round_id)) as tx:
            allowance = tx.allowance(noise_std=accounted_std, clip=clip)  # every budget and quota
            # ...and the worst-case account, at the noise this report carries alone (local: the same).
            allowance = min(allowance, tx.worst_allowance(noise_std=added_std, clip=clip))
            spent = bool(exhausted(allowance, clip, self.policy.exhausted_below))
            # The same steps whether or not the budget is spent (their time must not tell): an
            # exhausted client clips to 0, so its snapped update is zero and its charge 0.
            clipped, norm = clip_to_norm(arrays, 0.0 if spent else allowance)
            snapped = snap_toward_zero(clipped, gamma)  # its norm is at most `norm`
            charge = filt.charge(sensitivity=norm, noise_std=accounted_std)
            worst = tx.worst_filter
            worst_charge = None if worst is None else worst.charge(sensitivity=norm, noise_std=added_std)
            # Defence in depth: the allowance is admitted by construction. (A spent client's charge
            # is 0; its state may already be past a cap the owner lowered.)
            admitted = bool(tx.admits(charge)) and tx.worst_admits(worst_charge)
            if not (admitted or spent):
                raise RuntimeError("internal error: clipped update exceeds the allowance; nothing spent")
            status = ("left" if self.policy.after_exhaustion == "leave" else "noise-only") if spent else "contributed"
            state_after = filt.spend(tx.state, charge)
            tx.record(
                status=status,
                charge=charge,
                state_after=state_after,
                run_state_after=run_filt.spend(tx.run_state, charge),
                sensitivity=norm,
                noise_std=added_std,
                noise_multiplier=z,
                clip=clip,
                placement=spec.placement,
                worst_charge=worst_charge,
            )
        # Committed: the spend is on disk. Only now is anything computed that leaves the device.
        out = None if status == "left" else add_grid_noise(snapped, added_std, self._stream(spec))
        return Release(status, out, norm, added_std, state_after, filt)
