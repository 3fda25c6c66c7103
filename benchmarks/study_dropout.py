"""The dropout study as a benchmark: run a study config and print its runs table (markdown).

The run is ``fedfilter study dropout`` itself (``fedfilter.simulations.study``: the same config checks, the
same runner, so OUT gets the same results.json, report.md and plots); this script adds the
machine and the wall time, and prints report.md's "Runs" table to stdout.

    nice -n 10 python benchmarks/study_dropout.py --config simulations/configs/smoke.toml --out out/smoke
    nice -n 10 python benchmarks/study_dropout.py --config simulations/configs/dropout_full.toml \
        --out out/dropout_full > study_dropout.log 2>&1 &
    # the table of a study already run (e.g. the committed full study), without running anything
    python benchmarks/study_dropout.py --from docs/results_study/dropout_full

Below the table, one line checks the budgets: the largest share of a budget any client spent
(at most 1) and whether every client of every run is within its own budget (the filter's exact check).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

MACHINE_FILE = "benchmark_machine.txt"  # written beside results.json, read back by --from


def machine() -> str:
    import torch

    return (
        f"{platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load average "
        f"{os.getloadavg()[0]:.1f} at the end, torch {torch.__version__}, python {platform.python_version()}"
    )


def table(results: dict) -> str:
    from fedfilter.simulations.study.report import runs_table

    runs = results["runs"]
    planned = results.get("runs_planned", len(runs))
    ex = [r["exhaustion"] for r in runs]
    within = sum(bool(e["all_within_budget"]) for e in ex)
    lines = [
        f"study {results['study']}: {len(runs)} of {planned} runs, {runs[0]['rounds'] if runs else 0} rounds "
        f"each, filter {results['filter']} at delta = {results['delta']:g}",
        "",
        *runs_table(runs),
        "",
    ]
    if runs:
        lines.append(
            f"budgets: max share of a budget spent {max(e['max_spent_fraction'] for e in ex):.6f} (<= 1); "
            f"every client within its budget in {within}/{len(runs)} runs"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", help="study TOML file (see simulations/configs/)")
    p.add_argument("--out", help="output folder for results.json, report.md and plots (created if missing)")
    p.add_argument("--from", dest="from_dir", metavar="DIR", help="print the table of DIR/results.json and run nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar (it goes to stderr)")
    args = p.parse_args(argv)

    if args.from_dir:
        if args.config or args.out:
            p.error("--from runs nothing: give it alone")
        d = Path(args.from_dir)
        path = d / "results.json"
        if not path.is_file():
            p.error(f"{path} does not exist")
        results = json.loads(path.read_text(encoding="utf-8"))
        mfile = d / MACHINE_FILE
        print(f"machine: {mfile.read_text(encoding='utf-8').strip() if mfile.is_file() else 'not recorded'}")
        print(f"wall time: {results['seconds']:.1f} s (the study's own clock, from {path.name})\n")
        print(table(results))
        return 0

    if not (args.config and args.out):
        p.error("--config and --out are required to run a study (or --from DIR to print one)")
    from fedfilter.simulations.study.config import load_study
    from fedfilter.simulations.study.runner import run_study

    study = load_study(args.config)  # StudyConfigError lists every problem, as in the CLI
    started = time.perf_counter()
    results = run_study(study, args.out, progress=not args.no_progress)
    wall = time.perf_counter() - started
    m = machine()
    (Path(args.out) / MACHINE_FILE).write_text(m + "\n", encoding="utf-8")
    print(f"machine: {m}")
    print(
        f"wall time: {wall:.1f} s (of which {results['seconds']:.1f} s the runs, the rest plots and report.md); "
        f"wrote {args.out}/results.json, report.md and plots\n"
    )
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
