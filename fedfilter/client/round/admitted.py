"""The one value describing an admitted round, which every later stage and the placement read."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from fedfilter.client.mechanisms.gaussian import GaussianMechanism
from fedfilter.client.mechanisms.skellam import SkellamMechanism
from fedfilter.client.settings.node_config import DeviceConfig
from fedfilter.protocol.request import RoundSpec

__all__ = ["AdmittedRound", "Mechanism", "MechanismFor"]

Mechanism = GaussianMechanism | SkellamMechanism
# The round's mechanism for the arrays it releases (a Skellam one depends on the update's norms).
MechanismFor = Callable[[Sequence[np.ndarray]], Mechanism]


@dataclass(frozen=True)
class AdmittedRound:
    """A train request the device accepted: nothing is trained or spent yet.

    Parameters
    ----------
    spec : RoundSpec
        The coordinator's request, checked against the owner's policy and the placement.
    device : DeviceConfig
        The owner's settings (``context.node_config`` only).
    hold_s : float
        The owner's ``reply-hold-s``: every reply from the ledger on waits for it.
    keys : list of str
        The model's array names, in order.
    received : list of numpy.ndarray
        The model as received (the update is ``returned - received``).
    floating : list of int
        Indices of the floating-point arrays: the only ones a local round releases.
    mechanism : callable
        The placement's mechanism for the released arrays (``Placement.admit_request``).

    Examples
    --------
    >>> import numpy as np
    >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
    >>> from fedfilter.client.settings.node_config import device_config
    >>> spec = RoundSpec("run", 1, 1.0, 1.0)
    >>> device = device_config({"ledger-dir": "/tmp/x", "client-id": "a", "budget-epsilon": 4.0,
    ...                         "budget-delta": 1e-5})
    >>> admitted = AdmittedRound(spec, device, 0.0, ["w"], [np.zeros(2, np.float32)], [0],
    ...                          lambda arrays: GaussianMechanism.for_request(spec))
    >>> admitted.mechanism(admitted.received).placement
    'local'
    """

    spec: RoundSpec
    device: DeviceConfig
    hold_s: float
    keys: list[str]
    received: list[np.ndarray] = field(repr=False)
    floating: list[int]
    mechanism: MechanismFor = field(repr=False)
