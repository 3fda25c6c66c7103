"""One distributed round on the device: Skellam noise on SecAgg+'s integer grid (issue 15).

The rule, written once (``release_skellam``; the simulation engine mirrors it), for a request
``(z, C, m)`` and the coordinator's SecAgg+ setup ``(q, n, t)`` (checked by
``secagg_grid.check_secagg_state``, with ``t >= m``):

* ``sigma = z C`` is the accounted std of the released SUM (``round_rules.accounted_noise_std``),
  ``gamma = grid_step(C)`` the grid step, ``mu_total = down((sigma / gamma)**2)`` the Skellam
  variance per coordinate the sum must carry (grid units), ``mu_share = up(mu_total / m)`` this
  device's share. The released sum holds ``n' >= t >= m`` reports, so its noise is
  ``Sk(n' mu_share)`` with ``n' mu_share >= mu_total``: no deficit whatever drops out, and a round
  below ``t`` is never unmasked.
* In one ledger transaction (``BudgetLedger.reserve``: replay refusal, every quota): the Gaussian
  allowance ``a_G`` every filter admits at ``sigma``; its charge ``g``; the largest integer-grid L2
  whose worst-case Skellam charge is at most ``g`` (``skellam_allowance``, constant work). The update
  is clipped to that L2 (times ``gamma``), snapped toward zero onto the grid (``k``, int64), and
  charged ``skellam_charge`` at its exact integer norms; the charge is checked against every filter
  again (defence in depth) and recorded with ``placement="distributed"``, the sensitivity and noise
  std in model units (``l2 * gamma``, ``sqrt(mu_share) * gamma``). The commit is durable BEFORE any
  noise is drawn. The steps are the same whether or not the budget is spent (an exhausted device
  clips to 0, so ``k = 0`` and its charge is 0).
* The worst-case account (``fedfilter.client.ledger.worst_case``, issue 22): what the report costs ALONE,
  to a coordinator that forges the other peers and reads it exactly, ``k + Sk(mu_share)``. Its
  Gaussian allowance ``a_W`` at the share's std ``sqrt(mu_share) gamma``, its charge ``w``, and the
  largest L2 whose worst-case Skellam charge at ``mu_share`` and the worst-case filter's order is at
  most ``w``: the round's L2 allowance is the smaller of the two (``l2_allowance``: both bisections
  always run, so neither the time nor the reply shows which account binds). The update is charged
  to both, at its exact norms, in the same transaction. A device without a worst-case budget refuses
  the round before training (``worst_case.require_worst_case``).
* Only then: ``y = k + Sk(mu_share)`` per floating-point array (integer buffers carry no data and
  are released as 0), and the report ``encode_report(y, q)``.

Trust. As for any distributed noise, the main account assumes the other reports in the sum come from
honest devices that received the same request (so each adds at least ``mu_share``), and a SecAgg+
coordinator that follows the protocol (honest but curious: it unmasks only sums of at least ``t``
reports). Devices that add less noise, or a coordinator that sends different requests to different
devices, can leave the sum with less noise than accounted; the public ledger records the request.
The worst-case account assumes none of this: it holds against any coordinator.

Only the ``rdp`` filter accounts Skellam releases (``privacy/skellam.py`` explains why the Gaussian-DP
filter does not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.worst_case import WorstCaseMissingError, require_worst_case
from fedfilter.client.mechanisms.gaussian import (
    as_float_arrays,
    check_finite,
    clip_to_norm,
    floating_indices,
    snap_toward_zero,
)
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, round_noise_stream
from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.privacy.filters import GaussianFilter, exhausted, rdp_order
from fedfilter.privacy.rounding import down, up
from fedfilter.privacy.skellam import integer_norms, l2_up, skellam_allowance, skellam_charge
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.rules import accounted_noise_std
from fedfilter.protocol.secagg_grid import encode_report, grid_step

__all__ = [
    "SkellamGrid",
    "SkellamRelease",
    "skellam_grid",
    "l2_allowance",
    "release_skellam",
    "WRAP_SIGMAS",
    "MAX_MU_SHARE",
]

# The released sum's noise must stay well inside SecAgg+'s range [-q/2, q/2): beyond it the sum wraps
# and the round is useless (equally private, but the device would pay for nothing).
WRAP_SIGMAS = 8.0
# The largest share variance the exact sampler draws from (client/mechanisms/skellam_noise.py checks it too; a
# test keeps the two equal).
MAX_MU_SHARE = 2.0**32
# The clip bound is shrunk by this factor so that the charge at the snapped update's rounded-up L2
# never exceeds the allowance's (a few ulps of slack; nothing measurable is lost).
_CLIP_SLACK = 1.0 - 2.0**-30


@dataclass(frozen=True)
class SkellamGrid:
    """The public numbers of one distributed round: from the request and the SecAgg+ setup alone."""

    gamma: float  # grid step, model units (a power of two)
    mu_total: float  # Skellam variance per coordinate of the released sum, grid units
    mu_share: float  # variance this device adds, grid units
    target_range: int  # q: SecAgg+'s quantization range

    @property
    def noise_std(self) -> float:
        """The std this device adds, in model units."""
        return math.sqrt(self.mu_share) * self.gamma


def skellam_grid(spec: RoundSpec, *, target_range: int, sample_num: int) -> SkellamGrid:
    """The round's grid and variances; ``RoundSpecError`` naming the values when they are impossible.

    Call after ``check_request`` (which bounds z, C, m) and ``check_secagg_state`` (q, n).
    """
    z, clip, m = float(spec.noise_multiplier), float(spec.clip), int(spec.min_reports)
    gamma = grid_step(clip)
    problems = []
    if not (gamma > 0 and math.isfinite(gamma) and gamma >= np.finfo(np.float64).tiny):
        problems.append(f"clip={clip!r} gives a grid step {gamma!r} below the smallest normal float.")
    sigma = accounted_noise_std(z, clip)
    ratio = sigma / gamma if gamma > 0 else math.inf
    mu_total = float(down(ratio * ratio)) if math.isfinite(ratio) else math.inf
    mu_share = float(up(mu_total / m)) if math.isfinite(mu_total) else math.inf
    if not (math.isfinite(mu_total) and mu_total > 0 and mu_share > 0):
        problems.append(
            f"noise_multiplier * clip / grid step = {ratio!r} gives no usable Skellam variance ({mu_total!r})."
        )
    elif mu_share > MAX_MU_SHARE:
        problems.append(
            f"noise_multiplier={z!r} / min_reports={m} give each report a Skellam variance of {mu_share!r} grid "
            f"steps squared (step {gamma!r}), above the sampler's 2**32."
        )
    else:
        # The sum of n reports carries Sk(n mu_share): it must fit SecAgg+'s range [-q/2, q/2).
        spread = WRAP_SIGMAS * math.sqrt(sample_num * mu_share)
        if not spread < target_range / 2:
            problems.append(
                f"noise_multiplier={z!r} is too large for the quantization range target_range={target_range}: "
                f"the sum of sample_num={sample_num} reports would carry noise of std "
                f"{math.sqrt(sample_num * mu_share):.6g} grid steps (step {gamma!r}), and {WRAP_SIGMAS:g} of "
                f"them exceed target_range / 2."
            )
    if problems:
        raise RoundSpecError("round request refused: " + " ".join(problems))
    return SkellamGrid(gamma=gamma, mu_total=mu_total, mu_share=mu_share, target_range=int(target_range))


@dataclass(frozen=True)
class SkellamRelease:
    """What leaves the device in a distributed round, and the (private, local) bookkeeping behind it."""

    status: str  # "contributed", "noise-only" or "left"
    report: list[np.ndarray] | None = field(repr=False)  # encode_report(y, q) per model array; None if left
    sensitivity: float  # l2 * gamma: the snapped update's L2 norm, model units (0 without data)
    noise_std: float  # sqrt(mu_share) * gamma, model units
    charge: np.ndarray = field(repr=False)
    state_after: np.ndarray = field(repr=False)
    filter: GaussianFilter = field(repr=False)


def l2_allowance(
    filt: GaussianFilter,
    a_gauss,
    worst: GaussianFilter,
    a_worst,
    *,
    sigma: float,
    grid: SkellamGrid,
    dim: int,
) -> np.ndarray:
    """The round's integer-grid L2 allowance: the largest L2 whose Skellam charges fit BOTH accounts.

    ``a_gauss``: the Gaussian allowance every main filter admits at the sum's std ``sigma``;
    ``a_worst``: the worst-case account's at the share's std ``grid.noise_std``. Each is turned into
    its charge and then into the largest L2 whose worst-case Skellam charge (``skellam_allowance``:
    ``mu_total`` and the main filter's order; ``mu_share`` and the worst-case filter's order) is at
    most that charge; the result is the smaller. Both bisections always run (constant work). The
    device (one row) and the engine (one row per client) both call this.
    """
    gaussian = filt.charge(sensitivity=a_gauss, noise_std=sigma)
    main = skellam_allowance(
        gaussian, mu_total=grid.mu_total, alpha=rdp_order(filt), dim=dim, max_l2=np.asarray(a_gauss) / grid.gamma
    )
    w_std = grid.noise_std
    worst_gauss = worst.charge(sensitivity=a_worst, noise_std=w_std)
    alone = skellam_allowance(
        worst_gauss, mu_total=grid.mu_share, alpha=rdp_order(worst), dim=dim, max_l2=np.asarray(a_worst) / grid.gamma
    )
    return np.minimum(main, alone)


def _round_stream(noise_seed: int | None, spec: RoundSpec) -> NoiseStream:
    return NoiseStream() if noise_seed is None else round_noise_stream(noise_seed, spec.run_id, spec.round_id)


def release_skellam(
    ledger: BudgetLedger,
    policy: ClientPolicy,
    spec: RoundSpec,
    update: Sequence[np.ndarray],
    grid: SkellamGrid,
    *,
    noise_seed: int | None = None,
) -> SkellamRelease:
    """Filter, clip, snap, record and noise one distributed round (module docstring).

    ``update`` holds EVERY model array in order; only floating-point arrays are released (integer
    buffers as 0). Raises before spending on bad input; ``ReplayError`` for a round already recorded.
    """
    check_request(spec, policy)
    if spec.placement != "distributed":
        raise RoundSpecError(
            f"round request refused: a Skellam release needs placement='distributed'. Found {spec.placement!r}."
        )
    filt, run_filt = ledger.filter, ledger.run_filter
    if filt.kind != "rdp":
        raise RoundSpecError(
            "round request refused: distributed (Skellam) releases are accounted by the rdp filter; "
            f"this device's filter is {filt.kind!r}."
        )
    try:
        require_worst_case(ledger.current_worst_filter())
    except WorstCaseMissingError as err:
        raise RoundSpecError(str(err)) from None
    arrays = [np.asarray(a) for a in update]
    floating = floating_indices(arrays)
    released = as_float_arrays([arrays[i] for i in floating])
    check_finite(released)
    dim = max(1, sum(a.size for a in released))
    z, clip = float(spec.noise_multiplier), float(spec.clip)
    sigma = accounted_noise_std(z, clip)
    gamma, mu_total, mu_share = grid.gamma, grid.mu_total, grid.mu_share

    with ledger.reserve(spec.run_id, int(spec.round_id)) as tx:
        worst = require_worst_case(tx.worst_filter)
        allowance = tx.allowance(noise_std=sigma, clip=clip)  # every budget and quota, Gaussian units
        a_worst = tx.worst_allowance(noise_std=grid.noise_std, clip=clip)  # the report alone
        # The largest integer-grid L2 whose worst-case Skellam charges fit both admitted Gaussian ones
        # (constant work whatever the state, whichever account binds).
        l2_allow = float(l2_allowance(filt, allowance, worst, a_worst, sigma=sigma, grid=grid, dim=dim))
        spent = bool(exhausted(l2_allow * gamma, clip, policy.exhausted_below))
        # The same steps whether or not the budget is spent: an exhausted device clips to 0.
        bound = 0.0 if spent else l2_allow * gamma * _CLIP_SLACK
        clipped, _ = clip_to_norm(released, bound)
        k = snap_toward_zero(clipped, gamma)  # |k_i| <= C / gamma < 2**13: integer_norms is exact
        l1, l2sq = integer_norms(k)
        l2 = float(l2_up(l2sq))
        charge = skellam_charge(filt, l1, l2, mu_total)
        worst_charge = skellam_charge(worst, l1, l2, mu_share)  # k + Sk(mu_share), read alone
        admitted = bool(tx.admits(charge)) and tx.worst_admits(worst_charge)
        if not (admitted or spent):
            raise RuntimeError("internal error: the snapped update's charge exceeds the allowance; nothing spent")
        status = ("left" if policy.after_exhaustion == "leave" else "noise-only") if spent else "contributed"
        state_after = filt.spend(tx.state, charge)
        tx.record(
            status=status,
            charge=charge,
            state_after=state_after,
            run_state_after=run_filt.spend(tx.run_state, charge),
            sensitivity=l2 * gamma,
            noise_std=grid.noise_std,
            noise_multiplier=z,
            clip=clip,
            placement="distributed",
            worst_charge=worst_charge,
        )
    # Committed: the spend is on disk. Only now is anything computed that leaves the device.
    report = None
    if status != "left":
        noisy = add_skellam_noise(k, mu_share, _round_stream(noise_seed, spec))
        y = [np.zeros(a.shape, dtype=np.int64) for a in arrays]  # integer buffers: no data, released as 0
        for i, values in zip(floating, noisy):
            y[i] = np.asarray(values, dtype=np.int64).reshape(arrays[i].shape)
        report = encode_report(y, grid.target_range)
    return SkellamRelease(status, report, l2 * gamma, grid.noise_std, charge, state_after, filt)
