"""Child processes of a local Flower deployment: started, logged, watched and always stopped.

``ManagedProcess`` runs one process in its own process group, logs it to a file and, when
stopped, ends that group and every descendant that left it (``flower-superexec`` and the
``flwr-serverapp``/``flwr-clientapp`` processes it starts). ``free_ports`` picks 127.0.0.1 ports,
``tool`` finds Flower's console scripts next to this interpreter, and ``flower_env`` is the
environment every Flower process gets (its own ``FLWR_HOME``).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

LOOPBACK = "127.0.0.1"

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class DeploymentError(RuntimeError):
    """A process of the local deployment did not start, connect or finish as expected.

    Examples
    --------
    >>> issubclass(DeploymentError, RuntimeError)
    True
    """


def strip_ansi(text: str) -> str:
    r"""Remove ANSI colour and cursor codes from ``text``.

    Parameters
    ----------
    text : str
        A log's text.

    Returns
    -------
    str
        The text without escape codes.

    Examples
    --------
    >>> strip_ansi("\x1b[32mINFO\x1b[0m : ready")
    'INFO : ready'
    """
    return _ANSI.sub("", text)


class ManagedProcess:
    """One child process in its own process group, logged to a file, always stopped.

    The child is started in a new session, so a Ctrl-C at the terminal reaches only us and we
    decide how it ends. ``stop`` ends its process group and its descendants that left the group
    (``flower-superexec`` and the ``flwr-serverapp``/``flwr-clientapp`` processes it starts). The
    leader is reaped only in ``stop``: until then an exited leader stays a zombie, which keeps
    its process-group id from being reused, so the group can be signalled safely.

    Parameters
    ----------
    name : str
        The process's name in messages.
    argv : sequence of str
        The command line.
    log_path : Path
        The file its stdout and stderr are appended to.
    env : Mapping, optional
        Its environment (default: ours).
    cwd : Path, optional
        Its working directory.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     with ManagedProcess("shell", ["sh", "-c", "echo ready; sleep 30"], log_path=Path(d) / "sh.log") as proc:
    ...         proc.wait_for_log("ready", timeout=10).group(0), proc.running
    ('ready', True)
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
        """Start the process (once), its output appended to ``log_path``.

        Returns
        -------
        ManagedProcess
            ``self``.

        Raises
        ------
        RuntimeError
            It was started already.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     proc = ManagedProcess("true", ["true"], log_path=Path(d) / "true.log").start()
        ...     proc.wait(timeout=10), proc.stop()
        (0, 0)
        """
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
        """The leader's process id (the process group's id).

        Returns
        -------
        int
            The pid.

        Raises
        ------
        RuntimeError
            It was not started.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with ManagedProcess("true", ["true"], log_path=Path(d) / "true.log") as proc:
        ...         proc.pid > 0
        True
        """
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
        """The leader's exit code (negative: killed by that signal), None while it runs or before it starts.

        Returns
        -------
        int or None
            The exit code.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with ManagedProcess("false", ["false"], log_path=Path(d) / "false.log") as proc:
        ...         _ = proc.wait(timeout=10)
        ...         proc.returncode
        1
        """
        return self._exit_status()

    @property
    def running(self) -> bool:
        """Whether it was started and its leader has not exited.

        Returns
        -------
        bool
            True while it runs.

        Examples
        --------
        >>> ManagedProcess("idle", ["true"], log_path=Path("never.log")).running  # not started
        False
        """
        return self._popen is not None and self._exit_status() is None

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the leader to exit; its code, or None.

        Parameters
        ----------
        timeout : float
            Seconds to wait.

        Returns
        -------
        int or None
            The exit code, or None if it still runs (it is not reaped: see ``stop``).

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with ManagedProcess("sleep", ["sleep", "30"], log_path=Path(d) / "sleep.log") as proc:
        ...         proc.wait(timeout=0.2) is None
        True
        """
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

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     proc = ManagedProcess("sleep", ["sleep", "30"], log_path=Path(d) / "sleep.log").start()
        ...     proc.terminate()
        ...     proc.stop()  # reaps it: killed by SIGTERM
        -15
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
        """Stop the process and everything it started, and reap it.

        SIGTERM first, then SIGKILL what is left after ``grace_s`` seconds (or at the monotonic
        ``deadline``). Safe to call more than once and on a process that has already exited.

        Parameters
        ----------
        grace_s : float, optional
            Seconds between SIGTERM and SIGKILL.
        deadline : float, optional
            A ``time.monotonic()`` time to SIGKILL at instead.

        Returns
        -------
        int or None
            The exit code (negative: the signal), None if it was never started.

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     proc = ManagedProcess("sleep", ["sleep", "30"], log_path=Path(d) / "sleep.log").start()
        ...     proc.stop(grace_s=5), proc.stop()
        (-15, -15)
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
        r"""What this process has written to its log (ANSI colours removed).

        Returns
        -------
        str
            The log since this process started (an earlier process's lines in the same file are left out).

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with ManagedProcess("echo", ["echo", "hello"], log_path=Path(d) / "echo.log") as proc:
        ...         _ = proc.wait(timeout=10)
        ...         proc.log_text()
        'hello\n'
        """
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                return strip_ansi(log.read().decode("utf-8", errors="replace"))
        except FileNotFoundError:
            return ""

    def wait_for_log(self, pattern: re.Pattern | str, timeout: float) -> re.Match:
        r"""Wait until the log matches ``pattern``; ``DeploymentError`` on exit or timeout.

        Parameters
        ----------
        pattern : str or re.Pattern
            What a ready process writes.
        timeout : float
            Seconds to wait.

        Returns
        -------
        re.Match
            The first match.

        Raises
        ------
        DeploymentError
            The process exited, or the time ran out, first (with the log's last lines).

        Examples
        --------
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     with ManagedProcess("echo", ["echo", "port 9092"], log_path=Path(d) / "echo.log") as proc:
        ...         proc.wait_for_log(r"port (\d+)", timeout=10).group(1)
        '9092'
        """
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
    r"""The last ``lines`` lines of ``text``.

    Parameters
    ----------
    text : str
        A log's text.
    lines : int, optional
        How many lines.

    Returns
    -------
    str
        Those lines.

    Examples
    --------
    >>> tail("a\nb\nc\n", lines=2)
    'b\nc'
    """
    return "\n".join(text.rstrip().splitlines()[-lines:])


