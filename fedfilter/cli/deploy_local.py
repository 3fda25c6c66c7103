"""``fedfilter deploy-local``: the app on a real Flower Deployment Engine, all on 127.0.0.1.

    fedfilter deploy-local --clients N [--rounds R] [--out DIR] [--app-dir DIR] [--approve-app DIR ...]
                           [--budgets 1,2,4] [--delta 1e-5] [--filter gdp|rdp|zcdp]
                           [--placement local|distributed] [--min-reports M]
                           [--after-exhaustion noise-only|leave] [--min-noise-multiplier S]
                           [--data-dir DIR] [--run-config "k=v ..."] [--reply-hold-s S]
                           [--timeout S] [--verbose]

Starts a SuperLink (TLS, SuperNode authentication), registers one key per device, starts one
SuperNode per device through the owner's command ``fedfilter supernode`` with its own budget ledger
under OUT/devices/<i> and its own owner's state directory OUT/owners/<i> (approving the
``--approve-app`` apps, default the ``--app-dir`` app), runs the app with
``flwr run``, stops every process, and writes OUT/summary.json. See docs/deployment.md.
``--placement distributed`` runs distributed rounds: Skellam noise shares summed by SecAgg+
(the devices' ``rdp`` filter accounts them; a round with fewer than ``--min-reports`` reports,
default ``ceil(clients / 2)``, is never unmasked nor released).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from typing import Any

from fedfilter.protocol.request import AFTER_EXHAUSTION, PLACEMENTS


def _budgets(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated epsilons such as 1,2,4. Found {text!r}.") from None


def _run_config(text: str) -> dict[str, Any]:
    from fedfilter.protocol.flower_api import parse_config_args

    return dict(parse_config_args([text]))


def register(subparsers: Any) -> None:
    """Add ``deploy-local`` to the ``fedfilter`` command.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["deploy-local", "--clients", "3"])
    >>> args.clients, args.rounds
    (3, 2)
    """
    parser = subparsers.add_parser(
        "deploy-local",
        help="run the app on a local Flower Deployment Engine (TLS + node auth, 127.0.0.1)",
        description="Start a SuperLink and one SuperNode per device on 127.0.0.1 with TLS and "
        "SuperNode authentication, run the app with `flwr run`, stop every process "
        "and write OUT/summary.json.",
    )
    parser.add_argument("--clients", type=int, required=True, help="number of SuperNodes")
    parser.add_argument("--rounds", type=int, default=2, help="server rounds (default 2)")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("out/deploy"),
        help="output directory: certificates, keys, device ledgers, logs, "
        "summary.json (default out/deploy); device ledgers in it persist "
        "across invocations",
    )
    parser.add_argument(
        "--app-dir", type=Path, default=None, help="a Flower app directory (default: the built-in app, fedfilter/app)"
    )
    parser.add_argument(
        "--approve-app",
        type=Path,
        action="append",
        default=[],
        metavar="DIR",
        help="an app every simulated device owner approves (repeatable; default: the --app-dir app). "
        "Devices run only approved apps",
    )
    parser.add_argument(
        "--budgets",
        type=_budgets,
        default=(1.0, 2.0, 4.0),
        metavar="EPS,...",
        help="personal epsilon of each device, cycled (default 1,2,4)",
    )
    parser.add_argument("--delta", type=float, default=1e-5, help="every device's delta")
    parser.add_argument(
        "--filter",
        dest="filter_kind",
        default=None,
        metavar="KIND",
        help="privacy filter of every device: gdp, rdp or zcdp (default gdp; rdp with --placement distributed)",
    )
    parser.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="local",
        help="local: every report carries the full noise; distributed: Skellam noise shares summed by "
        "SecAgg+ (default local)",
    )
    parser.add_argument(
        "--min-reports",
        type=int,
        default=None,
        metavar="M",
        help="distributed: the SecAgg+ threshold, the fewest reports a round is released from "
        "(default ceil(clients / 2))",
    )
    parser.add_argument(
        "--after-exhaustion",
        choices=AFTER_EXHAUSTION,
        default="noise-only",
        help="what a device does once its budget is spent",
    )
    parser.add_argument(
        "--min-noise-multiplier",
        type=float,
        default=None,
        help="the smallest noise multiplier a device accepts (default: the client's own default)",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=None,
        help="root of the offline data sets, passed to every device as "
        "node-config data-dir (default: the task's own default)",
    )
    parser.add_argument(
        "--run-config",
        type=_run_config,
        default={},
        metavar='"k=v ..."',
        help="further overrides of the app's [tool.flwr.app.config]",
    )
    parser.add_argument(
        "--reply-hold-s",
        type=float,
        default=0.0,
        metavar="S",
        help="every device's reply-hold-s (default 0: timing protection off for a "
        "fast local trial; real devices default to 60)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="S",
        help="seconds the run may take before it is stopped (default 600)",
    )
    parser.add_argument("--verbose", action="store_true", help="echo every line of `flwr run --stream`")
    parser.set_defaults(func=_deploy)


def _deploy(args: argparse.Namespace) -> int:
    from fedfilter.deploy.command import BUILTIN_APP_DIR, DeployOptions, deploy_local

    options = DeployOptions(
        clients=args.clients,
        rounds=args.rounds,
        out=args.out,
        app_dir=args.app_dir or BUILTIN_APP_DIR,
        approve_apps=tuple(args.approve_app),
        budgets=args.budgets,
        delta=args.delta,
        filter_kind=args.filter_kind,
        placement=args.placement,
        min_reports=args.min_reports,
        after_exhaustion=args.after_exhaustion,
        min_noise_multiplier=args.min_noise_multiplier,
        data_dir=args.data_dir,
        run_config=args.run_config,
        reply_hold_s=args.reply_hold_s,
        timeout_s=args.timeout,
        verbose=args.verbose,
    )

    # SIGTERM ends the command like Ctrl-C does: through the cluster's teardown.
    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None
    try:
        return deploy_local(options, echo=lambda line: print(line, flush=True))
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
