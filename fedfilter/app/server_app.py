"""The coordinator's ServerApp: Flower's strategy loop behind ``IndividualFilterStrategy``.

``app`` is what ``[tool.flwr.app.components] serverapp = "fedfilter.app.server_app:app"`` loads.
As in Flower's templates, ``run`` reads the run config, builds the model and held-out test data
(``fedfilter.app.task``), picks the inner strategy (``FedAvg``; ``FedAvgM`` with its server learning
rate when ``server-lr`` is not 1, without momentum: ``w + server-lr * mean``), wraps it in
``fedfilter.coordinator.strategy.IndividualFilterStrategy`` and calls ``strategy.start``: per round
the wrapper adds the round request, checks every reply, hands the inner strategy the plain mean of
the valid noisy updates (in ``distributed`` placement, the only distributed path: runs the round
through Flower's SecAgg+ and releases the mean of the unmasked sum only,
``fedfilter.coordinator.secagg.secure_round``), and appends one ``PublicRoundRecord`` (with the server-side
evaluation on the task's test data) to the public ledger. Nothing per client is written anywhere.

Messages live longer than a round (``message-ttl-s`` > ``round-timeout-s``), so Flower does not
silently discard the replies of clients that have already spent budget.

Run config (``[tool.flwr.app.config]``, ``flwr run --run-config``; ``make_server_app(overrides)``
under ``run_simulation``, whose run config is empty): ``SERVER_DEFAULTS``, read from the app's
``pyproject.toml`` by ``fedfilter.app.config``.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, MetricRecord
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fedfilter.app.config import TRAIN_KEYS, app_defaults, resolve_config
from fedfilter.checks import positive_finite
from fedfilter.coordinator.secagg.secure_round import check_num_shares
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.flower_api import log
from fedfilter.protocol.rules import check_message_ttl, reconstruction_threshold, run_id_for

__all__ = ["app", "make_server_app", "run", "SERVER_DEFAULTS", "server_config", "inner_strategy"]

# The run config and its defaults: fedfilter/app/pyproject.toml [tool.flwr.app.config], the one place.
SERVER_DEFAULTS: dict[str, Any] = app_defaults()


def server_config(run_config: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Defaults, then the run config, then ``overrides``, typed as the ClientApp types them.

    ``fedfilter.app.config.resolve_config``: a key the app does not know, or a value of another
    type than its default's (``"3"`` for an int), is refused naming the key and the value.

    Parameters
    ----------
    run_config : Mapping
        Flower's ``context.run_config``.
    overrides : Mapping, optional
        Set by ``make_server_app`` (under ``run_simulation``).

    Returns
    -------
    dict
        The whole typed run config.

    Examples
    --------
    >>> cfg = server_config({"num-rounds": 3}, {"server-lr": 2})
    >>> cfg["num-rounds"], cfg["server-lr"]
    (3, 2.0)
    """
    return resolve_config(run_config, overrides or {})


