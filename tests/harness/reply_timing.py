"""The reply-timing harness: the built-in ClientApp driven in process for three devices, and the
statistics that tell two samples of reply times apart (``benchmarks/reply_timing.py`` prints them;
tests/client/flower/test_reply_timing.py runs a short version).

``measure(app, replies, holds)`` hands hand-built train Messages to the built-in ClientApp as a SuperNode
would, for a ``large``, a ``small`` and an ``exhausted`` device with their own ledgers, one phase per
reply hold, and returns each comparison (``compare``: medians, the Mann-Whitney U p-value and
``best_threshold_accuracy``, the accuracy of the best one-threshold classifier) with the samples.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from flwr.app import RecordDict
    from flwr.clientapp import ClientApp

TASK: dict[str, int | float | str] = {
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
    state: RecordDict
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
    # A delivered message, as a SuperNode hands it on (flwr's stubs type only the public constructors).
    return Message(content=content, metadata=meta)  # type: ignore[call-overload]


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
    app: ClientApp,
    replies: int,
    holds: list[float],
    *,
    local_epochs: int = 2,
    seed: int = 0,
    root: Path | None = None,
) -> dict:
    """Run every phase (one per hold, 0 = off) through ``app`` and return the comparisons (module doc).

    ``app`` is the deployed ClientApp (``fedfilter.app.client_app.make_client_app()``; device settings
    come from node_config only): the caller builds it, so this harness stays below the app layer.
    """
    from flwr.app import RecordDict

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
