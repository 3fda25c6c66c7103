"""The device's own check of SecAgg+'s range, as a yes/no: the tests of every plan that reads the limit
(``protocol.secagg.grid.largest_noise_multiplier``) ask it whether a device would take the round."""

from __future__ import annotations

from fedfilter.client.mechanisms.skellam import skellam_grid
from fedfilter.protocol.request import RoundSpec, RoundSpecError
from fedfilter.protocol.secagg.grid import quantization_range


def device_admits(noise_multiplier: float, *, asked: int, min_reports: int, clip: float = 1.0) -> bool:
    """Whether a device accepts a distributed round of ``asked`` reports at this z (``skellam_grid``)."""
    spec = RoundSpec("r", 0, noise_multiplier, clip, placement="distributed", min_reports=min_reports)
    try:
        skellam_grid(spec, target_range=quantization_range(asked), sample_num=asked)
    except RoundSpecError:
        return False
    return True
