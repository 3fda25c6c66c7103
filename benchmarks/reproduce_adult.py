"""Reproduce the short version's Adult table (private GD with and without filtering) on the engine.

    # 1. tune private GD (Algorithm 6) on a validation split of the training rows
    nice -n 10 python benchmarks/reproduce_adult.py --tune > adult_tune.log 2>&1
    # 2. 10 trials per eps and variant with the chosen hyperparameters, train -> test
    nice -n 10 python benchmarks/reproduce_adult.py --run --trials 10 > adult_run.log 2>&1
    # 3. the table
    python benchmarks/reproduce_adult.py --table

Every run appends one JSON line to ``--results`` (default ``simulations/reproduce/results``:
``adult_tune.jsonl`` and ``adult.jsonl``); what is already there is skipped, so a killed run resumes.
``--n-train N`` keeps the first N training rows (of the tune split for ``--tune``, of the training
set for ``--run``; the validation / test rows stay whole), for smoke runs; give those their own
``--results`` folder, since ``--table`` tabulates every row it finds:

    python benchmarks/reproduce_adult.py --run --trials 1 --n-train 1000 --results adult_small
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fedfilter.simulations.reproduce.adult_gd import EPSILONS, GRID, PAPER_TABLE, VARIANTS  # noqa: E402

RESULTS = Path("fedfilter/simulations/reproduce/results")  # the default of --results


def _rows(path: Path) -> list[dict]:
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def _first(task, n_train: int | None):
    """The task with only its first ``n_train`` training clients (one row each); all of them if None."""
    if n_train is None or n_train >= task.num_clients:
        return task
    return replace(task, train_data=task.train_data[:n_train], client_ids=task.client_ids[:n_train])


def tune(args) -> None:
    from fedfilter.simulations.reproduce.adult_gd import adult_task, setting
    from fedfilter.simulations.reproduce.private_gd import run_cell

    out = Path(args.results) / "adult_tune.jsonl"
    full = adult_task("tune")
    task = _first(full, args.n_train)
    # Rows written before --n-train existed carry no n_train: they used the whole tune split.
    done = {
        (r["epsilon"], r["clip"], r["eta"], r["k"], r["seed"], r.get("n_train", full.num_clients)) for r in _rows(out)
    }
    for eps, clip, eta, k in itertools.product(EPSILONS, GRID["clip"], GRID["eta"], GRID["k"]):
        for seed in range(args.tune_seeds):
            if (eps, clip, eta, k, seed, task.num_clients) in done:
                continue
            s = replace(setting(eps, "paper", clip=clip, eta=eta, k=k), extra_steps=0)
            r = run_cell(s, task, trial=seed, seed=10_000 + seed, chunk_size=args.chunk_size)
            row = {
                "epsilon": eps,
                "clip": clip,
                "eta": eta,
                "k": k,
                "sigma": s.sigma,
                "seed": seed,
                "val_accuracy": r.gd_test_accuracy,
                "seconds": r.seconds,
                "n_train": task.num_clients,
            }
            with out.open("a") as f:
                f.write(json.dumps(row) + "\n")
            print(json.dumps(row), flush=True)


def chosen(results: Path = RESULTS) -> dict[float, dict]:
    """Per eps, the grid point with the best mean validation accuracy of private GD in ``results``."""
    rows = _rows(Path(results) / "adult_tune.jsonl")
    best = {}
    for eps in EPSILONS:
        scores = {}
        for r in rows:
            if r["epsilon"] == eps:
                scores.setdefault((r["clip"], r["eta"], r["k"]), []).append(r["val_accuracy"])
        if scores:
            (clip, eta, k), accs = max(scores.items(), key=lambda kv: sum(kv[1]) / len(kv[1]))
            best[eps] = {"clip": clip, "eta": eta, "k": k, "val_accuracy": sum(accs) / len(accs)}
    return best


def run(args) -> None:
    from fedfilter.simulations.reproduce.adult_gd import adult_task, setting
    from fedfilter.simulations.reproduce.private_gd import run_cell

    out = Path(args.results) / "adult.jsonl"
    done = {(r["setting"]["epsilon"], r["setting"]["variant"], r["trial"], r["n_train"]) for r in _rows(out)}
    task = _first(adult_task("full"), args.n_train)
    picks = chosen(args.results)
    for eps in EPSILONS:
        if eps not in picks:
            print(f"eps={eps}: not tuned yet; run --tune first", flush=True)
            continue
        hp = {k: picks[eps][k] for k in ("clip", "eta", "k")}
        for variant in VARIANTS:
            s = setting(eps, variant, **hp)
            for trial in range(args.trials):
                if (eps, variant, trial, task.num_clients) in done:
                    continue
                r = run_cell(s, task, trial=trial, seed=trial, chunk_size=args.chunk_size)
                row = {**r.__dict__, "finished_at": time.strftime("%Y-%m-%d %H:%M:%S")}
                with out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(
                    f"eps={eps} {variant} trial {trial}: GD {r.gd_test_accuracy:.4f} filtered "
                    f"{r.filtered_test_accuracy:.4f} (step {r.chosen_step}) {r.seconds:.0f} s",
                    flush=True,
                )


def table(args) -> str:
    import numpy as np

    rows = _rows(Path(args.results) / "adult.jsonl")
    picks = chosen(args.results)
    fmt = lambda v: "-" if not v else f"{100 * np.mean(v):.2f} ± {100 * np.std(v):.2f} (n={len(v)})"
    lines = [
        "| eps | C, eta, k (sigma) | paper: GD | paper: GD + filter | ours: GD | ours: GD + filter | "
        "GDP filter, same sigma (a): k / GD / + filter | GDP filter, same k (b): sigma / GD / + filter |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for eps in EPSILONS:
        (g, gs), (f, fs) = PAPER_TABLE[eps]
        sel = lambda v: [r for r in rows if r["setting"]["epsilon"] == eps and r["setting"]["variant"] == v]
        p, a, b = sel("paper"), sel("gdp-noise"), sel("gdp-steps")
        hp = picks.get(eps)
        hp_s = f"{hp['clip']:g}, {hp['eta']:g}, {hp['k']} ({p[0]['setting']['sigma']:.1f})" if hp and p else "-"
        acc = lambda rs, key: [r[key] for r in rs]
        col_a = (
            (f"{a[0]['setting']['k']} / {fmt(acc(a, 'gd_test_accuracy'))} / {fmt(acc(a, 'filtered_test_accuracy'))}")
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
            f"| {eps} | {hp_s} | {g:.2f} ± {gs:.2f} | {f:.2f} ± {fs:.2f} | "
            f"{fmt(acc(p, 'gd_test_accuracy'))} | {fmt(acc(p, 'filtered_test_accuracy'))} | {col_a} | {col_b} |"
        )
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tune", action="store_true")
    p.add_argument("--run", action="store_true")
    p.add_argument("--table", action="store_true")
    p.add_argument("--trials", type=int, default=10)
    p.add_argument("--tune-seeds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--chunk-size", type=int, default=32768)
    p.add_argument(
        "--results", default=str(RESULTS), help="folder of adult_tune.jsonl and adult.jsonl (default: %(default)s)"
    )
    p.add_argument(
        "--n-train", type=int, default=None, help="first N training rows (of the tune split for --tune); default all"
    )
    args = p.parse_args(argv)
    if args.n_train is not None and args.n_train < 1:
        p.error("--n-train must be at least 1")
    import torch

    torch.set_num_threads(args.threads)
    Path(args.results).mkdir(parents=True, exist_ok=True)
    if args.tune:
        tune(args)
    if args.run:
        run(args)
    if args.table or not (args.tune or args.run):
        print(table(args))


if __name__ == "__main__":
    main()
