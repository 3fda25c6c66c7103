"""``report.md`` of a dropout study: the config echoed, tables of every run and group, the plots."""

from __future__ import annotations

from pathlib import Path

from fedfilter.simulations.study.plots import plot_disparity, plot_groups, plot_rounds


def _f(x, fmt: str = ".3f", none: str = "-") -> str:
    return none if x is None else format(x, fmt)


def _r(x) -> str:
    return "never" if x is None else str(int(x))


MODE_NOTES = """\
* **noise-only** (the default): an exhausted client keeps sending a pure-noise report, so the
  coordinator's view ("reports seen") does not change when budgets run out, and the formal guarantee
  covers everything it sees.
* **leave**: an exhausted client answers with a "left" marker. The coordinator sees the departure,
  and the round of departure depends on the client's data (its update norms): the guarantee does
  not cover that signal.
* **local** noise: every report carries the full Gaussian noise (local DP). **distributed**: each
  device snaps its clipped update to SecAgg+'s integer grid and adds a Skellam share of 1/min_reports
  of the noise variance; SecAgg+ reveals only the sum of at least `min_reports` reports, which carries
  the full noise, and a round with fewer reports is not released (column "released"). Each device is
  charged the Skellam mechanism's Rényi loss at its actual integer update, by the rdp filter (as the
  devices and `fedfilter.simulations.engine.skellam_round` do).
"""

COLUMN_NOTES = """\
Columns: *with budget* is the ground truth number of clients whose filter still admits a
contribution (read from every client's filter after the round, whether or not it was asked);
*contributing* counts clients whose data entered the last round; *reports seen* what the
coordinator received in the last round; *first / half* the first round a client was found exhausted
and the round by which half the clients had no budget left; *released* rounds whose aggregate was
applied. Accuracy is test accuracy of the global model.
"""

DISPARITY_NOTE = """\
Individual filters let every client stop on its own, so the clients who spend fastest (larger
updates, smaller budgets) leave first, and what they alone hold may then be forgotten. DP training
is already known to cost under-represented and harder groups more accuracy (Bagdasaryan,
Poursaeed and Shmatikov, "Differential Privacy Has Disparate Impact on Model Accuracy", NeurIPS
2019, arXiv 1905.12101); these tables show, per group, who ran out first and that group's accuracy.
For `label` groups a group is a class, its weight is its training examples, "with budget" is the
share of that class's examples held by clients that can still contribute, and accuracy is test
accuracy on the class. For `size` groups (natural splits) a group is a quartile of clients by
training-set size, and accuracy is the example-weighted accuracy of its clients on their own
training data: an oracle statistic that no coordinator sees.
"""


