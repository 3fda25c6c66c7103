"""``fedfilter reports``: serve the coordinator's public ledger over gRPC, or watch it live.

    fedfilter reports serve --ledger runs/ledger.sqlite --port 50071 [--host H] [--run-wait S]
    fedfilter reports watch --target 127.0.0.1:50071 [--run RUN_ID] [--from-round N] [--json]

gRPC and the generated code are imported only when a reports command runs, so registering this
module costs the other commands nothing.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from typing import Any


def register(subparsers: Any) -> None:
    """Add ``reports serve`` and ``reports watch`` to the ``fedfilter`` command.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["reports", "serve", "--ledger", "runs/ledger.sqlite", "--port", "0"])
    >>> args.reports_command, args.host, args.run_wait
    ('serve', '127.0.0.1', 60.0)
    """
    reports = subparsers.add_parser(
        "reports",
        help="serve or watch the public round records",
        description="Serve the coordinator's public ledger over gRPC, or watch a run live.",
    )
    sub = reports.add_subparsers(dest="reports_command", required=True)

    serve = sub.add_parser(
        "serve",
        help="serve a ledger file over gRPC until Ctrl-C or SIGTERM",
        description="Serve the public ledger (opened read-only) until Ctrl-C or SIGTERM.",
    )
    serve.add_argument("--ledger", required=True, help="the SQLite ledger file")
    serve.add_argument("--port", type=int, required=True, help="port to listen on (0: any free)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    serve.add_argument(
        "--run-wait",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds a watch may wait for a run that does not exist yet (default 60)",
    )
    serve.set_defaults(func=_serve)

    watch = sub.add_parser(
        "watch",
        help="print one line per round of a run, live, until the run finishes",
        description="Print one line per round, live; ends when the run is finished.",
    )
    watch.add_argument("--target", required=True, help="HOST:PORT of a report server")
    watch.add_argument("--run", default=None, help="run id (default: the newest run)")
    watch.add_argument("--from-round", type=int, default=0, help="first round to print (default: all)")
    watch.add_argument("--json", action="store_true", help="one JSON object per line")
    watch.set_defaults(func=_watch)


def _serve(args: argparse.Namespace) -> int:
    from fedfilter.coordinator.report_service import format_address, start_server

    stop = threading.Event()
    server, port = start_server(args.ledger, args.port, args.host, run_wait_s=args.run_wait)
    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set()) if in_main else None
    try:
        print(
            f"fedfilter reports: serving {args.ledger} on {format_address(args.host, port)} (Ctrl-C to stop)",
            flush=True,
        )
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        server.stop(grace=1.0).wait(5.0)
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return 0


def _watch(args: argparse.Namespace) -> int:
    import grpc

    from fedfilter.coordinator.public_report import format_record
    from fedfilter.coordinator.report_service import record_to_dict, watch

    if args.from_round < 0:
        raise ValueError(f"--from-round must be >= 0, got {args.from_round}")
    run_shown = None
    try:
        for record in watch(args.target, args.run, args.from_round):
            if args.json:
                print(json.dumps(record_to_dict(record), allow_nan=False), flush=True)
                continue
            if record.run_id != run_shown:
                print(f"run {record.run_id}", flush=True)
                run_shown = record.run_id
            print(format_record(record), flush=True)
    except grpc.RpcError as err:
        code = err.code().name if hasattr(err, "code") else "ERROR"
        details = err.details() if hasattr(err, "details") else str(err)
        print(f"fedfilter: error: reports watch {args.target}: {code}: {details}", file=sys.stderr)
        return 1
    except LookupError as err:
        print(f"fedfilter: error: reports watch {args.target}: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
