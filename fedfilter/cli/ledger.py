"""``fedfilter ledger show|enrol|migrate|accept-restore|worst-case``: the device owner's view of its lifelong budget.

Enrolment is the owner's act and the only way a device gets a budget: the Flower mod never
enrols, so a lost ledger is refused until the owner runs ``enrol`` again and says, with
``--recover``, what to do about what was lost. Likewise only the owner migrates an older format
(``migrate``) or accepts a ledger that is behind its roll-back anchor (``accept-restore``, which
shows the budget at risk and acts only with ``--confirm``). ``worst-case`` adds the budget against
any coordinator (``client/ledger/worst_case.py``) to a ledger enrolled without one.
"""

from __future__ import annotations

import argparse
import json
import sys

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.owner import LedgerView, accept_restore, inspect, migrate
from fedfilter.client.ledger.quota import Quotas
from fedfilter.client.ledger.report import odometer_report
from fedfilter.client.ledger.schema import RECOVER
from fedfilter.client.ledger.storage import LedgerError
from fedfilter.client.ledger.worst_case import SETTING, guarantee_lines
from fedfilter.privacy.filters import FILTER_KINDS


def _owner_errors(func):
    """A ledger the device refuses to use: one clear line for the owner, no traceback."""

    def wrapped(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except LedgerError as err:
            print(f"fedfilter: error: {err}", file=sys.stderr)
            return 2  # as the CLI's other input errors

    return wrapped


@_owner_errors
def _show(args: argparse.Namespace) -> int:
    ledger = BudgetLedger.open(args.dir)
    try:
        s = ledger.summary()
        s["odometer"] = odometer_report(ledger, [c["federation"] for c in s["coordinators"]])
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"device {s['client_id']}  ledger {args.dir}")
    print(
        f"  lifetime budget  epsilon={s['budget_epsilon']:g}  delta={s['budget_delta']:g}  filter={s['filter']}"
        f"  per-run quota={s['run_quota']:.0%}"
    )
    print(
        f"  spent            epsilon={s['spent_epsilon']:.4f}  (the filter's readout, at most the budget; "
        "the guarantee is the budget, which the filter enforces)"
    )
    odo = s["odometer"]
    # The odometer bounds the loss at every moment at once (it holds even if the device stops now), a
    # looser accountant than the filter's: beside the budget it can read higher without any overspend.
    print(
        f"  odometer         epsilon={odo['epsilon']:.4f}  delta={odo['delta']:g}  (not a spend: a running "
        "upper bound on the loss so far, valid at every moment, by a looser accountant than the filter's; "
        "it can read above the budget, which the filter still holds)"
    )
    print(f"  remaining        {s['remaining_fraction']:.1%} of the budget")
    w = s["worst_case"]
    if w is None:
        print(f"  worst case       no {SETTING}: this device refuses distributed rounds")
    else:
        print(
            f"  worst case       epsilon={w['budget_epsilon']:g}  spent epsilon={w['spent_epsilon']:.4f}  "
            f"remaining {w['remaining_fraction']:.1%}"
            + (f"  ({w['spends_before']} earlier spends charged conservatively)" if w["spends_before"] else "")
        )
    worst_eps = None if w is None else w["budget_epsilon"]
    for line in guarantee_lines(s["budget_epsilon"], worst_eps, s["budget_delta"]):
        print(f"  guarantee        {line}")
    if not s["runs"]:
        print("  no runs yet")
        return 0
    print(f"\n  {'run':<24} {'rounds':>6} {'contrib':>7} {'noise':>6} {'left':>5} {'spent eps':>10}")
    for r in s["runs"]:
        print(
            f"  {r['run_id']:<24} {r['rounds']:>6} {r['contributed']:>7} {r['noise_only']:>6} {r['left']:>5} "
            f"{r['spent_epsilon']:>10.4f}"
        )
    print(f"\n  {'federation':<24} {'rounds':>6} {'spent eps':>10} {'odometer*':>9}")
    for c in s["coordinators"]:
        spent = "(before quotas)" if c["spent_epsilon"] is None else f"{c['spent_epsilon']:.4f}"
        odo_c = odo["coordinators"].get(c["federation"])
        odo_text = "-" if odo_c is None else f"{odo_c:.4f}"
        print(f"  {c['federation'] or '-':<24} {c['rounds']:>6} {spent:>10} {odo_text:>9}")
    print("  * odometer: not a spend; a running upper bound by a looser accountant (see above)")
    return 0


