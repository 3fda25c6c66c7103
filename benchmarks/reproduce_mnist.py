"""Reproduce papers/004 Section 5.1 (MNIST, private GD with and without filtering) on the engine.

Each (eps, regime, variant, trial) cell is one run of Algorithm 7 whose first k steps are
Algorithm 6 (``fedfilter.simulations.reproduce.private_gd``). Results are appended, one JSON line per cell
and trial, to ``--out``; cells already there are skipped, so a killed run resumes where it was.

    nice -n 10 python benchmarks/reproduce_mnist.py --cells 0.3:tuned:paper --trials 1 \
        > reproduce_mnist.log 2>&1 &
    python benchmarks/reproduce_mnist.py --table
    python benchmarks/reproduce_mnist.py --plot docs/reproduce_mnist.png
    python benchmarks/reproduce_mnist.py --write-table docs/results.md   # refresh its marked table
    python benchmarks/reproduce_mnist.py --todo                          # what is left, in hours

A running cell is checkpointed every ``--checkpoint-every`` steps beside ``--out``
(``checkpoints/``, not tracked), so even a cell stopped halfway resumes from its last checkpoint.
A cell can take longer than a working session (eps 1.0 with the Gaussian-DP filter is 718 steps,
over 3 h here), and a new session gets a fresh work tree; so before a session ends,

    python benchmarks/reproduce_mnist.py --park      # copy each unfinished cell's checkpoint to parked/

and commit ``parked/`` (1.5 MB a cell). A run resumes from a parked checkpoint when it is further
along than the working one, and removes it once the cell's row is stored.

``--norms fast`` runs the engine's fast mode (``simulations/engine/layerwise.py``, issue 16); its
rows carry ``"norms": "fast"`` and are stored, skipped, checkpointed and tabulated apart from the
default ``vectorised`` rows (``--table --norms fast``), which stay as they are.

``--cells`` takes ``eps:regime:variant`` items (``all`` for every cell, in priority order);
``--n-train`` runs on the first N training images (smoke tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedfilter.simulations.reproduce.mnist_gd import EPSILONS, PAPER_TABLES, REGIMES, VARIANTS  # noqa: E402

# Priority (the machine is small): eps = 0.3 first -- the paper's three regimes, then the two
# Gaussian-DP columns of the tuned regime -- then eps = 0.5 and 1.0 the same way, then the rest.
ALL_CELLS = [(0.3, r, "paper") for r in REGIMES] + [(0.3, "tuned", "gdp-steps"), (0.3, "tuned", "gdp-noise")]
for _e in (0.5, 1.0):
    ALL_CELLS += [(_e, r, "paper") for r in REGIMES] + [(_e, "tuned", "gdp-steps"), (_e, "tuned", "gdp-noise")]
ALL_CELLS += [(e, r, v) for e in EPSILONS for r in ("subopt-clip", "subopt-noise") for v in ("gdp-steps", "gdp-noise")]


def parse_cells(items: list[str]) -> list[tuple[float, str, str]]:
    if items == ["all"]:
        return ALL_CELLS
    cells, problems = [], []
    for item in items:
        parts = item.split(":")
        try:
            eps, regime, variant = float(parts[0]), parts[1], parts[2]
        except (ValueError, IndexError):
            problems.append(f"{item!r} is not eps:regime:variant")
            continue
        if eps not in EPSILONS or regime not in REGIMES or variant not in VARIANTS:
            problems.append(f"{item!r}: eps in {EPSILONS}, regime in {REGIMES}, variant in {VARIANTS}")
            continue
        cells.append((eps, regime, variant))
    if problems:
        raise SystemExit("bad --cells: " + "; ".join(problems))
    return cells


def read_rows(path: Path) -> list[dict]:
    """The JSONL results, one dict per finished trial ([] before the first)."""
    path = Path(path)
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def row_norms(row: dict) -> str:
    """The engine's norm mode a row ran with (rows from before issue 16 ran ``vectorised``)."""
    return row.get("norms", "vectorised")


def done_keys(path: Path) -> set[tuple]:
    return {
        (
            r["setting"]["epsilon"],
            r["setting"]["regime"],
            r["setting"]["variant"],
            r["trial"],
            r["n_train"],
            row_norms(r),
        )
        for r in read_rows(path)
    }


