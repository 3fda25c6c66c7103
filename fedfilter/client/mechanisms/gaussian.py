"""The per-round Gaussian mechanism on the client: certified norms, clipping, snapping, noise.

Norms are computed in float64 and then inflated by a bound on their rounding error, so the
sensitivity the filter is charged for is never below the true norm of the array actually
released (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. (3.5): a sum of
n terms has relative error at most (n-1)u/(1-(n-1)u); squaring and the square root add a few u).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, rounded_gaussian
from fedfilter.client.mechanisms.spend import Account
from fedfilter.privacy.filters import GaussianFilter
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.rules import accounted_noise_std, added_noise_std
from fedfilter.protocol.wire import REPLY_DTYPE

_U = 2.0**-53  # unit roundoff of float64


class NonFiniteUpdateError(ValueError):
    """The update holds NaN or inf: refused before anything is spent.

    Examples
    --------
    >>> issubclass(NonFiniteUpdateError, ValueError)
    True
    """


def floating_indices(arrays: Sequence[np.ndarray]) -> list[int]:
    """The arrays a report releases: the floating-point ones. Integer, bool and complex arrays (e.g.
    BatchNorm's batch counter) are never released: they travel as zeros.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The model's arrays.

    Returns
    -------
    list of int
        The indices of the floating-point arrays.

    Examples
    --------
    >>> import numpy as np
    >>> floating_indices([np.zeros(2), np.zeros(2, dtype=np.int64)])
    [0]
    """
    return [i for i, a in enumerate(arrays) if np.issubdtype(np.asarray(a).dtype, np.floating)]


def as_float_arrays(update: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The update's arrays, refused (``ValueError``, before anything is spent) unless every one is
    floating-point and together they hold at least one value to release.

    Parameters
    ----------
    update : sequence of numpy.ndarray
        The update's arrays.

    Returns
    -------
    list of numpy.ndarray
        The same arrays, as numpy arrays.

    Examples
    --------
    >>> import numpy as np
    >>> len(as_float_arrays([np.ones(3), np.zeros((2, 2))]))
    2
    >>> as_float_arrays([np.zeros(2, dtype=np.int64)])
    Traceback (most recent call last):
    ...
    ValueError: update[0] must be a floating-point array. Found dtype int64.
    """
    arrays = [np.asarray(a) for a in update]
    for i, a in enumerate(arrays):
        if not np.issubdtype(a.dtype, np.floating):
            raise ValueError(f"update[{i}] must be a floating-point array. Found dtype {a.dtype}.")
    if sum(a.size for a in arrays) == 0:
        raise ValueError(
            "the update must hold at least one floating-point value: a model with only integer, bool or "
            f"complex arrays, or none, has nothing to release. Found {len(arrays)} floating-point array(s) "
            f"of shapes {[a.shape for a in arrays]}; nothing was spent."
        )
    return arrays


def check_finite(arrays: Sequence[np.ndarray]) -> None:
    """Raise ``NonFiniteUpdateError`` naming the first array holding NaN or inf, and the value.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The floating-point arrays to check.

    Examples
    --------
    >>> import numpy as np
    >>> check_finite([np.ones(2)])
    >>> check_finite([np.array([1.0, np.nan])])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.mechanisms.gaussian.NonFiniteUpdateError: update[0] (shape (2,)) contains 1 non-finite ...
    """
    for i, a in enumerate(arrays):
        bad = ~np.isfinite(a)
        if bad.any():
            raise NonFiniteUpdateError(
                f"update[{i}] (shape {a.shape}) contains {int(bad.sum())} non-finite value(s), "
                f"e.g. {a[bad].flat[0]!r}; nothing was spent."
            )


def certified_norm(arrays: Sequence[np.ndarray]) -> float:
    """An upper bound on the exact L2 norm of all arrays together, as stored.

    Entries are first scaled by an exact power of two so that the largest lies in [0.5, 1):
    squares then neither overflow nor lose the total to underflow, and the relative error bound
    holds (an entry whose square underflows contributes less than 2**-1074 to a total >= 0.25).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        Floating-point arrays, taken together as one vector.

    Returns
    -------
    float
        A bound at or just above their L2 norm.

    Examples
    --------
    >>> import numpy as np
    >>> certified_norm([np.array([3.0, 4.0])])
    5.0000000000000115
    """
    n = sum(a.size for a in arrays)
    peak = max((float(np.max(np.abs(a))) for a in arrays if a.size), default=0.0)
    if peak == 0.0:
        return 0.0
    exponent = math.frexp(peak)[1]
    # 2**-exponent in two exact halves: a single factor overflows for subnormal peaks.
    half_a, half_b = math.ldexp(1.0, -(exponent // 2)), math.ldexp(1.0, -(exponent - exponent // 2))
    total = 0.0
    for a in arrays:
        flat = a.astype(np.float64, copy=False).ravel() * half_a * half_b  # exact: powers of two
        total += float(np.dot(flat, flat))
    norm = math.ldexp(math.sqrt(total), exponent)
    return float(np.nextafter(norm * (1.0 + (n + 8) * 2 * _U), np.inf))


def clip_to_norm(arrays: Sequence[np.ndarray], max_norm: float) -> tuple[list[np.ndarray], float]:
    """Scale the update so its certified norm is at most ``max_norm``; returns (arrays, norm).

    The arrays keep their dtypes. Rounding in the cast can push a norm up by a few ulps of the
    dtype, so the result is re-certified and shrunk again if needed.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The update's floating-point arrays.
    max_norm : float
        The bound, finite and >= 0.

    Returns
    -------
    tuple of (list of numpy.ndarray, float)
        The clipped arrays and their certified norm (at most ``max_norm``).

    Examples
    --------
    >>> import numpy as np
    >>> clipped, norm = clip_to_norm([np.array([3.0, 4.0])], 1.0)
    >>> clipped[0], norm
    (array([0.6, 0.8]), 1.0)
    """
    if not (np.isfinite(max_norm) and max_norm >= 0):
        raise ValueError(f"max_norm must be finite and >= 0. Found {max_norm!r}.")
    norm = certified_norm(arrays)
    # The same passes whether or not the update needs clipping, so that their time does not tell
    # (a scale of exactly 1 leaves every value as it is).
    scale = 1.0 if norm <= max_norm else max_norm / norm
    # Casts move norms by about one ulp of the dtype (2**-24 for float32, 2**-11 for float16):
    # each retry shrinks by more than that.
    shrink = 1 - max(2.0**-20, 4 * max(float(np.finfo(a.dtype).eps) for a in arrays))
    for _ in range(8):
        clipped = [(a.astype(np.float64) * scale).astype(a.dtype) for a in arrays]
        norm = certified_norm(clipped)
        if norm <= max_norm:
            return clipped, norm
        scale *= shrink
    zeros = [np.zeros_like(a) for a in arrays]
    return zeros, 0.0


# Every floating-point report leaves the device in this dtype, whatever the model's dtype: the
# coordinator does not choose it (its values are integers times a power of two; see noise_grid).
NOISE_GRID_BITS = 16


NOISE_STD_RANGE = (2.0**-100, 2.0**100)  # every report (at most 2**24 steps) stays a normal float32


def noise_grid(std: float) -> tuple[float, float]:
    """``(gamma, sigma_g)``: the grid step, a power of two, and the noise std in grid steps.

    ``gamma = 2**(floor(log2 std) - 16)`` so ``sigma_g = std / gamma`` lies in ``[2**16, 2**17)``,
    exactly (scaling by a power of two). Snapping then moves each coordinate by less than
    ``2**-16`` of the noise std, and ``|k + R|`` stays far below ``2**24``, so float32 holds every
    report exactly.

    Parameters
    ----------
    std : float
        The noise std, in ``NOISE_STD_RANGE``.

    Returns
    -------
    tuple of (float, float)
        ``(gamma, sigma_g)``.

    Examples
    --------
    >>> noise_grid(1.0)
    (1.52587890625e-05, 65536.0)
    """
    if not (math.isfinite(std) and NOISE_STD_RANGE[0] <= std <= NOISE_STD_RANGE[1]):
        raise ValueError(f"noise std must be a finite number in [2**-100, 2**100]. Found {std!r}.")
    frac, exp = math.frexp(std)  # std = frac * 2**exp, frac in [0.5, 1)
    return math.ldexp(1.0, exp - 1 - NOISE_GRID_BITS), math.ldexp(frac, NOISE_GRID_BITS + 1)


def snap_toward_zero(arrays: Sequence[np.ndarray], gamma: float) -> list[np.ndarray]:
    """Each array as int64 multiples of ``gamma``, rounded toward zero.

    Exact: dividing by a power of two and truncating introduce no rounding, and ``|k gamma| <= |a|``
    per coordinate, so the snapped update's norm never exceeds the clipped one (the charge).

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The clipped update.
    gamma : float
        The grid step (``noise_grid``).

    Returns
    -------
    list of numpy.ndarray
        int64 arrays ``k`` with ``|k gamma| <= |a|``.

    Examples
    --------
    >>> import numpy as np
    >>> snap_toward_zero([np.array([0.75, -0.3])], 0.25)
    [array([ 3, -1])]
    """
    out = []
    for i, a in enumerate(arrays):
        k = np.trunc(np.asarray(a, dtype=np.float64) / gamma)
        if k.size and float(np.max(np.abs(k))) >= 2.0**52:
            raise ValueError(f"update[{i}] is too large for the noise grid (step {gamma!r}); nothing was spent.")
        out.append(k.astype(np.int64))
    return out


def add_grid_noise(snapped: Sequence[np.ndarray], std: float, stream: NoiseStream) -> list[np.ndarray]:
    """``(k + round(sigma_g G)) * gamma`` per array, in ``REPLY_DTYPE``.

    See ``fedfilter.client.mechanisms.gaussian_noise``.

    Parameters
    ----------
    snapped : sequence of numpy.ndarray
        The int64 arrays from ``snap_toward_zero``.
    std : float
        The noise std.
    stream : NoiseStream
        The random bytes.

    Returns
    -------
    list of numpy.ndarray
        The report's arrays.

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
    >>> add_grid_noise([np.array([1, 2])], 1.0, NoiseStream.from_seed(0))
    [array([-0.8088989,  1.8667908], dtype=float32)]
    """
    gamma, sigma_g = noise_grid(std)
    out = []
    for k in snapped:
        n = k + rounded_gaussian(sigma_g, k.size, stream).reshape(k.shape)
        out.append((n.astype(np.float64) * gamma).astype(REPLY_DTYPE))  # a function of n alone
    return out


@dataclass(frozen=True)
class GaussianMechanism:
    """The Gaussian release's steps in the spend template (``fedfilter.client.mechanisms.spend``).

    The observer's view is charged at ``accounted_std`` (the sum's std if distributed), the
    worst-case account at ``added_std`` (what this report carries alone; local: the same). The
    update is clipped to the allowance, snapped toward zero onto the noise grid (``gamma``), and
    charged at the clipped norm (the snapped norm is at most that).

    Parameters
    ----------
    placement : str
        ``"local"`` or ``"distributed"`` (Gaussian shares, for direct callers).
    noise_multiplier, clip : float
        The request's ``z`` and ``C``.
    accounted_std, added_std : float
        ``protocol.rules.accounted_noise_std`` and ``added_noise_std`` of the request.
    gamma : float
        The noise grid's step for ``added_std`` (``noise_grid``).

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec
    >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
    >>> m.accounted_std, m.added_std
    (2.0, 2.0)
    """

    placement: str
    noise_multiplier: float
    clip: float
    accounted_std: float
    added_std: float
    gamma: float

    @classmethod
    def for_request(cls, spec: RoundSpec) -> GaussianMechanism:
        """The mechanism a (validated) request asks for; ``ValueError`` when its noise std has no grid.

        Parameters
        ----------
        spec : RoundSpec
            The round's request.

        Returns
        -------
        GaussianMechanism

        Examples
        --------
        >>> from fedfilter.protocol.request import RoundSpec
        >>> GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0)).gamma
        3.0517578125e-05
        """
        z, clip = float(spec.noise_multiplier), float(spec.clip)
        added_std = added_noise_std(z, clip, spec.placement, spec.min_reports)
        gamma, _ = noise_grid(added_std)  # before anything is spent: an impossible std is refused here
        return cls(spec.placement, z, clip, accounted_noise_std(z, clip), added_std, gamma)

    # ``spend.nothing_left``: none. A Gaussian release is charged at its clipped norm, whatever of it
    # the noise grid (2**16 times finer than the noise) keeps, so every round with an allowance moves
    # the accounts; and the owner's threshold already stops it.
    floor: ClassVar[float] = 0.0

    def check(self, update: Sequence[np.ndarray], filt: GaussianFilter) -> list[np.ndarray]:
        """The arrays to release, refused (``ValueError``) before anything is spent. Every filter kind accounts it.

        Parameters
        ----------
        update : sequence of numpy.ndarray
            The update's arrays.
        filt : GaussianFilter
            The device's filter (unused: every kind accounts a Gaussian release).

        Returns
        -------
        list of numpy.ndarray

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.check([np.ones(2)], None)
        [array([1., 1.])]
        """
        arrays = as_float_arrays(update)
        check_finite(arrays)
        return arrays

    def allowance(self, account: Account) -> float | np.ndarray:
        """The smaller of every budget's allowance at ``accounted_std`` and the worst-case one at ``added_std``.

        Parameters
        ----------
        account : Account
            The ledger's account for this round.

        Returns
        -------
        float or numpy.ndarray
            The largest clipped norm the budgets still allow.

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as account:
        ...     m.allowance(account)
        1.8498617953338456
        >>> ledger.close(); tmp.cleanup()
        """
        allowance = account.allowance(noise_std=self.accounted_std, clip=self.clip)
        return min(allowance, account.worst_allowance(noise_std=self.added_std, clip=self.clip))

    def clip_and_snap(self, arrays: Sequence[np.ndarray], bound) -> tuple[list[np.ndarray] | None, float | np.ndarray]:
        """The update clipped to ``bound`` and snapped onto the grid, and its certified (clipped) norm.

        Parameters
        ----------
        arrays : sequence of numpy.ndarray
            The update (from ``check``).
        bound : float
            The allowance.

        Returns
        -------
        tuple of (list of numpy.ndarray, float)
            The snapped int64 arrays and the certified norm they are charged at.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> k, norm = m.clip_and_snap([np.array([3.0, 4.0])], 1.0)
        >>> norm, k[0]
        (1.0, array([19660, 26214]))
        """
        clipped, norm = clip_to_norm(arrays, float(bound))
        return snap_toward_zero(clipped, self.gamma), norm  # the snapped norm is at most `norm`

    def charges(self, account: Account, payload, sensitivity: float) -> tuple[np.ndarray, np.ndarray | None]:
        """The main charge at ``accounted_std`` and the worst-case one at ``added_std`` (None without an account).

        Parameters
        ----------
        account : Account
            The ledger's account for this round.
        payload : list of numpy.ndarray
            The snapped update (unused).
        sensitivity : float
            The certified clipped norm.

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray or None)

        Examples
        --------
        >>> import tempfile
        >>> from pathlib import Path
        >>> from fedfilter.client.ledger.budget import BudgetLedger
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> tmp = tempfile.TemporaryDirectory()
        >>> ledger = BudgetLedger.enrol(Path(tmp.name) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
        ...                             state_dir=Path(tmp.name) / "owner")
        >>> with ledger.reserve("run", 0) as account:
        ...     m.charges(account, None, 1.0)
        (array([0.25]), None)
        >>> ledger.close(); tmp.cleanup()
        """
        charge = account.filter.charge(sensitivity=sensitivity, noise_std=self.accounted_std)
        worst = account.worst_filter
        return charge, None if worst is None else worst.charge(sensitivity=sensitivity, noise_std=self.added_std)

    def noise(self, payload: list[np.ndarray], stream: NoiseStream) -> list[np.ndarray]:
        """The report: grid noise added to the snapped update (call only after the commit).

        Parameters
        ----------
        payload : list of numpy.ndarray
            The snapped update (``clip_and_snap``).
        stream : NoiseStream
            The random bytes.

        Returns
        -------
        list of numpy.ndarray
            The report, in ``REPLY_DTYPE``.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
        >>> from fedfilter.protocol.request import RoundSpec
        >>> m = GaussianMechanism.for_request(RoundSpec("run", 0, 1.0, 2.0))
        >>> m.noise([np.array([0, 0])], NoiseStream.from_seed(0))[0].dtype
        dtype('float32')
        """
        return add_grid_noise(payload, self.added_std, stream)
