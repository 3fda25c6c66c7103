"""A real Flower Deployment Engine on this machine: SuperLink, SuperNodes, TLS and node keys.

``deploy_local`` runs the same ClientApp and ServerApp that a real federation runs, through the
same processes (``flower-superlink``, one ``flower-supernode`` per device, ``flwr run``), with
TLS and SuperNode authentication switched on, but every process bound to 127.0.0.1:

1. a throw-away certificate authority and a server certificate for 127.0.0.1 / localhost;
2. one ``flower-superlink`` with ``--enable-supernode-auth`` and its own ``FLWR_HOME``;
3. the connection written to that ``FLWR_HOME``'s ``config.toml`` (``[superlink.NAME]``);
4. one ECDSA P-384 key per SuperNode, each registered with ``flwr supernode register``;
5. one ``flower-supernode`` per device, whose ``--node-config`` names the device's own budget
   ledger directory (``OUT/devices/<i>``), client id and personal budget;
6. ``flwr run APP_DIR CONNECTION --stream``, bounded by a timeout;
7. every process torn down (SIGTERM to its process group, SIGKILL after a grace period), also on
   Ctrl-C, SIGTERM or failure; then ``OUT/summary.json`` from the devices' own ledgers and the
   coordinator's public ledger.

The process handling lives in two small context managers that the tests reuse:
``ManagedProcess`` (one process group, logged to a file, always stopped) and ``FlowerCluster``
(a SuperLink, its CLI connection, keys, SuperNodes and runs).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
CONNECTION = "fedfilter-local"
RUN_COMPLETED = "finished:completed"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_STARTED_RUN = re.compile(r"Successfully started run (\d+)")
_SUPERNODE_ONLINE = re.compile(r"SuperNode ID: (\d+)")
_SUPERLINK_READY = re.compile(r"Uvicorn running on https?://\S+")


class DeploymentError(RuntimeError):
    """A process of the local deployment did not start, connect or finish as expected."""


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


# --- processes -----------------------------------------------------------------------------------


class ManagedProcess:
    """One child process in its own process group, logged to a file, always stopped.

    The child is started in a new session, so a Ctrl-C at the terminal reaches only us and we
    decide how it ends. ``stop`` ends its process group and its descendants that left the group
    (``flower-superexec`` and the ``flwr-serverapp``/``flwr-clientapp`` processes it starts). The
    leader is reaped only in ``stop``: until then an exited leader stays a zombie, which keeps
    its process-group id from being reused, so the group can be signalled safely.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ):
        self.name, self.argv, self.log_path = name, list(argv), Path(log_path)
        self.env, self.cwd = dict(env) if env is not None else None, cwd
        self._popen: subprocess.Popen | None = None
        self._family: _Descendants | None = None
        self._log_offset = 0

    # lifecycle ---------------------------------------------------------------------------------
    def start(self) -> ManagedProcess:
        if self._popen is not None:
            raise RuntimeError(f"{self.name} was started already")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self._log_offset = log.tell()  # an earlier process's lines stay, but are not ours
            self._popen = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=self.cwd,
                start_new_session=True,
            )
        return self

    def __enter__(self) -> ManagedProcess:
        return self.start() if self._popen is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        if self._popen is None:
            raise RuntimeError(f"{self.name} was not started")
        return self._popen.pid

    def _exit_status(self) -> int | None:
        """The leader's exit code (negative: killed by that signal), without reaping it."""
        if self._popen is None:
            return None
        if self._popen.returncode is not None:
            return self._popen.returncode
        try:
            info = os.waitid(os.P_PID, self._popen.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped elsewhere
            return self._popen.poll()
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    @property
    def returncode(self) -> int | None:
        return self._exit_status()

    @property
    def running(self) -> bool:
        return self._popen is not None and self._exit_status() is None

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the leader to exit; its code, or None."""
        deadline = time.monotonic() + timeout
        while True:
            code = self._exit_status()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(0.1)

    def _signal_group(self, sig: int) -> None:
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def terminate(self) -> None:
        """SIGTERM the process and everything it started (first half of ``stop``).

        "Everything it started" is its process group plus its descendants in other sessions
        (``flower-superlink`` starts ``flower-superexec`` with ``start_new_session=True``, and
        that one starts ``flwr-serverapp``), followed through /proc.
        """
        if self._popen is None or self._family is not None or self._popen.returncode is not None:
            return  # not started, already terminated, or reaped (the group id may be reused)
        self._family = _Descendants(self.pid)
        self._signal_group(signal.SIGTERM)
        self._family.signal(signal.SIGTERM)

    def _gone(self) -> bool:
        if self._family is None:
            return self._exit_status() is not None
        self._family.refresh()
        return self._exit_status() is not None and not self._family.alive()

    def stop(self, grace_s: float = 10.0, *, deadline: float | None = None) -> int | None:
        """SIGTERM the process and everything it started, SIGKILL what is left after ``grace_s``
        seconds (or at the monotonic ``deadline``), and reap it. Safe to call more than once and
        on a process that has already exited.
        """
        if self._popen is None:
            return None
        if self._popen.returncode is not None:
            return self._popen.returncode
        self.terminate()
        deadline = time.monotonic() + grace_s if deadline is None else deadline
        try:
            while time.monotonic() < deadline and not self._gone():
                time.sleep(0.1)
        finally:  # also when a second Ctrl-C cuts the grace period short
            self._signal_group(signal.SIGKILL)  # stragglers, or a leader ignoring SIGTERM
            if self._family is not None:
                self._family.refresh()
                self._family.signal(signal.SIGKILL)
        return self._popen.wait()

    # logs --------------------------------------------------------------------------------------
    def log_text(self) -> str:
        """What this process has written to its log (ANSI colours removed)."""
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return strip_ansi(log.read().decode("utf-8", errors="replace"))
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: re.Pattern | str, timeout: float) -> re.Match:
        """Wait until the log matches ``pattern``; ``DeploymentError`` on exit or timeout."""
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            match = regex.search(self.log_text())
            if match:
                return match
            code = self.returncode
            if code is not None:
                raise DeploymentError(
                    f"{self.name} exited with code {code} before it was ready; "
                    f"last log lines ({self.log_path}):\n{tail(self.log_text())}"
                )
            if time.monotonic() >= deadline:
                raise DeploymentError(
                    f"{self.name} was not ready after {timeout:.0f} s; "
                    f"last log lines ({self.log_path}):\n{tail(self.log_text())}"
                )
            time.sleep(0.2)


class _Descendants:
    """The live descendants of one process, followed through /proc (Linux), even after they
    have been re-parented: each is identified by (pid, start time), so a reused pid is never
    signalled.
    """

    def __init__(self, root_pid: int):
        self.root = root_pid
        self.known: dict[int, str] = {}  # pid -> start time
        self.refresh()

    @staticmethod
    def _table() -> dict[int, tuple[int, str, str]]:
        table = {}
        for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="utf-8", errors="replace") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            # after the command: state, ppid, ... field 22 of stat (index 19 here) is starttime
            table[int(entry)] = (int(fields[1]), fields[19], fields[0])
        return table

    def refresh(self) -> None:
        table = self._table()
        parents = {self.root} | {pid for pid, start in self.known.items() if pid in table and table[pid][1] == start}
        grew = True
        while grew:
            grew = False
            for pid, (ppid, start, _state) in table.items():
                if ppid in parents and pid not in parents and pid not in self.known:
                    self.known[pid] = start
                    parents.add(pid)
                    grew = True

    def _live(self) -> list[int]:
        table = self._table()
        return [
            pid for pid, start in self.known.items() if pid in table and table[pid][1] == start and table[pid][2] != "Z"
        ]

    def alive(self) -> bool:
        return bool(self._live())

    def signal(self, sig: int) -> None:
        for pid in self._live():
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while picking)."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((LOOPBACK, 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


# --- certificates and keys -----------------------------------------------------------------------


@dataclass(frozen=True)
class TlsFiles:
    ca_cert: Path
    server_cert: Path
    server_key: Path


def _write_private(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def make_tls(directory: Path, *, days: int = 7) -> TlsFiles:
    """A fresh CA (``ca.crt``) and a server certificate for IP:127.0.0.1 and DNS:localhost.

    The CA's private key is never written: nothing else can be signed with it later.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)

    ca_key = ec.generate_private_key(ec.SECP384R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fedfilter local CA")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    server_key = ec.generate_private_key(ec.SECP384R1())
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(LOOPBACK)), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA384())
    )

    files = TlsFiles(directory / "ca.crt", directory / "server.pem", directory / "server.key")
    files.ca_cert.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    files.server_cert.write_bytes(server_cert.public_bytes(serialization.Encoding.PEM))
    _write_private(
        files.server_key,
        server_key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return files


def make_node_key(private_path: Path) -> tuple[Path, Path]:
    """An ECDSA P-384 key pair in OpenSSH format (as ``ssh-keygen -t ecdsa -b 384 -N ""``).

    Returns (private key, public key ``<private>.pub``).
    """
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    private_path = Path(private_path)
    key = ec.generate_private_key(ec.SECP384R1())
    _write_private(
        private_path,
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
        ),
    )
    public_path = private_path.with_name(private_path.name + ".pub")
    public_path.write_bytes(
        key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH) + b"\n"
    )
    return private_path, public_path


