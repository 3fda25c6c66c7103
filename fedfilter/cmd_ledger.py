"""``fedfilter ledger show|enrol``: the device owner's view of its lifelong budget.

Enrolment is the owner's act and the only way a device gets a budget: the Flower mod never
enrols, so a lost ledger is refused until the owner runs ``enrol`` again and says, with
``--recover``, what to do about what was lost.
"""

from __future__ import annotations

import argparse
import json
import sys

from fedfilter.client.ledger import RECOVER, BudgetLedger, LedgerError, Quotas
from fedfilter.client.ledger_report import odometer_report
from fedfilter.client.privacy.filters import FILTER_KINDS


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
    print(f"  spent            epsilon={s['spent_epsilon']:.4f}  (the filter's readout; its guarantee is the budget)")
    odo = s["odometer"]
    print(
        f"  odometer         epsilon={odo['epsilon']:.4f}  delta={odo['delta']:g}"
        "  (valid now, also if the device stops now)"
    )
    print(f"  remaining        {s['remaining_fraction']:.1%} of the budget")
    if not s["runs"]:
        print("  no runs yet")
        return 0
    print(f"\n  {'run':<24} {'rounds':>6} {'contrib':>7} {'noise':>6} {'left':>5} {'spent eps':>10}")
    for r in s["runs"]:
        print(
            f"  {r['run_id']:<24} {r['rounds']:>6} {r['contributed']:>7} {r['noise_only']:>6} {r['left']:>5} "
            f"{r['spent_epsilon']:>10.4f}"
        )
    print(f"\n  {'federation':<24} {'rounds':>6} {'spent eps':>10} {'odometer':>9}")
    for c in s["coordinators"]:
        spent = "(before quotas)" if c["spent_epsilon"] is None else f"{c['spent_epsilon']:.4f}"
        odo_c = odo["coordinators"].get(c["federation"])
        odo_text = "-" if odo_c is None else f"{odo_c:.4f}"
        print(f"  {c['federation'] or '-':<24} {c['rounds']:>6} {spent:>10} {odo_text:>9}")
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
    )
    note = f" (recovered: {args.recover})" if args.recover else ""
    print(
        f"enrolled {ledger.enrolment.client_id}: epsilon={args.epsilon:g} delta={args.delta:g} "
        f"filter={args.filter} in {args.dir}{note}"
    )
    ledger.close()
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ledger", help="a device's lifetime budget ledger")
    lsub = p.add_subparsers(dest="ledger_command", required=True)
    show = lsub.add_parser("show", help="lifetime budget, spent, remaining and spending per run")
    show.add_argument("--dir", required=True, help="the device's ledger directory")
    show.add_argument("--json", action="store_true")
    show.set_defaults(func=_show)
    enrol = lsub.add_parser("enrol", help="set the device's personal budget (once, for life)")
    enrol.add_argument("--dir", required=True)
    enrol.add_argument("--client-id", required=True)
    enrol.add_argument("--epsilon", type=float, required=True)
    enrol.add_argument("--delta", type=float, required=True)
    enrol.add_argument("--filter", choices=list(FILTER_KINDS), default="gdp")
    enrol.add_argument("--run-quota", type=float, default=1.0, help="share of the budget one run may spend")
    enrol.add_argument(
        "--recover",
        choices=list(RECOVER),
        default=None,
        help="only for a device whose ledger was lost or damaged: 'reseal' accepts the "
        "database as it is now (spends it lost are forgotten), 'replace' moves the old "
        "files to a lost-* folder and starts a new ledger (a fresh budget)",
    )
    enrol.set_defaults(func=_enrol)
