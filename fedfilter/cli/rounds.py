"""``fedfilter rounds``: how many full-norm rounds a fresh client's budget admits, before a run.

Options shared with ``fedfilter epsilon`` (placement, filters, the output table) are in
``fedfilter.cli.budget_options``. In distributed placement it also shows the device's worst-case
account (``client/ledger/worst_case.py``): the worst-case-epsilon those rounds need, each report read
alone at the device's own share, and with ``--worst-case-epsilon`` the rounds that budget admits (the
planner's ``alone=True``: the charge and rounding the device's account uses).
"""

from __future__ import annotations

import argparse
import json

from fedfilter.cli.budget_options import (
    FILTER_HELP,
    add_placement_options,
    distributed_kind,
    table,
    worst_case_plan,
    worst_case_rows,
)
from fedfilter.planning.rounds import BASELINE_KINDS, plan_distributed_rounds, plan_rounds
from fedfilter.planning.sampled_rounds import plan_sampled_rounds
from fedfilter.privacy.filters import FILTER_KINDS


def _distributed_rounds(args: argparse.Namespace) -> int:
    kind = distributed_kind(args)
    p = plan_distributed_rounds(
        epsilon=args.epsilon,
        delta=args.delta,
        noise_multiplier=args.noise_multiplier,
        clip=args.clip,
        min_reports=args.min_reports,
        dim=args.dim,
        kind=kind,
    )
    worst = worst_case_plan(
        rounds=p.rounds,
        main_rounds=p.rounds,
        worst_case_epsilon=args.worst_case_epsilon,
        epsilon=args.epsilon,
        delta=args.delta,
        noise_multiplier=args.noise_multiplier,
        clip=args.clip,
        min_reports=args.min_reports,
        dim=args.dim,
        kind=kind,
    )
    out = {
        "filter": kind,
        "placement": "distributed",
        "epsilon": p.epsilon,
        "delta": p.delta,
        "noise_multiplier": p.noise_multiplier,
        "clip": p.clip,
        "min_reports": p.min_reports,
        "dim": p.dim,
        "order": p.order,
        "rounds": p.rounds,
        "gaussian_rounds": plan_rounds(
            "rdp", epsilon=args.epsilon, delta=args.delta, noise_multiplier=args.noise_multiplier
        ).rounds,
        **worst,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"Full-norm rounds for a fresh client, placement distributed (Skellam noise over SecAgg+): budget "
        f"(epsilon={p.epsilon:g}, delta={p.delta:g}), noise multiplier {p.noise_multiplier:g}, clip {p.clip:g}, "
        f"at least {p.min_reports} reports per sum, {p.dim} coordinates\n"
    )
    rows = [
        ("filter", f"rdp at order {p.order:g}: {FILTER_HELP['rdp']}"),
        ("rounds", f"{p.rounds}   (every update of norm C, worst-case L1 on the grid)"),
        ("gaussian", f"{out['gaussian_rounds']}   (the same budget with Gaussian noise, placement local)"),
        ("grid", f"L2 {p.l2:g}, L1 <= {p.l1:.6g}, Skellam variance {p.mu:.6g} per coordinate (grid units)"),
        *worst_case_rows(worst, p.rounds, p.min_reports),
    ]
    print(table(rows))
    return 0


