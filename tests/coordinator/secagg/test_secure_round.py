"""Distributed rounds of ``IndividualFilterStrategy`` through Flower's real SecAgg+ (loopback, no Ray).

Each test ClientApp is ``[secure_aggregation_mod, inner]`` (Flower's SecAgg+ client with the device's
checks and consistency round, which the coordinator's workflow must serve); the inner handler answers the
legacy ``fitres.*`` layout with ``encode_report`` of integer vectors the test chose, so the expected
sum, mean and model are computed here with numpy from those integers, independently of the
coordinator. ``LoopbackGrid.received`` holds everything the coordinator got.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.common import Code, FitRes, Status, bytes_to_ndarray, ndarrays_to_parameters
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key
from flwr.compat.common import recorddict_compat as compat
from flwr.serverapp.strategy import FedAdam, FedAvg, Result
from harness.secagg_loopback import LoopbackGrid, stage_of

from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.coordinator.public_ledger import PublicLedger
from fedfilter.coordinator.secagg import secure_round
from fedfilter.coordinator.strategy import IndividualFilterStrategy, NothingReleasedError
from fedfilter.protocol.secagg import masks as secagg_masks
from fedfilter.protocol.secagg.grid import encode_report, grid_step
from fedfilter.protocol.wire import (
    ARRAYS_RECORD,
    CONSISTENCY_RECORD,
    CONSISTENCY_STAGE,
    REQUEST_RECORD,
    round_spec_from_record,
)
from fedfilter.protos import fedfilter_pb2

KEYS = ["w", "b"]
SHAPES = [(3, 4), (4,)]
NODES = list(range(100, 110))
CLIP = 0.5
GAMMA = 2.0**-13  # grid_step(0.5): clip / gamma = 2**12
COLLECT = "collect_masked_vectors"


@pytest.fixture(autouse=True)
def _flowers_own_generator():
    """Device mods in earlier tests install the mask generator for the whole process (as a device
    does); these tests check that the coordinator's round installs and removes it, so start without."""
    secagg_masks.restore()


def global_arrays():
    rng = np.random.default_rng(3)
    return [rng.normal(0, 1, s).astype(np.float32) for s in SHAPES]


def as_record(arrays):
    return ArrayRecord({k: Array(np.array(a, order="C")) for k, a in zip(KEYS, arrays)})


def integer_reports(seed=0, nodes=NODES):
    """Each node's integer report y = k + noise, as the device would release it (|y| well below q/2)."""
    rng = np.random.default_rng(seed)
    return {nid: [rng.integers(-9000, 9000, size=s, dtype=np.int64) for s in SHAPES] for nid in nodes}


def make_app(reports, seen_contents, weight=1):
    """``[secure_aggregation_mod, inner]``; the inner reports ``encode_report(reports[nid], q)``."""
    app = ClientApp(mods=[secure_aggregation_mod])

    @app.train()
    def train(msg, ctxt):
        seen_contents[ctxt.node_id] = msg.content
        q = int(ctxt.state.config_records[RECORD_KEY_STATE]["target_range"])
        x = encode_report(reports[ctxt.node_id], q)
        fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(x), weight, {})
        return Message(compat.fitres_to_recorddict(fitres, True), reply_to=msg)

    return app


class Spy:
    """Wraps an inner strategy's aggregate_train to keep what it was handed."""

    def __init__(self, inner):
        self.inner, self.handed = inner, []
        original = inner.aggregate_train

        def aggregate_train(server_round, replies):
            replies = list(replies)
            self.handed.append(replies)
            return original(server_round, replies)

        inner.aggregate_train = aggregate_train


@pytest.fixture
def decoded(monkeypatch):
    """Every sum the strategy decodes (the released sum; the test compares it with the true integers)."""
    out = []
    original = secure_round.decode_sum

    def spy(aggregated, n, q):
        sums = original(aggregated, n, q)
        out.append((n, [s.copy() for s in sums]))
        return sums

    monkeypatch.setattr(secure_round, "decode_sum", spy)
    return out


