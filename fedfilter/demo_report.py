"""What ``fedfilter demo`` shows: the progress bar over the public ledger, the plot, the texts.

Kept apart from ``fedfilter.cmd_demo`` (the run itself) so each file stays small. The progress bar
reads the coordinator's public ledger only; the plot's "clients contributing data" come from the
devices' own ledgers after the run (the demo plays the device owners there).
"""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

DELTA = 1e-5  # every demo device's delta (fedfilter.cmd_demo.DEFAULTS["delta"])


def follow_public_ledger(ledger_path: Path, run_id: str, total: int, stop: threading.Event) -> None:
    """Advance a progress bar as the coordinator appends public records."""
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
    """Per round, the mean over the devices of the norm each put in (the ledger's ``sensitivity`` of a
    ``contributed`` record) over the clip: 1 when every device sent a full-norm update, 0 when none sent
    data. Read from the devices' own ledgers after the run (the coordinator never learns it). With
    distributed noise a device's allowance shrinks round by round as its budget runs out, long before
    its ledger calls it exhausted; this is where that shows."""
    from fedfilter.client.ledger import BudgetLedger

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
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    ax.bar(rounds, contributing, color="#9ecae1", label="clients contributing data (device ledgers)")
    ax.set_xlabel("round")
    ax.set_ylabel("clients contributing data")
    ax.set_ylim(0, max(n, 1) * 1.05)
    ax.set_xticks(rounds)
    ax2 = ax.twinx()
    shown = [(r, a) for r, a in zip(rounds, accuracy) if a is not None]  # released rounds only
    ax2.plot([r for r, _ in shown], [a for _, a in shown], "o-", color="#d62728", label="test accuracy (public ledger)")
    if clip_share is not None:
        ax2.plot(rounds, clip_share, "s--", color="#3182bd", label="mean norm put in / clip (device ledgers)")
    ax2.set_ylabel("test accuracy; share of the clip")
    ax2.set_ylim(0, 1)
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="lower left", fontsize=8)  # labels from the artists
    noise = "distributed noise over SecAgg+" if placement == "distributed" else "local noise"
    ax.set_title(f"fedfilter demo: {n} clients with individual budgets, {noise}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def placement_text(args: argparse.Namespace) -> str:
    """How the noise is placed, for the header line."""
    if args.placement == "distributed":
        return (
            f"distributed noise (Skellam shares summed by SecAgg+, released only from >= {args.min_reports} "
            f"reports, rdp filter)"
        )
    return "local noise (gdp filter)"


def guarantee_text(args: argparse.Namespace) -> str:
    """What each device's budget covers, in the words the summary keeps."""
    d = DELTA
    if args.after_exhaustion == "leave":
        text = (
            f"each client: (budget_epsilon, {d:g})-DP for its reports; in leave mode the round in "
            "which it leaves is visible and depends on its data (not covered)"
        )
    elif args.placement == "distributed":
        text = (
            f"each client: (budget_epsilon, {d:g})-DP over its whole lifetime for everything the "
            f"coordinator sees (Skellam shares masked by SecAgg+: only the sum of >= {args.min_reports} reports "
            "is unmasked, and it carries at least the accounted noise; rdp filter; exhausted clients send "
            "pure noise), provided the coordinator follows the SecAgg+ protocol and the other devices add "
            "their shares"
        )
    else:
        text = (
            f"each client: (budget_epsilon, {d:g})-DP over its whole lifetime for everything the "
            "coordinator sees (local Gaussian noise, gdp filter; exhausted clients send pure noise)"
        )
    if args.reply_hold_s == 0:
        text += "; reply timing is not covered: timing protection is off in this simulation"
    return text
