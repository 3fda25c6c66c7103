"""``fedfilter demo --population N``: the demo's second part, a federation large enough to learn privately.

After the Flower part (or alone, with ``--clients 0``) it runs ``N`` devices on the vectorised engine
(``fedfilter.simulations.population``): the privacy code the Flower devices run, applied to every
device at once, with distributed noise over simulated SecAgg+, budget tiers of epsilon 1, 2, 4 and 8,
and the noise multiplier the planner chooses for the smallest of them; then the same federation
without privacy. It prints the plan, the accuracy per round of both, what each budget tier spent,
and the guarantee with what it assumes; it writes ``OUT/population.json`` and ``OUT/population.png``.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "population_guarantee", "plot_population", "run_part", "tier_rows"]

DEFAULT_PER_ROUND = 500
DEFAULT_ROUNDS = 20


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Add the population part's options to ``fedfilter demo``.

    Parameters
    ----------
    p : argparse.ArgumentParser
        The ``demo`` parser.

    Examples
    --------
    >>> p = argparse.ArgumentParser()
    >>> add_arguments(p)
    >>> args = p.parse_args(["--population", "6000"])
    >>> args.population, args.population_per_round, args.population_rounds, args.population_task
    (6000, 500, 20, 'mnist')
    """
    p.add_argument(
        "--population",
        type=int,
        default=0,
        metavar="N",
        help="then run N devices on the vectorised engine (distributed noise, budgets epsilon 1-8), against the "
        "same federation without privacy (default 0: skip; make demo uses 6000)",
    )
    p.add_argument(
        "--population-per-round",
        type=int,
        default=DEFAULT_PER_ROUND,
        metavar="K",
        help="devices asked per round in the population part (default %(default)s)",
    )
    p.add_argument(
        "--population-rounds",
        type=int,
        default=DEFAULT_ROUNDS,
        metavar="R",
        help="rounds of the population part (default %(default)s)",
    )
    p.add_argument(
        "--population-task",
        choices=("mnist", "digits"),
        default="mnist",
        help="mnist (the offline copy FEDFILTER_DATA names; digits when it is missing) or digits",
    )


def check(args: argparse.Namespace) -> list[str]:
    """The population options' problems, each naming the flag and the value.

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` options.

    Returns
    -------
    list of str
        Empty when the options are usable.

    Examples
    --------
    >>> for problem in check(argparse.Namespace(population=100, population_per_round=500, population_rounds=0)):
    ...     print(problem)
    --population-per-round must be in [1, --population=100]. Found 500.
    --population-rounds must be >= 1. Found 0.
    """
    problems = []
    if args.population < 0:
        problems.append(f"--population must be >= 0. Found {args.population}.")
    elif args.population and not 1 <= args.population_per_round <= args.population:
        problems.append(
            f"--population-per-round must be in [1, --population={args.population}]. Found {args.population_per_round}."
        )
    if args.population_rounds < 1:
        problems.append(f"--population-rounds must be >= 1. Found {args.population_rounds}.")
    return problems


def settings_of(args: argparse.Namespace):
    """The ``PopulationSettings`` of the options (SecAgg+ threshold: ``default_min_reports``).

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` options.

    Returns
    -------
    PopulationSettings

    Examples
    --------
    >>> s = settings_of(argparse.Namespace(population=6000, population_per_round=500, population_rounds=20,
    ...     population_task="mnist", seed=0))
    >>> s.devices, s.min_reports, s.budgets
    (6000, 100, (1.0, 2.0, 4.0, 8.0))
    """
    from fedfilter.protocol.rules import default_min_reports
    from fedfilter.simulations.population.settings import PopulationSettings

    return PopulationSettings(
        devices=args.population,
        per_round=args.population_per_round,
        rounds=args.population_rounds,
        min_reports=default_min_reports(args.population_per_round, "distributed"),
        task=args.population_task,
        seed=args.seed,
    )


def population_guarantee(min_reports: int) -> str:
    """What each population device's budget covers, and what that assumes.

    Parameters
    ----------
    min_reports : int
        The SecAgg+ threshold.

    Returns
    -------
    str
        The Flower demo's distributed guarantee, and what the engine simulates.

    Examples
    --------
    >>> text = population_guarantee(100)
    >>> ">= 100 reports" in text and "100 x budget_epsilon" in text and "Simulated here" in text
    True
    """
    from fedfilter.cli.demo_report import guarantee_text

    args = argparse.Namespace(after_exhaustion="noise-only", placement="distributed", min_reports=min_reports)
    text = guarantee_text(argparse.Namespace(**vars(args), reply_hold_s=1.0))  # no reply timing in the engine
    return (
        f"{text}. Simulated here: the engine runs each device's privacy code (spend template, rdp filter, "
        "worst-case account, Skellam noise on the SecAgg+ integer grid) on arrays, with SecAgg+ as an exact "
        "integer sum, no drop-outs and no reply timing"
    )


