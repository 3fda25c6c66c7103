"""Full-norm rounds each filter admits, and the budget ledger's spend latency.

    python benchmarks/filter_rounds.py [--rounds-only]

Rounds: a fresh client, every clipped update of norm exactly C, noise std z*C, delta = 1e-5, for
z = 170 (Feldman & Zrnic (2021) Appendix A's eps = 0.3 setting) and z = 5 (a typical federated setting).
Latency: one FilteredClient.release (validate, allowance, clip, durable SQLite commit with
synchronous=FULL, noise) of a 100k-parameter update, against a baseline measured in the same run:
a bare SQLite insert+commit with the same durability settings on the same disk (the fsync floor).
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedfilter.client.ledger.budget import BudgetLedger  # noqa: E402
from fedfilter.client.release import FilteredClient  # noqa: E402
from fedfilter.planning.rounds import plan_rounds  # noqa: E402
from fedfilter.protocol.request import RoundSpec  # noqa: E402

EPSILONS = (0.3, 0.5, 1.0, 2.0, 8.0)
KINDS = ("gdp", "rdp", "zcdp", "basic", "advanced")


def rounds_table(z: float) -> str:
    lines = [
        f"noise multiplier z = {z:g}, delta = 1e-5",
        "",
        "| filter | " + " | ".join(f"eps={e:g}" for e in EPSILONS) + " |",
        "|---|" + "---:|" * len(EPSILONS),
    ]
    for kind in KINDS:
        cells = [plan_rounds(kind, epsilon=e, delta=1e-5, noise_multiplier=z).rounds for e in EPSILONS]
        lines.append(f"| {kind} | " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def percentile_ms(samples: list[float], q: float) -> float:
    return float(np.percentile(np.array(samples) * 1e3, q))


def latency(n: int = 400) -> str:
    with tempfile.TemporaryDirectory() as d:
        client = FilteredClient(BudgetLedger.enrol(Path(d) / "dev", client_id="bench", epsilon=1e6, delta=1e-5))
        update = [np.random.default_rng(0).normal(size=100_000).astype(np.float32) * 1e-3]
        conn = sqlite3.connect(Path(d) / "floor.sqlite", isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE t (a INTEGER PRIMARY KEY, b TEXT)")
        ours, floor = [], []
        for r in range(n):  # interleaved so both see the same machine load
            t0 = time.perf_counter()
            client.release(RoundSpec("bench", r, 1.0, 1.0), update)
            ours.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO t VALUES (?, ?)", (r, "x" * 200))
            conn.execute("COMMIT")
            floor.append(time.perf_counter() - t0)
    p50, p99 = percentile_ms(ours, 50), percentile_ms(ours, 99)
    f50, f99 = percentile_ms(floor, 50), percentile_ms(floor, 99)
    return (
        f"release of a 100k-parameter update, {n} rounds\n\n"
        "| | p50 (ms) | p99 (ms) |\n|---|---:|---:|\n"
        f"| FilteredClient.release (clip, durable spend, noise) | {p50:.2f} | {p99:.2f} |\n"
        f"| baseline: bare SQLite insert + commit, synchronous=FULL | {f50:.2f} | {f99:.2f} |\n"
        f"| ratio | {p50 / f50:.1f}x | {p99 / f99:.1f}x |"
    )


def main() -> None:
    for z in (170.0, 5.0):
        print(rounds_table(z), "\n")
    if "--rounds-only" not in sys.argv[1:]:
        print(latency())


if __name__ == "__main__":
    main()
