"""IndividualFilterStrategy around Flower's FedAvg and FedAdam, on hand-built reply Messages.

A fake Grid stands in for the transport. Every expected aggregate is computed here with numpy from
the reports, independently of ``fedfilter.coordinator``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAdam, FedAvg, FedAvgM
from helpers.strategy import (
    CLIP,
    KEYS,
    SHAPES,
    FakeGrid,
    Z,
    _client,
    _task_identity,  # noqa: F401 (an autouse fixture: Flower's ids for messages built here)
    as_record,
    error_reply,
    global_arrays,
    marker,
    noisy_update,
    report,
    wrap,
)

from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, STATUS_RECORD, round_spec_from_record
from fedfilter.protos import fedfilter_pb2


class SpyFedAvg(FedAvg):
    """FedAvg that keeps what it was handed (for the test only)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.handed = []

    def aggregate_train(self, server_round, replies):
        replies = list(replies)
        self.handed.append(replies)
        return super().aggregate_train(server_round, replies)


def configure(strategy, round_id=1, grid=None, arrays=None):
    arrays = global_arrays() if arrays is None else arrays
    grid = grid or FakeGrid()
    config = ConfigRecord({"local-epochs": 2, "lr": 0.1})
    return list(strategy.configure_train(round_id, as_record(arrays), config, grid)), arrays


def by_node(messages):
    return {m.metadata.dst_node_id: m for m in messages}


def expected_fedavg(g, updates):
    """The plain mean in float64, cast to float32, then the step w + mean in float64, cast back."""
    out = []
    for i, like in enumerate(g):
        mean = (sum(u[i].astype(np.float64) for u in updates) / len(updates)).astype(np.asarray(like).dtype)
        out.append((np.asarray(like).astype(np.float64) + mean.astype(np.float64)).astype(np.asarray(like).dtype))
    return out


def test_configure_train_adds_the_round_request_to_the_inner_strategys_messages():
    strategy = wrap(FedAvg(fraction_train=0.5, min_available_nodes=1, min_train_nodes=1), message_ttl_s=900.0)
    messages, _ = configure(strategy, round_id=3)
    assert len(messages) == 5 and len({m.metadata.dst_node_id for m in messages}) == 5  # FedAvg's sampling
    for msg in messages:
        spec = round_spec_from_record(msg.content[REQUEST_RECORD])
        assert (spec.run_id, spec.round_id, spec.noise_multiplier, spec.clip) == ("run-w", 3, Z, CLIP)
        assert (spec.placement, spec.min_reports) == ("local", 1)
        assert msg.content["config"]["server-round"] == 3 and msg.content["config"]["lr"] == 0.1
        assert list(msg.content[ARRAYS_RECORD].keys()) == KEYS
        assert msg.metadata.ttl == 900.0 and msg.metadata.message_type == MessageType.TRAIN
    # Without run_name the run id is the Flower run's.
    plain = wrap(run_name=None)
    msgs, _ = configure(plain, grid=FakeGrid(run_id=42))
    assert round_spec_from_record(msgs[0].content[REQUEST_RECORD]).run_id == "flwr-42"


