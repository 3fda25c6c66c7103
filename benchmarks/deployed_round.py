"""A deployed round before and after the device's own runtime, against the training inside it.

    python benchmarks/deployed_round.py [--clients 3] [--rounds 4] [--out DIR]

Runs the built-in app on the digits task twice through ``fedfilter deploy-local`` (TLS, SuperNode
authentication, local placement, reply hold off), each on a fresh local deployment:

* ``flower``:    Flower's plain ``flower-supernode`` (before): a fresh ``flwr-clientapp`` process per
                 message (torch import, data load, ledger open every round; no approval check);
* ``fedfilter``: the owner's command ``fedfilter supernode`` (after): the approved app stays loaded
                 in the run's worker between messages.

A round's time is the coordinator's own (the public ledger's ``wall_time_s``: from sending the round
to having aggregated the replies). The training inside it is measured in this process: the built-in
train handler on each device's partition with the same settings, after one untimed call (imports and
data load), the slowest device counted (the round waits for it). Printed per variant: the first round
(cold in both variants) and the mean of the later rounds, each with its ratio to the training and the
seconds above it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def training_seconds(clients: int, repeats: int = 3, *, filtered: bool = False) -> float:
    """The slowest device's time in the built-in train handler (warm), as a deployed device runs it;
    ``filtered``: through the device's own mods (``device_handler``: the filter, a durable spend on a
    ledger in a temporary directory), i.e. everything a warm message costs but Flower's transport."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, RecordDict

    from fedfilter.app.client_app import train
    from fedfilter.app.config import app_defaults
    from fedfilter.app.task import get_weights, load_task

    defaults = app_defaults()
    task = load_task(defaults["task"], clients, defaults["partition"], defaults["alpha"], defaults["partition-seed"])
    model = task.model_fn()
    keys = list(model.state_dict().keys())
    arrays = ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, get_weights(model))})
    config = ConfigRecord({"server-round": 1})
    handler = train
    if filtered:
        from fedfilter.app.client_app import app
        from fedfilter.client.runtime.app import device_handler

        handler = device_handler(app, secure_aggregation=False)
    ledgers = Path(tempfile.mkdtemp(prefix="deployed-round-ledgers-"))
    worst = 0.0
    for pid in range(clients):
        node_config = {"partition-id": pid, "num-partitions": clients}
        if filtered:
            from fedfilter.client.settings.node_config import enrol_device

            node_config.update(
                {
                    "ledger-dir": str(ledgers / str(pid)),
                    "client-id": f"d{pid}",
                    "budget-epsilon": 64.0,
                    "reply-hold-s": 0,
                }
            )
            enrol_device(node_config)
        context = Context(run_id=1, node_id=pid, node_config=node_config, state=RecordDict(), run_config={})
        times = []
        for attempt in range(repeats + 1):
            meta = Metadata(
                run_id=1,
                message_id=f"m{pid}-{attempt}",
                src_node_id=0,
                dst_node_id=pid,
                reply_to_message_id="",
                group_id="1",
                created_at=time.time(),
                ttl=3600.0,
                message_type="train",
            )
            content = RecordDict({"arrays": arrays, "config": config})
            if filtered:
                from fedfilter.protocol.request import RoundSpec
                from fedfilter.protocol.wire import REQUEST_RECORD, request_record

                spec = RoundSpec(run_id="bench", round_id=attempt + 1, noise_multiplier=0.5, clip=0.4)
                content[REQUEST_RECORD] = request_record(spec)
            msg = Message(content=content, metadata=meta)
            started = time.perf_counter()
            handler(msg, context)
            if attempt:  # the first call imports torch and loads the data
                times.append(time.perf_counter() - started)
        worst = max(worst, statistics.median(times))
    return worst


_TASK = re.compile(r"fedfilter device: task \S+ in ([0-9.]+) s")


def device_task_seconds(out: Path) -> list[float]:
    """Each message's time inside the device's runtime (pull, approval, app and filter, push), from
    the devices' own logs (the ``fedfilter`` variant only)."""
    found = []
    for log in sorted((out / "logs").glob("supernode-device-*.log")):
        found += [float(x) for x in _TASK.findall(log.read_text(errors="replace"))]
    return found


def deployed_rounds(variant: str, out: Path, clients: int, rounds: int) -> list[float]:
    from fedfilter.coordinator.public_ledger import PublicLedger
    from fedfilter.deploy.command import PUBLIC_LEDGER_FILE, DeployOptions, deploy_local

    lines: list[str] = []
    code = deploy_local(
        DeployOptions(
            clients=clients,
            rounds=rounds,
            out=out,
            budgets=(64.0,),  # every round a contributing round
            reply_hold_s=0.0,
            device_runtime=variant == "fedfilter",
            timeout_s=900.0,
            connect_timeout_s=120.0,
        ),
        echo=lines.append,
    )
    if code != 0:
        raise SystemExit(f"{variant}: deploy-local failed:\n" + "\n".join(lines[-20:]))
    summary = json.loads((out / "summary.json").read_text())
    with PublicLedger(out / PUBLIC_LEDGER_FILE, read_only=True) as ledger:
        return [float(r.wall_time_s) for r in ledger.records(summary["run_id"])]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--variants", default="flower,fedfilter", help="which to run (default both; '' = only the in-process timings)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where the deployments write (default: a temp dir)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    root = args.out or Path(tempfile.mkdtemp(prefix="deployed-round-"))
    root.mkdir(parents=True, exist_ok=True)
    training = training_seconds(args.clients)
    filtered = training_seconds(args.clients, filtered=True)
    results = {
        "clients": args.clients,
        "rounds": args.rounds,
        "training_s": training,
        "filtered_in_process_s": filtered,
        "cpus": os.cpu_count(),
        "load_average": os.getloadavg()[0],
    }
    print(f"training inside a round (slowest of {args.clients} devices, warm): {training:.3f} s")
    print(f"the same through the device's filter, in one process (no Flower transport): {filtered:.3f} s")
    for variant in [v for v in args.variants.split(",") if v]:
        walls = deployed_rounds(variant, root / variant, args.clients, args.rounds)
        later = statistics.mean(walls[1:]) if len(walls) > 1 else float("nan")
        results[variant] = {"round_wall_s": walls, "first_s": walls[0], "later_mean_s": later}
        tasks = device_task_seconds(root / variant)
        if tasks:
            results[variant]["device_task_s"] = tasks
            print(
                f"{variant:9s}: time inside the device's runtime per message: first {max(tasks):.2f} s, "
                f"median {statistics.median(tasks):.3f} s ({len(tasks)} messages)"
            )
        print(
            f"{variant:9s}: round 1 {walls[0]:6.2f} s ({walls[0] / training:5.1f} x training, "
            f"+{walls[0] - training:5.2f} s); rounds 2-{len(walls)} mean {later:6.2f} s "
            f"({later / training:5.1f} x training, +{later - training:5.2f} s)"
        )
    results["machine"] = f"{platform.machine()} {platform.python_version()}"
    (root / "deployed_round.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"written to {root / 'deployed_round.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
