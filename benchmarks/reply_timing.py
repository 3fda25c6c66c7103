"""Can a coordinator tell a device's budget state or data size from when its reply arrives?

    python benchmarks/reply_timing.py [--replies 200] [--hold 0.1] [--local-epochs 2] [--json FILE]

Drives the built-in ClientApp (``fedfilter.app.client_app.make_client_app()``: the real
``individual_filter_mod`` around the real digits train handler) directly with hand-built train
Messages, as a SuperNode would, for three devices with their own ledgers:

* ``large``      partition 9 of digits (Dirichlet alpha 0.5, 10 clients): 203 examples, budget left;
* ``small``      partition 8: 65 examples, budget left;
* ``exhausted``  partition 9 again (the same data as ``large``), budget spent in a warm-up round,
                 so it answers with pure noise (``noise-only``).

Two comparisons: budget state (``large`` contributing vs ``exhausted`` noise-only) and data size
(``small`` vs ``large``). Each is measured on two observables: the reply time (from handing the
message to the app to getting the reply back) and the reply's own ``metadata.created_at`` minus
the request's. Replies are interleaved in a random order per step, so machine load hits every
device alike; the phase with ``reply-hold-s = 0`` (off) runs first, then the one with the hold.

For each comparison: medians, the two-sided Mann-Whitney U p-value (scipy.stats), and the
accuracy of the best one-threshold classifier (the best cut of the pooled sample, either
direction; 50 % is chance). The hold passes when p > 0.01 and the accuracy stays below 60 %.
Under no difference, with 200 replies per device the best cut reaches 58 % in about 1 run of
100 (Kolmogorov-Smirnov: the best cut's accuracy is 0.5 + D/2).

The script checks what it claims: every reply is a "report" of the model's shapes and dtypes,
and each device's ledger says it contributed (or, ``exhausted``, sent noise) in every timed round.
Exit code 1 if the hold fails the criterion.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout

TASK = {
    "task": "digits",
    "num-clients": 10,
    "partition": "dirichlet",
    "alpha": 0.5,
    "partition-seed": 0,
    "lr": 0.1,
    "batch-size": 32,
}
# device -> (partition, budget epsilon); partition sizes of TASK: 8 -> 65 examples, 9 -> 203.
DEVICES = {"large": (9, 100.0), "small": (8, 100.0), "exhausted": (9, 0.5)}
COMPARISONS = (("budget state", "large", "exhausted"), ("data size", "small", "large"))
NOISE_MULTIPLIER, CLIP = 5.0, 0.4  # about 0.04 of mu^2 a round: 100 eps lasts thousands of rounds
P_MIN, ACCURACY_MAX = 0.01, 0.60


# --- statistics --------------------------------------------------------------------------------
def best_threshold_accuracy(a, b) -> tuple[float, float]:
    """Accuracy of the best rule "x <= t is a, else b" (or the reverse) over the pooled sample.

    Returns (accuracy, t). Ties stay together: a cut falls only between distinct values.
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    values = np.concatenate([a, b])
    is_a = np.concatenate([np.ones(a.size), np.zeros(b.size)])
    order = np.argsort(values, kind="stable")
    values, is_a = values[order], is_a[order]
    cuts = np.flatnonzero(np.diff(values) > 0)  # cut after index i
    a_below = np.cumsum(is_a)[cuts]
    b_below = (cuts + 1) - a_below
    correct = np.concatenate(
        [
            [max(a.size, b.size)],  # no cut: everything one class
            a_below + (b.size - b_below),
            b_below + (a.size - a_below),
        ]
    )
    best = int(np.argmax(correct))
    threshold = np.nan if best == 0 else float(values[cuts[(best - 1) % cuts.size]])
    return float(correct[best] / values.size), threshold


def compare(a, b) -> dict:
    from scipy.stats import mannwhitneyu

    accuracy, threshold = best_threshold_accuracy(a, b)
    return {
        "median_a_ms": 1e3 * float(np.median(a)),
        "median_b_ms": 1e3 * float(np.median(b)),
        "p": float(mannwhitneyu(a, b, alternative="two-sided").pvalue),
        "accuracy": accuracy,
        "threshold_ms": 1e3 * threshold,
    }


# --- driving the real ClientApp ------------------------------------------------------------------
@dataclass
class Device:
    name: str
    node_config: dict
    state: object
    round_id: int = 0
    times: list = field(default_factory=list)
    created: list = field(default_factory=list)


