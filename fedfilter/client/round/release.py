"""Release: the placement's arrays (with adaptive clipping, the clip bit appended: ``clip_bit.py``)
through ``client/release.py`` (clip to the allowance, spend durably, and only then noise), with the
placement's mechanism."""

from __future__ import annotations

import logging

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian import NonFiniteUpdateError
from fedfilter.client.release import Release, noise_stream, release
from fedfilter.client.round.admitted import AdmittedRound
from fedfilter.client.round.clip_bit import with_clip_bit
from fedfilter.client.round.placement import Placement

__all__ = ["release_update"]

log = logging.getLogger("fedfilter.client")


def release_update(
    ledger: BudgetLedger, admitted: AdmittedRound, placement: Placement, update: list[np.ndarray]
) -> Release:
    """Spend one round of ``ledger`` on ``update`` and noise it; an update holding NaN or inf goes as zero.

    Parameters
    ----------
    ledger : BudgetLedger
        The device's ledger, held for this round.
    admitted : AdmittedRound
        The round (request, owner's policy, mechanism).
    placement : Placement
        Which arrays are released.
    update : list of numpy.ndarray
        ``returned - received`` (``train.train``).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.client.mechanisms.gaussian import GaussianMechanism
    >>> from fedfilter.client.round.placement import LocalPlacement
    >>> from fedfilter.client.settings.node_config import device_config, enrol_device
    >>> from fedfilter.protocol.request import RoundSpec
    >>> settings = {"ledger-dir": tempfile.mkdtemp(), "client-id": "a", "budget-epsilon": 4.0, "budget-delta": 1e-5}
    >>> _ = enrol_device(settings)
    >>> spec = RoundSpec("run", 1, 1.0, 1.0)
    >>> admitted = AdmittedRound(spec, device_config(settings), 0.0, ["w"], [np.zeros(3, np.float32)], [0],
    ...                          lambda arrays: GaussianMechanism.for_request(spec))
    >>> ledger = BudgetLedger.open(settings["ledger-dir"])
    >>> release_update(ledger, admitted, LocalPlacement(), [np.full(3, 0.1, np.float32)]).status
    'contributed'
    >>> ledger.close()
    """
    spec, device = admitted.spec, admitted.device
    policy = device.policy  # the request was checked once, at admission
    released = placement.released(admitted, update)

    def spend_and_noise(arrays: list[np.ndarray]) -> Release:
        return release(
            ledger,
            admitted.mechanism(arrays),
            arrays,
            run_id=spec.run_id,
            round_id=int(spec.round_id),
            exhausted_below=policy.exhausted_below,
            after_exhaustion=policy.after_exhaustion,
            stream=noise_stream(device.noise_seed, spec),
        )

    try:
        return spend_and_noise(with_clip_bit(released, spec))
    except NonFiniteUpdateError:
        log.error("fedfilter mod: the update holds NaN or inf; releasing a zero update instead")
        return spend_and_noise(with_clip_bit([np.zeros_like(a) for a in released], spec))
