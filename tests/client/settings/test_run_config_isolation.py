"""No key of the coordinator's run config ever reaches the device's settings (the design's
invariant 7: nothing the coordinator sends can change a budget or turn the filter off).

The attack: a coordinator that puts every device setting (``NODE_CONFIG_KEYS``: ``noise-seed``,
``min-noise-multiplier``, the budget, the ledger, ...) in its run config, hoping the device reads it
where its owner set nothing, or in place of what its owner set. Each path that builds a device's settings
is played with and without that run config and must come out the same: the settings object the filter
uses (``device_config``'s ``DeviceConfig``), the noise (bit for bit, under a fixed owner's seed), and the
refusal of a request below the owner's minimum. Paths: ``individual_filter_mod`` on a real device's node
config, a simulated node's entry of the ``FEDFILTER_DEVICE_SETTINGS`` file, and the built-in app's
``simulated_device_config_mod``.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict
from helpers.mods import Handler, spec, train_message

import fedfilter.client.round.admit as admit
from fedfilter.app.client_app import make_client_app
from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.settings.node_config import NODE_CONFIG_KEYS, enrol_device
from fedfilter.client.settings.simulated import ENV_VAR, write_device_settings
from fedfilter.protocol.refusals import refusal_code
from fedfilter.protocol.wire import ARRAYS_RECORD

# Valid values a coordinator would choose for the keys that matter most; every other key gets a value too.
HOSTILE = {
    "noise-seed": 424242,
    "min-noise-multiplier": 0.001,
    "budget-epsilon": 1000.0,
    "run-quota": 1.0,
    "after-exhaustion": "leave",
    "reply-hold-s": 0,
    "client-id": "mallory",
}


def hostile_run_config(tmp_path: Path) -> dict:
    config = {key: HOSTILE.get(key, "set-by-the-coordinator") for key in NODE_CONFIG_KEYS}
    config["ledger-dir"] = str(tmp_path / "the-coordinators-ledger")
    return config


def owner(tmp_path: Path, name: str, **over) -> dict:
    config = {
        "ledger-dir": str(tmp_path / name),
        "client-id": "alice",
        "budget-epsilon": 4.0,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
        "noise-seed": 5,
        "min-noise-multiplier": 0.5,
        **over,
    }
    enrol_device(config)
    return config


def ctx(node_config: dict, run_config: dict) -> Context:
    return Context(run_id=7, node_id=42, node_config=dict(node_config), state=RecordDict(), run_config=dict(run_config))


@pytest.fixture
def settings_seen(monkeypatch) -> list:
    """Every DeviceConfig the filter builds (the settings object it then uses)."""
    seen: list = []
    real = admit.device_config

    def spy(node_config):
        seen.append(real(node_config))
        return seen[-1]

    monkeypatch.setattr(admit, "device_config", spy)
    return seen


def noisy(reply) -> list[np.ndarray]:
    assert not reply.has_error(), reply.error.reason
    record = reply.content[ARRAYS_RECORD]
    return [record[k].numpy() for k in record.keys()]


def test_a_run_config_with_every_device_key_changes_nothing_on_a_device(tmp_path, settings_seen, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    hostile = hostile_run_config(tmp_path)
    replies = {}
    for run_config in ({}, hostile):  # two devices, alike but for their ledger's folder
        node = owner(tmp_path, f"ledger-{bool(run_config)}")
        settings_seen.clear()
        replies[bool(run_config)] = individual_filter_mod(train_message(spec(1)), ctx(node, run_config), Handler())
        assert len(settings_seen) == 1
        replies[(bool(run_config), "settings")] = replace(settings_seen[0], ledger_dir=Path("."))
        # A request below the owner's minimum (0.5) stays refused, whatever the run config says.
        low = individual_filter_mod(train_message(spec(2, z=0.1)), ctx(node, run_config), Handler())
        assert low.has_error() and refusal_code(low.error.reason) == "noise-below-minimum", low.error.reason
        replies[(bool(run_config), "low")] = low.error.reason
    assert replies[(True, "settings")] == replies[(False, "settings")]
    assert replies[(True, "low")] == replies[(False, "low")]
    for a, b in zip(noisy(replies[False]), noisy(replies[True])):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()  # the same noise, bit for bit


def test_a_run_config_cannot_supply_a_setting_the_owner_left_out(tmp_path, settings_seen, monkeypatch):
    """The owner set no noise seed (fresh OS noise) and no minimum (the default 0.5): the run config's
    seed must not make the noise the seeded one, nor its minimum refuse or admit a request."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    seeded = owner(tmp_path, "seeded")
    unseeded = owner(tmp_path, "unseeded")
    del unseeded["noise-seed"], unseeded["min-noise-multiplier"]
    run_config = {"noise-seed": seeded["noise-seed"], "min-noise-multiplier": 3.0}
    reference = noisy(individual_filter_mod(train_message(spec(1)), ctx(seeded, {}), Handler()))
    settings_seen.clear()
    got = noisy(individual_filter_mod(train_message(spec(1)), ctx(unseeded, run_config), Handler()))
    (settings,) = settings_seen
    assert settings.noise_seed is None and settings.policy.min_noise_multiplier == 0.5
    assert all(a.tobytes() != b.tobytes() for a, b in zip(reference, got))


