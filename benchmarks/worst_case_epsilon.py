"""Does the demo's worst-case budget (m x epsilon) bind before the main one?

    python benchmarks/worst_case_epsilon.py [--epsilons 2,8] [--min-reports 5,10,100] [--dim 1000] [--max-rounds 50]

For each budget epsilon and ``min-reports`` m, one device (the real ledger and ``release`` with Skellam noise,
rdp filter, delta 1e-5) enrolled with ``worst-case-epsilon = m x epsilon`` (the rule the demo and
deploy-local use, ``demo_report.simulated_worst_case_epsilon``) answers distributed rounds (z = 1,
C = 1, an update of norm 2 C in ``--dim`` coordinates, so every round is clipped to its allowance)
for ``--max-rounds`` rounds. The table shows the rounds it contributed (near the end of its budget a
device keeps sending ever smaller updates, down to ``exhausted_below`` of the clip), what each
account spent, and which account stopped it ("-": neither, within the rounds).

The worst-case account's charges and its epsilon are at the order alpha* of ITS budget
(``filters.rdp_order``), so its spent epsilon is not comparable between budgets: measure it at the
budget a device is enrolled with, as here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from fedfilter.client.ledger.budget import BudgetLedger  # noqa: E402
from fedfilter.client.mechanisms.gaussian_noise import NoiseStream
from fedfilter.client.mechanisms.skellam import SkellamMechanism, skellam_grid  # noqa: E402
from fedfilter.client.release import release
from fedfilter.client.settings.policy import ClientPolicy, check_request
from fedfilter.deploy.devices import simulated_worst_case_epsilon
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import secaggplus_settings  # noqa: E402

DELTA = 1e-5


def run(root: Path, epsilon: float, m: int, dim: int, max_rounds: int) -> dict:
    worst = simulated_worst_case_epsilon(epsilon, m)
    ledger = BudgetLedger.enrol(
        root, client_id="bench", epsilon=epsilon, delta=DELTA, filter_kind="rdp", worst_case_epsilon=worst
    )
    policy = ClientPolicy(allow_distributed=True, max_min_reports=max(100, m))
    q = secaggplus_settings(m)["quantization_range"]
    update = [np.full(dim, 2.0 / np.sqrt(dim))]  # norm 2 C: every round is clipped to its allowance
    rounds = 0
    try:
        for r in range(max_rounds):
            spec = RoundSpec("bench", r, 1.0, 1.0, placement="distributed", min_reports=m)
            check_request(spec, policy)  # as the mod does, once, at its entry
            mechanism = SkellamMechanism.for_update(spec, skellam_grid(spec, target_range=q, sample_num=m), update)
            rel = release(
                ledger,
                mechanism,
                update,
                run_id=spec.run_id,
                round_id=r,
                exhausted_below=policy.exhausted_below,
                after_exhaustion=policy.after_exhaustion,
                stream=NoiseStream(),
            )
            rounds += rel.status == "contributed"
        s = ledger.summary()
        w = s["worst_case"]
        stopped = "-" if rounds == max_rounds else ("worst case" if w["remaining_fraction"] < 1e-3 else "main")
        return {
            "worst": worst,
            "rounds": rounds,
            "main": s["spent_epsilon"],
            "main_left": s["remaining_fraction"],
            "alone": w["spent_epsilon"],
            "stopped": stopped,
        }
    finally:
        ledger.close()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epsilons", default="2,8", help="budgets, comma-separated")
    p.add_argument("--min-reports", default="5,10,100", help="values of m, comma-separated")
    p.add_argument("--dim", type=int, default=1000)
    p.add_argument("--max-rounds", type=int, default=50)
    args = p.parse_args(argv)
    epsilons = [float(e) for e in args.epsilons.split(",")]
    ms = [int(m) for m in args.min_reports.split(",")]
    print(f"z = 1, C = 1, dim = {args.dim}, delta = {DELTA:g}, rdp filter, {args.max_rounds} rounds\n")
    print(
        "| epsilon | m | worst-case-epsilon | rounds contributed | main spent (left) | worst case spent | stopped by |"
    )
    print("|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for eps in epsilons:
            for m in ms:
                row = run(Path(tmp) / f"{eps}-{m}", eps, m, args.dim, args.max_rounds)
                print(
                    f"| {eps:g} | {m} | {row['worst']:g} | {row['rounds']} | {row['main']:.3f} "
                    f"({row['main_left']:.1%}) | {row['alone']:.3f} | {row['stopped']} |"
                )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
