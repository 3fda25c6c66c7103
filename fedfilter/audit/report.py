"""The audit's table (terminal) and figure (matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.stats import norm

from fedfilter.audit.game import scores


def table(result: dict) -> str:
    """The audit's result as the terminal table: the bounds per dtype, every distinguisher, the verdict.

    Parameters
    ----------
    result : dict
        ``run_audit``'s result.

    Returns
    -------
    str
        The table.

    Examples
    --------
    >>> from fedfilter.audit.run import run_audit
    >>> result = run_audit(epsilon=2.0, delta=1e-5, trials=2, dtypes=["float32"], seed=0, reply_hold_s=0.0)
    >>> print(table(result).splitlines()[0])  # doctest: +NORMALIZE_WHITESPACE
    fedfilter audit: claimed (epsilon=2, delta=1e-05), filter gdp, local placement, 2 trials per world,
    confidence 95%, thresholds planned
    """
    eps = result["claimed_epsilon"]
    lines = [
        f"fedfilter audit: claimed (epsilon={eps:g}, delta={result['delta']:g}), filter {result['filter']}, "
        f"local placement, {result['trials']} trials per world, confidence {1 - result['alpha']:.0%}, "
        f"thresholds {result['threshold']}",
        "",
        f"{'model':<8} {'z':>6} {'R':>2} {'mu claim':>8} {'eps_lb (CP)':>11} {'mu_lb':>7} "
        f"{'eps_lb (GDP)':>12} {'of claim':>8}",
    ]
    for dtype, g in result["games"].items():
        if "refused" in g:
            lines.append(f"{dtype:<8} refused: {g['refused']}")
            continue
        lines.append(
            f"{dtype:<8} {g['noise_multiplier']:>6.3f} {g['rounds_to_exhaust']:>2} {g['claimed_mu']:>8.4f} "
            f"{g['epsilon_lower_bound']:>11.4f} {g['gdp_mu_lower_bound']:>7.4f} "
            f"{g['gdp_epsilon_lower_bound']:>12.4f} {g['gdp_epsilon_lower_bound'] / eps:>8.1%}"
        )
    lines += [
        "",
        "exhaustion: a noise-only reply vs a contributing one (advantage = TPR - FPR on held-out trials; "
        f"each verdict at confidence {1 - result['exhaustion_alpha_each']:.3%})",
        f"{'model':<8} {'distinguisher':<14} {'feature':<22} {'advantage':>9} {'allowed':>8} {'(theory':>8} "
        f"{'+ slack)':>8}  verdict",
    ]
    for dtype, found in result["exhaustion"].items():
        for name, f in found.items():
            lines.append(
                f"{dtype:<8} {name:<14} {f['feature']:<22} {f['advantage']:>9.3f} {f['allowed']:>8.3f} "
                f"{f['theory']:>8.3f} {f['slack']:>8.3f}  {'ok' if f['within_bound'] else 'EXCEEDS'}"
            )
    verdict = "PASSED" if result["passed"] else "FAILED"
    lines += [
        "",
        f"{verdict}: lower bounds within the claim: {result['within_claim']}; exhaustion hidden: "
        f"{result['exhaustion_within_bounds']}  ({result['seconds']:.0f} s)",
    ]
    return "\n".join(lines)


def plot(result: dict, path: Path) -> None:
    """Draw the audit's figure (scores of both worlds against the claimed model) and save it.

    Parameters
    ----------
    result : dict
        ``run_audit``'s result with ``keep_runs=True`` (its ``_runs``).
    path : Path
        The PNG file.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.audit.run import run_audit
    >>> result = run_audit(epsilon=2.0, delta=1e-5, trials=2, dtypes=["float32"], seed=0, reply_hold_s=0.0,
    ...                    keep_runs=True)
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot(result, Path(d) / "audit.png")
    ...     (Path(d) / "audit.png").is_file()
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = result["_runs"]
    dtypes = list(runs)
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    ax = axes[0]
    run = runs[dtypes[0]]
    s0, s1 = scores(run)
    bins = np.linspace(min(s0.min(), s1.min()), max(s0.max(), s1.max()), 50)
    ax.hist(s0, bins=bins, density=True, alpha=0.5, label="no data (world 0)")
    ax.hist(s1, bins=bins, density=True, alpha=0.5, label="canary (world 1)")
    x = np.linspace(bins[0], bins[-1], 400)
    mu = run.effective_mu
    ax.plot(x, norm.pdf(x), "C0--", lw=1)
    ax.plot(x, norm.pdf(x - mu), "C1--", lw=1, label=f"claim: N(0,1), N({mu:.3f},1)")
    ax.set(title=f"attack score ({dtypes[0]} model)", xlabel="normalised score", ylabel="density")
    ax.legend(fontsize=8)

    ax = axes[1]
    fpr = np.linspace(1e-4, 1 - 1e-4, 400)
    claimed = result["games"][dtypes[0]]["claimed_mu"]
    ax.plot(fpr, norm.cdf(norm.ppf(fpr) + claimed), "k-", label=f"claimed {claimed:.3f}-GDP")
    for i, dtype in enumerate(dtypes):
        s0, s1 = scores(runs[dtype])
        t = np.sort(np.concatenate([s0, s1]))
        ax.plot(
            [np.mean(s0 >= v) for v in t[:: max(1, t.size // 300)]],
            [np.mean(s1 >= v) for v in t[:: max(1, t.size // 300)]],
            f"C{i}-",
            lw=1,
            alpha=0.8,
            label=f"empirical ({dtype})",
        )
        mu_lb = result["games"][dtype]["gdp_mu_lower_bound"]
        ax.plot(fpr, norm.cdf(norm.ppf(fpr) + mu_lb), f"C{i}:", label=f"lower bound {mu_lb:.3f}-GDP ({dtype})")
    ax.plot([0, 1], [0, 1], color="0.7", lw=0.8)
    ax.set(title="trade-off: TPR vs FPR", xlabel="FPR", ylabel="TPR")
    ax.legend(fontsize=8)

    ax = axes[2]
    names = list(result["exhaustion"][dtypes[0]])
    width = 0.8 / len(dtypes)
    for i, dtype in enumerate(dtypes):
        found = result["exhaustion"][dtype]
        xs = np.arange(len(names)) + i * width
        adv = [found[n]["advantage"] for n in names]
        ax.bar(xs, adv, width, color=f"C{i}", alpha=0.7, label=f"measured ({dtype})")
        ax.scatter(
            xs,
            [found[n]["allowed"] for n in names],
            marker="_",
            s=300,
            color="k",
            zorder=3,
            label="allowed (theory + slack)" if i == 0 else None,
        )
    ax.set_xticks(np.arange(len(names)) + width * (len(dtypes) - 1) / 2, names)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set(title="exhaustion distinguishers", ylabel="advantage TPR - FPR", ylim=(-0.2, 1.05))
    ax.legend(fontsize=8)
    fig.suptitle(
        f"fedfilter audit: claim epsilon={result['claimed_epsilon']:g}, delta={result['delta']:g}; "
        f"lower bounds CP {result['epsilon_lower_bound']:.3f}, GDP {result['gdp_epsilon_lower_bound']:.3f}"
        f" ({result['trials']} trials per world)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
