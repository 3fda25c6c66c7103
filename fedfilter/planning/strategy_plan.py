"""The plan ``IndividualFilterStrategy.from_plan`` takes whole, chosen from public facts only.

From the devices asked per round ``k``, the population ``N`` (when known), the rounds ``R``, the
devices' budgets (the smallest is planned for), the model's size, the placement and the drop-out
rate the operator expects, ``plan_strategy`` chooses:

* **how often a device is asked** (``participation``): balanced passes (``balanced_asks``: at most
  ``ceil(R k / N)`` asks, the default when ``N`` is known), uniform sampling (``asks_planned`` at
  the ``plan_quantile`` of ``Binomial(R, k / N)``, with the probability that a given device is asked
  more often), or every round (``N`` unknown: ``R`` asks);
* **the accounted noise multiplier** ``z`` (``noise_multiplier``): the smallest, rounded up to two
  decimals, whose planned asks at full clip the device's own filter admits at the smallest budget
  (``federation.least_affordable_noise_multiplier``). It is the report's ``z_eff``, the adaptive
  clipping bit included (Andrew et al. 2021, Section 3.1): the strategy sends the update's ``z``,
  ``update_noise_multiplier(z_eff, sigma_b)``. In distributed placement the Skellam charge is planned
  at a clip that is a power of two, where the grid (``grid_step``) makes it largest, over one more
  coordinate (the bit);
* **the clip**: an initial ``C0`` (default 0.1, Flower's ``initial_clipping_norm`` and Andrew et
  al.'s) and adaptive clipping's target quantile, learning rate and ``clipped_count_stddev``
  (``AdaptiveClipping``'s defaults; ``sigma_b = k / 20``). Noise-free, a round moves the clip by at
  most ``exp(eta_C max(gamma, 1 - gamma))`` (``e^0.1`` at the defaults), so ``rounds_per_decade``
  rounds move it by ten;
* **min_reports** (distributed placement): the largest ``m`` whose round aborts (fewer than ``m``
  of the ``k`` asked reply, ``Binomial(k, 1 - dropout)``) with probability at most
  ``abort_probability`` (``dropout.min_reports_for_dropout``).

Every figure is public. Nothing in the plan binds a device: each checks every request against
its owner's policy and pays from its own budget.

Pure: no Flower, no I/O.

Examples
--------
>>> plan = plan_strategy(devices=100, population=1000, rounds=50, dim=1000, epsilons=[4.0], delta=1e-5)
>>> plan["participation"]["asks_planned"], plan["noise_multiplier"], plan["budget"]["pays_for_planned_asks"]
(5, 2.42, True)
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from scipy import stats

from fedfilter.checks import finite, int_in, positive_finite, short_repr
from fedfilter.planning import dropout
from fedfilter.planning.dropout import check_rate, expected_reports, min_reports_for_dropout
from fedfilter.planning.federation import ROUNDS_COUNTED, least_affordable_noise_multiplier
from fedfilter.planning.participation import asks_planned, balanced_asks
from fedfilter.planning.rounds import admits_rounds, check_distributed_filter, rounds_admitted
from fedfilter.planning.self_sampling import sampling_section
from fedfilter.privacy.noise_norm import chi_mean
from fedfilter.protocol.adaptive_clip import AdaptiveClipping, update_noise_multiplier
from fedfilter.protocol.request import PLACEMENTS
from fedfilter.protocol.secagg.grid import largest_noise_multiplier

__all__ = [
    "DEFAULT_ABORT_PROBABILITY",
    "DEFAULT_INITIAL_CLIP",
    "DEFAULT_PLAN_QUANTILE",
    "PARTICIPATIONS",
    "PLAN_FORMAT",
    "plan_strategy",
    "rounds_per_decade",
    "strategy_arguments",
]

PLAN_FORMAT = 1  # the plan document's version: from_plan refuses another
DEFAULT_INITIAL_CLIP = 0.1  # Flower's initial_clipping_norm; Andrew et al. start there too (Section 4)
DEFAULT_PLAN_QUANTILE = 0.9  # uniform sampling: the asks a device is planned for
DEFAULT_ABORT_PROBABILITY = 0.01  # the chance a round may abort for too few replies
PARTICIPATIONS = ("balanced", "uniform", "every-round")
_NOISY_FRACTION = 0.1  # above this std the plan says the adaptive clip's estimate is noisy


def rounds_per_decade(adaptive: AdaptiveClipping) -> int:
    """Rounds the clip needs, at the least, to move by a factor of ten (noise-free, Algorithm 1).

    A round's step is ``exp(-eta_C (b_bar - gamma))`` with ``b_bar`` in [0, 1], so at most
    ``exp(eta_C max(gamma, 1 - gamma))``.

    Parameters
    ----------
    adaptive : AdaptiveClipping
        ``gamma`` and ``eta_C``.

    Examples
    --------
    >>> rounds_per_decade(AdaptiveClipping())  # e^0.1 per round: ln(10) / 0.1 = 23.03
    24
    """
    step = adaptive.clip_norm_lr * max(adaptive.target_clipped_quantile, 1.0 - adaptive.target_clipped_quantile)
    return math.ceil(math.log(10.0) / step)


def _problems(f: dict[str, Any]) -> list[str]:
    out = []
    for name in ("devices", "rounds", "dim"):
        if not int_in(f[name], 1, 2**62):
            out.append(f"{name} must be an integer >= 1. Found {short_repr(f[name])}.")
    if f["population"] is not None and not (int_in(f["population"], 1, 2**62) and f["population"] >= f["devices"]):
        out.append(
            f"population must be an integer >= devices ({short_repr(f['devices'])}). "
            f"Found {short_repr(f['population'])}."
        )
    eps = f["epsilons"]
    if not isinstance(eps, Sequence) or not eps or any(positive_finite("epsilon", e) for e in eps):
        out.append(f"epsilons must be a non-empty list of positive finite numbers. Found {short_repr(eps)}.")
    d = finite(f["delta"])
    if d is None or not 0 < d < 1:
        out.append(f"delta must be a number in (0, 1). Found {short_repr(f['delta'])}.")
    if f["placement"] not in PLACEMENTS:
        out.append(f"placement must be one of {PLACEMENTS}. Found {short_repr(f['placement'])}.")
    elif f["placement"] == "distributed" and f["filter"] is not None:
        try:
            check_distributed_filter(f["filter"])
        except ValueError as err:
            out.append(str(err))
    mode = f["participation"]
    if mode is not None and mode not in PARTICIPATIONS:
        out.append(f"participation must be one of {PARTICIPATIONS}. Found {short_repr(mode)}.")
    elif mode in ("balanced", "uniform") and f["population"] is None:
        out.append(f"participation {mode!r} needs the population (the devices in the federation). Found None.")
    if f["plan_quantile"] is not None and mode != "uniform":
        out.append(f"plan_quantile is for participation 'uniform' only. Found participation {short_repr(mode)}.")
    for name, low_open in (("plan_quantile", True), ("dropout_rate", False), ("abort_probability", True)):
        if f[name] is not None:
            try:
                check_rate(name, f[name], low_open=low_open)
            except ValueError as err:
                out.append(str(err))
    if f["min_reports"] is not None and not (
        int_in(f["min_reports"], 1, 2**62) and int_in(f["devices"], 1, 2**62) and f["min_reports"] <= f["devices"]
    ):
        out.append(
            f"min_reports must be an integer in [1, devices={short_repr(f['devices'])}]. "
            f"Found {short_repr(f['min_reports'])}."
        )
    for name in ("clip", "noise_multiplier", "clipped_count_stddev"):
        if f[name] is not None and (problem := positive_finite(name, f[name])) is not None:
            out.append(problem)
    if not int_in(f["seed"], 0, 2**63 - 1):
        out.append(f"seed must be an integer >= 0. Found {short_repr(f['seed'])}.")
    if f["adaptive"]:
        out += AdaptiveClipping(f["target_clipped_quantile"], f["clip_norm_lr"], f["clipped_count_stddev"]).problems()
    return out


def _participation(f: dict[str, Any]) -> dict[str, Any]:
    k, rounds, population = f["devices"], f["rounds"], f["population"]
    mode = f["participation"] or ("balanced" if population is not None else "every-round")
    quantile = None
    if mode == "balanced":
        asks, more = balanced_asks(rounds, k, population), 0.0
    elif mode == "uniform":
        quantile = f["plan_quantile"] if f["plan_quantile"] is not None else DEFAULT_PLAN_QUANTILE
        asks = asks_planned(rounds, k, population, quantile)
        more = float(stats.binom.sf(asks, rounds, k / population))  # P(X > asks), X ~ Binomial(R, k / N)
    else:
        asks, more = rounds, 0.0
    return {
        "mode": mode,
        "population": population,
        "devices_per_round": k,
        "rounds": rounds,
        "asks_planned": asks,
        "plan_quantile": quantile,
        "p_asked_more": more,
        "seed": f["seed"],
    }


def _round_up_admitted(z: float, admits: Any) -> float:
    """``z`` rounded up to two decimals, stepped up by 0.01 until the filter admits it."""
    out = math.ceil(z * 100.0) / 100.0
    while not admits(out):
        out = round(out + 0.01, 2)
    return out


def plan_strategy(
    *,
    devices: int,
    rounds: int,
    dim: int,
    epsilons: Sequence[float],
    delta: float,
    population: int | None = None,
    placement: str = "local",
    filter: str | None = None,
    participation: str | None = None,
    plan_quantile: float | None = None,
    dropout_rate: float = 0.0,
    abort_probability: float = DEFAULT_ABORT_PROBABILITY,
    clip: float | None = None,
    noise_multiplier: float | None = None,
    adaptive: bool = True,
    target_clipped_quantile: float = AdaptiveClipping.target_clipped_quantile,
    clip_norm_lr: float = AdaptiveClipping.clip_norm_lr,
    clipped_count_stddev: float | None = None,
    seed: int = 0,
    min_reports: int | None = None,
    sampling: bool = False,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """The strategy's settings from public facts: one JSON-able document (the module docstring says how).

    Parameters
    ----------
    devices : int
        ``k``, devices asked per round.
    rounds : int
        ``R``, rounds in the run.
    dim : int
        Floating-point coordinates the devices release.
    epsilons : sequence of float
        The devices' budgets (one, or the tiers); the smallest is planned for.
    delta : float
        Their delta, in (0, 1).
    population : int, optional
        ``N``, devices in the federation (at least ``k``).
    placement : {"local", "distributed"}, optional
        Where the noise is added.
    filter : str, optional
        The devices' filter (default gdp; rdp in distributed placement).
    participation : {"balanced", "uniform", "every-round"}, optional
        Default balanced when ``population`` is given, else every-round.
    plan_quantile : float, optional
        Uniform sampling: the quantile of asks paid for (default 0.9).
    dropout_rate : float, optional
        The chance a device asked does not reply, in [0, 1).
    abort_probability : float, optional
        Distributed placement: the chance a round may abort for too few replies (default 0.01).
    clip : float, optional
        The initial clip ``C0`` (default 0.1 with adaptive clipping, else required).
    noise_multiplier : float, optional
        The accounted ``z`` to use instead of the least the budget pays for (the plan says whether it pays).
    adaptive : bool, optional
        Adapt the clip (Andrew et al. 2021); False: a fixed clip.
    target_clipped_quantile, clip_norm_lr, clipped_count_stddev : float, optional
        ``AdaptiveClipping``'s fields (``clipped_count_stddev`` default ``k / 20``).
    seed : int, optional
        The public seed of the balanced passes' shuffles.
    min_reports : int, optional
        Distributed placement: ``m`` to use instead of the one the drop-out rate chooses.
    sampling : bool, optional
        Devices sample themselves (``planning.self_sampling``): the z with the most expected signal
        over noise among those that spend every budget (and, distributed, fit SecAgg+'s range for
        ``devices``), each budget's rate and order, under ``"sampling"``; needs the rdp
        filter and a fixed clip.
    progress : callable, optional
        With ``sampling``: ``progress(done, total)`` as the search for ``z`` goes (``plan_sampling``).

    Returns
    -------
    dict
        ``format``, ``noise_multiplier`` (accounted), ``update_noise_multiplier``, ``clip``,
        ``placement``, ``min_reports``, ``filter``, ``dim``, ``adaptive_clipping`` (or ``None``),
        ``participation``, ``dropout``, ``budget``, ``mean_noise_to_clip``; the reference
        (docs/flower-app.md) lists every field.

    Raises
    ------
    ValueError
        Naming every bad field and its value, or why no plan exists.

    Examples
    --------
    >>> plan = plan_strategy(devices=100, rounds=50, dim=1000, epsilons=[4.0, 8.0], delta=1e-5,
    ...                      placement="distributed", dropout_rate=0.1)
    >>> plan["min_reports"], plan["participation"]["mode"], plan["budget"]["asks_afforded"][0] >= 50
    (82, 'every-round', True)
    """
    f: dict[str, Any] = dict(locals())
    f["epsilons"] = list(epsilons) if isinstance(epsilons, Sequence) and not isinstance(epsilons, str) else epsilons
    if adaptive and clip is None:
        f["clip"] = DEFAULT_INITIAL_CLIP
    if problems := _problems(f):
        raise ValueError(" ".join(problems))
    if f["clip"] is None:
        raise ValueError("clip must be given for a fixed clip (adaptive=False). Found None.")
    kind = filter if filter is not None else ("rdp" if placement == "distributed" or sampling else "gdp")
    if sampling and (kind != "rdp" or adaptive):
        raise ValueError(
            "sampling (devices that sample themselves) needs filter 'rdp' and a fixed clip. Found "
            f"filter {kind!r}, adaptive={adaptive!r}."
        )
    part = _participation(f)
    asks = part["asks_planned"]
    if placement == "distributed" and min_reports is not None:
        m, p_abort = min_reports, dropout.abort_probability(devices, dropout_rate, min_reports)
    elif placement == "distributed":
        m, p_abort = min_reports_for_dropout(devices, dropout_rate, abort_probability)
    else:
        m, p_abort = 1, abort_probability_local(devices, dropout_rate)
    sigma_b = None
    if adaptive:
        sigma_b = AdaptiveClipping(clipped_count_stddev=clipped_count_stddev).stddev_for(devices)
    released = dim + 1 if adaptive else dim  # the bit rides as one more coordinate
    # Distributed: the Skellam charge at a power-of-two clip is the largest over the grid's binade.
    setting: dict[str, Any] = dict(placement=placement, clip=1.0, min_reports=m, dim=released)
    epsilon = min(f["epsilons"])

    def admits(z: float) -> bool:
        return admits_rounds(kind, rounds=asks, epsilon=epsilon, delta=delta, noise_multiplier=z, **setting)

    section = None
    if sampling:
        section = sampling_section(
            epsilons=f["epsilons"],
            delta=delta,
            asks=asks,
            placement=placement,
            min_reports=m,
            dim=released,
            noise_multipliers=None if noise_multiplier is None else [noise_multiplier],
            # A chosen z stays below SecAgg+'s range for the devices asked (every device refuses above
            # it); a z the caller fixes is theirs, and plan_federation's verdict says if it is refused.
            noise_limit=largest_noise_multiplier(devices, m, f["clip"])
            if placement == "distributed" and noise_multiplier is None
            else None,
            progress=progress,
        )
        noise_multiplier = section["noise_multiplier"]
    if noise_multiplier is None:
        z_least = least_affordable_noise_multiplier(epsilon=epsilon, delta=delta, rounds=asks, filter=kind, **setting)
        if z_least is None:
            raise ValueError(
                f"no noise multiplier up to 1e6 pays for {asks} asks at epsilon {epsilon:g}: plan fewer rounds, "
                "more devices in the population or a larger budget."
            )
        z = _round_up_admitted(z_least, admits)
    else:
        z = float(noise_multiplier)
    notes = []
    if section is not None and not section["spends_every_budget"]:
        limit = math.floor(section["spending_limit"] * 1000) / 1000  # down: at most this spends every budget
        notes.append(
            f"at noise multiplier {z:g} the largest budgets contribute at every ask and end with budget unspent; "
            f"at most {limit:g} spends every budget (leave --noise-multiplier out to plan it)"
        )
    if sigma_b is not None and not z < 2.0 * sigma_b and clipped_count_stddev is None:
        # The default sigma_b = k / 20 is too small for this z: a fixed clip, said in the plan.
        notes.append(
            f"adaptive clipping off: its bit needs clipped_count_stddev above noise_multiplier / 2 = {z / 2:g}, "
            f"and devices per round / 20 is {sigma_b:g}; the clip stays at {f['clip']:g} (give a larger "
            "clipped_count_stddev, or more devices)"
        )
        sigma_b = None
    if sigma_b is not None and not z < 2.0 * sigma_b:
        raise ValueError(
            f"clipped_count_stddev must exceed noise_multiplier / 2 = {z / 2:g} for the adaptive clip's bit to fit "
            f"in the round (Andrew et al. 2021, Section 3.1). Found {sigma_b:g} (devices per round / 20 unless "
            "given): ask more devices per round, give a larger clipped_count_stddev, or plan a fixed clip."
        )
    z_update = update_noise_multiplier(z, sigma_b) if sigma_b is not None else z
    n = expected_reports(devices, dropout_rate)
    # The noise on the update's coordinates of the mean of n reports, against the clip (scale-free):
    # local z C / sqrt(n); distributed z C sqrt(n / m) / n.
    per_report = z_update if placement == "local" else z_update / math.sqrt(m)
    mean_noise_to_clip = per_report * chi_mean(dim) / math.sqrt(max(n, 1.0))
    if section is not None:  # every report carries noise; the sum is divided by the contributions expected
        mean_noise_to_clip /= section["expected_rate"]
    afforded = [
        rounds_admitted(kind, epsilon=e, delta=delta, noise_multiplier=z, limit=max(ROUNDS_COUNTED, asks), **setting)
        for e in f["epsilons"]
    ]
    adaptive_doc = None
    if sigma_b is not None:
        spec = AdaptiveClipping(target_clipped_quantile, clip_norm_lr, sigma_b)
        bits = sigma_b / max(n, 1.0) * (math.sqrt(n) if placement == "local" else math.sqrt(n / m))
        adaptive_doc = {
            "target_clipped_quantile": spec.target_clipped_quantile,
            "clip_norm_lr": spec.clip_norm_lr,
            "clipped_count_stddev": sigma_b,
            "rounds_per_decade": rounds_per_decade(spec),
            "fraction_noise_std": bits,
        }
        if bits > _NOISY_FRACTION:
            notes.append(
                f"the unclipped fraction's estimate carries noise of std {bits:.3g} per round (above "
                f"{_NOISY_FRACTION:g}), so the clip wanders: distributed placement divides it by about "
                "sqrt(min_reports); "
                "a smaller clipped_count_stddev lowers it but its bit then costs more of each round"
            )
    return {
        "format": PLAN_FORMAT,
        "noise_multiplier": z,
        "update_noise_multiplier": z_update,
        "clip": float(f["clip"]),
        "placement": placement,
        "min_reports": m,
        "filter": kind,
        "dim": dim,
        "adaptive_clipping": adaptive_doc,
        "participation": part,
        "dropout": {
            "dropout_rate": float(dropout_rate),
            "abort_probability_target": float(abort_probability),
            "abort_probability": p_abort,
            "expected_reports": n,
        },
        "budget": {
            "epsilons": [float(e) for e in f["epsilons"]],
            "delta": float(delta),
            "asks_afforded": afforded,
            # Self-sampling devices pay for every planned ask at their rate (rates above 0).
            "pays_for_planned_asks": afforded[f["epsilons"].index(epsilon)] >= asks
            if section is None
            else all(q > 0 for q in section["rates"]),
        },
        "mean_noise_to_clip": mean_noise_to_clip,
        "sampling": section,
        "notes": notes,
    }


def abort_probability_local(devices: int, dropout_rate: float) -> float:
    """A local round aborts only when nobody replies: ``dropout_rate ** devices`` (``m = 1``).

    Parameters
    ----------
    devices : int
        ``k``.
    dropout_rate : float
        In [0, 1).

    Examples
    --------
    >>> abort_probability_local(3, 0.5)
    0.125
    """
    return dropout.abort_probability(devices, dropout_rate, 1)


def strategy_arguments(plan: Mapping[str, Any]) -> dict[str, Any]:
    """The strategy's keyword arguments from a plan document (``plan_strategy``'s, or ``fedfilter plan --json``'s).

    ``fedfilter plan --json`` prints the plan under ``"strategy"``; either the whole output or that
    part is accepted. Returns ``noise_multiplier``, ``clip``, ``placement``, ``min_reports``,
    ``adaptive_clipping`` (an ``AdaptiveClipping`` or ``None``), ``participation`` (a dict:
    ``mode``, ``population``, ``asks_planned``, ``seed``), and for devices that sample themselves
    ``planned_asks`` and ``expected_rate`` (0 and 1 without).

    Parameters
    ----------
    plan : mapping
        The plan document.

    Raises
    ------
    ValueError
        Naming a missing or bad field and its value.

    Examples
    --------
    >>> plan = plan_strategy(devices=10, population=100, rounds=20, dim=10, epsilons=[8.0], delta=1e-5)
    >>> args = strategy_arguments({"strategy": plan})
    >>> args["noise_multiplier"] == plan["noise_multiplier"], args["participation"]["asks_planned"]
    (True, 2)
    """
    if not isinstance(plan, Mapping):
        raise ValueError(f"plan must be a JSON object. Found {type(plan).__name__}.")
    doc = plan.get("strategy", plan)
    if not isinstance(doc, Mapping) or doc.get("format") != PLAN_FORMAT:
        found = doc.get("format") if isinstance(doc, Mapping) else doc
        raise ValueError(f"plan format must be {PLAN_FORMAT} (fedfilter plan --json). Found {short_repr(found)}.")
    missing = [k for k in ("noise_multiplier", "clip", "placement", "min_reports", "participation") if k not in doc]
    if missing:
        raise ValueError(f"the plan lacks {', '.join(missing)}. Found fields {sorted(doc)}.")
    adaptive = doc.get("adaptive_clipping")
    spec = None
    if adaptive is not None:
        if not isinstance(adaptive, Mapping):
            raise ValueError(f"plan adaptive_clipping must be an object or null. Found {short_repr(adaptive)}.")
        spec = AdaptiveClipping(
            adaptive.get("target_clipped_quantile", AdaptiveClipping.target_clipped_quantile),
            adaptive.get("clip_norm_lr", AdaptiveClipping.clip_norm_lr),
            adaptive.get("clipped_count_stddev"),
        )
        if problems := spec.problems():
            raise ValueError("plan adaptive_clipping: " + " ".join(problems))
    part = doc["participation"]
    if not isinstance(part, Mapping) or part.get("mode") not in PARTICIPATIONS:
        found = part.get("mode") if isinstance(part, Mapping) else part
        raise ValueError(f"plan participation.mode must be one of {PARTICIPATIONS}. Found {short_repr(found)}.")
    sampling = doc.get("sampling")
    if sampling is not None and not (
        isinstance(sampling, Mapping) and {"planned_asks", "expected_rate"} <= set(sampling)
    ):
        raise ValueError(
            f"plan sampling must be null or hold planned_asks and expected_rate. Found {short_repr(sampling)}."
        )
    return {
        "noise_multiplier": doc["noise_multiplier"],
        "clip": doc["clip"],
        "placement": doc["placement"],
        "min_reports": doc["min_reports"],
        "adaptive_clipping": spec,
        "participation": {k: part.get(k) for k in ("mode", "population", "asks_planned", "seed")},
        "planned_asks": 0 if sampling is None else sampling["planned_asks"],
        "expected_rate": 1.0 if sampling is None else sampling["expected_rate"],
    }
