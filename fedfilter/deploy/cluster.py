"""A SuperLink on 127.0.0.1, its ``flwr`` CLI connection, SuperNodes and ``flwr run``.

``FlowerCluster`` is a context manager: entering it starts a ``flower-superlink`` on a free
127.0.0.1 port with its own ``FLWR_HOME`` and writes the connection to that home's
``config.toml``; leaving it stops every process it started (SIGTERM, SIGKILL after a grace
period), also on Ctrl-C or failure. By default the SuperLink runs the Deployment Engine with TLS
(a throw-away CA) and SuperNode authentication; ``tls=False, node_auth=False, simulation=True``
gives a Simulation Engine SuperLink (``--insecure --simulation``) for ``flwr run`` with a
``federation_config``. In between: ``new_key``/``register``/``start_supernode``/``wait_online``
for SuperNodes, ``run_app`` for ``flwr run APP_DIR CONNECTION --stream`` bounded by a timeout
with a callback per output line, and ``flwr`` for any other CLI command.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfilter.client.ledger.owner_state import STATE_DIR_ENV
from fedfilter.deploy.flower_config import write_connection, write_flat_toml
from fedfilter.deploy.processes import (
    LOOPBACK,
    DeploymentError,
    ManagedProcess,
    flower_env,
    free_ports,
    strip_ansi,
    tail,
    tool,
)
from fedfilter.deploy.tls import TlsFiles, make_node_key, make_tls

CONNECTION = "fedfilter-local"
RUN_COMPLETED = "finished:completed"

STARTED_RUN = re.compile(r"Successfully started run (\d+)")  # a line of `flwr run`
_SUPERNODE_ONLINE = re.compile(r"SuperNode ID: (\d+)")
_SUPERLINK_READY = re.compile(r"Uvicorn running on https?://\S+")


@dataclass
class RunResult:
    """The outcome of ``flwr run`` (``FlowerCluster.run_app``).

    Parameters
    ----------
    run_id : int or None
        The run's id (None if it did not start).
    status : str
        Flower's status, e.g. ``finished:completed``, or ``timeout`` / ``not-started``.
    details : str
        Flower's status details, or what went wrong.
    duration_s : float
        Wall time of ``flwr run``.
    output : str, optional
        Everything ``flwr run`` printed.

    Examples
    --------
    >>> RunResult(3, RUN_COMPLETED, "", 12.5).ok
    True
    """

    run_id: int | None
    status: str  # Flower's, e.g. "finished:completed", or "timeout" / "not-started"
    details: str
    duration_s: float
    output: str = ""

    @property
    def ok(self) -> bool:
        """Whether the run completed (Flower's ``finished:completed``).

        Returns
        -------
        bool
            ``status == RUN_COMPLETED``.

        Examples
        --------
        >>> RunResult(None, "not-started", "no SuperLink", 0.1).ok
        False
        """
        return self.status == RUN_COMPLETED


@dataclass
class SuperNodeHandle:
    """A SuperNode a ``FlowerCluster`` started.

    Parameters
    ----------
    name : str
        Its name (its folder under ``supernodes/``).
    process : ManagedProcess
        Its process.
    home : Path
        Its folder.
    node_id : int, optional
        The id the SuperLink gave it (set by ``FlowerCluster.wait_online``).
    node_config : dict, optional
        The node config it was started with.

    Examples
    --------
    >>> proc = ManagedProcess("flower-supernode a", ["flower-supernode"], log_path=Path("a.log"))
    >>> SuperNodeHandle("a", proc, Path("supernodes/a")).node_id is None
    True
    """

    name: str
    process: ManagedProcess
    home: Path
    node_id: int | None = None
    node_config: dict[str, Any] = field(default_factory=dict)


class FlowerCluster:
    """A SuperLink on 127.0.0.1 and its CLI connection, and the SuperNodes started through it.

    By default the SuperLink runs with TLS and SuperNode authentication; everything stops when the
    context exits.

    Layout under ``root``: ``tls/`` (CA and server certificate), ``flwr-home/`` (the SuperLink's
    and the CLI's ``FLWR_HOME``, with ``config.toml``), ``keys/`` (SuperNode keys),
    ``supernodes/<name>/`` (each SuperNode's ``FLWR_HOME`` and node config), ``logs/``.

    Parameters
    ----------
    root : Path
        The folder for all of the above.
    connection : str, optional
        The CLI connection's name.
    node_auth : bool, optional
        SuperNode authentication (must be False with ``simulation``).
    tls : bool, optional
        False starts the SuperLink with ``--insecure`` (still bound to 127.0.0.1 only).
    simulation : bool, optional
        Add ``--simulation`` (Flower's Simulation Engine: no SuperNodes, no node authentication).
    superlink_args : sequence of str, optional
        Further flags for ``flower-superlink``.
    superlink_env : Mapping, optional
        Further environment variables for it.
    grace_s : float, optional
        Seconds between SIGTERM and SIGKILL when stopping.
    echo : callable, optional
        Called with a line for each event worth showing.

    Examples
    --------
    >>> FlowerCluster(Path("runs/x"), simulation=True)
    Traceback (most recent call last):
        ...
    ValueError: node_auth must be False with simulation=True: a simulation has no SuperNodes to admit.

    A deployment with two authenticated SuperNodes (it starts Flower's processes):

    >>> with FlowerCluster(Path("runs/deploy")) as cluster:  # doctest: +SKIP
    ...     keys = [cluster.new_key(f"node-{i}") for i in range(2)]
    ...     for private, public in keys:
    ...         cluster.register(public)
    ...     nodes = [cluster.start_supernode(f"node-{i}", private_key=k[0]) for i, k in enumerate(keys)]
    ...     cluster.wait_online(nodes)
    ...     result = cluster.run_app(Path("fedfilter/app"))
    """

    def __init__(
        self,
        root: Path,
        *,
        connection: str = CONNECTION,
        node_auth: bool = True,
        tls: bool = True,
        simulation: bool = False,
        superlink_args: Sequence[str] = (),
        superlink_env: Mapping[str, str] | None = None,
        grace_s: float = 10.0,
        echo: Callable[[str], None] | None = None,
    ):
        if simulation and node_auth:
            raise ValueError("node_auth must be False with simulation=True: a simulation has no SuperNodes to admit.")
        self.root = Path(root).resolve()
        self.connection, self.node_auth, self.grace_s = connection, node_auth, grace_s
        self.use_tls, self.simulation, self.superlink_args = tls, simulation, list(superlink_args)
        self.superlink_env = dict(superlink_env or {})
        self.echo = echo or (lambda line: None)
        self.tls_dir, self.home = self.root / "tls", self.root / "flwr-home"
        self.keys_dir, self.logs_dir = self.root / "keys", self.root / "logs"
        self.tls: TlsFiles | None = None
        self.port: int | None = None
        self.superlink: ManagedProcess | None = None
        self.supernodes: list[SuperNodeHandle] = []
        self._processes: list[ManagedProcess] = []

    @property
    def address(self) -> str:
        """The SuperLink's Control API address, ``127.0.0.1:PORT``.

        Returns
        -------
        str
            The address.

        Raises
        ------
        RuntimeError
            The SuperLink was not started.

        Examples
        --------
        >>> FlowerCluster(Path("runs/x")).address
        Traceback (most recent call last):
            ...
        RuntimeError: the SuperLink was not started
        """
        if self.port is None:
            raise RuntimeError("the SuperLink was not started")
        return f"{LOOPBACK}:{self.port}"

    # lifecycle ---------------------------------------------------------------------------------
    def __enter__(self) -> FlowerCluster:
        try:
            self.start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _track(self, process: ManagedProcess) -> ManagedProcess:
        self._processes.append(process)
        return process.start()

    def start(self, timeout: float = 60.0) -> None:
        """Certificates (with TLS), the SuperLink (ready when it listens) and the CLI connection.

        Entering the context calls it (and ``close`` if it fails).

        Parameters
        ----------
        timeout : float, optional
            Seconds the SuperLink has to get ready.

        Raises
        ------
        DeploymentError
            The SuperLink exited or was not ready in time.

        Examples
        --------
        >>> cluster = FlowerCluster(Path("runs/deploy"))
        >>> cluster.start(timeout=60)  # doctest: +SKIP
        >>> cluster.close()
        """
        self.home.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        argv = [tool("flower-superlink")]
        if self.use_tls:
            self.tls = make_tls(self.tls_dir)
            argv += [
                "--ssl-ca-certfile",
                str(self.tls.ca_cert),
                "--ssl-certfile",
                str(self.tls.server_cert),
                "--ssl-keyfile",
                str(self.tls.server_key),
            ]
        else:
            argv.append("--insecure")
        argv += ["--disable-runtime-dependency-installation", "--host", LOOPBACK, "--port", str(self.port)]
        if self.node_auth:
            argv.append("--enable-supernode-auth")
        if self.simulation:
            argv.append("--simulation")
        argv += self.superlink_args
        self.superlink = self._track(
            ManagedProcess(
                "flower-superlink",
                argv,
                log_path=self.logs_dir / "superlink.log",
                env=self.superlink_environment(),
                cwd=self.home,
            )
        )
        self.superlink.wait_for_log(_SUPERLINK_READY, timeout)
        self.write_connection()
        features = ["TLS" if self.use_tls else "no TLS"]
        features += ["SuperNode authentication"] if self.node_auth else []
        features += ["simulation"] if self.simulation else []
        self.echo(f"SuperLink listening on {self.address} ({', '.join(features)}); log {self.superlink.log_path}")

    def superlink_environment(self) -> dict[str, str]:
        """The SuperLink's environment: ``flower_env`` plus ``superlink_env``.

        In simulation it is what ``flwr-simulation`` and its Ray workers inherit.

        Returns
        -------
        dict of str to str
            The environment.

        Examples
        --------
        >>> cluster = FlowerCluster(Path("/tmp/c"), superlink_env={"X": "1"})
        >>> env = cluster.superlink_environment()
        >>> env["X"], env["FLWR_HOME"]
        ('1', '/tmp/c/flwr-home')
        """
        return {**flower_env(self.home), **self.superlink_env}

    def write_connection(self) -> Path:
        """``[superlink.NAME]`` in the CLI's ``FLWR_HOME/config.toml``, made the default.

        Returns
        -------
        Path
            The ``config.toml`` written.

        Examples
        --------
        ``start`` writes it once the SuperLink listens:

        >>> cluster.write_connection()  # doctest: +SKIP
        PosixPath('.../flwr-home/config.toml')
        """
        ca_cert = self.tls.ca_cert if self.tls is not None else None
        return write_connection(self.home, self.connection, self.address, root_certificates=ca_cert)

    def close(self) -> None:
        """Stop every process this cluster started, newest first (SIGTERM, then SIGKILL).

        One grace period in total: every process gets SIGTERM first. A second Ctrl-C does not stop the
        stopping of the others; it is raised at the end.

        Examples
        --------
        >>> FlowerCluster(Path("runs/x")).close()  # nothing started: nothing to stop
        """
        interrupted: BaseException | None = None

        def each(action: Callable[[ManagedProcess], Any]) -> None:
            nonlocal interrupted
            for process in reversed(self._processes):
                try:
                    action(process)
                except KeyboardInterrupt as err:  # a second Ctrl-C: keep stopping the others
                    interrupted = interrupted or err
                except Exception as err:
                    print(f"fedfilter: warning: stopping {process.name}: {err}", file=sys.stderr)

        each(ManagedProcess.terminate)  # SIGTERM to all first: one grace period in total
        deadline = time.monotonic() + self.grace_s
        each(lambda process: process.stop(deadline=deadline))
        if interrupted is not None:
            raise interrupted

    # the CLI -----------------------------------------------------------------------------------
    def flwr(self, *args: str, timeout: float = 60.0) -> subprocess.CompletedProcess:
        """One ``flwr`` CLI command against this cluster's connection (bounded by ``timeout``).

        Parameters
        ----------
        *args : str
            The command's arguments.
        timeout : float, optional
            Seconds it may take.

        Returns
        -------
        subprocess.CompletedProcess
            Its exit code and output.

        Raises
        ------
        DeploymentError
            It did not finish in time.

        Examples
        --------
        >>> with FlowerCluster(Path("runs/deploy")) as cluster:  # doctest: +SKIP
        ...     print(cluster.flwr("ls", cluster.connection).stdout)
        """
        try:
            return subprocess.run(
                [tool("flwr"), *args],
                env=flower_env(self.home),
                cwd=self.home,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired:
            raise DeploymentError(f"`flwr {' '.join(args)}` did not finish within {timeout:.0f} s") from None

    def _flwr_json(self, *args: str, timeout: float = 60.0) -> dict:
        done = self.flwr(*args, "--format", "json", timeout=timeout)
        try:
            payload = json.loads(done.stdout[done.stdout.index("{") :])
        except ValueError:
            payload = {}
        if done.returncode != 0 or not payload.get("success", False):
            raise DeploymentError(
                f"`flwr {' '.join(args)}` failed (exit {done.returncode}): "
                f"{strip_ansi(done.stdout + done.stderr).strip()}"
            )
        return payload

    def new_key(self, name: str) -> tuple[Path, Path]:
        """A SuperNode key pair under ``keys/`` (``make_node_key``).

        Parameters
        ----------
        name : str
            The key's file name.

        Returns
        -------
        tuple of Path
            (private key, public key).

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     private, public = FlowerCluster(Path(d)).new_key("node-0")
        ...     public.name
        'node-0.pub'
        """
        return make_node_key(self.keys_dir / name)

    def register(self, public_key: Path) -> int:
        """``flwr supernode register KEY.pub CONNECTION``; the node id the SuperLink assigned.

        Parameters
        ----------
        public_key : Path
            The SuperNode's public key.

        Returns
        -------
        int
            The node id.

        Examples
        --------
        >>> node_id = cluster.register(cluster.new_key("node-0")[1])  # doctest: +SKIP
        """
        payload = self._flwr_json("supernode", "register", str(public_key), self.connection)
        return int(payload["node-id"])

    def start_supernode(
        self,
        name: str,
        *,
        private_key: Path | None,
        node_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        owner_state_dir: Path | None = None,
        device_args: Sequence[str] = (),
        device_runtime: bool = True,
    ) -> SuperNodeHandle:
        """A SuperNode with its own ``FLWR_HOME`` and Runtime API port.

        With ``owner_state_dir`` it is the device owner's command, ``fedfilter supernode`` (Flower's
        SuperNode plus the device's runtime: only the apps approved in that state directory run, inside
        the device's filter; ``device_args`` are its own flags, e.g. ``--secure-aggregation``); without,
        or with ``device_runtime=False``, Flower's plain ``flower-supernode`` (which still runs with
        that state directory, where the device's roll-back anchor is). ``node_config`` is written to
        ``supernodes/<name>/node-config.toml`` and passed as ``--node-config FILE`` (no quoting
        pitfalls for paths). Does not wait: see ``wait_online``.

        Parameters
        ----------
        name : str
            The SuperNode's name.
        private_key : Path or None
            Its authentication key (None without node authentication).
        node_config : Mapping, optional
            Its node config.
        extra_args : sequence of str, optional
            Further flags for the SuperNode.
        owner_state_dir : Path, optional
            The device owner's state directory.
        device_args : sequence of str, optional
            ``fedfilter supernode``'s own flags.
        device_runtime : bool, optional
            Start ``fedfilter supernode`` (with ``owner_state_dir``) rather than ``flower-supernode``.

        Returns
        -------
        SuperNodeHandle
            The started SuperNode.

        Raises
        ------
        DeploymentError
            On a simulation SuperLink.

        Examples
        --------
        >>> node = cluster.start_supernode("node-0", private_key=key, node_config={"partition-id": 0})  # doctest: +SKIP
        >>> cluster.wait_online([node])  # doctest: +SKIP
        """
        if self.simulation:
            raise DeploymentError("a simulation SuperLink runs its own simulated nodes: start no SuperNode")
        home = self.root / "supernodes" / name
        home.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        env = flower_env(home / "flwr-home")
        if owner_state_dir is not None:
            env[STATE_DIR_ENV] = str(owner_state_dir)
        if owner_state_dir is not None and device_runtime:
            argv = [sys.executable, "-m", "fedfilter", "supernode", *device_args]
        else:
            argv = [tool("flower-supernode")]
        argv += ["--superlink", self.address]
        argv += ["--root-certificates", str(self.tls.ca_cert)] if self.tls is not None else ["--insecure"]
        argv += ["--host", LOOPBACK, "--port", str(port)]
        if private_key is not None:
            argv += ["--auth-supernode-private-key", str(private_key)]
        config = dict(node_config or {})
        if config:
            argv += ["--node-config", str(write_flat_toml(home / "node-config.toml", config))]
        argv += list(extra_args)
        process = self._track(
            ManagedProcess(
                f"flower-supernode {name}",
                argv,
                log_path=self.logs_dir / f"supernode-{name}.log",
                env=env,
                cwd=home,
            )
        )
        handle = SuperNodeHandle(name, process, home, node_config=config)
        self.supernodes.append(handle)
        return handle

    def wait_online(self, handles: Sequence[SuperNodeHandle], timeout: float = 60.0) -> None:
        """Wait until every SuperNode has connected (its log names its node id); sets their ``node_id``.

        Parameters
        ----------
        handles : sequence of SuperNodeHandle
            The SuperNodes.
        timeout : float, optional
            Seconds for all of them together.

        Raises
        ------
        DeploymentError
            A SuperNode exited or did not connect in time.

        Examples
        --------
        >>> cluster.wait_online(cluster.supernodes, timeout=60)  # doctest: +SKIP
        """
        deadline = time.monotonic() + timeout
        for handle in handles:
            match = handle.process.wait_for_log(_SUPERNODE_ONLINE, max(0.0, deadline - time.monotonic()))
            handle.node_id = int(match.group(1))

    # runs --------------------------------------------------------------------------------------
    def run_status(self, run_id: int) -> tuple[str, str]:
        """A run's status and status details, as the SuperLink reports them (``flwr ls --run-id``).

        Parameters
        ----------
        run_id : int
            The run.

        Returns
        -------
        tuple of str
            (status, details); ``unknown`` for a run the SuperLink does not know.

        Examples
        --------
        >>> cluster.run_status(result.run_id)  # doctest: +SKIP
        ('finished:completed', '')
        """
        payload = self._flwr_json("ls", self.connection, "--run-id", str(run_id))
        runs = payload.get("runs", [])
        if not runs:
            return "unknown", f"run {run_id} not found"
        return str(runs[0].get("status", "unknown")), str(runs[0].get("status-details", ""))

    def run_app(
        self,
        app_dir: Path,
        *,
        run_config: Mapping[str, Any] | None = None,
        federation_config: Mapping[str, Any] | None = None,
        timeout: float = 600.0,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        """``flwr run APP_DIR CONNECTION --stream``, bounded by ``timeout`` seconds.

        The run's status comes from the SuperLink afterwards (``flwr ls --run-id``): ``flwr run``
        exits 0 even when the ServerApp raised. On timeout the run is stopped (``flwr stop``).
        ``run_config`` and ``federation_config`` (e.g. ``{"num-supernodes": 10}`` for a simulation
        SuperLink) are written to flat TOML files and passed as ``--run-config``/``--federation-config``.

        Parameters
        ----------
        app_dir : Path
            The Flower app directory.
        run_config : Mapping, optional
            ``--run-config`` overrides.
        federation_config : Mapping, optional
            ``--federation-config`` values.
        timeout : float, optional
            Seconds the run may take.
        on_line : callable, optional
            Sees every output line.
        on_tick : callable, optional
            Called about once a second.

        Returns
        -------
        RunResult
            The run's id, status and output.

        Examples
        --------
        >>> result = cluster.run_app(Path("fedfilter/app"), run_config={"num-rounds": 2}, timeout=300)  # doctest: +SKIP
        >>> result.ok  # doctest: +SKIP
        True
        """
        argv = [tool("flwr"), "run", str(Path(app_dir).resolve()), self.connection, "--stream"]
        if run_config:
            config_file = write_flat_toml(self.root / "run-config.toml", run_config)
            argv += ["--run-config", str(config_file)]
        if federation_config:
            federation_file = write_flat_toml(self.root / "federation-config.toml", federation_config)
            argv += ["--federation-config", str(federation_file)]
        log_path = self.logs_dir / "flwr-run.log"
        process = self._track(
            ManagedProcess("flwr run", argv, log_path=log_path, env=flower_env(self.home), cwd=self.home)
        )
        started = time.monotonic()
        lines_seen = 0
        run_id: int | None = None
        timed_out = False
        while True:
            code = process.wait(1.0)
            text = process.log_text()
            lines = text.splitlines()
            if code is None and not text.endswith("\n"):
                lines = lines[:-1]  # a line still being written: read it whole next time
            for line in lines[lines_seen:]:
                if run_id is None and (match := STARTED_RUN.search(line)):
                    run_id = int(match.group(1))
                if on_line:
                    on_line(line)
            lines_seen = len(lines)
            if on_tick:
                on_tick()
            if code is not None:
                break
            if time.monotonic() - started > timeout:
                timed_out = True
                break
        if timed_out and run_id is not None:
            try:
                self.flwr("stop", str(run_id), self.connection, timeout=30)
            except DeploymentError:
                pass  # the SuperLink is stopped with the cluster anyway
        process.stop(self.grace_s)
        duration = time.monotonic() - started
        output = process.log_text()
        if run_id is None:
            return RunResult(None, "not-started", tail(output), duration, output)
        if timed_out:
            return RunResult(run_id, "timeout", f"no result after {timeout:.0f} s", duration, output)
        status, details = self.run_status(run_id)
        return RunResult(run_id, status, details, duration, output)