def test_fedavg_aggregate_is_global_plus_plain_mean_of_valid_reports_and_bad_replies_are_dropped():
    inner = SpyFedAvg(min_available_nodes=1, min_train_nodes=1)
    strategy = wrap(inner)
    messages, g = configure(strategy)
    msg = by_node(messages)
    good = {11: noisy_update(1), 12: noisy_update(2), 13: noisy_update(3)}
    u = noisy_update(4)
    stranger = Message(RecordDict(), dst_node_id=99, message_type=MessageType.TRAIN)
    replies = [report(msg[n], good[n], metrics={"num-examples": 1000 * n}) for n in good]  # counts are ignored
    replies += [
        marker(msg[14]),
        error_reply(msg[15]),
        report(msg[16], u, keys=["w", "c", "steps"]),  # wrong keys
        report(msg[17], [u[0].astype(np.float64), u[1], u[2]]),  # wrong dtype
        report(msg[18], [np.full(SHAPES[0], np.nan, np.float32), u[1], u[2]]),  # NaN
        report(msg[19], [u[0] * 1000, u[1], u[2]]),  # a norm no noise explains
        report(msg[11], noisy_update(5)),  # a second reply from node 11
        report(stranger, noisy_update(6)),  # a node not asked
        report(msg[20], u, status="contributed"),  # an unknown status
    ]
    arrays, metrics = strategy.aggregate_train(1, replies)

    expected = expected_fedavg(g, list(good.values()))
    for key, want in zip(KEYS, expected):
        got = arrays[key].numpy()
        assert got.dtype == np.asarray(want).dtype and got.shape == np.shape(want)
        np.testing.assert_array_equal(got, want)
    out = strategy.last_outcome
    assert (out.sampled, out.reports, out.markers, out.dropped, out.released) == (10, 3, 1, 8, True)
    assert dict(metrics) == {"reports-received": 3, "markers-received": 1, "replies-dropped": 8, "released": 1}
    mean = [sum(v[i].astype(np.float64) for v in good.values()) / 3 for i in range(2)]
    assert out.aggregate_norm == pytest.approx(math.sqrt(sum(float(np.sum(m**2)) for m in mean)), rel=1e-6)
    # The inner strategy got one reply: global + mean, weight 1; no example count reached it.
    (handed,) = inner.handed
    assert len(handed) == 1
    (metric_record,) = handed[0].content.metric_records.values()
    assert dict(metric_record) == {"num-examples": 1}
    assert list(handed[0].content.array_records) == [ARRAYS_RECORD]
    # The replies themselves are left as they came.
    assert replies[0].content[STATUS_RECORD]["status"] == "report"
    np.testing.assert_array_equal(replies[0].content[ARRAYS_RECORD]["w"].numpy(), good[11][0])


def test_fedavg_result_is_the_same_whatever_example_counts_clients_claim():
    results = []
    for counts in ((1, 1, 1), (1, 10**6, 3)):
        strategy = wrap()
        messages, _ = configure(strategy)
        msg = by_node(messages)
        replies = [report(msg[n], noisy_update(n), metrics={"num-examples": c}) for n, c in zip((11, 12, 13), counts)]
        arrays, _ = strategy.aggregate_train(1, replies)
        results.append([arrays[k].numpy() for k in KEYS])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_fedadam_applies_its_own_step_to_the_mean_update():
    inner = FedAdam(min_available_nodes=1, min_train_nodes=1, eta=0.1, beta_1=0.9, beta_2=0.99, tau=1e-3)
    strategy = wrap(inner)
    g = global_arrays()[:2]  # FedAdam's moments are float arrays: a float-only model
    keys = KEYS[:2]
    messages = list(strategy.configure_train(1, as_record(g, keys), ConfigRecord(), FakeGrid()))
    msg = by_node(messages)
    updates = {n: noisy_update(n)[:2] for n in (11, 12, 13, 14)}
    arrays, _ = strategy.aggregate_train(1, [report(msg[n], u, keys=keys) for n, u in updates.items()])

    eta_norm = 0.1 * math.sqrt(1 - 0.99**2) / (1 - 0.9**2)
    for i, key in enumerate(keys):
        mean = (sum(u[i].astype(np.float64) for u in updates.values()) / 4).astype(np.float32)
        delta = (g[i].astype(np.float64) + mean).astype(np.float32) - g[i]  # what FedAdam sees
        m_t, v_t = 0.1 * delta, 0.01 * delta.astype(np.float64) ** 2
        want = g[i] + eta_norm * m_t / (np.sqrt(v_t) + 1e-3)
        got = arrays[key].numpy()
        assert got.dtype == np.float32  # back in the model's dtype
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
        # Not FedAvg's step: Adam moves every coordinate by about eta.
        assert not np.allclose(got, g[i] + mean, atol=1e-3)


