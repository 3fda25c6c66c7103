"""``fedfilter ledger show|enrol``: the device owner's view of its lifelong budget."""

from __future__ import annotations

import argparse
import json

from client.ledger import BudgetLedger
from client.privacy.filters import FILTER_KINDS


def _show(args: argparse.Namespace) -> int:
    ledger = BudgetLedger.open(args.dir)
    try:
        s = ledger.summary()
    finally:
        ledger.close()
    if args.json:
        print(json.dumps(s))
        return 0
    print(f"device {s['client_id']}  ledger {args.dir}")
    print(f"  lifetime budget  epsilon={s['budget_epsilon']:g}  delta={s['budget_delta']:g}  filter={s['filter']}"
          f"  per-run quota={s['run_quota']:.0%}")
    print(f"  spent            epsilon={s['spent_epsilon']:.4f}")
    print(f"  remaining        {s['remaining_fraction']:.1%} of the budget")
    if not s["runs"]:
        print("  no runs yet")
        return 0
    print(f"\n  {'run':<24} {'rounds':>6} {'contrib':>7} {'noise':>6} {'left':>5} {'spent eps':>10}")
    for r in s["runs"]:
        print(f"  {r['run_id']:<24} {r['rounds']:>6} {r['contributed']:>7} {r['noise_only']:>6} {r['left']:>5} "
              f"{r['spent_epsilon']:>10.4f}")
    return 0


def _enrol(args: argparse.Namespace) -> int:
    ledger = BudgetLedger.enrol(args.dir, client_id=args.client_id, epsilon=args.epsilon, delta=args.delta,
                                filter_kind=args.filter, run_quota=args.run_quota)
    print(f"enrolled {ledger.enrolment.client_id}: epsilon={args.epsilon:g} delta={args.delta:g} "
          f"filter={args.filter} in {args.dir}")
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
    enrol.set_defaults(func=_enrol)