def _sampled_rounds(args: argparse.Namespace) -> int:
    """``--sampling-rate``: the device contributes with its own coin; every ask is charged amplified."""
    if args.filter not in (None, "rdp"):
        raise SystemExit(
            f"fedfilter rounds: --sampling-rate needs --filter rdp (a subsampled release has a Rényi curve, "
            f"not a Gaussian-DP or zCDP one). Found --filter {args.filter}."
        )
    if args.placement == "distributed" and args.dim is None:
        raise SystemExit("fedfilter rounds: --placement distributed needs --dim (the model size).")
    try:
        p = plan_sampled_rounds(
            epsilon=args.epsilon,
            delta=args.delta,
            noise_multiplier=args.noise_multiplier,
            sampling_rate=args.sampling_rate,
            placement=args.placement,
            clip=args.clip,
            min_reports=args.min_reports,
            dim=1 if args.dim is None else args.dim,
        )
    except ValueError as e:
        raise SystemExit(f"fedfilter rounds: {e}") from None
    out = {
        "filter": "rdp",
        "placement": p.placement,
        "epsilon": p.epsilon,
        "delta": p.delta,
        "noise_multiplier": p.noise_multiplier,
        "sampling_rate": p.sampling_rate,
        "order": p.order,
        "charge": p.charge,
        "rounds": p.rounds,
        "expected_contributions": p.expected_contributions,
    }
    if args.json:
        print(json.dumps(out))
        return 0
    print(
        f"Full-clip asks for a fresh device that samples itself: budget (epsilon={p.epsilon:g}, delta={p.delta:g}), "
        f"noise multiplier {p.noise_multiplier:g}, its own coin at rate {p.sampling_rate:g}, placement {p.placement}\n"
    )
    rows = [
        ("filter", f"rdp at order {p.order:g}, fixed before the first charge (docs/derivations/amplification.md)"),
        ("asks", f"{p.rounds}   (each charged the Poisson-subsampled loss, whatever the coin shows)"),
        ("contributes", f"{p.expected_contributions:.1f} times on average (rate x asks)"),
    ]
    print(table(rows))
    return 0


def _rounds(args: argparse.Namespace) -> int:
    if args.sampling_rate is not None:
        return _sampled_rounds(args)
    if args.placement == "distributed":
        return _distributed_rounds(args)
    args.filter = "gdp" if args.filter is None else args.filter
    kinds = list(FILTER_KINDS) + list(BASELINE_KINDS) if args.filter == "all" else [args.filter]
    plans = [
        plan_rounds(k, epsilon=args.epsilon, delta=args.delta, noise_multiplier=args.noise_multiplier) for k in kinds
    ]
    if args.json:
        out = [
            {
                "filter": p.filter,
                "epsilon": p.epsilon,
                "delta": p.delta,
                "noise_multiplier": p.noise_multiplier,
                "rounds": p.rounds,
                "last_round_fraction": p.last_round_fraction,
            }
            for p in plans
        ]
        print(json.dumps(out[0] if len(out) == 1 else out))
        return 0
    print(
        f"Full-norm rounds for a fresh client: budget (epsilon={args.epsilon:g}, delta={args.delta:g}), "
        f"noise multiplier {args.noise_multiplier:g} (every clipped update of norm C, noise std z*C)\n"
    )
    rows = [("filter", "rounds   then a partial round of")]
    for p in plans:
        tail = f"{p.last_round_fraction:.3f} C" if p.filter in FILTER_KINDS else "-"
        rows.append((p.filter, f"{p.rounds:<8} {tail:<9}  {FILTER_HELP[p.filter]}"))
    print(table(rows))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``rounds`` (how many full-norm rounds a budget buys) to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["rounds", "--epsilon", "8", "--delta", "1e-5", "--noise-multiplier", "1"])
    >>> args.func(args)  # doctest: +ELLIPSIS
    Full-norm rounds for a fresh client: budget (epsilon=8, delta=1e-05), noise multiplier 1 ...
    <BLANKLINE>
    filter  rounds   then a partial round of
    gdp     2        0.881 C    exact Gaussian-DP filter (default; the most rounds any valid accountant admits)
    0
    """
    p = sub.add_parser("rounds", help="how many full-norm rounds a fresh client admits")
    p.add_argument("--epsilon", type=float, required=True, help="the client's personal lifetime budget epsilon")
    p.add_argument("--delta", type=float, required=True, help="the client's personal delta (e.g. 1e-5)")
    p.add_argument("--noise-multiplier", type=float, required=True, help="z: noise std is z * C")
    p.add_argument(
        "--filter",
        choices=list(FILTER_KINDS) + list(BASELINE_KINDS) + ["all"],
        default=None,
        help="default gdp (rdp with --placement distributed)",
    )
    p.add_argument("--json", action="store_true", help="print a JSON object (a list with --filter all)")
    p.add_argument(
        "--worst-case-epsilon",
        type=float,
        default=None,
        help="placement distributed: the device's worst-case budget (each report read alone); show its rounds",
    )
    p.add_argument(
        "--sampling-rate",
        type=float,
        default=None,
        help="the device's own coin: asked, it contributes its update with this probability (else only "
        "noise) and each ask is charged the amplified loss; needs --filter rdp",
    )
    add_placement_options(p)
    p.set_defaults(func=_rounds)
