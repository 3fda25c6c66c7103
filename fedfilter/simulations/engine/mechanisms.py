"""The device's mechanisms with the steps the engine has already done for many clients at once.

The engine runs the device's spend template (``fedfilter.client.mechanisms.spend.spend``) on
``RowsAccount``s. It must know who trains before the template runs (an exhausted client does not
train), and it trains, certifies and clips whole chunks of clients at once; so its mechanisms hand the
template what it computed with the very same functions: the allowance (``EngineGaussian``: every
row of a budget group; ``EngineSkellam``: one client's ``l2_allowance``), and the certified norms of
the clipped updates. The charges are the device mechanisms' own, so states stay bitwise a device's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.client.mechanisms.gaussian import GaussianMechanism, clip_to_norm
from fedfilter.client.mechanisms.skellam import CLIP_SLACK, SkellamMechanism, SkellamPayload
from fedfilter.privacy.skellam import l1_cap


@dataclass(frozen=True)
class EngineGaussian(GaussianMechanism):
    """``GaussianMechanism`` for rows already trained and clipped by the engine.

    Parameters
    ----------
    allow : numpy.ndarray
        Each row's allowance (``RowsAccount.allowance`` at the accounted std, computed before training).
    norms : numpy.ndarray
        Each row's certified clipped norm (0 for exhausted rows: they clip to 0).

    Examples
    --------
    >>> import numpy as np
    >>> m = EngineGaussian("local", 1.0, 1.0, 1.0, 1.0, 2.0**-16, allow=np.ones(2), norms=np.zeros(2))
    >>> m.clip_and_snap(None, np.ones(2))[1]
    array([0., 0.])
    """

    allow: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    norms: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)

    def allowance(self, account) -> np.ndarray:
        """The allowance the engine computed to choose who trains (the same ``round_allowance``)."""
        return self.allow

    def clip_and_snap(self, arrays, bound) -> tuple[None, np.ndarray]:
        """The norms the engine's training certified (clipped to the same bound; the noise is the engine's)."""
        return None, self.norms


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
        the bound, ``skellam_charge`` at ``L2 = l2_allow`` and ``L1 = l1_cap(l2_allow, dim)`` (what
        ``skellam_allowance`` checked both accounts admit), instead of the snapped update's exact norms.

    Examples
    --------
    >>> from fedfilter.protocol.request import RoundSpec  # doctest: +SKIP
    >>> m = EngineSkellam.for_update(spec, grid, arrays)  # doctest: +SKIP
    """

    l2_allow: float = 0.0
    clipped: bool = False
    charge_at_bound: bool = False

    def allowance(self, account) -> float:
        """``l2_allow * gamma``: the device's allowance in model units."""
        return self.l2_allow * self.grid.gamma

    def clip_and_snap(self, arrays: Sequence[np.ndarray], bound) -> tuple[SkellamPayload, float]:
        """The device's clip and snap, without the clip when the engine has already clipped."""
        if not self.clipped:
            arrays, _ = clip_to_norm(arrays, float(bound) * CLIP_SLACK)
        return self.snap(arrays)

    def charges(self, account, payload: SkellamPayload, sensitivity: float) -> tuple[np.ndarray, np.ndarray]:
        """The device's charges, or with ``charge_at_bound`` those of the worst update within ``l2_allow``."""
        if not self.charge_at_bound or self.l2_allow == 0:  # an exhausted release costs nothing either way
            return super().charges(account, payload, sensitivity)
        l2 = self.l2_allow
        worst = SkellamPayload(payload.k, float(l1_cap(l2, self.dim)), l2)
        return super().charges(account, worst, l2 * self.grid.gamma)
