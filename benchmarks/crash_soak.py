"""Soak: kill -9 the spending loop many times (default 300) and audit the ledger after each kill.

python benchmarks/crash_soak.py --cycles 300
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped
from harness.crash import run_cycles  # noqa: E402
from tqdm import tqdm  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--cycles", type=int, default=300)
    ap.add_argument("--max-delay", type=float, default=0.3)
    args = ap.parse_args()
    t0 = time.time()
    with tempfile.TemporaryDirectory() as d:
        history = []
        for i in tqdm(range(args.cycles), desc="kill -9 cycles"):
            history += run_cycles(Path(d), 1, args.max_delay, seed=i)
    released, recorded = history[-1]
    print(
        f"{args.cycles} kills in {time.time() - t0:.0f} s: every audit passed "
        f"(integrity ok, spent >= released, spent <= budget)."
    )
    print(
        f"rounds released {released}, spends recorded {recorded}: "
        f"{recorded - released} spends were committed but never released (wasted, never lost)."
    )


if __name__ == "__main__":
    main()
