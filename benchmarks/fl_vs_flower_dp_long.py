"""The long runs of ``benchmarks/fl_vs_flower_dp.py``, as one queue that survives being stopped.

Each job is one ``fl_vs_flower_dp.py`` command (a preset, a seed, some arms, an ``--out`` directory under
``out/fl_vs_flower_dp/long/``). A worker takes the first job that is neither done (its ``results.json``
holds every arm at every epsilon) nor taken (another worker holds its lock), runs it niced, and goes on
to the next; the benchmark itself keeps finished arms and checkpoints the running one every 5 rounds,
so a killed worker, started again, loses at most 5 rounds. Two workers may share a directory: they run
other arms, and the benchmark merges what each writes.

    FEDFILTER_DATA=/path/to/data python benchmarks/fl_vs_flower_dp_long.py &   # a worker (start two for two)
    python benchmarks/fl_vs_flower_dp_long.py --status   # each job: done, running, its checkpoints
    python benchmarks/fl_vs_flower_dp_long.py --curve out/fl_vs_flower_dp/long/mnist-seed0  # accuracy per round
    python benchmarks/fl_vs_flower_dp_long.py --summary   # the MNIST study's table, from what has finished

Progress goes to ``out/fl_vs_flower_dp/long/queue.log``, each job's own output to ``logs/<job>.log``
beside it. The queue is ``JOBS`` below, in the order the study needs its answers: Flower's central DP
and no privacy at seed 0, fedfilter distributed at seed 0, no privacy at the other seeds (whether the
preset's length reaches 0.95 there too), then the private arms at the other seeds. A later session
adds jobs (their names must stay unique; a done job is never rerun): after seed 0's, (b) in balanced
passes with a fixed and with an adaptive clip, each in its own directory; then (b) as ``fedfilter plan``
sets it up at every seed, the clip study, the trusted amplified baseline (g), Flower's quickstart CNN
at 25 to 1,600 devices a round, and FEMNIST.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import math
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LONG = ROOT / "out" / "fl_vs_flower_dp" / "long"
EPSILONS = (1.0, 2.0, 4.0, 8.0)
PLAN = ("--fedfilter-z", "plan", "--plan-quantile", "0.9")  # uniform participation: pay for 0.9 of the asks


@dataclass(frozen=True)
class Job:
    """One benchmark command: ``arms`` at ``epsilons`` into ``out`` (a directory under ``LONG``)."""

    name: str
    out: str
    arms: str
    options: tuple[str, ...]
    epsilons: tuple[float, ...] = EPSILONS

    def command(self) -> list[str]:
        eps = ",".join(f"{e:g}" for e in self.epsilons)
        return [
            *("nice", "-n", "19", sys.executable, str(ROOT / "benchmarks" / "fl_vs_flower_dp.py")),
            *self.options,
            *("--epsilon", eps, "--arms", self.arms, "--out", str(LONG / self.out), "--no-progress"),
        ]

    def missing(self) -> list[str]:
        """``eps/arm`` pairs not yet in the job's ``results.json``."""
        path = LONG / self.out / "results.json"
        doc = json.loads(path.read_text()) if path.exists() else {"results": []}
        held = {(r["epsilon"], arm) for r in doc["results"] for arm in r["arms"]}
        return [f"{e:g}/{a}" for e in self.epsilons for a in self.arms if (e, a) not in held]


def mnist(seed: int, arms: str) -> Job:
    options = ("--preset", "mnist-long", "--seed", str(seed), *PLAN)
    return Job(f"mnist-seed{seed}-{arms}", f"mnist-seed{seed}", arms, options)


def mnist_balanced(seed: int, adaptive: bool) -> Job:
    """(b) in balanced passes: the plan pays for exactly the asks each device gets (no quantile); with
    ``adaptive``, the clip adapts to the median update norm (Andrew et al. 2021, Flower's defaults)."""
    options = ("--preset", "mnist-long", "--seed", str(seed), "--fedfilter-z", "plan", "--participation", "balanced")
    out = f"mnist-seed{seed}-balanced" + ("-adaptive" if adaptive else "")
    extra = ("--adaptive-clip", "0.5") if adaptive else ()
    return Job(out.replace("-balanced", "-b-balanced", 1), out, "b", (*options, *extra))


