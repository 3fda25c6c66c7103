"""Planning a federation: does the released mean carry more signal than noise, and can devices pay?

A round releases the mean of ``n`` reports. Its signal is the mean of clipped updates, of norm at
most the clip ``C``; its noise is Gaussian with the std per coordinate of the round rules
(``protocol/rules.released_mean_noise_std``: ``z C / sqrt(n)`` local, ``z C / sqrt(n m)``
distributed), whose expected norm over ``d`` coordinates is ``std * chi_mean(d)``
(``noise_norm.py``), about ``z C sqrt(d / n)`` locally. When that exceeds ``C`` the mean is mostly
noise whatever the devices learn: Flower's quickstart CNN (62,006 parameters) with 10 devices at
``z = 1`` gets noise of norm 79 against a signal of at most 1.

The remedies trade against the budget: a device pays ``1 / z`` per full-clip round (Feldman and Zrnic,
"Individual Privacy Accounting via a Rényi Filter", NeurIPS 2021, Algorithm 7: ``mu_t = ||clipped|| /
(z C)``), so a smaller ``z`` costs rounds, while more devices
per round, distributed placement (the noise is split among ``m`` reports) or fewer parameters
shrink the noise norm for free. ``plan_federation`` reports the figures and the settings that
learn: the noise norm at most ``TARGET_NOISE_TO_CLIP`` times the clip, and the rounds wanted within
the typical budget (counted by the device's own filter, ``planning/rounds.py``).
``ROUNDS_COUNTED`` caps how far the rounds a budget affords are counted.

Pure functions: no torch, no Flower, no I/O.

Examples
--------
The quickstart CNN's mean over 10 devices at z = 1 carries noise of norm about ``sqrt(62006 / 10)``:

>>> norm = mean_noise_norm(noise_multiplier=1.0, clip=1.0, placement="local", min_reports=1, devices=10, dim=62006)
>>> round(norm, 2), round(math.sqrt(62006 / 10), 2)
(78.74, 78.74)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from fedfilter.checks import positive_finite
from fedfilter.planning.rounds import (
    admits_rounds,
    check_distributed_filter,
    plan_distributed_epsilon,
    plan_epsilon,
    rounds_admitted,
)
from fedfilter.privacy.noise_norm import chi_mean, expected_noise_norm
from fedfilter.protocol.request import PLACEMENTS
from fedfilter.protocol.rules import released_mean_noise_std
from fedfilter.protocol.secagg.grid import largest_noise_multiplier

__all__ = ["TARGET_NOISE_TO_CLIP", "least_affordable_noise_multiplier", "mean_noise_norm", "plan_federation"]

# The recommended settings keep the mean's noise norm at most half the clip (the signal's bound),
# so that a round's mean can point where the devices' updates point.
TARGET_NOISE_TO_CLIP = 0.5
_MAX_Z = 1e6  # no noise multiplier above this is searched for
ROUNDS_COUNTED = 100_000  # rounds afforded are counted up to this (or the rounds wanted)


def mean_noise_norm(
    *, noise_multiplier: float, clip: float, placement: str, min_reports: int, devices: int, dim: int
) -> float:
    """The expected norm of the noise in the released mean of ``devices`` reports.

    Parameters
    ----------
    noise_multiplier : float
        ``z``.
    clip : float
        The clip norm ``C``.
    placement : {"local", "distributed"}
        Where the noise is added.
    min_reports : int
        ``m`` (distributed placement).
    devices : int
        ``n``, the reports averaged.
    dim : int
        The number of released coordinates.

    Returns
    -------
    float
        ``released_mean_noise_std(...) * chi_mean(dim)``.

    Examples
    --------
    Distributed placement with ``m = n`` divides the local noise by ``sqrt(n)``:

    >>> kw = dict(noise_multiplier=1.0, clip=1.0, devices=4, dim=2)
    >>> local = mean_noise_norm(placement="local", min_reports=1, **kw)
    >>> distributed = mean_noise_norm(placement="distributed", min_reports=4, **kw)
    >>> round(local, 12), round(2 * distributed, 12), round(0.5 * math.sqrt(math.pi / 2), 12)
    (0.626657068658, 0.626657068658, 0.626657068658)
    """
    std = released_mean_noise_std(noise_multiplier, clip, placement, min_reports, devices)
    return expected_noise_norm(std=std, dim=dim)


def _check(s: dict[str, Any]) -> None:
    """Every bad setting at once, each by name and value."""
    problems = []
    for name in ("devices", "dim", "min_reports", "rounds"):
        v = s[name]
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            problems.append(f"{name} must be an integer >= 1. Found {v!r}.")
    for name in ("noise_multiplier", "clip", "epsilon"):
        if (problem := positive_finite(name, s[name])) is not None:
            problems.append(problem)
    d = s["delta"]
    if isinstance(d, bool) or not (isinstance(d, (int, float)) and 0 < d < 1):
        problems.append(f"delta must be a number in (0, 1). Found {d!r}.")
    if s["placement"] not in PLACEMENTS:
        problems.append(f"placement must be one of {PLACEMENTS}. Found {s['placement']!r}.")
    elif s["placement"] == "distributed":
        try:
            check_distributed_filter(s["filter"])
        except ValueError as err:
            problems.append(str(err))
        if not problems and s["min_reports"] > s["devices"]:
            problems.append(
                f"min_reports={s['min_reports']} exceeds devices={s['devices']}: "
                "no distributed round would be released."
            )
    if problems:
        raise ValueError(" ".join(problems))


def _noise(s: dict[str, Any], **changes: Any) -> float:
    """The mean's expected noise norm; with self-sampling devices the coordinator divides the sum by
    ``devices * expected_rate`` (the contributions expected), not by ``devices``."""
    t = {**s, **changes}
    return expected_noise_norm(std=_mean_std(t), dim=t["dim"])


def _mean_std(s: dict[str, Any]) -> float:
    """The released mean's noise std per coordinate (``protocol.rules``), over ``expected_rate``."""
    std = released_mean_noise_std(s["noise_multiplier"], s["clip"], s["placement"], s["min_reports"], s["devices"])
    return std / s.get("expected_rate", 1.0)


