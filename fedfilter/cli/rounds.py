"""``fedfilter rounds`` and ``fedfilter epsilon``: plan a client's budget before a run.

``--placement distributed --dim D`` plans Skellam noise over SecAgg+ (issue 15): only the rdp filter
is valid there, so ``--filter`` defaults to rdp and gdp/zcdp are refused with a clear message.
"""

from __future__ import annotations

import argparse
import json

from fedfilter.privacy.filters import FILTER_KINDS
from fedfilter.privacy.planner import (
    BASELINE_KINDS,
    check_distributed_filter,
    plan_distributed_epsilon,
    plan_distributed_rounds,
    plan_epsilon,
    plan_rounds,
)

FILTER_HELP = {
    "gdp": "exact Gaussian-DP filter (default; the most rounds any valid accountant admits)",
    "rdp": "Rényi filter at dp_accounting's best order, full delta (papers/004 Thm 4.3, Remark 4.4)",
    "zcdp": "papers/004 Theorem 4.9 (zCDP to (eps, delta))",
    "basic": "papers/003 Theorem 3.4 via Lemma 3.3 (baseline)",
    "advanced": "papers/003 Theorem 5.1 via Lemma 3.3 (baseline)",
}


def _table(rows: list[tuple[str, str]]) -> str:
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)


def _distributed_kind(args: argparse.Namespace) -> str:
    """The filter for placement 'distributed' (rdp unless asked otherwise, then refused); needs --dim."""
    kind = "rdp" if args.filter is None else args.filter
    problems = []
    if args.dim is None:
        problems.append("--placement distributed needs --dim (the model size, the number of coordinates).")
    try:
        check_distributed_filter(kind)
    except ValueError as err:
        problems.append(f"--filter {kind}: {err}")
    if problems:
        raise ValueError(" ".join(problems))
    return kind


def _distributed_rounds(args: argparse.Namespace) -> int:
    kind = _distributed_kind(args)
    p = plan_distributed_rounds(
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
    ]
    print(_table(rows))
    return 0


def _rounds(args: argparse.Namespace) -> int:
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
    print(_table(rows))
    return 0


def _epsilon(args: argparse.Namespace) -> int:
    if args.placement == "distributed":
        kind = _distributed_kind(args)
        res = plan_distributed_epsilon(
            rounds=args.rounds,
            delta=args.delta,
            noise_multiplier=args.noise_multiplier,
            clip=args.clip,
            min_reports=args.min_reports,
            dim=args.dim,
            kind=kind,
        )
        if args.json:
            print(json.dumps(res))
            return 0
        print(
            _table(
                [
                    ("filter", f"rdp at order {res['order']:g} (placement distributed: Skellam over SecAgg+)"),
                    ("rounds", f"{args.rounds} full-norm rounds at noise multiplier {args.noise_multiplier:g}"),
                    ("delta", f"{args.delta:g}"),
                    ("epsilon", f"{res['epsilon']:.6g}   (smallest budget whose filter admits them)"),
                    ("fixed plan", f"{res['fixed_composition_epsilon']:.6g}   (the same rounds fixed in advance)"),
                ]
            )
        )
        return 0
    args.filter = "gdp" if args.filter is None else args.filter
    res = plan_epsilon(args.filter, noise_multiplier=args.noise_multiplier, rounds=args.rounds, delta=args.delta)
    if args.json:
        print(json.dumps(res))
        return 0
    print(
        _table(
            [
                ("filter", f"{args.filter}: {FILTER_HELP[args.filter]}"),
                ("rounds", f"{args.rounds} full-norm rounds at noise multiplier {args.noise_multiplier:g}"),
                ("delta", f"{args.delta:g}"),
                ("epsilon", f"{res['epsilon']:.6g}   (smallest budget whose filter admits them; rounded up)"),
                (
                    "fixed plan",
                    f"{res['fixed_composition_epsilon']:.6g}   (the same rounds fixed in advance, no filter)",
                ),
            ]
        )
    )
    return 0


def _placement_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placement",
        choices=["local", "distributed"],
        default="local",
        help="local: Gaussian noise on the device; distributed: Skellam noise over SecAgg+ (needs --dim, rdp)",
    )
    p.add_argument("--dim", type=int, default=None, help="model size (coordinates); placement distributed")
    p.add_argument("--clip", type=float, default=1.0, help="clip norm C (sets the grid step); placement distributed")
    p.add_argument("--min-reports", type=int, default=1, help="fewest reports in a released sum (distributed)")


def register(sub: argparse._SubParsersAction) -> None:
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
    _placement_arguments(p)
    p.set_defaults(func=_rounds)

    e = sub.add_parser("epsilon", help="the budget a planned run of full-norm rounds needs")
    e.add_argument("--noise-multiplier", type=float, required=True, help="z: noise std is z * C")
    e.add_argument("--rounds", type=int, required=True, help="full-norm rounds the run should afford")
    e.add_argument("--delta", type=float, required=True, help="the client's personal delta (e.g. 1e-5)")
    e.add_argument(
        "--filter", choices=list(FILTER_KINDS), default=None, help="default gdp (rdp with --placement distributed)"
    )
    e.add_argument("--json", action="store_true", help="print a JSON object")
    _placement_arguments(e)
    e.set_defaults(func=_epsilon)