def checkpoint_path(
    out: Path, eps: float, regime: str, variant: str, trial: int, n: int, activation: str, norms: str = "vectorised"
) -> Path:
    """Where a cell's checkpoint lives while it runs (beside ``--out``; not tracked by git)."""
    tail = "" if norms == "vectorised" else f"_{norms}"  # the default keeps the names parked before issue 16
    return out.parent / "checkpoints" / f"{out.stem}_{eps}_{regime}_{variant}_t{trial}_n{n}_{activation}{tail}.npz"


def parked_path(ckpt: Path) -> Path:
    """Where ``--park`` keeps a cell's checkpoint in git (``results/parked/``, beside ``checkpoints/``)."""
    return ckpt.parent.parent / "parked" / ckpt.name


def _copy_atomic(src: Path, dst: Path) -> None:
    """Copy so that a reader (or a kill) sees the old file or the new one, never half of one. The
    source is itself only ever replaced by rename, so the copy is of one whole checkpoint."""
    import shutil

    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.copyfile(src, tmp)
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, dst)


def saved_round(ckpt: Path) -> int:
    """The last step saved for a cell, in its working or its parked checkpoint (0: none)."""
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    return max([checkpoint_round(p) for p in (ckpt, parked_path(ckpt)) if p.exists()], default=0)


def unpark(ckpt: Path) -> int:
    """Put a cell's parked checkpoint in the working place if it is further along; return its step."""
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    parked = parked_path(ckpt)
    if not parked.exists():
        return 0
    step = checkpoint_round(parked)
    if not ckpt.exists() or checkpoint_round(ckpt) < step:
        _copy_atomic(parked, ckpt)
        return step
    return 0


def park(args) -> list[str]:
    """Copy every unfinished cell's working checkpoint of ``--out`` to ``parked/`` (to be committed)."""
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    out = Path(args.out)
    done = []
    for ckpt in sorted((out.parent / "checkpoints").glob(f"{out.stem}_*.npz")):
        dst = parked_path(ckpt)
        if dst.exists() and checkpoint_round(dst) >= checkpoint_round(ckpt):
            done.append(f"{dst} already at step {checkpoint_round(dst)}")
            continue
        _copy_atomic(ckpt, dst)
        done.append(f"parked {dst} at step {checkpoint_round(dst)}")
    return done or [f"nothing to park: no checkpoint of {out.stem} in {out.parent / 'checkpoints'}"]


def required_trials(eps: float, variant: str) -> int:
    """Trials each column needs (the issue: at least 1 per cell, 3 for eps = 0.3). The paper's
    columns at eps = 0.3 get 3; the Gaussian-DP columns, which the paper has no numbers for, 1."""
    return 3 if (eps == 0.3 and variant == "paper") else 1


def todo(args) -> str:
    """The (cell, trial)s still missing from ``--out``, in ALL_CELLS order, with their steps left
    (a cell's checkpoint counts as done up to its last saved step) and the hours they need."""
    from fedfilter.simulations.reproduce.mnist_gd import setting

    done = done_keys(args.out)
    lines = ["| eps | regime | column | trial | steps | left | checkpoint |", "|---|---|---|---|---|---|---|"]
    total = 0
    for eps, regime, variant in ALL_CELLS:
        s = setting(eps, regime, variant)
        steps = s.k + s.extra_steps
        for trial in range(required_trials(eps, variant)):
            if (eps, regime, variant, trial, args.n_table, args.norms) in done:
                continue
            ckpt = checkpoint_path(
                Path(args.out), eps, regime, variant, trial, args.n_table, args.activation, args.norms
            )
            saved, where = saved_round(ckpt), "-"  # read, never locked: a report must not make a worker skip a cell
            if saved:
                newest = max((p for p in (ckpt, parked_path(ckpt)) if p.exists()), key=lambda p: p.stat().st_mtime)
                where = f"step {saved}, saved {(time.time() - newest.stat().st_mtime) / 60:.0f} min ago"
            total += steps - saved
            lines.append(f"| {eps} | {regime} | {variant} | {trial} | {steps} | {steps - saved} | {where} |")
    hours = total * args.step_seconds / args.workers / 3600
    lines.append(
        f"\n{len(lines) - 2} runs, {total} steps left: about {hours:.1f} h at {args.step_seconds:g} s "
        f"a step with {args.workers} workers (--step-seconds, --workers)."
    )
    return "\n".join(lines)


TABLE_START = "<!-- mnist-table: python benchmarks/reproduce_mnist.py --table -->"
TABLE_END = "<!-- /mnist-table -->"