def _admits(s: dict[str, Any], z: float) -> bool:
    return admits_rounds(
        s["filter"],
        epsilon=s["epsilon"],
        delta=s["delta"],
        noise_multiplier=z,
        rounds=s["rounds"],
        placement=s["placement"],
        clip=s["clip"],
        min_reports=s["min_reports"],
        dim=s["dim"],
    )


def _least_affordable_z(s: dict[str, Any]) -> float | None:
    """The smallest noise multiplier (to 1e-9 relative, rounded up) whose rounds the budget admits."""
    hi = 1.0
    while not _admits(s, hi):
        hi *= 2.0
        if hi > _MAX_Z:
            return None
    lo = 0.0
    for _ in range(60):  # hi always admits
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if _admits(s, mid) else (mid, hi)
        if hi - lo <= 1e-9 * hi:
            break
    return hi


def least_affordable_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    rounds: int,
    placement: str = "local",
    filter: str | None = None,
    clip: float = 1.0,
    min_reports: int = 1,
    dim: int = 1,
) -> float | None:
    """The smallest noise multiplier (to 1e-9 relative, from above) whose ``rounds`` full-clip rounds
    a fresh device's own filter admits (``planning/rounds.admits_rounds``); ``None`` above ``1e6``.

    Parameters
    ----------
    epsilon, delta : float
        The device's budget.
    rounds : int
        The full-clip rounds (asks) to pay for.
    placement : {"local", "distributed"}, optional
        Where the noise is added.
    filter : str, optional
        The filter kind (default gdp, rdp for distributed placement).
    clip, min_reports, dim : float, int, int, optional
        Distributed placement: the clip norm, ``m`` and the released coordinates.

    Examples
    --------
    The gdp filter admits ``k`` rounds while ``k / z^2 <= mu^2``, so ``z = sqrt(k) / mu``:

    >>> from fedfilter.privacy.gaussian_dp import mu_for_budget
    >>> z = least_affordable_noise_multiplier(epsilon=4.0, delta=1e-5, rounds=85)
    >>> round(z, 6), round(math.sqrt(85) / mu_for_budget(4.0, 1e-5), 6)
    (9.96782, 9.96782)
    """
    kind = filter if filter is not None else ("rdp" if placement == "distributed" else "gdp")
    s = dict(
        filter=kind,
        epsilon=epsilon,
        delta=delta,
        rounds=rounds,
        placement=placement,
        clip=clip,
        min_reports=min_reports,
        dim=dim,
    )
    return _least_affordable_z(s)