def tier_rows(run) -> list[dict[str, Any]]:
    """Per budget tier: devices, asks, the epsilon spent (from each device's filter state), exhaustion.

    Parameters
    ----------
    run : PopulationRun
        The population part's run.

    Returns
    -------
    list of dict
        ``budget_epsilon``, ``devices``, ``asks_mean``, ``asks_max``, ``spent_mean``, ``spent_max``,
        ``exhausted`` (the share of the tier whose filter ran out), one per tier.

    Examples
    --------
    >>> from fedfilter.simulations.population.run import run_population
    >>> from fedfilter.simulations.population.settings import PopulationSettings
    >>> run = run_population(PopulationSettings(devices=20, per_round=10, rounds=1, budgets=(2.0, 8.0),
    ...     min_reports=5, task="digits"))
    >>> [(r["budget_epsilon"], r["devices"]) for r in tier_rows(run)]
    [(2.0, 10), (8.0, 10)]
    """
    import numpy as np

    res, rows = run.engine, []
    asks = res.graph_rounds if res.graph_rounds is not None else np.zeros(len(run.budgets), dtype=np.int64)
    for eps in sorted(set(run.budgets.tolist())):
        at = run.budgets == eps
        rows.append(
            {
                "budget_epsilon": float(eps),
                "devices": int(at.sum()),
                "asks_mean": float(asks[at].mean()),
                "asks_max": int(asks[at].max()),
                "spent_mean": float(res.spent_epsilon[at].mean()),
                "spent_max": float(res.spent_epsilon[at].max()),
                "exhausted": float((res.exhausted_round[at] >= 0).mean()),
            }
        )
    return rows


