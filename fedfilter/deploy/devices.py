"""What a local trial (the demo, ``deploy-local``) enrols its simulated devices with."""

from __future__ import annotations

import math


def simulated_worst_case_epsilon(epsilon: float, min_reports: int) -> float:
    """The worst-case-epsilon the demo and deploy-local enrol a simulated device with (distributed placement).

    It is ``min_reports`` times the device's budget, rounded up to 2 decimals. A report read alone
    carries 1/m of the sum's noise variance, so its Rényi loss is about m times the sum's. Measured,
    the worst-case accounts then use 30 to 60 % of it while the main budget is spent, and the demo
    learns as before (README; ``benchmarks/worst_case_epsilon.py``, docs/results.md). A real owner
    chooses their own (``fedfilter ledger enrol --worst-case-epsilon``).

    Parameters
    ----------
    epsilon : float
        The device's budget.
    min_reports : int
        The fewest reports in a released sum.

    Returns
    -------
    float
        The worst-case-epsilon.

    Examples
    --------
    >>> simulated_worst_case_epsilon(2.345, 3)
    7.04
    """
    return math.ceil(float(epsilon) * int(min_reports) * 100) / 100
