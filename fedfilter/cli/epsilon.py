"""``fedfilter epsilon``: the budget a planned run of full-norm rounds needs (the inverse of ``rounds``).

Options shared with ``fedfilter rounds`` are in ``fedfilter.cli.budget_options``.
"""

from __future__ import annotations

import argparse
import json

from fedfilter.cli.budget_options import FILTER_HELP, add_placement_options, distributed_kind, table
from fedfilter.planning.rounds import plan_distributed_epsilon, plan_epsilon
from fedfilter.privacy.filters import FILTER_KINDS


def _epsilon(args: argparse.Namespace) -> int:
    if args.placement == "distributed":
        kind = distributed_kind(args)
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
            table(
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
        table(
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
    """Add ``epsilon`` (the budget a planned run needs) to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["epsilon", "--rounds", "10", "--delta", "1e-5", "--noise-multiplier", "1"])
    >>> args.func(args)  # doctest: +NORMALIZE_WHITESPACE
    filter      gdp: exact Gaussian-DP filter (default; the most rounds any valid accountant admits)
    rounds      10 full-norm rounds at noise multiplier 1
    delta       1e-05
    epsilon     17.8566   (smallest budget whose filter admits them; rounded up)
    fixed plan  17.8566   (the same rounds fixed in advance, no filter)
    0
    """
    e = sub.add_parser("epsilon", help="the budget a planned run of full-norm rounds needs")
    e.add_argument("--noise-multiplier", type=float, required=True, help="z: noise std is z * C")
    e.add_argument("--rounds", type=int, required=True, help="full-norm rounds the run should afford")
    e.add_argument("--delta", type=float, required=True, help="the client's personal delta (e.g. 1e-5)")
    e.add_argument(
        "--filter", choices=list(FILTER_KINDS), default=None, help="default gdp (rdp with --placement distributed)"
    )
    e.add_argument("--json", action="store_true", help="print a JSON object")
    add_placement_options(e)
    e.set_defaults(func=_epsilon)
