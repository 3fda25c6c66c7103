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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from fedfilter.checks import finite, int_in, short_repr
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import INT64_MAX
from fedfilter.client.ledger.worst_case import WorstCaseMissingError, require_worst_case
from fedfilter.client.mechanisms.gaussian import (
    NOISE_STD_RANGE,
    add_grid_noise,
    as_float_arrays,
    check_finite,
    clip_to_norm,
    noise_grid,
    snap_toward_zero,
)
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.secagg.neighbourhood import SecAggGraphPolicy
from fedfilter.privacy.filters import GaussianFilter, exhausted
from fedfilter.protocol.request import AFTER_EXHAUSTION, MAX_RUN_ID_CHARS, PLACEMENTS, RoundSpec, RoundSpecError
from fedfilter.protocol.rules import accounted_noise_std, added_noise_std


@dataclass(frozen=True)
class ClientPolicy:
    """The device owner's rules; they come from the node's own config, never the coordinator."""

    min_noise_multiplier: float = 0.5
    after_exhaustion: str = "noise-only"
    # Distributed noise is private only against observers of a sum of >= m reports (secure
    # aggregation). The Flower mod sets this from its own mod order (secure_aggregation_mod's mark),
    # never from a setting; direct callers of the core API (the simulation engine) set it themselves.
    allow_distributed: bool = False
    # Below this share of the clip the remaining allowance is treated as spent. A round clipped to
    # 1e-3 C costs 1e-6 of a full round: stopping there wastes nothing measurable, and it keeps the
    # float32 slack of the last clipped round (about 1e-9 of the budget) from buying a further
    # round of pure rounding noise.
    exhausted_below: float = 1e-3
    # Distributed mode trusts secure aggregation to release only sums of >= m reports, and each
    # report carries only 1/sqrt(m) of the accounted noise: the owner caps the m it will believe.
    max_min_reports: int = 100
    # The owner's limits on SecAgg+ neighbourhood graphs (failure probability per round, threshold).
    secagg_graph: SecAggGraphPolicy = field(default_factory=SecAggGraphPolicy)

    def __post_init__(self):
        problems = []
        if finite(self.min_noise_multiplier) is None or self.min_noise_multiplier <= 0:
            problems.append(
                f"min_noise_multiplier must be a finite number > 0. Found {short_repr(self.min_noise_multiplier)}."
            )
        if not int_in(self.max_min_reports, 1, INT64_MAX):
            problems.append(
                f"max_min_reports must be an integer in [1, 2**63-1]. Found {short_repr(self.max_min_reports)}."
            )
        if self.after_exhaustion not in AFTER_EXHAUSTION:
            problems.append(f"after_exhaustion must be one of {AFTER_EXHAUSTION}. Found {self.after_exhaustion!r}.")
        if not (0 <= self.exhausted_below < 1):
            problems.append(f"exhausted_below must be in [0, 1). Found {self.exhausted_below!r}.")
        if problems:
            raise ValueError(" ".join(problems))


def validate_request(spec: RoundSpec, policy: ClientPolicy) -> None:
    """Raise ``RoundSpecError`` listing every problem with the request at once.

    Everything the round will compute from the request is bounded here, before any training:
    integers fit SQLite's int64, the noise std ``z * C`` (and the distributed share
    ``z * C / sqrt(m)``) is a finite, normal float, and ``m`` is at most the owner's cap.
    The error's code: ``bad-request`` if any value is malformed or out of range, else the first
    policy the request breaks.
    """
    problems: list[str] = []
    policy_codes: list[str] = []  # the problems that are the device's policy, not a malformed request
    if not (isinstance(spec.run_id, str) and 0 < len(spec.run_id) <= MAX_RUN_ID_CHARS):
        problems.append(
            f"run_id must be a non-empty string of at most {MAX_RUN_ID_CHARS} characters. "
            f"Found {short_repr(spec.run_id)}."
        )
    if not int_in(spec.round_id, 0, INT64_MAX):
        problems.append(f"round_id must be an integer in [0, 2**63-1]. Found {short_repr(spec.round_id)}.")
    z = finite(spec.noise_multiplier)
    if z is None or z <= 0:
        problems.append(f"noise_multiplier must be a finite number > 0. Found {short_repr(spec.noise_multiplier)}.")
        z = None
    elif z < policy.min_noise_multiplier:
        problems.append(f"noise_multiplier={z!r} is below this device's minimum {policy.min_noise_multiplier!r}.")
        policy_codes.append("noise-below-minimum")
    c = finite(spec.clip)
    if c is None or c <= 0:
        problems.append(f"clip must be a finite number > 0. Found {short_repr(spec.clip)}.")
        c = None
    m: int | None = spec.min_reports
    if not int_in(m, 1, policy.max_min_reports):
        problems.append(
            f"min_reports must be an integer in [1, {policy.max_min_reports}] (this device's "
            f"max-min-reports). Found {short_repr(m)}."
        )
        m = None
    if spec.placement not in PLACEMENTS:
        problems.append(f"placement must be one of {PLACEMENTS}. Found {short_repr(spec.placement)}.")
    elif spec.placement == "distributed" and not policy.allow_distributed:
        policy_codes.append("needs-secure-aggregation")
        problems.append(
            "placement='distributed' needs secure aggregation: this device serves it only when SecAgg+ masks "
            "its reply (secure_aggregation_mod before individual_filter_mod)."
        )
    if z is not None and c is not None:
        # The accounted std and the share actually added must lie in the noise grid's range
        # (client.mechanism.noise_grid): an overflow to inf, or a std too small for float32 reports,
        # would otherwise fail after training.
        low, high = NOISE_STD_RANGE
        std = z * c
        if not (math.isfinite(std) and low <= std <= high):
            problems.append(
                f"noise_multiplier * clip (the noise std) must be a finite number in [2**-100, 2**100]. "
                f"Found {z!r} * {c!r} = {std!r}."
            )
        elif spec.placement == "distributed" and m is not None:
            share = std / math.sqrt(int(m))
            if not low <= share <= high:
                problems.append(
                    f"noise_multiplier * clip / sqrt(min_reports) (each report's noise std) must be "
                    f"in [2**-100, 2**100]. Found {share!r}."
                )
    if problems:
        code = policy_codes[0] if len(policy_codes) == len(problems) else "bad-request"
        raise RoundSpecError("round request refused: " + " ".join(problems), code=code)


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
        validate_request(spec, self.policy)
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