def _rounds_afforded(s: dict[str, Any], z: float) -> int:
    """Full-clip rounds a fresh device's filter admits, counted up to ``ROUNDS_COUNTED``."""
    return rounds_admitted(
        s["filter"],
        epsilon=s["epsilon"],
        delta=s["delta"],
        noise_multiplier=z,
        limit=max(ROUNDS_COUNTED, s["rounds"]),
        placement=s["placement"],
        clip=s["clip"],
        min_reports=s["min_reports"],
        dim=s["dim"],
    )


def _epsilon_needed(s: dict[str, Any], z: float) -> float:
    if s["placement"] == "distributed":
        return plan_distributed_epsilon(
            rounds=s["rounds"],
            delta=s["delta"],
            noise_multiplier=z,
            clip=s["clip"],
            min_reports=s["min_reports"],
            dim=s["dim"],
            kind=s["filter"],
        )["epsilon"]
    return plan_epsilon(s["filter"], noise_multiplier=z, rounds=s["rounds"], delta=s["delta"])["epsilon"]


def _devices_needed(s: dict[str, Any], z: float, placement: str, target: float) -> int:
    """The fewest devices per round (all reporting; ``min_reports = devices`` when distributed)
    whose mean carries noise of norm at most ``target * clip`` at multiplier ``z``."""
    # local: n >= scale^2; distributed (m = n): n >= scale (the mean divided by n * expected_rate, _noise)
    scale = z * chi_mean(s["dim"]) / (target * s.get("expected_rate", 1.0))
    n = max(1, math.ceil(scale**2 if placement == "local" else scale))
    changes = lambda n: dict(devices=n, placement=placement, noise_multiplier=z, min_reports=n)  # noqa: E731
    # The closed form is exact up to rounding: a few steps settle it (never an open-ended search).
    for _ in range(100):
        if n > 1 and _noise(s, **changes(n - 1)) <= target * s["clip"]:
            n -= 1
        elif _noise(s, **changes(n)) > target * s["clip"]:
            n += 1
        else:
            return n
    raise RuntimeError(f"internal error: the devices needed did not settle near {n} for {s}.")


def _dim_allowed(s: dict[str, Any], target: float) -> int:
    """The most coordinates whose mean noise stays at most ``target * clip`` (0 if not even one)."""
    if _noise(s, dim=1) > target * s["clip"]:
        return 0
    lo, hi = 1, 2
    while _noise(s, dim=hi) <= target * s["clip"]:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _noise(s, dim=mid) <= target * s["clip"] else (lo, mid)
    return lo


def _round_down(x: float, digits: int = 2) -> float:
    """``x`` cut to ``digits`` significant digits, never above ``x``."""
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return float(f"{math.floor(x / scale) * scale:.{digits}g}")  # callers check the result still holds


def _round_up(x: float, digits: int = 2) -> float:
    scale = 10 ** (math.floor(math.log10(x)) - digits + 1)
    return float(f"{math.ceil(x / scale) * scale:.{digits}g}")  # callers check the result still holds


def _secagg_limit(s: dict[str, Any]) -> float | None:
    """Distributed placement: the largest z SecAgg+'s range carries over this many reports (every device
    refuses a round above it, ``protocol.secagg.grid.largest_noise_multiplier``); None for local plans."""
    if s["placement"] != "distributed":
        return None
    return largest_noise_multiplier(s["devices"], s["min_reports"], s["clip"])


def _figures(s: dict[str, Any]) -> dict[str, Any]:
    z = s["noise_multiplier"]
    std = _mean_std(s)
    norm = expected_noise_norm(std=std, dim=s["dim"])
    afforded = _rounds_afforded(s, z)
    limit = _secagg_limit(s)
    return {
        "secagg_noise_limit": limit,
        "fits_secagg_range": limit is None or z <= limit,
        "mean_noise_std": std,
        "mean_noise_norm": norm,
        "noise_to_clip": norm / s["clip"],
        "noise_dominates": norm > s["clip"],
        "rounds_afforded": afforded,
        "fits_budget": afforded >= s["rounds"],
        "epsilon_needed": _epsilon_needed(s, z),
    }


