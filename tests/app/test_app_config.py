"""The built-in app's defaults live in one place, ``fedfilter/app/pyproject.toml`` ``[tool.flwr.app.config]``."""

from __future__ import annotations

import argparse
import tomllib

import pytest
from helpers.flower_messages import delivered

from fedfilter.app.config import APP_PYPROJECT, app_defaults, resolve_config


def _toml_table() -> dict:
    with APP_PYPROJECT.open("rb") as handle:
        return tomllib.load(handle)["tool"]["flwr"]["app"]["config"]


def test_the_defaults_are_the_apps_toml_table():
    assert app_defaults() == _toml_table()
    assert {k: type(v) for k, v in app_defaults().items()} == {k: type(v) for k, v in _toml_table().items()}


def test_server_client_and_demo_read_the_same_table():
    from fedfilter.app.config import TRAIN_KEYS
    from fedfilter.app.server_app import SERVER_DEFAULTS, server_config
    from fedfilter.cli.demo import DEFAULTS, placement_defaults, register

    table = _toml_table()
    assert SERVER_DEFAULTS == table and server_config({}) == table
    assert set(TRAIN_KEYS) <= set(table)
    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = placement_defaults(parser.parse_args(["demo", "--out", "x"]))  # local placement's defaults
    assert (args.clip, args.local_epochs, args.lr, args.server_lr, args.task) == (
        table["clip"],
        table["local-epochs"],
        table["lr"],
        table["server-lr"],
        table["task"],
    )
    # The demo's noise multiplier is not the table's: it is planned for the demo's budgets (at most
    # epsilon 8; tests/cli/test_demo_population.py recomputes it), and its help quotes that default.
    assert args.noise_multiplier == DEFAULTS["noise_multiplier"] > table["noise-multiplier"]


def test_layers_override_in_order_and_keep_the_toml_types():
    out = resolve_config({"lr": 1, "num-rounds": 3}, {"lr": 0.5}, keys=("lr", "num-rounds", "task"))
    assert out == {"lr": 0.5, "num-rounds": 3, "task": _toml_table()["task"]}
    assert type(resolve_config({"lr": 1})["lr"]) is float  # an int where a float is expected


def test_app_defaults_is_a_copy():
    app_defaults()["lr"] = 99.0
    assert app_defaults()["lr"] == _toml_table()["lr"]


@pytest.mark.parametrize(
    "layer, words",
    [
        ({"learning-rate": 0.1}, ["'learning-rate'", "known"]),
        ({"num-rounds": 2.5}, ["'num-rounds'", "int", "2.5"]),
        ({"num-rounds": True}, ["'num-rounds'", "True"]),
        ({"lr": "fast"}, ["'lr'", "float", "'fast'"]),
        ({"task": 3}, ["'task'", "str", "3"]),
    ],
)
def test_unknown_keys_and_wrong_types_are_refused_by_name(layer, words):
    with pytest.raises(ValueError) as err:
        resolve_config(layer)
    for word in words:
        assert word in str(err.value), (word, str(err.value))


def test_the_client_app_refuses_an_unknown_training_setting():

    from flwr.app import ConfigRecord, Context, Message, RecordDict

    from fedfilter.app.client_app import train

    meta = delivered(RecordDict(), dst_node_id=2).metadata  # as node 2 receives it
    ctx = Context(run_id=7, node_id=2, node_config={}, state=RecordDict(), run_config={})

    def message(config):
        return Message(content=RecordDict({"config": ConfigRecord(config)}), metadata=meta)

    # Accepted settings get as far as the node's own config (no partition-id here), before any data.
    with pytest.raises(ValueError, match="node-config 'partition-id' is required"):
        train(message({"lr": 0.3, "server-round": 2}), ctx)
    with pytest.raises(ValueError, match="'epochs'"):
        train(message({"lr": 0.3, "epochs": 9}), ctx)
    with pytest.raises(ValueError, match="'lr' must be a float. Found 'fast'"):
        train(message({"lr": "fast"}), ctx)
    with pytest.raises(ValueError, match="'server-round' must be an int"):
        train(message({"server-round": 2.0}), ctx)
