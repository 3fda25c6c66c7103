"""The device's runtime, without a Flower engine: approval before install/import, the device's own
filter around every approved app exactly once, and the message types it answers.

``Worker.run_task`` runs with Flower's Runtime API calls replaced by an in-memory fake (the task
input a hostile coordinator chooses: message, context with its run config, FAB); the deployment test
(tests/deploy/test_device_runtime_deploy.py) runs the same code against real SuperNodes.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.cli.build import build_fab_from_disk
from flwr.clientapp import ClientApp
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from helpers.flower_messages import delivered

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.runtime import runner as device_runtime
from fedfilter.client.runtime.app import allowed_types, device_handler
from fedfilter.client.runtime.approval import approve
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, STATUS_RECORD, request_record

REPO = Path(__file__).resolve().parents[3]
HOSTILE = REPO / "tests" / "apps" / "hostile_reader"
BUILTIN = REPO / "fedfilter" / "app"


def message(kind: str = "train", round_id: int = 1, *, extra: dict | None = None) -> Message:
    spec = RoundSpec(run_id="run-a", round_id=round_id, noise_multiplier=1.0, clip=1.0)
    content = RecordDict(
        {ARRAYS_RECORD: ArrayRecord({"w": Array(np.zeros(8, dtype=np.float32))}), REQUEST_RECORD: request_record(spec)}
    )
    for key, record in (extra or {}).items():
        content[key] = record
    return delivered(content, message_type=kind, message_id=f"m-{kind}-{round_id}")


def device(tmp_path: Path, name: str = "ledger", **hostile) -> Context:
    config = {
        "ledger-dir": str(tmp_path / name),
        "client-id": name,
        "budget-epsilon": 4.0,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
    }
    enrol_device(config)
    return Context(run_id=7, node_id=42, node_config={**config, **hostile}, state=RecordDict(), run_config={})


def spent(tmp_path: Path, name: str = "ledger") -> float:
    ledger = BudgetLedger.open(tmp_path / name)
    try:
        return float(ledger.summary()["spent_epsilon"])
    finally:
        ledger.close()


def raw_app(mods=None) -> ClientApp:
    """An app that would send the device's settings and its raw weights, with or without listed mods."""
    app = ClientApp(mods=mods or [])

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        received = next(iter(msg.content.array_records.values()))
        arrays = {k: Array(a.numpy() + np.float32(1.0)) for k, a in received.items()}
        leak = ConfigRecord({k: str(v) for k, v in context.node_config.items()})
        return Message(RecordDict({"arrays": ArrayRecord(arrays), "leak": leak}), reply_to=msg)

    @app.query()
    def query(msg: Message, context: Context) -> Message:
        return Message(
            RecordDict({"leak": ConfigRecord({"budget": str(context.node_config["budget-epsilon"])})}), reply_to=msg
        )

    return app


# --- the device's filter around an approved app ---------------------------------------------------
def test_the_filter_wraps_an_app_that_lists_no_mod(tmp_path):
    reply = device_handler(raw_app(), secure_aggregation=False)(message(), device(tmp_path))
    assert not reply.has_error()
    assert set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}  # the leak was dropped
    assert spent(tmp_path) > 0


@pytest.mark.timeout(30, method="thread")  # a mod acting twice would wait forever on its own ledger lock
def test_an_app_that_lists_the_mods_itself_is_filtered_once(tmp_path):
    """Attack: an approved app listing the mods itself must not be filtered (and charged) twice."""
    handlers = {
        "plain": device_handler(raw_app(), secure_aggregation=True),
        "listed": device_handler(raw_app([secure_aggregation_mod, individual_filter_mod]), secure_aggregation=True),
    }
    contexts = {name: device(tmp_path, name) for name in handlers}
    for round_id in (1, 2):
        for name, handle in handlers.items():
            reply = handle(message(round_id=round_id), contexts[name])
            assert not reply.has_error(), (name, reply.error)
            assert set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
    assert spent(tmp_path, "plain") > 0
    assert spent(tmp_path, "listed") == pytest.approx(spent(tmp_path, "plain"), rel=1e-12)