def free_ports(count: int) -> list[int]:
    """``count`` distinct free TCP ports on 127.0.0.1 (held open together while picking).

    Parameters
    ----------
    count : int
        How many ports.

    Returns
    -------
    list of int
        The ports.

    Examples
    --------
    >>> ports = free_ports(3)
    >>> len(set(ports))
    3
    """
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


def tool(name: str) -> str:
    """The console script next to this interpreter (the venv's), else the one on PATH.

    Parameters
    ----------
    name : str
        The script's name, e.g. ``flower-superlink``.

    Returns
    -------
    str
        Its path, or ``name`` to be found on PATH.

    Examples
    --------
    >>> tool("no-such-script-here")
    'no-such-script-here'
    """
    candidate = Path(sys.executable).with_name(name)
    return str(candidate) if candidate.exists() else name


def flower_env(home: Path) -> dict[str, str]:
    """The environment of a Flower process whose ``FLWR_HOME`` is ``home``.

    This interpreter's scripts come first on PATH (so a venv works unactivated), and telemetry is
    off unless set.

    Parameters
    ----------
    home : Path
        The process's ``FLWR_HOME``.

    Returns
    -------
    dict of str to str
        The environment.

    Examples
    --------
    >>> env = flower_env(Path("/tmp/flwr-home"))
    >>> env["FLWR_HOME"], env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)
    ('/tmp/flwr-home', True)
    """
    env = dict(os.environ)
    # Flower's processes start their helpers (flower-superexec, flwr-serverapp, flwr-clientapp)
    # by name: put this interpreter's scripts first on PATH, so a venv works unactivated
    # (as under `make test`, which calls .venv/bin/python directly).
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    env["FLWR_HOME"] = str(home)
    env.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env
