"""``fedfilter rounds`` and ``fedfilter epsilon``: plan a client's budget before a run."""

from __future__ import annotations

import argparse
import json

from fedfilter.client.privacy.filters import FILTER_KINDS
from fedfilter.client.privacy.planner import BASELINE_KINDS, plan_epsilon, plan_rounds

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


def _rounds(args: argparse.Namespace) -> int:
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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rounds", help="how many full-norm rounds a fresh client admits")
    p.add_argument("--epsilon", type=float, required=True)
    p.add_argument("--delta", type=float, required=True)
    p.add_argument("--noise-multiplier", type=float, required=True, help="z: noise std is z * C")
    p.add_argument("--filter", choices=list(FILTER_KINDS) + list(BASELINE_KINDS) + ["all"], default="gdp")
    p.add_argument("--json", action="store_true", help="print a JSON object (a list with --filter all)")
    p.set_defaults(func=_rounds)

    e = sub.add_parser("epsilon", help="the budget a planned run of full-norm rounds needs")
    e.add_argument("--noise-multiplier", type=float, required=True)
    e.add_argument("--rounds", type=int, required=True)
    e.add_argument("--delta", type=float, required=True)
    e.add_argument("--filter", choices=list(FILTER_KINDS), default="gdp")
    e.add_argument("--json", action="store_true")
    e.set_defaults(func=_epsilon)