def hostile_mod(*, second_arrays: bool):
    """An app's own mod, listed outside the app's copy of ``individual_filter_mod``: it reads the device's
    ledger and settings and adds them, with the example count, to the reply (and, with ``second_arrays``,
    the raw trained weights as a second ArrayRecord)."""

    def mod(msg: Message, context: Context, call_next) -> Message:
        reply = call_next(msg, context)
        ledger = BudgetLedger.open(Path(context.node_config["ledger-dir"]))
        try:
            budget = ledger.summary()
        finally:
            ledger.close()
        reply.content["metrics"] = MetricRecord({"num-examples": 1234, "spent": float(budget["spent_epsilon"])})
        reply.content["leak"] = ConfigRecord({k: str(v) for k, v in context.node_config.items()})
        if second_arrays:
            reply.content["raw"] = ArrayRecord({k: Array(v.numpy()) for k, v in reply.content[ARRAYS_RECORD].items()})
        return reply

    return mod


@pytest.mark.parametrize("second_arrays", [False, True])
def test_an_apps_own_mods_add_nothing_to_the_reply(tmp_path, second_arrays):
    """Attack: an approved app lists its own mods, one of them outside its copy of the filter. The device's
    filter is outermost (device_handler; mod_once passes the app's copy through), so the reply is exactly
    the noisy update and the status: bit for bit the reply of a device running a plain app (the same
    training; with a second ArrayRecord the training output is unusable, so the update is zero: the reply
    of a plain app that trains nothing), under the same owner's noise seed."""
    seed = {"noise-seed": 9}
    hostile_app = raw_app([hostile_mod(second_arrays=second_arrays), individual_filter_mod])
    reference_app = raw_app()
    if second_arrays:
        reference_app = ClientApp()
        reference_app.train()(
            lambda msg, ctx: Message(RecordDict({"arrays": msg.content[ARRAYS_RECORD]}), reply_to=msg)
        )
    got = device_handler(hostile_app, secure_aggregation=True)(message(), device(tmp_path, "hostile", **seed))
    want = device_handler(reference_app, secure_aggregation=True)(message(), device(tmp_path, "reference", **seed))
    assert not got.has_error() and not want.has_error()
    assert set(got.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
    assert dict(got.content[STATUS_RECORD]) == {"status": "report"}
    assert list(got.content[ARRAYS_RECORD].keys()) == ["w"]
    arrays = {k: a.numpy() for k, a in got.content[ARRAYS_RECORD].items()}
    expected = {k: a.numpy() for k, a in want.content[ARRAYS_RECORD].items()}
    assert all(arrays[k].dtype == expected[k].dtype and arrays[k].tobytes() == expected[k].tobytes() for k in expected)
    assert spent(tmp_path, "hostile") == pytest.approx(spent(tmp_path, "reference"), rel=1e-12)


@pytest.mark.parametrize("kind", ["query", "evaluate", "query.leak", "system"])
def test_other_message_types_are_refused_and_nothing_runs(tmp_path, kind):
    """Attack: an approved app that answers query messages with the device's data."""
    ran = []
    app = raw_app()
    reply = device_handler(lambda m, c: ran.append(m) or app(m, c), secure_aggregation=False)(
        message(kind), device(tmp_path)
    )
    assert reply.has_error() and "refused" in reply.error.reason and ran == []


def test_only_the_owner_lets_query_through_and_evaluate_stays_refused(tmp_path):
    handle = device_handler(raw_app(), secure_aggregation=False, allowed=allowed_types(["query", "evaluate"]))
    assert not handle(message("query"), device(tmp_path)).has_error()
    evaluated = handle(message("evaluate"), device(tmp_path, "e"))
    assert evaluated.has_error() and "evaluation" in evaluated.error.reason
    with pytest.raises(ValueError, match="--allow-message-type"):
        allowed_types(["train", "system"])


def test_secagg_rounds_need_the_owners_consent(tmp_path):
    secagg = message(extra={RECORD_KEY_CONFIGS: ConfigRecord({"stage": "setup"})})
    reply = device_handler(raw_app(), secure_aggregation=False)(secagg, device(tmp_path))
    assert reply.has_error() and "--secure-aggregation" in reply.error.reason
    assert spent(tmp_path) == 0


# --- the worker: approval before anything is installed or imported ----------------------------------
class FakeRuntime:
    """Flower's Runtime API as a hostile coordinator fills it: one task input, the replies kept."""

    def __init__(self, monkeypatch, msg: Message, context: Context, fab: bytes, run_id: int = 7):
        from flwr.supernode.runtime import run_clientapp

        self.pushed: list[Message] = []
        self.outputs: list[tuple] = []
        run = SimpleNamespace(run_id=run_id, fab_id="fedfilter-test/hostile-reader", fab_version="0.1.0")
        fab_obj = SimpleNamespace(content=fab, hash_str="0" * 64)  # the coordinator's claim is ignored
        monkeypatch.setattr(run_clientapp, "pull_task_input", lambda client: (msg, context, run, fab_obj))
        monkeypatch.setattr(run_clientapp, "push_message", lambda client, reply, ctx: self.pushed.append(reply))
        monkeypatch.setattr(
            run_clientapp,
            "push_task_output",
            lambda client, context, sub_status, details: self.outputs.append((sub_status, details)),
        )
        monkeypatch.setattr(
            device_runtime, "_client", lambda settings, interceptors: SimpleNamespace(close=lambda: None)
        )
        import flwr.supercore.heartbeat as heartbeat

        monkeypatch.setattr(
            heartbeat, "HeartbeatSender", lambda fn: SimpleNamespace(start=lambda: None, stop=lambda: None)
        )


@pytest.fixture
def markers(tmp_path, monkeypatch) -> Path:
    # The app's modules may be loaded already by an earlier test of this process (the suite's order
    # and its workers vary): each test starts from a process that has not imported them.
    for name in [m for m in sys.modules if m == "hostile_reader" or m.startswith("hostile_reader.")]:
        monkeypatch.delitem(sys.modules, name)
    out = tmp_path / "markers"
    out.mkdir()
    monkeypatch.setenv("FEDFILTER_TEST_MARKER_DIR", str(out))
    monkeypatch.setenv("FLWR_HOME", str(tmp_path / "flwr-home"))
    return out


def test_an_unapproved_fab_is_refused_before_install_or_import(tmp_path, monkeypatch, markers):
    """Attack: approval claimed in the node config and run config the coordinator sends, and in the
    FAB's pyproject; the owner approved only the built-in app."""
    approvals = tmp_path / "owner" / "approved_apps.json"
    approve(BUILTIN, approvals)
    fab = build_fab_from_disk(HOSTILE)
    ctx = device(tmp_path, **{"approved-apps": "hostile-reader", "fedfilter-approved": "true"})
    ctx.run_config.update({"approved": True, "fedfilter-approved-apps": "hostile-reader"})
    runtime = FakeRuntime(monkeypatch, message(), ctx, fab)
    device_runtime.Worker(device_runtime.RuntimeSettings("127.0.0.1:1"), approvals=approvals).run_task("token")
    (reply,) = runtime.pushed
    import hashlib

    assert reply.has_error() and hashlib.sha256(fab).hexdigest() in reply.error.reason
    assert "fedfilter apps approve" in reply.error.reason
    assert list(markers.iterdir()) == []  # no module of the app was imported
    assert not (tmp_path / "flwr-home").exists()  # nothing was installed
    assert spent(tmp_path) == 0


def test_an_approved_fab_runs_inside_the_filter_and_stays_loaded(tmp_path, monkeypatch, markers):
    approvals = tmp_path / "owner" / "approved_apps.json"
    fab = build_fab_from_disk(HOSTILE)
    approve(HOSTILE, approvals)
    worker = device_runtime.Worker(device_runtime.RuntimeSettings("127.0.0.1:1"), approvals=approvals)
    ctx = device(tmp_path)
    for round_id in (1, 2):
        runtime = FakeRuntime(monkeypatch, message(round_id=round_id), ctx, fab)
        worker.run_task("token")
        (reply,) = runtime.pushed
        assert not reply.has_error(), reply.error
        assert set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}  # the app's leak never leaves
    assert len(list(markers.glob("imported-*"))) == 1  # imported once, kept for the run's next message
    assert (tmp_path / "flwr-home" / device_runtime.APPS_SUBDIR / reply_hash(fab)).is_dir()
    assert spent(tmp_path) > 0
    runtime = FakeRuntime(monkeypatch, message("query"), ctx, fab)
    worker.run_task("token")
    assert runtime.pushed[0].has_error()  # the app's query handler never runs
    # A revocation applies at the next message, even with the app loaded.
    from fedfilter.client.runtime.approval import revoke

    revoke(reply_hash(fab), approvals)
    runtime = FakeRuntime(monkeypatch, message(round_id=3), ctx, fab)
    worker.run_task("token")
    assert runtime.pushed[0].has_error() and "not approved" in runtime.pushed[0].error.reason
    from fedfilter.protocol.refusals import refusal_code

    assert refusal_code(runtime.pushed[0].error.reason) == "app-not-approved"  # the operator counts it by code


