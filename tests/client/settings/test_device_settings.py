"""The simulation's device-settings file (``client/settings/simulated.py``) as ``individual_filter_mod`` reads it.

A simulated node has only ``partition-id``/``num-partitions``; with ``FEDFILTER_DEVICE_SETTINGS``
set on the machine, the mod takes the node's entry of that file, and only when the node has no
``ledger-dir`` of its own. Problems get an error reply naming the file, key and value; nothing spent.
"""

from __future__ import annotations

import json
import logging

import pytest
from flwr.app import Context, RecordDict
from helpers.mods import Handler, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.settings.errors import DeviceSettingsError
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.client.settings.simulated import (
    ENV_VAR,
    load_device_settings,
    with_device_settings,
    write_device_settings,
)


def _device(tmp_path, name: str, epsilon: float, *, enrol: bool = True) -> dict:
    entry = {
        "ledger-dir": str(tmp_path / name),
        "client-id": name,
        "budget-epsilon": epsilon,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
    }
    if enrol:
        enrol_device(entry)
    return entry


def _sim_context(node_config: dict) -> Context:
    return Context(run_id=7, node_id=42, node_config=node_config, state=RecordDict(), run_config={})


def _spent(ledger_dir) -> float:
    ledger = BudgetLedger.open(ledger_dir)
    try:
        return ledger.spent_epsilon()
    finally:
        ledger.close()


@pytest.fixture
def settings(tmp_path, monkeypatch):
    devices = {0: _device(tmp_path, "dev-0", 3.0), 1: _device(tmp_path, "dev-1", 7.0)}
    path = write_device_settings(tmp_path / "devices.json", devices)
    monkeypatch.setenv(ENV_VAR, str(path))
    return path, devices


def test_each_simulated_node_is_charged_to_its_own_ledger(tmp_path, settings):
    for pid in (0, 1):
        reply = individual_filter_mod(
            train_message(spec(1)), _sim_context({"partition-id": pid, "num-partitions": 2}), Handler()
        )
        assert not reply.has_error()
    assert _spent(tmp_path / "dev-0") > 0 and _spent(tmp_path / "dev-1") > 0
    ledger = BudgetLedger.open(tmp_path / "dev-1")
    try:
        assert ledger.enrolment.epsilon == 7.0 and ledger.enrolment.client_id == "dev-1"
    finally:
        ledger.close()


def test_a_nodes_own_ledger_dir_wins_over_the_file(tmp_path, settings):
    own = _device(tmp_path, "own", 5.0)
    reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": 0, **own}), Handler())
    assert not reply.has_error()
    assert _spent(tmp_path / "own") > 0 and _spent(tmp_path / "dev-0") == 0


def test_without_the_variable_the_file_is_never_read_and_the_reply_names_the_variable(tmp_path, settings, monkeypatch):
    monkeypatch.delenv(ENV_VAR)
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": 0}), handler)
    assert reply.has_error() and str(settings[0]) not in reply.error.reason and handler.calls == 0
    # The fix is named: the variable, not a missing node-config 'ledger-dir'.
    assert ENV_VAR in reply.error.reason and "partition-id 0" in reply.error.reason
    assert _spent(tmp_path / "dev-0") == 0
    with pytest.raises(DeviceSettingsError, match=ENV_VAR):
        with_device_settings({"partition-id": 0}, environ={})


def test_a_deployed_node_without_ledger_dir_is_told_the_node_config_key(tmp_path, monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)
    reply = individual_filter_mod(train_message(spec(1)), _sim_context({"budget-epsilon": 2.0}), Handler())
    assert reply.has_error() and "'ledger-dir'" in reply.error.reason and "--node-config" in reply.error.reason
    assert "2.0" not in reply.error.reason


def test_toml_files_are_read_too(tmp_path):
    path = tmp_path / "devices.toml"
    path.write_text(f'[3]\nledger-dir = "{tmp_path / "d3"}"\nbudget-epsilon = 2.5\n')
    merged = with_device_settings({"partition-id": 3}, environ={ENV_VAR: str(path)})
    assert merged["budget-epsilon"] == 2.5 and merged["partition-id"] == 3


def _refused(tmp_path, monkeypatch, path, node_config, *words):
    monkeypatch.setenv(ENV_VAR, str(path))
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(1)), _sim_context(node_config), handler)
    assert reply.has_error(), "a broken device-settings file must be refused"
    for word in (str(path), *words):
        assert word in reply.error.reason, (word, reply.error.reason)
    assert "nothing was trained, spent or released" in reply.error.reason.lower()
    assert handler.calls == 0
    return reply


def test_a_missing_file_is_named(tmp_path, monkeypatch):
    _refused(tmp_path, monkeypatch, tmp_path / "nowhere.json", {"partition-id": 0}, "does not exist")