def runs_table(runs: list[dict]) -> list[str]:
    """The markdown lines of report.md's "Runs" table: one row per run record of ``results.json``.

    Parameters
    ----------
    runs : list of dict
        The ``runs`` of ``results.json``.

    Returns
    -------
    list of str
        The header, the separator and one row per run.

    Examples
    --------
    >>> run = {"label": "d, eps 4", "num_clients": 4, "rounds": 2, "with_budget_per_round": [4, 2],
    ...        "contributing_per_round": [4, 2], "reports_seen_per_round": [4, 4], "released_per_round": [1, 1],
    ...        "initial_accuracy": 0.1, "peak_accuracy": 0.6, "final_accuracy": 0.6,
    ...        "budget": {"epsilon_quantiles": {"median": 4, "min": 4, "max": 4}},
    ...        "exhaustion": {"first_round": 2, "round_half_without_budget": None},
    ...        "groups": {"worst_group": None, "per_group": {}, "final_accuracy_gap": None}}
    >>> runs_table([run])[2]
    '| 1 | d, eps 4 | 4 | 4 [4, 4] | 2 | 2 | 4 | 2 / never | 2/2 | 0.100 / 0.600 / 0.600 | - (-) | - |'
    """
    lines = [
        "| # | run | clients | epsilon median [min, max] | with budget at end | contributing (last) "
        "| reports seen (last) | first / half exhausted | released | accuracy initial / peak / final "
        "| worst group (final acc.) | group gap |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for i, r in enumerate(runs, 1):
        q = r["budget"]["epsilon_quantiles"]
        ex = r["exhaustion"]
        g = r["groups"]
        worst = g["worst_group"]
        worst_acc = g["per_group"][worst]["final_accuracy"] if worst is not None else None
        lines.append(
            f"| {i} | {r['label']} | {r['num_clients']} | {q['median']:.3g} [{q['min']:.3g}, {q['max']:.3g}] "
            f"| {r['with_budget_per_round'][-1]} | {r['contributing_per_round'][-1]} "
            f"| {r['reports_seen_per_round'][-1]} | {_r(ex['first_round'])} / {_r(ex['round_half_without_budget'])} "
            f"| {sum(r['released_per_round'])}/{r['rounds']} "
            f"| {r['initial_accuracy']:.3f} / {r['peak_accuracy']:.3f} / {r['final_accuracy']:.3f} "
            f"| {worst if worst is not None else '-'} ({_f(worst_acc)}) | {_f(g['final_accuracy_gap'])} |"
        )
    return lines


def _group_table(run: dict) -> list[str]:
    g = run["groups"]
    weight = "training examples" if g["kind"] == "label" else "clients"
    lines = [
        f"| group | {weight} | first exhausted | median exhausted | with budget at end "
        "| accuracy initial / peak / final |",
        "|---|---|---|---|---|---|",
    ]
    for name in g["names"]:
        rec = g["per_group"][name]
        end = rec["share_with_budget_per_round"][-1] if rec["share_with_budget_per_round"] else None
        lines.append(
            f"| {name} | {rec['weight']:.0f} | {_r(rec['first_exhausted_round'])} "
            f"| {_r(rec['median_exhausted_round'])} | {_f(end, '.2f')} "
            f"| {_f(rec['initial_accuracy'])} / {_f(rec['peak_accuracy'])} / {_f(rec['final_accuracy'])} |"
        )
    return lines


def write_report(results: dict, out: Path, figures: list[Path]) -> Path:
    """Write ``report.md``: the config echoed, tables of every run and group, links to the figures.

    Parameters
    ----------
    results : dict
        A study's ``results.json`` (as ``runner.run_study`` writes it).
    out : Path
        The folder to write into.
    figures : list of Path
        The PNG files to link (``plot_rounds``, ``plot_groups``, ``plot_disparity``).

    Returns
    -------
    Path
        ``out/report.md``.

    Examples
    --------
    With the results of a finished study (``fedfilter study dropout`` writes them):

    >>> import json
    >>> results = json.loads(Path("runs/study/results.json").read_text())  # doctest: +SKIP
    >>> write_report(results, Path("runs/study"), figures=[])  # doctest: +SKIP
    PosixPath('runs/study/report.md')
    """
    runs = results["runs"]
    fed = results["federation"]
    lines = [f"# Dropout study: {results['study']}", ""]
    if results.get("description"):
        lines += [results["description"].strip(), ""]
    lines += [
        f"{len(runs)} runs, {runs[0]['rounds'] if runs else 0} rounds each, "
        f"filter `{results['filter']}` at delta = {results['delta']:g}; "
        f"{results['seconds']:.0f} s in total. Raw numbers: `results.json`.",
        "",
    ]
    planned = results.get("runs_planned", len(runs))
    if planned > len(runs):
        lines += [f"**Partial: {len(runs)} of the {planned} planned runs finished.**", ""]
    lines += [
        "## What was swept",
        "",
        "| setting | values |",
        "|---|---|",
    ]
    for k, v in results["sweep"].items():
        lines.append(f"| {k} | {', '.join(map(str, v))} |")
    grid = results.get("budget_grid", 0)
    rounding = (
        f" Each draw is rounded down to the grid 2^(j/{grid}) (never up; a fixed budget stays "
        f"exactly the level), so that clients share filters."
        if grid
        else ""
    )
    lines += [
        "",
        "Per-client budgets: `epsilon_i = budget_level x draw_i`, the draw from the named "
        "distribution (written for level 1; the same draws at every level and mode)." + rounding,
        "",
    ]
    for name, h in results["heterogeneity"].items():
        lines.append(f"* `{name}`: {h['describe']}")
    seen = set()  # echo each realised distribution once per (data, level, heterogeneity, seed)
    realised = []
    for r in runs:
        s = r["settings"]
        key = (s["data"], s["budget_level"], s["heterogeneity"], s["seed"])
        if key in seen:
            continue
        seen.add(key)
        q = r["budget"]["epsilon_quantiles"]
        realised.append(
            f"| {s['data']} | {s['budget_level']:g} | {s['heterogeneity']} | {s['seed']} "
            f"| {r['budget']['distribution']} | {q['min']:.3g} / {q['p10']:.3g} / {q['median']:.3g} "
            f"/ {q['p90']:.3g} / {q['max']:.3g} |"
        )
    lines += [
        "",
        "| data | level | heterogeneity | seed | distribution | realised min / p10 / median / p90 / max |",
        "|---|---|---|---|---|---|",
        *realised,
        "",
        "Data sets:",
        "",
    ]
    for name, d in results["data_sets"].items():
        lines.append(f"* `{name}`: {d['describe']}")
    lines += [
        "",
        "Shared settings (`[federation]`; accounted noise std = noise_multiplier x clip):",
        "",
        "| key | value |",
        "|---|---|",
    ]
    for k, v in fed.items():
        lines.append(f"| {k} | {v} |")
    lines += ["", MODE_NOTES, "## Runs", "", *runs_table(runs), "", COLUMN_NOTES, "## Figures", ""]
    for p in figures:
        lines += [f"![{p.stem}]({p.name})", ""]
    lines += ["## Per group: who drops first, and that group's accuracy", "", DISPARITY_NOTE]
    for i, r in enumerate(runs, 1):
        lines += [f"<details><summary>{i}. {r['label']}</summary>", "", *_group_table(r), "", "</details>", ""]
    lines += ["## The config, as given", "", "```toml", results.get("config_toml", "").rstrip(), "```", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines), encoding="utf-8")
    return path


def write_outputs(results: dict, out: str | Path) -> list[Path]:
    """Draw every figure and write ``report.md`` into ``out``; returns the paths written.

    Parameters
    ----------
    results : dict
        A study's ``results.json`` (as ``runner.run_study`` writes it).
    out : str or Path
        The folder to write into (it must exist).

    Returns
    -------
    list of Path
        The figures, then ``report.md``.

    Examples
    --------
    Redraw the report of a study (what ``fedfilter study report --out runs/study`` does):

    >>> import json
    >>> results = json.loads(Path("runs/study/results.json").read_text())  # doctest: +SKIP
    >>> write_outputs(results, "runs/study")[-1]  # doctest: +SKIP
    PosixPath('runs/study/report.md')
    """
    out = Path(out)
    figures = plot_rounds(results, out) + plot_groups(results, out) + [plot_disparity(results, out)]
    return figures + [write_report(results, out, figures)]