def write_table(args) -> Path:
    """Replace the block between the table markers of a Markdown file with ``table(args)``."""
    doc = Path(args.write_table)
    text = doc.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"--write-table {doc}: no {TABLE_START!r} ... {TABLE_END!r} block to replace")
    doc.write_text(text[:start] + TABLE_START + "\n" + table(args).strip() + "\n" + text[end:])
    return doc


def machine() -> str:
    import torch

    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), python {platform.python_version()}"
    )


def run(args) -> None:
    import torch

    from fedfilter.simulations.reproduce.mnist_gd import mnist_task

    torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    task = mnist_task(args.n_train, args.activation)
    n = task.num_clients
    done = done_keys(out)
    print(f"machine: {machine()}", flush=True)
    for eps, regime, variant in parse_cells(args.cells):
        for trial in range(args.trials):
            ckpt = checkpoint_path(out, eps, regime, variant, trial, n, args.activation, args.norms)
            with cell_lock(ckpt) as mine:
                done |= done_keys(out)  # another worker may have finished it meanwhile
                if not mine:
                    print(f"skip {eps} {regime} {variant} trial {trial}: running in another process", flush=True)
                elif (eps, regime, variant, trial, n, args.norms) in done:
                    print(f"skip {eps} {regime} {variant} trial {trial}: already in {out}", flush=True)
                else:
                    if step := unpark(ckpt):
                        print(
                            f"resume {eps} {regime} {variant} trial {trial} from {parked_path(ckpt)} (step {step})",
                            flush=True,
                        )
                    run_one(args, task, out, ckpt, eps, regime, variant, trial)


