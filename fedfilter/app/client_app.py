"""The ClientApp for the built-in tasks, wrapped in the device's individual privacy filter.

``app`` is what ``[tool.flwr.app.components] clientapp = "fedfilter.app.client_app:app"`` loads. Its train
handler is an ordinary Flower handler: it loads this node's partition, trains ``local-epochs``
epochs of plain SGD and returns the new weights (and, like any Flower app, ``num-examples``).
``individual_filter_mod`` turns that into a filtered, noisy update and drops every metric.

Training settings are read from the train message's ``"config"`` ConfigRecord first (the
coordinator sends them each round, which also works under ``run_simulation``, where the run
config is empty), then from ``context.run_config``, then the defaults below:

================  =======  ==================================================================
key               default  meaning
================  =======  ==================================================================
task              digits   a task of ``fedfilter.app.task`` (the built-in tasks)
num-clients       10       partitions of the data set (simulation: ``num-partitions`` wins)
partition         iid      ``iid`` or ``dirichlet``
alpha             0.5      Dirichlet concentration
partition-seed    0        seed of the split
local-epochs      2        epochs of local SGD per round
lr                0.1      local learning rate
batch-size        32       local batch size
server-round      0        used only to vary the local shuffling seed per round
================  =======  ==================================================================

The node's data: ``partition-id`` (and in deployment ``data-dir``, the root of the offline data
sets) from ``context.node_config``. Imports stay light at module level: in the Deployment Engine
every message starts a fresh process, and torch is imported only when a train message arrives.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedfilter.client.flower_mod import individual_filter_mod, simulated_device_config_mod

__all__ = ["app", "make_client_app", "train", "TRAIN_DEFAULTS"]

TRAIN_DEFAULTS: dict[str, Any] = {
    "task": "digits",
    "num-clients": 10,
    "partition": "iid",
    "alpha": 0.5,
    "partition-seed": 0,
    "local-epochs": 2,
    "lr": 0.1,
    "batch-size": 32,
    "server-round": 0,
}


def _settings(msg: Message, context: Context) -> dict[str, Any]:
    sent = msg.content.config_records.get("config") or {}
    out = {}
    for key, default in TRAIN_DEFAULTS.items():
        value = sent.get(key, context.run_config.get(key, default))
        out[key] = type(default)(value)
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
    """Train this node's partition for ``local-epochs`` epochs and return the new weights."""
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
    """The built-in ClientApp; ``devices`` (partition-id -> node-config) only in simulation."""
    mods = [simulated_device_config_mod(devices)] if devices else []
    client_app = ClientApp(mods=mods + [individual_filter_mod])
    client_app.train()(train)
    return client_app


app = make_client_app()