# --- TOML for Flower's config files ---------------------------------------------------------------


def toml_value(value: Any) -> str:
    """One TOML value for a flat Flower config (bool, int, float or str)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a valid TOML basic string
    raise ValueError(f"config values must be bool, int, float or str. Found {value!r}.")


def write_flat_toml(path: Path, values: Mapping[str, Any]) -> Path:
    """A flat ``key = value`` TOML file (what ``--node-config``/``--run-config FILE.toml`` read)."""
    lines = [f"{json.dumps(key)} = {toml_value(val)}" for key, val in values.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def app_run_config(app_dir: Path) -> dict[str, Any]:
    """The app's ``[tool.flwr.app.config]`` defaults (the keys ``--run-config`` may override)."""
    pyproject = Path(app_dir) / "pyproject.toml"
    if not pyproject.is_file():
        raise ValueError(f"{pyproject} not found: APP_DIR must be a Flower app directory.")
    with pyproject.open("rb") as handle:
        data = tomllib.load(handle)
    try:
        app = data["tool"]["flwr"]["app"]
    except KeyError:
        raise ValueError(f"{pyproject} has no [tool.flwr.app] section: not a Flower app.") from None
    return _flatten(app.get("config", {}))


def _flatten(values: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}.{key}" if prefix else key
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