def test_a_worker_serves_one_run(tmp_path, monkeypatch, markers):
    approvals = tmp_path / "owner" / "approved_apps.json"
    approve(BUILTIN, approvals)
    fab = build_fab_from_disk(BUILTIN)
    worker = device_runtime.Worker(device_runtime.RuntimeSettings("127.0.0.1:1"), approvals=approvals, run_id=7)
    runtime = FakeRuntime(monkeypatch, message(), device(tmp_path), fab, run_id=8)
    worker.run_task("token")
    assert runtime.pushed[0].has_error() and spent(tmp_path) == 0


def reply_hash(fab: bytes) -> str:
    import hashlib

    return hashlib.sha256(fab).hexdigest()


def test_flowers_flags_pass_through_and_the_ones_it_sets_are_refused():
    runtime, flags = device_runtime.split_flower_args(
        ["--superlink", "127.0.0.1:9092", "--port", "9999", "--node-config", "a=1", "--root-certificates", "ca.crt"]
    )
    assert (runtime.host, runtime.port) == ("127.0.0.1", 9999)
    assert flags[:2] == ["--superlink", "127.0.0.1:9092"] and "--node-config" in flags
    for flag in (["--isolation", "subprocess"], ["--isolation=subprocess"], ["--superexec-auth-secret-file", "x"]):
        with pytest.raises(ValueError, match="sets"):
            device_runtime.split_flower_args(flag)


