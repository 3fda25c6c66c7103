"""Readable views of the coordinator's public ledger: one line per round, and a run's summary.

Everything here reads only public, round-level records (``coordinator/public_ledger.py``): the
``reports watch`` command prints ``format_record`` lines, ``deploy-local`` prints them live and
writes ``public_summary`` into its summary.json.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fedfilter.coordinator.public_ledger import PublicLedger


def _fmt(value: float, spec: str) -> str:
    return format(value, spec) if math.isfinite(value) else str(value)


def _accuracy(metrics: Any) -> str:
    keys = ["accuracy"] + sorted(k for k in metrics if "accuracy" in k.lower() and k != "accuracy")
    for key in keys:
        if key in metrics:
            return _fmt(metrics[key], ".4f")
    return "-"


def format_record(record: Any) -> str:
    """One readable line for a PublicRoundRecord.

    Parameters
    ----------
    record : fedfilter_pb2.PublicRoundRecord
        A round's public record.

    Returns
    -------
    str
        Counts, whether it was released, accuracy (``-`` if none) and wall time.

    Examples
    --------
    >>> from fedfilter.protos import fedfilter_pb2
    >>> record = fedfilter_pb2.PublicRoundRecord(round_id=1, reports_received=3, released=True, wall_time_s=1.25)
    >>> record.metrics["accuracy"] = 0.91
    >>> format_record(record)
    'round    1  reports    3  markers    0  dropped    0  released yes  accuracy 0.9100  wall 1.25 s'
    """
    return (
        f"round {record.round_id:>4}  reports {record.reports_received:>4}  "
        f"markers {record.markers_received:>4}  dropped {record.replies_dropped:>4}  "
        f"released {'yes' if record.released else 'no':<3}  "
        f"accuracy {_accuracy(record.metrics):>6}  wall {_fmt(record.wall_time_s, '.2f')} s"
    )


def public_run_ids(path: Path) -> list[str]:
    """The run ids in a public ledger, oldest first (none if the file does not exist).

    Parameters
    ----------
    path : pathlib.Path
        The ledger's SQLite file (opened read-only).

    Returns
    -------
    list of str
        The runs, oldest first.

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.protos import fedfilter_pb2
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = Path(tmp.name) / "ledger.sqlite"
    >>> with PublicLedger(path) as ledger:
    ...     ledger.start_run("run-1", {})
    ...     record = fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4,
    ...                                              reports_received=3, released=True, aggregate_norm=0.5)
    ...     record.metrics["accuracy"] = 0.91
    ...     ledger.append(record)
    >>> public_run_ids(path), public_run_ids(Path(tmp.name) / "missing.sqlite")
    (['run-1'], [])
    >>> tmp.cleanup()
    """
    if not Path(path).is_file():
        return []
    with PublicLedger(path, read_only=True) as ledger:
        return [run.run_id for run in ledger.runs()]


def public_summary(path: Path, old_runs: Sequence[str] = ()) -> dict[str, Any]:
    """Run id, rounds and final accuracy of the newest run in the coordinator's public ledger
    that is not one of ``old_runs`` (the runs of earlier invocations).

    Parameters
    ----------
    path : pathlib.Path
        The ledger's SQLite file (opened read-only).
    old_runs : sequence of str, optional
        Runs to pass over.

    Returns
    -------
    dict
        ``run_id``, ``rounds_completed`` and ``final_accuracy`` (``None`` where there is none).

    Examples
    --------
    >>> import tempfile
    >>> from fedfilter.protos import fedfilter_pb2
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = Path(tmp.name) / "ledger.sqlite"
    >>> with PublicLedger(path) as ledger:
    ...     ledger.start_run("run-1", {})
    ...     record = fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4,
    ...                                              reports_received=3, released=True, aggregate_norm=0.5)
    ...     record.metrics["accuracy"] = 0.91
    ...     ledger.append(record)
    >>> public_summary(path)
    {'run_id': 'run-1', 'rounds_completed': 1, 'final_accuracy': 0.91}
    >>> public_summary(path, old_runs=["run-1"])
    {'run_id': None, 'rounds_completed': 0, 'final_accuracy': None}
    >>> tmp.cleanup()
    """
    new_runs = [run for run in public_run_ids(path) if run not in set(old_runs)]
    if not new_runs:
        return {"run_id": None, "rounds_completed": 0, "final_accuracy": None}
    run_id = new_runs[-1]
    with PublicLedger(path, read_only=True) as ledger:
        records = ledger.records(run_id)
    accuracy = [float(r.metrics["accuracy"]) for r in records if "accuracy" in r.metrics]
    return {"run_id": run_id, "rounds_completed": len(records), "final_accuracy": accuracy[-1] if accuracy else None}