# --- the cluster ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    run_id: int | None
    status: str  # Flower's, e.g. "finished:completed", or "timeout" / "not-started"
    details: str
    duration_s: float
    output: str = ""

    @property
    def ok(self) -> bool:
        return self.status == RUN_COMPLETED


@dataclass
class SuperNodeHandle:
    name: str
    process: ManagedProcess
    home: Path
    node_id: int | None = None
    node_config: dict[str, Any] = field(default_factory=dict)


class FlowerCluster:
    """A SuperLink on 127.0.0.1 with TLS and SuperNode authentication, its CLI connection,
    and the SuperNodes started through it; everything stops when the context exits.

    Layout under ``root``: ``tls/`` (CA and server certificate), ``flwr-home/`` (the SuperLink's
    and the CLI's ``FLWR_HOME``, with ``config.toml``), ``keys/`` (SuperNode keys),
    ``supernodes/<name>/`` (each SuperNode's ``FLWR_HOME`` and node config), ``logs/``.
    """

    def __init__(
        self,
        root: Path,
        *,
        connection: str = CONNECTION,
        node_auth: bool = True,
        grace_s: float = 10.0,
        echo: Callable[[str], None] | None = None,
    ):
        self.root = Path(root).resolve()
        self.connection, self.node_auth, self.grace_s = connection, node_auth, grace_s
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

    def _env(self, home: Path) -> dict[str, str]:
        env = dict(os.environ)
        # Flower's processes start their helpers (flower-superexec, flwr-serverapp, flwr-clientapp)
        # by name: put this interpreter's scripts first on PATH, so a venv works unactivated
        # (as under `make test`, which calls .venv/bin/python directly).
        env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
        env["FLWR_HOME"] = str(home)
        env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def _track(self, process: ManagedProcess) -> ManagedProcess:
        self._processes.append(process)
        return process.start()

    def start(self, timeout: float = 60.0) -> None:
        """Certificates, the SuperLink (ready when it listens) and the CLI connection."""
        self.tls = make_tls(self.tls_dir)
        self.home.mkdir(parents=True, exist_ok=True)
        (self.port,) = free_ports(1)
        argv = [
            _tool("flower-superlink"),
            "--ssl-ca-certfile",
            str(self.tls.ca_cert),
            "--ssl-certfile",
            str(self.tls.server_cert),
            "--ssl-keyfile",
            str(self.tls.server_key),
            "--disable-runtime-dependency-installation",
            "--host",
            LOOPBACK,
            "--port",
            str(self.port),
        ]
        if self.node_auth:
            argv.append("--enable-supernode-auth")
        self.superlink = self._track(
            ManagedProcess(
                "flower-superlink",
                argv,
                log_path=self.logs_dir / "superlink.log",
                env=self._env(self.home),
                cwd=self.home,
            )
        )
        self.superlink.wait_for_log(_SUPERLINK_READY, timeout)
        self.write_connection()
        self.echo(
            f"SuperLink listening on {self.address} (TLS"
            f"{', SuperNode authentication' if self.node_auth else ''}); "
            f"log {self.superlink.log_path}"
        )

    def write_connection(self) -> Path:
        """``[superlink.NAME]`` in the CLI's ``FLWR_HOME/config.toml``, made the default."""
        assert self.tls is not None
        config = self.home / "config.toml"
        config.write_text(
            "[superlink]\n"
            f"default = {toml_value(self.connection)}\n\n"
            f"[superlink.{self.connection}]\n"
            f"address = {toml_value(self.address)}\n"
            f"root-certificates = {toml_value(str(self.tls.ca_cert))}\n",
            encoding="utf-8",
        )
        return config

    def close(self) -> None:
        """Stop every process this cluster started, newest first (SIGTERM, then SIGKILL)."""
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
        """One ``flwr`` CLI command against this cluster's connection (bounded by ``timeout``)."""
        try:
            return subprocess.run(
                [_tool("flwr"), *args],
                env=self._env(self.home),
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
        return make_node_key(self.keys_dir / name)

    def register(self, public_key: Path) -> int:
        """``flwr supernode register KEY.pub CONNECTION``; the node id the SuperLink assigned."""
        payload = self._flwr_json("supernode", "register", str(public_key), self.connection)
        return int(payload["node-id"])

    def list_supernodes(self) -> list[dict]:
        return self._flwr_json("supernode", "list", self.connection).get("nodes", [])

    def start_supernode(
        self,
        name: str,
        *,
        private_key: Path | None,
        node_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
    ) -> SuperNodeHandle:
        """A ``flower-supernode`` with its own ``FLWR_HOME`` and Runtime API port.

        ``node_config`` is written to ``supernodes/<name>/node-config.toml`` and passed as
        ``--node-config FILE`` (no quoting pitfalls for paths). Does not wait: see
        ``wait_online``.
        """
        assert self.tls is not None
        home = self.root / "supernodes" / name
        home.mkdir(parents=True, exist_ok=True)
        (port,) = free_ports(1)
        argv = [
            _tool("flower-supernode"),
            "--superlink",
            self.address,
            "--root-certificates",
            str(self.tls.ca_cert),
            "--host",
            LOOPBACK,
            "--port",
            str(port),
        ]
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
                env=self._env(home / "flwr-home"),
                cwd=home,
            )
        )
        handle = SuperNodeHandle(name, process, home, node_config=config)
        self.supernodes.append(handle)
        return handle

    def wait_online(self, handles: Sequence[SuperNodeHandle], timeout: float = 60.0) -> None:
        """Wait until every SuperNode has connected (its log names its node id)."""
        deadline = time.monotonic() + timeout
        for handle in handles:
            match = handle.process.wait_for_log(_SUPERNODE_ONLINE, max(0.0, deadline - time.monotonic()))
            handle.node_id = int(match.group(1))

    # runs --------------------------------------------------------------------------------------
    def run_status(self, run_id: int) -> tuple[str, str]:
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
        timeout: float = 600.0,
        on_line: Callable[[str], None] | None = None,
        on_tick: Callable[[], None] | None = None,
    ) -> RunResult:
        """``flwr run APP_DIR CONNECTION --stream``, bounded by ``timeout`` seconds.

        The run's status comes from the SuperLink afterwards (``flwr ls --run-id``): ``flwr run``
        exits 0 even when the ServerApp raised. On timeout the run is stopped (``flwr stop``).
        ``on_line`` sees every output line, ``on_tick`` is called about once a second.
        """
        argv = [_tool("flwr"), "run", str(Path(app_dir).resolve()), self.connection, "--stream"]
        if run_config:
            config_file = write_flat_toml(self.root / "run-config.toml", run_config)
            argv += ["--run-config", str(config_file)]
        log_path = self.logs_dir / "flwr-run.log"
        process = self._track(
            ManagedProcess("flwr run", argv, log_path=log_path, env=self._env(self.home), cwd=self.home)
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
                if run_id is None and (match := _STARTED_RUN.search(line)):
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


def _tool(name: str) -> str:
    """The console script next to this interpreter (the venv's), else the one on PATH."""
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


# --- the deployment ------------------------------------------------------------------------------

AFTER_EXHAUSTION = ("noise-only", "leave")
# The built-in Flower app directory (fedfilter/app: its pyproject.toml and components).
BUILTIN_APP_DIR = Path(__file__).resolve().parent / "app"


@dataclass
class DeployOptions:
    clients: int
    rounds: int = 2
    out: Path = Path("out/deploy")
    app_dir: Path = BUILTIN_APP_DIR
    budgets: tuple[float, ...] = (1.0, 2.0, 4.0)  # cycled over the devices
    delta: float = 1e-5
    filter_kind: str = "gdp"
    after_exhaustion: str = "noise-only"
    min_noise_multiplier: float | None = None
    data_dir: Path | None = None  # root of the offline data sets on every device
    run_config: dict[str, Any] = field(default_factory=dict)  # extra --run-config overrides
    # Every device's reply-hold-s, set explicitly: 0 (timing protection off) keeps a local trial
    # fast; real devices default to client.reply_timing.DEFAULT_REPLY_HOLD_S. The output says which.
    reply_hold_s: float = 0.0
    timeout_s: float = 600.0
    connect_timeout_s: float = 60.0
    grace_s: float = 10.0
    verbose: bool = False

    def check(self) -> None:
        problems = []
        if isinstance(self.clients, bool) or not isinstance(self.clients, int) or self.clients < 1:
            problems.append(f"--clients must be an integer >= 1. Found {self.clients!r}.")
        if isinstance(self.rounds, bool) or not isinstance(self.rounds, int) or self.rounds < 1:
            problems.append(f"--rounds must be an integer >= 1. Found {self.rounds!r}.")
        if not self.budgets or not all(math.isfinite(b) and b > 0 for b in self.budgets):
            problems.append(f"--budgets must be finite epsilons > 0. Found {self.budgets!r}.")
        from fedfilter.client.privacy.filters import FILTER_KINDS

        if self.filter_kind not in FILTER_KINDS:
            problems.append(f"--filter must be one of {', '.join(FILTER_KINDS)}. Found {self.filter_kind!r}.")
        if not 0 < self.delta < 1:
            problems.append(f"--delta must be in (0, 1). Found {self.delta!r}.")
        if self.after_exhaustion not in AFTER_EXHAUSTION:
            problems.append(
                f"--after-exhaustion must be one of {', '.join(AFTER_EXHAUSTION)}. Found {self.after_exhaustion!r}."
            )
        if self.min_noise_multiplier is not None and not (
            math.isfinite(self.min_noise_multiplier) and self.min_noise_multiplier > 0
        ):
            problems.append(f"--min-noise-multiplier must be a finite number > 0. Found {self.min_noise_multiplier!r}.")
        from fedfilter.client.reply_timing import MAX_REPLY_HOLD_S

        if not (math.isfinite(self.reply_hold_s) and 0 <= self.reply_hold_s <= MAX_REPLY_HOLD_S):
            problems.append(
                f"--reply-hold-s must be in [0, {MAX_REPLY_HOLD_S:g}] seconds. Found {self.reply_hold_s!r}."
            )
        for name in ("timeout_s", "connect_timeout_s", "grace_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                problems.append(f"{name} must be a finite number > 0. Found {value!r}.")
        if problems:
            raise ValueError(" ".join(problems))


def device_node_config(index: int, options: DeployOptions, ledger_dir: Path) -> dict[str, Any]:
    """The ``--node-config`` of device ``index``: where its ledger lives and its own budget."""
    config: dict[str, Any] = {
        "ledger-dir": str(ledger_dir),
        "client-id": f"device-{index}",
        "budget-epsilon": float(options.budgets[index % len(options.budgets)]),
        "budget-delta": float(options.delta),
        "filter": options.filter_kind,
        "after-exhaustion": options.after_exhaustion,
        "partition-id": index,
        "num-partitions": options.clients,
        "reply-hold-s": float(options.reply_hold_s),
    }
    if options.min_noise_multiplier is not None:
        config["min-noise-multiplier"] = float(options.min_noise_multiplier)
    if options.data_dir is not None:
        config["data-dir"] = str(Path(options.data_dir).resolve())
    return config


# Run-config keys this command fills in, when the app declares them ([tool.flwr.app.config]).
ROUNDS_KEYS = ("num-rounds", "num-server-rounds")
PUBLIC_LEDGER_KEYS = ("public-ledger",)
MIN_NODES_KEY = "min-available-nodes"
PUBLIC_LEDGER_FILE = "public_ledger.sqlite"


def build_run_config(app_config: Mapping[str, Any], options: DeployOptions, public_ledger: Path) -> dict[str, Any]:
    """The ``--run-config`` overrides: rounds, the public ledger's path, the user's extras.

    Flower refuses override keys the app does not declare, so every key is checked here first.
    """
    overrides: dict[str, Any] = {}
    rounds_key = next((k for k in ROUNDS_KEYS if k in app_config), None)
    if rounds_key is None:
        raise ValueError(
            f"the app declares none of {', '.join(ROUNDS_KEYS)} in "
            "[tool.flwr.app.config]: cannot set the number of rounds."
        )
    overrides[rounds_key] = options.rounds
    ledger_key = next((k for k in PUBLIC_LEDGER_KEYS if k in app_config), None)
    if ledger_key is not None:
        overrides[ledger_key] = str(public_ledger)
    if MIN_NODES_KEY in app_config:  # the coordinator waits for every device before round 1
        overrides[MIN_NODES_KEY] = options.clients
    unknown = sorted(set(options.run_config) - set(app_config))
    if unknown:
        raise ValueError(
            f"--run-config keys {', '.join(unknown)} are not declared in the app's "
            f"[tool.flwr.app.config] (declared: {', '.join(sorted(app_config))})."
        )
    overrides.update(options.run_config)
    return overrides


def public_run_ids(path: Path) -> list[str]:
    """The run ids in a public ledger, oldest first (none if the file does not exist)."""
    if not path.is_file():
        return []
    from fedfilter.coordinator.public_ledger import PublicLedger

    with PublicLedger(path, read_only=True) as ledger:
        return [run.run_id for run in ledger.runs()]


class LedgerProgress:
    """Prints each new round of the coordinator's public ledger (read-only, polled), skipping
    the runs of earlier invocations (``old_runs``)."""

    def __init__(self, path: Path, echo: Callable[[str], None], old_runs: Sequence[str] = ()):
        self.path, self.echo, self.old_runs = path, echo, set(old_runs)
        self.shown: set[tuple[str, int]] = set()

    def tick(self) -> None:
        if not self.path.is_file():
            return
        from fedfilter.cmd_reports import format_record
        from fedfilter.coordinator.public_ledger import PublicLedger

        try:
            with PublicLedger(self.path, read_only=True) as ledger:
                for run in ledger.runs():
                    if run.run_id in self.old_runs:
                        continue
                    for record in ledger.records(run.run_id):
                        key = (record.run_id, int(record.round_id))
                        if key not in self.shown:
                            self.shown.add(key)
                            self.echo(format_record(record))
        except Exception:  # a ledger still being created: try again on the next tick
            pass


def public_summary(path: Path, old_runs: Sequence[str] = ()) -> dict[str, Any]:
    """Run id, rounds and final accuracy of the newest run in the coordinator's public ledger
    that is not one of ``old_runs`` (the runs of earlier invocations)."""
    new_runs = [run for run in public_run_ids(path) if run not in set(old_runs)]
    if not new_runs:
        return {"run_id": None, "rounds_completed": 0, "final_accuracy": None}
    from fedfilter.coordinator.public_ledger import PublicLedger

    run_id = new_runs[-1]
    with PublicLedger(path, read_only=True) as ledger:
        records = ledger.records(run_id)
    accuracy = [float(r.metrics["accuracy"]) for r in records if "accuracy" in r.metrics]
    return {"run_id": run_id, "rounds_completed": len(records), "final_accuracy": accuracy[-1] if accuracy else None}


def deploy_local(options: DeployOptions, echo: Callable[[str], None] = print) -> int:
    """Run the app on a local Deployment Engine; write ``OUT/summary.json``; 0 on success.

    Every process is stopped before this returns, whatever happened (Ctrl-C included).
    """
    from fedfilter.client.flower_mod import enrol_device
    from fedfilter.client.ledger import LEDGER_FILE
    from fedfilter.client.reply_timing import timing_protection
    from fedfilter.cmd_demo import device_report

    options.check()
    app_dir = Path(options.app_dir).resolve()
    app_config = app_run_config(app_dir)
    out = Path(options.out).resolve()
    public_ledger = out / PUBLIC_LEDGER_FILE
    run_config = build_run_config(app_config, options, public_ledger)
    out.mkdir(parents=True, exist_ok=True)
    devices_dir = out / "devices"
    # Each device's owner enrols it once, before its SuperNode starts: the mod never enrols, so a
    # lost ledger fails closed instead of starting over.
    for index in range(options.clients):
        enrol_device(device_node_config(index, options, devices_dir / str(index)))
    started = time.monotonic()
    result: RunResult | None = None
    error: str | None = None

    def show(line: str) -> None:
        echo(f"[{time.monotonic() - started:6.1f} s] {line}")

    old_runs = public_run_ids(public_ledger)  # a reused OUT keeps earlier runs
    progress = LedgerProgress(public_ledger, show, old_runs)
    timing = timing_protection(options.reply_hold_s)
    show(f"timing protection: {timing}")
    try:
        with FlowerCluster(out, grace_s=options.grace_s, echo=show) as cluster:
            handles = []
            for index in range(options.clients):
                name = f"device-{index}"
                private_key, public_key = cluster.new_key(name)
                node_id = cluster.register(public_key)
                ledger_dir = devices_dir / str(index)
                ledger_dir.mkdir(parents=True, exist_ok=True)
                config = device_node_config(index, options, ledger_dir)
                handles.append(cluster.start_supernode(name, private_key=private_key, node_config=config))
                show(
                    f"{name}: key registered (node {node_id}), budget epsilon "
                    f"{config['budget-epsilon']:g}, ledger {ledger_dir}"
                )
            cluster.wait_online(handles, options.connect_timeout_s)
            show(
                f"{len(handles)} SuperNodes connected; submitting `flwr run {app_dir} "
                f"{cluster.connection} --stream` ({options.rounds} rounds)"
            )

            def on_line(line: str) -> None:
                if options.verbose or "ERROR" in line or _STARTED_RUN.search(line):
                    show(f"flwr run | {line}")

            result = cluster.run_app(
                app_dir, run_config=run_config, timeout=options.timeout_s, on_line=on_line, on_tick=progress.tick
            )
            progress.tick()
            show(
                f"run {result.run_id}: {result.status} after {result.duration_s:.1f} s"
                + (f" ({result.details})" if result.details not in ("", "N/A") else "")
            )
    except KeyboardInterrupt:
        error = "interrupted"
        show("interrupted: every process was stopped")
    except DeploymentError as err:
        error = str(err)
        show(f"deployment failed: {err}")
    # Leaving the cluster's context stopped every process, on every path above.

    # What the device owners read from their own ledgers (the same report as `fedfilter demo`).
    public = public_summary(public_ledger, old_runs)
    clients = [
        device_report(devices_dir / str(i), public["run_id"])
        for i in range(options.clients)
        if (devices_dir / str(i) / LEDGER_FILE).is_file()
    ]
    summary = {
        "engine": "deployment",
        "run_id": public["run_id"],
        "flower_run_id": result.run_id if result else None,
        "status": result.status if result else ("interrupted" if error == "interrupted" else "failed"),
        "error": error if error != "interrupted" else None,
        "rounds_completed": public["rounds_completed"],
        "public_ledger": str(public_ledger),
        "clients": clients,
        "final_accuracy": public["final_accuracy"],
        "settings": {
            "clients": options.clients,
            "rounds": options.rounds,
            "app_dir": str(app_dir),
            "budgets": list(options.budgets),
            "delta": options.delta,
            "filter": options.filter_kind,
            "after_exhaustion": options.after_exhaustion,
            "min_noise_multiplier": options.min_noise_multiplier,
            "run_config": run_config,
            "tls": True,
            "supernode_auth": True,
            "reply_hold_s": options.reply_hold_s,
        },
        "timing_protection": timing,
        "wall_time_s": round(time.monotonic() - started, 1),
        "logs": str(out / "logs"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    show(f"summary written to {out / 'summary.json'}")
    for client in summary["clients"]:
        show(
            f"{client['client_id']}: spent epsilon {client['spent_epsilon']:.4g} of "
            f"{client['budget_epsilon']:g}"
            + (f", exhausted in round {client['exhausted_round']}" if client["exhausted_round"] is not None else "")
        )
    if error == "interrupted":
        return 130
    return 0 if result is not None and result.ok else 1
