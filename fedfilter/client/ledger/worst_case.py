"""The worst-case account: what a device's report costs against a coordinator that breaks SecAgg+.

Why. In distributed placement a device adds only its share ``Sk(mu_share)``,
``mu_share = mu_total / m``, and its main account charges the noise of the released SUM. A
coordinator that forges the other SecAgg+ peers (Sybils) passes every device check and reads one
report exactly: against it the release is ``k + Sk(mu_share)``, and an epsilon-8 budget is about
epsilon 51 at m = 10, 483 at m = 100. No device can tell forged peers from real ones without an
identity the coordinator does not control.

So every device also keeps a second account, under a second budget the owner sets,
``worst-case-epsilon`` (at the enrolment's delta and filter kind, at the order its own budget picks:
``worst_case_filter``), charged
what its report ALONE costs at the noise this device itself adds:

* ``local`` placement: the report is the release; the worst-case charge is the main one's at the
  worst-case filter's order (a device that samples itself charges the subsampled curve there).
* ``distributed`` with Skellam noise (``mechanisms.skellam.SkellamMechanism``): Agarwal-Kairouz-Liu's
  bound (``privacy/skellam.skellam_charge``) at the update's exact integer L1 and L2 norms and the
  device's own share ``mu_share`` (not ``mu_total``), at the worst-case filter's order alpha*.
* ``distributed`` with Gaussian shares (``release.FilteredClient`` called directly): the Gaussian
  charge at the share's std.

The device contributes while BOTH accounts admit the round (the allowance is the smaller of the
two); both charges are recorded in one ledger transaction before any noise. The guarantees it holds
are then: (eps_i, delta) against a coordinator that controls no more devices than the owner's
``secagg-colluders`` (docs/secure-aggregation.md: no graph failure term enters delta); (eps_worst,
delta) against any coordinator (``guarantee_lines``). There is no default: a device without a
worst-case budget refuses distributed rounds (``require_worst_case``).

The quotas (per run, per coordinator, per day) cap both accounts, each at the same fraction of its own
budget, the worst-case one over the worst-case charges of the same spends (``ledger.quota``).

Past spends (``past_worst_charge``). An owner may add the worst-case budget to a ledger that already
has spends (``fedfilter ledger worst-case``). Their worst-case charges are recomputed from what each
row records, conservatively: a local spend is charged the unsampled Gaussian at its recorded norm and std (its
main charge when it did not sample itself; a row does not record its rate, and a subsampled release
costs at most the full one at any order, while the main charge is in the units of the main filter's
order, which a self-sampling device's worst-case account does not share); a distributed spend without
data costs 0; a distributed spend with data under the rdp filter is charged the Skellam bound at
``l2 = sensitivity / gamma`` (rounded up), the largest L1 any integer vector of that L2 can have
(``||k||_1 <= ||k||_2^2``, no dimension needed) and ``mu = (noise_std / gamma)^2`` rounded down, which
is at least the Gaussian charge of the same numbers (its first term IS that charge), so it also
covers a Gaussian share; under gdp and zcdp (Gaussian shares only) the Gaussian charge at the
recorded share's std.
"""

from __future__ import annotations

import numpy as np

from fedfilter.checks import positive_finite
from fedfilter.privacy.filters import GaussianFilter, make_filter
from fedfilter.privacy.rounding import down, up
from fedfilter.privacy.skellam import skellam_charge
from fedfilter.protocol.secagg.grid import grid_step

SETTING = "worst-case-epsilon"
# What the error and the printed guarantee call the two accounts (README, `fedfilter ledger show`).
TRUSTS_SECAGG = (
    "against a coordinator that may lie about SecAgg+ rounds (population, graph, drop-outs) but controls "
    "no more of a round's devices than this device's secagg-colluders allows (default none)"
)
TRUSTS_NOTHING = "against any coordinator"


class WorstCaseMissingError(ValueError):
    """A distributed round on a device without a worst-case budget; nothing was trained or spent.

    Examples
    --------
    >>> require_worst_case(None)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    fedfilter.client.ledger.worst_case.WorstCaseMissingError: round request refused: ...
    """


def check_worst_case_epsilon(worst_case_epsilon, epsilon) -> float:
    """The owner's worst-case budget, checked: finite, > 0, and at least the main ``epsilon`` (the
    account against any coordinator can never promise more than the one that trusts SecAgg+).

    Parameters
    ----------
    worst_case_epsilon : float
        The owner's worst-case budget.
    epsilon : float
        The main budget.

    Returns
    -------
    float

    Examples
    --------
    >>> check_worst_case_epsilon(8, 4.0)
    8.0
    >>> check_worst_case_epsilon(2.0, 4.0)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: worst-case-epsilon=2.0 is below the budget epsilon=4.0: ...
    """
    if (problem := positive_finite(SETTING, worst_case_epsilon)) is not None:
        raise ValueError(problem)
    if worst_case_epsilon < epsilon:
        raise ValueError(
            f"{SETTING}={worst_case_epsilon!r} is below the budget epsilon={epsilon!r}: the account against any "
            "coordinator covers every release the main one does, so it must be at least as large."
        )
    return float(worst_case_epsilon)