def run_round(*, min_reports=4, drop=None, inner=None, reports=None, ledger=None, weight=1, nodes=NODES, **kwargs):
    reports = reports if reports is not None else integer_reports(nodes=nodes)
    seen = {}
    grid = LoopbackGrid({nid: make_app(reports, seen, weight) for nid in nodes}, drop=drop)
    inner = inner if inner is not None else FedAvg(min_available_nodes=len(nodes), fraction_evaluate=0.0)
    spy = Spy(inner)
    strategy = IndividualFilterStrategy(
        inner,
        noise_multiplier=1.0,
        clip=CLIP,
        placement="distributed",
        min_reports=min_reports,
        run_name="secure-run",
        public_ledger=ledger,
        **kwargs,
    )
    g = global_arrays()
    try:
        result = strategy.start(grid=grid, initial_arrays=as_record(g), num_rounds=1, timeout=60)
    except NothingReleasedError:  # the round was not released: what Flower's loop returned holds no arrays
        result = Result()
    return strategy, result, grid, spy, seen, reports, g


def exact_sum(reports, nodes):
    return [sum(reports[n][i] for n in nodes) for i in range(len(SHAPES))]


def expected_model(g, total, n):
    """FedAvg's step on one weight-1 reply: global + mean, mean = sum * gamma / n in float64."""
    return [(w.astype(np.float64) + (s.astype(np.float64) * GAMMA / n)).astype(w.dtype) for w, s in zip(g, total)]


def test_the_released_mean_is_the_exact_integer_sum_times_gamma_over_n(decoded, tmp_path):
    assert grid_step(CLIP) == GAMMA
    path = tmp_path / "public.sqlite"
    strategy, result, grid, spy, seen, reports, g = run_round(ledger=str(path))
    ((n, sums),) = decoded
    total = exact_sum(reports, NODES)
    assert n == len(NODES)
    for got, want in zip(sums, total):
        np.testing.assert_array_equal(got, want)
    for key, want in zip(KEYS, expected_model(g, total, n)):
        np.testing.assert_array_equal(result.arrays[key].numpy(), want)
    outcome = strategy.last_outcome
    assert (outcome.sampled, outcome.reports, outcome.dropped, outcome.released) == (10, 10, 0, True)
    mean = [s.astype(np.float64) * GAMMA / n for s in total]
    want_norm = np.sqrt(sum(float(np.sum(m**2)) for m in mean))
    assert outcome.aggregate_norm == pytest.approx(want_norm, rel=1e-12)
    with PublicLedger(path, read_only=True) as ledger:
        (record,) = ledger.records("secure-run")
        (run,) = ledger.runs()
    assert json.loads(run.config_json)["secure-aggregation"] is True
    assert (record.clients_sampled, record.reports_received, record.replies_dropped, record.released) == (
        10,
        10,
        0,
        True,
    )
    assert record.request.placement == fedfilter_pb2.DISTRIBUTED and record.aggregate_norm == pytest.approx(want_norm)
    # The masks were Flower's generator again after the round (the override is scoped to it).
    assert not secagg_masks.cryptographic_masks_installed()


def test_the_masked_stage_carries_exactly_the_message_api_content():
    strategy, result, grid, spy, seen, reports, g = run_round()
    assert sorted(seen) == NODES
    for content in seen.values():
        # (the records seen, after secure_aggregation_mod put its protocol records back; no pinning, so no
        # sealed certificate: the collect message is Flower's own plus the strategy's content)
        assert set(content.keys()) == {ARRAYS_RECORD, "config", REQUEST_RECORD, RECORD_KEY_CONFIGS}
        spec = round_spec_from_record(content[REQUEST_RECORD])
        assert (spec.run_id, spec.round_id, spec.placement, spec.min_reports, spec.clip) == (
            "secure-run",
            1,
            "distributed",
            4,
            CLIP,
        )
        for key, want in zip(KEYS, g):
            np.testing.assert_array_equal(content[ARRAYS_RECORD][key].numpy(), want)
        assert content["config"]["server-round"] == 1
    # Only SecAgg+'s four stages and the consistency round went out: no train message in the clear.
    assert {stage_of(m) for m in grid.sent} == {"setup", "share_keys", COLLECT, CONSISTENCY_STAGE, "unmask"}


