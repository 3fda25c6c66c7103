"""What the operator reads at run time: the released mean's norm against the noise norm
it should carry, refusals counted by code with the fix to make, and a run that released nothing
failing with the reason. The devices are the real ``individual_filter_mod`` called in-process
behind a fake Grid (no Flower engine); ``tests/test_example_app.py`` runs the same through
``flwr run``."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg
from helpers.flower_messages import task_identity
from helpers.strategy import FakeGrid

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.strategy import IndividualFilterStrategy, NothingReleasedError
from fedfilter.planning.federation import plan_federation

NODES = [11, 12, 13, 14]
DIM = 4000  # coordinates: the norm of the mean's noise then varies by about 1% around its mean
Z, CLIP = 0.5, 1.0


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    task_identity(monkeypatch, run_id=7)


def _zero_update(msg, ctx):
    """Training that changes nothing: the report is pure noise (and costs nothing)."""
    return Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)


def _devices(root, *, enrol=True, train=_zero_update, **settings):
    """A reply function for FakeGrid: each node is a device running the real mod around ``train``."""
    contexts = {}
    for node in NODES:
        config = {
            "ledger-dir": str(root / str(node)),
            "client-id": f"d{node}",
            "budget-epsilon": 8.0,
            "budget-delta": 1e-5,
            "reply-hold-s": 0,
            **settings,
        }
        if enrol:
            enrol_device(config)
        contexts[node] = Context(run_id=7, node_id=node, node_config=config, state=RecordDict(), run_config={})

    def reply(msg):
        return individual_filter_mod(msg, contexts[msg.metadata.dst_node_id], train)

    return reply


def _start(strategy, client, rounds=2):
    arrays = ArrayRecord({"w": Array(np.zeros(DIM, np.float32))})
    return strategy.start(
        grid=FakeGrid(nodes=NODES, client=client),
        initial_arrays=arrays,
        num_rounds=rounds,
        timeout=60,
        train_config=ConfigRecord({"lr": 0.1}),
    )


def _wrap(tmp_path, **kwargs):
    inner = FedAvg(min_available_nodes=len(NODES), fraction_evaluate=0.0)
    return IndividualFilterStrategy(
        inner, noise_multiplier=Z, clip=CLIP, run_name="r", public_ledger=str(tmp_path / "public.sqlite"), **kwargs
    )


def test_the_planners_noise_figure_is_what_a_real_run_of_zero_updates_measures(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _start(_wrap(tmp_path), _devices(tmp_path / "devices"))
    plan = plan_federation(
        devices=len(NODES), dim=DIM, noise_multiplier=Z, clip=CLIP, epsilon=8.0, delta=1e-5, rounds=2
    )
    with PublicLedger(tmp_path / "public.sqlite", read_only=True) as ledger:
        records = ledger.records("r")
    assert [r.released for r in records] == [True, True]
    for record in records:
        # The public record's figure is the planner's, and the measured norm of the released mean
        # (zero updates: pure noise) lies within 5% of it (its spread is about 1% here).
        assert record.expected_noise_norm == pytest.approx(plan["mean_noise_norm"], rel=1e-12)
        assert record.aggregate_norm == pytest.approx(record.expected_noise_norm, rel=0.05)
    assert plan["noise_dominates"] is True  # 0.5 * sqrt(4000 / 4) = 15.8 against a clip of 1
    logged = caplog.text
    assert logged.count("released mean norm") == 2 and "expected noise norm 15.8" in logged
    assert logged.count("the released mean is mostly noise") == 1  # warned once, not per round
    assert "fedfilter plan --devices 4 --params 4000" in logged


def test_with_devices_that_sample_themselves_the_noise_figure_follows_the_mean_divided_by_the_rate(tmp_path):
    # The coordinator divides the plain mean by the plan's expected rate; zero updates keep the mean pure
    # noise, so its norm must sit near the planner's figure over that rate, not near the figure itself.
    settings = {"filter": "rdp", "rdp-order": 6.0}
    _start(_wrap(tmp_path, planned_asks=4, expected_rate=0.25), _devices(tmp_path / "devices", **settings))
    plan = plan_federation(
        devices=len(NODES), dim=DIM, noise_multiplier=Z, clip=CLIP, epsilon=8.0, delta=1e-5, rounds=2
    )
    with PublicLedger(tmp_path / "public.sqlite", read_only=True) as ledger:
        records = ledger.records("r")
    assert [r.released for r in records] == [True, True]
    for record in records:
        assert record.expected_noise_norm == pytest.approx(plan["mean_noise_norm"] / 0.25, rel=1e-12)
        assert record.aggregate_norm == pytest.approx(record.expected_noise_norm, rel=0.05)


def test_a_quiet_mean_is_not_called_noise(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    # 0.02 * sqrt(4000 / 4) = 0.63 < clip 1 (the ratio does not depend on the clip: only on z, d, n).
    strategy = IndividualFilterStrategy(FedAvg(min_available_nodes=len(NODES)), noise_multiplier=0.02, clip=1.0)
    _start(strategy, _devices(tmp_path / "devices", **{"min-noise-multiplier": 0.02}), rounds=1)
    assert strategy.last_outcome.released and strategy.last_outcome.expected_noise_norm < 1.0
    assert "mostly noise" not in caplog.text


def test_devices_not_enrolled_are_counted_and_the_run_fails_with_the_fix(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    with pytest.raises(NothingReleasedError) as err:
        _start(_wrap(tmp_path), _devices(tmp_path / "devices", enrol=False))
    message = str(err.value)
    assert "no round of run 'r' was released in 2 round(s)" in message
    assert "8 refused: not-enrolled" in message and "fedfilter ledger enrol" in message  # 4 devices x 2 rounds
    assert caplog.text.count("4 refused: not-enrolled") == 2  # per round, as it happens
    with PublicLedger(tmp_path / "public.sqlite", read_only=True) as ledger:
        assert ledger.is_finished("r")
        assert [(r.released, r.replies_dropped, r.expected_noise_norm) for r in ledger.records("r")] == [
            (False, 4, 0.0),
            (False, 4, 0.0),
        ]


def test_noise_below_the_devices_minimum_says_raise_the_multiplier(tmp_path):
    with pytest.raises(NothingReleasedError, match="refused: noise-below-minimum .*raise noise_multiplier"):
        _start(_wrap(tmp_path), _devices(tmp_path / "devices", **{"min-noise-multiplier": 1.0}), rounds=1)


def test_noise_below_the_devices_minimum_names_the_owners_value_and_both_fixes(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    with pytest.raises(NothingReleasedError) as err:
        _start(_wrap(tmp_path), _devices(tmp_path / "devices", **{"min-noise-multiplier": 1.0}), rounds=1)
    message = str(err.value)
    # The value the owners set, as the devices said it, and both fixes with what the second costs.
    assert "noise_multiplier=0.5 is below this device's min-noise-multiplier 1.0 (its owner's setting)" in message
    assert "raise noise_multiplier to at least that value" in message
    assert "the owner lowers min-noise-multiplier in the device's settings" in message and "costs" in message
    # Loud in the log too: an ERROR line that says nothing was released and that `flwr run` exits 0.
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert any("NOTHING RELEASED" in line and "exits 0" in line for line in errors), errors
    assert any("4 refused: noise-below-minimum" in line for line in errors), errors


def test_the_log_counts_replies_and_explains_the_inner_strategys_one_result(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    _start(_wrap(tmp_path), _devices(tmp_path / "devices"), rounds=1)
    lines = [r.getMessage() for r in caplog.records]
    counts = next(i for i, line in enumerate(lines) if line.startswith("fedfilter round 1: 4 asked"))
    assert lines[counts] == (
        "fedfilter round 1: 4 asked, 4 replies received: 4 valid reports, 0 left (budget spent), 0 dropped; "
        "released=True"
    )
    handing = next(i for i, line in enumerate(lines) if "handing the inner strategy" in line)
    received = next(i for i, line in enumerate(lines) if "aggregate_train: Received 1 results" in line)
    assert handing < received, lines  # our line comes just before Flower's, and says what it counts
    assert "the plain mean of 4 valid reports (of 4 replies received, 4 asked)" in lines[handing]


def test_three_released_rounds_of_pure_noise_are_warned_about_once(tmp_path, caplog, monkeypatch):
    from fedfilter.coordinator import run_log

    # Zero updates: every report is pure noise. A level of 1e-9 leaves the warning to chance with
    # probability 3e-9 (the default level's figures are tested in test_signal_check.py).
    monkeypatch.setattr(run_log, "NOISE_LIKE_ALPHA", 1e-9)
    caplog.set_level(logging.WARNING)
    _start(_wrap(tmp_path), _devices(tmp_path / "devices"), rounds=4)
    warnings = [r.getMessage() for r in caplog.records if "carry no signal" in r.getMessage()]
    assert len(warnings) == 1, warnings  # after round 3, once for the streak
    assert "to round 3" in warnings[0] and "send noise only" in warnings[0] and "fedfilter plan" in warnings[0]


@pytest.mark.parametrize(("budget", "warned"), [(1e5, False), (8.0, True)])
def test_rounds_with_signal_are_not_warned_about_and_exhausted_devices_are(
    tmp_path, caplog, monkeypatch, budget, warned
):
    """At z = 0.02 a full-clip round costs mu = 50: budgets of epsilon 1e5 pay for 3 rounds of signal,
    while budgets of 8 are spent within the first round, after which the devices send noise only."""
    from fedfilter.coordinator import run_log

    monkeypatch.setattr(run_log, "NOISE_LIKE_ALPHA", 1e-9)  # the strictest level: signal must still show
    caplog.set_level(logging.WARNING)

    def shifted(msg, ctx):  # an update of norm 10, clipped to 1: signal 1 against noise std 0.01
        arrays = msg.content["arrays"]
        moved = {k: Array(arrays[k].numpy() + 10.0 / np.sqrt(DIM)) for k in arrays.keys()}
        return Message(RecordDict({"arrays": ArrayRecord(moved)}), reply_to=msg)

    reply = _devices(tmp_path / "devices", train=shifted, **{"min-noise-multiplier": 0.02, "budget-epsilon": budget})
    strategy = IndividualFilterStrategy(FedAvg(min_available_nodes=len(NODES)), noise_multiplier=0.02, clip=1.0)
    _start(strategy, reply, rounds=3)
    assert strategy.last_outcome.released
    assert ("carry no signal" in caplog.text) is warned, caplog.text


def test_devices_without_the_mod_are_told_apart_and_the_fix_named(tmp_path):
    def plain_client_app(msg):  # a ClientApp without individual_filter_mod: the template's reply
        content = RecordDict({"arrays": msg.content["arrays"], "metrics": MetricRecord({"num-examples": 10})})
        return Message(content, reply_to=msg)

    with pytest.raises(NothingReleasedError) as err:
        _start(_wrap(tmp_path), plain_client_app, rounds=1)
    assert "4 refused: no-filter-mod" in str(err.value)
    assert "ClientApp(mods=[individual_filter_mod])" in str(err.value)


def test_a_round_with_some_refusals_is_released_and_counted(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    good = _devices(tmp_path / "good")
    strategy = _wrap(tmp_path)

    def mixed(msg):
        if msg.metadata.dst_node_id == NODES[0]:
            return Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)  # no mod
        return good(msg)

    _start(strategy, mixed, rounds=1)
    outcome = strategy.last_outcome
    assert outcome.released and outcome.reports == 3 and outcome.refusals == {"no-filter-mod": 1}
    assert "1 refused: no-filter-mod" in caplog.text


def test_an_older_public_ledger_gains_the_column_and_keeps_its_records(tmp_path):
    import sqlite3

    from fedfilter.coordinator import public_ledger
    from fedfilter.protos import fedfilter_pb2

    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)  # the schema as released before expected_noise_norm existed (frozen here)
    conn.executescript(
        """
        CREATE TABLE runs (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT NOT NULL UNIQUE, created_at_unix REAL NOT NULL,
            config_json TEXT NOT NULL, finished_at_unix REAL
        );
        CREATE TABLE records (
            run_id TEXT NOT NULL REFERENCES runs(run_id), round_id INTEGER NOT NULL,
            clients_sampled INTEGER NOT NULL, reports_received INTEGER NOT NULL,
            markers_received INTEGER NOT NULL, replies_dropped INTEGER NOT NULL, released INTEGER NOT NULL,
            aggregate_norm REAL NOT NULL, finished_at_unix REAL NOT NULL, record BLOB NOT NULL,
            PRIMARY KEY (run_id, round_id)
        ) WITHOUT ROWID;
        """
        + f"PRAGMA user_version={public_ledger.SCHEMA_VERSION};"
    )
    conn.execute("INSERT INTO runs (run_id, created_at_unix, config_json) VALUES ('old', 1.0, '{}')")
    conn.commit()
    conn.close()
    with PublicLedger(path) as ledger:
        record = fedfilter_pb2.PublicRoundRecord(
            run_id="old", round_id=1, clients_sampled=2, reports_received=2, released=True,
            aggregate_norm=3.0, expected_noise_norm=2.5,
        )  # fmt: skip
        ledger.append(record)
        assert ledger.records("old")[0].expected_noise_norm == 2.5
        bad = fedfilter_pb2.PublicRoundRecord(run_id="old", round_id=2, expected_noise_norm=float("nan"))
        with pytest.raises(ValueError, match="expected_noise_norm must be finite"):
            ledger.append(bad)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT expected_noise_norm FROM records").fetchall() == [(2.5,)]
    conn.close()


def test_an_app_the_owners_did_not_approve_is_named_by_code_and_hash(tmp_path, caplog):
    """The device runtime's refusal (``client/runtime``) reaches the operator as ``app-not-approved``
    with the FAB's hash, not as Flower's bare error code."""
    from flwr.app import Error

    from fedfilter.client.runtime.approval import Decision
    from fedfilter.protocol.flower_api import ErrorCode

    fab_hash = "ab" * 32

    def unapproved(msg):  # what client/runtime/runner.py sends for an app its owner did not approve
        reason = Decision(fab_hash, False, "", None).refusal()
        return Message(Error(code=ErrorCode.LOAD_CLIENT_APP_EXCEPTION, reason=reason), reply_to=msg)

    caplog.set_level(logging.WARNING)
    with pytest.raises(NothingReleasedError) as err:
        _start(_wrap(tmp_path), unapproved, rounds=1)
    message = str(err.value)
    assert "4 refused: app-not-approved" in message and "flower-error" not in message
    assert f"has not approved app {fab_hash}" in message and "fedfilter apps approve" in message
    assert message.count(fab_hash) == 1  # four identical texts, shown once
    assert "fedfilter round 1: 4 refused: app-not-approved" in caplog.text
