"""Release latency with float-safe noise against the float noise it replaced, in one run.

    python benchmarks/noise_latency.py [--dims 100000 1000000] [--repeats 5]

For each model size: (1) the replaced float noise (numpy's float64 normal added in float64, cast to
float32: what `add_gaussian_noise` did before the float-safe noise), (2) the float-safe noise (snap the update
onto the grid, exact rounded Gaussian from ChaCha20, `fedfilter.client.mechanisms.gaussian`), (3) a whole
`FilteredClient.release` (validate, filter, clip, durable SQLite commit, snap, noise). Medians of
`--repeats` runs, one core, and the ratio (2) / (1).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.mechanisms.gaussian import add_grid_noise, noise_grid, snap_toward_zero
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
from fedfilter.client.release import FilteredClient
from fedfilter.protocol.request import RoundSpec


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dims", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    z, clip = 1.0, 1.0
    std = z * clip
    print(f"{'parameters':>12}  {'float noise (s)':>15}  {'float-safe (s)':>14}  {'ratio':>6}  {'release (s)':>11}")
    with tempfile.TemporaryDirectory() as tmp:
        client = FilteredClient(BudgetLedger.enrol(Path(tmp) / "dev", client_id="bench", epsilon=1e6, delta=1e-5))
        rounds = iter(range(10**9))  # one release per (run, round)
        for dim in args.dims:
            update = (np.random.default_rng(0).normal(size=dim) * 1e-4).astype(np.float32)
            rng = np.random.Generator(np.random.PCG64(1))
            old = _median_seconds(
                lambda: (update.astype(np.float64) + rng.normal(0.0, std, dim)).astype(np.float32), args.repeats
            )
            gamma = noise_grid(std)[0]
            new = _median_seconds(
                lambda: add_grid_noise(snap_toward_zero([update], gamma), std, NoiseStream()), args.repeats
            )
            release = _median_seconds(
                lambda: client.release(RoundSpec("bench", next(rounds), z, clip), [update]), args.repeats
            )
            print(f"{dim:>12,}  {old:>15.4f}  {new:>14.4f}  {new / old:>6.2f}  {release:>11.4f}")


if __name__ == "__main__":
    main()
