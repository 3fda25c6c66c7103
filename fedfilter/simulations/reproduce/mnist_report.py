"""The report side of the MNIST reproduction (``benchmarks/reproduce_mnist.py``): reading its JSONL
results, the Markdown tables beside Feldman & Zrnic (2021) Section 5.1's (with the privacy check under them), the
marked table block of a document, and the PNG plot.
"""

from __future__ import annotations

import json
from pathlib import Path

from fedfilter.simulations.reproduce.mnist_gd import EPSILONS, PAPER_TABLES, REGIMES, VARIANTS


def read_rows(path: Path) -> list[dict]:
    r"""The JSONL results, one dict per finished trial ([] before the first).

    Parameters
    ----------
    path : Path
        The ``--out`` JSONL file.

    Returns
    -------
    list of dict
        One row per line.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     empty = read_rows(Path(d) / "mnist.jsonl")
    ...     _ = (Path(d) / "mnist.jsonl").write_text('{"trial": 0}\n\n{"trial": 1}\n')
    ...     empty, read_rows(Path(d) / "mnist.jsonl")
    ([], [{'trial': 0}, {'trial': 1}])
    """
    path = Path(path)
    return [json.loads(l) for l in path.read_text().splitlines() if l.strip()] if path.exists() else []


def row_norms(row: dict) -> str:
    """The engine's norm mode a row ran with (rows stored before the modes existed ran ``vectorised``).

    Parameters
    ----------
    row : dict
        One result row.

    Returns
    -------
    str
        ``vectorised``, ``fast`` or ``device``.

    Examples
    --------
    >>> row_norms({}), row_norms({"norms": "fast"})
    ('vectorised', 'fast')
    """
    return row.get("norms", "vectorised")


TABLE_START = "<!-- mnist-table: python benchmarks/reproduce_mnist.py --table -->"
TABLE_END = "<!-- /mnist-table -->"


def write_table(args) -> Path:
    r"""Replace the block between the table markers of a Markdown file with ``table(args)``.

    Parameters
    ----------
    args : argparse.Namespace
        ``write_table`` (the Markdown file), and ``table``'s ``out``, ``n_table``, ``norms``.

    Returns
    -------
    Path
        The file rewritten.

    Raises
    ------
    SystemExit
        The file has no marked block.

    Examples
    --------
    >>> import argparse, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     doc = Path(d) / "results.md"
    ...     _ = doc.write_text(f"before\n{TABLE_START}\nold\n{TABLE_END}\nafter\n")
    ...     args = argparse.Namespace(write_table=doc, out=Path(d) / "none.jsonl", n_table=60000, norms="vectorised")
    ...     text = write_table(args).read_text()
    >>> "old" in text, text.endswith(f"{TABLE_END}\nafter\n")
    (False, True)
    """
    doc = Path(args.write_table)
    text = doc.read_text()
    start, end = text.find(TABLE_START), text.find(TABLE_END)
    if start < 0 or end < start:
        raise SystemExit(f"--write-table {doc}: no {TABLE_START!r} ... {TABLE_END!r} block to replace")
    doc.write_text(text[:start] + TABLE_START + "\n" + table(args).strip() + "\n" + text[end:])
    return doc


def table(args) -> str:
    """Markdown tables of the JSONL results beside Feldman & Zrnic (2021) Section 5.1's.

    Parameters
    ----------
    args : argparse.Namespace
        ``out`` (the JSONL file), ``n_table`` (the training-set size of the rows shown), ``norms``.

    Returns
    -------
    str
        One table per regime, then the privacy check.

    Examples
    --------
    >>> import argparse
    >>> text = table(argparse.Namespace(out=Path("no/such.jsonl"), n_table=60000, norms="vectorised"))
    >>> text.splitlines()[-1]
    'Privacy check: no runs yet.'
    """
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
            f"\n**{regime}** (Feldman & Zrnic (2021) Section 5.1 table '{regime}'; test accuracy %, mean ± std over "
            "trials; ours: population std, as for Adult)\n",
            "| eps | paper: GD | paper: GD + filter | ours: GD | ours: GD + filter | inside paper's mean ± std "
            "(GD / + filter) | GDP filter, paper's sigma (a): k / GD / + filter | GDP filter, paper's k (b): "
            "sigma / GD / + filter |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for eps in EPSILONS:
            (g, gs), (f, fs) = PAPER_TABLES[regime][eps]
            sel = lambda v, eps=eps, regime=regime: [  # called at once, in this iteration
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
    """One line on the guarantee behind the table.

    In every run, each client's spent epsilon (read from the filter that ran it) must be at most the
    filter's budget, and the first k steps must have clipped at exactly C (so the GD column is
    Algorithm 6 itself). Runs that break either are named.

    Parameters
    ----------
    rows : list of dict
        The result rows tabulated.

    Returns
    -------
    str
        The line.

    Examples
    --------
    >>> row = {"setting": {"epsilon": 0.3, "regime": "tuned", "variant": "paper", "filter_epsilon": 0.30066},
    ...        "trial": 0, "max_spent_epsilon": 0.3006, "prefix_max_clip_deficit": 0.0}
    >>> privacy_check([row])  # doctest: +ELLIPSIS
    "Privacy check: in all 1 runs every client's spent epsilon is at most its filter's budget ..."
    """
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
    """Draw the results into one PNG (``args.plot``).

    Top: ours against Feldman & Zrnic's mean ± std per cell, with the two Gaussian-DP columns beside
    them. Bottom, one panel per eps: each run's test accuracy at the stopping rule's queries (step k
    onwards), the star marking the query the rule picks by training accuracy.

    Parameters
    ----------
    args : argparse.Namespace
        ``plot`` (the PNG file), ``out``, ``n_table``, ``norms``.

    Returns
    -------
    Path
        The PNG written.

    Examples
    --------
    >>> import argparse, tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     args = argparse.Namespace(plot=Path(d) / "mnist.png", out=Path(d) / "none.jsonl", n_table=60000,
    ...                               norms="vectorised")
    ...     plot(args).name
    'mnist.png'
    """
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
        "Feldman & Zrnic (2021) Section 5.1: MNIST, 60,000 single-example clients (paper's columns left of "
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
