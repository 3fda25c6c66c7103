"""The ``fedfilter`` command: one sub-command per module in ``COMMAND_MODULES``.

Each module defines ``register(subparsers)``, which adds its sub-command(s) and sets
``func`` (called with the parsed arguments, returning an exit code) as a default.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "fedfilter.cli.rounds",  # rounds, epsilon
    "fedfilter.cli.plan",  # plan (the federation: noise in the mean, rounds afforded)
    "fedfilter.cli.ledger",  # ledger show / enrol
    "fedfilter.cli.reports",  # reports serve / watch
    "fedfilter.cli.demo",  # demo (Flower simulation)
    "fedfilter.cli.deploy_local",  # deploy-local
    "fedfilter.cli.apps",  # apps approve / list / revoke (the device owner's)
    "fedfilter.cli.supernode",  # supernode (the device owner's Flower SuperNode)
    "fedfilter.cli.study",  # study dropout
    "fedfilter.cli.audit",  # audit (canary devices through the real mod)
    "fedfilter.cli.odometer",  # odometer (privacy loss so far, valid at any moment)
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fedfilter",
        description="Individual privacy filters for Flower federations.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    passthrough = getattr(args, "passthrough", None)
    if passthrough is None and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if passthrough is not None:  # a command that hands the flags it does not know to another program
        setattr(args, passthrough, extra)
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:  # bad input: one clear line, no traceback
        print(f"fedfilter: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
