"""The ``fedfilter`` command: one sub-command per module in ``COMMAND_MODULES``.

Each module defines ``register(subparsers)``, which adds its sub-command(s) and sets
``func`` (called with the parsed arguments, returning an exit code) as a default. The modules import
only the core dependencies at load time, so ``pip install fedfilter`` runs every command's ``--help``
and the light commands; a command that needs an extra says which (``EXTRA_OF``).
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = [
    "fedfilter.cli.rounds",  # rounds (how many rounds a budget buys)
    "fedfilter.cli.epsilon",  # epsilon (the budget a planned run needs)
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

# Top-level modules that only pyproject's extras install -> the extra (a command that imports one of
# them on a core install gets one line naming the extra, not a traceback).
EXTRA_OF = {"torch": "app", "sklearn": "app", "matplotlib": "app", "tqdm": "app", "ray": "app", "h5py": "study"}


def build_parser() -> argparse.ArgumentParser:
    """The ``fedfilter`` parser with every sub-command of ``COMMAND_MODULES``.

    Returns
    -------
    argparse.ArgumentParser
        The parser; each sub-command sets ``func`` (its handler) as a default.

    Examples
    --------
    >>> build_parser().parse_args(["rounds", "--epsilon", "8", "--delta", "1e-5", "--noise-multiplier", "1"]).command
    'rounds'
    """
    parser = argparse.ArgumentParser(
        prog="fedfilter",
        description="Individual privacy filters for Flower federations.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one ``fedfilter`` sub-command; bad input and a missing extra print one line and return 2.

    Parameters
    ----------
    argv : list of str, optional
        The arguments after ``fedfilter`` (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        The exit code.

    Examples
    --------
    >>> main(["odometer", "--kind", "gdp", "--mus", "0.5,0.5", "--delta-g", "1e-5"])
    odometer gdp: epsilon=4.27687 at delta=1e-05, valid at every round at once
    0
    """
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
    except ModuleNotFoundError as err:
        needed = EXTRA_OF.get((err.name or "").split(".")[0])
        if needed is None:
            raise
        print(
            f"fedfilter: error: fedfilter {args.command} needs {err.name}, which comes with the '{needed}' "
            f'extra: pip install "fedfilter[{needed}]"',
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":
    sys.exit(main())
