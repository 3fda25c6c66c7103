"""Fast tests of the Flower mod, the coordinator's reply checks and the built-in ClientApp.

Messages and Contexts are built by hand and the mod is called directly: no Flower engine runs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from harness.probe_coordinator import FilteredMeanStrategy
from helpers.flower_messages import delivered
from helpers.mods import KEYS, SHAPES, Handler, context, model_arrays, records, spec, train_message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.flower.simulated_mod import simulated_device_config_mod
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.coordinator.strategy import classify_reply, plain_mean, report_norm_bound
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, STATUS_RECORD, request_record


def reply_arrays(reply: Message) -> list[np.ndarray]:
    return next(iter(reply.content.array_records.values())).to_numpy_ndarrays()


# --- the reply --------------------------------------------------------------------------------
def test_contributed_reply_holds_only_the_noisy_update_and_a_report_status(tmp_path):
    handler, ctx = Handler(step=1.0), context(tmp_path)
    reply = individual_filter_mod(train_message(spec()), ctx, handler)

    assert not reply.has_error()
    assert set(reply.content.keys()) == {ARRAYS_RECORD, STATUS_RECORD}
    assert len(reply.content.metric_records) == 0  # num-examples and training metrics dropped
    assert dict(reply.content[STATUS_RECORD]) == {"status": "report"}
    out = reply.content[ARRAYS_RECORD]
    assert list(out.keys()) == KEYS
    assert [(a.dtype, a.shape) for a in out.to_numpy_ndarrays()] == [(np.float32, s) for s in SHAPES]
    recs, spent, budget = records(tmp_path)
    assert [r.status for r in recs] == ["contributed"]
    assert recs[0].sensitivity <= 1.0 + 1e-12  # the update of norm ~50 was clipped to C = 1
    assert 0 < spent <= budget


def test_the_reply_is_the_update_not_the_weights(tmp_path):
    # Large noise multiplier, tiny clip: the reply must be close to the clipped *update* (not w + update).
    ctx = context(tmp_path, **{"noise-seed": 3})
    reply = individual_filter_mod(train_message(spec(z=0.5, clip=1e-3)), ctx, Handler(step=1.0))
    w, b = reply_arrays(reply)
    assert abs(float(w.mean())) < 1e-3 and abs(float(b.mean())) < 1e-3  # weights were 0.5


def test_noise_only_reply_after_exhaustion_looks_like_a_report_and_the_handler_always_runs(tmp_path):
    handler = Handler(step=1.0)
    ctx = context(tmp_path, **{"budget-epsilon": 1.0})  # mu ~ 0.27 < one round at z = 1
    replies = [individual_filter_mod(train_message(spec(r), message_id=f"m{r}"), ctx, handler) for r in (1, 2, 3, 4)]

    recs, spent, budget = records(tmp_path)
    statuses = [r.status for r in recs]
    assert "noise-only" in statuses and statuses[0] == "contributed"
    assert spent <= budget * (1 + 1e-12)
    assert handler.calls == 4  # trained every round, exhausted or not
    for reply in replies:  # identical structure whatever the status
        assert dict(reply.content[STATUS_RECORD]) == {"status": "report"}
        assert list(reply.content[ARRAYS_RECORD].keys()) == KEYS
        assert [a.shape for a in reply_arrays(reply)] == SHAPES
        assert len(reply.content.metric_records) == 0


def test_noise_only_reply_is_pure_noise_with_the_requested_std(tmp_path):
    ctx = context(tmp_path, **{"budget-epsilon": 0.5})
    z, clip = 2.0, 0.25
    for r in (1, 2, 3):  # spends it all (a float32 rounding residue can take a second round)
        individual_filter_mod(train_message(spec(r, z=z, clip=clip)), ctx, Handler())
    reply = individual_filter_mod(train_message(spec(4, z=z, clip=clip)), ctx, Handler())
    assert records(tmp_path)[0][-1].status == "noise-only"
    flat = np.concatenate([a.ravel().astype(np.float64) for a in reply_arrays(reply)])
    n = flat.size  # 2050 draws: the sample std is within 4 standard errors of z * clip
    assert abs(flat.mean()) < 4 * z * clip / math.sqrt(n)
    assert abs(flat.std() / (z * clip) - 1) < 4 / math.sqrt(2 * n)


def test_leave_mode_answers_with_the_left_marker_and_no_arrays(tmp_path):
    handler = Handler()
    ctx = context(tmp_path, **{"budget-epsilon": 1.0, "after-exhaustion": "leave"})
    replies = [individual_filter_mod(train_message(spec(r)), ctx, handler) for r in (1, 2, 3)]
    assert dict(replies[0].content[STATUS_RECORD]) == {"status": "report"}
    last = replies[-1]
    assert not last.has_error()
    assert dict(last.content[STATUS_RECORD]) == {"status": "left"}
    assert len(last.content.array_records) == 0 and len(last.content.metric_records) == 0
    assert records(tmp_path)[0][-1].status == "left"


# --- malicious or broken requests ---------------------------------------------------------------
@pytest.mark.parametrize(
    "bad, field",
    [
        (dict(z=1e-9), "noise_multiplier"),
        (dict(z=float("nan")), "noise_multiplier"),
        (dict(z=float("inf")), "noise_multiplier"),
        (dict(clip=float("nan")), "clip"),
        (dict(clip=-1.0), "clip"),
        (dict(placement="distributed", m=10), "distributed"),  # the device does not allow it
        (dict(placement="central"), "placement"),
    ],
)
def test_bad_requests_get_an_error_naming_the_field_and_nothing_is_spent_or_trained(tmp_path, bad, field):
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(**bad)), context(tmp_path), handler)
    assert reply.has_error()
    assert field in reply.error.reason
    assert handler.calls == 0
    assert not (tmp_path / "ledger").exists() or records(tmp_path)[0] == []


@pytest.mark.parametrize(
    "request_cfg, words",
    [
        (None, [REQUEST_RECORD]),
        (
            ConfigRecord({"run-id": "r", "round-id": 1, "clip": 1.0, "placement": "local", "min-reports": 1}),
            ["noise-multiplier", "missing"],
        ),
        (
            ConfigRecord(
                {
                    "run-id": "r",
                    "round-id": "1",
                    "noise-multiplier": 1.0,
                    "clip": 1.0,
                    "placement": "local",
                    "min-reports": 1,
                }
            ),
            ["round-id", "'1'"],
        ),
        (
            ConfigRecord(
                {
                    "run-id": "r",
                    "round-id": 1,
                    "noise-multiplier": True,
                    "clip": 1.0,
                    "placement": "local",
                    "min-reports": 1,
                }
            ),
            ["noise-multiplier", "True"],
        ),
    ],
)
def test_malformed_requests_are_refused(tmp_path, request_cfg, words):
    handler = Handler()
    msg = train_message(None, request=request_cfg)
    reply = individual_filter_mod(msg, context(tmp_path), handler)
    assert reply.has_error() and handler.calls == 0
    for w in words:
        assert w in reply.error.reason


def test_huge_clip_cannot_spend_beyond_the_budget(tmp_path):
    ctx = context(tmp_path, **{"budget-epsilon": 2.0})
    for r in range(1, 6):
        reply = individual_filter_mod(train_message(spec(r, z=0.5, clip=1e12)), ctx, Handler(step=1e6))
        assert not reply.has_error()
    # The noise grows with the clip: the whole update goes through, and costs next to nothing.
    recs, spent, budget = records(tmp_path)
    assert spent <= budget * (1 + 1e-12)
    for r in recs:
        assert r.noise_std == 0.5 * 1e12
        assert float(r.charge[0]) == pytest.approx((r.sensitivity / r.noise_std) ** 2, rel=1e-9)
        assert float(r.charge[0]) < 1e-7


def test_a_replayed_round_gets_an_error_and_no_second_release(tmp_path):
    handler, ctx = Handler(), context(tmp_path)
    first = individual_filter_mod(train_message(spec(1)), ctx, handler)
    assert not first.has_error()
    again = individual_filter_mod(train_message(spec(1)), ctx, handler)
    assert again.has_error() and "already" in again.error.reason and "round-id=1" in again.error.reason
    assert handler.calls == 1
    assert len(records(tmp_path)[0]) == 1


def test_a_new_run_id_within_one_flower_run_is_refused(tmp_path):
    ctx = context(tmp_path)
    assert not individual_filter_mod(train_message(spec(1, run_id="a")), ctx, Handler()).has_error()
    reply = individual_filter_mod(train_message(spec(2, run_id="b")), ctx, Handler())
    assert reply.has_error() and "'b'" in reply.error.reason and "'a'" in reply.error.reason


def test_restarted_client_keeps_its_spent_budget_across_runs(tmp_path):
    ctx1 = context(tmp_path, **{"budget-epsilon": 3.0})
    individual_filter_mod(train_message(spec(1, run_id="run-1")), ctx1, Handler())
    spent_before = records(tmp_path)[1]
    # A new Flower run: fresh Context (empty state), new run-id, same ledger directory.
    ctx2 = context(tmp_path, **{"budget-epsilon": 3.0})
    individual_filter_mod(train_message(spec(1, run_id="run-2")), ctx2, Handler())
    recs, spent_after, budget = records(tmp_path)
    assert [r.run_id for r in recs] == ["run-1", "run-2"]
    assert spent_before > 0 and spent_after >= spent_before
    assert spent_after <= budget * (1 + 1e-12)


def test_the_budget_comes_only_from_the_node_config(tmp_path):
    # A request that smuggles device settings in changes nothing; a node config asking for a
    # different budget than the one enrolled is refused without revealing either budget.
    request = request_record(spec(1))
    request["budget-epsilon"] = 1000.0
    request["after-exhaustion"] = "leave"
    individual_filter_mod(train_message(None, request=request), context(tmp_path), Handler())
    assert records(tmp_path)[2] == 4.0
    reply = individual_filter_mod(train_message(spec(2)), context(tmp_path, **{"budget-epsilon": 9.0}), Handler())
    assert reply.has_error() and "9" not in reply.error.reason and "4" not in reply.error.reason


def test_missing_device_settings_give_a_generic_error(tmp_path):
    ctx = Context(run_id=7, node_id=42, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    handler = Handler()
    reply = individual_filter_mod(train_message(spec()), ctx, handler)
    assert reply.has_error() and "device" in reply.error.reason and handler.calls == 0


# --- failures after an accepted request become pure noise -----------------------------------------
@pytest.mark.parametrize("handler", [Handler(fail=True), Handler(nan=True)])
def test_failed_training_or_nan_update_sends_pure_noise_not_an_error(tmp_path, handler):
    reply = individual_filter_mod(train_message(spec()), context(tmp_path), handler)
    assert not reply.has_error()
    assert dict(reply.content[STATUS_RECORD]) == {"status": "report"}
    assert [a.shape for a in reply_arrays(reply)] == SHAPES
    recs, spent, _ = records(tmp_path)
    assert recs[0].sensitivity == 0.0 and spent == 0.0


def test_noise_seed_is_reproducible_per_round_and_differs_between_rounds(tmp_path):
    out = []
    for d in ("a", "b"):
        ctx = context(tmp_path / d, **{"noise-seed": 11})
        out.append(
            [reply_arrays(individual_filter_mod(train_message(spec(r)), ctx, Handler(step=0.0)))[1] for r in (1, 2)]
        )
    np.testing.assert_array_equal(out[0][0], out[1][0])
    assert not np.allclose(out[0][0], out[0][1])


def test_integer_buffers_are_never_released(tmp_path):
    arrays = [np.full((4, 3), 0.5, np.float32), np.array(17, dtype=np.int64)]

    def handler(msg, ctx):
        rec = next(iter(msg.content.array_records.values()))
        new = {"w": Array(rec["w"].numpy() + 1), "b": Array(np.array(99, dtype=np.int64))}
        return Message(RecordDict({"arrays": ArrayRecord(new)}), reply_to=msg)

    reply = individual_filter_mod(train_message(spec(), arrays=arrays), context(tmp_path), handler)
    w, b = reply_arrays(reply)
    assert w.dtype == np.float32 and b.dtype == np.int64 and int(b) == 0


# --- other message types ----------------------------------------------------------------------
def test_evaluate_on_private_data_is_refused(tmp_path):
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(), message_type="evaluate"), context(tmp_path), handler)
    assert reply.has_error() and "evaluat" in reply.error.reason and handler.calls == 0


def test_query_passes_through_untouched(tmp_path):
    msg = train_message(None, message_type="query")
    sentinel = Message(RecordDict({"x": ConfigRecord({"y": 1})}), reply_to=msg)
    assert individual_filter_mod(msg, context(tmp_path), lambda m, c: sentinel) is sentinel


def test_train_actions_are_filtered_too(tmp_path):
    reply = individual_filter_mod(train_message(spec(), message_type="train.custom"), context(tmp_path), Handler())
    assert len(reply.content.metric_records) == 0 and records(tmp_path)[0][0].status == "contributed"


def test_simulated_device_config_mod_gives_each_partition_its_own_settings(tmp_path):
    seen = {}
    mod = simulated_device_config_mod(
        {0: {"ledger-dir": "/a", "budget-epsilon": 1.0}, 1: {"ledger-dir": "/b", "budget-epsilon": 2.0}}
    )
    for pid in (0, 1):
        ctx = Context(run_id=1, node_id=pid, node_config={"partition-id": pid}, state=RecordDict(), run_config={})
        mod(train_message(None), ctx, lambda m, c: seen.setdefault(pid, dict(c.node_config)))
    assert seen[0]["ledger-dir"] == "/a" and seen[1]["budget-epsilon"] == 2.0
    assert seen[1]["partition-id"] == 1


# --- the coordinator's checks ---------------------------------------------------------------------
def _reply(status="report", arrays=None, keys=KEYS, error=False):
    msg = train_message(spec())
    if error:
        from flwr.app import Error

        return Message(Error(code=6, reason="x"), reply_to=msg)
    content = RecordDict()
    if arrays is not None:
        content[ARRAYS_RECORD] = ArrayRecord({k: Array(a) for k, a in zip(keys, arrays)})
    content[STATUS_RECORD] = ConfigRecord({"status": status})
    return Message(content, reply_to=msg)


def test_coordinator_classifies_replies_and_drops_bad_ones():
    template, bound = model_arrays(), report_norm_bound(clip=1.0, noise_std=1.0, dim=2050)
    good = [np.random.default_rng(0).normal(0, 1, s).astype(np.float32) for s in SHAPES]
    assert classify_reply(_reply(arrays=good), KEYS, template, bound)[0] == "report"
    assert classify_reply(_reply("left"), KEYS, template, bound)[0] == "marker"
    bad = {
        "error": _reply(error=True),
        "nan": _reply(arrays=[np.full(SHAPES[0], np.nan, np.float32), good[1]]),
        "dtype": _reply(arrays=[good[0].astype(np.float64), good[1]]),
        "shape": _reply(arrays=[good[0][:10], good[1]]),
        "keys": _reply(arrays=good, keys=["w", "c"]),
        "huge": _reply(arrays=[good[0] * 1000, good[1]]),
        "status": _reply("contributed", arrays=good),
        "left with arrays": _reply("left", arrays=good),
    }
    for name, msg in bad.items():
        kind, arrays, reason = classify_reply(msg, KEYS, template, bound)
        assert kind == "dropped" and arrays is None and reason, name


def test_plain_mean_ignores_example_counts_and_distributed_rounds_need_min_reports():
    template = model_arrays()
    reports = [model_arrays(1.0), model_arrays(3.0)]
    assert all(np.all(m == 2.0) for m in plain_mean(reports, template))
    strategy = FilteredMeanStrategy(noise_multiplier=1.0, clip=1.0, placement="distributed", min_reports=3)
    from fedfilter.coordinator.strategy import RoundTally

    tally = RoundTally(reports=reports)
    assert not strategy.released(tally)
    weights, norm = strategy.step(template, tally)
    assert norm == 0.0 and all(np.all(w == 0) for w in weights)
    tally.reports.append(model_arrays(2.0))
    assert strategy.released(tally)
    weights, norm = strategy.step(template, tally)
    assert all(np.allclose(w, 2.0) for w in weights) and norm > 0


# --- the built-in ClientApp, called directly (no engine) ----------------------------------------
def test_builtin_client_app_trains_its_partition_behind_the_filter(tmp_path):
    torch = pytest.importorskip("torch")
    from fedfilter.app.client_app import make_client_app
    from fedfilter.simulations.tasks.training import get_weights

    torch.manual_seed(0)
    from fedfilter.simulations.tasks.models import DigitsMLP

    model = DigitsMLP()
    keys, weights = list(model.state_dict().keys()), get_weights(model)
    content = RecordDict(
        {
            ARRAYS_RECORD: ArrayRecord({k: Array(w) for k, w in zip(keys, weights)}),
            "config": ConfigRecord({"task": "digits", "num-clients": 4, "local-epochs": 1, "lr": 0.1}),
            REQUEST_RECORD: request_record(spec(1, z=0.5, clip=0.4)),
        }
    )
    meta = delivered(RecordDict(), dst_node_id=2).metadata  # as node 2 receives it
    device = {"ledger-dir": str(tmp_path / "dev2"), "budget-epsilon": 10.0, "reply-hold-s": 0}  # a fast test
    enrol_device(device)
    app = make_client_app({2: device})
    ctx = Context(
        run_id=7, node_id=2, node_config={"partition-id": 2, "num-partitions": 4}, state=RecordDict(), run_config={}
    )
    reply = app(Message(content=content, metadata=meta), ctx)
    assert not reply.has_error(), reply.error.reason if reply.has_error() else ""
    assert list(reply.content[ARRAYS_RECORD].keys()) == keys
    assert len(reply.content.metric_records) == 0
    rec = BudgetLedger.open(tmp_path / "dev2").records()
    assert [r.status for r in rec] == ["contributed"] and 0 < rec[0].sensitivity <= 0.4


def test_a_replaced_ledger_file_is_reopened_not_written_through_a_stale_connection(tmp_path):
    import shutil

    ctx = context(tmp_path, **{"budget-epsilon": 3.0})
    individual_filter_mod(train_message(spec(1, run_id="r1")), ctx, Handler())
    assert len(records(tmp_path)[0]) == 1
    shutil.rmtree(tmp_path / "ledger")  # the owner wipes the device and starts a new ledger (a fresh budget)
    BudgetLedger.enrol(tmp_path / "ledger", client_id="alice", epsilon=3.0, delta=1e-5, recover="replace").close()
    ctx = context(tmp_path, **{"budget-epsilon": 3.0})
    reply = individual_filter_mod(train_message(spec(1, run_id="r2")), ctx, Handler())
    assert not reply.has_error()
    recs = records(tmp_path)[0]
    assert [r.run_id for r in recs] == ["r2"]  # written to the new file, not the unlinked one