def test_a_simulated_nodes_settings_come_from_its_file_entry_never_the_run_config(tmp_path, settings_seen, monkeypatch):
    """A simulated node's only settings are its entry of the owner's file; a run config holding a whole
    device (an enrolled ledger included) neither stands in for a missing file nor changes an entry."""
    node = {"partition-id": 0, "num-partitions": 1}
    device = owner(tmp_path, "sim", **{"min-noise-multiplier": 2.0})
    run_config = {**hostile_run_config(tmp_path), "ledger-dir": str(tmp_path / "sim")}
    monkeypatch.delenv(ENV_VAR, raising=False)
    for rc in ({}, run_config):  # no file: refused alike, nothing read from the run config
        reply = individual_filter_mod(train_message(spec(1, z=3.0)), ctx(node, rc), Handler())
        assert reply.has_error() and refusal_code(reply.error.reason) == "device-settings", reply.error.reason
    monkeypatch.setenv(ENV_VAR, str(write_device_settings(tmp_path / "devices.json", {0: device})))
    reasons, settings = [], []
    for rc in ({}, run_config):
        settings_seen.clear()
        reply = individual_filter_mod(train_message(spec(1, z=1.0)), ctx(node, rc), Handler())
        assert reply.has_error() and refusal_code(reply.error.reason) == "noise-below-minimum"
        reasons.append(reply.error.reason)
        settings.extend(settings_seen)
    assert reasons[0] == reasons[1] and settings[0] == settings[1]


def test_the_builtin_apps_simulated_settings_ignore_the_run_config(tmp_path, settings_seen, monkeypatch):
    """``make_client_app(devices)`` (the Simulation Engine's stand-in for --node-config): refused below
    the owner's minimum before any training, with the same settings, whatever the run config."""
    monkeypatch.delenv(ENV_VAR, raising=False)
    device = owner(tmp_path, "builtin", **{"min-noise-multiplier": 2.0})
    app = make_client_app({0: device})
    reasons, settings = [], []
    for rc in ({}, hostile_run_config(tmp_path)):
        settings_seen.clear()
        reply = app(train_message(spec(1, z=1.0)), ctx({"partition-id": 0, "num-partitions": 1}, rc))
        assert reply.has_error() and refusal_code(reply.error.reason) == "noise-below-minimum", reply.error.reason
        reasons.append(reply.error.reason)
        settings.extend(settings_seen)
    assert reasons[0] == reasons[1] and len(settings) == 2 and settings[0] == settings[1]
