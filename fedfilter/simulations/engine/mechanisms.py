"""The device's mechanisms with the steps the engine has already done for many clients at once.

The engine runs the device's spend template (``fedfilter.client.mechanisms.spend.spend``) on its
accounts (``accounts.py``). ``EngineGaussian`` runs it once for a whole Gaussian round: the
template computes every row's allowance and exhaustion, then the round's updates train only the rows
with something left, in chunks, and clip each to its bound (``gaussian_round.GaussianReports``),
the charges are committed, and only then is the noise added. ``EngineSkellam`` is one client's
Skellam release, with its ``l2_allowance`` computed with the rest. The charges are the device
mechanisms' own, so states stay bitwise a device's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from fedfilter.client.mechanisms.gaussian import GaussianMechanism, clip_to_norm
from fedfilter.client.mechanisms.skellam import CLIP_SLACK, SkellamMechanism, SkellamPayload
from fedfilter.privacy.skellam import l1_cap


@dataclass(frozen=True)
class EngineGaussian(GaussianMechanism):
    """``GaussianMechanism`` for a whole round of the engine (``RoundRows``, ``GaussianReports``).

    The allowance is the main account's at the accounted std (Gaussian rounds keep no worst-case
    account); ``clip_and_snap`` hands each row's bound to the round's updates, which train the rows
    with something left, clip each to its bound and return their sum and certified norms. The
    charges are the device mechanism's own, so states stay bitwise a device's.

    Examples
    --------
    >>> import numpy as np
    >>> class Updates:
    ...     def clip(self, bound):
    ...         return np.zeros(3), np.minimum(bound, 0.5)
    >>> m = EngineGaussian("local", 1.0, 1.0, 1.0, 1.0, 2.0**-16)
    >>> m.clip_and_snap(Updates(), np.array([0.0, 2.0]))[1]
    array([0. , 0.5])
    """

    def allowance(self, account) -> np.ndarray:
        """Each row's allowance at the accounted std (``RoundRows.allowance``), at most the clip.

        Parameters
        ----------
        account : RoundRows
            The round's rows.

        Returns
        -------
        numpy.ndarray
            One allowance per row, model units.

        Examples
        --------
        >>> import numpy as np
        >>> from fedfilter.simulations.engine.accounts import RoundRows
        >>> from fedfilter.simulations.engine.core import Engine
        >>> from fedfilter.simulations.engine.config import EngineConfig
        >>> engine = Engine(EngineConfig(num_clients=4, epsilon=2.0))
        >>> m = EngineGaussian("local", 1.0, 1.0, 1.0, 1.0, 2.0**-16)
        >>> m.allowance(RoundRows(engine, np.arange(4))).round(4)
        array([0.5016, 0.5016, 0.5016, 0.5016])
        """
        return account.allowance(noise_std=self.accounted_std, clip=self.clip)

    def clip_and_snap(self, arrays, bound) -> tuple[Any, np.ndarray]:
        """``arrays.clip(bound)``: the round's updates trained, clipped, summed; their certified norms.

        Parameters
        ----------
        arrays : GaussianReports
            The round's updates (anything with ``clip(bound)``).
        bound : numpy.ndarray
            Each row's allowance, 0 where it has nothing left.

        Returns
        -------
        tuple of (numpy.ndarray, numpy.ndarray)
            The sum of the clipped updates and each row's certified norm.

        Examples
        --------
        >>> import numpy as np
        >>> class Updates:
        ...     def clip(self, bound):
        ...         return np.zeros(3), np.minimum(bound, 0.5)
        >>> m = EngineGaussian("local", 1.0, 1.0, 1.0, 1.0, 2.0**-16)
        >>> m.clip_and_snap(Updates(), [0.0, 2.0])[1]
        array([0. , 0.5])
        """
        return arrays.clip(np.asarray(bound, dtype=np.float64))


@dataclass(frozen=True)
class EngineSkellam(SkellamMechanism):
    """``SkellamMechanism`` for one client whose ``l2_allowance`` the engine computed with the rest.

    Parameters
    ----------
    l2_allow : float
        The client's integer-grid L2 allowance (``skellam.l2_allowance``).
    clipped : bool
        The engine already clipped the update to ``l2_allow * gamma * CLIP_SLACK`` (``norms !=
        "device"``; the same guarantee: certified norm at most that bound).
    charge_at_bound : bool
        ``accounting="worst-case"`` (never a device's rule): charge the worst case of any update within
        the bound, at ``L2 = l2_allow`` and ``L1 = l1_cap(l2_allow, dim)`` (what ``skellam_allowance``
        checked both accounts admit), instead of the snapped update's exact norms (``at_bound``).

    Examples
    --------
    >>> import dataclasses, numpy as np
    >>> from fedfilter.client.mechanisms.skellam import skellam_grid
    >>> from fedfilter.protocol.request import RoundSpec
    >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
    >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
    >>> m = EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)])
    >>> dataclasses.replace(m, l2_allow=100.0).allowance(None)
    0.0244140625
    """

    l2_allow: float = 0.0
    clipped: bool = False
    charge_at_bound: bool = False

    def allowance(self, account) -> float:
        """``l2_allow * gamma``: the device's allowance in model units.

        Parameters
        ----------
        account : Account
            Unused: the engine computed ``l2_allow`` with the other clients'.

        Returns
        -------
        float

        Examples
        --------
        >>> import dataclasses, numpy as np
        >>> from fedfilter.client.mechanisms.skellam import skellam_grid
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
        >>> m = EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)])
        >>> dataclasses.replace(m, l2_allow=100.0).allowance(None) == 100.0 * grid.gamma
        True
        """
        return self.l2_allow * self.grid.gamma

    def clip_and_snap(self, arrays: Sequence[np.ndarray], bound) -> tuple[SkellamPayload, float]:
        """The device's clip and snap, without the clip when the engine has already clipped.

        Parameters
        ----------
        arrays : sequence of numpy.ndarray
            The client's update.
        bound : float
            Its allowance, model units.

        Returns
        -------
        tuple of (SkellamPayload, float)
            The integer update with its exact norms, and its certified norm in model units.

        Examples
        --------
        >>> import dataclasses, numpy as np
        >>> from fedfilter.client.mechanisms.skellam import skellam_grid
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
        >>> m = dataclasses.replace(EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)]), l2_allow=100.0)
        >>> payload, norm = m.clip_and_snap([np.array([3.0, 4.0, 0.0], np.float32)], 1.0)
        >>> payload.l1, payload.l2, norm
        (5733, 4095.0, 0.999755859375)
        """
        if not self.clipped:
            arrays, _ = clip_to_norm(arrays, float(bound) * CLIP_SLACK)
        return self.at_bound(*self.snap(arrays), bound)

    def at_bound(self, payload: SkellamPayload, norm: float, bound) -> tuple[SkellamPayload, float]:
        """With ``charge_at_bound``, the payload's norms are the bound's (the worst update within
        ``l2_allow``: ``L2 = l2_allow``, ``L1 = l1_cap(l2_allow, dim)``), so every charge read from them,
        a sampled one's too, is the worst case; ``k`` is unchanged. Otherwise (and for a release clipped
        to 0) the payload as snapped.

        Parameters
        ----------
        payload : SkellamPayload
            The snapped update.
        norm : float
            Its certified norm, model units.
        bound : float
            The allowance it was clipped to (0 when exhausted).

        Returns
        -------
        tuple of (SkellamPayload, float)

        Examples
        --------
        >>> import dataclasses, numpy as np
        >>> from fedfilter.client.mechanisms.skellam import skellam_grid
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
        >>> m = dataclasses.replace(EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)]), l2_allow=100.0,
        ...                         charge_at_bound=True)
        >>> payload, norm = m.clip_and_snap([np.zeros(3, np.float32)], 1.0)
        >>> payload.l1, payload.l2, norm == 100.0 * grid.gamma
        (173.20508075688778, 100.0, True)
        """
        if not self.charge_at_bound or self.l2_allow == 0 or not float(bound) > 0:
            return payload, norm
        l2 = self.l2_allow
        return SkellamPayload(payload.k, float(l1_cap(l2, self.dim)), l2), l2 * self.grid.gamma


@dataclass(frozen=True)
class EngineSkellamRows(EngineSkellam):
    """``EngineSkellam`` for many clients spent as one account, where the charge is the bound's
    (``charge_at_bound``, worst-case accounting): rows of one budget group with one ``l2_allow`` and
    one rate, each charged the worst case within it, so one charge, committed to every row
    (``RowsAccount.commit``), is each row's own. ``clip_and_snap`` hands the bound to the rows' updates
    (``distributed_round.KeptUpdates``), which train only the rows whose update enters the sum, clip and
    snap each with the device's functions, and return the integer sum.

    Examples
    --------
    >>> import dataclasses, numpy as np
    >>> from fedfilter.client.mechanisms.skellam import skellam_grid
    >>> from fedfilter.protocol.request import RoundSpec
    >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
    >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
    >>> base = EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)])
    >>> m = EngineSkellamRows(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
    >>> class Rows:
    ...     def snapped_sum(self, bound, gamma):
    ...         return np.array([2, 0, -1])
    >>> m = dataclasses.replace(m, l2_allow=100.0, clipped=True, charge_at_bound=True)
    >>> payload, norm = m.clip_and_snap(Rows(), 100.0 * grid.gamma)
    >>> payload.k[0].tolist(), payload.l2
    ([2, 0, -1], 100.0)
    """

    def clip_and_snap(self, arrays: Any, bound) -> tuple[SkellamPayload, float]:
        """The rows' snapped sum, with the bound's norms (``at_bound``).

        Parameters
        ----------
        arrays : KeptUpdates
            The rows' updates (anything with ``snapped_sum(bound, gamma)``).
        bound : float
            The rows' allowance, model units.

        Returns
        -------
        tuple of (SkellamPayload, float)

        Raises
        ------
        ValueError
            Without ``charge_at_bound`` and ``clipped`` (each row's charge would then be its own).

        Examples
        --------
        >>> import dataclasses, numpy as np
        >>> from fedfilter.client.mechanisms.skellam import skellam_grid
        >>> from fedfilter.protocol.request import RoundSpec
        >>> spec = RoundSpec("run", 0, 1.0, 1.0, placement="distributed", min_reports=2)
        >>> grid = skellam_grid(spec, target_range=2**22, sample_num=4)
        >>> base = EngineSkellam.for_update(spec, grid, [np.zeros(3, np.float32)])
        >>> m = EngineSkellamRows(**{f.name: getattr(base, f.name) for f in dataclasses.fields(base)})
        >>> class Rows:
        ...     def snapped_sum(self, bound, gamma):
        ...         return np.array([1, 1, 0])
        >>> m.clip_and_snap(Rows(), 1.0)
        Traceback (most recent call last):
        ...
        ValueError: EngineSkellamRows charges every row the bound's worst case: it needs charge_at_bound and clipped.
        """
        if not (self.charge_at_bound and self.clipped):
            raise ValueError(
                "EngineSkellamRows charges every row the bound's worst case: it needs charge_at_bound and clipped."
            )
        total = arrays.snapped_sum(float(bound) * CLIP_SLACK, self.grid.gamma)
        return self.at_bound(SkellamPayload([total], 0, 0.0), 0.0, bound)
