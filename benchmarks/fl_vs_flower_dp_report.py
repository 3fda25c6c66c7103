"""The results of ``benchmarks/fl_vs_flower_dp.py`` as text, markdown and plots.

``table`` and ``markdown`` print one ``results.json``; run as a script, this draws the plots
docs/results.md shows from one or more of them:

    python benchmarks/fl_vs_flower_dp_report.py out/fl_vs_flower_dp/mnist-dirichlet-plan \
        --plots docs/results_fl_vs_flower_dp/mnist-dirichlet

* ``accuracy_vs_epsilon.png``: final accuracy of every arm against the (smallest) per-device epsilon;
* ``accuracy_per_round.png``: test accuracy at each evaluated round, per arm and epsilon (where a run
  takes off, which a final accuracy alone hides);
* ``contributing.png``: devices contributing per round, per arm and epsilon;
* ``dropout.png``: which devices run out of budget: the share out of budget by the end, by budget
  tier, by data size and by label skew (quartiles), for (b), (c) and (d).

With ``--seeds`` it prints, for runs that differ only in ``--seed``, each arm's final accuracy per seed,
its mean, and every arm's paired difference to (a) (the same seed: the same partition, initial model
and local shuffling; the noise streams differ by mechanism) with its mean and sample standard deviation:

    python benchmarks/fl_vs_flower_dp_report.py out/fl_vs_flower_dp/femnist-plan \
        out/fl_vs_flower_dp/femnist-plan-seed{1,2,3,4} --seeds
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ARM_STYLE = {  # colour and marker per arm, the same in every plot
    "a": ("tab:blue", "o"),
    "b": ("tab:green", "s"),
    "c": ("tab:olive", "D"),
    "d": ("tab:red", "v"),
    "e": ("tab:gray", "x"),
    "f": ("tab:purple", "^"),
}


def table(doc: dict[str, Any]) -> str:
    s = doc["settings"]
    lines = [
        f"{s['task']}: {s['num_clients']} devices, {s['clients_per_round']} per round, {s['rounds']} rounds, "
        f"clip {s['clip']}, delta {s['delta']:g}, budgets {s['budgets']}",
        f"{'eps':>5} {'arm':<24} {'accuracy':>9} {'rounds':>6} {'devices/round':>17} {'exhausted':>9} {'server':>9}",
    ]
    for entry in doc["results"]:
        for arm, r in sorted(entry["arms"].items()):
            contrib = r["contributing_per_round"]
            spread = f"{contrib[0]}..{contrib[-1]}" if contrib else "-"
            acc = "-" if r["accuracy"] is None else f"{r['accuracy']:.4f}"
            lines.append(
                f"{entry['epsilon']:>5g} ({arm}) {r['name']:<20} {acc:>9} {r['rounds_run']:>6} {spread:>17} "
                f"{r.get('exhausted', '-'):>9} {'trusted' if r['trusted_server'] else 'none':>9}"
            )
        a = entry["arms"].get("a")
        if a is not None:
            lines.append(
                f"      (a) ran at epsilon {entry['smallest_epsilon']:g} for every device, z = "
                f"{entry['noise_multiplier']:.4f}; Flower's accountant: spent {a['spent_epsilon']:.4f}"
            )
    return "\n".join(lines)


def markdown(doc: dict[str, Any]) -> str:
    """The results as a markdown table (docs/results.md): final and best accuracy, rounds released,
    devices contributing in the first and last round, devices out of budget, and the largest share of
    its budget a device spent (by the arm's own accountant)."""
    lines = [
        "| epsilon | arm | server | z | final accuracy | best accuracy | rounds released | devices first / last round "
        "| out of budget | max spent / budget |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for entry in doc["results"]:
        for arm, r in sorted(entry["arms"].items()):
            accs = [a for a in r["accuracy_per_round"] if a is not None]
            contrib = r["contributing_per_round"]
            if "devices" in r:
                share = max(d["spent_epsilon"] / d["epsilon"] for d in r["devices"])
            elif "spent_epsilon" in r:
                share = r["spent_epsilon"] / r["epsilon_budget"]
            else:
                share = None
            z = r.get("noise_multiplier")
            lines.append(
                f"| {entry['epsilon']:g} | ({arm}) {r['name']} | {'trusted' if r['trusted_server'] else 'untrusted'} "
                f"| {'-' if z is None else f'{z:.3g}'} "
                f"| {accs[-1]:.3f} | {max(accs):.3f} | {r['rounds_run']} | {contrib[0]} / {contrib[-1]} "
                f"| {r.get('exhausted', '-')} | {'-' if share is None else f'{share:.3f}'} |"
            )
    return "\n".join(lines)


def seeds_markdown(docs: list[dict[str, Any]]) -> str:
    """Runs that differ only in their seed, as one markdown table per epsilon (module docstring)."""
    same = [{k: v for k, v in d["settings"].items() if k != "seed"} for d in docs]
    if any(s != same[0] for s in same):
        raise ValueError("--seeds: the runs differ in more than their seed.")
    all_seeds = [d["settings"]["seed"] for d in docs]
    if len(set(all_seeds)) != len(all_seeds):
        raise ValueError(f"--seeds: a seed appears twice. Found {all_seeds}.")
    lines = []
    for epsilon in sorted({e["epsilon"] for d in docs for e in d["results"]}):
        # the runs that hold this epsilon, and the arms every one of them ran
        held = [(d["settings"]["seed"], e) for d in docs for e in d["results"] if e["epsilon"] == epsilon]
        seeds, entries = [s for s, _ in held], [e for _, e in held]
        arms = sorted(set.intersection(*(set(e["arms"]) for e in entries)))
        head = " | ".join(f"seed {s}" for s in seeds)
        lines += [
            f"epsilon {epsilon:g} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}):",
            "",
            f"| arm | {head} | mean | minus (a): mean (sd) |",
            "|---|" + "---:|" * (len(seeds) + 2),
        ]
        for arm in arms:
            finals = np.array([_final(e["arms"][arm]) for e in entries])
            cells = " | ".join(f"{v:.3f}" for v in finals)
            if arm != "a" and "a" in arms:
                diff = finals - np.array([_final(e["arms"]["a"]) for e in entries])
                sd = f"{diff.std(ddof=1):.3f}" if len(diff) > 1 else "-"
                gap = f"{diff.mean():+.3f} ({sd})"
            else:
                gap = "-"
            lines.append(f"| ({arm}) {entries[0]['arms'][arm]['name']} | {cells} | {finals.mean():.3f} | {gap} |")
        lines.append("")
    return "\n".join(lines)


def _final(r: dict[str, Any]) -> float:
    return [a for a in r["accuracy_per_round"] if a is not None][-1]


def _quartiles(devices: list[dict[str, Any]], key: str) -> list[tuple[str, list[dict[str, Any]]]]:
    """The devices in four groups by ``key`` (quartiles; ties go to the lower group), named by range."""
    values = np.array([d[key] for d in devices], dtype=float)
    edges = np.quantile(values, [0, 0.25, 0.5, 0.75, 1])
    groups = []
    for j in range(4):
        lo, hi = edges[j], edges[j + 1]
        inside = [d for d, v in zip(devices, values, strict=True) if (lo < v or j == 0) and v <= hi]
        groups.append((f"{lo:.3g}-{hi:.3g}", inside))
    return groups


def _groups(devices: list[dict[str, Any]]) -> list[list[tuple[str, list[dict[str, Any]]]]]:
    """By budget tier, by data size, by label skew (devices without a label entropy: one empty group)."""
    # named by their multiple of the smallest budget, so runs at different epsilons share the groups
    low = min(d["epsilon"] for d in devices)
    tiers = [
        (f"{t / low:g} x", [d for d in devices if d["epsilon"] == t]) for t in sorted({d["epsilon"] for d in devices})
    ]
    skew = _quartiles(devices, "label_entropy") if all("label_entropy" in d for d in devices) else [("-", [])]
    return [tiers, _quartiles(devices, "examples"), skew]


def _per_round(plt, entries: list[dict[str, Any]], key: str, label: str, title: str, out: Path) -> Path:
    """One panel per epsilon, one line per arm: ``r[key + "_per_round"]`` at the rounds it was measured."""
    fig, axes = plt.subplots(1, len(entries), figsize=(4 * len(entries), 3.2), squeeze=False, sharey=True)
    for ax, entry in zip(axes[0], entries, strict=True):
        for arm, r in sorted(entry["arms"].items()):
            colour, marker = ARM_STYLE[arm]
            xy = [(i + 1, v) for i, v in enumerate(r[f"{key}_per_round"]) if v is not None]
            ax.plot([x for x, _ in xy], [y for _, y in xy], color=colour, marker=marker, markersize=3, label=f"({arm})")
        ax.set_title(f"epsilon {entry['epsilon']:g}", fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(label)
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = out / f"{key}_per_round.png"
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot(docs: list[dict[str, Any]], out: Path) -> list[Path]:
    """The three figures of the module docstring for ``docs`` (one task), written under ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    s = docs[0]["settings"]
    title = f"{s['task']}: {s['num_clients']} devices, {s['clients_per_round']} per round, {s['rounds']} rounds"
    written = []

    # Accuracy against epsilon, one line per arm (every results.json given, by epsilon).
    points: dict[str, list[tuple[float, float]]] = {}
    names: dict[str, str] = {}
    for doc in docs:
        for entry in doc["results"]:
            for arm, r in entry["arms"].items():
                points.setdefault(arm, []).append((entry["smallest_epsilon"], _final(r)))
                names[arm] = r["name"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm in sorted(points):
        xy = sorted(points[arm])
        colour, marker = ARM_STYLE[arm]
        style = "--" if arm == "e" else "-"
        ax.plot(
            [x for x, _ in xy], [y for _, y in xy], style, color=colour, marker=marker, label=f"({arm}) {names[arm]}"
        )
    ax.set_xscale("log")
    ticks = sorted({x for xy in points.values() for x, _ in xy})
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel(f"per-device epsilon (smallest tier), delta = {s['delta']:g}")
    ax.set_ylabel("final test accuracy")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    written.append(out / "accuracy_vs_epsilon.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    entries = [e for doc in docs for e in doc["results"]]
    written.append(_per_round(plt, entries, "accuracy", "test accuracy", title, out))

    # Devices contributing per round.
    fig, axes = plt.subplots(1, len(entries), figsize=(4 * len(entries), 3.2), squeeze=False, sharey=True)
    for ax, entry in zip(axes[0], entries, strict=True):
        for arm, r in sorted(entry["arms"].items()):
            colour, _ = ARM_STYLE[arm]
            rounds = range(1, len(r["contributing_per_round"]) + 1)
            ax.plot(rounds, r["contributing_per_round"], color=colour, label=f"({arm})")
        ax.set_title(f"epsilon {entry['epsilon']:g}", fontsize=9)
        ax.set_xlabel("round")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("devices contributing")
    axes[0][-1].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    written.append(out / "contributing.png")
    fig.savefig(written[-1], dpi=120)
    plt.close(fig)

    # Who drops out first: the share of devices whose budget ran out by the end, by budget tier, by
    # data size (quartiles of training examples) and by label skew (quartiles of label entropy).
    cells = [(e, arm) for e in entries for arm in ("b", "c", "d") if arm in e["arms"]]
    if cells:
        fig, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
        width = 0.8 / len(cells)
        for i, (entry, arm) in enumerate(cells):
            devices = entry["arms"][arm]["devices"]
            colour, _ = ARM_STYLE[arm]
            shade = 0.35 + 0.65 * (i + 1) / len(cells)
            label = f"({arm}) epsilon {entry['epsilon']:g}"
            for ax, groups in zip(axes, _groups(devices), strict=True):
                share = [np.mean([d["exhausted_round"] >= 0 for d in g]) if g else np.nan for _, g in groups]
                ax.bar(np.arange(len(groups)) + i * width, share, width, color=colour, alpha=shade, label=label)
                ax.set_xticks(np.arange(len(groups)) + 0.4 - width / 2, [name for name, _ in groups], fontsize=8)
        for ax, what in zip(
            axes,
            ("budget tier (multiple of the smallest epsilon)", "training examples", "label entropy (low = skewed)"),
            strict=True,
        ):
            ax.set_xlabel(what)
            ax.grid(alpha=0.3, axis="y")
        axes[0].set_ylabel("share out of budget by the end")
        axes[0].set_ylim(0, 1)
        axes[-1].legend(fontsize=7)
        fig.suptitle(title, fontsize=9)
        fig.tight_layout()
        written.append(out / "dropout.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", help="directories holding results.json (one task)")
    p.add_argument("--plots", default=None, help="directory for the figures")
    p.add_argument("--seeds", action="store_true", help="print the runs (one per seed) as a markdown table")
    args = p.parse_args(argv)
    if not (args.plots or args.seeds):
        p.error("give --plots DIR, --seeds, or both.")
    docs = []
    for run in args.runs:
        path = Path(run) / "results.json"
        if not path.is_file():
            p.error(f"runs: no results.json in {run!r}")
        docs.append(json.loads(path.read_text()))
    if len({d["settings"]["task"] for d in docs}) != 1:
        p.error(f"runs: one task at a time. Found {sorted({d['settings']['task'] for d in docs})}")
    if args.seeds:
        try:
            print(seeds_markdown(docs))
        except ValueError as err:
            p.error(str(err))
    if args.plots:
        for path in plot(docs, Path(args.plots)):
            print(path, file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