def test_the_cli_hands_unknown_flags_only_to_supernode(capsys):
    from fedfilter.cli import build_parser, main

    parser = build_parser()
    args, extra = parser.parse_known_args(["supernode", "--superlink", "x:1", "--secure-aggregation"])
    assert args.secure_aggregation and extra == ["--superlink", "x:1"]
    with pytest.raises(SystemExit):
        main(["apps", "list", "--superlink", "x"])


def test_every_printed_guarantee_names_what_a_device_trusts():
    import argparse

    from fedfilter.cli.demo_report import guarantee_text
    from fedfilter.client.runtime.approval import TRUST_TEXT

    for placement in ("local", "distributed"):
        args = argparse.Namespace(placement=placement, after_exhaustion="noise-only", min_reports=2, reply_hold_s=0)
        assert guarantee_text(args).endswith(TRUST_TEXT)
    assert "approved" in TRUST_TEXT and "nothing the coordinator sends" in TRUST_TEXT


def test_a_tls_runtime_api_needs_its_ca_and_the_worker_uses_it():
    with pytest.raises(ValueError, match="--ssl-ca-certfile"):
        device_runtime.run_supernode(
            ["--ssl-certfile", "rt.pem", "--ssl-keyfile", "rt.key"], secure_aggregation=False, allow_message_types=()
        )
    settings = device_runtime.RuntimeSettings("127.0.0.1:9094", insecure=False, root_certificates="ca.crt")
    argv = settings.worker_argv(parent_pid=1)
    assert argv[argv.index("--root-certificates") + 1] == "ca.crt" and "--insecure" not in argv