def mnist_plan(seed: int, clip: str = "0.5", epsilons: tuple[float, ...] = EPSILONS) -> Job:
    """(b) as ``fedfilter plan`` sets it up for this federation: balanced passes, the plan's z, and the
    plan's ``min_reports`` for a 10% drop-out rate (170 of 200; ``fedfilter plan --devices 200
    --dropout-rate 0.1``). ``clip`` is a fixed clip, or ``adaptive`` (the plan's default: start at 0.1,
    follow the median update norm; Andrew et al. 2021 and Flower's defaults)."""
    options = ("--preset", "mnist-long", "--seed", str(seed), "--fedfilter-z", "plan", "--participation", "balanced")
    options += ("--min-reports", str(PLAN_MIN_REPORTS))
    if clip.startswith("adaptive"):  # "adaptive": the median target; "adaptive-Q": target quantile Q
        options += ("--clip", "0.1", "--adaptive-clip", clip.partition("-")[2] or "0.5")
    else:
        options += ("--clip", clip)
    suffix = "" if clip == "0.5" else f"-{clip}" if clip.startswith("adaptive") else f"-clip-{clip}"
    return Job(f"mnist-seed{seed}-plan{suffix}", f"mnist-seed{seed}-plan{suffix}", "b", options, epsilons)


PLAN_MIN_REPORTS = 170  # fedfilter plan's min_reports for 200 asked per round at a 10% drop-out rate
# fedfilter.planning.dropout.min_reports_for_dropout(k, 0.1, 0.01) for the other federations' k
DROPOUT_MIN_REPORTS = {5: 3, 10: 6, 25: 19, 50: 40, 100: 82, 105: 87, 200: 170, 400: 345, 800: 700, 1600: 1412}


def quickstart(per_round: int, arms: str) -> Job:
    """Flower's quickstart CNN over 6,000 MNIST devices at epsilon 8, ``per_round`` asked in balanced
    passes: does it learn, in distributed (b) and local (d) placement, against no privacy (e)?"""
    options = ("--preset", "quickstart-population", "--clients-per-round", str(per_round))
    options += ("--fedfilter-z", "plan", "--participation", "balanced")
    options += ("--min-reports", str(DROPOUT_MIN_REPORTS[per_round]))
    return Job(f"quickstart-k{per_round}-{arms}", f"quickstart-k{per_round}", arms, options, (8.0,))


def quickstart_clip(clip: str) -> Job:
    """Flower's quickstart CNN on mnist-long's federation at epsilon 8, (b) as the plan sets it up, at a
    fixed ``clip`` or ``adaptive`` (from the plan's 0.1)."""
    options = ("--preset", "mnist-long", "--model", "quickstart-cnn", "--lr", "0.15", "--seed", "0")
    options += ("--fedfilter-z", "plan", "--participation", "balanced", "--min-reports", str(PLAN_MIN_REPORTS))
    options += ("--clip", "0.1", "--adaptive-clip", "0.5") if clip == "adaptive" else ("--clip", clip)
    return Job(f"quickstart-clip-{clip}", f"quickstart-clip-{clip}", "b", options, (8.0,))


def femnist(seed: int, arms: str) -> Job:
    """FEMNIST at epsilon 8 (``femnist-long``): (a) Flower's central DP against (b) as the plan sets it
    up (every writer every round; ``min_reports`` for a 10% drop-out rate). (h) is not queued here: with
    every writer asked every round, a self-sampling writer's expected signal over noise is the
    unsampled one's at best (docs/results.md, FEMNIST at convergence length), and the plan takes rate 1."""
    options = ("--preset", "femnist-long", "--seed", str(seed), "--fedfilter-z", "plan")
    options += ("--min-reports", str(DROPOUT_MIN_REPORTS[105]))
    return Job(f"femnist-seed{seed}-{arms}", f"femnist-seed{seed}", arms, options, (8.0,))


