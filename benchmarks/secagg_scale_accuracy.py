"""What distributed placement buys as the devices per round grow.

Runs a study file through the study runner with ``resume`` (rerun the same command after an
interruption and the finished runs are kept), then prints the table of final accuracy against
devices per round, local against distributed, with each distributed run's SecAgg+ graph and the
largest delta against an honest coordinator, and draws the plot:

    nice -n 10 python benchmarks/secagg_scale_accuracy.py --config simulations/configs/secagg_scale.toml \\
        --out out/secagg_scale --plot docs/results_secagg_scale
    # the table and plot of a study already run, without running anything
    python benchmarks/secagg_scale_accuracy.py --from out/secagg_scale --plot docs/results_secagg_scale
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rows(results: dict) -> list[dict]:
    out = []
    for r in results["runs"]:
        asked = max(r["sampled_per_round"]) if r["sampled_per_round"] else 0
        graph = r.get("secagg_graph")
        out.append(
            {
                "devices": asked,
                "epsilon": r["settings"]["budget_level"],
                "placement": r["settings"]["noise"],
                "accuracy": r["accuracy_per_round"],
                "final": r["final_accuracy"],
                "released": sum(r["released_per_round"]),
                "rounds": r["rounds"],
                "graph": graph,
                "within": r["exhaustion"]["all_within_budget"],
                "seconds": r["seconds"],
            }
        )
    return sorted(out, key=lambda x: (x["epsilon"], x["devices"], x["placement"]))


def table(results: dict) -> str:
    lines = [
        "| devices per round | epsilon | placement | accuracy (round 5 / 10) | rounds released | SecAgg+ k / t | "
        "abort bound per round | s |",
        "|---:|---:|---|---|---:|---|---:|---:|",
    ]
    for x in rows(results):
        acc = x["accuracy"]
        mid = acc[len(acc) // 2 - 1] if len(acc) >= 2 else acc[-1]
        g = x["graph"]
        kt = f"{g['num_shares']} / {g['threshold']}" if g else "-"
        abort = f"{g['abort_probability']:.2g}" if g else "-"
        lines.append(
            f"| {x['devices']} | {x['epsilon']:g} | {x['placement']} | {mid:.3f} / {x['final']:.3f} | "
            f"{x['released']}/{x['rounds']} | {kt} | {abort} | {x['seconds']:.0f} |"
        )
    within = all(x["within"] for x in rows(results))
    lines.append("")
    lines.append(f"every client within its budget in every run: {within}")
    return "\n".join(lines)


def plot(results: dict, out_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 4))
    data = rows(results)
    for eps in sorted({x["epsilon"] for x in data}):
        for placement, style in (("local", "o--"), ("distributed", "s-")):
            pts = sorted(
                (x["devices"], x["final"]) for x in data if x["epsilon"] == eps and x["placement"] == placement
            )
            if pts:
                ax.plot(*zip(*pts), style, label=f"{placement}, epsilon {eps:g}")
    ax.set_xscale("log")
    ax.set_xlabel("devices per round (all asked, MNIST, 12 examples each)")
    ax.set_ylabel(f"test accuracy after {data[0]['rounds'] if data else 0} rounds")
    ax.axhline(0.1, color="grey", lw=0.5)
    ax.set_ylim(0, 1)
    ax.legend()
    ax.set_title("distributed (SecAgg+ sparse graph) vs local noise")
    fig.tight_layout()
    path = out_dir / "secagg_scale_accuracy.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    (out_dir / "secagg_scale_summary.json").write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return path


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="study TOML file (simulations/configs/secagg_scale.toml)")
    p.add_argument("--out", help="output folder of the study (results.json; resumed when it exists)")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="read DIR/results.json and run nothing")
    p.add_argument("--plot", metavar="DIR", help="write the plot and a summary JSON there")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    if args.from_dir:
        results = json.loads((Path(args.from_dir) / "results.json").read_text(encoding="utf-8"))
    else:
        if not (args.config and args.out):
            p.error("--config and --out are required (or --from DIR)")
        from fedfilter.simulations.study.config import load_study
        from fedfilter.simulations.study.runner import run_study

        started = time.perf_counter()
        results = run_study(load_study(args.config), args.out, progress=not args.no_progress, resume=True)
        print(f"wall time: {time.perf_counter() - started:.1f} s\n")
    print(table(results))
    if args.plot:
        print(f"\nwrote {plot(results, Path(args.plot))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
