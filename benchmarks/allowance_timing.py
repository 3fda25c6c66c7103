"""Can the time of the filter decision tell an exhausted client from a contributing one?

    python benchmarks/allowance_timing.py [--samples 195] [--release]

Times ``round_allowance`` + ``exhausted`` (what ``FilteredClient.release`` runs on every round,
with the ledger's run filter) on a fresh state and on a state spent to its allowance, interleaved,
and prints the medians and the accuracy of the best one-threshold classifier on the time; the same
classifier between two samples of the fresh state shows what chance alone reaches. (Before the allowance did
constant work, the classifier reached 97.7 % on whole replies.) With ``--release``,
the same for a whole ``FilteredClient.release`` of a 100k-parameter update (SQLite commit
included) by a contributing and by an exhausted noise-only client.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedfilter.client.ledger.budget import BudgetLedger  # noqa: E402
from fedfilter.client.release import FilteredClient  # noqa: E402
from fedfilter.privacy.filters import exhausted, make_filter, round_allowance  # noqa: E402
from fedfilter.protocol.request import RoundSpec  # noqa: E402


def best_threshold_accuracy(a: np.ndarray, b: np.ndarray) -> float:
    """Accuracy of the best rule "time <= t means class a" (or its mirror) over both samples."""
    times = np.concatenate([a, b])
    labels = np.concatenate([np.zeros(len(a)), np.ones(len(b))])[np.argsort(times)]
    # Predict "a" for the first i sorted times and "b" for the rest, for every split i.
    a_before = np.concatenate([[0], np.cumsum(labels == 0)])
    b_after = np.concatenate([np.cumsum((labels == 1)[::-1])[::-1], [0]])
    correct = a_before + b_after
    best = correct.max() / len(times)
    return float(max(best, 1 - correct.min() / len(times)))


def release_times(samples: int) -> str:
    update = [np.random.default_rng(0).normal(size=100_000).astype(np.float32)]
    with tempfile.TemporaryDirectory() as d:
        live = FilteredClient(BudgetLedger.enrol(Path(d) / "live", client_id="live", epsilon=1e6, delta=1e-5))
        spent = FilteredClient(BudgetLedger.enrol(Path(d) / "spent", client_id="spent", epsilon=0.01, delta=1e-5))
        for r in range(3):  # a few full rounds exhaust epsilon 0.01 at z = 1
            spent.release(RoundSpec("warm", r, 1.0, 1.0), update)
        times = {"contributed": [], "noise-only": []}
        rng = np.random.default_rng(0)
        for r in range(samples):
            for who in rng.permutation([0, 1]):
                client = (live, spent)[who]
                t0 = time.perf_counter()
                status = client.release(RoundSpec("bench", r, 1.0, 1.0), update).status
                times[status].append(time.perf_counter() - t0)
    a, b = np.array(times["contributed"]), np.array(times["noise-only"])
    if len(a) != samples or len(b) != samples:
        raise RuntimeError(f"expected {samples} releases of each kind; got {len(a)} and {len(b)}")
    return (
        f"FilteredClient.release, {samples} each: contributing median {np.median(a) * 1e3:.2f} ms, "
        f"noise-only median {np.median(b) * 1e3:.2f} ms, classifier accuracy {best_threshold_accuracy(a, b):.1%}"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=195)
    parser.add_argument("--release", action="store_true", help="also time whole releases")
    args = parser.parse_args()
    print(
        f"{'filter':<6} {'fresh median (us)':>18} {'exhausted median (us)':>22} {'classifier accuracy':>20}"
        f" {'fresh vs fresh (chance)':>24}"
    )
    for kind in ("gdp", "rdp", "zcdp"):
        filt = make_filter(kind, 1.0, 1e-5)
        run_filt = filt.scaled(1.0)
        std, clip = 1.0, 1.0
        fresh = filt.initial_state()
        spent = filt.spend(fresh, filt.charge(sensitivity=float(filt.allowance(fresh, noise_std=std)), noise_std=std))

        def decide(state):
            t0 = time.perf_counter()
            allow = round_allowance(filt, state, noise_std=std, clip=clip, run_filter=run_filt, run_state=state)
            exhausted(allow, clip, 1e-3)
            return time.perf_counter() - t0

        assert not exhausted(round_allowance(filt, fresh, noise_std=std, clip=clip), clip, 1e-3)
        assert exhausted(round_allowance(filt, spent, noise_std=std, clip=clip), clip, 1e-3)
        for _ in range(20):  # warm up
            decide(fresh), decide(spent)
        rng = np.random.default_rng(0)
        runs = {"a": [], "b": [], "c": []}
        for _ in range(args.samples):  # interleaved in a random order: the same load, no position effect
            for key in rng.permutation(["a", "b", "c"]):
                runs[key].append(decide(spent if key == "b" else fresh))
        a, b, c = (np.array(runs[k]) for k in "abc")
        print(
            f"{kind:<6} {np.median(a) * 1e6:>18.1f} {np.median(b) * 1e6:>22.1f} "
            f"{best_threshold_accuracy(a, b):>19.1%} {best_threshold_accuracy(a, c):>24.1%}"
        )
    if args.release:
        print(release_times(args.samples))


if __name__ == "__main__":
    main()
