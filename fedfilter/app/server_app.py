"""The coordinator's ServerApp: rounds of filtered, noisy updates, a plain mean, public records only.

``app`` is what ``[tool.flwr.app.components] serverapp = "fedfilter.app.server_app:app"`` loads.
Each round it samples nodes, sends them the model, the training settings and the round request,
waits a bounded time for replies (``round-timeout-s``; the message TTL is longer, so a client
that has already spent budget is not silently discarded by Flower), checks every reply, takes the
plain mean of the valid noisy updates (``fedfilter.coordinator.strategy``), applies it with the server
learning rate, evaluates the model on the task's held-out test data and appends one
``PublicRoundRecord`` to the public ledger. Nothing per client is written anywhere.

Run config (``[tool.flwr.app.config]``, ``flwr run --run-config``; ``make_server_app(overrides)``
under ``run_simulation``, whose run config is empty): ``SERVER_DEFAULTS``, read from the app's
``pyproject.toml`` by ``fedfilter.app.config``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from logging import INFO, WARNING
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.common.logger import log
from flwr.serverapp import Grid, ServerApp

from fedfilter.app.config import app_defaults
from fedfilter.client.wire import request_proto
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.strategy import FilteredMeanStrategy
from fedfilter.protos import fedfilter_pb2

__all__ = ["app", "make_server_app", "run", "SERVER_DEFAULTS"]

# The run config and its defaults: fedfilter/app/pyproject.toml [tool.flwr.app.config], the one place.
SERVER_DEFAULTS: dict[str, Any] = app_defaults()
# Sent to every client with each train message (the ClientApp's training settings).
_TRAIN_KEYS = ("task", "num-clients", "partition", "alpha", "partition-seed", "local-epochs", "lr", "batch-size")


def server_config(run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then the run config, then ``overrides``; unknown override keys are refused."""
    unknown = sorted(set(overrides or {}) - set(SERVER_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown server setting(s) {unknown}; known: {sorted(SERVER_DEFAULTS)}.")
    merged = {**run_config, **(overrides or {})}
    out = {}
    for key, default in SERVER_DEFAULTS.items():
        value = merged.get(key, default)
        try:
            out[key] = type(default)(value)
        except (TypeError, ValueError):
            raise ValueError(f"run-config {key!r} must be a {type(default).__name__}. Found {value!r}.") from None
    return out


def _wait_for_nodes(grid: Grid, wanted: int, wait_s: float) -> list[int]:
    deadline = time.monotonic() + wait_s
    while True:
        nodes = list(grid.get_node_ids())
        if len(nodes) >= wanted or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if not nodes:
        raise RuntimeError(f"no node connected within node-wait-s={wait_s}.")
    if len(nodes) < wanted:
        log(
            WARNING,
            "fedfilter: %d of min-available-nodes=%d connected after %.0f s; going on",
            len(nodes),
            wanted,
            wait_s,
        )
    return nodes


def run(grid: Grid, context: Context, overrides: Mapping[str, Any] | None = None) -> None:
    """The coordinator's main loop (see the module docstring)."""
    import torch

    from fedfilter.app.task import evaluate, get_weights, load_task, set_weights

    cfg = server_config(context.run_config, overrides)
    run_id = cfg["run-name"] or f"flwr-{context.run_id}"
    ttl = cfg["message-ttl-s"] or 2 * cfg["round-timeout-s"] + 60.0
    if ttl <= cfg["round-timeout-s"]:
        raise ValueError(
            f"message-ttl-s={ttl} must exceed round-timeout-s={cfg['round-timeout-s']}: a "
            "shorter TTL discards replies whose clients have already spent budget."
        )
    strategy = FilteredMeanStrategy(
        noise_multiplier=cfg["noise-multiplier"],
        clip=cfg["clip"],
        placement=cfg["placement"],
        min_reports=cfg["min-reports"],
        fraction=cfg["fraction-train"],
        server_lr=cfg["server-lr"],
        ttl_s=ttl,
    )

    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    task = load_task(cfg["task"], num_clients=1)  # the coordinator needs the model and test data only
    model = task.model_fn()
    keys = list(model.state_dict().keys())
    weights = get_weights(model)
    rng = np.random.default_rng(cfg["seed"])
    train_config = {k: cfg[k] for k in _TRAIN_KEYS}

    public_config = {k: v for k, v in cfg.items() if k not in ("public-ledger", "run-name")}
    ledger = PublicLedger(cfg["public-ledger"])
    started_run = False
    try:
        ledger.start_run(run_id, public_config)
        started_run = True
        _wait_for_nodes(grid, cfg["min-available-nodes"], cfg["node-wait-s"])
        for round_id in range(1, cfg["num-rounds"] + 1):
            started = time.time()
            sampled = strategy.sample(grid.get_node_ids(), rng)
            spec = strategy.spec(run_id, round_id)
            messages = strategy.train_messages(spec, sampled, keys, weights, {**train_config, "server-round": round_id})
            replies = grid.send_and_receive(messages, timeout=cfg["round-timeout-s"])
            tally = strategy.tally(replies, sampled, keys, weights)
            released = strategy.released(tally)
            weights, aggregate_norm = strategy.step(weights, tally)

            set_weights(model, weights)
            loss, accuracy = evaluate(model, *task.test_data, loss_fn=task.loss)
            finished = time.time()
            record = fedfilter_pb2.PublicRoundRecord(
                run_id=run_id,
                round_id=round_id,
                request=request_proto(spec, local_epochs=cfg["local-epochs"], learning_rate=cfg["lr"]),
                clients_sampled=len(sampled),
                reports_received=len(tally.reports),
                markers_received=tally.markers,
                replies_dropped=tally.dropped,
                released=released,
                aggregate_norm=aggregate_norm if math.isfinite(aggregate_norm) else 0.0,
                metrics={"accuracy": float(accuracy), "loss": float(loss)},
                started_at_unix=started,
                finished_at_unix=finished,
                wall_time_s=finished - started,
            )
            ledger.append(record)
            log(
                INFO,
                "fedfilter round %d: %d sampled, %d reports, %d markers, %d dropped, released=%s, accuracy=%.4f",
                round_id,
                len(sampled),
                len(tally.reports),
                tally.markers,
                tally.dropped,
                released,
                accuracy,
            )
            for reason in sorted(set(tally.reasons)):
                log(WARNING, "fedfilter round %d: dropped a reply: %s", round_id, reason)
    finally:
        if started_run:
            ledger.finish_run(run_id)
        ledger.close()


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``overrides`` on top of the run's own (for run_simulation)."""
    server_app = ServerApp()
    fixed = dict(overrides or {})

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run(grid, context, fixed)

    return server_app


app = make_server_app()