@_owner_errors
def _enrol(args: argparse.Namespace) -> int:
    ledger = BudgetLedger.enrol(
        args.dir,
        client_id=args.client_id,
        epsilon=args.epsilon,
        delta=args.delta,
        filter_kind=args.filter,
        run_quota=args.run_quota,
        quotas=Quotas(),
        recover=args.recover,
        worst_case_epsilon=args.worst_case_epsilon,
        orders=None if args.rdp_order is None else [args.rdp_order],
    )
    note = f" (recovered: {args.recover})" if args.recover else ""
    worst = "" if args.worst_case_epsilon is None else f" {SETTING}={args.worst_case_epsilon:g}"
    print(
        f"enrolled {ledger.enrolment.client_id}: epsilon={args.epsilon:g} delta={args.delta:g}{worst} "
        f"filter={args.filter}{'' if args.rdp_order is None else f' at order {args.rdp_order:g}'} in {args.dir}{note}"
    )
    ledger.close()
    return 0


def _print_view(view: LedgerView, again: str) -> None:
    """The database beside what its anchor and seal name, and the budget at risk (``again``: when it is spent)."""
    at_risk = (
        "unknown (no intact roll-back anchor of this directory names what the device spent)"
        if view.at_risk_epsilon is None
        else f"{view.at_risk_epsilon:.4g}"
    )
    print(f"  database             {view.database}")
    print(f"  roll-back anchor     {view.anchored}  ({view.anchor_file})")
    print(f"  seal                 {view.sealed}")
    print(f"  budget at risk       lifetime epsilon {at_risk}: spent already, and spent again {again}")


@_owner_errors
def _migrate(args: argparse.Namespace) -> int:
    view = inspect(args.dir)  # before migrating: what the anchor and seal name beside the database
    ledger, migrated = migrate(args.dir)
    ledger.close()
    if not migrated:
        print(f"nothing to migrate: the ledger at {args.dir} opens as it is.")
        return 0
    # Migrating keeps the spends the database holds; spends beyond it only an anchor or seal can show.
    print(f"migrated: {args.dir} is in the current format; the spends its database holds are kept as they are.\n")
    _print_view(view, "if this database is not the device's latest")
    return 0


@_owner_errors
def _accept_restore(args: argparse.Namespace) -> int:
    view = inspect(args.dir)
    if view.refused is None:
        print(f"nothing to accept: the ledger at {args.dir} opens as it is.")
        return 0
    print(f"refused now: {view.refused}\n")
    _print_view(view, "if you accept")
    if not args.confirm:
        print("\nnothing changed. To accept this database as the device's ledger, run again with --confirm.")
        return 2
    accept_restore(args.dir)
    print(f"\naccepted: {args.dir} is the device's ledger again (old seal in a lost-* folder, old anchor kept).")
    return 0


