"""``fedfilter apps approve|list|revoke``: the apps this device's owner lets run (``client/runtime/approval.py``).

    fedfilter apps approve PATH      # an app directory (the FAB `flwr run PATH` builds) or a .fab file
    fedfilter apps list [--json]
    fedfilter apps revoke HASH       # the full hash or at least its first 8 hex digits

The list lives in the owner's state directory (``FEDFILTER_STATE_DIR``, else XDG state).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``apps approve``, ``apps list`` and ``apps revoke`` to the ``fedfilter`` command.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["apps", "revoke", "0123abcd"])
    >>> args.apps_command, args.hash
    ('revoke', '0123abcd')
    """
    parser = subparsers.add_parser(
        "apps",
        help="the apps this device's owner approved (the only code the device runs)",
        description="Approve, list or revoke the Flower apps this device runs. A device runs only "
        "approved apps, always inside its own privacy filter; nothing the coordinator sends can approve one.",
    )
    sub = parser.add_subparsers(dest="apps_command", required=True)
    approve = sub.add_parser("approve", help="approve an app directory or a .fab file")
    approve.add_argument(
        "path", type=Path, metavar="PATH", help="an app directory (the FAB `flwr run` builds from it) or a .fab file"
    )
    approve.set_defaults(func=_approve)
    listing = sub.add_parser("list", help="list the approved apps")
    listing.add_argument("--json", action="store_true", help="print the approved apps as JSON")
    listing.set_defaults(func=_list)
    revoke = sub.add_parser("revoke", help="revoke an approval by its hash")
    revoke.add_argument("hash", metavar="HASH", help="the approved FAB hash, or at least its first 8 hex digits")
    revoke.set_defaults(func=_revoke)


def _approve(args: argparse.Namespace) -> int:
    from fedfilter.client.runtime.approval import approvals_path, approve

    entry = approve(args.path)
    how = f"component {entry.clientapp} (from installed packages) and hash" if entry.clientapp else "hash"
    print(f"approved {entry.source} by {how} {entry.hash}")
    print(f"approved apps: {approvals_path()}")
    return 0


def _list(args: argparse.Namespace) -> int:
    from fedfilter.client.runtime.approval import approvals_path, load_approved

    apps = load_approved()
    if args.json:
        print(json.dumps([a.to_json() for a in apps], indent=2))
        return 0
    print(f"{len(apps)} approved app(s) in {approvals_path()}")
    for a in apps:
        print(f"{a.hash}  {'component ' + a.clientapp if a.clientapp else 'hash only'}  {a.source}  ({a.approved_at})")
    return 0


def _revoke(args: argparse.Namespace) -> int:
    from fedfilter.client.runtime.approval import revoke

    for entry in revoke(args.hash):
        print(f"revoked {entry.hash} ({entry.source})")
    return 0
