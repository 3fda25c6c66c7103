"""The public record of one run of ``IndividualFilterStrategy``: a run entry with its public settings,
then one ``PublicRoundRecord`` per round, held until the server-side evaluation of that round has run
and appended with its metrics. Nothing per client is kept or written (``public_ledger.py`` refuses
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
    """Writes the run to ``target`` (a path, an open ``PublicLedger`` or ``None``: nothing written)."""

    def __init__(self, target: str | Path | PublicLedger | None) -> None:
        self.target = target
        self._ledger: PublicLedger | None = None
        self._pending: fedfilter_pb2.PublicRoundRecord | None = None

    @contextmanager
    def run(self, run_id: str, config: Mapping[str, Any]) -> Iterator[None]:
        """The run's entry, opened before Flower's loop and finished (and closed, if opened here) after it."""
        self._pending = None
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

    def hold(self, record: fedfilter_pb2.PublicRoundRecord) -> None:
        """This round's record, appended once the round's server-side metrics are known."""
        self._pending = record

    def append_held(self, metrics: MetricRecord | None) -> None:
        record, self._pending = self._pending, None
        if record is None or self._ledger is None:
            return
        for name, value in (metrics or {}).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                record.metrics[name] = float(value)
        record.finished_at_unix = time.time()
        record.wall_time_s = record.finished_at_unix - record.started_at_unix
        self._ledger.append(record)
