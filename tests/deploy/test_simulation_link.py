"""Fast checks of the simulation SuperLink wrapper (``fedfilter.deploy.simulation_link``); the end-to-end run
is in ``test_flower_simulation.py`` (``fedfilter demo``)."""

from __future__ import annotations

import tomllib

import pytest

from fedfilter.client.settings.simulated import ENV_VAR
from fedfilter.deploy.simulation_link import (
    SIMULATION_CONNECTION,
    SimulationLink,
    federation_config_arg,
    federation_options,
)


def test_federation_options_are_what_flwr_run_federation_config_takes():
    options = federation_options(7)
    assert options == {"num-supernodes": 7, "client-resources-num-cpus": 1}
    assert federation_config_arg(options) == "num-supernodes=7 client-resources-num-cpus=1"


@pytest.mark.parametrize("n, cpus", [(0, 1), (2.0, 1), (True, 1), (3, 0), (3, 0.5)])
def test_bad_simulation_sizes_are_refused_by_name(n, cpus):
    with pytest.raises(ValueError, match="num-supernodes|client-resources-num-cpus"):
        federation_options(n, cpus)


def test_the_superlink_environment_names_the_device_settings_and_keeps_ray_on_loopback(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    link = SimulationLink(tmp_path, num_supernodes=3, device_settings=tmp_path / "devices.json")
    env = link.superlink_environment()
    assert env[ENV_VAR] == str((tmp_path / "devices.json").resolve())
    assert env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and env["FLWR_HOME"] == str(link.home)
    assert ENV_VAR not in SimulationLink(tmp_path, num_supernodes=3).superlink_environment()


def test_the_connection_is_loopback_and_insecure_only_there(tmp_path):
    link = SimulationLink(tmp_path, num_supernodes=3)
    link.port = 4321
    link.home.mkdir(parents=True)
    config = tomllib.loads(link.write_connection().read_text())
    assert config["superlink"]["default"] == SIMULATION_CONNECTION
    assert config["superlink"][SIMULATION_CONNECTION] == {"address": "127.0.0.1:4321", "insecure": True}