def mnist_sampled(seed: int, budgets: str = "equal", epsilons: tuple[float, ...] = EPSILONS) -> Job:
    """(h): devices that sample themselves on mnist-long's federation, every device asked each round in
    balanced passes (the plan's z, rates and mean rate; ``fl_vs_flower_dp_plan.sampling_plan``), beside
    (g), a trusted server's Poisson-amplified DP-FedAvg, and (a). ``budgets="tiers"``: 2 / 4 / 6 at
    Jorgensen et al.'s shares (``--budgets tiers`` at epsilon 2; their mean is 3.78)."""
    options = ("--preset", "mnist-long", "--seed", str(seed), "--budgets", budgets)
    name = f"mnist-seed{seed}-sampled" + ("-tiers" if budgets == "tiers" else "")
    if budgets == "equal" and epsilons != EPSILONS:
        name += "-eps" + "-".join(f"{e:g}" for e in epsilons)
    return Job(name, name, "h", options, epsilons)


def femnist_threshold(seed: int, min_reports: int) -> Job:
    """FEMNIST (b) at another SecAgg+ threshold: at 105 (no drop-out tolerated) the sum carries (a)'s noise
    variance, which separates the threshold's cost from Skellam's in (b)'s gap to (a)."""
    options = ("--preset", "femnist-long", "--seed", str(seed), "--fedfilter-z", "plan")
    options += ("--min-reports", str(min_reports))
    name = f"femnist-seed{seed}-b-m{min_reports}"
    return Job(name, name, "b", options, (8.0,))


def mnist_trusted_everyone(seed: int) -> Job:
    """(g) asking every device (Poisson rate 1, no amplification): at a fixed 30 rounds the noise in a
    trusted server's mean falls as its rate rises (z C / (q N): 0.024 C at rate 0.2, 0.022 C at 1, at
    epsilon 1), so this is the strongest trusted baseline the mechanism allows here, and the noise (h) has."""
    options = ("--preset", "mnist-long", "--seed", str(seed), *PLAN, "--clients-per-round", "1000")
    name = f"mnist-seed{seed}-g-everyone"
    return Job(name, name, "g", options)


CLIP_SWEEP = ("0.1", "0.25", "1", "2")  # with 0.5 (the preset's) and adaptive: the tuned fixed clip

JOBS: list[Job] = (
    [mnist(0, "ae"), mnist(0, "b")]
    + [mnist_balanced(0, False), mnist_balanced(0, True)]  # what balanced passes and the adaptive clip buy
    + [mnist(s, "e") for s in (1, 2, 3, 4)]  # does the preset's length reach 0.95 at every seed? (cheap)
    + [mnist_plan(0), mnist_plan(0, "adaptive")]  # (b) as the plan sets it up: the headline arm
    + [job for s in (1, 2, 3, 4) for job in (mnist(s, "a"), mnist_plan(s))]
    + [mnist_plan(0, clip, (2.0, 8.0)) for clip in CLIP_SWEEP]  # the best fixed clip, at seed 0
    + [mnist_plan(0, "adaptive-0.2")]  # a lower target quantile where the noise is large
    + [mnist(s, "g") for s in (0, 1, 2, 3, 4)]  # a trusted server's Poisson-amplified DP-FedAvg
    + [quickstart_clip(clip) for clip in ("adaptive", "0.5", *CLIP_SWEEP)]
    + [quickstart(k, arms) for k in (25, 50, 100, 200, 400, 800, 1600) for arms in ("bd", "e")]
    + [quickstart(k, arms) for k in (5, 10) for arms in ("bd", "e")]  # below the smallest that learned
    + [femnist(0, "e")]
    + [femnist(s, arms) for s in (0, 1, 2, 3, 4) for arms in ("a", "b")]
    + [femnist_threshold(0, 105)]  # how much of (b)'s FEMNIST gap is the drop-out tolerance
    # the rest of it: (f), (a)'s mechanism through the engine, against (b) at 105; and a second seed at 105
    + [femnist(0, "f"), femnist_threshold(1, 105)]
    + [mnist_plan(s, "adaptive") for s in (1, 2, 3, 4)]
    # Devices that sample themselves (h): seed 0 first, the budget tiers and their mean, then seeds 1-4.
    + [mnist_sampled(0), mnist_sampled(0, "tiers", (2.0,)), mnist_sampled(0, "equal", (3.78,))]
    + [mnist_sampled(s) for s in (1, 2, 3, 4)]
    + [mnist_trusted_everyone(0)]  # the trusted server at its least noise, beside (h) at seed 0
)