def test_fedavgm_server_learning_rate_scales_the_mean_step():
    strategy = wrap(FedAvgM(min_available_nodes=1, min_train_nodes=1, server_learning_rate=0.5))
    messages, g = configure(strategy)
    msg = by_node(messages)
    updates = [noisy_update(n) for n in (11, 12)]
    arrays, _ = strategy.aggregate_train(1, [report(msg[n], u) for n, u in zip((11, 12), updates)])
    for i in range(2):
        mean = (updates[0][i].astype(np.float64) + updates[1][i]) / 2
        np.testing.assert_allclose(arrays[KEYS[i]].numpy(), g[i] + 0.5 * mean, rtol=1e-5, atol=1e-6)
    assert arrays["steps"].numpy() == 5 and arrays["steps"].numpy().dtype == np.int64


def test_a_distributed_round_sends_nothing_in_the_clear_and_never_aggregates_a_plain_reply():
    # Distributed rounds go through SecAgg+ (tests/coordinator/secagg/test_secure_round.py): configure_train
    # hands Flower's loop no message to send, and a reply outside SecAgg+ is dropped, never averaged.
    inner = SpyFedAvg(min_available_nodes=1, min_train_nodes=1)
    strategy = wrap(inner, placement="distributed", min_reports=3)
    grid = FakeGrid(client=lambda msg: None)  # no node answers SecAgg+'s setup: the protocol halts
    messages, _ = configure(strategy, grid=grid)
    assert messages == []
    stray = Message(RecordDict(), dst_node_id=11, message_type=MessageType.TRAIN)
    arrays, metrics = strategy.aggregate_train(1, [report(stray, noisy_update(1, 0.2))])
    assert arrays is None and metrics["released"] == 0 and not inner.handed
    outcome = strategy.last_outcome
    assert (outcome.sampled, outcome.reports, outcome.dropped, outcome.aggregate_norm) == (10, 0, 11, 0.0)
    # Only SecAgg+'s setup went out, and it carries no model and no round request.
    assert all(set(m.content.keys()) == {"secaggplus_configs"} for m in grid.sent[0])


def test_a_round_without_reports_is_dropped():
    strategy = wrap()
    messages, _ = configure(strategy)
    msg = by_node(messages)
    arrays, metrics = strategy.aggregate_train(1, [marker(msg[11]), error_reply(msg[12])])
    assert arrays is None and dict(metrics)["released"] == 0
    assert strategy.last_outcome.reports == 0
    configure(strategy, round_id=2)
    assert strategy.aggregate_train(2, [])[0] is None


def test_client_side_evaluation_is_never_sent():
    strategy = wrap()
    assert list(strategy.configure_evaluate(1, as_record(global_arrays()), ConfigRecord(), FakeGrid())) == []
    assert strategy.aggregate_evaluate(1, []) is None


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"noise_multiplier": 0.0}, "noise_multiplier"),
        ({"noise_multiplier": float("nan")}, "noise_multiplier"),
        ({"clip": -1.0}, "clip"),
        ({"placement": "central"}, "placement"),
        ({"min_reports": 0}, "min_reports"),
        ({"min_reports": True}, "min_reports"),
        ({"message_ttl_s": 0}, "message_ttl_s"),
        ({"run_name": ""}, "run_name"),
    ],
)
def test_bad_settings_are_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        wrap(**kwargs)


def test_an_inner_strategy_with_another_array_key_or_not_a_strategy_is_refused():
    with pytest.raises(ValueError, match="arrayrecord_key"):
        wrap(FedAvg(arrayrecord_key="weights"))
    with pytest.raises(ValueError, match="Strategy"):
        IndividualFilterStrategy(object(), noise_multiplier=Z, clip=CLIP)


def test_aggregate_without_configure_for_that_round_is_an_error():
    strategy = wrap()
    with pytest.raises(RuntimeError, match="configure_train"):
        strategy.aggregate_train(1, [])
    configure(strategy, round_id=1)
    with pytest.raises(RuntimeError, match="configure_train"):
        strategy.aggregate_train(2, [])