def plot_population(path: Path, private: list[float], no_privacy: list[float], title: str) -> None:
    """Accuracy per round of the private federation and of the same without privacy, saved as a PNG.

    Parameters
    ----------
    path : Path
        The PNG file.
    private, no_privacy : list of float
        Test accuracy per round.
    title : str
        The figure's title.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot_population(Path(d) / "p.png", [0.2, 0.5], [0.6, 0.8], "demo")
    ...     (Path(d) / "p.png").stat().st_size > 0
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = list(range(1, len(private) + 1))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.plot(rounds, no_privacy, "o--", color="#636363", label="the same federation without privacy")
    ax.plot(rounds, private, "o-", color="#d62728", label="private: budgets epsilon <= 8 (device filters)")
    ax.axhline(0.1, color="#bdbdbd", lw=0.8, ls=":", label="chance (10 classes)")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy")
    ax.set_ylim(0, 1)
    ax.set_xticks(rounds if len(rounds) <= 25 else rounds[:: math.ceil(len(rounds) / 20)])
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _header(run) -> None:
    s, plan = run.settings, run.plan
    tiers = ", ".join(f"{e:g}" for e in s.budgets)
    print(f"\n== population part: {run.devices:,} devices on {run.task!r}, the vectorised engine ==")
    if run.fallback:
        print(f"  data: {run.fallback}")
    print(
        f"  {run.examples_per_device:.3g} training examples a device; personal budgets epsilon {tiers} "
        f"(as many devices each), delta {s.delta:g}, rdp filter; exhausted devices send pure noise"
    )
    print(
        f"  {s.per_round} devices asked per round at random, {s.rounds} rounds; distributed noise: Skellam shares "
        f"summed by SecAgg+, released only from >= {s.min_reports} reports; clip {s.clip:g}, {run.dim:,} parameters"
    )
    asked = (
        f"at most {plan['asks_planned']} times with probability >= {plan['plan_quantile']:g}"
        if plan["plan_quantile"] is not None
        else f"at most {plan['asks_planned']} times (balanced passes)"
    )
    print(
        f"  plan (fedfilter.planning): a device is asked {asked}; z = {plan['noise_multiplier']:g} is the least "
        f"noise multiplier whose {plan['asks_planned']} full-clip asks the smallest budget (epsilon "
        f"{plan['planned_epsilon']:g}) pays for; the released mean's noise norm is {plan['noise_to_clip']:.3g} x "
        "the clip"
    )


def _print_tables(run, rows: list[dict[str, Any]]) -> None:
    print(f"\n{'round':>5}  {'asked':>6}  {'contributing*':>13}  {'private acc':>11}  {'no-privacy acc':>14}")
    for rec, base in zip(run.engine.rounds, run.no_privacy_accuracy):
        acc = "-" if rec.accuracy is None else f"{rec.accuracy:.3f}"
        print(f"{rec.round_id:>5}  {rec.sampled:>6}  {rec.contributing:>13}  {acc:>11}  {base:>14.3f}")
    print("  * devices whose data entered the round (the others had spent their budget and sent pure noise);")
    print("    the coordinator never learns it. Accuracy: on the held-out test set after the round.")
    print(f"\n{'budget eps':>10}  {'devices':>7}  {'asked mean/max':>14}  {'spent eps mean/max':>18}  {'exhausted':>9}")
    for r in rows:
        asked = f"{r['asks_mean']:.2f} / {r['asks_max']}"
        spent = f"{r['spent_mean']:.3f} / {r['spent_max']:.3f}"
        print(f"{r['budget_epsilon']:>10.2f}  {r['devices']:>7,}  {asked:>14}  {spent:>18}  {r['exhausted']:>8.0%}")
    print("  spent: each device's filter state read as epsilon at delta 1e-05 (rounded up); never above its budget.")


def run_part(args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """Run the population part, print it, write ``OUT/population.json`` and ``OUT/population.png``.

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` options (``population`` > 0).
    out : Path
        The demo's output folder.

    Returns
    -------
    dict
        What ``population.json`` holds.

    Raises
    ------
    RuntimeError
        When a device's spent epsilon exceeds its budget (the filters make that impossible).

    Examples
    --------
    >>> import contextlib, io, tempfile
    >>> args = argparse.Namespace(population=20, population_per_round=10, population_rounds=1,
    ...     population_task="digits", seed=0)
    >>> with tempfile.TemporaryDirectory() as d, contextlib.redirect_stdout(io.StringIO()):
    ...     summary = run_part(args, Path(d))
    >>> summary["devices"], summary["max_budget_epsilon"] <= 8
    (20, True)
    """
    from tqdm import tqdm

    from fedfilter.simulations.population.run import run_population

    settings = settings_of(args)
    print(f"\nfedfilter demo: population part, {settings.devices:,} devices x {settings.rounds} rounds ...", flush=True)
    print(
        "  the same federation without privacy runs beside it in a second process; the bar follows the private run",
        flush=True,
    )
    with tqdm(total=settings.rounds, desc="private", unit="round") as bar:

        def on_private(record) -> None:
            bar.set_postfix(accuracy=f"{record.accuracy:.3f}", refresh=False)
            bar.update(1)

        run = run_population(settings, on_private=on_private, parallel=True)
    _header(run)
    rows = tier_rows(run)
    _print_tables(run, rows)
    over = run.engine.spent_epsilon > run.budgets
    if over.any():
        raise RuntimeError(f"devices {list(map(int, over.nonzero()[0][:10]))} spent more than their budgets")
    guarantee = population_guarantee(run.settings.min_reports)
    print(f"\nguarantee: {guarantee}")
    private, base = run.private_accuracy, run.no_privacy_accuracy
    print(
        f"\npopulation part: final test accuracy {private[-1]:.3f} private (every budget <= epsilon "
        f"{max(run.settings.budgets):g}) against {base[-1]:.3f} without privacy "
        f"({run.seconds['both']:.0f} s for both runs)"
    )
    title = (
        f"{run.devices:,} devices on {run.task}, {run.settings.per_round} asked a round\nbudgets epsilon "
        f"{', '.join(f'{e:g}' for e in run.settings.budgets)} (delta 1e-5), distributed noise over SecAgg+"
    )
    plot_population(out / "population.png", private, base, title)
    summary = {
        "task": run.task,
        "fallback": run.fallback,
        "devices": run.devices,
        "examples_per_device": run.examples_per_device,
        "parameters": run.dim,
        "settings": {k: v for k, v in vars(run.settings).items() if k != "adaptive_clipping"},
        "adaptive_clipping": None if run.settings.adaptive_clipping is None else vars(run.settings.adaptive_clipping),
        "max_budget_epsilon": float(run.budgets.max()),
        "plan": run.plan,
        "private_accuracy_per_round": private,
        "no_privacy_accuracy_per_round": base,
        "contributing_per_round": [r.contributing for r in run.engine.rounds],
        "released_per_round": [bool(r.released) for r in run.engine.rounds],
        "tiers": rows,
        "guarantee": guarantee,
        "wall_time_s": {k: round(v, 1) for k, v in run.seconds.items()},
    }
    (out / "population.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"wrote {out / 'population.json'}, {out / 'population.png'}")
    return summary
