"""The device's ClientApp runtime: only owner-approved apps, always inside the device's filter.

``fedfilter supernode`` starts Flower's own ``flower-supernode --isolation process`` (so the SuperNode
starts no ClientApp itself) and, in place of Flower's SuperExec + ``flwr-clientapp``, this runtime:

* ``Launcher`` (the ``fedfilter supernode`` process, no torch): acquires each ClientApp task from the
  SuperNode's Runtime API (``AcquireTask``, authenticated with a per-start SuperExec secret, so no
  other local process can take the device's tasks) and hands its token, over a pipe, to the worker of
  that task's run, starting one when needed.
* ``Worker`` (one process per run): for every token, pulls the message, context, run and FAB
  (Flower's ``pull_task_input``), then **before installing or importing anything** decides on the
  FAB's own bytes (``client/runtime/approval.py``). Refused: an error reply naming the hash and the
  owner's command; nothing is installed, imported, trained or spent. Approved: the ClientApp is loaded
  once per run (warm rounds: torch, the data and the ledger connection stay loaded between the run's
  messages; a new run is a new process, so nothing of one run's app survives into another) and
  called through ``client/device_app.device_handler``. The reply and the context go back with
  Flower's ``push_message``/``push_task_output``, as ``flwr-clientapp`` does.

Compared with Flower's ``flwr.supernode.runtime.run_clientapp`` (the part replaced): the approval
check between pulling and ``install_from_fab``; an approved-by-hash FAB is installed under a
directory named by its full hash computed here (never the hash the coordinator sends) and loaded
from there; an approved-by-component app is imported from the device's installed packages without
installing the FAB; app dependencies are never installed at run time; and the process stays for
the run's next message.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import re
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("fedfilter.device")

# `module.sub:attr.attr`, as Flower's app references are written; checked before any import.
_COMPONENT = re.compile(r"^[A-Za-z_][\w]*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
POLL_S = 0.1  # the launcher's AcquireTask interval: a local HTTP call
APPS_SUBDIR = "fedfilter-approved-apps"  # under FLWR_HOME: approved-by-hash FABs, one folder per full hash


@dataclass(frozen=True)
class RuntimeSettings:
    """What the owner set for this device's runtime (never the coordinator).

    Attributes
    ----------
    runtime_api_address : str
        ``host:port`` of the SuperNode's Runtime API.
    insecure : bool
        True: plain HTTP to the Runtime API.
    root_certificates : str or None
        Path of the Runtime API's CA, when it serves TLS.
    secure_aggregation : bool
        Whether the owner enabled distributed placement (SecAgg+).
    allow_message_types : tuple of str
        Message categories the owner allows besides ``train``.

    Examples
    --------
    >>> settings = RuntimeSettings("127.0.0.1:9094")
    >>> settings.insecure, settings.secure_aggregation
    (True, False)
    """

    runtime_api_address: str
    insecure: bool = True
    root_certificates: str | None = None  # path: the Runtime API's CA, when it serves TLS
    secure_aggregation: bool = False
    allow_message_types: tuple[str, ...] = ()

    def worker_argv(self, parent_pid: int) -> list[str]:
        """The command line of a worker process with these settings.

        Parameters
        ----------
        parent_pid : int
            The launcher's process id (the worker exits when it goes).

        Returns
        -------
        list of str
            ``argv``, starting with this Python interpreter.

        Examples
        --------
        >>> RuntimeSettings("127.0.0.1:9094", secure_aggregation=True).worker_argv(123)[1:]
        ... # doctest: +NORMALIZE_WHITESPACE
        ['-m', 'fedfilter.client.runtime.runner', '--runtime-api-address', '127.0.0.1:9094',
         '--parent-pid', '123', '--insecure', '--secure-aggregation']
        """
        argv = [sys.executable, "-m", "fedfilter.client.runtime.runner", "--runtime-api-address"]
        argv += [self.runtime_api_address, "--parent-pid", str(parent_pid)]
        argv += ["--insecure"] if self.insecure else ["--root-certificates", str(self.root_certificates)]
        argv += ["--secure-aggregation"] if self.secure_aggregation else []
        for kind in self.allow_message_types:
            argv += ["--allow-message-type", kind]
        return argv


def _client(settings: RuntimeSettings, interceptors: list[Any]) -> Any:
    from fedfilter.protocol.flower_api import (
        RuntimeHttpClient,
        make_simple_http_retry_invoker,
        validate_and_resolve_root_certificates,
    )

    return RuntimeHttpClient.from_server_address(
        server_address=settings.runtime_api_address,
        insecure=settings.insecure,
        root_certificates=validate_and_resolve_root_certificates(settings.root_certificates, settings.insecure),
        interceptors=interceptors,
        retry_invoker=make_simple_http_retry_invoker(),
    )


# --- the worker: one run's messages ------------------------------------------------------------
def load_component(component: str) -> Any:
    """Import ``module:attr`` from the installed packages (``sys.path`` unchanged).

    Parameters
    ----------
    component : str
        ``package.module:attribute``, checked before any import.

    Returns
    -------
    ClientApp
        The app; ``ValueError`` when the reference is malformed or names something else.

    Examples
    --------
    >>> try:
    ...     load_component("json:dumps")
    ... except ValueError as err:
    ...     print(err)
    clientapp component 'json:dumps' is not a flwr ClientApp (found function).
    >>> app = load_component("fedfilter.app.client_app:app")  # doctest: +SKIP
    """
    from flwr.clientapp import ClientApp

    if not _COMPONENT.match(component):
        raise ValueError(f"clientapp component must look like 'package.module:attribute'. Found {component!r}.")
    module_name, _, attr = component.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, ClientApp):
        raise ValueError(f"clientapp component {component!r} is not a flwr ClientApp (found {type(obj).__name__}).")
    return obj


def _load_installed(fab: bytes, digest: str, fab_id: str, fab_version: str) -> Any:
    """Install an approved-by-hash FAB under FLWR_HOME/fedfilter-approved-apps/<full hash> and load it."""
    from fedfilter.protocol.flower_api import get_flwr_home, get_load_client_app_fn, install_from_fab

    install_dir = Path(get_flwr_home()) / APPS_SUBDIR / digest
    app_path = install_from_fab(fab, install_dir=install_dir, skip_prompt=True)
    return get_load_client_app_fn(default_app_ref="", app_path=str(app_path), multi_app=True)(
        fab_id, fab_version, digest
    )


@dataclass
class Worker:
    """Runs the tasks of one run; keeps its approved app loaded between them.

    Attributes
    ----------
    settings : RuntimeSettings
        The owner's runtime settings.
    approvals : Path or None
        The approvals file (None: the owner's state directory).
    loaded : dict of str to callable
        FAB hash to its device handler (at most one per run).
    run_id : int or None
        The run served (set by its first task).

    Examples
    --------
    >>> worker = Worker(RuntimeSettings("127.0.0.1:9094"))
    >>> worker.loaded, worker.run_id
    ({}, None)
    """

    settings: RuntimeSettings
    approvals: Path | None = None  # default: the owner's state directory
    loaded: dict[str, Callable] = field(default_factory=dict)  # FAB hash -> device handler
    run_id: int | None = None

    def handler_for(self, decision: Any, fab: bytes, run: Any) -> Callable:
        """The device handler of an approved FAB, loaded on the run's first message.

        Parameters
        ----------
        decision : Decision
            The approval ``decide`` gave (by component: imported; by hash: installed, then loaded).
        fab : bytes
            The FAB.
        run : Run
            Flower's run (its id, ``fab_id`` and ``fab_version``).

        Returns
        -------
        callable
            ``device_handler`` around the app; a second FAB in one run is a ``RuntimeError``.

        Examples
        --------
        >>> from types import SimpleNamespace
        >>> from fedfilter.client.runtime.approval import Decision
        >>> worker = Worker(RuntimeSettings("127.0.0.1:9094"), loaded={"a" * 64: print})
        >>> try:
        ...     worker.handler_for(Decision("b" * 64, True, "hash", "app:app"), b"", SimpleNamespace(run_id=7))
        ... except RuntimeError as err:
        ...     print(str(err)[:31])
        run 7 changed its app to bbbbbb
        """
        from fedfilter.client.runtime.app import allowed_types, device_handler

        if decision.fab_hash not in self.loaded:
            if self.loaded:  # one run, one FAB: a different one is never loaded beside it
                raise RuntimeError(f"run {run.run_id} changed its app to {decision.fab_hash}: refused")
            if decision.by == "component":
                app = load_component(decision.clientapp)
            else:
                app = _load_installed(fab, decision.fab_hash, run.fab_id, run.fab_version)
            self.loaded[decision.fab_hash] = device_handler(
                app,
                secure_aggregation=self.settings.secure_aggregation,
                allowed=allowed_types(self.settings.allow_message_types),
            )
        return self.loaded[decision.fab_hash]

    def run_task(self, token: str) -> None:
        """Pull one task, decide on its FAB, run it through the device handler and push the reply.

        Parameters
        ----------
        token : str
            The task's token from the launcher.

        Examples
        --------
        >>> Worker(RuntimeSettings("127.0.0.1:9094")).run_task(token)  # doctest: +SKIP
        """
        from flwr.app import Error, Message

        from fedfilter.client.runtime.approval import decide, load_approved
        from fedfilter.protocol.flower_api import (
            ErrorCode,
            HeartbeatSender,
            RuntimeTokenHttpInterceptor,
            RuntimeVersionHttpInterceptor,
            SubStatus,
            make_task_heartbeat_fn_http,
            pull_task_input,
            push_message,
            push_task_output,
        )

        client = _client(
            self.settings,
            [RuntimeVersionHttpInterceptor(component_name="flwr-clientapp"), RuntimeTokenHttpInterceptor(token)],
        )
        heartbeat = HeartbeatSender(make_task_heartbeat_fn_http(client))
        heartbeat.start()
        started = time.perf_counter()
        context = message = reply = None
        status, details = SubStatus.FAILED, "fedfilter: the task failed"
        try:
            message, context, run, fab = pull_task_input(client)
            if self.run_id is None:
                self.run_id = run.run_id
            if run.run_id != self.run_id:
                raise RuntimeError(f"a task of run {run.run_id} reached the worker of run {self.run_id}")
            try:  # the owner's list is read for every message: a revocation applies at the next one
                decision = decide(fab.content, load_approved(self.approvals))
            except ValueError as err:  # a damaged list approves nothing
                log.error("fedfilter device: %s", err)
                decision = decide(fab.content, [])
            if not decision.approved:
                log.warning("fedfilter device: refused app %s: not approved by the owner", decision.fab_hash)
                reply = Message(
                    Error(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason=decision.refusal()), reply_to=message
                )
                details = decision.refusal()
            else:
                handler = self.handler_for(decision, fab.content, run)
                reply = handler(message, context)
                status, details = SubStatus.COMPLETED, ""
        except Exception as err:  # as flwr-clientapp: an error reply; the details stay on the device
            log.exception("fedfilter device: the task failed")
            if message is not None:
                reply = Message(
                    Error(code=ErrorCode.CLIENT_APP_RAISED_EXCEPTION, reason=f"{type(err).__name__}"), reply_to=message
                )
        finally:
            try:
                if reply is not None and context is not None:
                    push_message(client, reply, context)
            except Exception:
                log.exception("fedfilter device: pushing the reply failed")
            push_task_output(client=client, context=context, sub_status=status, details=details)
            heartbeat.stop()
            client.close()
            # Local only (the device's log): what benchmarks/deployed_round.py reads.
            log.info("fedfilter device: task %s in %.3f s", status, time.perf_counter() - started)

    def serve(self, lines: Any) -> None:
        """One token per line until the launcher closes the pipe.

        Parameters
        ----------
        lines : iterable of str
            The pipe (blank lines are skipped).

        Examples
        --------
        >>> Worker(RuntimeSettings("127.0.0.1:9094")).serve(["", "  \\n"])  # no token: nothing runs
        >>> Worker(RuntimeSettings("127.0.0.1:9094")).serve(sys.stdin)  # doctest: +SKIP
        """
        for line in lines:
            token = line.strip()
            if token:
                self.run_task(token)


# --- the launcher: acquires tasks, one warm worker per run --------------------------------------
class Launcher:
    """Acquires the device's ClientApp tasks and hands each to the warm worker of its run.

    Parameters
    ----------
    settings : RuntimeSettings
        The owner's runtime settings.
    secret : bytes
        The SuperExec secret of this start (authenticates ``AcquireTask``).

    Examples
    --------
    >>> launcher = Launcher(RuntimeSettings("127.0.0.1:9094"), secret=bytes(32))
    >>> launcher.workers, launcher.stopping.is_set()
    ({}, False)
    """

    def __init__(self, settings: RuntimeSettings, secret: bytes):
        self.settings, self.secret = settings, secret
        self.workers: dict[int, subprocess.Popen] = {}
        self.stopping = threading.Event()

    def _worker(self, run_id: int) -> subprocess.Popen:
        worker = self.workers.get(run_id)
        if worker is not None and worker.poll() is None:
            return worker
        for other in list(self.workers):  # a new run: the previous run's app is unloaded
            self._retire(other)
        worker = subprocess.Popen(self.settings.worker_argv(os.getpid()), stdin=subprocess.PIPE, text=True)
        self.workers[run_id] = worker
        return worker

    def _retire(self, run_id: int) -> None:
        worker = self.workers.pop(run_id)
        try:
            if worker.stdin is not None:
                worker.stdin.close()  # it finishes its current task, then exits
        except OSError:
            pass

    def dispatch(self, run_id: int, token: str) -> None:
        """Send ``token`` to the worker of ``run_id``, starting it (and retiring another run's) when needed.

        Parameters
        ----------
        run_id : int
            The task's run.
        token : str
            The task's token.

        Examples
        --------
        >>> launcher.dispatch(run_id, token)  # starts a worker process  # doctest: +SKIP
        """
        for attempt in range(2):
            worker = self._worker(run_id)
            try:
                if worker.stdin is None:
                    raise BrokenPipeError("the worker has no input pipe")
                worker.stdin.write(token + "\n")
                worker.stdin.flush()
                return
            except (BrokenPipeError, OSError):
                self.workers.pop(run_id, None)
                if attempt:
                    raise

    def serve(self) -> None:
        """Poll the Runtime API for tasks until ``stopping`` is set; then retire every worker.

        Examples
        --------
        >>> Launcher(RuntimeSettings("127.0.0.1:9094"), secret).serve()  # doctest: +SKIP
        """
        from fedfilter.protocol.flower_api import (
            AcquireTaskRequest,
            RuntimeVersionHttpInterceptor,
            SuperExecAuthHttpInterceptor,
            TaskType,
        )

        client = _client(
            self.settings,
            [
                RuntimeVersionHttpInterceptor(component_name="SuperExec"),
                SuperExecAuthHttpInterceptor(
                    master_secret=self.secret, protected_methods=frozenset({"/flwr.proto.Runtime/AcquireTask"})
                ),
            ],
        )
        try:
            while not self.stopping.is_set():
                res = client.AcquireTask(AcquireTaskRequest(supported_task_types=[TaskType.CLIENT_APP.value]))
                if res.HasField("task") and res.token:
                    self.dispatch(res.task.run_id, res.token)
                    continue
                self.stopping.wait(POLL_S)
        finally:
            client.close()
            for run_id in list(self.workers):
                self._retire(run_id)


# --- `fedfilter supernode` ----------------------------------------------------------------------
# Flags of flower-supernode this command must read (the Runtime API it serves) or must set itself.
_RUNTIME_FLAGS = ("--host", "--port", "--ssl-certfile", "--ssl-ca-certfile")
_OWN_FLAGS = ("--isolation", "--superexec-auth-secret-file")


def split_flower_args(flower_args: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    """Read the Runtime API flags among Flower's; refuse the ones this command sets itself.

    Parameters
    ----------
    flower_args : sequence of str
        The ``flower-supernode`` arguments the owner passed.

    Returns
    -------
    tuple of (argparse.Namespace, list of str)
        The Runtime API's ``host``, ``port`` and TLS files, and the arguments passed on unchanged.

    Examples
    --------
    >>> runtime, passthrough = split_flower_args(["--superlink", "10.0.0.1:9092", "--port=9100"])
    >>> runtime.port, passthrough
    (9100, ['--superlink', '10.0.0.1:9092', '--port=9100'])
    >>> try:
    ...     split_flower_args(["--isolation", "subprocess"])
    ... except ValueError as err:
    ...     print(str(err)[-22:])
    Found ['--isolation'].
    """
    from fedfilter.protocol.flower_api import SUPERNODE_UVICORN_DEFAULT_PORT, UVICORN_DEFAULT_HOST

    taken = [a for a in flower_args if a.split("=", 1)[0] in _OWN_FLAGS]
    if taken:
        raise ValueError(
            f"fedfilter supernode sets {', '.join(_OWN_FLAGS)} itself (process isolation with the device's "
            f"own runtime). Found {taken}."
        )
    peek = argparse.ArgumentParser(add_help=False)
    peek.add_argument("--host", default=UVICORN_DEFAULT_HOST)
    peek.add_argument("--port", type=int, default=SUPERNODE_UVICORN_DEFAULT_PORT)
    peek.add_argument("--ssl-certfile", default=None)
    peek.add_argument("--ssl-ca-certfile", default=None)
    runtime, _ = peek.parse_known_args(list(flower_args))
    return runtime, list(flower_args)


def run_supernode(
    flower_args: Sequence[str],
    *,
    secure_aggregation: bool,
    allow_message_types: Sequence[str],
    echo: Callable[[str], None] = print,
) -> int:
    """Flower's SuperNode (process isolation) plus the device's runtime, until either ends.

    Parameters
    ----------
    flower_args : sequence of str
        Arguments for ``flower-supernode`` (``--isolation`` and the SuperExec secret are set here).
    secure_aggregation : bool
        Whether the owner enabled distributed placement (SecAgg+).
    allow_message_types : sequence of str
        Message categories answered besides ``train``.
    echo : callable, optional
        Where the start-up lines go.

    Returns
    -------
    int
        The SuperNode's exit code.

    Examples
    --------
    >>> run_supernode(["--superlink", "10.0.0.1:9092"], secure_aggregation=False,
    ...               allow_message_types=[])  # doctest: +SKIP
    """
    from fedfilter.client.runtime.app import allowed_types
    from fedfilter.client.runtime.approval import TRUST_TEXT, approvals_path, load_approved

    allowed = allowed_types(allow_message_types)
    runtime, passthrough = split_flower_args(flower_args)
    if runtime.ssl_certfile is not None and runtime.ssl_ca_certfile is None:
        raise ValueError("--ssl-certfile needs --ssl-ca-certfile: the device's runtime verifies the Runtime API.")
    host = f"[{runtime.host}]" if ":" in runtime.host else runtime.host
    settings = RuntimeSettings(
        runtime_api_address=f"{host}:{runtime.port}",
        insecure=runtime.ssl_certfile is None,
        root_certificates=runtime.ssl_ca_certfile,
        secure_aggregation=secure_aggregation,
        allow_message_types=tuple(sorted(allowed - {"train"})),
    )
    approved = load_approved()
    echo(f"fedfilter supernode: {TRUST_TEXT}.")
    echo(f"fedfilter supernode: {len(approved)} approved app(s) in {approvals_path()}")
    echo(
        f"fedfilter supernode: message types answered: {', '.join(sorted(allowed))}; distributed placement "
        f"(SecAgg+) {'enabled' if secure_aggregation else 'off'}"
    )
    with tempfile.TemporaryDirectory(prefix="fedfilter-supernode-") as private:
        secret_file = Path(private) / "superexec-secret"
        secret = secrets.token_bytes(32)
        fd = os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as handle:
            handle.write(secret)
        argv = [_flower_supernode(), *passthrough, "--isolation", "process"]
        argv += ["--superexec-auth-secret-file", str(secret_file)]
        supernode = subprocess.Popen(argv)
        launcher = Launcher(settings, secret)
        thread = threading.Thread(target=_serve_logged, args=(launcher,), name="fedfilter-launcher", daemon=True)
        thread.start()
        try:
            while supernode.poll() is None and thread.is_alive():
                time.sleep(0.5)
        finally:
            launcher.stopping.set()
            if supernode.poll() is None:
                supernode.terminate()
                try:
                    supernode.wait(10)
                except subprocess.TimeoutExpired:
                    supernode.kill()
            thread.join(5)
    return supernode.returncode or 0


def _serve_logged(launcher: Launcher) -> None:
    try:
        launcher.serve()
    except Exception:
        if not launcher.stopping.is_set():
            log.exception("fedfilter supernode: the device runtime stopped")


def _flower_supernode() -> str:
    candidate = Path(sys.executable).with_name("flower-supernode")
    return str(candidate) if candidate.exists() else "flower-supernode"


def _worker_main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fedfilter's device runtime worker (started by fedfilter supernode)")
    parser.add_argument("--runtime-api-address", required=True)
    parser.add_argument("--insecure", action="store_true")
    parser.add_argument("--root-certificates", default=None)
    parser.add_argument("--parent-pid", type=int, default=None)
    parser.add_argument("--secure-aggregation", action="store_true")
    parser.add_argument("--allow-message-type", action="append", default=[])
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("fedfilter").setLevel(logging.INFO)
    if args.parent_pid is not None:
        from fedfilter.protocol.flower_api import start_parent_process_monitor

        start_parent_process_monitor(args.parent_pid)
    settings = RuntimeSettings(
        runtime_api_address=args.runtime_api_address,
        insecure=args.insecure,
        root_certificates=args.root_certificates,
        secure_aggregation=args.secure_aggregation,
        allow_message_types=tuple(args.allow_message_type),
    )
    Worker(settings).serve(sys.stdin)


if __name__ == "__main__":
    _worker_main()