def worst_case_filter(main: GaussianFilter, worst_case_epsilon: float) -> GaussianFilter:
    """The worst-case account's filter: the main filter's kind and delta at ``worst_case_epsilon``, at the
    default orders (for rdp: the best for its own budget).

    Not at the main filter's orders: a device that samples itself holds its main filter at one order
    fixed for its rate (``rdp-order``), often 10 or more, where a budget as large as a worst-case one
    (``min-reports`` times the main budget, say) buys almost nothing; the worst-case account reads
    one report alone, whose noise is small, so sampling gains it little and its own order serves it
    best. The two accounts are separate filters, each valid at its own order.

    Parameters
    ----------
    main : GaussianFilter
        The lifetime filter.
    worst_case_epsilon : float
        The worst-case budget.

    Returns
    -------
    GaussianFilter

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> worst_case_filter(make_filter("gdp", 4.0, 1e-5), 8.0)
    GaussianFilter(kind='gdp', epsilon=8.0, delta=1e-05, orders=())
    """
    return make_filter(main.kind, float(worst_case_epsilon), main.delta)


def require_worst_case(worst: GaussianFilter | None) -> GaussianFilter:
    """The one check every distributed path calls before training or spending.

    Parameters
    ----------
    worst : GaussianFilter or None
        The worst-case account's filter.

    Returns
    -------
    GaussianFilter
        ``worst``; ``WorstCaseMissingError`` when it is None.

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> require_worst_case(make_filter("gdp", 8.0, 1e-5)).epsilon
    8.0
    """
    if worst is None:
        raise WorstCaseMissingError(
            f"round request refused: distributed placement needs this device's owner to set {SETTING} "
            "(`fedfilter ledger worst-case --dir DIR --epsilon E`, or at enrolment): in distributed placement a "
            "report carries only 1/min_reports of the accounted noise, and a coordinator that forges the other "
            f"SecAgg+ peers reads it alone; {SETTING} is the budget the device keeps against that coordinator."
        )
    return worst


def past_worst_charge(
    worst: GaussianFilter, *, placement: str, sensitivity: float, noise_std: float, clip: float
) -> np.ndarray:
    """A conservative worst-case charge for a spend recorded before the account existed (module doc).

    Parameters
    ----------
    worst : GaussianFilter
        The worst-case account's filter.
    placement : str
        The spend's placement.
    sensitivity, noise_std, clip : float
        As the spend records them.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> from fedfilter.privacy.filters import make_filter
    >>> worst = make_filter("gdp", 8.0, 1e-5)
    >>> past_worst_charge(worst, placement="local", sensitivity=1.0, noise_std=2.0, clip=2.0)
    array([0.25])
    >>> past_worst_charge(worst, placement="distributed", sensitivity=1.0, noise_std=1.0, clip=2.0)
    array([1.])

    A self-sampling spend's main charge (here at rate 0.01, order 10.6) is far below what the same release
    costs at the worst-case account's order; the unsampled Gaussian bounds it at every order:

    >>> from fedfilter.privacy.subsampled import sampled_gaussian_charge
    >>> main, worst = make_filter("rdp", 1.0, 1e-5, [10.6]), make_filter("rdp", 1.0, 1e-5, [18.0])
    >>> sampled = float(sampled_gaussian_charge(main, rate=0.01, sensitivity=1.0, noise_std=1.1)[0])
    >>> past = past_worst_charge(worst, placement="local", sensitivity=1.0, noise_std=1.1, clip=1.0)
    >>> at_worst_order = sampled_gaussian_charge(worst, rate=0.01, sensitivity=1.0, noise_std=1.1)
    >>> bool(past[0] >= at_worst_order[0] > sampled)
    True
    """
    if not sensitivity > 0:
        return np.zeros(worst.dim)
    gaussian = np.asarray(worst.charge(sensitivity=sensitivity, noise_std=noise_std), dtype=np.float64)
    if placement == "local" or worst.kind != "rdp":
        return gaussian.reshape(worst.dim)
    gamma = grid_step(clip)
    l2 = float(up(sensitivity / gamma))
    l1 = max(l2, float(up(l2 * l2)))
    ratio = noise_std / gamma
    mu = float(down(ratio * ratio))
    skellam = np.asarray(skellam_charge(worst, l1, l2, mu), dtype=np.float64)
    return np.maximum(skellam, gaussian).reshape(worst.dim)


def guarantee_lines(epsilon: float, worst_case_epsilon: float | None, delta: float) -> list[str]:
    """The two guarantees a device holds, as the demo, deploy-local and `ledger show` print them.

    Parameters
    ----------
    epsilon : float
        The main budget.
    worst_case_epsilon : float or None
        The worst-case budget (None: local rounds only).
    delta : float
        The enrolment's delta.

    Returns
    -------
    list of str

    Examples
    --------
    >>> guarantee_lines(4.0, 8.0, 1e-5)[1]
    '(eps_worst=8, delta=1e-05) against any coordinator'
    """
    if worst_case_epsilon is None:  # local rounds only: each report is private on its own
        return [f"(eps_i={epsilon:g}, delta={delta:g}) {TRUSTS_NOTHING} (local rounds only: no {SETTING} set)"]
    return [
        f"(eps_i={epsilon:g}, delta={delta:g}) {TRUSTS_SECAGG}",
        f"(eps_worst={worst_case_epsilon:g}, delta={delta:g}) {TRUSTS_NOTHING}",
    ]
