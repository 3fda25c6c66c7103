"""Accuracy of local vs distributed noise at equal personal budgets (the vectorised engine).

    python benchmarks/secagg_accuracy.py [--clients 100] [--epsilons 0.5 1 2] [--rounds 40]
        [--noise-multiplier 4] [--seeds 0] [--out docs/results_secagg]

Every client of a federation of ``--clients`` on the digits task has the same personal budget
epsilon (delta 1e-5, the ``rdp`` filter: the filter that accounts the Skellam mechanism of distributed
placement) and is asked every round with the same request (noise multiplier z, clip C); the two
placements differ only in where the noise is added:

* ``local``: every report carries Gaussian noise of std z C (the coordinator sees each report);
* ``distributed``: every report carries a share calibrated to ``min-reports`` = clients / 2, the
  SecAgg+ threshold, so the released sum carries at least std z C, whatever drops out.

The per-client accounting is the same: a device's loss is that of its update plus noise of std z C,
so at equal budgets both placements buy the same rounds, and the model's noise differs by about
``sqrt(clients / 2)``. The engine (``fedfilter.simulations.engine``) applies the device's filters,
allowances and charges to every client at once and draws the round's noise in one aggregate draw
(``noise_draw="aggregate"``, same distribution as the sum of the reports). Which distributed
mechanism the engine ran is printed (Gaussian shares on main; Skellam shares on the integer grid once
the engine speaks it); the Flower path runs Skellam shares over SecAgg+ (``fedfilter demo
--placement distributed``).

    # several noise multipliers run before: one table and one plot of final accuracy against epsilon
    python benchmarks/secagg_accuracy.py --from out/z1 out/z2 out/z4 --out docs/results_secagg

Writes ``OUT/secagg_accuracy.json`` and ``OUT/secagg_accuracy.png`` (test accuracy per round, one
line per placement and budget) and prints a markdown table: final and best accuracy, rounds in
which some client still contributed data, the largest spent epsilon over the budget (at most 1 for
every client, checked).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from fedfilter.protocol.request import PLACEMENTS

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def distributed_mechanism() -> str:
    """What the engine adds in distributed placement (read from its source, not assumed)."""
    import importlib.util

    from fedfilter.simulations.engine import core

    skellam = importlib.util.find_spec("fedfilter.simulations.engine.skellam_round") is not None
    skellam = skellam and "distributed_round" in inspect.getsource(core)
    return "Skellam shares on the SecAgg+ integer grid" if skellam else "Gaussian shares"


def run_one(args, placement: str, epsilon: float, seed: int) -> dict:
    from fedfilter.simulations.engine.config import EngineConfig
    from fedfilter.simulations.engine.core import run_engine

    config = EngineConfig(
        task="digits",
        num_clients=args.clients,
        epsilon=epsilon,
        delta=1e-5,
        filter_kind="rdp",
        noise_multiplier=args.noise_multiplier,
        clip=args.clip,
        placement=placement,
        min_reports=args.clients // 2 if placement == "distributed" else 1,
        # the demo's rule (demo_report.simulated_worst_case_epsilon): min_reports x epsilon
        worst_case_epsilon=epsilon * (args.clients // 2) if placement == "distributed" else None,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        lr=args.lr,
        server_lr=args.server_lr,
        seed=seed,
        eval_every=args.eval_every,
        noise_draw="aggregate",
        group_by="none",
        run_id=f"secagg-{placement}-{epsilon:g}-{seed}",
    )
    started = time.monotonic()
    result = run_engine(config)
    accuracy = [(r.round_id, r.accuracy) for r in result.rounds if r.accuracy is not None]
    spent = [float(s) / epsilon for s in result.spent_epsilon]  # filter.epsilon_spent, rounded up
    if max(spent) > 1 + 1e-9:
        raise RuntimeError(f"{placement} eps {epsilon}: a client spent {max(spent)} of its budget")
    return {
        "placement": placement,
        "epsilon": epsilon,
        "seed": seed,
        "accuracy": accuracy,
        "final_accuracy": accuracy[-1][1],
        "best_accuracy": max(a for _, a in accuracy),
        "rounds_with_data": sum(1 for c in result.contributing if c > 0),
        "contributing": list(result.contributing),
        "max_spent_fraction": max(spent),
        "wall_s": round(time.monotonic() - started, 1),
    }


def plot(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    epsilons = sorted({r["epsilon"] for r in rows})
    colours = plt.cm.viridis([i / max(1, len(epsilons) - 1) * 0.85 for i in range(len(epsilons))])
    for colour, eps in zip(colours, epsilons):
        for placement, style in (("distributed", "-"), ("local", "--")):
            runs = [r for r in rows if r["epsilon"] == eps and r["placement"] == placement]
            if not runs:
                continue
            rounds = [x for x, _ in runs[0]["accuracy"]]
            mean = [statistics.mean(r["accuracy"][i][1] for r in runs) for i in range(len(rounds))]
            ax.plot(rounds, mean, style, color=colour, marker="o", ms=3, label=f"{placement}, epsilon {eps:g}")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def summarise(folders: list[Path], out: Path) -> None:
    """Final accuracy against epsilon for every (placement, z) of earlier runs, and the best z of each
    placement per epsilon; writes ``OUT/secagg_accuracy_summary.json`` and ``.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = []
    for folder in folders:
        payload = json.loads((Path(folder) / "secagg_accuracy.json").read_text())
        z = payload["settings"]["noise_multiplier"]
        runs += [{**r, "z": z, "mechanism": payload["distributed_mechanism"]} for r in payload["runs"]]
    mechanisms = sorted({r["mechanism"] for r in runs})
    print(f"# distributed noise in the engine: {', '.join(mechanisms)}")
    print("| epsilon | placement | " + " | ".join(f"z = {z:g}" for z in sorted({r["z"] for r in runs})) + " | best |")
    print("|---:|---|" + "---:|" * (len({r["z"] for r in runs}) + 1))
    best = []
    zs = sorted({r["z"] for r in runs})
    for eps in sorted({r["epsilon"] for r in runs}):
        for placement in PLACEMENTS:
            cells, top = [], None
            for z in zs:
                hit = [r for r in runs if (r["epsilon"], r["placement"], r["z"]) == (eps, placement, z)]
                acc = statistics.mean(r["final_accuracy"] for r in hit) if hit else None
                cells.append("-" if acc is None else f"{acc:.3f}")
                if acc is not None and (top is None or acc > top[0]):
                    top = (acc, z)
            if top is not None:
                best.append({"epsilon": eps, "placement": placement, "accuracy": top[0], "z": top[1]})
            shown = "-" if top is None else f"{top[0]:.3f} (z = {top[1]:g})"
            print(f"| {eps:g} | {placement} | " + " | ".join(cells) + f" | {shown} |")
    out.mkdir(parents=True, exist_ok=True)
    (out / "secagg_accuracy_summary.json").write_text(json.dumps({"runs": runs, "best": best}, indent=2) + "\n")
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for placement, colour in (("distributed", "#d62728"), ("local", "#3182bd")):
        for z, style in zip(zs, (":", "-.", "--", "-", "-")):
            pts = sorted(
                (r["epsilon"], r["final_accuracy"]) for r in runs if r["placement"] == placement and r["z"] == z
            )
            if pts:
                ax.plot(*zip(*pts), style, color=colour, marker="o", ms=3, lw=1, label=f"{placement}, z = {z:g}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("personal epsilon (every client; rdp filter, delta 1e-5)")
    ax.set_ylabel("final test accuracy")
    ax.set_ylim(0, 1)
    ax.axhline(0.1, color="grey", lw=0.5)
    ax.legend(fontsize=7, ncol=2, loc="upper left")
    ax.set_title("digits, 100 clients: local vs distributed noise at equal budgets", fontsize=9)
    fig.tight_layout()
    fig.savefig(out / "secagg_accuracy_summary.png", dpi=120)
    plt.close(fig)
    print(f"# wrote {out / 'secagg_accuracy_summary.json'} and {out / 'secagg_accuracy_summary.png'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.5, 1.0, 2.0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--noise-multiplier", type=float, default=4.0)
    parser.add_argument("--clip", type=float, default=0.4)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--server-lr", type=float, default=1.0)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--out", type=Path, default=Path("out/secagg_accuracy"))
    parser.add_argument("--from", dest="folders", type=Path, nargs="+", default=None, help="summarise earlier OUTs")
    args = parser.parse_args(argv)
    if args.folders:
        summarise(args.folders, args.out)
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    mechanism = distributed_mechanism()
    print(
        f"# {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__}; "
        f"digits, {args.clients} clients, all asked every round, {args.rounds} rounds, rdp filter, delta 1e-5, "
        f"z = {args.noise_multiplier:g}, C = {args.clip:g}, min-reports {args.clients // 2}; "
        f"distributed noise in the engine: {mechanism}",
        flush=True,
    )
    print("| epsilon | placement | final accuracy | best accuracy | rounds with data | max spent / budget | seconds |")
    print("|---:|---|---:|---:|---:|---:|---:|")
    rows = []
    for eps in args.epsilons:
        for placement in PLACEMENTS:
            for seed in args.seeds:
                row = run_one(args, placement, eps, seed)
                rows.append(row)
                print(
                    f"| {eps:g} | {placement} | {row['final_accuracy']:.3f} | {row['best_accuracy']:.3f} | "
                    f"{row['rounds_with_data']} | "
                    f"{row['max_spent_fraction']:.3f} | {row['wall_s']:.0f} |",
                    flush=True,
                )
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}
    payload = {"settings": settings, "distributed_mechanism": mechanism, "runs": rows}
    (args.out / "secagg_accuracy.json").write_text(json.dumps(payload, indent=2) + "\n")
    title = (
        f"digits, {args.clients} clients, equal budgets (rdp, delta 1e-5), z = {args.noise_multiplier:g}: "
        f"local vs distributed noise"
    )
    plot(rows, args.out / "secagg_accuracy.png", title)
    print(f"# wrote {args.out / 'secagg_accuracy.json'} and {args.out / 'secagg_accuracy.png'}")
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
