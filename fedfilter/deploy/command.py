"""``deploy_local``: the app on a real Flower Deployment Engine on this machine.

The same ClientApp and ServerApp that a real federation runs, through the same processes
(``flower-superlink``, one ``flower-supernode`` per device, ``flwr run``), with TLS and SuperNode
authentication switched on, but every process bound to 127.0.0.1:

1. a throw-away certificate authority and a server certificate for 127.0.0.1 / localhost;
2. one ``flower-superlink`` with ``--enable-supernode-auth`` and its own ``FLWR_HOME``;
3. the connection written to that ``FLWR_HOME``'s ``config.toml`` (``[superlink.NAME]``);
4. one ECDSA P-384 key per SuperNode, each registered with ``flwr supernode register``;
5. one ``flower-supernode`` per device, whose ``--node-config`` names the device's own budget
   ledger directory (``OUT/devices/<i>``), client id and personal budget;
6. ``flwr run APP_DIR CONNECTION --stream``, bounded by a timeout (``placement = "distributed"``:
   rounds of Skellam noise shares summed by SecAgg+, which the built-in app runs when the run
   config says so; every device is then enrolled with the ``rdp`` filter);
7. every process torn down (SIGTERM to its process group, SIGKILL after a grace period), also on
   Ctrl-C, SIGTERM or failure; then ``OUT/summary.json`` from the devices' own ledgers and the
   coordinator's public ledger.

The processes are handled by ``fedfilter.deploy.cluster.FlowerCluster``.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fedfilter.checks import is_int, positive_finite
from fedfilter.deploy.cluster import STARTED_RUN, FlowerCluster, RunResult
from fedfilter.deploy.flower_config import app_run_config
from fedfilter.deploy.processes import DeploymentError
from fedfilter.protocol.request import AFTER_EXHAUSTION, PLACEMENTS
from fedfilter.protocol.rules import default_min_reports

# The filter each placement's devices are enrolled with unless --filter says otherwise: the exact
# Gaussian-DP filter for local Gaussian noise; the Renyi filter, the one that accounts the Skellam
# sum, for distributed noise over SecAgg+ (which refuses any other).
DEFAULT_FILTER = {"local": "gdp", "distributed": "rdp"}
# The built-in Flower app directory (fedfilter/app: its pyproject.toml and components).
BUILTIN_APP_DIR = Path(__file__).resolve().parents[1] / "app"


@dataclass
class DeployOptions:
    """The settings of one ``fedfilter deploy-local`` run (the command's flags).

    Parameters
    ----------
    clients : int
        SuperNodes (devices).
    rounds : int, optional
        Server rounds.
    out : Path, optional
        Output folder: certificates, keys, device ledgers, logs, ``summary.json``.
    app_dir : Path, optional
        The Flower app to run (default: the built-in one).
    approve_apps : tuple of Path, optional
        The apps every simulated device owner approves; empty: ``app_dir`` only.
    budgets : tuple of float, optional
        Personal epsilons, cycled over the devices.
    delta : float, optional
        Every device's delta.
    filter_kind : str, optional
        The devices' filter; None: ``DEFAULT_FILTER[placement]``.
    after_exhaustion : str, optional
        What an exhausted device sends.
    placement : str, optional
        ``local`` or ``distributed``.
    min_reports : int, optional
        Distributed: the SecAgg+ threshold; None: ``rules.default_min_reports``.
    min_noise_multiplier : float, optional
        The smallest noise multiplier a device accepts.
    data_dir : Path, optional
        Root of the offline data sets on every device.
    run_config : dict, optional
        Extra ``--run-config`` overrides.
    reply_hold_s : float, optional
        Every device's reply hold: 0 (timing protection off) keeps a local trial fast; real devices
        default to ``client.reply_timing.DEFAULT_REPLY_HOLD_S``.
    timeout_s : float, optional
        Seconds the run may take.
    device_runtime : bool, optional
        False: Flower's plain ``flower-supernode`` (no approval, no enforced filter); only the
        baseline of ``benchmarks/deployed_round.py``, the CLI has no such flag.
    connect_timeout_s : float, optional
        Seconds the SuperNodes have to connect.
    grace_s : float, optional
        Seconds between SIGTERM and SIGKILL when stopping.
    verbose : bool, optional
        Show every process's output.

    Examples
    --------
    >>> options = DeployOptions(clients=4, placement="distributed")
    >>> options.filter, options.reports_needed
    ('rdp', 2)
    """

    clients: int
    rounds: int = 2
    out: Path = Path("out/deploy")
    app_dir: Path = BUILTIN_APP_DIR
    # The apps every simulated device owner approves (`fedfilter apps approve`); empty: app_dir only.
    approve_apps: tuple[Path, ...] = ()
    budgets: tuple[float, ...] = (1.0, 2.0, 4.0)  # cycled over the devices
    delta: float = 1e-5
    filter_kind: str | None = None  # None: DEFAULT_FILTER[placement]
    after_exhaustion: str = "noise-only"
    placement: str = "local"
    min_reports: int | None = None  # distributed: the SecAgg+ threshold; None: rules.default_min_reports
    min_noise_multiplier: float | None = None
    data_dir: Path | None = None  # root of the offline data sets on every device
    run_config: dict[str, Any] = field(default_factory=dict)  # extra --run-config overrides
    # Every device's reply-hold-s, set explicitly: 0 (timing protection off) keeps a local trial
    # fast; real devices default to client.reply_timing.DEFAULT_REPLY_HOLD_S. The output says which.
    reply_hold_s: float = 0.0
    timeout_s: float = 600.0
    # False: Flower's plain flower-supernode (a fresh flwr-clientapp per message, no approval, no
    # enforced filter). Only the baseline of benchmarks/deployed_round.py; the CLI has no such flag.
    device_runtime: bool = True
    connect_timeout_s: float = 60.0
    grace_s: float = 10.0
    verbose: bool = False

    @property
    def filter(self) -> str:
        """The filter every device is enrolled with.

        Returns
        -------
        str
            ``filter_kind``, else the placement's default.

        Examples
        --------
        >>> DeployOptions(clients=2).filter, DeployOptions(clients=2, filter_kind="zcdp").filter
        ('gdp', 'zcdp')
        """
        return self.filter_kind if self.filter_kind is not None else DEFAULT_FILTER.get(self.placement, "gdp")

    @property
    def approved_apps(self) -> tuple[Path, ...]:
        """What each device's owner approves: ``--approve-app``, else the app submitted.

        Returns
        -------
        tuple of Path
            Resolved paths.

        Examples
        --------
        >>> DeployOptions(clients=2).approved_apps == (BUILTIN_APP_DIR,)
        True
        """
        return tuple(Path(p).resolve() for p in (self.approve_apps or (self.app_dir,)))

    @property
    def reports_needed(self) -> int:
        """The fewest reports a released round has (the run config's ``min-reports``).

        Returns
        -------
        int
            ``min_reports``, else the placement's default for ``clients``.

        Examples
        --------
        >>> DeployOptions(clients=3).reports_needed
        1
        >>> DeployOptions(clients=3, placement="distributed", min_reports=3).reports_needed
        3
        """
        if self.min_reports is not None:
            return self.min_reports
        return default_min_reports(self.clients, self.placement) if isinstance(self.clients, int) else 1

    def check(self) -> None:
        """Refuse bad options, naming every problem at once.

        Raises
        ------
        ValueError
            One sentence per problem.

        Examples
        --------
        >>> DeployOptions(clients=2).check()
        >>> DeployOptions(clients=1, placement="distributed").check()
        Traceback (most recent call last):
            ...
        ValueError: --placement distributed needs --clients >= 2 (SecAgg+ unmasks no single report). Found 1.
        """
        problems: list[str | None] = []  # None: a check that passed (fedfilter.checks)
        if not is_int(self.clients) or self.clients < 1:
            problems.append(f"--clients must be an integer >= 1. Found {self.clients!r}.")
        if not is_int(self.rounds) or self.rounds < 1:
            problems.append(f"--rounds must be an integer >= 1. Found {self.rounds!r}.")
        if not self.budgets or not all(math.isfinite(b) and b > 0 for b in self.budgets):
            problems.append(f"--budgets must be finite epsilons > 0. Found {self.budgets!r}.")
        from fedfilter.privacy.filters import FILTER_KINDS

        if self.filter not in FILTER_KINDS:
            problems.append(f"--filter must be one of {', '.join(FILTER_KINDS)}. Found {self.filter_kind!r}.")
        if self.placement not in PLACEMENTS:
            problems.append(f"--placement must be one of {', '.join(PLACEMENTS)}. Found {self.placement!r}.")
        elif self.placement == "distributed" and isinstance(self.clients, int) and self.clients < 2:
            problems.append(
                f"--placement distributed needs --clients >= 2 (SecAgg+ unmasks no single report). "
                f"Found {self.clients}."
            )
        elif self.placement == "distributed" and self.filter != "rdp":
            problems.append(
                f"--placement distributed needs --filter rdp (the filter that accounts the Skellam sum). "
                f"Found {self.filter!r}."
            )
        m = self.min_reports
        if m is not None and (not is_int(m) or m < 1):
            problems.append(f"--min-reports must be an integer >= 1. Found {m!r}.")
        elif m is not None and self.placement != "distributed" and m != 1:
            problems.append(f"--min-reports applies to --placement distributed only. Found {m!r}.")
        elif m is not None and isinstance(self.clients, int) and m > self.clients:
            problems.append(f"--min-reports must be at most --clients={self.clients}. Found {m!r}.")
        clash = sorted({"placement", "min-reports"} & set(self.run_config))
        if clash:
            problems.append(f"--run-config may not set {clash}: use --placement and --min-reports.")
        if not 0 < self.delta < 1:
            problems.append(f"--delta must be in (0, 1). Found {self.delta!r}.")
        if self.after_exhaustion not in AFTER_EXHAUSTION:
            problems.append(
                f"--after-exhaustion must be one of {', '.join(AFTER_EXHAUSTION)}. Found {self.after_exhaustion!r}."
            )
        if self.min_noise_multiplier is not None:
            problems.append(positive_finite("--min-noise-multiplier", self.min_noise_multiplier))
        from fedfilter.client.settings.node_config import MAX_REPLY_HOLD_S

        if not (math.isfinite(self.reply_hold_s) and 0 <= self.reply_hold_s <= MAX_REPLY_HOLD_S):
            problems.append(
                f"--reply-hold-s must be in [0, {MAX_REPLY_HOLD_S:g}] seconds. Found {self.reply_hold_s!r}."
            )
        problems += [
            positive_finite(name, getattr(self, name)) for name in ("timeout_s", "connect_timeout_s", "grace_s")
        ]
        for app in self.approve_apps:
            if not (Path(app).is_dir() or Path(app).suffix == ".fab" and Path(app).is_file()):
                problems.append(f"--approve-app must be an app directory or a .fab file. Found {str(app)!r}.")
        found = [p for p in problems if p]
        if found:
            raise ValueError(" ".join(found))


def device_node_config(index: int, options: DeployOptions, ledger_dir: Path) -> dict[str, Any]:
    """The ``--node-config`` of device ``index``: where its ledger lives and its own budget.

    Parameters
    ----------
    index : int
        The device's number (its partition id).
    options : DeployOptions
        The run's options.
    ledger_dir : Path
        The device's ledger directory.

    Returns
    -------
    dict
        The node config (with ``worst-case-epsilon`` in distributed placement).

    Examples
    --------
    >>> config = device_node_config(1, DeployOptions(clients=3), Path("out/devices/1"))
    >>> config["client-id"], config["budget-epsilon"], config["partition-id"]
    ('device-1', 2.0, 1)
    """
    config: dict[str, Any] = {
        "ledger-dir": str(ledger_dir),
        "client-id": f"device-{index}",
        "budget-epsilon": float(options.budgets[index % len(options.budgets)]),
        "budget-delta": float(options.delta),
        "filter": options.filter,
        "after-exhaustion": options.after_exhaustion,
        "partition-id": index,
        "num-partitions": options.clients,
        "reply-hold-s": float(options.reply_hold_s),
    }
    if options.placement == "distributed":  # the budget against any coordinator (client/ledger/worst_case.py)
        from fedfilter.deploy.devices import simulated_worst_case_epsilon

        config["worst-case-epsilon"] = simulated_worst_case_epsilon(config["budget-epsilon"], options.reports_needed)
    if options.min_noise_multiplier is not None:
        config["min-noise-multiplier"] = float(options.min_noise_multiplier)
    if options.data_dir is not None:
        config["data-dir"] = str(Path(options.data_dir).resolve())
    return config


# Run-config keys this command fills in, when the app declares them ([tool.flwr.app.config]).
ROUNDS_KEYS = ("num-rounds", "num-server-rounds")
PUBLIC_LEDGER_KEYS = ("public-ledger",)
MIN_NODES_KEY = "min-available-nodes"
PLACEMENT_KEY, MIN_REPORTS_KEY = "placement", "min-reports"
PUBLIC_LEDGER_FILE = "public_ledger.sqlite"


def build_run_config(app_config: Mapping[str, Any], options: DeployOptions, public_ledger: Path) -> dict[str, Any]:
    """The ``--run-config`` overrides: rounds, the public ledger's path, the user's extras.

    Flower refuses override keys the app does not declare, so every key is checked here first.

    Parameters
    ----------
    app_config : Mapping
        The app's ``[tool.flwr.app.config]`` (``app_run_config``).
    options : DeployOptions
        The run's options.
    public_ledger : Path
        The coordinator's public ledger file.

    Returns
    -------
    dict
        The overrides.

    Raises
    ------
    ValueError
        A key the app does not declare.

    Examples
    --------
    >>> app_config = app_run_config(BUILTIN_APP_DIR)
    >>> build_run_config(app_config, DeployOptions(clients=3, rounds=4), Path("/out/public_ledger.sqlite"))
    ... # doctest: +NORMALIZE_WHITESPACE
    {'num-rounds': 4, 'public-ledger': '/out/public_ledger.sqlite', 'min-available-nodes': 3,
     'placement': 'local', 'min-reports': 1}
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
    if options.placement != "local" or PLACEMENT_KEY in app_config:
        for key, value in ((PLACEMENT_KEY, options.placement), (MIN_REPORTS_KEY, options.reports_needed)):
            if key not in app_config:
                raise ValueError(f"the app declares no {key!r} in [tool.flwr.app.config]: cannot set --placement.")
            overrides[key] = value
    unknown = sorted(set(options.run_config) - set(app_config))
    if unknown:
        raise ValueError(
            f"--run-config keys {', '.join(unknown)} are not declared in the app's "
            f"[tool.flwr.app.config] (declared: {', '.join(sorted(app_config))})."
        )
    overrides.update(options.run_config)
    return overrides


OWNERS_DIR = "owners"  # OUT/owners/<i>: each simulated device owner's state directory
_REFUSED = re.compile(r"refused app ([0-9a-f]{64}): not approved")


def approve_owner_apps(owners: Path, options: DeployOptions) -> list[str]:
    r"""Every simulated owner's list of approved apps, exactly ``options.approved_apps`` (rewritten).

    Parameters
    ----------
    owners : Path
        The owners' state directories' parent (``OUT/owners``).
    options : DeployOptions
        The run's options.

    Returns
    -------
    list of str
        ``name (hash prefix)`` of each approved app.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     app = Path(d, "myapp")
    ...     app.mkdir()
    ...     _ = (app / "pyproject.toml").write_text(
    ...         '[project]\nname = "myapp"\nversion = "1.0.0"\n\n[tool.flwr.app]\npublisher = "me"\n\n'
    ...         '[tool.flwr.app.components]\nserverapp = "myapp.server_app:app"\nclientapp = "myapp.client_app:app"\n'
    ...     )
    ...     approve_owner_apps(Path(d, "owners"), DeployOptions(clients=2, approve_apps=(app,)))  # doctest: +ELLIPSIS
    ['myapp (...)']
    """
    from fedfilter.client.runtime.approval import APPROVED_FILE, approve

    entries = []
    for index in range(options.clients):
        path = owners / str(index) / APPROVED_FILE
        path.unlink(missing_ok=True)  # this invocation's owners approve exactly what it says
        entries = [approve(app, path) for app in options.approved_apps]
    return [f"{Path(e.source).name} ({e.hash[:12]})" for e in entries]


def refused_apps(logs: Path, clients: int) -> dict[str, list[str]]:
    r"""The apps each device refused, read from its own log (a local trial shows both sides).

    Parameters
    ----------
    logs : Path
        The deployment's ``logs/`` folder.
    clients : int
        The number of devices.

    Returns
    -------
    dict of str to list of str
        Device name -> the hashes of the apps it refused (devices that refused none are left out).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     _ = Path(d, "supernode-device-1.log").write_text(f"refused app {'ab' * 32}: not approved\n")
    ...     refused_apps(Path(d), clients=2) == {"device-1": ["ab" * 32]}
    True
    """
    out = {}
    for index in range(clients):
        name = f"device-{index}"
        try:
            text = (logs / f"supernode-{name}.log").read_text(encoding="utf-8", errors="replace")
        except OSError:
            continue
        hashes = sorted(set(_REFUSED.findall(text)))
        if hashes:
            out[name] = hashes
    return out


# The strategy's summary names where the app writes its public ledger and the run it records
# (coordinator/strategy.py: "Public ledger: /abs/path (run ID)"); `flwr run --stream` shows it.
ANNOUNCED_LEDGER = re.compile(r"Public ledger: (?P<path>/[^\x1b]*?) \(run (?P<run>[^()\x1b]+)\)")


class LedgerProgress:
    """Print each new round of the coordinator's public ledger (read-only, polled).

    The runs of earlier invocations (``old_runs``) are skipped. ``see(line)`` follows the ledger the
    app announces in its log: an app that writes its ledger elsewhere than ``path`` (its own
    ``public_ledger=...``, relative to the ServerApp's working directory) is found wherever that
    is, and only the announced run counts.

    Parameters
    ----------
    path : Path
        Where the public ledger is expected.
    echo : callable
        Prints a line.
    old_runs : sequence of str, optional
        Runs already in the ledger before this invocation.

    Examples
    --------
    >>> progress = LedgerProgress(Path("out/public_ledger.sqlite"), print)
    >>> progress.see("INFO : Public ledger: /srv/ledger.sqlite (run run-7)")
    >>> progress.path, progress.run_id
    (PosixPath('/srv/ledger.sqlite'), 'run-7')
    """

    def __init__(self, path: Path, echo: Callable[[str], None], old_runs: Sequence[str] = ()):
        self.path, self.echo, self.old_runs = path, echo, set(old_runs)
        self.shown: set[tuple[str, int]] = set()
        self.run_id: str | None = None  # the run the app announced, once seen

    def see(self, line: str) -> None:
        """Follow the ledger and run an output line announces (the first announcement only).

        Parameters
        ----------
        line : str
            One line of ``flwr run``'s output.

        Examples
        --------
        >>> progress = LedgerProgress(Path("out/public_ledger.sqlite"), print)
        >>> progress.see("INFO : starting round 1")  # not an announcement
        >>> progress.run_id is None
        True
        """
        if self.run_id is not None or (match := ANNOUNCED_LEDGER.search(line)) is None:
            return
        from fedfilter.coordinator.public_report import public_run_ids

        self.path, self.run_id = Path(match["path"]), match["run"].strip()
        try:
            runs = public_run_ids(self.path)
        except Exception:  # a ledger being created: only the announced run counts anyway
            runs = []
        self.old_runs = {run for run in runs if run != self.run_id}

    def tick(self) -> None:
        """Print the rounds recorded since the last tick (nothing while the ledger does not exist).

        Examples
        --------
        >>> LedgerProgress(Path("no/such/ledger.sqlite"), print).tick()
        """
        if not self.path.is_file():
            return
        from fedfilter.coordinator.public_ledger import PublicLedger
        from fedfilter.coordinator.public_report import format_record

        try:
            with PublicLedger(self.path, read_only=True) as ledger:
                for run in ledger.runs():
                    if run.run_id in self.old_runs or (self.run_id is not None and run.run_id != self.run_id):
                        continue
                    for record in ledger.records(run.run_id):
                        key = (record.run_id, int(record.round_id))
                        if key not in self.shown:
                            self.shown.add(key)
                            self.echo(format_record(record))
        except Exception:  # a ledger still being created: try again on the next tick
            pass


def released_rounds(path: Path, run_id: str | None) -> int:
    """How many rounds of ``run_id`` the coordinator's public ledger marks released.

    Parameters
    ----------
    path : Path
        The public ledger file.
    run_id : str or None
        The run.

    Returns
    -------
    int
        The released rounds (0 without a ledger or a run).

    Examples
    --------
    >>> released_rounds(Path("no/such/ledger.sqlite"), "run-7")
    0
    """
    if run_id is None or not path.is_file():
        return 0
    from fedfilter.coordinator.public_ledger import PublicLedger

    with PublicLedger(path, read_only=True) as ledger:
        return sum(bool(r.released) for r in ledger.records(run_id))


def deploy_local(options: DeployOptions, echo: Callable[[str], None] = print) -> int:
    """Run the app on a local Deployment Engine; write ``OUT/summary.json``; 0 on success.

    Every process is stopped before this returns, whatever happened (Ctrl-C included).

    Parameters
    ----------
    options : DeployOptions
        The run's options.
    echo : callable, optional
        Prints a line of progress.

    Returns
    -------
    int
        The exit code.

    Examples
    --------
    It starts a SuperLink and a SuperNode per device:

    >>> deploy_local(DeployOptions(clients=3, rounds=2, out=Path("out/deploy")))  # doctest: +SKIP
    0
    """
    from fedfilter.client.flower.reply_timing import timing_protection
    from fedfilter.client.ledger.owner_state import owner_state_at
    from fedfilter.client.ledger.report import device_report, odometer_text
    from fedfilter.client.ledger.schema import LEDGER_FILE
    from fedfilter.client.ledger.worst_case import guarantee_lines
    from fedfilter.client.runtime.approval import APPROVE_HINT, TRUST_TEXT
    from fedfilter.client.settings.node_config import enrol_simulated_device
    from fedfilter.coordinator.public_report import public_run_ids, public_summary

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
        # in its owner's state directory, the one its SuperNode runs with (roll-back anchors live there)
        with owner_state_at(out / OWNERS_DIR / str(index)):
            enrol_simulated_device(device_node_config(index, options, devices_dir / str(index)))
    # ... and approves the apps it runs, in its own state directory (never the coordinator's say).
    approvals = approve_owner_apps(out / OWNERS_DIR, options)
    started = time.monotonic()
    result: RunResult | None = None
    error: str | None = None

    def show(line: str) -> None:
        echo(f"[{time.monotonic() - started:6.1f} s] {line}")

    old_runs = public_run_ids(public_ledger)  # a reused OUT keeps earlier runs
    progress = LedgerProgress(public_ledger, show, old_runs)
    timing = timing_protection(options.reply_hold_s)
    show(f"timing protection: {timing}")
    show(f"device owners approved: {'; '.join(approvals)} ({TRUST_TEXT})")
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
                handles.append(
                    cluster.start_supernode(
                        name,
                        private_key=private_key,
                        node_config=config,
                        owner_state_dir=out / OWNERS_DIR / str(index),  # where enrolment put its anchor
                        device_runtime=options.device_runtime,
                        # Distributed placement is the owner's choice too: these owners enable it.
                        device_args=["--secure-aggregation"] if options.placement == "distributed" else [],
                    )
                )
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
                progress.see(line)
                if options.verbose or "ERROR" in line or STARTED_RUN.search(line):
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
    refused = refused_apps(out / "logs", options.clients)
    for name, hashes in refused.items():
        show(
            f"{name} refused app {', '.join(hashes)}: not approved by its owner (nothing installed, imported, "
            f"trained or spent; the owner approves with `{APPROVE_HINT}`)"
        )

    # What the device owners read from their own ledgers (the same report as `fedfilter demo`).
    if progress.run_id is not None:  # the app said where its ledger is: read that one
        public_ledger = progress.path
        old_runs = sorted(run for run in public_run_ids(public_ledger) if run != progress.run_id)
    elif not any(k in app_config for k in PUBLIC_LEDGER_KEYS):
        show(
            "no public ledger found: the app declares no 'public-ledger' run-config key and its log named "
            "none (IndividualFilterStrategy(..., public_ledger=PATH) prints it): rounds_completed is 0"
        )
    public = public_summary(public_ledger, old_runs)
    released = released_rounds(public_ledger, public["run_id"])

    def owner_report(i: int) -> dict[str, Any]:
        # in the owner's state directory, where the device's roll-back anchor is (as at enrolment)
        with owner_state_at(out / OWNERS_DIR / str(i)):
            return device_report(devices_dir / str(i), public["run_id"])

    clients = [owner_report(i) for i in range(options.clients) if (devices_dir / str(i) / LEDGER_FILE).is_file()]
    summary = {
        "engine": "deployment",
        "run_id": public["run_id"],
        "flower_run_id": result.run_id if result else None,
        "status": result.status if result else ("interrupted" if error == "interrupted" else "failed"),
        "error": error if error != "interrupted" else None,
        "rounds_completed": public["rounds_completed"],
        "placement": options.placement,
        # Distributed rounds run through SecAgg+: the coordinator unmasks only the sum of the reports.
        "secure_aggregation": options.placement == "distributed",
        "released_rounds": released,
        "refused_apps": refused,
        "public_ledger": str(public_ledger),
        "clients": clients,
        "odometer": odometer_text(options.delta),
        "final_accuracy": public["final_accuracy"],
        "settings": {
            "clients": options.clients,
            "rounds": options.rounds,
            "app_dir": str(app_dir),
            "approved_apps": [str(p) for p in options.approved_apps],
            "budgets": list(options.budgets),
            "delta": options.delta,
            "filter": options.filter,
            "placement": options.placement,
            "min_reports": options.reports_needed,
            "after_exhaustion": options.after_exhaustion,
            "min_noise_multiplier": options.min_noise_multiplier,
            "run_config": run_config,
            "tls": True,
            "supernode_auth": True,
            "reply_hold_s": options.reply_hold_s,
        },
        "timing_protection": timing,
        "guarantee": {
            c["client_id"]: guarantee_lines(c["budget_epsilon"], c["worst_case_epsilon"], options.delta)
            for c in clients
        },
        "wall_time_s": round(time.monotonic() - started, 1),
        "logs": str(out / "logs"),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    show(f"summary written to {out / 'summary.json'}")
    for client in summary["clients"]:
        worst = client["worst_case_epsilon"]
        show(
            f"{client['client_id']}: spent epsilon {client['spent_epsilon']:.4g} of "
            f"{client['budget_epsilon']:g}"
            + ("" if worst is None else f"; worst case {client['worst_case_spent_epsilon']:.4g} of {worst:g}")
            + (f", exhausted in round {client['exhausted_round']}" if client["exhausted_round"] is not None else "")
        )
        for line in guarantee_lines(client["budget_epsilon"], worst, options.delta):
            show(f"  guarantee: {line}")
    if error == "interrupted":
        return 130
    return 0 if result is not None and result.ok else 1
