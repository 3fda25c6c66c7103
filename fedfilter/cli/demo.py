"""``fedfilter demo``: a small Flower simulation in which clients with different budgets drop out.

    fedfilter demo --clients 10 --rounds 5 --out runs/demo [--task digits] [--seed 0]
    fedfilter demo --placement distributed --out runs/demo-sa [--min-reports M]

Runs the built-in app (``fedfilter/app``) on Flower's Simulation Engine the way a user would:
``flwr run fedfilter/app flwrrun --stream`` against a SuperLink started here in simulation mode on
127.0.0.1 (``fedfilter.deploy.simulation_link``; Ray bound to 127.0.0.1, one CPU per client), with the
demo's settings as ``--run-config`` overrides of the app's ``[tool.flwr.app.config]``. Every
simulated device is enrolled up front with its own budget ledger under ``OUT/devices/<id>`` and a
personal epsilon drawn log-uniformly from ``[--eps-min, --eps-max]`` (delta 1e-5). Those settings
go into ``OUT/device-settings.json`` (keyed by partition-id), which the devices find through
``FEDFILTER_DEVICE_SETTINGS`` in the SuperLink's environment (``fedfilter.client.settings.simulated``);
the coordinator never sees it. During the run a progress bar follows the coordinator's *public*
ledger (``OUT/public_ledger.sqlite``) and the run's own log lines are streamed. After the run the
demo plays the part of the device owners: it
opens each device's ledger to count, per round, the clients that still had budget and contributed
their data. Those counts are printed and plotted here, next to the public accuracy; they were
never sent to the coordinator (exhausted clients keep sending pure noise, which looks the same).
Timing protection is off by default here (``--reply-hold-s 0``: a held reply would block a Ray
actor that serves many nodes in turn); the demo prints so, and its guarantee then excludes timing.

``--placement distributed`` runs the same app with distributed noise over Flower's SecAgg+: every
device masks its report (``secaggplus_mod`` around the filter mod) and adds only its Skellam share
of the noise, the coordinator unmasks only the sum of at least ``--min-reports`` reports (the
SecAgg+ reconstruction threshold; default ``ceil(clients / 2)``, at most 100) and never releases a round with
fewer. The devices are enrolled with the Renyi filter (``rdp``), which accounts the Skellam
mechanism; the defaults (noise multiplier, budget range) are the distributed ones below.

Outputs: ``OUT/summary.json``, ``OUT/rounds.png``, ``OUT/public_ledger.sqlite``,
``OUT/devices/<id>/budget_ledger.sqlite``, ``OUT/device-settings.json``, Flower's logs in
``OUT/flower/logs``. Every process the demo starts is stopped at the end, also on Ctrl-C.
Device ledgers are lifelong: running the demo again
with the same ``--out`` continues from what each device has already spent, with the budget it was
enrolled with.

Flower, Ray and torch are imported only by the processes the command starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import Any

from fedfilter.app.config import APP_DIR, app_defaults, resolve_config
from fedfilter.checks import positive_finite
from fedfilter.cli import demo_population
from fedfilter.cli.demo_report import (
    DELTA,
    clip_share_per_round,
    demo_summary,
    follow_public_ledger,
    guarantee_text,
    learning_text,
    placement_text,
    plan_summary,
    plot_rounds,
    print_clients_table,
    print_rounds_table,
)
from fedfilter.deploy.devices import simulated_worst_case_epsilon
from fedfilter.protocol.request import AFTER_EXHAUSTION, PLACEMENTS
from fedfilter.protocol.rules import default_min_reports
from fedfilter.simulations.population.settings import MAX_DEMO_EPSILON

# Demo defaults. The app's own settings come from its one place (fedfilter/app/pyproject.toml); the
# budget draw and the noise multiplier are the demo's. Budgets are ones people use: epsilon
# log-uniform on [1, 8] at delta 1e-5, never above 8 (MAX_DEMO_EPSILON). The noise multiplier is
# planned (``planned_noise_multiplier``): the least whose every round at full clip the smallest budget's
# own filter pays for; at the defaults (5 rounds, epsilon 1, digits MLP) that is the value below, which
# tests/cli/test_demo_population.py recomputes with the planner.
_APP = app_defaults()
DEFAULTS = {
    "noise_multiplier": 8.35,  # gdp filter: sqrt(5) / mu(epsilon 1, delta 1e-5), rounded up
    "clip": _APP["clip"],
    "local_epochs": _APP["local-epochs"],
    "lr": _APP["lr"],
    "server_lr": _APP["server-lr"],
    "eps_min": 1.0,
    "eps_max": MAX_DEMO_EPSILON,
    "delta": DELTA,
}
# Distributed placement: z C is the std of the SUM (not of each report); the rdp filter accounts the
# Skellam sum, and plans a slightly larger z than the gdp filter for the same budget and rounds.
DISTRIBUTED_DEFAULTS = {"noise_multiplier": 9.05, "eps_min": 1.0, "eps_max": MAX_DEMO_EPSILON}
# The filter that accounts each placement's mechanism: the exact Gaussian-DP filter for Gaussian
# noise; the Renyi filter for the Skellam sum (the gdp filter is not valid for it).
FILTER_OF_PLACEMENT = {"local": "gdp", "distributed": "rdp"}
RUN_TIMEOUT_S, ROUND_TIMEOUT_S = 300.0, 120.0  # the whole `flwr run`: start-up plus per round


def register(subparsers: Any) -> None:
    """Add ``demo`` to the ``fedfilter`` command.

    Parameters
    ----------
    subparsers : argparse._SubParsersAction
        The ``fedfilter`` parser's sub-commands.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = parser.parse_args(["demo", "--out", "runs/demo", "--clients", "4"])
    >>> args.clients, args.rounds, args.placement, args.noise_multiplier  # None: the placement's default
    (4, 5, 'local', None)
    """
    p = subparsers.add_parser(
        "demo",
        help="run a small Flower simulation with personal budgets (epsilon <= 8), then optionally a "
        "population that learns at those budgets",
        description="Flower Simulation Engine demo: clients with heterogeneous personal budgets, "
        "individual filters, a plain-mean coordinator and its public ledger; with --population N, "
        "then N devices on the vectorised engine, against the same federation without privacy.",
    )
    p.add_argument(
        "--clients",
        type=int,
        default=10,
        help="number of simulated Flower devices (default 10; 0: the population part alone)",
    )
    p.add_argument("--rounds", type=int, default=5, help="federated rounds (default 5)")
    p.add_argument("--out", required=True, help="output folder (device ledgers, public ledger, summary)")
    p.add_argument("--task", default=_APP["task"], help=f"built-in task (default {_APP['task']})")
    p.add_argument("--seed", type=int, default=0, help="seed of budgets, model and sampling (default 0)")
    p.add_argument(
        "--placement",
        choices=PLACEMENTS,
        default="local",
        help="local: every report carries the full noise; distributed: Skellam shares summed by SecAgg+ "
        "(the coordinator sees only the sum of >= --min-reports reports; devices use the rdp filter)",
    )
    p.add_argument(
        "--min-reports",
        type=int,
        default=None,
        metavar="M",
        help="distributed: the SecAgg+ threshold, the fewest reports a released round has; each share is "
        "calibrated to it (default ceil(clients / 2), at most 100)",
    )
    p.add_argument(
        "--noise-multiplier",
        type=float,
        default=None,
        help="z, noise std z * clip (default: the planner's, the least whose every round at full clip the "
        f"smallest budget pays for: {DEFAULTS['noise_multiplier']:g} at the defaults; distributed: "
        f"{DISTRIBUTED_DEFAULTS['noise_multiplier']:g}, the std of the sum)",
    )
    p.add_argument(
        "--clip", type=float, default=DEFAULTS["clip"], help="clip norm C of each update (default %(default)s)"
    )
    p.add_argument(
        "--eps-min",
        type=float,
        default=None,
        help=f"smallest personal epsilon, log-uniform draw (default {DEFAULTS['eps_min']:g}; "
        f"distributed: {DISTRIBUTED_DEFAULTS['eps_min']:g})",
    )
    p.add_argument(
        "--eps-max",
        type=float,
        default=None,
        help=f"largest personal epsilon (default {DEFAULTS['eps_max']:g}; distributed: "
        f"{DISTRIBUTED_DEFAULTS['eps_max']:g})",
    )
    p.add_argument(
        "--after-exhaustion",
        choices=AFTER_EXHAUSTION,
        default="noise-only",
        help="what a device whose budget is spent sends: pure noise (hides the exhaustion) or a 'left' marker",
    )
    p.add_argument(
        "--local-epochs",
        type=int,
        default=DEFAULTS["local_epochs"],
        help="local epochs per round (default %(default)s)",
    )
    p.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="the devices' learning rate (default %(default)s)")
    p.add_argument(
        "--server-lr",
        type=float,
        default=DEFAULTS["server_lr"],
        help="the server's step on the mean (default %(default)s)",
    )
    p.add_argument(
        "--reply-hold-s",
        type=float,
        default=0.0,
        metavar="S",
        help="every device's reply-hold-s (default 0: timing protection off, so the "
        "simulation stays fast; deployed devices default to 60)",
    )
    p.add_argument("--verbose", action="store_true", help="show Flower's INFO logs")
    demo_population.add_arguments(p)
    p.set_defaults(func=_run)


def placement_defaults(args: argparse.Namespace) -> argparse.Namespace:
    """Fill in what the user left unset with the placement's defaults (in place; returned).

    Parameters
    ----------
    args : argparse.Namespace
        The parsed ``demo`` options.

    Returns
    -------
    argparse.Namespace
        ``args``, with ``eps_min``, ``eps_max``, ``min_reports`` and (unless the settings are bad, or
        the Flower part is skipped) ``noise_multiplier`` set: the planner's (``flower_plan``), the least
        whose ``rounds`` full-clip rounds the smallest budget's filter pays for, rounded up.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = placement_defaults(parser.parse_args(["demo", "--out", "runs/demo", "--placement", "distributed"]))
    >>> args.noise_multiplier, args.eps_min, args.eps_max, args.min_reports
    (9.05, 1.0, 8.0, 5)
    """
    table = {**DEFAULTS, **(DISTRIBUTED_DEFAULTS if args.placement == "distributed" else {})}
    for name in ("eps_min", "eps_max"):
        if getattr(args, name) is None:
            setattr(args, name, table[name])
    if args.min_reports is None:
        args.min_reports = default_min_reports(args.clients, args.placement)
    if args.noise_multiplier is None and args.clients and not _problems(args):  # else _check names the problems
        from fedfilter.simulations.population.settings import planned_noise_multiplier

        args.noise_multiplier = planned_noise_multiplier(flower_plan(args, 1.0), rounds=args.rounds, delta=DELTA)
        args.noise_planned = True  # what the texts may say of it
    return args


def model_dim(task: str) -> int:
    """The floating-point coordinates a device releases for the task's model.

    Parameters
    ----------
    task : str
        A built-in task.

    Returns
    -------
    int
        ``fedfilter.cli.plan.count_parameters`` of the task's model.

    Examples
    --------
    >>> model_dim("digits")
    2410
    """
    from fedfilter.cli.plan import count_parameters
    from fedfilter.simulations.tasks.registry import load_task

    return count_parameters(load_task(task, num_clients=1).model_fn())


def flower_plan(args: argparse.Namespace, noise_multiplier: float) -> dict[str, Any]:
    """``fedfilter.planning.federation.plan_federation`` for the Flower part: every client asked every
    round, the smallest budget of the draw (``--eps-min``, cut to the draw's 2 decimals).

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` options, defaults filled in.
    noise_multiplier : float
        The z to report the figures at.

    Returns
    -------
    dict
        The planner's figures, verdict and recommendations.

    Examples
    --------
    >>> args = argparse.Namespace(clients=10, rounds=5, clip=0.4, eps_min=1.0, placement="local", min_reports=1,
    ...     task="digits")
    >>> plan = flower_plan(args, 8.35)
    >>> plan["fits_budget"], round(plan["noise_to_clip"]), plan["distributed"]["devices"]
    (True, 130, 894)
    """
    from fedfilter.planning.federation import plan_federation

    return plan_federation(
        devices=args.clients,
        dim=model_dim(args.task),
        noise_multiplier=noise_multiplier,
        clip=args.clip,
        epsilon=math.floor(args.eps_min * 100) / 100,  # draw_budgets rounds to 2 decimals
        delta=DELTA,
        rounds=args.rounds,
        placement=args.placement,
        min_reports=args.min_reports,
        filter=FILTER_OF_PLACEMENT[args.placement],
    )


def no_privacy_baseline(args: argparse.Namespace, run_id: str) -> list[float]:
    """The Flower part's devices without privacy: their test accuracy per round.

    The app's data split, initial model and local training (``fedfilter.simulations.population.no_privacy``),
    every device asked every round as the app's strategy does, the plain mean of the unclipped updates.

    Parameters
    ----------
    args : argparse.Namespace
        The ``demo`` options (``task``, ``clients``, ``rounds``, ``local_epochs``, ``lr``, ``server_lr``, ``seed``).
    run_id : str
        The run.

    Returns
    -------
    list of float
        One accuracy per round.

    Examples
    --------
    >>> args = argparse.Namespace(task="digits", clients=4, rounds=2, local_epochs=1, lr=0.1, server_lr=1.0, seed=0)
    >>> acc = no_privacy_baseline(args, "run-1")
    >>> len(acc), acc[-1] > 0.3  # chance is 0.1
    (2, True)
    """
    from fedfilter.simulations.population.no_privacy import no_privacy_accuracy
    from fedfilter.simulations.tasks.registry import load_task

    task = load_task(args.task, num_clients=args.clients, partition=_APP["partition"], seed=_APP["partition-seed"])
    return no_privacy_accuracy(
        task,
        per_round=args.clients,
        rounds=args.rounds,
        local_epochs=args.local_epochs,
        lr=args.lr,
        batch_size=_APP["batch-size"],
        server_lr=args.server_lr,
        seed=args.seed,
        run_id=run_id,
    )


def _problems(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.clients == 0:  # the population part alone
        if args.population < 1:
            problems.append("--clients 0 skips the Flower part: it needs --population N > 0. Found --population 0.")
        return problems + demo_population.check(args)
    if args.placement not in PLACEMENTS:
        problems.append(f"--placement must be one of {', '.join(PLACEMENTS)}. Found {args.placement!r}.")
    if args.placement == "distributed" and args.clients < 2:
        problems.append(
            f"--placement distributed needs --clients >= 2 (SecAgg+ unmasks no single report). Found {args.clients}."
        )
    if args.placement == "distributed" and not 1 <= args.min_reports <= args.clients:
        problems.append(f"--min-reports must be in [1, --clients={args.clients}]. Found {args.min_reports}.")
    if args.placement == "local" and args.min_reports != 1:
        problems.append(f"--min-reports applies to --placement distributed only. Found {args.min_reports}.")
    if args.noise_multiplier is not None and (p := positive_finite("--noise-multiplier", args.noise_multiplier)):
        problems.append(p)
    if args.clients < 0:
        problems.append(f"--clients must be >= 1 (0: the population part alone). Found {args.clients}.")
    if args.rounds < 1:
        problems.append(f"--rounds must be >= 1. Found {args.rounds}.")
    if not (0 < args.eps_min <= args.eps_max and math.isfinite(args.eps_max)):
        problems.append(f"need 0 < --eps-min <= --eps-max. Found {args.eps_min} and {args.eps_max}.")
    if (p := positive_finite("--clip", args.clip)) is not None:
        problems.append(p)
    from fedfilter.client.settings.node_config import MAX_REPLY_HOLD_S

    if not (math.isfinite(args.reply_hold_s) and 0 <= args.reply_hold_s <= MAX_REPLY_HOLD_S):
        problems.append(f"--reply-hold-s must be in [0, {MAX_REPLY_HOLD_S:g}] seconds. Found {args.reply_hold_s}.")
    return problems + demo_population.check(args)


def _check(args: argparse.Namespace) -> None:
    if problems := _problems(args):
        raise ValueError(" ".join(problems))


def draw_budgets(n: int, eps_min: float, eps_max: float, seed: int) -> list[float]:
    """Personal epsilons, log-uniform on [eps_min, eps_max], rounded to 2 decimals.

    Parameters
    ----------
    n : int
        The number of devices.
    eps_min, eps_max : float
        The range of the draw.
    seed : int
        The demo's seed (the same seed draws the same budgets).

    Returns
    -------
    list of float
        One epsilon per device.

    Examples
    --------
    >>> draw_budgets(3, 10.0, 60.0, seed=0)
    [14.35, 52.65, 15.02]
    """
    import numpy as np

    rng = np.random.default_rng([seed, 0xB0D6E7])
    return [round(float(math.exp(rng.uniform(math.log(eps_min), math.log(eps_max)))), 2) for _ in range(n)]


def device_configs(
    out: Path,
    budgets: list[float],
    *,
    after_exhaustion: str,
    min_noise_multiplier: float = 0.5,
    reply_hold_s: float = 0.0,
    filter_kind: str = "gdp",
    worst_case_reports: int | None = None,
) -> dict[int, dict]:
    """Each simulated node's own node-config (what ``--node-config`` would hold on a real device).

    Every device is enrolled here, up front (its owner's act; the mod never enrols). A device
    already enrolled under ``out/devices/<id>`` keeps the budget it was enrolled with.
    ``reply_hold_s`` is set explicitly: 0 (timing protection off) keeps the simulation fast, where a
    held reply would block a Ray actor that serves many nodes in turn.

    Parameters
    ----------
    out : Path
        The demo's output folder; ledgers go to ``out/devices/<id>``.
    budgets : list of float
        Each new device's epsilon (``draw_budgets``).
    after_exhaustion : str
        What a device whose budget is spent sends (``noise-only`` or ``leave``).
    min_noise_multiplier : float, optional
        The smallest noise multiplier a device accepts.
    reply_hold_s : float, optional
        Every device's reply hold (0: timing protection off).
    filter_kind : str, optional
        The filter a NEW device is enrolled with (``FILTER_OF_PLACEMENT``); an enrolled one keeps its own.
    worst_case_reports : int, optional
        Distributed placement: ``min_reports``. Each device's worst-case-epsilon is then
        ``simulated_worst_case_epsilon(budget, min_reports)``, unless its ledger already has one.

    Returns
    -------
    dict of int to dict
        Partition id -> the device's node-config.

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:
    ...     devices = device_configs(Path(d), [10.0, 20.0], after_exhaustion="noise-only")
    ...     again = device_configs(Path(d), [99.0, 99.0], after_exhaustion="noise-only")  # enrolled: kept
    >>> devices[1]["budget-epsilon"], again[1]["budget-epsilon"], devices[1]["filter"]
    (20.0, 20.0, 'gdp')
    """
    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.ledger.schema import LEDGER_FILE
    from fedfilter.client.settings.node_config import enrol_simulated_device

    table = {}
    for i, eps in enumerate(budgets):
        ledger_dir = out / "devices" / str(i)
        delta, kind, worst = DEFAULTS["delta"], filter_kind, None
        if worst_case_reports is not None:
            worst = simulated_worst_case_epsilon(eps, worst_case_reports)
        if (ledger_dir / LEDGER_FILE).exists():
            ledger = BudgetLedger.open(ledger_dir)
            eps, delta, kind = ledger.enrolment.epsilon, ledger.enrolment.delta, ledger.enrolment.filter_kind
            if ledger.worst_case is not None:
                worst = ledger.worst_case.epsilon
            elif worst is not None:
                worst = simulated_worst_case_epsilon(eps, worst_case_reports or 1)
            ledger.close()
        table[i] = {
            "ledger-dir": str(ledger_dir),
            "client-id": f"client-{i}",
            "budget-epsilon": float(eps),
            "budget-delta": float(delta),
            "filter": kind,
            "after-exhaustion": after_exhaustion,
            "min-noise-multiplier": float(min_noise_multiplier),
            "reply-hold-s": float(reply_hold_s),
        }
        if worst is not None:
            table[i]["worst-case-epsilon"] = float(worst)
        enrol_simulated_device(table[i])  # each device's owner enrols it once, up front: the mod never does
    return table


def run_config_overrides(args: argparse.Namespace, run_id: str, ledger_path: Path) -> dict[str, Any]:
    """The demo's ``--run-config`` overrides of the app's ``[tool.flwr.app.config]`` (checked here).

    Parameters
    ----------
    args : argparse.Namespace
        The demo's options, defaults filled in (``placement_defaults``).
    run_id : str
        The run's name in the public ledger.
    ledger_path : Path
        The coordinator's public ledger file.

    Returns
    -------
    dict
        Run-config key -> value; an unknown key or a wrong type raises ValueError.

    Examples
    --------
    >>> parser = argparse.ArgumentParser(prog="fedfilter")
    >>> register(parser.add_subparsers(dest="command"))
    >>> args = placement_defaults(parser.parse_args(["demo", "--out", "runs/demo", "--rounds", "3"]))
    >>> over = run_config_overrides(args, "run-1", Path("public_ledger.sqlite"))
    >>> over["num-rounds"], over["placement"], over["run-name"]
    (3, 'local', 'run-1')
    """
    overrides = {
        "run-name": run_id,
        "num-rounds": args.rounds,
        "min-available-nodes": args.clients,
        "noise-multiplier": float(args.noise_multiplier),
        "clip": float(args.clip),
        "placement": args.placement,
        "min-reports": args.min_reports,
        "local-epochs": args.local_epochs,
        "lr": float(args.lr),
        "server-lr": float(args.server_lr),
        "task": args.task,
        "num-clients": args.clients,
        "seed": args.seed,
        "public-ledger": str(ledger_path),
    }
    resolve_config(overrides, source="demo run-config")  # unknown keys or wrong types: refused here
    return overrides


_SHOWN = re.compile(r"fedfilter (round|mod)|ERROR|Traceback|Exception")


def _stream_line(verbose: bool):
    """Show the run's own log lines above the progress bar: the coordinator's rounds and problems, or all."""
    from tqdm import tqdm

    def show(line: str) -> None:
        if verbose or _SHOWN.search(line):
            tqdm.write(f"  | {line}")

    return show


@contextlib.contextmanager
def _sigterm_as_interrupt():
    """SIGTERM ends the demo like Ctrl-C does: through the SuperLink's teardown."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, interrupt) if in_main else None
    try:
        yield
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)


def check_device_filters(devices: dict[int, dict], placement: str) -> None:
    """Refuse distributed placement unless every device was enrolled with the rdp filter.

    The rdp filter is the Skellam mechanism's accountant: a device enrolled earlier under ``--out``
    with another filter is refused here.

    Parameters
    ----------
    devices : dict of int to dict
        ``device_configs``'s node-configs.
    placement : str
        ``local`` (nothing to check) or ``distributed``.

    Raises
    ------
    ValueError
        Naming the devices enrolled with another filter.

    Examples
    --------
    >>> check_device_filters({0: {"filter": "rdp"}}, "distributed")
    >>> check_device_filters({0: {"filter": "gdp"}}, "distributed")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: --placement distributed needs every device enrolled with filter 'rdp'; devices [0] ...
    """
    if placement != "distributed":
        return
    wrong = {i: d["filter"] for i, d in devices.items() if d["filter"] != FILTER_OF_PLACEMENT["distributed"]}
    if wrong:
        raise ValueError(
            f"--placement distributed needs every device enrolled with filter 'rdp'; devices {sorted(wrong)} "
            f"under --out were enrolled with {sorted(set(wrong.values()))}: use a new --out."
        )


def _run(args: argparse.Namespace) -> int:
    placement_defaults(args)
    _check(args)
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.clients and (code := _flower_part(args, out)) != 0:
        return code
    if args.population:
        try:
            with _sigterm_as_interrupt():
                demo_population.run_part(args, out)
        except KeyboardInterrupt:  # the second process gets the same signal from the terminal, or ends with the pool
            print("\nfedfilter demo: interrupted during the population part", flush=True)
            return 130
    return 0


def _flower_part(args: argparse.Namespace, out: Path) -> int:
    from fedfilter.client.flower.reply_timing import timing_protection
    from fedfilter.client.ledger.report import device_report, odometer_text
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.coordinator.public_ledger import PublicLedger
    from fedfilter.deploy.simulation_link import SimulationLink

    budgets = draw_budgets(args.clients, args.eps_min, args.eps_max, args.seed)
    devices = device_configs(
        out,
        budgets,
        after_exhaustion=args.after_exhaustion,
        min_noise_multiplier=min(0.5, args.noise_multiplier),
        reply_hold_s=args.reply_hold_s,
        filter_kind=FILTER_OF_PLACEMENT[args.placement],
        worst_case_reports=args.min_reports if args.placement == "distributed" else None,
    )
    check_device_filters(devices, args.placement)
    # The simulation runner's file of device settings (what --node-config holds on a real device).
    settings_file = write_device_settings(out / "device-settings.json", devices)
    run_id = f"demo-{time.strftime('%Y%m%dT%H%M%S')}-{secrets.token_hex(2)}"
    ledger_path = out / "public_ledger.sqlite"
    overrides = run_config_overrides(args, run_id, ledger_path)
    print(f"fedfilter demo: {args.clients} clients x {args.rounds} rounds on {args.task!r}, run {run_id}")
    planned = " (the planner's for the smallest budget)" if getattr(args, "noise_planned", False) else ""
    print(
        f"  personal budgets: epsilon log-uniform on [{args.eps_min:g}, {args.eps_max:g}], delta "
        f"{DEFAULTS['delta']:g}; noise multiplier {args.noise_multiplier:g}{planned}, clip {args.clip:g}, "
        f"{placement_text(args)}, after exhaustion: {args.after_exhaustion}"
    )
    timing = timing_protection(args.reply_hold_s)
    print(f"  timing protection: {timing}")

    stop = threading.Event()
    follower = threading.Thread(target=follow_public_ledger, args=(ledger_path, run_id, args.rounds, stop), daemon=True)
    started = time.monotonic()
    echo = (lambda line: print(f"  {line}", flush=True)) if args.verbose else None
    # Every process started here (SuperLink, flwr-simulation, Ray, flwr run) stops when the
    # context exits, also on Ctrl-C, SIGTERM or an error (fedfilter.deploy.cluster.FlowerCluster.close).
    try:
        with (
            _sigterm_as_interrupt(),
            SimulationLink(
                out / "flower", num_supernodes=args.clients, device_settings=settings_file, echo=echo
            ) as link,
        ):
            follower.start()
            try:
                result = link.run_app(
                    APP_DIR,
                    run_config=overrides,
                    timeout=RUN_TIMEOUT_S + ROUND_TIMEOUT_S * args.rounds,
                    on_line=_stream_line(args.verbose),
                )
            finally:
                stop.set()
                if follower.is_alive():
                    follower.join()
    except KeyboardInterrupt:
        print("\nfedfilter demo: interrupted; every process it started was stopped", flush=True)
        return 130
    elapsed = time.monotonic() - started
    if not result.ok:
        last = "\n".join(result.output.rstrip().splitlines()[-15:])
        raise RuntimeError(
            f"the Flower run ended {result.status!r} ({result.details}); logs in {link.logs_dir}:\n{last}"
        )

    # The coordinator's view: public records only.
    with PublicLedger(ledger_path, read_only=True) as public:
        records = public.records(run_id) if public.has_run(run_id) else []
    # The device owners' view, read here after the run from each device's own ledger.
    clients = [device_report(Path(devices[i]["ledger-dir"]), run_id) for i in range(args.clients)]
    rounds = [int(r.round_id) for r in records]
    contributing = [sum(r in c["contributed_rounds"] for c in clients) for r in rounds]
    ledger_dirs = [Path(devices[i]["ledger-dir"]) for i in range(args.clients)]
    clip_share = clip_share_per_round(ledger_dirs, run_id, rounds, args.clip)
    # A round below the SecAgg+ threshold is not released: the model, and its accuracy, stay as they were.
    accuracy = [float(r.metrics["accuracy"]) if "accuracy" in r.metrics else None for r in records]

    # The same 10 devices without privacy, and the planner's figures at this z: what the accuracy is read against.
    no_privacy = no_privacy_baseline(args, run_id)
    plan = flower_plan(args, float(args.noise_multiplier))
    print_rounds_table(records, contributing, clip_share, accuracy, no_privacy)
    print_clients_table(clients)
    guarantee = guarantee_text(args)
    print(f"\nguarantee: {guarantee}")
    print(f"odometer: {odometer_text(DELTA)}")
    print(f"\n{learning_text(args, plan, accuracy, no_privacy)}")
    for c in clients:
        if c["spent_epsilon"] > c["budget_epsilon"]:
            raise RuntimeError(f"{c['client_id']} spent {c['spent_epsilon']} > its budget {c['budget_epsilon']}")
        if c["worst_case_epsilon"] is not None and c["worst_case_spent_epsilon"] > c["worst_case_epsilon"]:
            raise RuntimeError(f"{c['client_id']} spent {c['worst_case_spent_epsilon']} > its worst-case budget")
    summary = demo_summary(
        args,
        run_id=run_id,
        public_ledger=ledger_path,
        records=records,
        clients=clients,
        accuracy=accuracy,
        contributing=contributing,
        clip_share=clip_share,
        filter_kind=FILTER_OF_PLACEMENT[args.placement],
        timing=timing,
        guarantee=guarantee,
        elapsed=elapsed,
    )
    summary["no_privacy_accuracy_per_round"] = no_privacy
    summary["plan"] = plan_summary(plan)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot_rounds(
        out / "rounds.png", rounds, contributing, accuracy, args.clients, args.placement, clip_share, no_privacy
    )
    print(f"\nwrote {out / 'summary.json'}, {out / 'rounds.png'} ({elapsed:.0f} s)")
    return 0