def _checked(s: dict[str, Any], *, need_budget: bool = True) -> dict[str, Any]:
    """Settings with their figures; never a plan whose mean is mostly noise (or over budget)."""
    out = {**s, **_figures(s)}
    if out["noise_dominates"] or (need_budget and not out["fits_budget"]):
        raise RuntimeError(f"internal error: recommended settings that do not learn within budget: {out}")
    return out


def _recommend(s: dict[str, Any], z_budget: float | None, z_learn: float, target: float) -> tuple[dict, str]:
    if z_budget is None:
        return {}, f"no noise multiplier up to {_MAX_Z:g} fits {s['rounds']} rounds in the budget: plan fewer rounds"
    if z_learn >= z_budget:
        z_nice = _round_down(z_learn)
        rec = {**s, "noise_multiplier": z_nice if z_nice >= z_budget else z_learn}
        return _checked(rec), (
            "these devices, with a noise multiplier the budget pays for and the mean's noise at most half the clip"
        )
    rec = dict(s)
    for _ in range(4):  # distributed: the budget's multiplier depends (a little) on min-reports
        z_rec = _round_up(z_budget)
        rec["noise_multiplier"] = z_rec
        rec["devices"] = _devices_needed(rec, z_rec, s["placement"], target)
        if s["placement"] != "distributed":
            break
        rec["min_reports"] = rec["devices"]
        z_next = _least_affordable_z(rec)
        if z_next is None or z_next <= z_rec:
            break
        z_budget = z_next
    return _checked(rec), (
        f"the budget pays for noise multiplier {rec['noise_multiplier']:g} at least; at {s['devices']} devices per "
        f"round that noise swamps the mean, {rec['devices']:,} devices keep it at most half the clip"
    )