@_owner_errors
def _worst_case(args: argparse.Namespace) -> int:
    ledger = BudgetLedger.open(args.dir)
    try:
        wc = ledger.set_worst_case(args.epsilon)
        spent = ledger.summary()["worst_case"]["spent_epsilon"]
    except ValueError as err:
        print(f"fedfilter: error: {err}", file=sys.stderr)
        return 2
    finally:
        ledger.close()
    print(
        f"{SETTING}={wc.epsilon:g} set for {ledger.enrolment.client_id} in {args.dir}; "
        f"{wc.after_seq and f'its {wc.after_seq} earlier spends' or 'no earlier spends'} "
        f"charged conservatively: spent epsilon={spent:.4f}"
    )
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ledger show|enrol|migrate|accept-restore|worst-case`` to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> import tempfile
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     enrol = parser.parse_args(["ledger", "enrol", "--dir", d, "--client-id", "phone-1",
    ...                                "--epsilon", "8", "--delta", "1e-5"])
    ...     _ = enrol.func(enrol)  # doctest: +ELLIPSIS
    ...     show = parser.parse_args(["ledger", "show", "--dir", d])
    ...     _ = show.func(show)  # doctest: +ELLIPSIS
    enrolled phone-1: epsilon=8 delta=1e-05 filter=gdp in /...
    device phone-1  ledger /...
      lifetime budget  epsilon=8  delta=1e-05  filter=gdp  per-run quota=100%
    ...
    """
    p = sub.add_parser("ledger", help="a device's lifetime budget ledger")
    lsub = p.add_subparsers(dest="ledger_command", required=True)
    show = lsub.add_parser("show", help="lifetime budget, spent, remaining and spending per run")
    show.add_argument("--dir", required=True, help="the device's ledger directory")
    show.add_argument("--json", action="store_true", help="print a JSON object")
    show.set_defaults(func=_show)
    enrol = lsub.add_parser("enrol", help="set the device's personal budget (once, for life)")
    enrol.add_argument("--dir", required=True, help="the device's ledger directory (on persistent storage)")
    enrol.add_argument("--client-id", required=True, help="the device's name, stored in its ledger")
    enrol.add_argument("--epsilon", type=float, required=True, help="the device's personal lifetime budget epsilon")
    enrol.add_argument("--delta", type=float, required=True, help="the device's personal delta (e.g. 1e-5)")
    enrol.add_argument(
        "--filter",
        choices=list(FILTER_KINDS),
        default="gdp",
        help="the privacy filter: gdp (Gaussian DP, the most rounds), zcdp, or rdp (Renyi; distributed "
        "noise needs it) (default %(default)s)",
    )
    enrol.add_argument(
        "--rdp-order",
        type=float,
        default=None,
        help="rdp only: the one Renyi order the filter is held at, for a device that samples itself (the "
        "order `fedfilter rounds --sampling-rate` prints for its plan; default: the budget's best for Gaussian rounds)",
    )
    enrol.add_argument("--run-quota", type=float, default=1.0, help="share of the budget one run may spend")
    enrol.add_argument(
        "--recover",
        choices=list(RECOVER),
        default=None,
        help="only for a device whose ledger was lost or damaged: 'reseal' accepts the "
        "database as it is now (spends it lost are forgotten), 'replace' moves the old "
        "files to a lost-* folder and starts a new ledger (a fresh budget)",
    )
    enrol.add_argument(
        "--worst-case-epsilon",
        type=float,
        default=None,
        help="the budget against ANY coordinator, also one that forges SecAgg+ peers and reads one report "
        "alone (at --delta; at least --epsilon). Needed for distributed rounds; set once, for life",
    )
    enrol.set_defaults(func=_enrol)
    mig = lsub.add_parser(
        "migrate",
        help="bring a ledger in an older format up to date (keeps the spends it holds; names the budget at risk)",
    )
    mig.add_argument("--dir", required=True, help="the device's ledger directory")
    mig.set_defaults(func=_migrate)
    acc = lsub.add_parser(
        "accept-restore",
        help="accept a ledger that is behind its roll-back anchor (a restored backup): shows the budget at risk",
    )
    acc.add_argument("--dir", required=True, help="the device's ledger directory")
    acc.add_argument("--confirm", action="store_true", help="accept it (without: only show what is at risk)")
    acc.set_defaults(func=_accept_restore)
    worst = lsub.add_parser(
        "worst-case",
        help=f"set {SETTING} on an enrolled ledger (once, for life): the budget against any coordinator",
    )
    worst.add_argument("--dir", required=True, help="the device's ledger directory")
    worst.add_argument("--epsilon", type=float, required=True, help="at the ledger's delta; at least its epsilon")
    worst.set_defaults(func=_worst_case)
