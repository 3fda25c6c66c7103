"""A device owner's report about one run, read from the device's own budget ledger.

The report is for the owner only: it is never sent anywhere (the coordinator learns nothing from
it). "Exhausted" means what the device itself decided and recorded: each round's ledger record
has the status the release chose (``client/release.py``): ``contributed`` while both accounts had
something left (``client/mechanisms/spend.nothing_left``: more than ``ClientPolicy.exhausted_below`` of
the clip, and at least the mechanism's floor), ``noise-only`` or ``left`` once either had not.
So the round a device ran out of budget is its first record of the run whose status is not
``contributed``; no second threshold is applied here. A device whose last contribution of a run
used its budget up reports no exhausted round for that run (it never had to stop in it); in its
next run, the first round is the one it ran out.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import SpendRecord
from fedfilter.privacy.odometer import filter_odometer

CONTRIBUTED = "contributed"  # of ledger.STATUSES; "noise-only" and "left" mean it had run out


def exhausted_round(records: list[SpendRecord], run_id: str | None) -> int | None:
    """The first round of ``run_id`` in which the device did not contribute, or None.

    Parameters
    ----------
    records : list of SpendRecord
        The ledger's spends.
    run_id : str or None
        The run.

    Returns
    -------
    int or None

    Examples
    --------
    >>> from fedfilter.client.ledger.schema import spend_record
    >>> rows = [(1, "run", 0, "contributed", 1.0, 2.0, 1.0, 2.0, "local", "[0.25]", "[0.25]", "[0.25]",
    ...          0.0, "default", "[]"),
    ...         (2, "run", 1, "left", 0.0, 2.0, 1.0, 2.0, "local", "[0.0]", "[0.25]", "[0.25]", 0.0, "default", "[]")]
    >>> records = [spend_record(r) for r in rows]
    >>> exhausted_round(records, "run")
    1
    """
    for rec in records:
        if rec.run_id == run_id and rec.status != CONTRIBUTED:
            return int(rec.round_id)
    return None


def contributed_rounds(records: list[SpendRecord], run_id: str | None) -> list[int]:
    """The rounds of ``run_id`` in which the device released its (clipped, noised) update.

    Parameters
    ----------
    records : list of SpendRecord
        The ledger's spends.
    run_id : str or None
        The run.

    Returns
    -------
    list of int

    Examples
    --------
    >>> from fedfilter.client.ledger.schema import spend_record
    >>> rows = [(1, "run", 0, "contributed", 1.0, 2.0, 1.0, 2.0, "local", "[0.25]", "[0.25]", "[0.25]",
    ...          0.0, "default", "[]"),
    ...         (2, "run", 1, "left", 0.0, 2.0, 1.0, 2.0, "local", "[0.0]", "[0.25]", "[0.25]", 0.0, "default", "[]")]
    >>> records = [spend_record(r) for r in rows]
    >>> contributed_rounds(records, "run")
    [0]
    """
    return [int(rec.round_id) for rec in records if rec.run_id == run_id and rec.status == CONTRIBUTED]


def device_report(ledger_dir: Path, run_id: str | None) -> dict[str, Any]:
    """What a device owner can read from their own ledger about one run (never sent anywhere):
    client id, budget, lifetime spent epsilon (the filter's readout), the lifetime odometer (at the
    ledger's delta), the worst-case budget and its spent epsilon (None without one), the round it ran
    out (or None) and the rounds it contributed to. ``run_id`` None (no run reached the public ledger)
    reports no rounds.

    Parameters
    ----------
    ledger_dir : pathlib.Path
        The device's ledger folder.
    run_id : str or None
        The run.

    Returns
    -------
    dict

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> from fedfilter.client.ledger.owner_state import owner_state_at
    >>> with tempfile.TemporaryDirectory() as tmp, owner_state_at(Path(tmp) / "owner"):
    ...     BudgetLedger.enrol(Path(tmp) / "ledger", client_id="a", epsilon=4.0, delta=1e-5).close()
    ...     report = device_report(Path(tmp) / "ledger", "run")
    >>> report["budget_epsilon"], report["spent_epsilon"], report["exhausted_round"]
    (4.0, 0.0, None)
    """
    ledger = BudgetLedger.open(ledger_dir)
    try:
        records = ledger.records(run_id) if run_id is not None else []
        summary = ledger.summary()
        spent = summary["spent_epsilon"]
        # epsilon_spent rounds up (conservative), so a filter that landed exactly on its budget can
        # read a few ulps above it. The filter's own check is in its state, not in epsilon: when the
        # state is within budget, the true spend is at most the budget, and min() stays an upper bound.
        if bool(ledger.filter.within_budget(ledger.state())):
            spent = min(spent, summary["budget_epsilon"])
        worst = summary["worst_case"]  # the account against any coordinator (client/ledger/worst_case.py)
        return {
            "client_id": summary["client_id"],
            "budget_epsilon": summary["budget_epsilon"],
            "spent_epsilon": spent,
            "worst_case_epsilon": None if worst is None else worst["budget_epsilon"],
            "worst_case_spent_epsilon": None if worst is None else worst["spent_epsilon"],
            # Valid at any moment (Rogers et al. (2016) Definition 3.2), also if the device stops now.
            "odometer_epsilon": filter_odometer(ledger.filter, ledger.state()),
            "exhausted_round": exhausted_round(records, run_id),
            "contributed_rounds": contributed_rounds(records, run_id),
        }
    finally:
        ledger.close()


def odometer_report(ledger: BudgetLedger, federations: list[str | None]) -> dict[str, Any]:
    """The odometer (Rogers et al. (2016) Definition 3.2) of the device's lifetime spend and of each
    federation's, at the ledger's delta: a bound on the privacy loss so far that holds at every
    moment, also if the device stops now. The filter's guarantee is its budget while it keeps it.

    Parameters
    ----------
    ledger : BudgetLedger
        The open ledger.
    federations : list of str or None
        The federations to report (None and "" are skipped).

    Returns
    -------
    dict
        ``epsilon``, ``delta`` and ``coordinators`` (epsilon per federation).

    Examples
    --------
    >>> import tempfile
    >>> from pathlib import Path
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     ledger = BudgetLedger.enrol(Path(tmp) / "ledger", client_id="a", epsilon=4.0, delta=1e-5,
    ...                                 state_dir=Path(tmp) / "owner")
    ...     print(odometer_report(ledger, ["default"]))
    ...     ledger.close()
    {'epsilon': 0.0, 'delta': 1e-05, 'coordinators': {'default': 0.0}}
    """
    filt = ledger.filter
    return {
        "epsilon": filter_odometer(filt, ledger.state()),
        "delta": filt.delta,
        "coordinators": {name: filter_odometer(filt, ledger.coordinator_state(name)) for name in federations if name},
    }


def odometer_text(delta: float) -> str:
    """Which of a report's numbers is the guarantee, in the words the summaries keep.

    Parameters
    ----------
    delta : float
        The ledgers' delta.

    Returns
    -------
    str

    Examples
    --------
    >>> odometer_text(1e-5).startswith("odometer_epsilon bounds each client's privacy loss so far at delta 1e-05")
    True
    """
    return (
        f"odometer_epsilon bounds each client's privacy loss so far at delta {delta:g}, valid at every moment "
        "(also if the client stops now); spent_epsilon is the filter's readout, not a guarantee: while the "
        "client keeps its filter, its guarantee is budget_epsilon"
    )
