"""What each arm of ``benchmarks/fl_vs_flower_dp.py`` is asked to run: the devices' budgets,
SecAgg+'s threshold and fedfilter's noise multiplier.

Budget tiers (``--budgets tiers``): the shares of Jorgensen et al. (ICDE 2015), used for individualized
DP-SGD by Boenisch et al. (PETS 2023): 34 % of the devices at ``epsilon``, 43 % at ``2 epsilon``, 23 % at
``3 epsilon`` (assigned by a permutation drawn from ``--seed``).
"""

from __future__ import annotations

import argparse
import math

import numpy as np

from fedfilter.planning.participation import asks_planned
from fedfilter.protocol.adaptive_clip import AdaptiveClipping

TIER_SHARES = (0.34, 0.43, 0.23)  # Jorgensen et al. 2015: conservatives, pragmatists, liberals
TIER_FACTORS = (1.0, 2.0, 3.0)


def budgets(n: int, epsilon: float, kind: str, seed: int) -> np.ndarray:
    """Each device's epsilon: all ``epsilon``, or the tiers (module docstring)."""
    if kind == "equal":
        return np.full(n, float(epsilon))
    counts = np.floor(np.array(TIER_SHARES) * n).astype(int)
    counts[0] += n - counts.sum()  # the remainder to the most conservative tier
    eps = np.repeat(np.array(TIER_FACTORS) * float(epsilon), counts)
    return eps[np.random.default_rng([seed, 2015]).permutation(n)]


# --- (b), (c), (d): fedfilter through the vectorised engine ---------------------------------------


def min_reports(args: argparse.Namespace) -> int:
    """(b), (c): SecAgg+'s threshold m (``--min-reports``, default half the devices asked, at least 2)."""
    return int(args.min_reports or max(2, args.clients_per_round // 2))


def adaptive_clipping(args: argparse.Namespace) -> AdaptiveClipping | None:
    """The engine arms' adaptive clipping (``--adaptive-clip`` is Flower's target_clipped_quantile), or None."""
    if args.adaptive_clip is None:
        return None
    lr = {} if args.clip_norm_lr is None else {"clip_norm_lr": args.clip_norm_lr}
    return AdaptiveClipping(args.adaptive_clip, clipped_count_stddev=args.clipped_count_stddev, **lr)


def fedfilter_noise_multipliers(task, args: argparse.Namespace, epsilon: float, flower_z: float) -> dict[str, float]:
    """The z of (b), (c) and (d): (a)'s, ``--fedfilter-z``, or with ``plan`` each placement's own plan.

    The plan is what a fedfilter coordinator can choose from public facts alone: the smallest noise
    multiplier (rounded up to 2 decimals) whose filter, at the smallest budget, pays full-clip rounds
    for as many rounds as a device is expected to be asked (``ceil(rounds * clients_per_round /
    num_clients)``, or with ``--plan-quantile`` that quantile of the number of times it is asked, by
    ``asks_planned``), by ``plan_federation``'s ``least_affordable_noise_multiplier``: rdp Skellam rounds
    with ``min_reports`` shares for (b) and (c) (the same z: (b) minus (c) is the accounting alone), the
    Gaussian-DP filter for (d). A device asked more often than that spends its budget and drops out;
    its filter, not the plan, enforces the budget. No accuracy is looked at.
    """
    if args.fedfilter_z is None:
        return dict.fromkeys("bcd", flower_z)
    if args.fedfilter_z != "plan":
        return dict.fromkeys("bcd", float(args.fedfilter_z))
    from fedfilter.planning.federation import plan_federation

    model = task.model_fn()
    dim = int(sum(p.numel() for p in model.parameters()))
    k = args.clients_per_round
    asked = asks_planned(args.rounds, k, task.num_clients, args.plan_quantile)
    out = {}
    for arm, placement, m in (("b", "distributed", min_reports(args)), ("d", "local", 1)):
        plan = plan_federation(
            devices=k,
            dim=dim,
            noise_multiplier=flower_z,
            clip=args.clip,
            epsilon=epsilon,
            delta=args.delta,
            rounds=asked,
            placement=placement,
            min_reports=m,
        )
        z = plan["least_affordable_noise_multiplier"]
        if z is None:
            raise SystemExit(f"no noise multiplier pays for {asked} rounds at epsilon {epsilon:g} ({placement})")
        out[arm] = math.ceil(z * 100) / 100
    out["c"] = out["b"]
    return out


# --- (g): a trusted server that samples every device on its own coin ----------------------------------


def amplified_noise_multiplier(epsilon: float, delta: float, rounds: int, rate: float) -> float:
    """(g)'s ``z``: the smallest (to 1e-4 relative, rounded up) at which dp_accounting's ``RdpAccountant``
    certifies ``rounds`` compositions of ``PoissonSampledDpEvent(rate, GaussianDpEvent(z))`` within
    (epsilon, delta): the best a trusted server running Poisson-sampled DP-FedAvg can claim."""
    import logging

    import dp_accounting
    from dp_accounting import rdp
    from harness.flower_central_dp import smallest_noise_multiplier  # the same search as (a)'s z

    logging.getLogger("absl").setLevel(logging.ERROR)  # its fractional series warns at orders below 2

    def fits(z: float) -> bool:
        accountant = rdp.RdpAccountant()
        accountant.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z)), rounds)
        return accountant.get_epsilon(delta) <= epsilon

    return smallest_noise_multiplier(fits, f"{rounds} rounds at epsilon={epsilon!r}")


