"""One distributed round on the device: Skellam noise on SecAgg+'s integer grid.

The rule, written once (``SkellamMechanism``, run by ``mechanisms/spend.py``; the engine runs it too), for a request
``(z, C, m)`` and the coordinator's SecAgg+ setup ``(q, n, t)`` (checked by
``client.secagg.neighbourhood.check_secagg_state``, with ``t >= m``):

* ``sigma = z C`` is the accounted std of the released SUM (``protocol.rules.accounted_noise_std``),
  ``gamma = grid_step(C)`` the grid step, ``mu_total = down((sigma / gamma)**2)`` the Skellam
  variance per coordinate the sum must carry (grid units), ``mu_share = up(mu_total / m)`` this
  device's share. The released sum holds ``n' >= t >= m`` reports, so its noise is
  ``Sk(n' mu_share)`` with ``n' mu_share >= mu_total``: no deficit whatever drops out, and a round
  below ``t`` is never unmasked.
* In one ledger transaction (``fedfilter.client.release.release``; ``BudgetLedger.reserve``: replay
  refusal, every quota): the Gaussian allowance ``a_G`` every filter admits at ``sigma`` (not capped at
  ``C``); its charge ``g``; the largest integer-grid L2, at most ``min(a_G, C) / gamma``, whose
  worst-case Skellam charge is at most ``g`` (``skellam_allowance``, constant work). The update
  is clipped to that L2 (times ``gamma``), snapped toward zero onto the grid (``k``, int64), and
  charged ``skellam_charge`` at its exact integer norms; the charge is checked against every filter
  again (defence in depth) and recorded with ``placement="distributed"``, the sensitivity and noise
  std in model units (``l2 * gamma``, ``sqrt(mu_share) * gamma``). The commit is durable BEFORE any
  noise is drawn. The steps are the same whether or not the budget is spent (an exhausted device
  clips to 0, so ``k = 0`` and its charge is 0).
* The worst-case account (``fedfilter.client.ledger.worst_case``): what the report costs ALONE,
  to a coordinator that forges the other peers and reads it exactly, ``k + Sk(mu_share)``. Its
  Gaussian allowance ``a_W`` at the share's std ``sqrt(mu_share) gamma`` (not capped at ``C``), its
  charge ``w``, and the largest L2, at most ``min(a_W, C) / gamma``, whose worst-case Skellam charge at
  ``mu_share`` and the worst-case filter's order is at most ``w``: the round's L2 allowance is the
  smaller of the two (``l2_allowance``: both bisections
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

from fedfilter.client.mechanisms.gaussian import (
    as_float_arrays,
    check_finite,
    clip_to_norm,
    floating_indices,
    snap_toward_zero,
)
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
from fedfilter.client.mechanisms.skellam_noise import MAX_MU_SHARE, add_skellam_noise
from fedfilter.client.mechanisms.spend import Account
from fedfilter.privacy.filters import GaussianFilter, rdp_order
from fedfilter.privacy.skellam import integer_norms, l2_up, skellam_allowance, skellam_charge
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.rules import accounted_noise_std
from fedfilter.protocol.secagg.grid import (
    WRAP_SIGMAS,
    encode_report,
    grid_step,
    skellam_variances,
    sum_noise_fits,
)

# The clip bound is shrunk by this factor so that the charge at the snapped update's rounded-up L2
# never exceeds the allowance's (a few ulps of slack; nothing measurable is lost). The engine uses it too.
CLIP_SLACK = 1.0 - 2.0**-30


@dataclass(frozen=True)
class SkellamGrid:
    """The public numbers of one distributed round: from the request and the SecAgg+ setup alone.

    Attributes
    ----------
    gamma : float
        The grid step, model units (a power of two).
    mu_total : float
        The Skellam variance per coordinate of the released sum, grid units.
    mu_share : float
        The variance this device adds, grid units.
    target_range : int
        ``q``: SecAgg+'s quantization range.

    Examples
    --------
    >>> SkellamGrid(gamma=0.25, mu_total=64.0, mu_share=16.0, target_range=2**22).noise_std
    1.0
    """

    gamma: float  # grid step, model units (a power of two)
    mu_total: float  # Skellam variance per coordinate of the released sum, grid units
    mu_share: float  # variance this device adds, grid units
    target_range: int  # q: SecAgg+'s quantization range

    @property
    def noise_std(self) -> float:
        """The std this device adds, in model units.

        Examples
        --------
        >>> SkellamGrid(gamma=0.25, mu_total=64.0, mu_share=16.0, target_range=2**22).noise_std
        1.0
        """
        return math.sqrt(self.mu_share) * self.gamma


def skellam_grid(spec: RoundSpec, *, target_range: int, sample_num: int) -> SkellamGrid:
    """The round's grid and variances; ``RoundSpecError`` naming the values when they are impossible.

    Call after ``check_request`` (which bounds z, C, m) and ``check_secagg_state`` (q, n).

    Parameters
    ----------
    spec : RoundSpec
        The distributed request (``z``, ``C``, ``m``).
    target_range : int
        SecAgg+'s quantization range ``q``.
    sample_num : int
        The number of reports SecAgg+ sums (``n``).

    Returns
    -------
    SkellamGrid

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec
    >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
    >>> skellam_grid(spec, target_range=2**22, sample_num=4)
    SkellamGrid(gamma=0.000244140625, mu_total=16777215.999999998, mu_share=8388608.0, target_range=4194304)
    """
    z, clip, m = float(spec.noise_multiplier), float(spec.clip), int(spec.min_reports)
    gamma = grid_step(clip)
    problems = []
    if not (gamma > 0 and math.isfinite(gamma) and gamma >= np.finfo(np.float64).tiny):
        problems.append(f"clip={clip!r} gives a grid step {gamma!r} below the smallest normal float.")
    ratio = accounted_noise_std(z, clip) / gamma if gamma > 0 else math.inf
    mu_total, mu_share = skellam_variances(z, clip, m)
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
        if not sum_noise_fits(mu_share, sample_num, target_range):
            problems.append(
                f"noise_multiplier={z!r} is too large for the quantization range target_range={target_range}: "
                f"the sum of sample_num={sample_num} reports would carry noise of std "
                f"{math.sqrt(sample_num * mu_share):.6g} grid steps (step {gamma!r}), and {WRAP_SIGMAS:g} of "
                f"them exceed target_range / 2."
            )
    if problems:
        raise RoundSpecError("round request refused: " + " ".join(problems))
    return SkellamGrid(gamma=gamma, mu_total=mu_total, mu_share=mu_share, target_range=int(target_range))


def l2_allowance(
    filt: GaussianFilter,
    a_gauss,
    worst: GaussianFilter,
    a_worst,
    *,
    sigma: float,
    grid: SkellamGrid,
    dim: int,
    clip: float,
) -> np.ndarray:
    """The round's integer-grid L2 allowance: the largest L2, at most ``clip / gamma``, whose Skellam
    charges fit BOTH accounts.

    ``a_gauss``: the Gaussian allowance every main filter admits at the sum's std ``sigma``;
    ``a_worst``: the worst-case account's at the share's std ``grid.noise_std``; both NOT capped at
    ``clip`` (``round_allowance(..., clip=inf)``). Each is turned into its charge, what that account
    can pay this round, and then into the largest L2 in ``[0, min(a, clip) / gamma]`` whose
    worst-case Skellam charge (``skellam_allowance``: ``mu_total`` and the main filter's order;
    ``mu_share`` and the worst-case filter's order) is at most that charge; the result is the
    smaller. Both bisections always run (constant work). The device (one row) and the engine (one
    row per client) both call this.

    Why uncapped: a Skellam release of norm L2 costs more than a Gaussian one of the same norm (the
    discreteness term of ``skellam_rho``, largest at small orders and small ``mu``). Capping the
    Gaussian allowance at ``C`` first capped the charge at a Gaussian full round's, below a Skellam
    full round's, so a device released less than ``C`` in every round however much budget it had
    left: 0.74 to 0.77 C with the worst-case account at the settings of ``benchmarks/fl_vs_flower_dp.py``
    (FEMNIST and MNIST at epsilon 8). ``fedfilter plan`` counts full-``C`` Skellam rounds, as this does.

    Parameters
    ----------
    filt : GaussianFilter
        The main (rdp) filter.
    a_gauss : float or numpy.ndarray
        The main Gaussian allowance at ``sigma``, not capped.
    worst : GaussianFilter
        The worst-case account's filter.
    a_worst : float or numpy.ndarray
        Its Gaussian allowance at ``grid.noise_std``, not capped.
    sigma : float
        The accounted std of the sum, model units.
    grid : SkellamGrid
        The round's grid.
    dim : int
        The number of released coordinates.
    clip : float
        The request's ``C``.

    Returns
    -------
    numpy.ndarray
        The L2 allowance, grid units.

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.privacy.filters import make_filter
    >>> from fedfilter.protocol.request import RoundSpec
    >>> spec = RoundSpec("run", 0, 2.0, 1.0, placement="distributed", min_reports=10)
    >>> grid = skellam_grid(spec, target_range=2**22, sample_num=20)
    >>> filt, worst = make_filter("rdp", 1e3, 1e-5), make_filter("rdp", 1e4, 1e-5)
    >>> a, w = filt.allowance(np.zeros(1), noise_std=2.0), worst.allowance(np.zeros(1), noise_std=grid.noise_std)
    >>> float(l2_allowance(filt, a, worst, w, sigma=2.0, grid=grid, dim=1000, clip=1.0)) * grid.gamma  # a full C
    1.0
    """
    top = float(clip)
    gaussian = filt.charge(sensitivity=a_gauss, noise_std=sigma)
    main = skellam_allowance(
        gaussian,
        mu_total=grid.mu_total,
        alpha=rdp_order(filt),
        dim=dim,
        max_l2=np.minimum(np.asarray(a_gauss), top) / grid.gamma,
    )
    w_std = grid.noise_std
    worst_gauss = worst.charge(sensitivity=a_worst, noise_std=w_std)
    alone = skellam_allowance(
        worst_gauss,
        mu_total=grid.mu_share,
        alpha=rdp_order(worst),
        dim=dim,
        max_l2=np.minimum(np.asarray(a_worst), top) / grid.gamma,
    )
    return np.minimum(main, alone)


def _worst_filter(account: Account) -> GaussianFilter:
    # The release refused the round before reserving when the device has no worst-case budget
    # (``ledger.worst_case.require_worst_case``): a reservation without one is a bug.
    if account.worst_filter is None:
        raise RuntimeError("internal error: a distributed round without a worst-case budget; nothing spent")
    return account.worst_filter


@dataclass(frozen=True)
class SkellamPayload:
    """The snapped update on the integer grid and its exact norms (``integer_norms``; ``l2`` rounded up).

    Attributes
    ----------
    k : list of numpy.ndarray
        The int64 arrays (floating-point arrays only).
    l1 : float
        Their L1 norm.
    l2 : float
        Their L2 norm, rounded up.

    Examples
    --------
    >>> import numpy as np
    >>> SkellamPayload([np.array([1, 2])], 3.0, 2.25)
    SkellamPayload(l1=3.0, l2=2.25)
    """

    k: list[np.ndarray] = field(repr=False)
    l1: float
    l2: float


@dataclass(frozen=True)
class SkellamMechanism:
    """The Skellam release's steps in the spend template (module docstring; ``mechanisms/spend.py``).

    Built for one update's layout: only its floating-point arrays (``floating``) are released, integer
    buffers travel as 0; ``dim`` counts the released coordinates (the allowance's bisection needs it).

    Parameters
    ----------
    noise_multiplier, clip : float
        The request's ``z`` and ``C``.
    sigma : float
        The accounted std of the released sum, model units.
    grid : SkellamGrid
        The round's grid and variances (``skellam_grid``).
    shapes : tuple of tuple of int
        The shape of every model array, in order.
    floating : tuple of int
        The indices of the floating-point arrays (the ones released).
    dim : int
        The number of released coordinates (at least 1).

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.protocol.request import RoundSpec
    >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
    >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
    >>> m = SkellamMechanism.for_update(spec, grid, [np.zeros(3, np.float32), np.zeros(1, np.int64)])
    >>> m.floating, m.dim
    ((0,), 3)
    """

    noise_multiplier: float
    clip: float
    sigma: float
    grid: SkellamGrid
    shapes: tuple[tuple[int, ...], ...]
    floating: tuple[int, ...]
    dim: int
    placement: str = "distributed"

    @classmethod
    def for_update(cls, spec: RoundSpec, grid: SkellamGrid, update: Sequence[np.ndarray]) -> SkellamMechanism:
        """The mechanism for a validated distributed request, its grid and the layout of ``update``.

        Parameters
        ----------
        spec : RoundSpec
            The request (placement ``"distributed"``).
        grid : SkellamGrid
            The round's grid (``skellam_grid``).
        update : sequence of numpy.ndarray
            The model's arrays (their shapes and dtypes).

        Returns
        -------
        SkellamMechanism

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> m.shapes, m.floating
        (((3,), (1,)), (0,))
        """
        if spec.placement != "distributed":
            raise RoundSpecError(
                f"round request refused: a Skellam release needs placement='distributed'. Found {spec.placement!r}."
            )
        arrays = [np.asarray(a) for a in update]
        floating = tuple(floating_indices(arrays))
        dim = max(1, sum(arrays[i].size for i in floating))
        z, clip = float(spec.noise_multiplier), float(spec.clip)
        shapes = tuple(a.shape for a in arrays)
        return cls(z, clip, accounted_noise_std(z, clip), grid, shapes, floating, dim)

    @property
    def added_std(self) -> float:
        """The std this report carries, model units: ``sqrt(mu_share) * gamma``.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> m.added_std
        0.7071067811865476
        """
        return self.grid.noise_std

    @property
    def floor(self) -> float:
        """``sqrt(dim)`` grid steps, model units (``spend.nothing_left``): from there on an update
        clipped to the allowance keeps a coordinate of at least one step (its largest is at least
        ``L / sqrt(dim)``), so it is charged and the accounts move; below it, one of equal coordinates
        snaps to zero, costs nothing, and would leave the device "contributing" nothing for ever.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> m.floor  # sqrt(3) grid steps
        0.0004228639666916204
        """
        return math.sqrt(self.dim) * self.grid.gamma

    def check(self, update: Sequence[np.ndarray], filt: GaussianFilter) -> list[np.ndarray]:
        """The floating-point arrays to release, refused before anything is spent (and an rdp filter required).

        Parameters
        ----------
        update : sequence of numpy.ndarray
            The model's arrays, in the layout the mechanism was built for.
        filt : GaussianFilter
            The device's filter (must be rdp).

        Returns
        -------
        list of numpy.ndarray

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> from fedfilter.privacy.filters import make_filter
        >>> m.check([np.ones(3, np.float32), np.zeros(1, np.int64)], make_filter("rdp", 8.0, 1e-5))
        [array([1., 1., 1.], dtype=float32)]
        """
        if filt.kind != "rdp":
            raise RoundSpecError(
                "round request refused: distributed (Skellam) releases are accounted by the rdp filter; "
                f"this device's filter is {filt.kind!r}."
            )
        released = as_float_arrays([np.asarray(update[i]) for i in self.floating])
        check_finite(released)
        return released

    def allowance(self, account: Account) -> float:
        """``l2_allowance`` (both accounts, constant work) in model units: times the grid step.

        Parameters
        ----------
        account : Account
            The books (with a worst-case account).

        Returns
        -------
        float

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=8.0, delta=1e-5,
        ...                             filter_kind="rdp", worst_case_epsilon=16.0, state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as account:
        ...     m.allowance(account)
        1.0
        >>> ledger.close(); tmp.cleanup()
        """
        worst = _worst_filter(account)
        # Not capped at C (l2_allowance says why): every budget and quota; the report alone.
        allowance = account.allowance(noise_std=self.sigma, clip=math.inf)
        a_worst = account.worst_allowance(noise_std=self.grid.noise_std, clip=math.inf)
        l2_allow = float(
            l2_allowance(
                account.filter,
                allowance,
                worst,
                a_worst,
                sigma=self.sigma,
                grid=self.grid,
                dim=self.dim,
                clip=self.clip,
            )
        )
        return l2_allow * self.grid.gamma

    def clip_and_snap(self, arrays: Sequence[np.ndarray], bound) -> tuple[SkellamPayload, float]:
        """Clip to ``bound * CLIP_SLACK``, snap toward zero onto the grid; the sensitivity ``l2 * gamma``.

        Parameters
        ----------
        arrays : sequence of numpy.ndarray
            The released arrays (``check``).
        bound : float
            The allowance, model units.

        Returns
        -------
        tuple of (SkellamPayload, float)

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> m.clip_and_snap([np.array([0.6, 0.8, 0.0], np.float32)], 1.0)
        (SkellamPayload(l1=5733, l2=4095.0), 0.999755859375)
        """
        clipped, _ = clip_to_norm(arrays, float(bound) * CLIP_SLACK)
        return self.snap(clipped)

    def snap(self, clipped: Sequence[np.ndarray]) -> tuple[SkellamPayload, float]:
        """Snap a clipped update toward zero onto the grid: the integer ``k``, its norms, ``l2 * gamma``.

        Parameters
        ----------
        clipped : sequence of numpy.ndarray
            The clipped released arrays.

        Returns
        -------
        tuple of (SkellamPayload, float)

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> m.snap([np.array([0.5, 0.0, 0.0])])
        (SkellamPayload(l1=2048, l2=2048.0), 0.5)
        """
        k = snap_toward_zero(clipped, self.grid.gamma)  # |k_i| <= C / gamma < 2**13: integer_norms is exact
        l1, l2sq = integer_norms(k)
        l2 = float(l2_up(l2sq))
        return SkellamPayload(k, l1, l2), l2 * self.grid.gamma

    def charges(self, account: Account, payload: SkellamPayload, sensitivity: float) -> tuple[np.ndarray, np.ndarray]:
        """``skellam_charge`` at the sum's ``mu_total`` and, read alone, at ``mu_share``.

        Parameters
        ----------
        account : Account
            The books (with a worst-case account).
        payload : SkellamPayload
            The snapped update.
        sensitivity : float
            Its ``l2 * gamma`` (unused: the charge is at the exact integer norms).

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray)
            The main and worst-case charges.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=8.0, delta=1e-5,
        ...                             filter_kind="rdp", worst_case_epsilon=16.0, state_dir=Path(tmp.name) / "owner")
        >>> payload, sensitivity = m.clip_and_snap([np.array([0.6, 0.8, 0.0], np.float32)], 1.0)
        >>> with ledger.reserve("run", 0) as account:
        ...     m.charges(account, payload, sensitivity)
        (array([0.50373275]), array([1.04524118]))
        >>> ledger.close(); tmp.cleanup()
        """
        worst = _worst_filter(account)
        charge = skellam_charge(account.filter, payload.l1, payload.l2, self.grid.mu_total)
        return charge, skellam_charge(worst, payload.l1, payload.l2, self.grid.mu_share)  # k + Sk(mu_share)

    def noise(self, payload: SkellamPayload, stream: NoiseStream) -> list[np.ndarray]:
        """The report ``encode_report(k + Sk(mu_share), q)``, integer buffers as 0 (only after the commit).

        Parameters
        ----------
        payload : SkellamPayload
            The snapped update.
        stream : NoiseStream
            The random bytes.

        Returns
        -------
        list of numpy.ndarray
            The report, one array per model array.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> m = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=2**22, sample_num=4),
        ...                                 [np.zeros(3, np.float32), np.zeros(1, np.int64)])
        >>> payload, _ = m.snap([np.array([0.5, 0.0, 0.0])])
        >>> [a.shape for a in m.noise(payload, NoiseStream.from_seed("doc"))]
        [(3,), (1,)]
        """
        noisy = add_skellam_noise(payload.k, self.grid.mu_share, stream)
        y = [np.zeros(shape, dtype=np.int64) for shape in self.shapes]  # integer buffers: no data, released as 0
        for i, values in zip(self.floating, noisy):
            y[i] = np.asarray(values, dtype=np.int64).reshape(self.shapes[i])
        return encode_report(y, self.grid.target_range)
