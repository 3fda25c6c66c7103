"""The built-in ServerApp's choices before any round: inner strategy, TTL rule, bad settings."""

from __future__ import annotations

import pytest
from flwr.app import Context, RecordDict
from flwr.serverapp.strategy import FedAvg, FedAvgM

from fedfilter.app.server_app import inner_strategy, run, server_config


def _context(**run_config):
    return Context(run_id=3, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)


def test_server_lr_one_is_fedavg_and_any_other_is_fedavgm_without_momentum():
    plain = inner_strategy(server_config({}), min_available_nodes=4)
    assert type(plain) is FedAvg and plain.min_available_nodes == 4 and plain.min_train_nodes == 1
    assert plain.fraction_evaluate == 0.0  # the wrapper sends no evaluation anyway
    scaled = inner_strategy(server_config({"server-lr": 0.5, "fraction-train": 0.3}), min_available_nodes=2)
    assert type(scaled) is FedAvgM and scaled.server_learning_rate == 0.5 and scaled.server_momentum == 0.0
    assert scaled.fraction_train == 0.3


@pytest.mark.parametrize(
    "run_config,field",
    [
        ({"message-ttl-s": 100.0, "round-timeout-s": 300.0}, "message-ttl-s"),
        ({"fraction-train": 0.0}, "fraction-train"),
        ({"server-lr": -1.0}, "server-lr"),
        ({"num-rounds": "many"}, "num-rounds"),
        ({"placement": "distributed", "min-reports": 3, "num-shares": 4}, "num-shares"),  # even: Flower crashes
        ({"placement": "distributed", "min-reports": 3, "num-shares": 1.5}, "num-shares"),
    ],
)
def test_bad_run_config_is_refused_by_name_before_any_round(run_config, field):
    with pytest.raises(ValueError, match=field):
        run(grid=None, context=_context(**run_config))


@pytest.mark.parametrize("value", ["3", 1.5, True])
def test_the_server_types_the_run_config_as_the_client_app_does(value):
    # One coercion (fedfilter.app.config.resolve_config): "3" or 1.5 for an int is refused, not converted.
    with pytest.raises(ValueError, match=r"'num-rounds' must be a int\. Found"):
        server_config({"num-rounds": value})
    assert server_config({"num-rounds": 3, "clip": 1})["clip"] == 1.0  # an int where a float is expected


def test_unknown_override_keys_are_refused():
    with pytest.raises(ValueError, match="server-learning-rate"):
        server_config({}, {"server-learning-rate": 0.5})