def test_a_partition_id_not_in_the_file_is_named(tmp_path, settings, monkeypatch):
    _refused(tmp_path, monkeypatch, settings[0], {"partition-id": 5}, "partition-id 5")
    assert _spent(tmp_path / "dev-0") == 0 and _spent(tmp_path / "dev-1") == 0


@pytest.mark.parametrize(
    "key, value",
    [("after-exhaustion", "sometimes"), ("reply-hold-s", -3), ("max-min-reports", 1.5)],
)
def test_a_bad_value_is_named_with_its_key_and_nothing_is_spent(tmp_path, monkeypatch, key, value):
    entry = _device(tmp_path, "dev-0", 3.0)
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"0": {**entry, key: value}}))
    _refused(tmp_path, monkeypatch, path, {"partition-id": 0}, repr(key), repr(value), "partition-id 0")
    assert _spent(tmp_path / "dev-0") == 0


@pytest.mark.parametrize("key, value", [("budget-epsilon", "8,5"), ("run-quota", "half"), ("noise-seed", 1.5)])
def test_a_bad_budget_value_is_named_by_key_only_and_the_value_stays_in_the_devices_log(
    tmp_path, monkeypatch, caplog, key, value
):
    # A mistyped budget is still the owner's intended budget: the coordinator must not read it.
    entry = _device(tmp_path, "dev-0", 3.0)
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"0": {**entry, key: value}}))
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply = _refused(tmp_path, monkeypatch, path, {"partition-id": 0}, repr(key), "withheld")
    assert repr(value) not in reply.error.reason and str(value) not in reply.error.reason
    assert repr(value) in caplog.text
    assert _spent(tmp_path / "dev-0") == 0


def test_an_unknown_key_is_refused_without_repeating_its_value(tmp_path, monkeypatch, caplog):
    entry = _device(tmp_path, "dev-0", 3.0)
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"0": {**entry, "budget-epsilom": 9.25}}))
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply = _refused(tmp_path, monkeypatch, path, {"partition-id": 0}, "'budget-epsilom'", "unknown key")
    assert "9.25" not in reply.error.reason and "9.25" in caplog.text
    assert _spent(tmp_path / "dev-0") == 0


@pytest.mark.parametrize("text", ["{not json", '{"zero": {}}', '{"0": 3}', "[1, 2]", '{"0": {}, "00": {}}'])
def test_a_malformed_file_is_refused(tmp_path, text):
    path = tmp_path / "devices.json"
    path.write_text(text)
    with pytest.raises(DeviceSettingsError, match="devices.json"):
        load_device_settings(path)


def test_the_file_never_enrols_a_device(tmp_path, monkeypatch):
    # An entry for a device whose owner never enrolled it: refused, and still no ledger afterwards.
    entry = _device(tmp_path, "dev-0", 3.0, enrol=False)
    path = write_device_settings(tmp_path / "devices.json", {0: entry})
    monkeypatch.setenv(ENV_VAR, str(path))
    reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": 0}), Handler())
    assert reply.has_error() and not (tmp_path / "dev-0" / LEDGER_FILE).exists()


def test_the_written_file_is_private_to_its_owner(tmp_path):
    path = write_device_settings(tmp_path / "devices.json", {0: _device(tmp_path, "dev-0", 3.0)})
    assert path.stat().st_mode & 0o077 == 0


@pytest.mark.parametrize(
    "bad_entry, words",
    [
        ({"ledger-dir": "x", "budget-epsilom": 9.25}, ["unknown key 'budget-epsilom'"]),
        ({"ledger-dir": "x", "after-exhaustion": "sometimes"}, ["'after-exhaustion'", "'sometimes'"]),
        ({"ledger-dir": "x", "reply-hold-s": [1, 2]}, ["'reply-hold-s'", "bool, int, float or str"]),
        (7.5, ["must hold a table of settings"]),
    ],
)
def test_one_bad_entry_fails_that_device_only(tmp_path, monkeypatch, bad_entry, words):
    table = {str(i): _device(tmp_path, f"dev-{i}", 2.0) for i in range(10)}
    table["3"] = bad_entry
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(table))
    monkeypatch.setenv(ENV_VAR, str(path))
    for pid in range(10):
        handler = Handler()
        reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": pid}), handler)
        if pid == 3:
            assert reply.has_error() and handler.calls == 0
            for word in ("partition-id 3", str(path), *words):
                assert word in reply.error.reason, (word, reply.error.reason)
            assert "9.25" not in reply.error.reason and "7.5" not in reply.error.reason
        else:
            assert not reply.has_error(), (pid, reply.error.reason if reply.has_error() else "")
            assert _spent(tmp_path / f"dev-{pid}") > 0
    with pytest.raises(DeviceSettingsError, match="partition-id 3"):  # whoever checks the whole file sees it
        load_device_settings(path)