def _model():
    import torch

    from fedfilter.simulations.tasks.registry import load_task
    from fedfilter.simulations.tasks.training import get_weights

    torch.manual_seed(0)
    model = load_task("digits", num_clients=1).model_fn()
    return list(model.state_dict().keys()), get_weights(model)


def _train_message(device: Device, keys, weights, *, z: float, local_epochs: int):
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, Metadata, RecordDict

    from fedfilter.protocol.request import RoundSpec
    from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record

    device.round_id += 1
    spec = RoundSpec(run_id=f"timing-{device.name}", round_id=device.round_id, noise_multiplier=z, clip=CLIP)
    content = RecordDict(
        {
            ARRAYS_RECORD: ArrayRecord({k: Array(w) for k, w in zip(keys, weights)}),
            "config": ConfigRecord({**TASK, "local-epochs": local_epochs, "server-round": device.round_id}),
            REQUEST_RECORD: request_record(spec),
        }
    )
    meta = Metadata(
        run_id=1,
        message_id=f"{device.name}-{device.round_id}",
        src_node_id=1,
        dst_node_id=2,
        reply_to_message_id="",
        group_id=str(device.round_id),
        created_at=time.time(),
        ttl=3600.0,
        message_type="train",
    )
    return Message(content=content, metadata=meta)


def _ask(
    app,
    device: Device,
    keys,
    weights,
    *,
    hold: float,
    local_epochs: int,
    z: float = NOISE_MULTIPLIER,
    timed: bool = True,
) -> None:
    from flwr.app import Context

    from fedfilter.protocol.wire import STATUS_RECORD

    device.node_config["reply-hold-s"] = hold
    ctx = Context(run_id=1, node_id=2, node_config=device.node_config, state=device.state, run_config={})
    msg = _train_message(device, keys, weights, z=z, local_epochs=local_epochs)
    started = time.perf_counter()
    reply = app(msg, ctx)
    elapsed = time.perf_counter() - started
    if reply.has_error() or reply.content[STATUS_RECORD]["status"] != "report":
        raise RuntimeError(
            f"{device.name} round {device.round_id}: expected a report, got "
            f"{reply.error.reason if reply.has_error() else dict(reply.content[STATUS_RECORD])}"
        )
    out = next(iter(reply.content.array_records.values())).to_numpy_ndarrays()
    if [(a.shape, a.dtype) for a in out] != [(w.shape, w.dtype) for w in weights]:
        raise RuntimeError(f"{device.name}: the reply's arrays differ from the model's shapes/dtypes")
    if timed:
        device.times.append(elapsed)
        device.created.append(reply.metadata.created_at - msg.metadata.created_at)


def _check_ledgers(devices: dict, timed_from: dict) -> None:
    from fedfilter.client.ledger.budget import BudgetLedger

    want = {"large": "contributed", "small": "contributed", "exhausted": "noise-only"}
    for name, device in devices.items():
        ledger = BudgetLedger.open(device.node_config["ledger-dir"])
        try:
            statuses = {r.status for r in ledger.records() if r.round_id >= timed_from[name]}
        finally:
            ledger.close()
        if statuses != {want[name]}:
            raise RuntimeError(
                f"device {name}: ledger statuses of the timed rounds are {statuses}, expected only {want[name]!r}"
            )


