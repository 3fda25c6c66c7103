"""A gRPC service that serves the public ledger to observers, and a client helper to watch it.

The server only ever reads the ledger (it opens the SQLite file read-only, so it can run in its
own process next to the coordinator that writes it) and polls it for new rows. It serves public
data only, over an insecure channel bound to ``127.0.0.1`` by default.

    server = serve("runs/ledger.sqlite", port=50071)      # returns a started grpc.Server
    for record in watch("127.0.0.1:50071"):               # newest run, live, until it finishes
        print(record.round_id, record.metrics["accuracy"])
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.protos import fedfilter_pb2, fedfilter_pb2_grpc

__all__ = [
    "ReportServicer",
    "start_server",
    "serve",
    "watch",
    "newest_run_id",
    "record_to_dict",
    "format_address",
]

DEFAULT_POLL_INTERVAL_S = 0.2
DEFAULT_RUN_WAIT_S = 60.0


def format_address(host: str, port: int) -> str:
    """``host:port``, with brackets around an IPv6 host.

    Parameters
    ----------
    host : str
        A host name or IPv4/IPv6 address.
    port : int
        The port.

    Returns
    -------
    str
        The gRPC address.

    Examples
    --------
    >>> format_address("127.0.0.1", 50071), format_address("::1", 50071)
    ('127.0.0.1:50071', '[::1]:50071')
    """
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


class ReportServicer(fedfilter_pb2_grpc.ReportServiceServicer):
    """Serves the ledger at ``ledger_path`` (read-only).

    The file may not exist yet when the server starts: until the coordinator creates it, the
    ledger reads as empty. ``StreamRecords`` polls every ``poll_interval_s`` seconds and waits at
    most ``run_wait_s`` seconds for a run that has not been started yet.

    Parameters
    ----------
    ledger_path : str or pathlib.Path
        The public ledger's SQLite file.
    poll_interval_s : float, optional
        Seconds between polls of the ledger.
    run_wait_s : float, optional
        Seconds ``StreamRecords`` waits for a run to appear.

    Examples
    --------
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = Path(tmp.name) / "ledger.sqlite"
    >>> with PublicLedger(path) as ledger:
    ...     ledger.start_run("run-1", {})
    ...     ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4))
    ...     ledger.finish_run("run-1")
    >>> servicer = ReportServicer(path)
    >>> [run.run_id for run in servicer.ListRuns(fedfilter_pb2.ListRunsRequest(), None).runs]
    ['run-1']
    >>> servicer.close(); tmp.cleanup()
    """

    def __init__(
        self,
        ledger_path: str | Path,
        *,
        poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
        run_wait_s: float = DEFAULT_RUN_WAIT_S,
    ):
        if not (poll_interval_s > 0 and math.isfinite(poll_interval_s)):
            raise ValueError(f"poll_interval_s must be positive, got {poll_interval_s}")
        if not (run_wait_s >= 0 and math.isfinite(run_wait_s)):
            raise ValueError(f"run_wait_s must be finite and >= 0, got {run_wait_s}")
        self.ledger_path = Path(ledger_path)
        self.poll_interval_s = poll_interval_s
        self.run_wait_s = run_wait_s
        self._ledger: PublicLedger | None = None
        self._open_lock = threading.Lock()

    def _get_ledger(self) -> PublicLedger | None:
        """The read-only ledger, opened on first use; None while the file does not exist."""
        with self._open_lock:
            if self._ledger is None and self.ledger_path.is_file():
                self._ledger = PublicLedger(self.ledger_path, read_only=True)
            return self._ledger

    def close(self) -> None:
        """Close the ledger connection (the server should be stopped first).

        Examples
        --------
        >>> servicer = ReportServicer("missing.sqlite")
        >>> servicer.close()
        """
        with self._open_lock:
            if self._ledger is not None:
                self._ledger.close()
                self._ledger = None

    def _has_run(self, run_id: str) -> bool:
        ledger = self._get_ledger()
        return ledger is not None and ledger.has_run(run_id)

    # -- RPCs --------------------------------------------------------------------------------

    def GetRecords(self, request, context):  # noqa: N802 (gRPC method name)
        """Every record of ``request.run_id``; an unknown run aborts the call with NOT_FOUND.

        Parameters
        ----------
        request : fedfilter_pb2.GetRecordsRequest
            The run to read.
        context : grpc.ServicerContext
            The call's context.

        Returns
        -------
        fedfilter_pb2.RecordList
            The run's records, by round.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = Path(tmp.name) / "ledger.sqlite"
        >>> with PublicLedger(path) as ledger:
        ...     ledger.start_run("run-1", {})
        ...     ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4))
        ...     ledger.finish_run("run-1")
        >>> servicer = ReportServicer(path)
        >>> [r.round_id for r in servicer.GetRecords(fedfilter_pb2.GetRecordsRequest(run_id="run-1"), None).records]
        [1]
        >>> servicer.close(); tmp.cleanup()
        """
        if not self._has_run(request.run_id):
            context.abort(grpc.StatusCode.NOT_FOUND, f"unknown run_id {request.run_id!r}")
        ledger = self._get_ledger()
        assert ledger is not None
        return fedfilter_pb2.RecordList(records=ledger.records(request.run_id))

    def ListRuns(self, request, context):  # noqa: N802
        """Every run in the ledger, oldest first (none while the file does not exist).

        Parameters
        ----------
        request : fedfilter_pb2.ListRunsRequest
            The (empty) request.
        context : grpc.ServicerContext
            The call's context.

        Returns
        -------
        fedfilter_pb2.RunList
            The runs.

        Examples
        --------
        >>> servicer = ReportServicer("missing.sqlite")
        >>> len(servicer.ListRuns(fedfilter_pb2.ListRunsRequest(), None).runs)
        0
        """
        ledger = self._get_ledger()
        return fedfilter_pb2.RunList(runs=ledger.runs() if ledger is not None else [])

    def StreamRecords(self, request, context):  # noqa: N802
        """Yield the records of ``request.run_id`` from ``request.from_round`` on, live, until the run finishes.

        Parameters
        ----------
        request : fedfilter_pb2.StreamRecordsRequest
            The run and the first round wanted.
        context : grpc.ServicerContext
            The call's context (the stream ends when it is no longer active).

        Yields
        ------
        fedfilter_pb2.PublicRoundRecord
            The records, by round.

        Examples
        --------
        >>> import tempfile
        >>> tmp = tempfile.TemporaryDirectory()
        >>> path = Path(tmp.name) / "ledger.sqlite"
        >>> with PublicLedger(path) as ledger:
        ...     ledger.start_run("run-1", {})
        ...     ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4))
        ...     ledger.finish_run("run-1")
        >>> servicer = ReportServicer(path)
        >>> class Active:
        ...     def is_active(self):
        ...         return True
        >>> request = fedfilter_pb2.StreamRecordsRequest(run_id="run-1")
        >>> [r.round_id for r in servicer.StreamRecords(request, Active())]
        [1]
        >>> servicer.close(); tmp.cleanup()
        """
        run_id = request.run_id
        if not run_id:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "run_id is empty")
        deadline = time.monotonic() + self.run_wait_s
        while not self._has_run(run_id):
            if not context.is_active():
                return
            if time.monotonic() >= deadline:
                context.abort(
                    grpc.StatusCode.NOT_FOUND,
                    f"run_id {run_id!r} did not appear within {self.run_wait_s:g} s",
                )
            time.sleep(self.poll_interval_s)

        ledger = self._get_ledger()
        assert ledger is not None
        # Round ids are strictly increasing within a run (the ledger refuses anything else) and
        # appends are refused once a run is finished, so: read "finished" first, then the rows;
        # if the run was finished before the read, that read saw its last row.
        last = int(request.from_round) - 1
        while context.is_active():
            finished = ledger.is_finished(run_id)
            for record in ledger.records_after(run_id, last):
                yield record
                last = record.round_id
            if finished:
                return
            time.sleep(self.poll_interval_s)


def start_server(
    ledger_path: str | Path,
    port: int = 0,
    host: str = "127.0.0.1",
    *,
    max_workers: int = 16,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
    run_wait_s: float = DEFAULT_RUN_WAIT_S,
) -> tuple[grpc.Server, int]:
    """Start a report server and return it with the port it bound (``port=0``: the OS picks).

    Each open ``StreamRecords`` call holds one of ``max_workers`` threads. Raises ``ValueError``
    if the address cannot be bound (SO_REUSEPORT is off, so a port in use is an error).

    Parameters
    ----------
    ledger_path : str or pathlib.Path
        The public ledger's SQLite file.
    port : int, optional
        The port (0: the OS picks one).
    host : str, optional
        The address to bind.
    max_workers : int, optional
        Server threads (each open stream holds one).
    poll_interval_s : float, optional
        Seconds between polls of the ledger.
    run_wait_s : float, optional
        Seconds a stream waits for its run to appear.

    Returns
    -------
    tuple of (grpc.Server, int)
        The started server and its port.

    Examples
    --------
    >>> server, port = start_server("runs/ledger.sqlite")  # doctest: +SKIP
    >>> server.stop(None)  # doctest: +SKIP
    """
    if not 0 <= int(port) <= 65535:
        raise ValueError(f"port must be in 0..65535, got {port}")
    servicer = ReportServicer(ledger_path, poll_interval_s=poll_interval_s, run_wait_s=run_wait_s)
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="reports"),
        options=[("grpc.so_reuseport", 0)],
    )
    fedfilter_pb2_grpc.add_ReportServiceServicer_to_server(servicer, server)
    address = format_address(host, int(port))
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError as err:
        raise ValueError(f"cannot bind the report server to {address}: {err}") from None
    if bound == 0:
        raise ValueError(f"cannot bind the report server to {address}")
    server.start()
    return server, bound


def serve(ledger_path: str | Path, port: int, host: str = "127.0.0.1") -> grpc.Server:
    """Start a report server for ``ledger_path`` on ``host:port`` and return it (started).

    Stop it with ``server.stop(grace)``. Use :func:`start_server` to learn an OS-chosen port.

    Parameters
    ----------
    ledger_path : str or pathlib.Path
        The public ledger's SQLite file.
    port : int
        The port.
    host : str, optional
        The address to bind.

    Returns
    -------
    grpc.Server
        The started server.

    Examples
    --------
    >>> server = serve("runs/ledger.sqlite", port=50071)  # doctest: +SKIP
    >>> server.stop(grace=1.0)  # doctest: +SKIP
    """
    server, _ = start_server(ledger_path, port, host)
    return server


def newest_run_id(
    stub: fedfilter_pb2_grpc.ReportServiceStub,
    *,
    wait_s: float = DEFAULT_RUN_WAIT_S,
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S,
) -> str:
    """The id of the newest run the server knows, waiting up to ``wait_s`` for a first run.

    Parameters
    ----------
    stub : fedfilter_pb2_grpc.ReportServiceStub
        A client of the report service.
    wait_s : float, optional
        Seconds to wait for a first run (then ``LookupError``).
    poll_interval_s : float, optional
        Seconds between polls.

    Returns
    -------
    str
        The newest run's id.

    Examples
    --------
    >>> import tempfile
    >>> tmp = tempfile.TemporaryDirectory()
    >>> path = Path(tmp.name) / "ledger.sqlite"
    >>> with PublicLedger(path) as ledger:
    ...     ledger.start_run("run-1", {})
    ...     ledger.append(fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, clients_sampled=4))
    ...     ledger.finish_run("run-1")
    >>> servicer = ReportServicer(path)
    >>> class Stub:  # stands in for a ReportServiceStub, without a channel
    ...     def ListRuns(self, request, timeout):
    ...         return servicer.ListRuns(request, None)
    >>> newest_run_id(Stub())
    'run-1'
    >>> servicer.close(); tmp.cleanup()
    """
    deadline = time.monotonic() + wait_s
    while True:
        runs = stub.ListRuns(fedfilter_pb2.ListRunsRequest(), timeout=max(wait_s, 5.0)).runs
        if runs:
            return runs[-1].run_id
        if time.monotonic() >= deadline:
            raise LookupError(f"no run appeared in the ledger within {wait_s:g} s")
        time.sleep(poll_interval_s)


def watch(
    target: str,
    run_id: str | None = None,
    from_round: int = 0,
    *,
    timeout_s: float | None = None,
    wait_s: float = DEFAULT_RUN_WAIT_S,
) -> Iterator[fedfilter_pb2.PublicRoundRecord]:
    """Yield the records of ``run_id`` (None: the newest run) served at ``target`` (host:port).

    Yields every record from round ``from_round`` on, then new ones as they arrive, and returns
    when the run is finished. ``timeout_s`` bounds the whole stream (``grpc.RpcError`` with
    DEADLINE_EXCEEDED when it runs out); ``wait_s`` bounds the wait for a first run when
    ``run_id`` is None. Closing the generator cancels the stream.

    Parameters
    ----------
    target : str
        The server's ``host:port``.
    run_id : str or None, optional
        The run to watch (``None``: the newest).
    from_round : int, optional
        The first round wanted.
    timeout_s : float or None, optional
        Bound on the whole stream, in seconds.
    wait_s : float, optional
        Seconds to wait for a first run when ``run_id`` is ``None``.

    Yields
    ------
    fedfilter_pb2.PublicRoundRecord
        The run's records, by round.

    Examples
    --------
    >>> for record in watch("127.0.0.1:50071"):  # doctest: +SKIP
    ...     print(record.round_id, record.released)
    """
    if from_round < 0:
        raise ValueError(f"from_round must be >= 0, got {from_round}")
    channel = grpc.insecure_channel(target)
    call = None
    try:
        stub = fedfilter_pb2_grpc.ReportServiceStub(channel)
        if run_id is None:
            run_id = newest_run_id(stub, wait_s=wait_s)
        call = stub.StreamRecords(
            fedfilter_pb2.StreamRecordsRequest(run_id=run_id, from_round=from_round),
            timeout=timeout_s,
        )
        yield from call
    finally:
        if call is not None:
            call.cancel()
        channel.close()


def _finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _placement_name(value: int) -> str:
    try:
        return fedfilter_pb2.NoisePlacement.Name(value)
    except ValueError:  # a value from a newer schema
        return str(value)


def record_to_dict(record: fedfilter_pb2.PublicRoundRecord) -> dict[str, Any]:
    """A plain, JSON-ready dict of a record (ints stay ints; NaN/inf become None).

    Parameters
    ----------
    record : fedfilter_pb2.PublicRoundRecord
        A round's public record.

    Returns
    -------
    dict
        The record's fields, the request's nested under ``"request"``.

    Examples
    --------
    >>> record = fedfilter_pb2.PublicRoundRecord(run_id="run-1", round_id=1, released=True,
    ...                                          aggregate_norm=float("nan"))
    >>> d = record_to_dict(record)
    >>> d["round_id"], d["aggregate_norm"], d["request"]["placement"]
    (1, None, 'NOISE_PLACEMENT_UNSPECIFIED')
    """
    request = record.request
    return {
        "run_id": record.run_id,
        "round_id": int(record.round_id),
        "request": {
            "noise_multiplier": _finite_or_none(request.noise_multiplier),
            "clip": _finite_or_none(request.clip),
            "placement": _placement_name(request.placement),
            "min_reports": request.min_reports,
            "local_epochs": request.local_epochs,
            "learning_rate": _finite_or_none(request.learning_rate),
        },
        "clients_sampled": record.clients_sampled,
        "reports_received": record.reports_received,
        "markers_received": record.markers_received,
        "replies_dropped": record.replies_dropped,
        "released": record.released,
        "aggregate_norm": _finite_or_none(record.aggregate_norm),
        "metrics": {key: _finite_or_none(record.metrics[key]) for key in sorted(record.metrics)},
        "started_at_unix": record.started_at_unix,
        "finished_at_unix": record.finished_at_unix,
        "wall_time_s": record.wall_time_s,
    }