def test_start_writes_one_public_record_per_round_like_the_server_app(tmp_path):
    path = tmp_path / "public.sqlite"
    strategy = wrap(public_ledger=str(path), public_config={"num-rounds": 2, "task": "toy"}, message_ttl_s=120.0)
    grid = FakeGrid(nodes=[11, 12, 13, 14], client=_client(fail_nodes=(14,), leave_nodes=(13,)))
    evaluated = []

    def evaluate_fn(server_round, arrays):
        evaluated.append(server_round)
        return MetricRecord({"accuracy": 0.25 * server_round, "loss": 1.0 / (server_round + 1)})

    result = strategy.start(
        grid=grid,
        initial_arrays=as_record(global_arrays()),
        num_rounds=2,
        timeout=60,
        train_config=ConfigRecord({"local-epochs": 3, "lr": 0.05}),
        evaluate_fn=evaluate_fn,
    )
    assert evaluated == [0, 1, 2]
    assert [len(sent) for sent in grid.sent] == [4, 0, 4, 0]  # train to all, evaluate to none, per round
    with PublicLedger(path, read_only=True) as ledger:
        (run,) = ledger.runs()
        assert run.run_id == "run-w" and ledger.is_finished("run-w")
        records = ledger.records("run-w")
    assert [r.round_id for r in records] == [1, 2]
    g = global_arrays()
    for record in records:
        r = record.round_id
        assert record.request == fedfilter_pb2.RoundRequest(
            run_id="run-w",
            round_id=r,
            noise_multiplier=Z,
            clip=CLIP,
            placement=fedfilter_pb2.LOCAL,
            min_reports=1,
            local_epochs=3,
            learning_rate=0.05,
        )
        assert (record.clients_sampled, record.reports_received, record.markers_received) == (4, 2, 1)
        assert record.replies_dropped == 1 and record.released
        mean = [(noisy_update(1100 + r)[i].astype(np.float64) + noisy_update(1200 + r)[i]) / 2 for i in range(2)]
        want_norm = math.sqrt(sum(float(np.sum(m**2)) for m in mean))
        assert record.aggregate_norm == pytest.approx(want_norm, rel=1e-6)
        assert dict(record.metrics) == {"accuracy": 0.25 * r, "loss": 1.0 / (r + 1)}
        assert record.started_at_unix <= record.finished_at_unix
        assert record.wall_time_s == pytest.approx(record.finished_at_unix - record.started_at_unix)
    # The final model: two plain-mean steps.
    for r in (1, 2):
        g = expected_fedavg(g, [noisy_update(1100 + r), noisy_update(1200 + r)])
    for key, want in zip(KEYS, g):
        np.testing.assert_array_equal(result.arrays[key].numpy(), want)


def test_start_without_evaluate_fn_still_records_rounds_and_a_run_with_no_release_fails(tmp_path):
    from fedfilter.coordinator.strategy import NothingReleasedError

    path = tmp_path / "public.sqlite"
    strategy = wrap(public_ledger=str(path))
    grid = FakeGrid(nodes=[11, 12], client=_client(fail_nodes=(11,), leave_nodes=(12,)))
    initial = as_record(global_arrays())
    # Never released: Flower's Result would hold no arrays, and a server app would save an empty model.
    with pytest.raises(NothingReleasedError, match="no round of run 'run-w' was released in 1 round"):
        strategy.start(grid=grid, initial_arrays=initial, num_rounds=1, timeout=60)
    with PublicLedger(path, read_only=True) as ledger:
        assert ledger.is_finished("run-w")
        (record,) = ledger.records("run-w")
    assert (record.reports_received, record.released, record.aggregate_norm) == (0, False, 0.0)
    assert dict(record.metrics) == {}


def test_start_refuses_a_ttl_not_longer_than_the_round_timeout(tmp_path):
    strategy = wrap(message_ttl_s=30.0, public_ledger=str(tmp_path / "p.sqlite"))
    with pytest.raises(ValueError, match="TTL"):
        strategy.start(grid=FakeGrid(client=_client()), initial_arrays=as_record(global_arrays()), timeout=60)
    assert not (tmp_path / "p.sqlite").exists()