def amplified_epsilon(z: float, delta: float, rounds: int, rate: float) -> float:
    """What dp_accounting certifies for (g)'s run: ``rounds`` Poisson-sampled Gaussian releases at ``z``."""
    import dp_accounting
    from dp_accounting import rdp

    accountant = rdp.RdpAccountant()
    accountant.compose(dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(z)), rounds)
    return float(accountant.get_epsilon(delta))


# --- (h): devices that sample themselves ---------------------------------------------------------------


def sampled_per_round(task, args: argparse.Namespace) -> int:
    """(h)'s devices asked per round (``--sampled-per-round``; default every device)."""
    return int(args.sampled_per_round or task.num_clients)


def sampled_min_reports(task, args: argparse.Namespace) -> int:
    """(h)'s SecAgg+ threshold: every asked device reports (a dropped coin is a report of noise), so the
    plan's ``min_reports`` for a 10 % drop-out rate with a 1 % abort probability (``--sampled-min-reports``)."""
    from fedfilter.planning.dropout import min_reports_for_dropout

    if args.sampled_min_reports:
        return int(args.sampled_min_reports)
    return max(2, min_reports_for_dropout(sampled_per_round(task, args), 0.1, 0.01)[0])


def sampling_plan(task, args: argparse.Namespace, eps: np.ndarray) -> dict:
    """(h)'s plan from public facts (``planning.sampled_rounds.plan_sampling``): the asks each device
    expects (balanced passes), the z with the most expected signal over noise among those that spend every
    budget and fit SecAgg+'s range for the devices asked, in distributed placement, each budget's rate,
    and their mean (the coordinator's divisor)."""
    from fedfilter.planning.sampled_rounds import plan_sampling
    from fedfilter.protocol.secagg.grid import largest_noise_multiplier

    k = sampled_per_round(task, args)
    asks = math.ceil(args.rounds * k / task.num_clients)
    values, counts = np.unique(eps, return_counts=True)
    dim = int(sum(p.numel() for p in task.model_fn().parameters()))
    m = sampled_min_reports(task, args)
    plan = plan_sampling(
        budgets=[float(v) for v in values],
        shares=[float(c) / len(eps) for c in counts],
        delta=args.delta,
        asks=asks,
        placement="distributed",
        clip=args.clip,
        min_reports=m,
        dim=dim,
        noise_limit=largest_noise_multiplier(k, m, args.clip),
    )
    rates = dict(zip(map(float, values), plan.rates))
    summary = (
        f"z = {plan.noise_multiplier:g}, {asks} asks per device, rates {rates} (mean {plan.mean_rate:.3f}), "
        f"min_reports {m}"
    )
    return {
        "summary": summary,
        "noise_multiplier": plan.noise_multiplier,
        "asks": asks,
        "per_round": k,
        "min_reports": m,
        "rates": dict(zip(map(float, values), plan.rates)),
        "expected_rate": max(plan.mean_rate, 1e-6),
    }


def sampled_engine_settings(sampling: dict | None) -> dict:
    """(h)'s ``EngineConfig`` fields from its plan: the asks, each budget's plan order, the mean rate."""
    if sampling is None:
        raise RuntimeError("internal error: arm (h) without its sampling plan")
    return dict(planned_asks=sampling["asks"], rdp_order="plan", expected_rate=sampling["expected_rate"])
