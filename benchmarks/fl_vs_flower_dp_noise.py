"""Where the gaps between fedfilter and Flower's DP live: in the noise, or in the path before it (a diagnostic
for docs/results.md).

Two questions, each asked on ``fl_vs_flower_dp.py``'s own settings (everything after ``--`` is its
arguments; its ``load``, ``engine_arm`` and Flower driver run unchanged):

``--noise-free``: the listed arms with their noise draws replaced by zeros, and nothing else changed
    (sampling, local SGD, clipping, each device's filter, averaging). (a): Flower's
    ``add_gaussian_noise_inplace`` as its DP wrapper module calls it; the engine's arms: the one
    aggregate draw per round (Gaussian for (f), Skellam for (b)). Equal curves mean the two paths agree
    up to the noise, so a gap between the noisy arms is the noise's (its scale, its law, the draw).
``--f-scale X``: (f), the central Gaussian mechanism through the engine, at ``X`` times (a)'s z, with
    budgets that never bind, so only the noise's scale differs from (f). ``X = sqrt(k / m)`` gives the
    variance (b)'s sum carries (``k`` reports of ``1/m`` of the noise each, min-reports ``m``).
``--draws N``: the listed arms with ``N`` other noise streams each, the seed held fixed: so the spread
    is how much the final accuracy depends on which noise is drawn. The engine's run id keys its noise
    streams (and its sampling, when fewer than all clients are asked); (a) gets another seed for
    numpy's global generator, which Flower's wrapper draws its noise from (its sampling is unchanged).

Nothing here is a privacy claim: a noise-free run releases everything. Run (the extra ``app``)::

    python benchmarks/fl_vs_flower_dp_noise.py --noise-free --arms af --seeds 0,1,2 -- \\
        --task mnist-dirichlet --num-clients 1000 --clients-per-round 200 --rounds 20 --epsilon 4 \\
        --max-test 2000 --lr 0.1 --clip 0.5 --eval-every 5
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fedfilter.checks import positive_finite

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped
import fl_vs_flower_dp as bench  # noqa: E402  (the benchmark this diagnoses, beside this script)

NEVER_BINDS = 1e4  # a per-device epsilon no 100-round run at z >= 0.1 comes near


class _Zeros:
    """Stands in for the engine's aggregate Gaussian generator: every draw is zero."""

    def normal(self, loc, scale, size):
        return np.zeros(size)


def remove_noise() -> None:
    """Replace every arm's noise draw by zeros (for this process only)."""
    import flwr.serverapp.strategy.dp_fixed_clipping as flower_dp

    import fedfilter.simulations.engine.distributed_round as distributed
    import fedfilter.simulations.engine.gaussian_round as gaussian

    flower_dp.add_gaussian_noise_inplace = lambda arrays, std: None
    gaussian.aggregate_noise_rng = lambda *key: _Zeros()  # the engine's Gaussian rounds draw here
    distributed.aggregate_skellam = lambda n, mu_share, dim, stream: np.zeros(dim, dtype=np.int64)


def run_arm(args: argparse.Namespace, task, arm: str, *, z_scale: float = 1.0, draw: int = 0) -> dict:
    """One arm's result (accuracy and test loss per round) at the benchmark's settings (its first epsilon);
    ``draw`` 0 is the benchmark's own noise, ``draw`` i > 0 another (``run_id(i)``, or for (a) another
    seed of numpy's global generator)."""
    from harness.flower_central_dp import flower_noise_multiplier
    from tqdm import tqdm

    n, k, epsilon = task.num_clients, args.clients_per_round, args.epsilon[0]
    eps = bench.budgets(n, epsilon, args.budgets, args.seed)
    z = flower_noise_multiplier(float(eps.min()), args.delta, args.rounds, n, k)
    if arm == "a":
        noise_seed = None if draw == 0 else draw * 1_000_003 + args.seed
        return bench.flower_arm(task, args, z=z, epsilon=float(eps.min()), noise_seed=noise_seed)
    if z_scale != 1.0:
        z, eps = z * z_scale, np.full(n, NEVER_BINDS)
    arm_z = z if arm == "f" else bench.fedfilter_noise_multipliers(task, args, float(eps.min()), z)[arm]
    with tqdm(disable=True) as bar:
        return bench.engine_arm(task, args, arm=arm, z=arm_z, eps=eps, bar=bar, run_id=run_id(draw))


def run_id(draw: int) -> str:
    """The engine's run id for ``draw``: it keys the engine's noise streams (and its sampling)."""
    return "fl-vs-flower" if draw == 0 else f"fl-vs-flower-draw-{draw}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--noise-free", action="store_true", help="every listed arm with its noise draws zeroed")
    how.add_argument("--f-scale", type=float, help="(f) at this multiple of (a)'s z, budgets that never bind")
    how.add_argument("--draws", type=int, help="every listed arm with this many other noise draws each")
    p.add_argument("--arms", default="af", help="arms among a, b, f (--noise-free; default af)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    ours = p.parse_args(argv[:split])
    seeds = [int(s) for s in ours.seeds.split(",")]
    arms = "f" if ours.f_scale is not None else ours.arms
    if set(arms) - set("abf") or not arms:
        p.error(f"--arms must be letters among a, b, f. Found {ours.arms!r}.")
    if ours.draws is not None and ours.draws < 1:
        p.error(f"--draws must be an integer >= 1. Found {ours.draws!r}.")
    if ours.f_scale is not None and (problem := positive_finite("--f-scale", ours.f_scale)) is not None:
        p.error(problem)
    if ours.noise_free:
        remove_noise()
    what = (
        "noise-free"
        if ours.noise_free
        else f"(f) at {ours.f_scale:g} x (a)'s z, budgets that never bind"
        if ours.f_scale is not None
        else "run id: the noise streams"
    )
    draws = range(1, ours.draws + 1) if ours.draws else [0]
    print(f"| seed | arm ({what}) | final accuracy | final test loss | accuracy at each evaluation |")
    print("|---|---|---|---|---|")
    for seed in seeds:
        args = bench.parse_args([*argv[split + 1 :], "--seed", str(seed), "--no-progress"])
        task = bench.load(args)
        for arm in arms:
            for draw in draws:
                result = run_arm(args, task, arm, z_scale=ours.f_scale or 1.0, draw=draw)
                curve = [a for a in result["accuracy_per_round"] if a is not None]
                loss = [x for x in result["loss_per_round"] if x is not None][-1]
                shown = " ".join(f"{a:.3f}" for a in curve)
                name = f"({arm}) {bench.ARMS[arm]}" + (f", {run_id(draw)}" if ours.draws else "")
                print(f"| {seed} | {name} | {curve[-1]:.3f} | {loss:.6f} | {shown} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
