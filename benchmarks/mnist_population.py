"""MNIST as 60,000 single-example devices (Feldman & Zrnic (2021) Section 5.1's population), distributed
placement, no trusted server: devices that sample themselves against a coordinator that asks a lot.

    python benchmarks/mnist_population.py --arm sampled --asked 60000 --epsilon 2
    python benchmarks/mnist_population.py --arm unsampled --asked 600 --epsilon 2
    python benchmarks/mnist_population.py --table          # docs/results.md's table, from results.jsonl
    python benchmarks/mnist_population.py --plot docs/mnist_population.png

Each training example is one device with one lifetime budget epsilon (delta 1e-5). Every step the
coordinator asks ``--asked`` devices in balanced passes (each asked within one of every other) and
SecAgg+ unmasks the sum of their Skellam reports (``min_reports`` for a 10% drop-out rate):

* ``sampled``: each asked device puts its clipped gradient in its report with its own rate, from its
  budget over the asks the plan expects of it (``client/mechanisms/sampled.py``); the plan
  (``planning.sampled_rounds.plan_sampling``) picks the z with the most expected signal over noise
  among those SecAgg+'s range admits for that many reports (``secagg_noise_limit``);
* ``unsampled``: each asked device contributes; z is the least its budget admits for its asks
  (``planning.federation.least_affordable_noise_multiplier``), Abadi et al.'s lot of 600 by default.

The devices' charges are the worst case within the clip (the engine's ``accounting="worst-case"``: an
upper bound on what a device with individual accounting pays, so the budgets hold), and one Skellam
draw carries the sum's noise (``noise_draw="aggregate"``): the simulation then trains only the
gradients the coins keep (``DistributedPlacement._spend_rows``). The worst-case account (a coordinator
that reads one report) is set out of the way: with thousands of reports a round a single report
carries a small share of the noise, so what this study measures is the guarantee of the sum SecAgg+
releases. The model is Opacus' MNIST CNN (``MnistCNN("relu")``), as in the central reproduction.

Results are appended to ``out/mnist_population/results.jsonl`` (one line per run; a run already there is
not run again); a run is checkpointed every 10 steps in ``out/mnist_population/checkpoints/`` and
resumes when rerun.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

OUT = Path(__file__).resolve().parents[1] / "out" / "mnist_population"
POPULATION = 60_000
DELTA = 1e-5
# A single report's worst-case account is not what this study measures (module docstring).
WORST_CASE_EPSILON = 1e9
# Abadi et al. (2016), Section 5.2 (MNIST, delta 1e-5): test accuracy at epsilon 0.5, 2 and 8.
ABADI = {0.5: 0.90, 2.0: 0.95, 8.0: 0.97}


def secagg_noise_limit(asked: int, min_reports: int, clip: float) -> float:
    """0.1% below the largest z whose Skellam sum of ``asked`` reports fits SecAgg+'s range for that many
    reports (``protocol.secagg.grid.largest_noise_multiplier``, the rule every device checks)."""
    from fedfilter.protocol.secagg.grid import largest_noise_multiplier

    return largest_noise_multiplier(asked, min_reports, clip) * 0.999


def plan(arm: str, *, epsilon: float, steps: int, asked: int, clip: float, dim: int, population: int) -> dict:
    """The run's public plan: asks per device, min_reports, z, the devices' rate and its mean."""
    from fedfilter.planning.dropout import min_reports_for_dropout
    from fedfilter.planning.federation import least_affordable_noise_multiplier
    from fedfilter.planning.sampled_rounds import plan_sampling

    asks = math.ceil(steps * asked / population)
    m, _ = min_reports_for_dropout(asked, 0.1, 0.01)
    limit = secagg_noise_limit(asked, m, clip)
    setting = dict(delta=DELTA, placement="distributed", clip=clip, min_reports=m, dim=dim)
    if arm == "sampled":
        grid = sorted({*(float(z) for z in np.geomspace(0.5, 64.0, 28) if z < limit), limit})
        p = plan_sampling(budgets=[epsilon], asks=asks, noise_multipliers=grid, **setting)
        z, rate = float(p.noise_multiplier), float(p.rates[0])
    else:
        z = least_affordable_noise_multiplier(epsilon=epsilon, rounds=asks, **setting)
        if z is None or z > limit:
            raise ValueError(f"epsilon {epsilon} over {asks} asks needs z {z}, above SecAgg+'s limit {limit:.3g}")
        rate = 1.0
    return dict(asks=asks, min_reports=m, noise_multiplier=z, rate=rate, secagg_limit=limit)


def engine_config(
    arm: str, p: dict, *, epsilon: float, steps: int, asked: int, clip: float, lr: float, seed: int, population: int
):
    from fedfilter.simulations.engine import EngineConfig

    sampling = (
        dict(planned_asks=p["asks"], rdp_order="plan", expected_rate=max(p["rate"], 1e-6)) if arm == "sampled" else {}
    )
    return EngineConfig(
        client_mode="single-example",
        epsilon=epsilon,
        worst_case_epsilon=WORST_CASE_EPSILON,
        delta=DELTA,
        filter_kind="rdp",
        placement="distributed",
        accounting="worst-case",
        noise_draw="aggregate",
        noise_multiplier=p["noise_multiplier"],
        clip=clip,
        min_reports=p["min_reports"],
        fraction=asked / population,
        participation="balanced",
        after_exhaustion="noise-only",
        rounds=steps,
        lr=1.0,
        server_lr=lr,
        seed=seed,
        run_id="mnist-population",
        eval_every=10**9,
        group_by="none",
        chunk_size=1024,
        norms="vectorised",
        **sampling,
    )


def run(args: argparse.Namespace, epsilon: float) -> dict:
    from fedfilter.simulations.engine.checkpoint import load_checkpoint, save_checkpoint
    from fedfilter.simulations.engine.core import Engine
    from fedfilter.simulations.reproduce.mnist_gd import mnist_task

    task = mnist_task(None if args.population == POPULATION else args.population)
    dim = int(sum(p.numel() for p in task.model_fn().parameters()))
    p = plan(
        args.arm,
        epsilon=epsilon,
        steps=args.steps,
        asked=args.asked,
        clip=args.clip,
        dim=dim,
        population=task.num_clients,
    )
    identity = dict(
        arm=args.arm,
        asked=args.asked,
        epsilon=epsilon,
        steps=args.steps,
        clip=args.clip,
        lr=args.lr,
        seed=args.seed,
        population=task.num_clients,
    )
    done = [r for r in rows(args.out) if all(r.get(k) == v for k, v in identity.items())]
    if done:
        print(f"{identity}: already in {args.out / 'results.jsonl'} (final accuracy {done[-1]['final_accuracy']:.4f})")
        return done[-1]
    print(f"{identity}: plan {p}", flush=True)
    cfg = engine_config(args.arm, p, **{k: v for k, v in identity.items() if k != "arm"})
    engine = Engine(cfg, task=task)
    curve: list[tuple[int, float]] = []
    kept: list[int] = []
    earlier, started = 0.0, time.perf_counter()
    checkpoint = args.out / "checkpoints" / ("-".join(f"{k}{v}" for k, v in identity.items()) + ".ckpt")
    if checkpoint.exists():
        snapshot, meta = load_checkpoint(checkpoint)
        if meta["identity"] != identity:
            raise ValueError(f"checkpoint {checkpoint} belongs to {meta['identity']}")
        engine.restore(snapshot)
        curve, kept, earlier = [tuple(c) for c in meta["curve"]], meta["kept"], meta["seconds"]
        print(f"resumed after step {engine.round_id}", flush=True)
    last = args.steps if args.stop_after is None else min(args.steps, args.stop_after)
    for step in range(engine.round_id + 1, last + 1):
        record = engine.step()
        kept.append(int(record.kept if record.kept is not None else record.contributing))
        if step % args.eval_every == 0 or step == args.steps:
            _, accuracy, _ = engine.evaluate()
            curve.append((step, float(accuracy)))
            seconds = earlier + time.perf_counter() - started
            print(
                f"step {step}/{args.steps}: test {accuracy:.4f}, kept {np.mean(kept[-args.eval_every :]):.0f} a step, "
                f"exhausted {record.exhausted_total}, {seconds / 60:.1f} min",
                flush=True,
            )
        if step % 10 == 0 and step < last:
            meta = dict(identity=identity, curve=curve, kept=kept, seconds=earlier + time.perf_counter() - started)
            save_checkpoint(checkpoint, engine.snapshot(), meta)
    if last < args.steps:  # a probe of the planned run's first steps: nothing recorded
        return dict(identity, **p, curve=curve)
    result = engine.result()
    row = dict(
        identity,
        **p,
        final_accuracy=curve[-1][1],
        curve=curve,
        mean_kept=float(np.mean(kept)),
        released=int(sum(r.released for r in engine.records)) if engine.records else None,
        max_spent_epsilon=float(result.spent_epsilon.max()),
        seconds=earlier + time.perf_counter() - started,
    )
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "results.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    checkpoint.unlink(missing_ok=True)
    return row


def rows(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def table(out: Path) -> str:
    lines = [
        "| epsilon | arm | asked a step | z | rate | kept a step | steps | lr | final accuracy "
        "| highest on the way (step) | Abadi et al. |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in sorted(rows(out), key=lambda r: (r["epsilon"], r["arm"], r["asked"], -r["lr"])):
        peak = max(r["curve"], key=lambda c: c[1])  # the test curve's shape only: the final model is the result
        lines.append(
            f"| {r['epsilon']:g} | {r['arm']} | {r['asked']:,} | {r['noise_multiplier']:.3g} | {r['rate']:.4g} | "
            f"{r['mean_kept']:.0f} | {r['steps']} | {r['lr']:g} | {r['final_accuracy']:.4f} | "
            f"{peak[1]:.4f} ({peak[0]}) | {ABADI.get(r['epsilon'], '-')} |"
        )
    return "\n".join(lines)


def plans(args: argparse.Namespace) -> str:
    """Each arm's plan at each budget, before anything runs: z, the rate, the updates kept a step and the
    noise std of the released mean per coordinate over the clip (``z C`` over the expected kept updates,
    times ``sqrt(asked / min_reports)``: the sum carries that much more than ``z C`` when all report)."""
    from fedfilter.simulations.tasks.models import MnistCNN

    dim = sum(p.numel() for p in MnistCNN("relu").parameters())  # the runs' model (mnist_task's)
    lines = [
        "| epsilon | arm | asked a step | asks a device | z (SecAgg+ limit) | rate | kept a step "
        "| mean's noise std / C |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for eps in (float(e) for e in args.epsilon.split(",")):
        for arm, asked in (("unsampled", 600), ("sampled", 6_000), ("sampled", args.population)):
            try:
                p = plan(
                    arm, epsilon=eps, steps=args.steps, asked=asked, clip=args.clip, dim=dim, population=args.population
                )
            except ValueError as err:
                lines.append(f"| {eps:g} | {arm} | {asked:,} | | {err} | | | |")
                continue
            kept = asked * p["rate"]
            noise = p["noise_multiplier"] * math.sqrt(asked / p["min_reports"]) / kept if kept else math.inf
            lines.append(
                f"| {eps:g} | {arm} | {asked:,} | {p['asks']} | {p['noise_multiplier']:.3g} "
                f"({p['secagg_limit']:.3g}) | {p['rate']:.3g} | {kept:,.0f} | {noise:.2e} |"
            )
    return "\n".join(lines)


def plot(path: str, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = rows(out)
    epsilons = sorted({r["epsilon"] for r in data})
    fig, axes = plt.subplots(1, len(epsilons), figsize=(4.5 * len(epsilons), 3.6), squeeze=False)
    for ax, eps in zip(axes[0], epsilons):
        for r in (r for r in data if r["epsilon"] == eps):
            steps, acc = zip(*r["curve"])
            label = f"{r['arm']}, {r['asked']:,} asked, z {r['noise_multiplier']:.2g}, lr {r['lr']:g}"
            ax.plot(steps, acc, label=label)
        if eps in ABADI:
            ax.axhline(ABADI[eps], color="grey", ls=":", label="Abadi et al. 2016")
        ax.set(title=f"epsilon {eps:g}", xlabel="step", ylabel="test accuracy", ylim=(0.0, 1.0))
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--arm", choices=("sampled", "unsampled"), default="sampled")
    ap.add_argument("--asked", type=int, default=None, help="devices asked a step (sampled 60000, unsampled 600)")
    ap.add_argument("--epsilon", default="2", help="comma-separated budgets")
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1.0, help="the coordinator's step on the mean clipped gradient")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-every", type=int, default=50)
    ap.add_argument("--stop-after", type=int, help="a probe: run the planned run's first N steps, record nothing")
    ap.add_argument("--population", type=int, default=POPULATION, help="the first N training images (a smaller study)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--plans", action="store_true", help="each arm's plan at each --epsilon (nothing runs)")
    ap.add_argument("--plot", metavar="PNG")
    args = ap.parse_args(argv)
    if args.table:
        print(table(args.out))
        return
    if args.plans:
        print(plans(args))
        return
    if args.plot:
        plot(args.plot, args.out)
        return
    if args.asked is None:
        args.asked = args.population if args.arm == "sampled" else 600
    for eps in (float(e) for e in args.epsilon.split(",")):
        run(args, eps)


if __name__ == "__main__":
    main()
