"""The ClientApp for the built-in tasks, wrapped in the device's individual privacy filter.

``app`` is what ``[tool.flwr.app.components] clientapp = "fedfilter.app.client_app:app"`` loads. Its train
handler is an ordinary Flower handler: it loads this node's partition, trains ``local-epochs``
epochs of plain SGD and returns the new weights (and, like any Flower app, ``num-examples``).
``individual_filter_mod`` turns that into a filtered, noisy update and drops every metric. Before it
runs ``secure_aggregation_mod`` (Flower's SecAgg+ client with sound masks): in a round the coordinator
runs through SecAgg+, the filter releases Skellam noise on SecAgg+'s integer grid (``distributed``
placement) and the report reaches the coordinator only masked; other rounds pass through it unchanged.

Training settings (``TRAIN_KEYS``) are read from the train message's ``"config"`` ConfigRecord
first (the coordinator sends them each round), then from ``context.run_config``, then the app's
defaults in ``fedfilter/app/pyproject.toml`` ``[tool.flwr.app.config]`` (``fedfilter.app.config``):
``task``, ``num-clients`` (simulation: ``num-partitions`` wins), ``partition`` (``iid`` or
``dirichlet``), ``alpha``, ``partition-seed``, ``local-epochs``, ``lr``, ``batch-size``. The
message may also carry ``server-round`` (only varies the local shuffling seed per round).

The node's data: ``partition-id`` (and in deployment ``data-dir``, the root of the offline data
sets) from ``context.node_config``. Imports stay light at module level: in the Deployment Engine
every message starts a fresh process, and torch is imported only when a train message arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfilter.app.config import TRAIN_KEYS, resolve_config
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower.simulated_mod import simulated_device_config_mod
from fedfilter.client.secagg.mod import secure_aggregation_mod

__all__ = ["app", "make_client_app", "train"]

ROUND_KEY = "server-round"


def _settings(msg: Message, context: Context) -> dict[str, Any]:
    sent = dict(msg.content.config_records.get("config") or {})
    server_round = sent.pop(ROUND_KEY, 0)
    if isinstance(server_round, bool) or not isinstance(server_round, int):
        raise ValueError(f"train config {ROUND_KEY!r} must be an int. Found {server_round!r}.")
    out = resolve_config(context.run_config, sent, keys=TRAIN_KEYS, source="run-config or train config")
    out[ROUND_KEY] = server_round
    return out


def _partition(node_config: Mapping[str, Any], settings: Mapping[str, Any]) -> tuple[int, int]:
    if "partition-id" not in node_config:
        raise ValueError(
            "node-config 'partition-id' is required (the Simulation Engine sets it; "
            'in deployment pass --node-config "partition-id=K ...").'
        )
    pid = int(node_config["partition-id"])
    num = int(node_config.get("num-partitions", settings["num-clients"]))
    if not 0 <= pid < num:
        raise ValueError(f"partition-id must be in [0, {num}). Found {pid}.")
    return pid, num


def train(msg: Message, context: Context) -> Message:
    """Train this node's partition for ``local-epochs`` epochs and return the new weights.

    The handler is an ordinary Flower one; the mods around it in ``app`` (``individual_filter_mod``)
    turn the reply into a filtered, noisy update and drop its metrics.

    Parameters
    ----------
    msg : flwr.app.Message
        The coordinator's train message: the model's ``ArrayRecord`` and a ``"config"`` ConfigRecord.
    context : flwr.app.Context
        The node's context (``partition-id`` and ``data-dir`` in its node config; the run config).

    Returns
    -------
    flwr.app.Message
        The reply: the trained weights and ``num-examples``.

    Examples
    --------
    >>> import time, torch
    >>> from flwr.app import ConfigRecord, Metadata
    >>> from fedfilter.app.task import load_task
    >>> model = load_task("digits", 2).model_fn()
    >>> content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
    ...                       "config": ConfigRecord({"task": "digits", "num-clients": 2, "local-epochs": 1})})
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> context = Context(run_id=1, node_id=2, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    >>> reply = train(Message(content=content, metadata=meta), context)
    >>> reply.content["metrics"]["num-examples"] > 0
    True
    """
    import torch

    from fedfilter.app.task import load_task, local_update, set_weights

    torch.set_num_threads(1)
    settings = _settings(msg, context)
    pid, num = _partition(context.node_config, settings)
    data_dir = context.node_config.get("data-dir")
    task = load_task(
        settings["task"],
        num,
        settings["partition"],
        settings["alpha"],
        settings["partition-seed"],
        str(data_dir) if data_dir else None,
    )
    x, y = task.train_data[pid]
    arrays = next(iter(msg.content.array_records.values()))
    model = task.model_fn()
    if list(arrays.keys()) != list(model.state_dict().keys()):
        raise ValueError(
            f"the model sent has keys {list(arrays.keys())}, this task's model has {list(model.state_dict().keys())}."
        )
    set_weights(model, arrays.to_numpy_ndarrays())
    local_update(
        model,
        x,
        y,
        epochs=settings["local-epochs"],
        lr=settings["lr"],
        batch_size=settings["batch-size"],
        seed=1_000_003 * settings["server-round"] + pid,
        loss_fn=task.loss,
    )
    content = RecordDict(
        {
            "arrays": ArrayRecord(model.state_dict()),
            # What a plain Flower app sends; individual_filter_mod drops it (it reveals the data size).
            "metrics": MetricRecord({"num-examples": int(len(y))}),
        }
    )
    return Message(content, reply_to=msg)


def make_client_app(devices: Mapping[int, Mapping[str, Any]] | None = None) -> ClientApp:
    """The built-in ClientApp: ``train`` inside ``secure_aggregation_mod`` and ``individual_filter_mod``.

    Parameters
    ----------
    devices : Mapping of int to Mapping, optional
        Simulation only: partition-id -> the device's node-config (``simulated_device_config_mod``).

    Returns
    -------
    flwr.clientapp.ClientApp
        The app.

    Examples
    --------
    >>> isinstance(make_client_app(), ClientApp)
    True
    """
    mods = [simulated_device_config_mod(devices)] if devices else []
    # The order is the device's own: secure_aggregation_mod marks the reply it will mask, and only
    # then does individual_filter_mod serve distributed placement.
    client_app = ClientApp(mods=mods + [secure_aggregation_mod, individual_filter_mod])
    client_app.train()(train)
    return client_app


app = make_client_app()
