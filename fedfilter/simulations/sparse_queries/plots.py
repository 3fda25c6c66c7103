"""Figures for the sparse-query simulation (matplotlib, Agg backend, PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from .simulate import SparseQueryResult  # noqa: E402


def plot_result(res: SparseQueryResult, path: str | Path) -> Path:
    """Three panels: queries answered and users admitted; |error| per day against (T1.2); paid days.

    Parameters
    ----------
    res : SparseQueryResult
        A simulation's result.
    path : str or Path
        The PNG file.

    Returns
    -------
    Path
        ``path``.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.simulations.sparse_queries.simulate import SparseQueryConfig, simulate
    >>> result = simulate(SparseQueryConfig(n_users=200, days=60, sparsity=5))
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot_result(result, Path(d) / "sparse.png").name
    'sparse.png'
    """
    cfg = res.config
    days = np.arange(1, cfg.days + 1)
    fig, ax = plt.subplots(1, 3, figsize=(15, 4.2))

    share = ax[0].twinx()
    for run, style in ((res.worst_case, "C3"), (res.individual, "C0")):
        ax[0].plot(days, np.cumsum(~np.isnan(run.answers)), color=style, label=f"{run.name}: queries answered")
        share.plot(
            days,
            run.users_admitted / cfg.n_users,
            color=style,
            ls=":",
            label=f"{run.name}: share of users with budget left",
        )
    ax[0].set_xlabel("day")
    ax[0].set_ylabel("cumulative queries answered (solid)")
    share.set_ylabel("share of users whose filter admits an active day (dotted)")
    share.set_ylim(0, 1.05)
    ax[0].set_title(f"s = {cfg.sparsity}: worst case stops after k0 = {res.worst_case.answered}")
    lines = ax[0].get_legend_handles_labels()
    more = share.get_legend_handles_labels()
    ax[0].legend(lines[0] + more[0], lines[1] + more[1], fontsize=7, loc="center right")

    ind = res.individual
    ax[1].plot(
        days, np.abs(ind.answers - ind.truth_active), ".", ms=3, color="C0", label="individual: |a_t - sum over S_t|"
    )
    ax[1].plot(
        days, np.abs(ind.answers - ind.truth_all), ".", ms=3, color="C1", label="individual: |a_t - sum over all users|"
    )
    wc = res.worst_case
    ans = ~np.isnan(wc.answers)
    ax[1].plot(days[ans], np.abs(wc.answers - wc.truth_all)[ans], "x", color="C3", label="worst case: |error|")
    ax[1].axhline(
        res.bound, color="k", ls="--", lw=1, label=f"Thm 1.2 bound sqrt(s log(1/beta)/kappa) = {res.bound:.1f}"
    )
    ax[1].set_yscale("symlog", linthresh=1.0)
    ax[1].set_ylim(bottom=0)
    ax[1].set_xlabel("day")
    ax[1].set_ylabel("absolute error")
    ax[1].set_title(f"beta = {cfg.failure_prob:g}, sigma = {res.sigma:.2f}")
    ax[1].legend(fontsize=7)

    top = int(max(res.active_days.max(initial=0), cfg.sparsity)) + 1
    bins = np.arange(0, top + 1) - 0.5
    ax[2].hist(
        [res.active_days[~res.heavy], res.active_days[res.heavy]],
        bins=bins,
        stacked=True,
        color=["C0", "C1"],
        label=["light users: active days", "heavy users: active days"],
    )
    ax[2].axvline(cfg.sparsity + 0.5, color="k", ls="--", lw=1, label=f"s = {cfg.sparsity}: days a budget pays for")
    ax[2].set_xlabel("active days in the year")
    ax[2].set_ylabel("users")
    ax[2].set_title(f"{int(np.sum(res.paid_days >= cfg.sparsity))} of {cfg.n_users} users spent the whole budget")
    ax[2].legend(fontsize=7)

    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
