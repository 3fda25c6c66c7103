"""Exact Skellam noise against the exact rounded Gaussian, samples per second, in one run.

    python benchmarks/skellam_speed.py [--mus 50 100000 10000000] [--size 1000000] [--repeats 5]

For each ``mu``: the one-off table build (cached per mu), then the median over ``--repeats`` of
``skellam_noise(mu, size)`` and of ``rounded_gaussian(sqrt(mu), size)`` (same variance), each from a fresh
ChaCha20 stream, and their ratio; also how many samples went to the exact path.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from fedfilter.client.mechanisms import skellam_noise as sn
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream, rounded_gaussian


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mus", type=float, nargs="+", default=[50.0, 1e5, 1e7])
    parser.add_argument("--size", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    exact_calls = [0]
    exact = sn._exact_magnitude

    def counting(*a):
        exact_calls[0] += 1
        return exact(*a)

    sn._exact_magnitude = counting
    header = f"{'mu':>10}  {'table (s)':>9}  {'skellam (M/s)':>13}  {'gaussian (M/s)':>14}  {'ratio':>5}"
    print(f"{header}  {'exact path':>10}")
    for mu in args.mus:
        sn._fast_table.cache_clear()
        start = time.perf_counter()
        sn._fast_table(mu)
        build = time.perf_counter() - start
        exact_calls[0] = 0
        t_sk = _median_seconds(lambda: sn.skellam_noise(mu, args.size, NoiseStream()), args.repeats)
        t_g = _median_seconds(lambda: rounded_gaussian(math.sqrt(mu), args.size, NoiseStream()), args.repeats)
        rate_sk, rate_g = args.size / t_sk / 1e6, args.size / t_g / 1e6
        print(f"{mu:>10g}  {build:>9.3f}  {rate_sk:>13.2f}  {rate_g:>14.2f}  {t_sk / t_g:>5.2f}  {exact_calls[0]:>10}")


if __name__ == "__main__":
    main()
