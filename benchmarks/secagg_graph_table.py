"""The SecAgg+ graph ``choose_graph`` picks, per devices per round and assumed rates (issue 23).

    python benchmarks/secagg_graph_table.py --n 10 100 1000 10000 100000

Prints, per row: k (num_shares; n = the full graph), t (threshold), the per-round failure
probability the guarantee against an honest coordinator adds to delta, the per-round abort
probability, each device's share of a full graph's neighbours (k / n), and the seconds it took.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000, 10000])
    p.add_argument("--rates", nargs="+", default=["0.1:0", "0.1:0.05", "0.2:0.1"], help="dropout:corrupt pairs")
    args = p.parse_args(argv)
    from fedfilter.privacy.secagg_graph import choose_graph

    print("| devices n | dropout rate | corrupt rate | k | t | failure per round | abort per round | k / n | s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for rates in args.rates:
        d, c = (float(x) for x in rates.split(":"))
        for n in args.n:
            started = time.perf_counter()
            try:
                g = choose_graph(n, dropout_rate=d, corrupt_rate=c)
            except ValueError as err:
                print(f"| {n} | {d:g} | {c:g} | - | - | {err} | | | |")
                continue
            s = time.perf_counter() - started
            print(
                f"| {n} | {d:g} | {c:g} | {g.num_shares} | {g.threshold} | {g.failure_probability:.2g} | "
                f"{g.abort_probability:.2g} | {g.num_shares / n:.3f} | {s:.2f} |"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
