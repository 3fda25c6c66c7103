"""Sparse counting queries: worst-case accounting vs the individual filter (Feldman & Zrnic (2021) Theorem 1.2).

    python benchmarks/sparse_queries.py                       # the table
    python benchmarks/sparse_queries.py --figures docs/results_study   # and one PNG per scenario

For each scenario (sparsity s, share of heavy users, filter kind) the same users are run under both
methods for several seeds; the table gives queries answered, the empirical rate of days whose error
against the active-set sum exceeds Theorem 1.2's bound sqrt(s log(1/beta) / kappa) (it must stay
below beta; the exact Gaussian rate is erfc(sqrt(log(1/beta)))), days answered within the bound
against the sum over *all* users, and the largest share of a budget any user spent.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedfilter.simulations.sparse_queries import SparseQueryConfig, exact_exceed_probability, simulate  # noqa: E402

SCENARIOS = [
    # (sparsity, heavy_share, filter)
    (5, 0.0, "zcdp"),
    (10, 0.0, "zcdp"),
    (10, 0.02, "zcdp"),
    (10, 0.10, "zcdp"),
    (20, 0.10, "zcdp"),
    (10, 0.10, "gdp"),
]


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    base = SparseQueryConfig(
        n_users=args.users, days=args.days, epsilon=args.epsilon, delta=args.delta, failure_prob=args.beta
    )
    for s, heavy, kind in SCENARIOS:
        cfg0 = replace(base, sparsity=s, heavy_share=heavy, filter=kind)
        per_seed = [simulate(replace(cfg0, seed=seed)) for seed in range(args.seeds)]
        sums = [r.summary() for r in per_seed]
        wc = [x["worst_case"] for x in sums]
        ind = [x["individual"] for x in sums]
        n_ind = sum(x["answered"] for x in ind)
        rows.append(
            {
                "sparsity": s,
                "heavy_share": heavy,
                "filter": kind,
                "seeds": args.seeds,
                "sigma": sums[0]["sigma"],
                "kappa": sums[0]["kappa"],
                "bound": sums[0]["bound"],
                "worst_case_answered": float(np.mean([x["answered"] for x in wc])),
                "individual_answered": float(np.mean([x["answered"] for x in ind])),
                "worst_case_exceed_rate": sum(x["exceed_rate"] * x["answered"] for x in wc)
                / max(sum(x["answered"] for x in wc), 1),
                "individual_exceed_rate": sum(x["exceed_rate"] * x["answered"] for x in ind) / n_ind,
                "expected_exceed_rate": exact_exceed_probability(args.beta),
                "individual_days_with_everyone": float(np.mean([x["days_with_everyone"] for x in ind])),
                "individual_within_bound_vs_all": float(np.mean([x["within_bound_vs_all_users"] for x in ind])),
                "individual_mae_vs_all": float(np.mean([x["mean_abs_error_vs_all_users"] for x in ind])),
                "users_admitted_at_end": float(np.mean([x["users_admitted_at_end"] for x in ind])) / args.users,
                "max_spent_fraction": max(x["users"]["max_spent_fraction"] for x in sums),
                "max_epsilon_spent": max(x["users"]["max_epsilon_spent"] for x in sums),
            }
        )
        if args.figures:
            from fedfilter.simulations.sparse_queries.plots import plot_result

            name = f"sparse_s{s}_heavy{heavy:g}_{kind}.png"
            plot_result(per_seed[0], Path(args.figures) / name)
    return rows


def table(rows: list[dict], args: argparse.Namespace) -> str:
    head = (
        "| s | heavy share | filter | sigma | bound | answered: worst case | answered: individual "
        "| exceed rate (<= beta): worst / indiv. | days before first drop-out | within bound vs all users "
        "| users with budget left | max budget share spent |"
    )
    lines = [
        f"{args.users} users, {args.days} days, budget (epsilon={args.epsilon:g}, delta={args.delta:g}) per user, "
        f"beta={args.beta:g} (exact Gaussian exceed rate {exact_exceed_probability(args.beta):.4f}), "
        f"means over {args.seeds} seeds",
        "",
        head,
        "|" + "---|" * (head.count("|") - 1),
    ]
    for r in rows:
        lines.append(
            f"| {r['sparsity']} | {r['heavy_share']:g} | {r['filter']} | {r['sigma']:.2f} | {r['bound']:.1f} "
            f"| {r['worst_case_answered']:.0f} | {r['individual_answered']:.0f} "
            f"| {r['worst_case_exceed_rate']:.3f} / {r['individual_exceed_rate']:.4f} "
            f"| {r['individual_days_with_everyone']:.1f} | {r['individual_within_bound_vs_all']:.1f} "
            f"| {r['users_admitted_at_end']:.3f} | {r['max_spent_fraction']:.12f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--users", type=int, default=10_000)
    p.add_argument("--days", type=int, default=365)
    p.add_argument("--epsilon", type=float, default=1.0)
    p.add_argument("--delta", type=float, default=1e-6)
    p.add_argument("--beta", type=float, default=0.05, help="failure probability of the error bound")
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--figures", default=None, help="folder for one PNG per scenario (first seed)")
    p.add_argument("--json", action="store_true", help="print the rows as JSON instead of a table")
    args = p.parse_args(argv)
    rows = run(args)
    print(json.dumps(rows, indent=1) if args.json else table(rows, args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
