"""PNG figures of a dropout study, drawn from ``results.json`` alone (matplotlib, Agg backend)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def slug(text: str) -> str:
    """A file-name-safe, lower-case form of ``text`` (runs of other characters become one ``-``).

    Parameters
    ----------
    text : str
        Any text, e.g. a data set's name.

    Returns
    -------
    str
        The slug (``x`` when nothing is left).

    Examples
    --------
    >>> slug("FEMNIST, natural split!")
    'femnist-natural-split'
    """
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def _by_data(runs: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in runs:
        out.setdefault(r["settings"]["data"], []).append(r)
    return out


def _short(run: dict) -> str:
    """The label without the data set (which the panel title names)."""
    prefix = run["settings"]["data"] + ", "
    return run["label"][len(prefix) :] if run["label"].startswith(prefix) else run["label"]


def _colors(n: int):
    cmap = plt.get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def plot_rounds(results: dict, out: Path) -> list[Path]:
    """Draw ``contributing.png`` (ground truth and what the coordinator saw) and ``accuracy.png``.

    One column per data set, one line per run.

    Parameters
    ----------
    results : dict
        A study's ``results.json`` (``runs``: each run's ``settings``, ``label`` and per-round lists).
    out : Path
        The folder to write into.

    Returns
    -------
    list of Path
        The two files written.

    Examples
    --------
    >>> import tempfile
    >>> run = {"settings": {"data": "d"}, "label": "d, eps 4", "contributing_per_round": [4, 2],
    ...        "reports_seen_per_round": [4, 4], "sampled_per_round": [4, 4], "initial_accuracy": 0.1,
    ...        "accuracy_per_round": [0.5, 0.6]}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [p.name for p in plot_rounds({"runs": [run]}, Path(d))]
    ['contributing.png', 'accuracy.png']
    """
    groups = _by_data(results["runs"])
    cols = len(groups)
    paths = []

    fig, ax = plt.subplots(2, cols, figsize=(5.2 * cols + 1, 7.5), squeeze=False, sharex=True)
    for j, (name, runs) in enumerate(groups.items()):
        for run, color in zip(runs, _colors(len(runs))):
            r = np.arange(1, len(run["contributing_per_round"]) + 1)
            ax[0, j].plot(r, run["contributing_per_round"], color=color, label=_short(run))
            ax[1, j].plot(r, run["reports_seen_per_round"], color=color, label=_short(run))
            ax[1, j].plot(r, run["sampled_per_round"], color=color, ls=":", lw=0.8)
        ax[0, j].set_title(f"{name}: clients whose data entered the round")
        ax[1, j].set_title(f"{name}: reports the coordinator saw (dotted: asked)")
        ax[1, j].set_xlabel("round")
        ax[0, j].set_ylabel("clients contributing (ground truth)")
        ax[1, j].set_ylabel("reports seen")
        ax[0, j].set_ylim(bottom=0)
        ax[1, j].set_ylim(bottom=0)
        ax[1, j].legend(fontsize=6, loc="lower left")
    fig.tight_layout()
    paths.append(out / "contributing.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)

    fig, ax = plt.subplots(1, cols, figsize=(5.2 * cols + 1, 4.2), squeeze=False)
    for j, (name, runs) in enumerate(groups.items()):
        for run, color in zip(runs, _colors(len(runs))):
            r, acc = _evaluated(run, [run["initial_accuracy"]] + run["accuracy_per_round"])
            ax[0, j].plot(r, acc, color=color, marker=".", label=_short(run))
        ax[0, j].set_title(f"{name}: test accuracy")
        ax[0, j].set_xlabel("round (0 = initial model)")
        ax[0, j].set_ylabel("accuracy")
        ax[0, j].set_ylim(0, 1)
        ax[0, j].legend(fontsize=6, loc="best")
    fig.tight_layout()
    paths.append(out / "accuracy.png")
    fig.savefig(paths[-1], dpi=100)
    plt.close(fig)
    return paths


def _evaluated(run: dict, values: list) -> tuple[np.ndarray, np.ndarray]:
    """Rounds (0 = initial model) at which the model was evaluated, and ``values`` there."""
    flags = [True] + list(run.get("accuracy_evaluated_per_round", [True] * (len(values) - 1)))
    rounds = np.array([r for r, f in enumerate(flags) if f])
    vals = np.array([np.nan if values[r] is None else values[r] for r in rounds], dtype=np.float64)
    return rounds, vals


def plot_groups(results: dict, out: Path) -> list[Path]:
    """Per data set, one panel per run: each group's share still able to contribute, and its accuracy.

    Parameters
    ----------
    results : dict
        A study's ``results.json`` (each run's ``groups``).
    out : Path
        The folder to write into.

    Returns
    -------
    list of Path
        One ``groups_<data>.png`` per data set.

    Examples
    --------
    >>> import tempfile
    >>> group = {"initial_share_with_budget": 1.0, "share_with_budget_per_round": [1.0, 0.5],
    ...          "initial_accuracy": 0.1, "accuracy_per_round": [0.4, 0.5]}
    >>> run = {"settings": {"data": "d"}, "label": "d, eps 4", "accuracy_per_round": [0.5, 0.6],
    ...        "groups": {"kind": "label", "names": ["0"], "per_group": {"0": group}}}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     [p.name for p in plot_groups({"runs": [run]}, Path(d))]
    ['groups_d.png']
    """
    paths = []
    for name, runs in _by_data(results["runs"]).items():
        n = len(runs)
        cols = min(4, n)
        rows = math.ceil(n / cols)
        fig, ax = plt.subplots(2 * rows, cols, figsize=(4.2 * cols, 3.1 * 2 * rows), squeeze=False)
        for k, run in enumerate(runs):
            a_share, a_acc = ax[2 * (k // cols), k % cols], ax[2 * (k // cols) + 1, k % cols]
            names = run["groups"]["names"]
            for g, color in zip(names, _colors(len(names))):
                rec = run["groups"]["per_group"][g]
                share = [rec["initial_share_with_budget"]] + rec["share_with_budget_per_round"]
                a_share.plot(np.arange(len(share)), share, color=color, label=g)
                r, acc = _evaluated(run, [rec["initial_accuracy"]] + rec["accuracy_per_round"])
                a_acc.plot(r, acc, color=color, marker="." if len(r) < 15 else None, label=g)
            a_share.set_title(_short(run), fontsize=8)
            a_share.set_ylim(-0.02, 1.02)
            a_acc.set_ylim(-0.02, 1.02)
            a_share.set_ylabel("share with budget" if k % cols == 0 else "")
            a_acc.set_ylabel("group accuracy" if k % cols == 0 else "")
            a_acc.set_xlabel("round")
            if k == 0:
                a_share.legend(fontsize=6, ncol=2 if len(names) > 5 else 1)
        for k in range(n, rows * cols):
            ax[2 * (k // cols), k % cols].axis("off")
            ax[2 * (k // cols) + 1, k % cols].axis("off")
        kind = runs[0]["groups"]["kind"]
        what = "class (share of its training examples)" if kind == "label" else "data-size quartile of clients"
        fig.suptitle(f"{name}: drop-out and accuracy per {what}", fontsize=10)
        fig.tight_layout(rect=(0, 0, 1, 1 - 0.3 / (2 * rows * 3.1)))
        paths.append(out / f"groups_{slug(name)}.png")
        fig.savefig(paths[-1], dpi=90)
        plt.close(fig)
    return paths


def plot_disparity(results: dict, out: Path) -> Path:
    """Every group of every run: how much of it still had budget at the end vs its final accuracy gap.

    Parameters
    ----------
    results : dict
        A study's ``results.json`` (each run's ``final_accuracy`` and ``groups``).
    out : Path
        The folder to write into.

    Returns
    -------
    Path
        ``disparity.png``.

    Examples
    --------
    >>> import tempfile
    >>> group = {"final_accuracy": 0.7, "share_with_budget_per_round": [1.0, 0.5]}
    >>> run = {"settings": {"data": "d"}, "final_accuracy": 0.8, "groups": {"per_group": {"0": group}}}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot_disparity({"runs": [run]}, Path(d)).name
    'disparity.png'
    """
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for (name, runs), color in zip(_by_data(results["runs"]).items(), _colors(10)):
        xs, ys = [], []
        for run in runs:
            overall = run["final_accuracy"]
            for rec in run["groups"]["per_group"].values():
                if rec["final_accuracy"] is None or not rec["share_with_budget_per_round"]:
                    continue
                xs.append(rec["share_with_budget_per_round"][-1])
                ys.append(rec["final_accuracy"] - overall)
        ax.scatter(xs, ys, s=12, alpha=0.6, color=color, label=name)
    ax.axhline(0, color="k", lw=0.8)
    ax.set_xlabel("group's share still with budget after the last round")
    ax.set_ylabel("group accuracy - overall accuracy (final)")
    ax.set_title("Do groups that drop out first lose accuracy?")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = out / "disparity.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
