"""``fedfilter study dropout``: how clients drop out under different budgets (vectorised engine)."""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

# The study files installed with fedfilter (package data of fedfilter.simulations).
PACKAGED = resources.files("fedfilter.simulations") / "configs"


def packaged_configs() -> dict[str, Path]:
    """Name (file stem) -> path of every study file installed with fedfilter.

    Returns
    -------
    dict of str to Path
        One entry per packaged ``.toml`` study.

    Examples
    --------
    >>> packaged_configs()["smoke"].name
    'smoke.toml'
    """
    return {Path(f.name).stem: Path(str(f)) for f in PACKAGED.iterdir() if f.name.endswith(".toml")}


def study_config(value: str) -> Path:
    """``--config``: a study file, or the name of a packaged one (``smoke``, ``smoke.toml``).

    Parameters
    ----------
    value : str
        A path to a study TOML file, or a packaged study's name with or without ``.toml``.

    Returns
    -------
    Path
        The study file.

    Raises
    ------
    ValueError
        Neither a file nor a packaged study (the message lists the packaged ones).

    Examples
    --------
    >>> study_config("smoke.toml") == study_config("smoke") == packaged_configs()["smoke"]
    True
    """
    path = Path(value)
    if path.is_file():
        return path
    packaged = packaged_configs()
    name = path.stem if path.suffix == ".toml" and path.parent == Path(".") else value
    if name in packaged:
        return packaged[name]
    raise ValueError(
        f"--config {value!r} is neither a file nor a packaged study (packaged: {', '.join(sorted(packaged))}; "
        f"in {PACKAGED})."
    )


def _dropout(args: argparse.Namespace) -> int:
    from fedfilter.simulations.study.config import load_study

    args.config = str(study_config(args.config))
    study = load_study(args.config)  # StudyConfigError (a ValueError) lists every problem
    runs = study.runs()
    if args.dry_run:
        print(f"{args.config}: valid; {len(runs)} runs x {study.rounds} rounds")
        for i, r in enumerate(runs, 1):
            print(f"{i:4d}  {r.label}    [{r.heterogeneity.describe(r.budget_level)}]")
        return 0
    if not args.out:
        raise ValueError("--out is required to run a study (a folder for results.json, report.md and plots).")
    from fedfilter.simulations.study.runner import run_study

    results = run_study(study, args.out, progress=not args.no_progress)
    n = len(results["runs"])
    print(
        f"{n} runs in {results['seconds']:.0f} s; wrote {args.out}/results.json, {args.out}/report.md and plots",
        file=sys.stderr,
    )
    return 0


def _report(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from fedfilter.simulations.study.report import write_outputs

    path = Path(args.out) / "results.json"
    if not path.is_file():
        raise ValueError(f"--out {args.out!r} holds no results.json (run 'fedfilter study dropout' first).")
    results = json.loads(path.read_text(encoding="utf-8"))
    if not results.get("runs"):
        raise ValueError(f"{str(path)!r} has no finished runs yet.")
    write_outputs(results, args.out)
    print(f"wrote {args.out}/report.md and plots from {len(results['runs'])} runs", file=sys.stderr)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``study dropout`` and ``study report`` to the ``fedfilter`` command.

    Parameters
    ----------
    sub : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["study", "dropout", "--config", "smoke", "--dry-run"])
    >>> args.func(args)  # doctest: +ELLIPSIS
    /.../smoke.toml: valid; 16 runs x 20 rounds
       1  digits-iid, eps 4 fixed, noise-only, local    [epsilon_i = 4 for every client]
    ...
    0
    """
    p = sub.add_parser("study", help="studies of how clients drop out (vectorised engine)")
    studies = p.add_subparsers(dest="study", required=True)
    names = ", ".join(sorted(packaged_configs()))
    d = studies.add_parser(
        "dropout",
        help="sweep budgets, heterogeneity, modes and data; write results.json, report.md and plots",
        description="Run every point of a TOML study and write OUT/results.json, OUT/report.md and PNG "
        f"plots. Studies installed with fedfilter: {names} (e.g. --config smoke; the files are in "
        f"{PACKAGED}: copy one to start your own).",
    )
    d.add_argument("--config", required=True, help=f"a study TOML file, or a packaged study's name ({names})")
    d.add_argument("--out", help="output folder (created if missing)")
    d.add_argument("--dry-run", action="store_true", help="check the config and list the runs, run nothing")
    d.add_argument("--no-progress", action="store_true", help="no progress bar")
    d.set_defaults(func=_dropout)

    r = studies.add_parser(
        "report", help="redraw report.md and the plots from OUT/results.json (e.g. of a study stopped early)"
    )
    r.add_argument("--out", required=True, help="folder holding results.json")
    r.set_defaults(func=_report)
