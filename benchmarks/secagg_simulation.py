"""Distributed rounds of the built-in app through Flower's Simulation Engine (Ray) at scale: wall time, memory.

    python benchmarks/secagg_simulation.py [--clients 1000] [--rounds 1] [--min-reports 100] [--out out/secagg_sim]

Where: ``flwr run`` of the built-in app (``fedfilter/app``) on a SuperLink in simulation mode on
127.0.0.1 (``fedfilter.deploy.simulation_link.SimulationLink``; Ray on 127.0.0.1, ``num_cpus = 1`` per
simulated device), ``placement = "distributed"``: every round is Flower's SecAgg+ with fedfilter's
primitives on both sides, on the neighbourhood graph the coordinator ships by default
(``coordinator.secure_round.round_graph``), each device running ``[secure_aggregation_mod,
individual_filter_mod]`` with its own enrolled ledger (rdp filter, Skellam shares on the grid).

Printed: the run's wall time, each round's wall time, sampled / reports in the sum / released (from
the public ledger), how many devices' ledgers hold a contributed distributed record per round, and
the peak memory (proportional set size) of this process and everything it started (SuperLink,
ServerApp, Ray's processes), sampled every second from /proc.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import threading
import time
from pathlib import Path


def _tree_pss_mib(root_pid: int) -> float:
    """Proportional set size (shared pages split between their users) of ``root_pid`` and all its
    descendants, in MiB (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    total_kib, stack = 0, [root_pid]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total_kib += next((int(line.split()[1]) for line in f if line.startswith("Pss:")), 0)
        except (OSError, ValueError):
            continue
    return total_kib / 1024


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--min-reports", type=int, default=100, help="default: 100, the devices' max-min-reports")
    parser.add_argument("--out", type=Path, default=Path("out/secagg_sim"))
    parser.add_argument("--timeout", type=float, default=7200.0)
    args = parser.parse_args(argv)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only

    from fedfilter.client.ledger.budget import BudgetLedger
    from fedfilter.client.settings.node_config import enrol_device
    from fedfilter.client.settings.simulated import write_device_settings
    from fedfilter.coordinator.public_ledger import PublicLedger
    from fedfilter.coordinator.secagg.secure_round import round_graph
    from fedfilter.deploy.command import BUILTIN_APP_DIR
    from fedfilter.deploy.simulation_link import SimulationLink

    n, root = args.clients, args.out.resolve()
    if root.exists() and any(root.iterdir()):
        raise SystemExit(f"--out {root} is not empty: choose a new directory.")
    root.mkdir(parents=True, exist_ok=True)
    graph = round_graph(n, args.min_reports)
    print(
        f"# {platform.node()}, {os.cpu_count()} CPUs, python {platform.python_version()}; {n} simulated devices, "
        f"min-reports {args.min_reports}, SecAgg+ graph k={graph.num_shares} t={graph.threshold} "
        f"(abort probability <= {graph.abort_probability:.3g} per round at the assumed drop-outs)",
        flush=True,
    )
    started = time.perf_counter()
    devices = {}
    for i in range(n):
        devices[i] = {
            "ledger-dir": str(root / "devices" / str(i)),
            "client-id": f"client-{i}",
            "budget-epsilon": 1000.0,  # never exhausted here: every device contributes every round
            "budget-delta": 1e-5,
            "filter": "rdp",
            "after-exhaustion": "leave",
            "reply-hold-s": 0,  # timing protection off: Ray actors serve many devices
        }
        enrol_device(devices[i])
    enrol_s = time.perf_counter() - started
    settings = write_device_settings(root / "device-settings.json", devices)
    ledger_path = root / "public.sqlite"
    run_config = {
        "run-name": "secagg-scale",
        "num-rounds": args.rounds,
        "min-available-nodes": n,
        "node-wait-s": 600.0,
        "placement": "distributed",
        "min-reports": args.min_reports,
        "noise-multiplier": 1.0,
        "clip": 0.4,
        "local-epochs": 1,
        "num-clients": n,
        "round-timeout-s": args.timeout,
        "public-ledger": str(ledger_path),
    }
    peak = {"mib": 0.0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            peak["mib"] = max(peak["mib"], _tree_pss_mib(os.getpid()))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    run_started = time.perf_counter()
    try:
        with SimulationLink(root / "flower", num_supernodes=n, device_settings=settings) as link:
            result = link.run_app(BUILTIN_APP_DIR, run_config=run_config, timeout=args.timeout)
    finally:
        stop.set()
        sampler.join()
    run_s = time.perf_counter() - run_started
    if not result.ok:
        print(result.status, result.details, result.output[-3000:], file=sys.stderr)
        return 1
    with PublicLedger(ledger_path, read_only=True) as ledger:
        records = ledger.records("secagg-scale")
        (run,) = ledger.runs()
    contributed = [0] * args.rounds
    for cfg in devices.values():
        dev = BudgetLedger.open(cfg["ledger-dir"])
        try:
            for r in dev.records("secagg-scale"):
                if r.placement == "distributed" and r.status == "contributed":
                    contributed[r.round_id - 1] += 1
        finally:
            dev.close()
    rows = []
    print("| round | sampled | reports in the sum | released | devices charged | round wall s |")
    print("|---:|---:|---:|---|---:|---:|")
    for r in records:
        wall = getattr(r, "wall_time_s", float("nan"))
        rows.append(
            {
                "round": r.round_id,
                "sampled": r.clients_sampled,
                "reports": r.reports_received,
                "released": r.released,
                "devices_charged": contributed[r.round_id - 1],
                "wall_s": wall,
            }
        )
        print(
            f"| {r.round_id} | {r.clients_sampled} | {r.reports_received} | {'yes' if r.released else 'no'} | "
            f"{contributed[r.round_id - 1]} | {wall:.1f} |"
        )
    summary = {
        "clients": n,
        "min_reports": args.min_reports,
        "num_shares": graph.num_shares,
        "threshold": graph.threshold,
        "abort_probability": graph.abort_probability,
        "enrol_s": enrol_s,
        "flwr_run_s": run_s,
        "run_wall_time_s": getattr(run, "wall_time_s", math.nan),
        "peak_pss_mib": peak["mib"],
        "rounds": rows,
        "load_average_end": os.getloadavg()[0],
    }
    print(
        f"# enrolment {enrol_s:.0f} s; flwr run {run_s:.0f} s; peak memory (PSS, this process and all it started) "
        f"{peak['mib']:.0f} MiB; load average {os.getloadavg()[0]:.1f} at the end"
    )
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
