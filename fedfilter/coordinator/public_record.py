"""The public record of one run of ``IndividualFilterStrategy``: a run entry with its public settings,
then one ``PublicRoundRecord`` per round, appended with its metrics once the server-side evaluation
of that round has run. Nothing per client is kept or written (``public_ledger.py`` refuses
names that look per-client)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from flwr.app import MetricRecord

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.protos import fedfilter_pb2

__all__ = ["PublicRecorder"]


class PublicRecorder:
    """Writes the run to ``target`` (a path, an open ``PublicLedger`` or ``None``: nothing written).

    Parameters
    ----------
    target : str, pathlib.Path, PublicLedger or None
        Where the run is recorded.

    Examples
    --------
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> recorder = PublicRecorder(Path(tmp.name) / "ledger.sqlite")
    >>> with recorder.run("run-1", {"rounds": 1}):
    ...     recorder.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=2), None)
    >>> with PublicLedger(recorder.target, read_only=True) as ledger:
    ...     len(ledger.records("run-1")), ledger.is_finished("run-1")
    (1, True)
    >>> tmp.cleanup()
    """

    def __init__(self, target: str | Path | PublicLedger | None) -> None:
        self.target = target
        self._ledger: PublicLedger | None = None

    @contextmanager
    def run(self, run_id: str, config: Mapping[str, Any]) -> Iterator[None]:
        """The run's entry, opened before the rounds and finished (and closed, if opened here) after them.

        Parameters
        ----------
        run_id : str
            The run's id.
        config : Mapping
            The run's public settings (no per-client names).

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> with PublicLedger(Path(tmp.name) / "ledger.sqlite") as ledger:
        ...     with PublicRecorder(ledger).run("run-1", {"rounds": 0}):
        ...         pass
        ...     [run.run_id for run in ledger.runs()], ledger.is_finished("run-1")
        (['run-1'], True)
        >>> tmp.cleanup()
        """
        if self.target is None:
            yield
            return
        ledger = self.target if isinstance(self.target, PublicLedger) else PublicLedger(self.target)
        owned = ledger is not self.target
        started = False
        try:
            ledger.start_run(run_id, dict(config))
            started, self._ledger = True, ledger
            yield
        finally:
            self._ledger = None
            if started:
                ledger.finish_run(run_id)
            if owned:
                ledger.close()

    def append(self, record: fedfilter_pb2.PublicRoundRecord, metrics: MetricRecord | None) -> None:
        """Append one round's record with its server-side ``metrics`` (numbers only), once they are known.

        Parameters
        ----------
        record : fedfilter_pb2.PublicRoundRecord
            The round's record as released (its ``started_at_unix`` set).
        metrics : MetricRecord or None
            The server-side evaluation of the round's model.

        Examples
        --------
        >>> from fedfilter.protos import fedfilter_pb2
        >>> PublicRecorder(None).append(fedfilter_pb2.PublicRoundRecord(run_id="r", round_id=1), None)
        """
        if self._ledger is None:
            return
        for name, value in (metrics or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                record.metrics[name] = float(value)
        record.finished_at_unix = time.time()
        record.wall_time_s = record.finished_at_unix - record.started_at_unix
        self._ledger.append(record)