def test_a_repeated_partition_id_fails_that_device_only(tmp_path, monkeypatch):
    d0, d1 = _device(tmp_path, "dev-0", 2.0), _device(tmp_path, "dev-1", 2.0)
    path = tmp_path / "devices.json"
    path.write_text(f'{{"0": {json.dumps(d0)}, "1": {json.dumps(d1)}, "01": {json.dumps(d0)}}}')
    with pytest.raises(DeviceSettingsError, match="partition-id 1 has more than one entry"):
        with_device_settings({"partition-id": 1}, environ={ENV_VAR: str(path)})
    assert with_device_settings({"partition-id": 0}, environ={ENV_VAR: str(path)})["ledger-dir"] == d0["ledger-dir"]


def test_a_key_that_is_not_a_partition_id_is_named_to_the_device_it_would_have_been(tmp_path):
    path = tmp_path / "devices.json"
    path.write_text(json.dumps({"0": _device(tmp_path, "dev-0", 2.0), "device-1": {"ledger-dir": "x"}}))
    assert with_device_settings({"partition-id": 0}, environ={ENV_VAR: str(path)})["partition-id"] == 0
    stray = r"no entry for partition-id 1 \(keys that are not partition-ids: \['device-1'\]"
    with pytest.raises(DeviceSettingsError, match=stray):
        with_device_settings({"partition-id": 1}, environ={ENV_VAR: str(path)})


def test_an_unset_client_id_takes_the_enrolled_one(tmp_path, monkeypatch):
    # The owner enrolled "device-0" in directory "0"; the settings leave client-id out: no mismatch.
    from fedfilter.client.ledger.budget import BudgetLedger as Ledger

    Ledger.enrol(tmp_path / "0", client_id="device-0", epsilon=3.0, delta=1e-5).close()
    path = write_device_settings(
        tmp_path / "devices.json", {0: {"ledger-dir": str(tmp_path / "0"), "budget-epsilon": 3.0, "reply-hold-s": 0}}
    )
    monkeypatch.setenv(ENV_VAR, str(path))
    reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": 0}), Handler())
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert _spent(tmp_path / "0") > 0


def test_a_mismatch_names_what_differs_and_no_value(tmp_path, monkeypatch, caplog):
    from fedfilter.client.ledger.budget import BudgetLedger as Ledger

    Ledger.enrol(tmp_path / "0", client_id="device-0", epsilon=3.0, delta=1e-5).close()
    entry = {"ledger-dir": str(tmp_path / "0"), "client-id": "phone-0", "budget-epsilon": 3.5, "reply-hold-s": 0}
    path = write_device_settings(tmp_path / "devices.json", {0: entry})
    monkeypatch.setenv(ENV_VAR, str(path))
    handler = Handler()
    with caplog.at_level(logging.ERROR, logger="fedfilter.client"):
        reply = individual_filter_mod(train_message(spec(1)), _sim_context({"partition-id": 0}), handler)
    assert reply.has_error() and handler.calls == 0
    reason = reply.error.reason
    assert "'client-id', 'budget-epsilon'" in reason and "enrolment" in reason and "different budget" not in reason
    assert "3.5" not in reason and "3.0" not in reason and "phone-0" not in reason
    assert "phone-0" in caplog.text and "3.5" in caplog.text
    assert _spent(tmp_path / "0") == 0


def test_a_mismatch_reply_is_the_same_whatever_the_budget_spent(tmp_path, monkeypatch):
    # The reply reaches the coordinator: it may depend on the owner's settings, not on the budget state.
    from fedfilter.client.ledger.budget import BudgetLedger as Ledger

    reasons = []
    for name, spend in (("fresh", False), ("spent", True)):
        Ledger.enrol(tmp_path / name, client_id="device-0", epsilon=3.0, delta=1e-5).close()
        entry = {"ledger-dir": str(tmp_path / name), "budget-epsilon": 3.0, "reply-hold-s": 0}
        if spend:  # a round spent under the right settings first
            path = write_device_settings(tmp_path / f"{name}-ok.json", {0: entry})
            monkeypatch.setenv(ENV_VAR, str(path))
            assert not individual_filter_mod(
                train_message(spec(1)), _sim_context({"partition-id": 0}), Handler()
            ).has_error()
            assert _spent(tmp_path / name) > 0
        path = write_device_settings(tmp_path / f"{name}.json", {0: {**entry, "budget-epsilon": 5.0}})
        monkeypatch.setenv(ENV_VAR, str(path))
        reply = individual_filter_mod(train_message(spec(2)), _sim_context({"partition-id": 0}), Handler())
        assert reply.has_error()
        reasons.append(reply.error.reason)
    assert reasons[0] == reasons[1] and "'budget-epsilon'" in reasons[0]