@contextlib.contextmanager
def cell_lock(ckpt: Path):
    """Yield whether this process holds the cell (an exclusive flock beside its checkpoint), so two
    workers given overlapping cell lists never run, checkpoint or append the same cell twice."""
    import fcntl

    ckpt.parent.mkdir(parents=True, exist_ok=True)
    with open(ckpt.with_suffix(".lock"), "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True  # released when the file closes


def run_one(args, task, out: Path, ckpt: Path, eps: float, regime: str, variant: str, trial: int) -> None:
    from fedfilter.simulations.reproduce.mnist_gd import setting
    from fedfilter.simulations.reproduce.private_gd import run_cell

    s = setting(eps, regime, variant)
    print(
        f"=== eps={eps} {regime} {variant} trial {trial} (norms={args.norms}): sigma={s.sigma:.6g} C={s.clip:g} "
        f"eta={s.eta:g} k={s.k} B_norm={s.b_norm:g} filter={s.filter_kind}@eps={s.filter_epsilon!r} "
        f"steps={s.k + s.extra_steps} n={task.num_clients}",
        flush=True,
    )
    t0 = time.time()
    result = run_cell(
        s,
        task,
        trial=trial,
        seed=args.seed + trial,
        chunk_size=args.chunk_size,
        norms=args.norms,
        checkpoint=ckpt,
        checkpoint_every=args.checkpoint_every,
        log=lambda m: print(f"  [{time.time() - t0:7.0f}s] {m}", flush=True),
    )
    row = {
        **result.__dict__,
        "activation": args.activation,
        "norms": args.norms,
        "machine": machine(),
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    with out.open("a") as f:
        f.write(json.dumps(row) + "\n")
        f.flush()
        os.fsync(f.fileno())
    ckpt.unlink(missing_ok=True)  # the row is on disk: the checkpoint has served
    parked_path(ckpt).unlink(missing_ok=True)  # (commit its removal with the row)
    print(
        f"=== done: GD {result.gd_test_accuracy:.4f}, filtered {result.filtered_test_accuracy:.4f} "
        f"(step {result.chosen_step}), {result.seconds:.0f} s",
        flush=True,
    )


def table(args) -> str:
    """Markdown tables of the JSONL results beside papers/004 Section 5.1's."""
    import numpy as np

    rows = read_rows(args.out)
    fmt = lambda v: (
        "-"
        if not v
        else (f"{100 * np.mean(v):.2f}" + (f" ± {100 * np.std(v):.2f}" if len(v) > 1 else "") + f" (n={len(v)})")
    )

    def inside(v, mean, std):  # our mean within the paper's mean ± std
        return "-" if not v else ("yes" if abs(100 * np.mean(v) - mean) <= std else "no")

    lines = []
    for regime in REGIMES:
        lines += [
            f"\n**{regime}** (papers/004 Section 5.1 table '{regime}'; test accuracy %, mean ± std over "
            "trials; ours: population std, as for Adult)\n",
            "| eps | paper: GD | paper: GD + filter | ours: GD | ours: GD + filter | inside paper's mean ± std "
            "(GD / + filter) | GDP filter, paper's sigma (a): k / GD / + filter | GDP filter, paper's k (b): "
            "sigma / GD / + filter |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for eps in EPSILONS:
            (g, gs), (f, fs) = PAPER_TABLES[regime][eps]
            sel = lambda v: [
                r
                for r in rows
                if r["setting"]["epsilon"] == eps
                and r["setting"]["regime"] == regime
                and r["setting"]["variant"] == v
                and r["n_train"] == args.n_table
                and row_norms(r) == args.norms
            ]
            acc = lambda rs, key: [r[key] for r in rs]
            p, a, b = sel("paper"), sel("gdp-noise"), sel("gdp-steps")
            gd, fl = acc(p, "gd_test_accuracy"), acc(p, "filtered_test_accuracy")
            col_a = (
                (
                    f"{a[0]['setting']['k']} / {fmt(acc(a, 'gd_test_accuracy'))} / "
                    f"{fmt(acc(a, 'filtered_test_accuracy'))}"
                )
                if a
                else "-"
            )
            col_b = (
                (
                    f"{b[0]['setting']['sigma']:.1f} / {fmt(acc(b, 'gd_test_accuracy'))} / "
                    f"{fmt(acc(b, 'filtered_test_accuracy'))}"
                )
                if b
                else "-"
            )
            lines.append(
                f"| {eps} | {g:.2f} ± {gs:.2f} | {f:.2f} ± {fs:.2f} | {fmt(gd)} | {fmt(fl)} | "
                f"{inside(gd, g, gs)} / {inside(fl, f, fs)} | {col_a} | {col_b} |"
            )
    return "\n".join(
        lines + ["", privacy_check([r for r in rows if r["n_train"] == args.n_table and row_norms(r) == args.norms])]
    )


def privacy_check(rows: list[dict]) -> str:
    """One line on the guarantee behind the table: in every run, each client's spent epsilon (read
    from the filter that ran it) is at most the filter's budget, and the first k steps clipped at
    exactly C (so the GD column is Algorithm 6 itself). Runs that break either are named."""
    if not rows:
        return "Privacy check: no runs yet."
    name = lambda r: f"eps {r['setting']['epsilon']} {r['setting']['regime']} {r['setting']['variant']} #{r['trial']}"
    over = [name(r) for r in rows if r["max_spent_epsilon"] > r["setting"]["filter_epsilon"]]
    short = [name(r) for r in rows if r["prefix_max_clip_deficit"] > 0]
    if over or short:
        return (
            f"**Privacy check FAILED**: spent epsilon above budget in {over or 'none'}; "
            f"first k steps clipped below C in {short or 'none'}."
        )
    margin = min(r["setting"]["filter_epsilon"] - r["max_spent_epsilon"] for r in rows)
    return (
        f"Privacy check: in all {len(rows)} runs every client's spent epsilon is at most its filter's "
        f"budget (smallest margin {margin:.3g}), and every run's first k steps clipped at exactly C."
    )


def plot(args) -> Path:
    """One PNG. Top: ours against papers/004's mean ± std per cell, with the two Gaussian-DP
    columns beside them. Bottom, one panel per eps: each run's test accuracy at the stopping rule's
    queries (step k onwards), the star marking the query the rule picks by training accuracy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    rows = [r for r in read_rows(args.out) if r["n_train"] == args.n_table and row_norms(r) == args.norms]
    fig = plt.figure(figsize=(14, 9))
    grid = fig.add_gridspec(2, 3, height_ratios=(1.1, 1))
    ax = fig.add_subplot(grid[0, :])
    cells = [(e, g) for g in REGIMES for e in EPSILONS]
    xs = np.arange(len(cells))
    of = lambda e, g, v: [
        r for r in rows if r["setting"]["epsilon"] == e and r["setting"]["regime"] == g and r["setting"]["variant"] == v
    ]
    for off, key, (pi, label, color) in (
        (-0.3, "gd_test_accuracy", (0, "GD", "tab:blue")),
        (-0.1, "filtered_test_accuracy", (1, "GD + filter", "tab:orange")),
    ):
        mean = [PAPER_TABLES[g][e][pi][0] for e, g in cells]
        std = [PAPER_TABLES[g][e][pi][1] for e, g in cells]
        ax.errorbar(
            xs + off, mean, yerr=std, fmt="_", color=color, capsize=4, alpha=0.6, label=f"paper: {label} (mean ± std)"
        )
        ours = [(i + off, 100 * r[key]) for i, (e, g) in enumerate(cells) for r in of(e, g, "paper")]
        if ours:
            ax.plot(*zip(*ours), "o", color=color, ms=6, label=f"ours: {label}")
    for off, variant, marker, name in (
        (0.1, "gdp-noise", "^", "GDP filter, paper's sigma (a)"),
        (0.3, "gdp-steps", "v", "GDP filter, paper's k (b)"),
    ):
        for key, color, which in (
            ("gd_test_accuracy", "tab:blue", "GD"),
            ("filtered_test_accuracy", "tab:orange", "+ filter"),
        ):
            pts = [(i + off, 100 * r[key]) for i, (e, g) in enumerate(cells) for r in of(e, g, variant)]
            if pts:
                ax.plot(*zip(*pts), marker, color=color, ms=7, mfc="none", label=f"{name}: {which}")
    ax.set_xticks(xs, [f"{g}\neps {e}" for e, g in cells], fontsize=8)
    ax.set_ylabel("test accuracy (%)")
    ax.set_title(
        "papers/004 Section 5.1: MNIST, 60,000 single-example clients (paper's columns left of "
        "each tick, Gaussian-DP columns right)"
    )
    ax.legend(fontsize=7, loc="lower right", ncol=2)
    colors = {(g, v): plt.cm.tab10(i) for i, (g, v) in enumerate((g, v) for g in REGIMES for v in VARIANTS)}
    for j, eps in enumerate(EPSILONS):
        ax2 = fig.add_subplot(grid[1, j])
        labelled = set()
        for r in (r for r in rows if r["setting"]["epsilon"] == eps):
            s = r["setting"]
            c = colors[(s["regime"], s["variant"])]
            name = f"{s['regime']} {s['variant']} (k {s['k']})"
            ax2.plot(
                r["query_steps"],
                [100 * a for a in r["query_test_accuracy"]],
                "-o",
                ms=3,
                color=c,
                alpha=0.8,
                label=None if name in labelled else name,
            )
            ax2.plot([r["chosen_step"]], [100 * r["filtered_test_accuracy"]], "*", ms=11, color=c)
            labelled.add(name)
        ax2.set_title(f"eps {eps}: test accuracy at each query", fontsize=9)
        ax2.set_xlabel("step (the first query is step k)")
        if j == 0:
            ax2.set_ylabel("test accuracy (%); star = stopping rule's pick")
        if labelled:
            ax2.legend(fontsize=6.5)
    fig.tight_layout()
    out = Path(args.plot)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cells", nargs="+", default=["0.3:tuned:paper"])
    p.add_argument("--trials", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-train", type=int, default=None)
    p.add_argument("--activation", default="relu", choices=("relu", "tanh"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--chunk-size", type=int, default=512)
    p.add_argument(
        "--norms",
        default="vectorised",
        choices=("vectorised", "fast", "device"),
        help="the engine's norm mode; rows of each mode are stored, skipped and tabulated apart "
        "(fast: simulations/engine/layerwise.py, issue 16)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        help="save a running cell every N steps (results/checkpoints/); a restarted run resumes there",
    )
    p.add_argument("--out", default="simulations/reproduce/results/mnist.jsonl")
    p.add_argument("--table", action="store_true", help="print the tables from --out and exit")
    p.add_argument("--n-table", type=int, default=60000, help="training-set size of the rows to tabulate")
    p.add_argument("--plot", metavar="PNG", help="draw the results of --out into PNG and exit")
    p.add_argument("--write-table", metavar="MD", help="replace the marked MNIST table block of MD and exit")
    p.add_argument("--todo", action="store_true", help="list the runs still missing from --out and exit")
    p.add_argument(
        "--park",
        action="store_true",
        help="copy unfinished cells' checkpoints to parked/ beside --out (commit it) and exit",
    )
    p.add_argument("--step-seconds", type=float, default=15.0, help="--todo: seconds per 60,000-client step")
    p.add_argument("--workers", type=int, default=2, help="--todo: workers running side by side")
    args = p.parse_args(argv)
    if args.plot:
        print(f"wrote {plot(args)}")
    elif args.write_table:
        print(f"wrote {write_table(args)}")
    elif args.todo:
        print(todo(args))
    elif args.park:
        print("\n".join(park(args)))
    elif args.table:
        print(table(args))
    else:
        run(args)


if __name__ == "__main__":
    main()
