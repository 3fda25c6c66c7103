"""The SecAgg+ graph ``choose_graph`` picks, per devices per round, min-reports and assumed drop-outs.

    python benchmarks/secagg_graph_table.py --n 100 1000 10000 --min-reports-fraction 0.5 0.25 0.1

Prints, per row: k (num_shares; n = the full graph), t (threshold = min-reports + colluders), the
per-round abort probability at the assumed drop-out rate (privacy does not depend on it), each
device's share of a full graph's neighbours (k / n), and the seconds it took.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, nargs="+", default=[10, 100, 1000, 10000])
    p.add_argument("--min-reports-fraction", type=float, nargs="+", default=[0.5, 0.25, 0.1])
    p.add_argument("--dropout-rate", type=float, nargs="+", default=[0.1, 0.2])
    p.add_argument("--colluders", type=int, default=0)
    args = p.parse_args(argv)
    from fedfilter.protocol.secagg.graph import choose_graph

    print("| devices n | min-reports | dropout rate | k | t | abort per round | k / n | s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for d in args.dropout_rate:
        for f in args.min_reports_fraction:
            for n in args.n:
                m = max(1, math.ceil(f * n))
                started = time.perf_counter()
                try:
                    g = choose_graph(n, min_reports=m, colluders=args.colluders, dropout_rate=d)
                except ValueError as err:
                    print(f"| {n} | {m} | {d:g} | - | - | {err} | | |")
                    continue
                s = time.perf_counter() - started
                print(
                    f"| {n} | {m} | {d:g} | {g.num_shares} | {g.threshold} | {g.abort_probability:.2g} | "
                    f"{g.num_shares / n:.3f} | {s:.2f} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
