"""``fedfilter supernode``: the owner's command that connects a device to a federation.

    fedfilter supernode [--secure-aggregation] [--allow-message-type query|evaluate]
                        FLOWER_SUPERNODE_FLAGS...   (--superlink, --root-certificates,
                        --auth-supernode-private-key, --node-config, --host, --port, ...)

Starts Flower's ``flower-supernode`` with every flag given (and ``--isolation process``) plus the
device's own ClientApp runtime (``fedfilter.client.runtime.runner``): only apps the owner approved
(``fedfilter apps approve``) run, each inside the device's privacy filter. See docs/deployment.md.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``supernode`` to the ``fedfilter`` command; flags it does not know go to ``flower-supernode``.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args, flower_flags = parser.parse_known_args(["supernode", "--secure-aggregation", "--superlink", "h:9092"])
    >>> args.secure_aggregation, flower_flags, args.passthrough
    (True, ['--superlink', 'h:9092'], 'flower_args')
    """
    parser = subparsers.add_parser(
        "supernode",
        allow_abbrev=False,
        help="start Flower's SuperNode with the device's runtime: approved apps only, inside its filter",
        description="Start flower-supernode (all unrecognised flags are passed to it; --isolation process is "
        "set here) and the device's ClientApp runtime: only apps approved with `fedfilter apps approve` run, "
        "always inside the device's individual privacy filter.",
    )
    parser.add_argument(
        "--secure-aggregation",
        action="store_true",
        help="allow distributed placement: SecAgg+ rounds (secure_aggregation_mod around the filter)",
    )
    parser.add_argument(
        "--allow-message-type",
        action="append",
        default=[],
        metavar="TYPE",
        help="also answer this message type (query or evaluate; default: train only). Query answers are "
        "outside the privacy filter; evaluate stays refused by the filter",
    )
    parser.set_defaults(func=_supernode, passthrough="flower_args")


def _supernode(args: argparse.Namespace) -> int:
    from fedfilter.client.runtime.runner import run_supernode

    def _interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _interrupt) if in_main else None
    try:
        return run_supernode(
            args.flower_args,
            secure_aggregation=args.secure_aggregation,
            allow_message_types=args.allow_message_type,
            echo=lambda line: print(line, flush=True),
        )
    except KeyboardInterrupt:
        return 0
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
