"""What ``fedfilter demo`` shows: the progress bar over the public ledger, the plot, the texts, the
tables printed after the run and ``summary.json``.

Kept apart from ``fedfilter.cli.demo`` (parsing and the run itself). The progress bar
reads the coordinator's public ledger only; the plot's "clients contributing data" come from the
devices' own ledgers after the run (the demo plays the device owners there).
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path
from typing import Any

from fedfilter.client.ledger.worst_case import TRUSTS_SECAGG

DELTA = 1e-5  # every demo device's delta (fedfilter.cli.demo.DEFAULTS["delta"])


def follow_public_ledger(ledger_path: Path, run_id: str, total: int, stop: threading.Event) -> None:
    """Advance a progress bar (on stderr) as the coordinator appends public records, until ``stop`` is set.

    Parameters
    ----------
    ledger_path : Path
        The coordinator's public ledger file (it may not exist yet).
    run_id : str
        The run whose records are counted.
    total : int
        The rounds the run has (the bar's length).
    stop : threading.Event
        Set by the caller when the run ends; the bar then shows the final count.

    Examples
    --------
    >>> import tempfile
    >>> stop = threading.Event()
    >>> stop.set()  # a run that has already ended: one look, then return
    >>> with tempfile.TemporaryDirectory() as d:
    ...     follow_public_ledger(Path(d) / "public_ledger.sqlite", "run-1", 5, stop)
    """
    from tqdm import tqdm

    from fedfilter.coordinator.public_ledger import PublicLedger

    with tqdm(total=total, desc="rounds", unit="round") as bar:
        reader = None
        while not stop.is_set():
            try:
                if reader is None and ledger_path.exists():
                    reader = PublicLedger(ledger_path, read_only=True)
                if reader is not None and reader.has_run(run_id):
                    records = reader.records(run_id)
                    if len(records) > bar.n:
                        if "accuracy" in records[-1].metrics:  # a round not released has no new model
                            bar.set_postfix(accuracy=f"{records[-1].metrics['accuracy']:.3f}", refresh=False)
                        bar.update(len(records) - bar.n)
            except Exception:  # noqa: BLE001 - a busy or half-created file: try again shortly
                pass
            stop.wait(0.3)
        if reader is not None:
            if reader.has_run(run_id):
                bar.update(len(reader.records(run_id)) - bar.n)
            reader.close()


def clip_share_per_round(ledger_dirs: list[Path], run_id: str, rounds: list[int], clip: float) -> list[float]:
    """Per round, the mean over the devices of the norm each put in, over the clip.

    The norm a device put in is the ``sensitivity`` of a ``contributed`` record of its ledger: the
    share is 1 when every device sent a full-norm update, 0 when none sent data. Read from the
    devices' own ledgers after the run (the coordinator never learns it). With distributed noise a
    device's allowance shrinks round by round as its budget runs out, long before its ledger calls it
    exhausted; this is where that shows.

    Parameters
    ----------
    ledger_dirs : list of Path
        The devices' ledger directories.
    run_id : str
        The run.
    rounds : list of int
        The rounds to report.
    clip : float
        The clip norm C.

    Returns
    -------
    list of float
        One share in [0, 1] per round of ``rounds``.

    Examples
    --------
    >>> clip_share_per_round([], "run-1", [1, 2], clip=1.0)  # no device: nothing was put in
    [0.0, 0.0]
    """
    from fedfilter.client.ledger.budget import BudgetLedger

    total = dict.fromkeys(rounds, 0.0)
    for ledger_dir in ledger_dirs:
        ledger = BudgetLedger.open(ledger_dir)
        try:
            for record in ledger.records(run_id):
                if record.status == "contributed" and int(record.round_id) in total:
                    total[int(record.round_id)] += float(record.sensitivity)
        finally:
            ledger.close()
    n = max(len(ledger_dirs), 1)
    return [total[r] / (n * clip) for r in rounds]


def plot_rounds(
    path: Path,
    rounds: list[int],
    contributing: list[int],
    accuracy: list[float | None],
    n: int,
    placement: str,
    clip_share: list[float] | None = None,
    no_privacy: list[float] | None = None,
) -> None:
    """Plot, per round, the clients contributing data (bars) and the public accuracy, and save it.

    Parameters
    ----------
    path : Path
        The PNG file to write.
    rounds : list of int
        The rounds (x axis).
    contributing : list of int
        Per round, the clients that contributed data (from the device ledgers).
    accuracy : list of float or None
        Per round, the public test accuracy (None for a round not released).
    n : int
        The number of clients (the bars' axis limit).
    placement : str
        ``local`` or ``distributed`` (for the title).
    clip_share : list of float, optional
        Per round, ``clip_share_per_round``'s share, drawn when given.
    no_privacy : list of float, optional
        Per round, the accuracy of the same clients without privacy, drawn when given.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     plot_rounds(Path(d) / "rounds.png", [1, 2], [3, 1], [0.5, None], n=3, placement="local")
    ...     (Path(d) / "rounds.png").stat().st_size > 0
    True
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.8))
    ax.bar(rounds, contributing, color="#9ecae1", label="clients contributing data (device ledgers)")
    ax.set_xlabel("round")
    ax.set_ylabel("clients contributing data")
    ax.set_ylim(0, max(n, 1) * 1.05)
    ax.set_xticks(rounds)
    ax2 = ax.twinx()
    shown = [(r, a) for r, a in zip(rounds, accuracy) if a is not None]  # released rounds only
    ax2.plot([r for r, _ in shown], [a for _, a in shown], "o-", color="#d62728", label="test accuracy (public ledger)")
    if no_privacy is not None:
        ax2.plot(rounds, no_privacy, "o--", color="#636363", label="test accuracy, same clients without privacy")
    if clip_share is not None:
        ax2.plot(rounds, clip_share, "s--", color="#3182bd", label="mean norm put in / clip (device ledgers)")
    ax2.set_ylabel("test accuracy; share of the clip")
    ax2.set_ylim(0, 1)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    # below the axes, clear of the lines; labels from the artists
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2, fontsize=7)
    noise = "distributed noise over SecAgg+" if placement == "distributed" else "local noise"
    ax.set_title(f"fedfilter demo: {n} clients with individual budgets, {noise}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def placement_text(args: argparse.Namespace) -> str:
    """How the noise is placed, for the header line.

    Parameters
    ----------
    args : argparse.Namespace
        The demo's options (``placement``, ``min_reports``).

    Returns
    -------
    str
        One phrase.

    Examples
    --------
    >>> placement_text(argparse.Namespace(placement="local", min_reports=1))
    'local noise (gdp filter)'
    """
    if args.placement == "distributed":
        return (
            f"distributed noise (Skellam shares summed by SecAgg+, released only from >= {args.min_reports} "
            f"reports, rdp filter)"
        )
    return "local noise (gdp filter)"


def guarantee_text(args: argparse.Namespace) -> str:
    """What each device's budget covers, in the words the summary keeps.

    Parameters
    ----------
    args : argparse.Namespace
        The demo's options (``after_exhaustion``, ``placement``, ``min_reports``, ``reply_hold_s``).

    Returns
    -------
    str
        The guarantee, ending with the trust the device places in its approved apps.

    Examples
    --------
    >>> args = argparse.Namespace(after_exhaustion="noise-only", placement="local", min_reports=1, reply_hold_s=0.0)
    >>> guarantee_text(args).startswith("each client: (budget_epsilon, 1e-05)-DP over its whole lifetime")
    True
    >>> "timing protection is off" in guarantee_text(args)
    True
    """
    d = DELTA
    if args.after_exhaustion == "leave":
        text = (
            f"each client: (budget_epsilon, {d:g})-DP for its reports; in leave mode the round in "
            "which it leaves is visible and depends on its data (not covered)"
        )
    elif args.placement == "distributed":
        text = (
            f"each client: (budget_epsilon, {d:g})-DP over its whole lifetime for everything the "
            f"coordinator sees (Skellam shares masked by SecAgg+: every sum it can unmask holds >= "
            f"{args.min_reports} reports, so at least the accounted noise; rdp filter; exhausted clients send "
            f"pure noise) {TRUSTS_SECAGG}; "
            f"(worst_case_epsilon = {args.min_reports} x budget_epsilon, {d:g})-DP against any coordinator "
            "(one that forges the other SecAgg+ peers and reads a report alone), enforced by each device's "
            "worst-case account"
        )
    else:
        text = (
            f"each client: (budget_epsilon, {d:g})-DP over its whole lifetime for everything the "
            "coordinator sees (local Gaussian noise, gdp filter; exhausted clients send pure noise)"
        )
    if args.reply_hold_s == 0:
        text += "; reply timing is not covered: timing protection is off in this simulation"
    from fedfilter.client.runtime.approval import TRUST_TEXT

    return f"{text}; {TRUST_TEXT}"


# --- after the run: the tables and summary.json (the device owners' view beside the public one) ---
def print_rounds_table(
    records: list,
    contributing: list[int],
    clip_share: list[float],
    accuracy: list[float | None],
    no_privacy: list[float] | None = None,
) -> None:
    """Print per round the public record, and what the devices' own ledgers say after the run.

    Parameters
    ----------
    records : list
        The public ledger's round records (``round_id``, ``reports_received``, ``markers_received``,
        ``released``).
    contributing : list of int
        Per round, the clients that contributed data.
    clip_share : list of float
        Per round, the mean norm put in over the clip.
    accuracy : list of float or None
        Per round, the public accuracy (None for a round not released).
    no_privacy : list of float, optional
        Per round, the accuracy of the same clients without privacy (a last column when given).

    Examples
    --------
    >>> from types import SimpleNamespace as Rec
    >>> rec = Rec(round_id=1, reports_received=3, markers_received=0, released=True)
    >>> print_rounds_table([rec], [2], [0.667], [0.5], [0.8])  # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
    round  reports  markers  released  contributing*  norm/clip*  accuracy  no privacy
        1        3        0       yes              2       0.667     0.500       0.800
      * from the devices' own ledgers after the run; the coordinator never learns it.
        norm/clip: the mean norm the devices put in, over the clip (0 when none sent data).
        no privacy: the same clients, data, model and training, with no clip, no noise, no budget.
    """
    base = no_privacy if no_privacy is not None else [None] * len(records)
    print()
    print(
        f"{'round':>5}  {'reports':>7}  {'markers':>7}  {'released':>8}  {'contributing*':>13}  "
        f"{'norm/clip*':>10}  {'accuracy':>8}" + ("  no privacy" if no_privacy is not None else "")
    )
    for rec, k, share, acc, b in zip(records, contributing, clip_share, accuracy, base):
        shown = "-" if acc is None else f"{acc:.3f}"
        print(
            f"{rec.round_id:>5}  {rec.reports_received:>7}  {rec.markers_received:>7}  "
            f"{'yes' if rec.released else 'no':>8}  {k:>13}  {share:>10.3f}  {shown:>8}"
            + ("" if b is None else f"  {b:>10.3f}")
        )
    print("  * from the devices' own ledgers after the run; the coordinator never learns it.")
    print("    norm/clip: the mean norm the devices put in, over the clip (0 when none sent data).")
    if no_privacy is not None:
        print("    no privacy: the same clients, data, model and training, with no clip, no noise, no budget.")


def learning_text(
    args: argparse.Namespace, plan: dict[str, Any], accuracy: list[float | None], no_privacy: list[float]
) -> str:
    """Whether these few clients can learn privately: the planner's verdict and the two accuracies.

    Parameters
    ----------
    args : argparse.Namespace
        The demo's options (``clients``, ``placement``, ``noise_multiplier``, ``eps_min``, ``rounds``;
        ``noise_planned`` when the planner chose the noise multiplier).
    plan : dict
        ``fedfilter.cli.demo.flower_plan``'s figures at the run's noise multiplier.
    accuracy : list of float or None
        Per round, the public accuracy.
    no_privacy : list of float
        Per round, the accuracy of the same clients without privacy.

    Returns
    -------
    str
        A paragraph.

    Examples
    --------
    >>> args = argparse.Namespace(clients=10, placement="local", noise_multiplier=8.35, eps_min=1.0, rounds=5,
    ...     noise_planned=True)
    >>> plan = {"noise_dominates": True, "noise_to_clip": 129.4, "recommended": {"devices": 680058},
    ...         "distributed": {"devices": 894}}
    >>> print(learning_text(args, plan, [0.1, None], [0.5, 0.9]))  # doctest: +NORMALIZE_WHITESPACE
    10 clients cannot learn privately at these budgets: at noise multiplier 8.35 (the least whose 5 rounds the
    smallest budget, epsilon 1, pays for) the released mean carries noise of norm 129 times the clip, the most
    the clients' signal can be. For that noise to be half the clip the planner (fedfilter.planning) wants
    680,058 devices per round with local noise, or 894 with distributed noise over SecAgg+ (--population
    runs such a federation). Test accuracy after the last round: 0.100 private, 0.900 for the same clients
    without privacy.
    """
    last = next((a for a in reversed(accuracy) if a is not None), float("nan"))
    tail = (
        f"Test accuracy after the last round: {last:.3f} private, {no_privacy[-1]:.3f} for the same clients "
        "without privacy."
    )
    head = (
        f"noise multiplier {args.noise_multiplier:g}: the released mean carries noise of norm "
        f"{plan['noise_to_clip']:.3g} times the clip."
    )
    if plan["noise_dominates"]:
        wants = [f"{plan['recommended']['devices']:,} devices per round with {args.placement} noise"]
        if "distributed" in plan:
            wants.append(f"{plan['distributed']['devices']:,} with distributed noise over SecAgg+")
        why = (
            f" (the least whose {args.rounds} rounds the smallest budget, epsilon {args.eps_min:g}, pays for)"
            if getattr(args, "noise_planned", False)
            else ""
        )
        head = (
            f"{args.clients} clients cannot learn privately at these budgets: at noise multiplier "
            f"{args.noise_multiplier:g}{why} the released mean carries noise of norm {plan['noise_to_clip']:.3g} "
            "times the clip, the most the clients' signal can be. For that noise to be half the clip the planner "
            f"(fedfilter.planning) wants {', or '.join(wants)} (--population runs such a federation)."
        )
    return f"{head} {tail}"


def plan_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """The planner's figures ``summary.json`` keeps.

    Parameters
    ----------
    plan : dict
        ``fedfilter.planning.federation.plan_federation``'s result.

    Returns
    -------
    dict
        The figures, the verdict and the devices per round it recommends.

    Examples
    --------
    >>> plan = {"noise_multiplier": 2.0, "epsilon": 1.0, "rounds": 5, "mean_noise_norm": 3.0,
    ...     "noise_to_clip": 7.5, "rounds_afforded": 5, "verdict": "v", "recommended": {"devices": 9}}
    >>> plan_summary(plan)["recommended_devices"]
    9
    """
    keys = ("noise_multiplier", "epsilon", "rounds", "mean_noise_norm", "noise_to_clip", "rounds_afforded", "verdict")
    out = {k: plan[k] for k in keys}
    out["recommended_devices"] = plan["recommended"].get("devices")
    out["distributed_devices"] = plan.get("distributed", {}).get("devices")
    return out


def print_clients_table(clients: list[dict[str, Any]]) -> None:
    """Print per client its budget, what it spent, its odometer and worst-case account.

    Parameters
    ----------
    clients : list of dict
        ``device_report`` of each client.

    Examples
    --------
    >>> c = {"client_id": "client-0", "budget_epsilon": 10.0, "spent_epsilon": 4.0, "odometer_epsilon": 3.5,
    ...      "worst_case_epsilon": None, "worst_case_spent_epsilon": None, "exhausted_round": None}
    >>> print_clients_table([c])  # doctest: +NORMALIZE_WHITESPACE
    <BLANKLINE>
    client  budget eps  spent eps  odometer  worst eps  spent  exhausted in round
    client-0  10.00  4.000  3.500  -  -  -
    """
    print()
    print(
        f"{'client':>10}  {'budget eps':>10}  {'spent eps':>10}  {'odometer':>9}  {'worst eps':>10}  {'spent':>8}  "
        "exhausted in round"
    )
    for c in clients:
        ex = "-" if c["exhausted_round"] is None else str(c["exhausted_round"])
        worst = "-" if c["worst_case_epsilon"] is None else f"{c['worst_case_epsilon']:.2f}"
        worst_spent = "-" if c["worst_case_spent_epsilon"] is None else f"{c['worst_case_spent_epsilon']:.3f}"
        print(
            f"{c['client_id']:>10}  {c['budget_epsilon']:>10.2f}  {c['spent_epsilon']:>10.3f}  "
            f"{c['odometer_epsilon']:>9.3f}  {worst:>10}  {worst_spent:>8}  {ex}"
        )


def demo_summary(
    args: argparse.Namespace,
    *,
    run_id: str,
    public_ledger: Path,
    records: list,
    clients: list[dict[str, Any]],
    accuracy: list[float | None],
    contributing: list[int],
    clip_share: list[float],
    filter_kind: str,
    timing: str,
    guarantee: str,
    elapsed: float,
) -> dict[str, Any]:
    """What ``OUT/summary.json`` keeps of a run (README lists its keys).

    That is the public records, each client's report from its own ledger, the settings and the
    guarantee the demo printed.

    Parameters
    ----------
    args : argparse.Namespace
        The demo's options, defaults filled in.
    run_id : str
        The run.
    public_ledger : Path
        The coordinator's public ledger file.
    records : list
        The run's public round records.
    clients : list of dict
        ``device_report`` of each client.
    accuracy, contributing, clip_share : list
        Per round: the public accuracy, the clients contributing data, the share of the clip put in.
    filter_kind : str
        The devices' filter.
    timing : str
        The timing protection the demo printed.
    guarantee : str
        ``guarantee_text(args)``.
    elapsed : float
        The run's wall time in seconds.

    Returns
    -------
    dict
        The summary, ready for ``json.dump``.

    Examples
    --------
    >>> from types import SimpleNamespace as Rec
    >>> args = argparse.Namespace(placement="local", task="digits", clients=2, rounds=1, seed=0,
    ...     noise_multiplier=0.5, clip=1.0, min_reports=1, local_epochs=1, lr=0.1, server_lr=1.0,
    ...     eps_min=10.0, eps_max=60.0, after_exhaustion="noise-only", reply_hold_s=0.0)
    >>> s = demo_summary(args, run_id="run-1", public_ledger=Path("public_ledger.sqlite"),
    ...     records=[Rec(released=True)], clients=[], accuracy=[0.8], contributing=[2], clip_share=[1.0],
    ...     filter_kind="gdp", timing="off", guarantee="...", elapsed=12.34)
    >>> s["released_rounds"], s["final_accuracy"], s["wall_time_s"]
    (1, 0.8, 12.3)
    """
    from fedfilter.client.ledger.report import odometer_text

    released = [bool(r.released) for r in records]
    return {
        "run_id": run_id,
        "rounds_completed": len(records),
        "public_ledger": str(public_ledger),
        "placement": args.placement,
        # Distributed rounds run through SecAgg+: the coordinator unmasks only the sum of the reports.
        "secure_aggregation": args.placement == "distributed",
        "released_rounds": sum(released),
        "released_per_round": released,
        "clients": [
            {
                k: c[k]
                for k in (
                    "client_id",
                    "budget_epsilon",
                    "spent_epsilon",
                    "odometer_epsilon",
                    "worst_case_epsilon",
                    "worst_case_spent_epsilon",
                    "exhausted_round",
                )
            }
            for c in clients
        ],
        "final_accuracy": next((a for a in reversed(accuracy) if a is not None), float("nan")),
        "accuracy_per_round": accuracy,
        "contributing_per_round": contributing,
        "clip_share_per_round": clip_share,
        "settings": {
            "task": args.task,
            "clients": args.clients,
            "rounds": args.rounds,
            "seed": args.seed,
            "noise_multiplier": args.noise_multiplier,
            "clip": args.clip,
            "placement": args.placement,
            "min_reports": args.min_reports,
            "filter": filter_kind,
            "local_epochs": args.local_epochs,
            "lr": args.lr,
            "server_lr": args.server_lr,
            "epsilon_distribution": f"log-uniform[{args.eps_min:g}, {args.eps_max:g}]",
            "delta": DELTA,
            # simulated_worst_case_epsilon (above): min_reports x budget (distributed placement)
            "worst_case_epsilon": "min_reports x budget_epsilon" if args.placement == "distributed" else None,
            "after_exhaustion": args.after_exhaustion,
            "reply_hold_s": args.reply_hold_s,
        },
        "timing_protection": timing,
        "guarantee": guarantee,
        "odometer": odometer_text(DELTA),
        "wall_time_s": round(elapsed, 1),
    }