def test_the_coordinator_receives_only_masked_vectors_and_protocol_fields():
    strategy, result, grid, spy, seen, reports, g = run_round()
    collected = [m for m in grid.received if COLLECT in _stage_replied(m)]
    assert len(collected) == len(NODES)
    q = 2**28  # secaggplus_settings(10)
    for msg in grid.received:
        assert all(len(record) == 0 for record in msg.content.array_records.values())
        assert set(msg.content.metric_records) <= {"fitres.num_examples"}
        for record in msg.content.metric_records.values():
            assert dict(record) == {"num_examples": 1}
        allowed = {RECORD_KEY_CONFIGS, CONSISTENCY_RECORD, "fitres.metrics", "fitres.status"}
        assert set(msg.content.config_records) <= allowed
        if "fitres.metrics" in msg.content.config_records:
            assert len(msg.content.config_records["fitres.metrics"]) == 0
    for msg in collected:
        nid = int(msg.metadata.src_node_id)
        masked = [bytes_to_ndarray(b) for b in msg.content.config_records[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        # Flower's quantized plain vector would be [weight factor q] + (x + q/2); none of it is visible.
        plain = [np.array([q])] + [a.astype(np.int64) + q // 2 for a in encode_report(reports[nid], q)]
        assert len(masked) == len(plain)
        for m, p in zip(masked, plain):
            assert not np.any(m.astype(np.int64) == p)  # a coordinate left unmasked: chance 2**-32 each
        assert np.mean(np.concatenate([m.ravel() for m in masked]) >= q) > 0.5  # uniform over [0, 2**32)


def _stage_replied(msg):
    configs = msg.content.config_records.get(RECORD_KEY_CONFIGS)
    return COLLECT if configs is not None and Key.MASKED_PARAMETERS in configs else ""


@pytest.mark.parametrize("stage", [COLLECT, "unmask"])
def test_dropouts_after_the_masks_are_shared_leave_the_survivors_exact_sum(decoded, stage):
    dropped = {101, 105, 108}  # 3 of 10: more than the default sparse graph is sized for; the full graph
    strategy, result, grid, spy, seen, reports, g = run_round(
        drop=lambda st, nid: st == stage and nid in dropped, secagg_num_shares=1.0
    )
    ((n, sums),) = decoded
    # A node dropped at "unmask" has sent its masked vector: it is in the sum, its mask removed by the others.
    in_sum = [nid for nid in NODES if not (stage == COLLECT and nid in dropped)]
    assert n == len(in_sum)
    total = exact_sum(reports, in_sum)
    for got, want in zip(sums, total):
        np.testing.assert_array_equal(got, want)
    for key, want in zip(KEYS, expected_model(g, total, n)):
        np.testing.assert_array_equal(result.arrays[key].numpy(), want)
    assert strategy.last_outcome.released and strategy.last_outcome.reports == n


def test_a_round_below_min_reports_is_not_released_and_the_model_stays(decoded, tmp_path):
    path = tmp_path / "public.sqlite"
    strategy, result, grid, spy, seen, reports, g = run_round(
        min_reports=8, drop=lambda st, nid: st == COLLECT and nid in (100, 101, 102), ledger=str(path)
    )
    assert not decoded and not spy.handed  # nothing unmasked, the inner strategy never called
    assert len(result.arrays) == 0  # Flower's Result keeps no arrays: the model stays the initial one
    outcome = strategy.last_outcome
    assert (outcome.sampled, outcome.reports, outcome.dropped, outcome.released) == (10, 0, 10, False)
    assert outcome.aggregate_norm == 0.0
    # The unmask stage was never sent: Flower's workflow halted below its threshold (min_reports).
    assert "unmask" not in {stage_of(m) for m in grid.sent}
    with PublicLedger(path, read_only=True) as ledger:
        (record,) = ledger.records("secure-run")
    assert (record.released, record.reports_received, record.aggregate_norm) == (False, 0, 0.0)


def test_a_round_with_a_report_weight_other_than_one_is_not_released(decoded):
    strategy, result, grid, spy, seen, reports, g = run_round(weight=2)
    assert not decoded and not spy.handed and not strategy.last_outcome.released


@pytest.mark.parametrize("inner_class", [FedAvg, FedAdam])
def test_the_inner_strategy_gets_one_weight_one_reply_holding_global_plus_mean(decoded, inner_class):
    inner = inner_class(min_available_nodes=10)
    strategy, result, grid, spy, seen, reports, g = run_round(inner=inner)
    ((n, sums),) = decoded
    ((reply,),) = spy.handed
    assert dict(reply.content["metrics"]) == {inner.weighted_by_key: 1}
    for key, want in zip(KEYS, expected_model(g, exact_sum(reports, NODES), n)):
        np.testing.assert_array_equal(reply.content[ARRAYS_RECORD][key].numpy(), want)
    assert set(result.arrays.keys()) == set(KEYS)


@pytest.mark.parametrize("shares", [2, 4, 6, 0.0, 1.5, -1.0, True, "all", "0.5.1"])
def test_share_counts_flower_cannot_run_are_refused_by_name(shares):
    with pytest.raises(ValueError, match="secagg_num_shares"):
        IndividualFilterStrategy(
            FedAvg(), noise_multiplier=1.0, clip=CLIP, placement="distributed", min_reports=3, secagg_num_shares=shares
        )


def test_an_odd_share_count_runs_and_sums_exactly(decoded):
    strategy, result, grid, spy, seen, reports, g = run_round(min_reports=3, secagg_num_shares=5)
    ((n, sums),) = decoded
    for got, want in zip(sums, exact_sum(reports, NODES)):
        np.testing.assert_array_equal(got, want)


def test_the_released_mean_is_recorded_without_per_client_metrics():
    strategy, result, grid, spy, seen, reports, g = run_round()
    metrics = result.train_metrics_clientapp[1]
    assert set(metrics) == {"reports-received", "markers-received", "replies-dropped", "released"}
    assert isinstance(metrics, MetricRecord)


def test_a_sum_of_fewer_than_min_reports_is_never_released_even_if_secagg_unmasked_it():
    # Defence in depth: SecAgg+'s threshold is min_reports, so Flower halts first; the strategy checks again.
    total = [np.ones(s, dtype=np.float64) for s in SHAPES]
    for n, released in ((3, False), (4, True)):
        secure = secure_round.SecureSum(sampled=10, reports=n, aggregate=total, quantization_range=2**28)
        mean, reason = secure_round.released_mean(secure, template=global_arrays(), clip=CLIP, min_reports=4)
        assert (mean is not None) == released and bool(reason) != released
    secure = secure_round.SecureSum(sampled=10, reports=4, aggregate=total[:1], quantization_range=2**28)
    mean, reason = secure_round.released_mean(secure, template=global_arrays(), clip=CLIP, min_reports=4)
    assert mean is None and "shapes" in reason


def test_the_server_app_samples_at_least_min_reports_nodes_in_distributed_placement():
    from fedfilter.app.server_app import inner_strategy, server_config

    cfg = server_config({"placement": "distributed", "min-reports": 4, "fraction-train": 0.1})
    assert inner_strategy(cfg, min_available_nodes=10).min_train_nodes == 4
    assert inner_strategy(cfg, min_available_nodes=3).min_train_nodes == 3  # never more than are connected
    assert inner_strategy(server_config({"min-reports": 4}), min_available_nodes=10).min_train_nodes == 1


def test_a_malformed_masked_reply_fails_the_round_not_the_run(decoded):
    from flwr.app import ConfigRecord, RecordDict

    reports = integer_reports()
    seen = {}
    apps = {nid: make_app(reports, seen) for nid in NODES}
    honest = apps[105]

    def malformed(msg, ctxt):
        if stage_of(msg) == COLLECT:  # a reply without the masked parameters Flower indexes
            return Message(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord({})}), reply_to=msg)
        return honest(msg, ctxt)

    apps[105] = malformed
    grid = LoopbackGrid(apps)
    inner = FedAvg(min_available_nodes=10)
    spy = Spy(inner)
    strategy = IndividualFilterStrategy(
        inner, noise_multiplier=1.0, clip=CLIP, placement="distributed", min_reports=4, run_name="r"
    )
    # The run goes through both rounds, then fails: no round was released (NothingReleasedError).
    with pytest.raises(NothingReleasedError, match="malformed"):
        strategy.start(grid=grid, initial_arrays=as_record(global_arrays()), num_rounds=2, timeout=60)
    assert not decoded and not spy.handed and strategy.last_outcome.round_id == 2
    assert not strategy.last_outcome.released and "malformed" in strategy.last_outcome.reasons[0]
    assert not secagg_masks.cryptographic_masks_installed()