def _wait_for_nodes(grid: Grid, wanted: int, wait_s: float) -> int:
    """How many nodes the inner strategy should wait for: ``wanted``, or those connected after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        connected = len(list(grid.get_node_ids()))
        if connected >= wanted or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    if connected == 0:
        raise RuntimeError(f"no node connected within node-wait-s={wait_s}.")
    if connected < wanted:
        message = "fedfilter: %d of min-available-nodes=%d connected after %.0f s; going on"
        log(WARNING, message, connected, wanted, wait_s)
    return min(connected, wanted)


def inner_strategy(cfg: Mapping[str, Any], min_available_nodes: int) -> FedAvg:
    """The Flower strategy the filter wraps: FedAvg, or FedAvgM's server learning rate without momentum.

    In distributed placement every round samples at least ``min-reports`` nodes (and 2, SecAgg+'s
    minimum) when that many are connected: a smaller sample can never be released.

    Parameters
    ----------
    cfg : Mapping
        The run config (``server_config``).
    min_available_nodes : int
        The nodes the strategy waits for.

    Returns
    -------
    flwr.serverapp.strategy.FedAvg
        ``FedAvg`` when ``server-lr`` is 1, else ``FedAvgM`` with momentum 0.

    Examples
    --------
    >>> type(inner_strategy(server_config({}), 10)).__name__
    'FedAvg'
    >>> type(inner_strategy(server_config({"server-lr": 2.0}), 10)).__name__
    'FedAvgM'
    """
    min_train = 1
    if cfg["placement"] == "distributed":
        needed = reconstruction_threshold(cfg["min-reports"]) + cfg["secagg-colluders"]
        min_train = min(needed, min_available_nodes)
        if min_train < cfg["min-reports"]:
            message = "fedfilter: %d nodes connected, fewer than min-reports=%d: no distributed round can be released"
            log(WARNING, message, min_available_nodes, cfg["min-reports"])
    common = dict(
        fraction_train=cfg["fraction-train"],
        fraction_evaluate=0.0,  # client-side evaluation is refused (IndividualFilterStrategy.configure_evaluate)
        min_train_nodes=min_train,
        min_evaluate_nodes=0,
        min_available_nodes=min_available_nodes,
    )
    if cfg["server-lr"] == 1.0:
        return FedAvg(**common)
    return FedAvgM(**common, server_learning_rate=cfg["server-lr"], server_momentum=0.0)


def run(grid: Grid, context: Context, overrides: Mapping[str, Any] | None = None) -> None:
    """Build the model, the inner strategy and the filter wrapper, then run Flower's loop.

    Parameters
    ----------
    grid : flwr.serverapp.Grid
        Flower's grid of the run.
    context : flwr.app.Context
        The ServerApp's context (its ``run_config``).
    overrides : Mapping, optional
        Run-config values on top of the run's own.

    Examples
    --------
    Flower calls it through ``app``; it needs a running SuperLink and its nodes:

    >>> run(grid, context, {"num-rounds": 3})  # doctest: +SKIP
    """
    import torch

    from fedfilter.app.task import evaluate, get_weights, load_task, set_weights

    cfg = server_config(context.run_config, overrides)
    if not (0 < cfg["fraction-train"] <= 1):
        raise ValueError(f"run-config 'fraction-train' must be in (0, 1]. Found {cfg['fraction-train']!r}.")
    if (problem := positive_finite("run-config 'server-lr'", cfg["server-lr"])) is not None:
        raise ValueError(problem)
    ttl = cfg["message-ttl-s"] or 2 * cfg["round-timeout-s"] + 60.0
    try:
        check_message_ttl(ttl, cfg["round-timeout-s"])
    except ValueError as err:
        raise ValueError(f"run-config 'message-ttl-s' / 'round-timeout-s': {err}") from None

    if cfg["placement"] == "distributed":
        try:  # before any node is waited for or model built
            check_num_shares(cfg["num-shares"], cfg["min-reports"])
        except ValueError as err:
            raise ValueError(f"run-config 'num-shares': {err}") from None

    torch.set_num_threads(1)
    torch.manual_seed(cfg["seed"])
    task = load_task(cfg["task"], num_clients=1)  # the coordinator needs the model and test data only
    model = task.model_fn()
    keys = list(model.state_dict().keys())
    initial = ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, get_weights(model))})

    def evaluate_on_test_data(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        set_weights(model, [arrays[k].numpy() for k in keys])
        loss, accuracy = evaluate(model, *task.test_data, loss_fn=task.loss)
        return MetricRecord({"accuracy": float(accuracy), "loss": float(loss)})

    available = _wait_for_nodes(grid, cfg["min-available-nodes"], cfg["node-wait-s"])
    strategy = IndividualFilterStrategy(
        inner_strategy(cfg, available),
        noise_multiplier=cfg["noise-multiplier"],
        clip=cfg["clip"],
        placement=cfg["placement"],
        min_reports=cfg["min-reports"],
        secagg_num_shares=cfg["num-shares"],
        secagg_colluders=cfg["secagg-colluders"],
        public_ledger=cfg["public-ledger"],
        run_name=cfg["run-name"] or run_id_for(context.run_id),
        public_config={k: v for k, v in cfg.items() if k not in ("public-ledger", "run-name")},
        message_ttl_s=ttl,
    )
    strategy.start(
        grid=grid,
        initial_arrays=initial,
        num_rounds=cfg["num-rounds"],
        timeout=cfg["round-timeout-s"],
        train_config=ConfigRecord({k: cfg[k] for k in TRAIN_KEYS}),
        evaluate_fn=evaluate_on_test_data,
    )


def make_server_app(overrides: Mapping[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``overrides`` on top of the run's own (for ``run_simulation``).

    Parameters
    ----------
    overrides : Mapping, optional
        Run-config values fixed for every run of this app.

    Returns
    -------
    flwr.serverapp.ServerApp
        The app.

    Examples
    --------
    >>> isinstance(make_server_app({"num-rounds": 2}), ServerApp)
    True
    """
    server_app = ServerApp()
    fixed = dict(overrides or {})

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run(grid, context, fixed)

    return server_app


app = make_server_app()
