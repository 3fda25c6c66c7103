"""Can a coordinator tell a device's budget state or data size from when its reply arrives?

    python benchmarks/reply_timing.py [--replies 200] [--hold 0.1] [--local-epochs 2] [--json FILE]

Drives the built-in ClientApp (``fedfilter.app.client_app.make_client_app()``: the real
``individual_filter_mod`` around the real digits train handler) directly with hand-built train
Messages, as a SuperNode would, for three devices with their own ledgers:

* ``large``      partition 9 of digits (Dirichlet alpha 0.5, 10 clients): 203 examples, budget left;
* ``small``      partition 8: 65 examples, budget left;
* ``exhausted``  partition 9 again (the same data as ``large``), budget spent in a warm-up round,
                 so it answers with pure noise (``noise-only``).

Two comparisons: budget state (``large`` contributing vs ``exhausted`` noise-only) and data size
(``small`` vs ``large``). Each is measured on two observables: the reply time (from handing the
message to the app to getting the reply back) and the reply's own ``metadata.created_at`` minus
the request's. Replies are interleaved in a random order per step, so machine load hits every
device alike; the phase with ``reply-hold-s = 0`` (off) runs first, then the one with the hold.

For each comparison: medians, the two-sided Mann-Whitney U p-value (scipy.stats), and the
accuracy of the best one-threshold classifier (the best cut of the pooled sample, either
direction; 50 % is chance). The hold passes when p > 0.01 and the accuracy stays below 60 %.
Under no difference, with 200 replies per device the best cut reaches 58 % in about 1 run of
100 (Kolmogorov-Smirnov: the best cut's accuracy is 0.5 + D/2).

The script checks what it claims: every reply is a "report" of the model's shapes and dtypes,
and each device's ledger says it contributed (or, ``exhausted``, sent noise) in every timed round.
Exit code 1 if the hold fails the criterion.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped

from harness.reply_timing import measure  # noqa: E402

from fedfilter.app.client_app import make_client_app  # noqa: E402

P_MIN, ACCURACY_MAX = 0.01, 0.60


def passes(row: dict) -> bool:
    return row["p"] > P_MIN and row["accuracy"] < ACCURACY_MAX


def report(result: dict) -> str:
    lines = []
    for phase in result["phases"]:
        hold = phase["hold_s"]
        head = f"hold {hold:g} s" if hold > 0 else "hold off (reply-hold-s = 0)"
        lines.append(
            f"{head}: {result['replies']} replies per device, local-epochs "
            f"{result['local_epochs']}, {phase['seconds']:g} s"
            + (f", overruns (replies >= 2 x hold) {phase['overruns']}" if hold > 0 else "")
        )
        lines.append(
            f"  {'comparison':<13} {'observable':<11} {'median a ms':>14} {'median b ms':>14} "
            f"{'MW p':>9} {'best cut':>9} {'at ms':>9}  verdict"
        )
        for r in phase["rows"]:
            verdict = "no detectable difference" if passes(r) else "LEAKS"
            lines.append(
                f"  {r['comparison']:<13} {r['observable']:<11} "
                f"{r['a'] + ' ' + format(r['median_a_ms'], '.2f'):>14} "
                f"{r['b'] + ' ' + format(r['median_b_ms'], '.2f'):>14} {r['p']:>9.2g} "
                f"{100 * r['accuracy']:>8.1f}% {r['threshold_ms']:>9.2f}  {verdict}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=200, help="timed replies per device and phase")
    parser.add_argument("--hold", type=float, default=0.1, help="reply-hold-s of the protected phase")
    parser.add_argument("--local-epochs", type=int, default=2, help="the coordinator's local-epochs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.replies < 3 or not args.hold > 0 or args.local_epochs < 1:
        parser.error(
            f"need --replies >= 3, --hold > 0, --local-epochs >= 1. Found {args.replies}, "
            f"{args.hold}, {args.local_epochs}."
        )
    import flwr
    import torch

    logging.getLogger("fedfilter.client").setLevel(logging.ERROR)  # overruns are counted instead
    started = time.monotonic()
    result = measure(make_client_app(), args.replies, [0.0, args.hold], local_epochs=args.local_epochs, seed=args.seed)
    print(
        f"Flower {flwr.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; built-in ClientApp (digits MLP), "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    held = [r for p in result["phases"] if p["hold_s"] > 0 for r in p["rows"]]
    return 0 if all(passes(r) for r in held) else 1


if __name__ == "__main__":
    raise SystemExit(main())
