"""Rounds per second of a Flower simulation with ``individual_filter_mod`` and without it.

    python benchmarks/flower_overhead.py [--task both|digits|mnist] [--clients 100] [--rounds R] [--local-epochs 1]

For each task (default: both, one after the other, each in its own process) both variants run in
ONE simulation (one Ray start, the same actors, the same simulated nodes), so start-up costs and
machine load hit both alike. The tasks: ``digits`` (the digits MLP, 2,410 parameters, a few
milliseconds of training: close to the worst case for the filter's share) and ``mnist`` (the
built-in MNIST CNN, 26,010 parameters, data from ``FEDFILTER_DATA``). The ClientApp registers the
built-in train handler (local SGD) twice:

* ``train``           a plain Flower client: returns the new weights and ``num-examples``;
* ``train.filtered``  the same handler behind the device-config and filter mods (ledger per
                      device, request validation, certified clipping, durable spend, noise).

The coordinator alternates plain and filtered rounds (after ``--warmup`` untimed rounds of each:
actors import torch, load the data and, for the filtered variant, open each device's ledger once
per actor process there; a cold open costs about 5 ms, half of it the exact solve for the filter's
budget, and as Ray hands a node's message to whichever actor is free some opens still fall in timed
rounds) and times each round from sending the messages to
having aggregated the replies: for plain rounds the mean of the returned weights, for filtered
rounds the reply checks and plain mean of ``fedfilter.coordinator.strategy``. It prints both rates,
their ratio and the filter's cost per client-round. ``benchmarks/flower_stages.py`` splits that cost
into stages.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # Ray on 127.0.0.1 only, before Ray starts
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # tests/harness: drivers not shipped


def build_apps(args, devices: dict, timings: dict):
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.serverapp import ServerApp
    from harness.probe_coordinator import (
        FilteredMeanStrategy,  # tests/: rounds driven message by message
    )

    from fedfilter.app.client_app import train
    from fedfilter.client.filter_mod import individual_filter_mod
    from fedfilter.client.flower.simulated_mod import simulated_device_config_mod
    from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD

    client_app = ClientApp()
    client_app.train()(train)
    client_app.train("filtered", mods=[simulated_device_config_mod(devices), individual_filter_mod])(train)

    server_app = ServerApp()
    strategy = FilteredMeanStrategy(noise_multiplier=1.0, clip=0.5, ttl_s=3600.0)
    config = {"task": args.task, "num-clients": args.clients, "local-epochs": args.local_epochs, "lr": 0.1}

    @server_app.main()
    def main(grid, context):
        import torch

        from fedfilter.simulations.tasks.models import DigitsMLP, MnistCNN
        from fedfilter.simulations.tasks.training import get_weights

        deadline = time.monotonic() + 120
        while len(list(grid.get_node_ids())) < args.clients and time.monotonic() < deadline:
            time.sleep(0.2)
        nodes = sorted(grid.get_node_ids())
        torch.manual_seed(0)
        model = {"digits": DigitsMLP, "mnist": MnistCNN}[args.task]()
        keys, weights = list(model.state_dict().keys()), get_weights(model)

        def one_round(kind: str, round_id: int):
            nonlocal weights
            spec = strategy.spec("bench", round_id)
            model_record = ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, weights)})
            messages = []
            for node in nodes:
                content = RecordDict(
                    {ARRAYS_RECORD: model_record, "config": ConfigRecord({**config, "server-round": round_id})}
                )
                if kind == "filtered":
                    from fedfilter.protocol.wire import request_record

                    content[REQUEST_RECORD] = request_record(spec)
                messages.append(
                    Message(
                        content,
                        dst_node_id=node,
                        message_type="train" if kind == "plain" else "train.filtered",
                        group_id=str(round_id),
                        ttl=3600.0,
                    )
                )
            started = time.perf_counter()
            replies = list(grid.send_and_receive(messages, timeout=600))
            if kind == "plain":
                ok = [m for m in replies if not m.has_error()]
                new = [next(iter(m.content.array_records.values())).to_numpy_ndarrays() for m in ok]
                weights = [np.mean([n[i] for n in new], axis=0).astype(w.dtype) for i, w in enumerate(weights)]
                good = len(ok)
            else:
                tally = strategy.tally(replies, nodes, keys, weights)
                weights, _ = strategy.step(weights, tally)
                good = len(tally.reports)
            elapsed = time.perf_counter() - started
            if good != len(nodes):
                raise RuntimeError(f"{kind} round {round_id}: {good} of {len(nodes)} valid replies")
            return elapsed

        round_id = 0
        for _ in range(args.warmup):  # untimed: actors import torch, load data, open ledgers
            for kind in ("plain", "filtered"):
                round_id += 1
                one_round(kind, round_id)
        for _ in range(args.rounds):
            for kind in ("plain", "filtered"):
                round_id += 1
                timings.setdefault(kind, []).append(one_round(kind, round_id))

    return server_app, client_app


TASKS = ("digits", "mnist")
DEFAULT_ROUNDS = {"digits": 8, "mnist": 5}  # an MNIST round takes ~5x longer: fewer keep the runtime modest


def run_each_task(argv: list[str], tasks: tuple[str, ...]) -> None:
    """One child process per task (each its own Ray start), then one summary table."""
    results = []
    for task in tasks:
        out = subprocess.run(
            [sys.executable, __file__, *argv, "--task", task], check=True, stdout=subprocess.PIPE, text=True
        ).stdout
        print(out, end="", flush=True)
        results.append(json.loads(out.strip().splitlines()[-1]))
    print("\nsummary: ms per client-round = (median filtered - median plain round) x actors / clients")
    print(f"{'task':>8}  {'plain r/s':>9}  {'filtered r/s':>12}  {'ratio':>6}  {'ms/client-round':>15}")
    for r in results:
        print(
            f"{r['task']:>8}  {r['rounds_per_s']['plain']:>9.3f}  {r['rounds_per_s']['filtered']:>12.3f}  "
            f"{r['ratio']:>6.3f}  {r['ms_per_client_round']:>15.2f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=(*TASKS, "both"), default="both")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument(
        "--rounds", type=int, default=None, help="timed rounds of each kind (default: 8 digits, 5 mnist)"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds of each kind first (default 2)")
    parser.add_argument("--local-epochs", type=int, default=1)
    parser.add_argument(
        "--ledger-root",
        default=None,
        help="where the devices' ledgers live (default: $TMPDIR); /dev/shm (no fsync cost) isolates the CPU work",
    )
    args = parser.parse_args()
    if args.task == "both":
        argv = list(sys.argv[1:])
        if "--task" in argv:
            del argv[argv.index("--task") : argv.index("--task") + 2]
        run_each_task([a for a in argv if not a.startswith("--task=")], TASKS)
        return
    if args.rounds is None:
        args.rounds = DEFAULT_ROUNDS[args.task]

    import flwr
    import torch
    from flwr.simulation import run_simulation

    with tempfile.TemporaryDirectory(prefix="fedfilter-bench-", dir=args.ledger_root) as tmp:
        devices = {
            i: {
                "ledger-dir": str(Path(tmp) / "devices" / str(i)),
                "client-id": f"client-{i}",
                "budget-epsilon": 1000.0,
                "reply-hold-s": 0,
            }  # no timing hold: measures the filter
            for i in range(args.clients)
        }
        from fedfilter.client.settings.node_config import enrol_device

        for device in devices.values():
            enrol_device(device)  # the owner's act, up front: the mod never enrols
        timings: dict[str, list[float]] = {}
        server_app, client_app = build_apps(args, devices, timings)
        started = time.perf_counter()
        run_simulation(
            server_app=server_app,
            client_app=client_app,
            num_supernodes=args.clients,
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}},
        )
        total = time.perf_counter() - started

    rate = {k: len(v) / sum(v) for k, v in timings.items()}
    print()
    print(
        f"Flower {flwr.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs; {args.clients} clients, task {args.task}, {args.local_epochs} local epoch(s), "
        f"{args.warmup} warm-up + {args.rounds} timed rounds of each kind, interleaved, in one simulation "
        f"({total:.0f} s in all); ledgers in {args.ledger_root or tempfile.gettempdir()}"
    )
    print(f"{'variant':>10}  {'rounds/s':>8}  {'median s/round':>14}  {'min':>6}  {'max':>6}")
    for kind in ("plain", "filtered"):
        t = timings[kind]
        print(f"{kind:>10}  {rate[kind]:>8.3f}  {statistics.median(t):>14.3f}  {min(t):>6.3f}  {max(t):>6.3f}")
    ratio = rate["filtered"] / rate["plain"]
    print(f"ratio filtered/plain rounds per second: {ratio:.3f} (overhead {100 * (1 / ratio - 1):.1f}% per round)")
    # The filter's own cost per client and round: the extra round time, times the Ray actors that
    # share the clients (one per CPU: one CPU per client), spread over the clients.
    extra_s = statistics.median(timings["filtered"]) - statistics.median(timings["plain"])
    ms_per_client = 1000 * extra_s * (os.cpu_count() or 1) / args.clients
    print(f"filter cost per client-round (median rounds, actor time): {ms_per_client:.2f} ms")
    print(
        json.dumps(
            {
                "task": args.task,
                "ms_per_client_round": ms_per_client,
                "clients": args.clients,
                "rounds": args.rounds,
                "warmup": args.warmup,
                "rounds_per_s": rate,
                "ratio": ratio,
                "seconds_per_round": timings,
            }
        )
    )


if __name__ == "__main__":
    main()