def measure(
    replies: int, holds: list[float], *, local_epochs: int = 2, seed: int = 0, root: Path | None = None
) -> dict:
    """Run every phase (one per hold, 0 = off) and return the comparisons (see module doc)."""
    from flwr.app import RecordDict

    from fedfilter.app.client_app import make_client_app

    app = make_client_app()  # the deployed ClientApp: device settings come from node_config only
    keys, weights = _model()
    rng = np.random.default_rng(seed)
    with tempfile.TemporaryDirectory(prefix="fedfilter-timing-", dir=root) as tmp:
        devices = {
            name: Device(
                name,
                {
                    "partition-id": pid,
                    "num-partitions": TASK["num-clients"],
                    "ledger-dir": str(Path(tmp) / name),
                    "client-id": name,
                    "budget-epsilon": eps,
                    "budget-delta": 1e-5,
                },
                RecordDict(),
            )
            for name, (pid, eps) in DEVICES.items()
        }
        from fedfilter.client.settings.node_config import enrol_device

        for device in devices.values():
            enrol_device(device.node_config)  # the owner's act, up front: the mod never enrols
        # Warm-up, untimed: torch, the data, each ledger; one full-norm round at z = 0.5 (mu 2)
        # spends the 0.5-epsilon budget of "exhausted".
        for name, device in devices.items():
            _ask(
                app,
                device,
                keys,
                weights,
                hold=0,
                local_epochs=local_epochs,
                z=0.5 if name == "exhausted" else NOISE_MULTIPLIER,
                timed=False,
            )
            _ask(app, device, keys, weights, hold=0, local_epochs=local_epochs, timed=False)
        phases = []
        for hold in holds:
            timed_from = {name: d.round_id + 1 for name, d in devices.items()}
            for d in devices.values():
                d.times, d.created = [], []
            started = time.monotonic()
            for _ in range(replies):
                for name in rng.permutation(list(devices)):
                    _ask(app, devices[name], keys, weights, hold=hold, local_epochs=local_epochs)
            _check_ledgers(devices, timed_from)
            rows = []
            for label, a, b in COMPARISONS:
                for observable in ("times", "created"):
                    row = compare(getattr(devices[a], observable), getattr(devices[b], observable))
                    rows.append(
                        {
                            "comparison": label,
                            "a": a,
                            "b": b,
                            "observable": "reply time" if observable == "times" else "created_at",
                            **row,
                        }
                    )
            overruns = {
                name: int(sum(t >= 2 * hold for t in d.times)) if hold > 0 else None for name, d in devices.items()
            }
            phases.append(
                {
                    "hold_s": hold,
                    "rows": rows,
                    "overruns": overruns,
                    "seconds": round(time.monotonic() - started, 1),
                    "samples": {name: {"times": d.times, "created": d.created} for name, d in devices.items()},
                }
            )
    return {"replies": replies, "local_epochs": local_epochs, "phases": phases}


def passes(row: dict) -> bool:
    return row["p"] > P_MIN and row["accuracy"] < ACCURACY_MAX


def report(result: dict) -> str:
    lines = []
    for phase in result["phases"]:
        hold = phase["hold_s"]
        head = f"hold {hold:g} s" if hold > 0 else "hold off (reply-hold-s = 0)"
        lines.append(
            f"{head}: {result['replies']} replies per device, local-epochs "
            f"{result['local_epochs']}, {phase['seconds']:g} s"
            + (f", overruns (replies >= 2 x hold) {phase['overruns']}" if hold > 0 else "")
        )
        lines.append(
            f"  {'comparison':<13} {'observable':<11} {'median a ms':>14} {'median b ms':>14} "
            f"{'MW p':>9} {'best cut':>9} {'at ms':>9}  verdict"
        )
        for r in phase["rows"]:
            verdict = "no detectable difference" if passes(r) else "LEAKS"
            lines.append(
                f"  {r['comparison']:<13} {r['observable']:<11} "
                f"{r['a'] + ' ' + format(r['median_a_ms'], '.2f'):>14} "
                f"{r['b'] + ' ' + format(r['median_b_ms'], '.2f'):>14} {r['p']:>9.2g} "
                f"{100 * r['accuracy']:>8.1f}% {r['threshold_ms']:>9.2f}  {verdict}"
            )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replies", type=int, default=200, help="timed replies per device and phase")
    parser.add_argument("--hold", type=float, default=0.1, help="reply-hold-s of the protected phase")
    parser.add_argument("--local-epochs", type=int, default=2, help="the coordinator's local-epochs")
    parser.add_argument("--seed", type=int, default=0, help="seed of the interleaving order")
    parser.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = parser.parse_args(argv)
    if args.replies < 3 or not args.hold > 0 or args.local_epochs < 1:
        parser.error(
            f"need --replies >= 3, --hold > 0, --local-epochs >= 1. Found {args.replies}, "
            f"{args.hold}, {args.local_epochs}."
        )
    import flwr
    import torch

    logging.getLogger("fedfilter.client").setLevel(logging.ERROR)  # overruns are counted instead
    started = time.monotonic()
    result = measure(args.replies, [0.0, args.hold], local_epochs=args.local_epochs, seed=args.seed)
    print(
        f"Flower {flwr.__version__}, torch {torch.__version__}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; built-in ClientApp (digits MLP), "
        f"{time.monotonic() - started:.0f} s in all"
    )
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    held = [r for p in result["phases"] if p["hold_s"] > 0 for r in p["rows"]]
    return 0 if all(passes(r) for r in held) else 1


if __name__ == "__main__":
    raise SystemExit(main())
