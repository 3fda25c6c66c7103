"""A device refuses, before training and with nothing spent, every distributed round it cannot serve
soundly: no SecAgg+ layer on the device, a local round under SecAgg+, a SecAgg+ setup that would make
Flower's quantization inexact or release sums of fewer than min-reports reports, a filter that cannot
account Skellam noise, and request numbers that give no usable grid."""

from __future__ import annotations

import pytest
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from helpers.mods import Handler, context, records, spec, train_message
from helpers.secagg import RUN, assert_refused_before_training, node_id, run_round

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import secaggplus_settings


def test_distributed_is_refused_without_secure_aggregation_mod(tmp_path):
    handler = Handler()
    reply = individual_filter_mod(train_message(spec(placement="distributed", m=4)), context(tmp_path), handler)
    assert reply.has_error() and "placement='distributed' needs secure aggregation" in reply.error.reason
    assert handler.calls == 0 and records(tmp_path)[0] == []


def test_a_device_without_secure_aggregation_mod_serves_no_secagg_round(tmp_path, monkeypatch):
    n = 4
    result = run_round(tmp_path, monkeypatch, n, threshold=3, mods=[individual_filter_mod])
    assert all(r.has_error() for r in result.grid.received)  # refused at the first stage already
    assert result.trainer.calls == [] and result.captured.y == {} and not result.strategy.aggregated


def test_local_placement_is_refused_under_secure_aggregation(tmp_path, monkeypatch):
    n = 4
    local = RoundSpec(RUN, 1, 1.0, 1.0, placement="local", min_reports=1)
    result = run_round(tmp_path, monkeypatch, n, threshold=3, spec=local)
    assert_refused_before_training(tmp_path, result, n, "placement='local'", "secure aggregation")


@pytest.mark.parametrize(
    "settings, threshold, min_reports, words",
    [
        # Flower's defaults: max_weight=1000 (a 1000 times coarser step), clipping_range=8.0.
        ({}, 3, 3, ["max_weight must be 1.0", "Found 1000", "clipping_range"]),
        (secaggplus_settings(5), 3, 4, ["threshold 3", "below min-reports 4"]),
        ({**secaggplus_settings(5), "quantization_range": 2**30, "clipping_range": 2.0**29}, 3, 3, ["sample_num"]),
        ({**secaggplus_settings(5), "clipping_range": 10.0}, 3, 3, ["clipping_range must be target_range / 2"]),
        ({**secaggplus_settings(5), "modulus_range": 2**31}, 3, 3, ["sample_num * target_range"]),
        (
            {**secaggplus_settings(5), "quantization_range": 3 * 2**20, "clipping_range": 1.5 * 2**20},
            3,
            3,
            ["target_range (quantization range) must be a power of two", "3145728"],
        ),
    ],
)
def test_each_secagg_setup_problem_is_refused_before_training(
    tmp_path, monkeypatch, settings, threshold, min_reports, words
):
    n = 5
    request = RoundSpec(RUN, 1, 1.0, 1.0, placement="distributed", min_reports=min_reports)
    result = run_round(tmp_path, monkeypatch, n, spec=request, threshold=threshold, settings=settings)
    assert_refused_before_training(tmp_path, result, n, "secure aggregation refused", *words)


def test_a_gdp_device_refuses_distributed_rounds(tmp_path, monkeypatch):
    n = 4
    over = {i: {"filter": "gdp"} for i in range(n)}
    result = run_round(tmp_path, monkeypatch, n, threshold=3, node_over=over)
    assert_refused_before_training(
        tmp_path,
        result,
        n,
        "distributed (Skellam) releases are accounted by the rdp filter; this device's filter is 'gdp'",
    )


@pytest.mark.parametrize(
    "z, q, words",
    [
        # The sum's noise (std sqrt(n mu_share) grid steps) would wrap around SecAgg+'s range.
        (1.0, 2**16, ["noise_multiplier=1.0", "too large for the quantization range target_range=65536"]),
        (3000.0, None, ["noise_multiplier=3000.0", "above the sampler's 2**32"]),
    ],
)
def test_request_numbers_without_a_usable_grid_are_refused(tmp_path, monkeypatch, z, q, words):
    n = 4
    request = RoundSpec(RUN, 1, z, 1.0, placement="distributed", min_reports=3)
    settings = secaggplus_settings(n)
    if q is not None:
        settings = {**settings, "quantization_range": q, "clipping_range": float(q // 2)}
    result = run_round(tmp_path, monkeypatch, n, spec=request, threshold=3, settings=settings)
    assert_refused_before_training(tmp_path, result, n, *words)


def test_min_reports_beyond_the_owners_cap_is_refused_under_secure_aggregation(tmp_path, monkeypatch):
    n = 4
    over = {i: {"max-min-reports": 2} for i in range(n)}
    result = run_round(tmp_path, monkeypatch, n, threshold=3, node_over=over)
    assert_refused_before_training(tmp_path, result, n, "min_reports", "max-min-reports")


def test_node_ids_are_the_devices(tmp_path):
    assert node_id(0) == 100  # the harness's numbering, which the tests above rely on


def test_too_few_neighbours_are_refused_before_training_not_after(tmp_path):
    """secaggplus_mod checks the neighbours only after the inner handler trained (and spent): the
    device's layer checks first."""
    from flwr.app import ConfigRecord, Context, RecordDict
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, RECORD_KEY_STATE, Key

    from fedfilter.client.secagg.mod import secure_aggregation_mod

    msg = train_message(spec(placement="distributed", m=3))
    msg.content[RECORD_KEY_CONFIGS] = ConfigRecord(
        {Key.STAGE: Stage.COLLECT_MASKED_VECTORS, Key.CIPHERTEXT_LIST: [b"x", b"y"], Key.SOURCE_LIST: [1, 2]}
    )
    from fedfilter.client.secagg.mod import CONSISTENCY_STATE_RECORD

    flower = ConfigRecord({"current_stage": Stage.SHARE_KEYS, "threshold": 5, "nid": 42})
    own = ConfigRecord({"phase": "shared"})
    state = RecordDict({RECORD_KEY_STATE: flower, CONSISTENCY_STATE_RECORD: own})
    ctx = Context(run_id=7, node_id=42, node_config={}, state=state, run_config={})
    called = []
    reply = secure_aggregation_mod(msg, ctx, lambda m, c: called.append(m))
    assert reply.has_error() and "3 nodes shared keys" in reply.error.reason and "threshold 5" in reply.error.reason
    assert called == []


def test_messages_without_secagg_configs_pass_through_unmarked(tmp_path):
    from fedfilter.client.secagg.mod import reply_masked, secure_aggregation_mod

    seen = []

    def inner(m, c):
        seen.append(reply_masked())
        return individual_filter_mod(m, c, Handler())

    ctx = context(tmp_path)
    reply = secure_aggregation_mod(train_message(spec()), ctx, inner)  # a local round: served as before
    assert seen == [False] and not reply.has_error() and records(tmp_path)[0][0].placement == "local"
    reply = secure_aggregation_mod(train_message(spec(2, placement="distributed", m=3)), ctx, inner)
    assert seen == [False, False] and reply.has_error() and "needs secure aggregation" in reply.error.reason
