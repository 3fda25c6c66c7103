"""Reproduce Feldman & Zrnic (2021) Section 5.1 (MNIST, private GD with and without filtering) on the engine:
the driver behind ``benchmarks/reproduce_mnist.py`` (its ``main``), a library module so that tests
call it in process.

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

``--norms fast`` runs the engine's fast mode (``simulations/engine/layerwise.py``); its
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
import time
from pathlib import Path

from fedfilter.simulations.reproduce.mnist_gd import EPSILONS, REGIMES, VARIANTS
from fedfilter.simulations.reproduce.mnist_report import plot, read_rows, row_norms, table, write_table

# Priority (the machine is small): eps = 0.3 first -- the paper's three regimes, then the two
# Gaussian-DP columns of the tuned regime -- then eps = 0.5 and 1.0 the same way, then the rest.
ALL_CELLS = [(0.3, r, "paper") for r in REGIMES] + [(0.3, "tuned", "gdp-steps"), (0.3, "tuned", "gdp-noise")]
for _e in (0.5, 1.0):
    ALL_CELLS += [(_e, r, "paper") for r in REGIMES] + [(_e, "tuned", "gdp-steps"), (_e, "tuned", "gdp-noise")]
ALL_CELLS += [(e, r, v) for e in EPSILONS for r in ("subopt-clip", "subopt-noise") for v in ("gdp-steps", "gdp-noise")]


def parse_cells(items: list[str]) -> list[tuple[float, str, str]]:
    """``--cells``: ``eps:regime:variant`` items, or ``all`` for every cell in priority order.

    Parameters
    ----------
    items : list of str
        The items given.

    Returns
    -------
    list of (float, str, str)
        The cells.

    Raises
    ------
    SystemExit
        Naming every bad item.

    Examples
    --------
    >>> parse_cells(["0.3:tuned:paper", "1.0:subopt-noise:gdp-steps"])
    [(0.3, 'tuned', 'paper'), (1.0, 'subopt-noise', 'gdp-steps')]
    >>> len(parse_cells(["all"])) == len(ALL_CELLS)
    True
    """
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


def done_keys(path: Path) -> set[tuple]:
    r"""The (eps, regime, variant, trial, n_train, norms) of every row already in ``path``.

    Parameters
    ----------
    path : Path
        The ``--out`` JSONL file.

    Returns
    -------
    set of tuple
        One key per finished trial.

    Examples
    --------
    >>> import tempfile
    >>> row = {"setting": {"epsilon": 0.3, "regime": "tuned", "variant": "paper"}, "trial": 0, "n_train": 60000}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = (Path(d) / "mnist.jsonl").write_text(json.dumps(row) + "\n")
    ...     done_keys(Path(d) / "mnist.jsonl")
    {(0.3, 'tuned', 'paper', 0, 60000, 'vectorised')}
    """
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
    """Where a cell's checkpoint lives while it runs (beside ``--out``; not tracked by git).

    Parameters
    ----------
    out : Path
        The ``--out`` JSONL file.
    eps : float
        The cell's epsilon.
    regime, variant : str
        The cell's regime and column.
    trial : int
        The trial.
    n : int
        The training-set size.
    activation : str
        The model's activation.
    norms : str, optional
        The engine's norm mode (the default keeps the names of checkpoints parked before the modes
        existed).

    Returns
    -------
    Path
        ``checkpoints/<stem>_<cell>.npz`` beside ``out``.

    Examples
    --------
    >>> checkpoint_path(Path("results/mnist.jsonl"), 0.3, "tuned", "paper", 0, 60000, "relu").as_posix()
    'results/checkpoints/mnist_0.3_tuned_paper_t0_n60000_relu.npz'
    """
    tail = "" if norms == "vectorised" else f"_{norms}"  # the default keeps the names parked before norm modes existed
    return out.parent / "checkpoints" / f"{out.stem}_{eps}_{regime}_{variant}_t{trial}_n{n}_{activation}{tail}.npz"


def parked_path(ckpt: Path) -> Path:
    """Where ``--park`` keeps a cell's checkpoint in git (``results/parked/``, beside ``checkpoints/``).

    Parameters
    ----------
    ckpt : Path
        The working checkpoint.

    Returns
    -------
    Path
        The parked copy's path.

    Examples
    --------
    >>> parked_path(Path("results/checkpoints/mnist_0.3_tuned_paper_t0_n60000_relu.npz")).as_posix()
    'results/parked/mnist_0.3_tuned_paper_t0_n60000_relu.npz'
    """
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
    """The last step saved for a cell, in its working or its parked checkpoint (0: none).

    Parameters
    ----------
    ckpt : Path
        The working checkpoint.

    Returns
    -------
    int
        The step.

    Examples
    --------
    >>> saved_round(Path("no/such/checkpoints/cell.npz"))
    0
    """
    from fedfilter.simulations.engine.checkpoint import checkpoint_round

    return max([checkpoint_round(p) for p in (ckpt, parked_path(ckpt)) if p.exists()], default=0)


def unpark(ckpt: Path) -> int:
    """Put a cell's parked checkpoint in the working place if it is further along; return its step.

    Parameters
    ----------
    ckpt : Path
        The working checkpoint.

    Returns
    -------
    int
        The parked step copied, or 0 (nothing parked, or the working one is as far).

    Examples
    --------
    >>> unpark(Path("no/such/checkpoints/cell.npz"))
    0
    """
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
    """Copy every unfinished cell's working checkpoint of ``--out`` to ``parked/`` (to be committed).

    Parameters
    ----------
    args : argparse.Namespace
        ``out``.

    Returns
    -------
    list of str
        One line per checkpoint (or one saying there is none).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     park(argparse.Namespace(out=str(Path(d) / "mnist.jsonl")))[0].startswith("nothing to park")
    True
    """
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
    """Trials each column needs: at least 1 per cell, 3 for eps = 0.3.

    The paper's columns at eps = 0.3 get 3; the Gaussian-DP columns, which the paper has no numbers
    for, 1.

    Parameters
    ----------
    eps : float
        The cell's epsilon.
    variant : str
        The cell's column.

    Returns
    -------
    int
        The trials.

    Examples
    --------
    >>> required_trials(0.3, "paper"), required_trials(0.3, "gdp-steps"), required_trials(1.0, "paper")
    (3, 1, 1)
    """
    return 3 if (eps == 0.3 and variant == "paper") else 1


def todo(args) -> str:
    """The (cell, trial)s still missing from ``--out``, with their steps left and the hours they need.

    In ``ALL_CELLS`` order; a cell's checkpoint counts as done up to its last saved step.

    Parameters
    ----------
    args : argparse.Namespace
        ``out``, ``n_table``, ``norms``, ``activation``, ``step_seconds``, ``workers``.

    Returns
    -------
    str
        A Markdown table and a total.

    Examples
    --------
    It calibrates every cell's filter (several seconds); ``main(["--todo"])`` prints it:

    >>> print(todo(args))  # doctest: +SKIP
    | eps | regime | column | trial | steps | left | checkpoint |
    ...
    """
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


def machine() -> str:
    """The machine a row ran on: host, CPUs, torch and its threads, python.

    Returns
    -------
    str
        One line.

    Examples
    --------
    >>> "CPUs, torch " in machine()
    True
    """
    import torch

    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, torch {torch.__version__} "
        f"({torch.get_num_threads()} threads), python {platform.python_version()}"
    )


def run(args) -> None:
    """Run every cell of ``--cells`` for ``--trials`` trials, skipping what ``--out`` already has.

    Parameters
    ----------
    args : argparse.Namespace
        ``main``'s options.

    Examples
    --------
    It trains the MNIST model for hundreds of steps per cell; ``main`` calls it with its options:

    >>> main(["--cells", "0.3:tuned:paper", "--trials", "1"])  # doctest: +SKIP
    """
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
    """Yield whether this process holds the cell (an exclusive flock beside its checkpoint).

    Two workers given overlapping cell lists thus never run, checkpoint or append the same cell twice.

    Parameters
    ----------
    ckpt : Path
        The cell's checkpoint path (the lock is ``<ckpt>.lock``).

    Yields
    ------
    bool
        True if this process holds the cell.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     ckpt = Path(d) / "checkpoints" / "cell.npz"
    ...     with cell_lock(ckpt) as mine, cell_lock(ckpt) as again:
    ...         mine, again
    (True, False)
    """
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
    """Run one (cell, trial), append its row to ``out`` and remove its checkpoints.

    Parameters
    ----------
    args : argparse.Namespace
        ``main``'s options.
    task : Task
        The MNIST task.
    out : Path
        The JSONL file.
    ckpt : Path
        The cell's checkpoint.
    eps : float
        The cell's epsilon.
    regime, variant : str
        The cell's regime and column.
    trial : int
        The trial.

    Examples
    --------
    It trains the model (``run`` calls it for each cell it holds):

    >>> run_one(args, task, out, ckpt, 0.3, "tuned", "paper", 0)  # doctest: +SKIP
    """
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


def main(argv=None) -> None:
    """``benchmarks/reproduce_mnist.py``: run cells, or report on ``--out`` (see the module docstring).

    Parameters
    ----------
    argv : list of str, optional
        The arguments (default: ``sys.argv[1:]``).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     main(["--park", "--out", str(Path(d) / "mnist.jsonl")])  # doctest: +ELLIPSIS
    nothing to park: no checkpoint of mnist in /.../checkpoints
    """
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
        "(fast: simulations/engine/layerwise.py)",
    )
    p.add_argument(
        "--checkpoint-every",
        type=int,
        default=5,
        help="save a running cell every N steps (results/checkpoints/); a restarted run resumes there",
    )
    p.add_argument("--out", default="fedfilter/simulations/reproduce/results/mnist.jsonl")
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