def plan_federation(
    *,
    devices: int,
    dim: int,
    noise_multiplier: float,
    clip: float,
    epsilon: float,
    delta: float,
    rounds: int,
    placement: str = "local",
    min_reports: int = 1,
    filter: str | None = None,
    sampling: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The federation's figures, a verdict, what to change, and recommended settings that learn.

    ``devices`` report each round (all of them: dropouts only raise the noise of the mean); ``dim``
    is the number of floating-point coordinates the devices release; ``epsilon``, ``delta`` and
    ``filter`` (default gdp, rdp for distributed placement) are a typical device's budget.

    Parameters
    ----------
    devices : int
        Reports per round, >= 1.
    dim : int
        Released floating-point coordinates, >= 1.
    noise_multiplier : float
        ``z``, finite and > 0.
    clip : float
        The clip norm ``C``, finite and > 0.
    epsilon : float
        A typical device's budget epsilon.
    delta : float
        Its delta, in (0, 1).
    rounds : int
        The rounds wanted, >= 1.
    placement : {"local", "distributed"}, optional
        Where the noise is added.
    min_reports : int, optional
        ``m`` (distributed placement; at most ``devices``).
    filter : str, optional
        The devices' filter kind (default gdp, rdp for distributed placement).
    sampling : mapping, optional
        Devices that sample themselves: the plan's ``"sampling"`` part
        (``planning.self_sampling.sampling_section``). Every asked device adds its noise, and the
        coordinator divides the sum by the contributions expected, ``devices * expected_rate``: the
        figures' noise is that mean's. Each budget pays for the planned asks (``rounds``) at the rate its
        rule gives, so the verdict asks whether every budget buys a rate above 0 and ends spent, not
        whether full-clip rounds fit (``rounds_afforded`` still counts those). What to change holds the
        rates fixed; the settings that learn (``recommended``, ``at_these_devices``, ``distributed``)
        stay those of devices that contribute at every ask.

    Returns
    -------
    dict
        The settings (with ``expected_rate``, 1 without sampling, and ``expected_contributions``); the
        figures (``mean_noise_std``, ``mean_noise_norm``, ``noise_to_clip``,
        ``noise_dominates``, ``rounds_afforded``, ``fits_budget``, ``epsilon_needed``, and for distributed
        placement ``secagg_noise_limit`` and ``fits_secagg_range``: above that limit the sum's noise
        overflows SecAgg+'s range and every device refuses the round); the noise
        multipliers the budget affords and that learn; ``changes`` (sentences); ``recommended`` and
        ``recommended_why``; ``at_these_devices`` and, for local plans, ``distributed``; ``verdict``.

    Raises
    ------
    ValueError
        Naming every bad setting at once.

    Examples
    --------
    >>> plan = plan_federation(
    ...     devices=100, dim=10, noise_multiplier=10.0, clip=1.0, epsilon=4.0, delta=1e-5, rounds=50
    ... )
    >>> plan["noise_dominates"], plan["rounds_afforded"], plan["recommended"]["devices"]
    (True, 85, 2257)
    >>> plan["recommended"]["mean_noise_norm"] <= TARGET_NOISE_TO_CLIP * plan["recommended"]["clip"]
    True
    """
    kind = filter if filter is not None else ("rdp" if placement == "distributed" else "gdp")
    s: dict[str, Any] = dict(
        devices=devices,
        dim=dim,
        noise_multiplier=noise_multiplier,
        clip=clip,
        epsilon=epsilon,
        delta=delta,
        rounds=rounds,
        placement=placement,
        min_reports=min_reports,
        filter=kind,
    )
    _check(s)
    s["expected_rate"] = _expected_rate(sampling)
    out: dict[str, Any] = {**s, **_figures(s), "expected_contributions": s["devices"] * s["expected_rate"]}
    if sampling is not None:  # each budget's rule buys its rate over the planned asks, whatever z is
        out["fits_budget"] = all(rate > 0 for rate in sampling["rates"])
    every_ask = {**s, "expected_rate": 1.0}  # the settings that learn: devices that contribute at every ask
    target = TARGET_NOISE_TO_CLIP
    z_budget = _least_affordable_z(s)
    z_learn = target * s["clip"] / _noise(every_ask, noise_multiplier=1.0)  # the noise norm is linear in z
    out["least_affordable_noise_multiplier"] = z_budget
    out["largest_learning_noise_multiplier"] = z_learn

    changes = []
    z = s["noise_multiplier"]
    rates = " and these rates" if sampling is not None else ""
    if out["noise_dominates"]:
        changes.append(
            f"more devices per round: {_devices_needed(s, z, s['placement'], 1.0):,} at noise multiplier {z:g}"
            f"{rates} ({s['placement']} placement) bring the noise norm down to the clip"
            + (" (a larger population, so that each device is asked as often)" if sampling is not None else "")
        )
        if s["placement"] == "local":
            dist_norm = _noise(s, placement="distributed", min_reports=s["devices"])
            changes.append(
                f"distributed placement (SecAgg+, min-reports {s['devices']}): noise norm {dist_norm:.4g} at these "
                f"devices{rates}; {_devices_needed(s, z, 'distributed', 1.0):,} devices per round bring it to the "
                "clip"
            )
        if sampling is None:  # with sampling a smaller z also lowers every rate: the plan weighs the two
            changes.append(f"a smaller noise multiplier: at most {z_learn / target:.3g} (each device then pays more)")
        d_max = _dim_allowed(s, 1.0)
        changes.append(
            f"fewer parameters: at most {d_max:,} released coordinates at these settings"
            if d_max
            else "fewer parameters cannot help at these settings"
        )
        changes.append(
            "a larger clip with a smaller multiplier (the same noise std z*C) lets more of each update "
            "through; a device pays only ||update|| / (z C) per round"
        )
    if not out["fits_budget"]:
        changes.append(
            f"fewer rounds: a typical device affords {out['rounds_afforded']} full-clip rounds "
            f"(epsilon {out['epsilon_needed']:.4g} buys {s['rounds']})"
            if sampling is None
            else f"fewer planned asks, or a larger noise multiplier: {_unpaid(sampling)} buys no contribution over "
            f"the {s['rounds']} planned asks at noise multiplier {z:g}"
        )

    # Recommended: the federation as given if the budget pays for a mean that learns; else the
    # devices per round that make the budget's multiplier learn.
    if sampling is None and out["mean_noise_norm"] <= target * s["clip"] and out["fits_budget"]:
        rec, why = _checked(dict(s)), "the settings given"
    else:
        rec, why = _recommend(every_ask, z_budget, z_learn, target)
    if not rec.get("fits_secagg_range", True):
        why += (
            f"; but every device refuses it: SecAgg+'s range carries noise multiplier at most "
            f"{_round_down(rec['secagg_noise_limit'], 3):g} over {rec['devices']:,} reports (fewer devices a "
            "round, with devices that sample themselves, fit: fedfilter plan --sampling)"
        )
    out["recommended"] = rec
    out["recommended_why"] = why
    # Two more ways out, each checked like the recommendation: the devices given, at the multiplier
    # that learns (and the budget that needs); distributed placement, when the plan is local.
    z_nice = _round_down(z_learn)
    out["at_these_devices"] = _checked({**every_ask, "noise_multiplier": z_nice}, need_budget=False)
    if s["placement"] == "local" and s["devices"] >= 2:
        d = {**every_ask, "placement": "distributed", "filter": "rdp", "min_reports": s["devices"]}
        out["distributed"] = _recommend(
            d, _least_affordable_z(d), target * s["clip"] / _noise(d, noise_multiplier=1.0), target
        )[0]
    if not out["fits_secagg_range"]:
        changes.insert(
            0,
            f"a noise multiplier of at most {_round_down(out['secagg_noise_limit'], 3):g}, or fewer devices a "
            f"round: SecAgg+'s 32-bit modulus must carry the sum of {s['devices']:,} reports' noise, and every "
            "device refuses a round whose noise would overflow it",
        )
    out["changes"] = changes
    if not out["fits_secagg_range"]:
        out["verdict"] = (
            f"releases nothing: every device refuses noise multiplier {z:g} over {s['devices']:,} reports, "
            f"which overflows SecAgg+'s range (at most {_round_down(out['secagg_noise_limit'], 3):g} fits)"
        )
    elif out["noise_dominates"]:
        over = (
            f" (the noise of {s['devices']:,} devices over the {out['expected_contributions']:.4g} contributions "
            "expected)"
            if sampling is not None
            else ""
        )
        out["verdict"] = (
            f"the released mean is mostly noise: its noise norm {out['mean_noise_norm']:.4g}{over} is "
            f"{out['noise_to_clip']:.3g} times the clip {s['clip']:g}, the most the devices' signal can be"
        )
    elif not out["fits_budget"]:
        out["verdict"] = (
            f"the mean can learn (noise norm {out['mean_noise_norm']:.4g} against clip {s['clip']:g}), but a "
            + (
                f"typical device affords only {out['rounds_afforded']} of the {s['rounds']} rounds at full clip"
                if sampling is None
                else f"budget of {_unpaid(sampling)} buys no contribution over the {s['rounds']} planned asks"
            )
        )
    elif sampling is not None:
        unspent = (
            ""
            if sampling["spends_every_budget"]
            else f"; at noise multiplier {z:g}, above {sampling['spending_limit']:.4g}, the largest budgets end with "
            "budget unspent"
        )
        out["verdict"] = (
            f"learns: noise norm {out['mean_noise_norm']:.4g} against clip {s['clip']:g} over the "
            f"{out['expected_contributions']:.4g} contributions expected a round, and each budget pays for the "
            f"{s['rounds']} planned asks at its own rate{unspent}"
        )
    else:
        out["verdict"] = (
            f"learns: noise norm {out['mean_noise_norm']:.4g} against clip {s['clip']:g}, and a typical device "
            f"affords {out['rounds_afforded']} full-clip rounds (>= {s['rounds']} wanted)"
        )
    return out


def _expected_rate(sampling: Mapping[str, Any] | None) -> float:
    """The mean rate the coordinator divides by (1 without sampling), checked like any plan field."""
    if sampling is None:
        return 1.0
    q = sampling.get("expected_rate")
    if isinstance(q, bool) or not isinstance(q, (int, float)) or not 0 < q <= 1:
        raise ValueError(f"sampling expected_rate must be a number in (0, 1]. Found {q!r}.")
    return float(q)


def _unpaid(sampling: Mapping[str, Any]) -> str:
    """The budgets whose rule gives rate 0 (they buy no contribution), as "epsilon 0.1, epsilon 0.2"."""
    return ", ".join(f"epsilon {e:g}" for e, q in zip(sampling["budgets"], sampling["rates"]) if not q > 0)