def log(text: str) -> None:
    LONG.mkdir(parents=True, exist_ok=True)
    line = f"{time.strftime('%Y-%m-%d %H:%M:%S')} [{os.getpid()}] {text}"
    with open(LONG / "queue.log", "a") as f:
        f.write(line + "\n")
    print(line, flush=True)


def take(job: Job):
    """The job's lock, held (an open file), or None when another worker holds it."""
    (LONG / "locks").mkdir(parents=True, exist_ok=True)
    lock = open(LONG / "locks" / f"{job.name}.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        return None
    return lock


def work(jobs: list[Job]) -> int:
    """Run jobs until none is left to take (0), or until one fails (its return code: the worker stops,
    as whatever broke it, a missing data set or a bug, would break the next job too)."""
    while True:
        for job in jobs:
            if not job.missing():
                continue
            lock = take(job)
            if lock is None:
                continue
            with lock:
                if not job.missing():  # finished by a worker between the two looks
                    continue
                (LONG / "logs").mkdir(parents=True, exist_ok=True)
                log(f"start {job.name}: {' '.join(job.command()[4:])}")
                started = time.perf_counter()
                env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
                with open(LONG / "logs" / f"{job.name}.log", "a") as out:
                    code = subprocess.call(job.command(), cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env=env)
                minutes = (time.perf_counter() - started) / 60
                log(f"{'done' if code == 0 else f'FAILED ({code})'} {job.name} after {minutes:.1f} min")
                if code:
                    log(f"worker stops: see {LONG / 'logs' / f'{job.name}.log'}")
                    return code
            break  # back to the head of the queue
        else:
            return 0


def status(jobs: list[Job]) -> str:
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    lines = []
    for job in jobs:
        missing = job.missing()
        lock = None if not missing else take(job)
        state = "done" if not missing else "pending" if lock is not None else "running"
        if lock is not None:
            lock.close()
        saved = sorted((LONG / job.out / "checkpoints").glob("*.npz"))
        at = ", ".join(f"{p.stem} round {checkpoint_round(p)}" for p in saved if p.stem.endswith(tuple(job.arms)))
        lines.append(f"{job.name:<22} {state:<8} missing {len(missing):>2}" + (f"  checkpoints: {at}" if at else ""))
    return "\n".join(lines)


def curve(out: Path) -> str:
    """Test accuracy at every evaluated round of each arm under ``out``: finished arms from
    ``results.json``, running or stopped ones from their checkpoints (a stopped tuning run's curve)."""
    from fedfilter.simulations.engine.checkpoint import load_checkpoint

    rows = []
    path = out / "results.json"
    for entry in json.loads(path.read_text())["results"] if path.exists() else []:
        for arm, r in sorted(entry["arms"].items()):
            rows.append((f"eps {entry['epsilon']:g} ({arm}), finished", r["accuracy_per_round"]))
    for saved in sorted((out / "checkpoints").glob("*.npz")):
        snapshot, _ = load_checkpoint(saved)
        accuracy = snapshot.get("accuracy") or [r["accuracy"] for r in snapshot.get("records", [])]
        rows.append((f"{saved.stem}, checkpoint after round {snapshot['round_id']}", accuracy))
    return "\n".join(
        f"{name}: " + " ".join(f"{i + 1}:{a:.4f}" for i, a in enumerate(accuracy) if a is not None)
        for name, accuracy in rows
    )


SUMMARY_ARMS = (  # (column, directory under LONG with {seed}, arm letter)
    ("(a) Flower central DP", "mnist-seed{seed}", "a"),
    ("(b) fedfilter, as planned", "mnist-seed{seed}-plan", "b"),
    ("(b) adaptive clip", "mnist-seed{seed}-plan-adaptive", "b"),
    ("(h) fedfilter, devices sample", "mnist-seed{seed}-sampled", "h"),
    ("(g) trusted, amplified", "mnist-seed{seed}", "g"),
    ("(g) trusted, everyone asked", "mnist-seed{seed}-g-everyone", "g"),
    ("(e) no privacy", "mnist-seed{seed}", "e"),
)
SUMMARY_GAPS = (
    ("(b) - (a)", 1, 0),
    ("(h) - (g)", 3, 4),
    ("(h) - (g) everyone", 3, 5),
)  # (column, arm, against), indices into SUMMARY_ARMS


def _finished(seeds) -> dict[tuple[str, float], dict[int, float]]:
    """``{(column of SUMMARY_ARMS, epsilon): {seed: final accuracy}}`` of every run that finished."""
    found: dict[tuple[str, float], dict[int, float]] = {}
    for name, pattern, arm in SUMMARY_ARMS:
        for seed in seeds:
            path = LONG / pattern.format(seed=seed) / "results.json"
            for entry in json.loads(path.read_text())["results"] if path.exists() else []:
                result = entry["arms"].get(arm)
                if result is not None and result.get("accuracy") is not None:
                    found.setdefault((name, entry["epsilon"]), {})[seed] = result["accuracy"]
    return found


def _paired_gaps(found: dict[tuple[str, float], dict[int, float]], x: str, y: str, eps: float) -> list[float]:
    """Column ``x`` minus column ``y`` at ``eps``, one gap per seed both finished (in seed order)."""
    a, b = found.get((x, eps), {}), found.get((y, eps), {})
    return [a[s] - b[s] for s in sorted(set(a) & set(b))]


def _standard_error(gaps: list[float]) -> float:
    """The seeds' sample standard deviation over sqrt(n); 0 for one seed (none to spread)."""
    return statistics.stdev(gaps) / math.sqrt(len(gaps)) if len(gaps) > 1 else 0.0


def summary(seeds=(0, 1, 2, 3, 4)) -> str:
    """The MNIST study's final accuracies as a markdown table: per epsilon, each arm's per-seed values
    and their mean over the seeds that finished, and the gaps of ``SUMMARY_GAPS`` over the seeds both
    arms finished: their mean, its standard error (the seeds' sample standard deviation over sqrt(n);
    a paired comparison, so the seed-to-seed spread both arms share cancels) and each seed's."""
    found = _finished(seeds)
    epsilons = sorted({eps for _, eps in found})
    head = "| epsilon | " + " | ".join(name for name, _, _ in SUMMARY_ARMS)
    head += "".join(f" | {gap}: paired mean ± s.e. (seeds: each)" for gap, _, _ in SUMMARY_GAPS) + " |"
    lines = [head, "|---:|" + "---|" * (len(SUMMARY_ARMS) + len(SUMMARY_GAPS))]
    for eps in epsilons:
        cells = []
        for name, _, _ in SUMMARY_ARMS:
            vals = found.get((name, eps), {})
            each = " / ".join(f"{vals[s]:.3f}" for s in sorted(vals))
            cells.append(f"**{sum(vals.values()) / len(vals):.3f}** ({len(vals)}: {each})" if vals else "-")
        for _, arm, against in SUMMARY_GAPS:
            cells.append(_paired_gap(_paired_gaps(found, SUMMARY_ARMS[arm][0], SUMMARY_ARMS[against][0], eps)))
        lines.append(f"| {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


PLOTTED_ARMS = (  # the columns the plot compares, in the order of the legend
    "(a) Flower central DP",
    "(h) fedfilter, devices sample",
    "(g) trusted, amplified",
    "(g) trusted, everyone asked",
    "(e) no privacy",
)


def summary_plot(path: Path, seeds=(0, 1, 2, 3, 4)) -> None:
    """The table's arms against epsilon (each seed a dot, the mean over the seeds that finished a
    line) and, beside them, the paired gaps of (h) (each seed's, and their mean with its standard
    error) against the goal's band of one point.

    Raises
    ------
    FileNotFoundError
        No run of the study has finished under ``LONG``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    found = _finished(seeds)
    if not found:
        raise FileNotFoundError(f"no finished run of the MNIST study under {LONG}: run the long queue first.")
    fig, (ax, gap_ax) = plt.subplots(1, 2, figsize=(12.0, 4.4))
    for i, name in enumerate(PLOTTED_ARMS):
        epsilons = sorted(eps for arm, eps in found if arm == name)
        if not epsilons:
            continue
        color = f"C{i}"
        means = [statistics.mean(found[(name, eps)].values()) for eps in epsilons]
        seeds_run = max(len(found[(name, eps)]) for eps in epsilons)
        seeds = "1 seed" if seeds_run == 1 else f"up to {seeds_run} seeds"
        ax.plot(epsilons, means, "-", color=color, label=f"{name} ({seeds})")
        for eps in epsilons:
            each = list(found[(name, eps)].values())
            ax.plot([eps] * len(each), each, "o", color=color, alpha=0.45, markersize=4)
    ax.set_xscale("log", base=2)
    ax.set(xlabel="epsilon (delta 1e-5)", ylabel="final test accuracy", ylim=(0.0, 1.0))
    ax.set_title("MNIST-Dirichlet, 1,000 devices, 30 rounds: each seed a dot, the mean a line", fontsize=10)
    ax.legend(fontsize=8, loc="lower right")
    gap_ax.axhspan(-0.01, 0.01, color="grey", alpha=0.15, label="within 1 point")
    gap_ax.axhline(0.0, color="grey", lw=0.8)
    for k, (label, arm, against) in enumerate(g for g in SUMMARY_GAPS if SUMMARY_ARMS[g[1]][0].startswith("(h)")):
        x, y = SUMMARY_ARMS[arm][0], SUMMARY_ARMS[against][0]
        per_eps = {eps: _paired_gaps(found, x, y, eps) for eps in sorted({e for name, e in found if name == x})}
        per_eps = {eps: gaps for eps, gaps in per_eps.items() if gaps}
        if not per_eps:
            continue
        color, shift = f"C{k + 5}", 1.04**k  # side by side on the log axis
        epsilons = [eps * shift for eps in per_eps]
        means = [statistics.mean(g) for g in per_eps.values()]
        errors = [_standard_error(g) for g in per_eps.values()]
        gap_ax.errorbar(epsilons, means, yerr=errors, fmt="s-", color=color, capsize=3, label=f"{label}: mean ± s.e.")
        for eps, gaps in zip(epsilons, per_eps.values()):
            gap_ax.plot([eps] * len(gaps), gaps, "o", color=color, alpha=0.45, markersize=4)
    gap_ax.set_xscale("log", base=2)
    gap_ax.set(xlabel="epsilon (delta 1e-5)", ylabel="accuracy gap, paired by seed")
    gap_ax.set_title("devices that sample themselves against a trusted server", fontsize=10)
    gap_ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _paired_gap(gaps: list[float]) -> str:
    """``**mean** ± s.e. (n: each)`` of per-seed gaps; one seed has no standard error, none is "-".

    >>> _paired_gap([0.02, -0.01, 0.0]), _paired_gap([0.01]), _paired_gap([])
    ('**+0.003** ± 0.009 (3: +0.020 / -0.010 / +0.000)', '+0.010', '-')
    """
    if not gaps:
        return "-"
    each = " / ".join(f"{g:+.3f}" for g in gaps)
    if len(gaps) == 1:
        return each
    return f"**{statistics.mean(gaps):+.3f}** ± {_standard_error(gaps):.3f} ({len(gaps)}: {each})"


def quickstart_summary() -> str:
    """Flower's quickstart CNN at epsilon 8 by devices per round (markdown): final accuracy in distributed
    (b) and local (d) placement against no privacy (e), and each placement's z."""
    lines = [
        "| devices a round | (b) distributed: z, final | (d) local: z, final | (e) no privacy |",
        "|---:|---:|---:|---:|",
    ]
    for k in sorted(DROPOUT_MIN_REPORTS):
        path = LONG / f"quickstart-k{k}" / "results.json"
        if not path.exists():
            continue
        arms = json.loads(path.read_text())["results"][0]["arms"]

        def cell(arm: str) -> str:
            r = arms.get(arm)
            if r is None:
                return "-"
            z = f"{r['noise_multiplier']:g}, " if r.get("noise_multiplier") is not None else ""
            return f"{z}{r['accuracy']:.3f}"

        lines.append(f"| {k} | {cell('b')} | {cell('d')} | {cell('e')} |")
    return "\n".join(lines)


def spending(outs: list[Path]) -> str:
    """Each budget's share spent, per run (markdown): for every epsilon and arm in each ``--out``
    directory, the accuracy, z, and per budget the devices, the plan's rate (self-sampling arms) and the
    mean and least ``spent_epsilon / epsilon`` of its devices' final filters."""
    lines = [
        "| run | epsilon | arm | z | accuracy | budget | devices | rate | spent, mean | spent, least |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for out in outs:
        for entry in json.loads((out / "results.json").read_text())["results"]:
            for arm, r in sorted(entry["arms"].items()):
                tiers: dict[float, list[float]] = {}
                for d in r.get("devices") or []:
                    tiers.setdefault(float(d["epsilon"]), []).append(d["spent_epsilon"] / d["epsilon"])
                rates = (r.get("sampling_plan") or {}).get("rates", {})
                z = f"{r['noise_multiplier']:.4g}" if r.get("noise_multiplier") is not None else "-"
                for e, spent in sorted(tiers.items()):
                    rate = rates.get(repr(e))
                    lines.append(
                        f"| {out.name} | {entry['epsilon']:g} | ({arm}) | {z} | {r['accuracy']:.4f} | {e:g} | "
                        f"{len(spent)} | {'-' if rate is None else f'{rate:.3g}'} | {sum(spent) / len(spent):.3f} | "
                        f"{min(spent):.3f} |"
                    )
    return "\n".join(lines)


def trusted_noise(rates=(0.05, 0.1, 0.2, 0.5, 1.0), devices: int = 1000, rounds: int = 30) -> str:
    """A trusted server's noise in the mean by its Poisson rate (markdown): at each epsilon, the smallest z
    dp_accounting certifies for ``rounds`` Poisson-sampled Gaussian releases (``amplified_noise_multiplier``,
    (g)'s z) and the noise std of the mean over the clip, ``z / (q devices)``."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    sys.path.insert(0, str(ROOT / "tests"))  # tests/harness: the search (a) and (g) share
    from fl_vs_flower_dp_plan import amplified_noise_multiplier

    lines = ["| epsilon | " + " | ".join(f"rate {q:g}: z, noise / C" for q in rates) + " |"]
    lines.append("|---:|" + "---|" * len(rates))
    for eps in EPSILONS:
        cells = []
        for q in rates:
            z = amplified_noise_multiplier(eps, 1e-5, rounds, q)
            cells.append(f"{z:.3f}, {z / (q * devices):.4f}")
        lines.append(f"| {eps:g} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--status", action="store_true", help="print each job's state and exit")
    p.add_argument("--curve", default=None, help="print the accuracy per round of the runs in this --out directory")
    p.add_argument("--only", default=None, help="comma-separated job names (default: the whole queue)")
    p.add_argument("--summary", action="store_true", help="print the MNIST study's table (markdown) and exit")
    p.add_argument("--summary-plot", metavar="PNG", type=Path, help="plot the MNIST study's table to PNG and exit")
    p.add_argument("--quickstart", action="store_true", help="print the quickstart sweep's table (markdown) and exit")
    p.add_argument(
        "--spending", nargs="+", default=None, help="print each budget's share spent in these --out directories"
    )
    p.add_argument("--trusted-noise", action="store_true", help="print a trusted server's noise by its sampling rate")
    args = p.parse_args(argv)
    jobs = JOBS if args.only is None else [j for j in JOBS if j.name in args.only.split(",")]
    if args.status:
        print(status(jobs))
        return 0
    if args.curve:
        print(curve(Path(args.curve)))
        return 0
    if args.summary:
        print(summary())
        return 0
    if args.summary_plot:
        summary_plot(args.summary_plot)
        print(f"wrote {args.summary_plot}")
        return 0
    if args.quickstart:
        print(quickstart_summary())
        return 0
    if args.trusted_noise:
        print(trusted_noise())
        return 0
    if args.spending:
        print(spending([Path(o) for o in args.spending]))
        return 0
    return work(jobs)


if __name__ == "__main__":
    raise SystemExit(main())
