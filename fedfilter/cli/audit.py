"""``fedfilter audit``: measure the privacy guarantee with canary devices (see fedfilter/audit/)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path


def _default_tmp() -> str:
    # Canary ledgers are throw-away: a RAM disk spares the disk thousands of durable commits.
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else tempfile.gettempdir()


def _audit(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from fedfilter.audit import report
    from fedfilter.audit.outputs import write_outputs
    from fedfilter.audit.run import DTYPES, run_audit

    dtypes = list(DTYPES) if args.dtype == "both" else [args.dtype]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tqdm(
        total=args.trials * len(dtypes),
        unit="trial",
        desc="canary pairs",
        file=sys.stderr,
        mininterval=1.0,
        disable=args.no_progress,
    ) as bar:
        result = run_audit(
            epsilon=args.epsilon,
            delta=args.delta,
            trials=args.trials,
            dtypes=dtypes,
            rounds=args.rounds,
            filter_kind=args.filter,
            alpha=args.alpha,
            threshold=args.threshold,
            seed=args.seed,
            tmp_dir=args.tmp_dir or _default_tmp(),
            progress=bar.update,
            reply_hold_s=args.reply_hold_s,
            keep_runs=True,
        )
    written = write_outputs(result, result.pop("_runs"), out)
    text = report.table(result)
    if args.json:
        print(text, file=sys.stderr)
        print(json.dumps(result))
    else:
        print(text)
        print(f"\nwrote {', '.join(str(path) for path in written)}")
    return 1 if args.strict and not result["passed"] else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``audit`` (canary devices through the real mod) to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["audit", "--epsilon", "2", "--out", "runs/audit", "--dtype", "float32"])
    >>> args.trials, args.rounds, args.filter
    (1000, 3, 'gdp')
    """
    p = sub.add_parser(
        "audit",
        help="measure the privacy guarantee with canary devices through the real mod",
        description="A distinguishing game between a canary update of norm C and no data, "
        "played by fresh canary devices through the real ClientApp and filter mod, "
        "and the exhaustion distinguishers (bits, time, bytes of a noise-only "
        "reply vs a contributing one).",
    )
    p.add_argument("--epsilon", type=float, required=True, help="claimed per-device budget epsilon")
    p.add_argument("--delta", type=float, default=1e-5, help="claimed per-device delta (default %(default)s)")
    p.add_argument("--trials", type=int, default=1000, help="pairs of canary devices (one per world) per model dtype")
    p.add_argument("--out", required=True, help="directory for audit.json, audit.png, audit_trials.npz")
    p.add_argument(
        "--dtype", choices=["float32", "float64", "both"], default="both", help="the model dtype the coordinator sends"
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="full-norm rounds that exhaust the budget (sets the noise multiplier)"
    )
    p.add_argument("--filter", choices=["gdp", "zcdp", "rdp"], default="gdp", help="the canaries' privacy filter")
    p.add_argument("--alpha", type=float, default=0.05, help="1 - confidence of every bound")
    p.add_argument(
        "--threshold",
        choices=["planned", "split"],
        default="planned",
        help="fix the game's thresholds from the claim before the trials, or choose them on half",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="reproducible audit, device noise included (default: OS randomness, as deployed)",
    )
    p.add_argument(
        "--tmp-dir", default=None, help="where the throw-away canary ledgers go (default: a RAM disk if any)"
    )
    p.add_argument(
        "--reply-hold-s",
        type=float,
        default=0.02,
        help="the devices' reply hold in the probe round timed by the timing distinguishers "
        "(deployed devices default to 60 s; 0 turns timing protection off)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object (the table goes to stderr)")
    p.add_argument("--strict", action="store_true", help="exit 1 if a bound exceeds the claim or exhaustion shows")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=_audit)
