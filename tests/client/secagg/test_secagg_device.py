"""The device side of distributed noise over SecAgg+, through Flower's real protocol.

Flower's own ``SecAggPlusWorkflow`` (driven by a minimal legacy server here) talks to in-process
ClientApps ``ClientApp(mods=[secure_aggregation_mod, individual_filter_mod])`` through the wire
format (``tests/harness/secagg_loopback.py``). As in the product, the workflow is made to send Message-API
content (``"arrays"``, ``"config"``, ``"fedfilter.request"``) in its collect stage. The tests look at
everything the coordinator received, and at each device's integer report (captured by a test hook:
a wrapper around the Skellam sampler, which never ships in a reply).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.common import parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import Stage
from helpers.secagg import (
    DTYPES,
    KEYS,
    RUN,
    ledger_records,
    node_id,
    run_round,
)

from fedfilter.client.mechanisms.gaussian_noise import round_noise_stream
from fedfilter.client.mechanisms.skellam_noise import add_skellam_noise
from fedfilter.privacy.rounding import down, up
from fedfilter.privacy.skellam import integer_norms, l2_up, skellam_charge
from fedfilter.protocol.secagg.grid import decode_sum, grid_step
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD


# --- the exact integer sum -------------------------------------------------------------------
@pytest.mark.parametrize(
    "n, dropped, late",
    [
        (8, (), ()),
        (8, (node_id(1), node_id(4)), ()),  # dropped after the masks were shared: their reports are lost
        (10, (node_id(0), node_id(9)), (node_id(5),)),  # and one more drops out while unmasking
    ],
)
def test_the_unmasked_sum_is_exactly_the_sum_of_the_reports(tmp_path, monkeypatch, n, dropped, late):
    t = max(5, n // 2 + 1)  # devices refuse a threshold at or below half their neighbourhood

    def drop(stage, nid):
        return (stage == Stage.COLLECT_MASKED_VECTORS and nid in dropped) or (stage == Stage.UNMASK and nid in late)

    result = run_round(tmp_path, monkeypatch, n, threshold=t, drop=drop)
    assert result.strategy.aggregated and len(result.strategy.results) == n - len(dropped)
    q = result.settings["quantization_range"]
    aggregated = parameters_to_ndarrays(result.strategy.results[0][1].parameters)
    decoded = decode_sum(aggregated, n - len(dropped), q)
    survivors = [node_id(i) for i in range(n) if node_id(i) not in dropped]
    assert set(result.captured.y) == {node_id(i) for i in range(n)}  # the dropped ones trained and spent too
    # The training code saw the Message-API content only, never the SecAgg+ protocol's record.
    assert result.trainer.seen_keys == [sorted([ARRAYS_RECORD, "config", REQUEST_RECORD])] * n
    gamma = grid_step(1.0)
    for index, (got, dtype) in enumerate(zip(decoded, DTYPES)):
        if np.dtype(dtype).kind == "f":
            floating = [KEYS[j] for j, d in enumerate(DTYPES) if np.dtype(d).kind == "f"].index(KEYS[index])
            expected = sum(result.captured.y[nid][floating] for nid in survivors)
            assert np.abs(expected).max() < q // 2  # no wrap: the centred residue is the sum itself
            np.testing.assert_array_equal(got, expected)
            # The sum is that of the snapped updates plus noise of variance n' mu_share >= mu_total.
            k_sum = sum(result.captured.k[nid][floating] for nid in survivors)
            assert np.abs(k_sum * gamma).max() < 3.0
        else:
            np.testing.assert_array_equal(got, 0)  # integer buffers carry no data: released as 0
    # Each device's y is its k plus the noise its seed draws (recomputed here, independently), and its
    # ledger holds the charge of k at its exact integer norms.
    mu_total = _mu_total(1.0, 1.0)
    for i in range(n):
        nid = node_id(i)
        records, filt, _ = ledger_records(tmp_path, i)
        (rec,) = records
        assert rec.placement == "distributed" and rec.status == "contributed"
        mu = result.captured.mu[nid]
        assert mu * t >= mu_total and mu == float(up(mu_total / t))
        zeros = [np.zeros_like(a) for a in result.captured.k[nid]]
        noise = add_skellam_noise(zeros, mu, round_noise_stream(1000 + i, RUN, 1))
        for y, k, e in zip(result.captured.y[nid], result.captured.k[nid], noise):
            np.testing.assert_array_equal(y, k + e)
        assert rec.noise_std == math.sqrt(mu) * gamma
        l1, l2sq = integer_norms(result.captured.k[nid])
        assert 0 < rec.sensitivity == l2_up(l2sq) * gamma <= 1.0
        np.testing.assert_array_equal(rec.charge, skellam_charge(filt, l1, l2_up(l2sq), mu_total))


def _mu_total(z: float, clip: float) -> float:
    ratio = z * clip / grid_step(clip)
    return float(down(ratio * ratio))


def test_the_builtin_client_app_runs_the_secagg_layer_before_the_filter(monkeypatch):
    from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
    from helpers.flower_messages import delivered

    from fedfilter.app.client_app import make_client_app
    from fedfilter.protocol.refusals import refusal_code

    monkeypatch.delenv("FEDFILTER_DEVICE_SETTINGS", raising=False)
    setup = {Key.STAGE: Stage.SETUP, Key.SAMPLE_NUMBER: 3, Key.SHARE_NUMBER: 3, Key.THRESHOLD: 2}
    setup |= {Key.CLIPPING_RANGE: 8.0, Key.TARGET_RANGE: 1 << 16, Key.MOD_RANGE: 1 << 32, Key.MAX_WEIGHT: 1.0}
    app = make_client_app()

    def ask(content: RecordDict) -> Message:
        return app(delivered(content), Context(run_id=1, node_id=42, node_config={}, state=RecordDict(), run_config={}))

    # SecAgg+'s first stage is answered by the SecAgg+ layer: the filter would refuse a SecAgg+ message
    # that did not pass through it first ("secagg-mod-order").
    reply = ask(RecordDict({RECORD_KEY_CONFIGS: ConfigRecord(setup)}))
    assert not reply.has_error() and RECORD_KEY_CONFIGS in reply.content.config_records
    # A plain round reaches the filter, which refuses a device without settings before any training.
    reply = ask(RecordDict({ARRAYS_RECORD: ArrayRecord({"w": Array(np.zeros(3, np.float32))})}))
    assert reply.has_error() and refusal_code(reply.error.reason) == "device-settings"


def test_a_round_below_the_threshold_is_never_unmasked_and_costs_each_device_its_charge_only(tmp_path, monkeypatch):
    n, t = 6, 5
    dropped = {node_id(0), node_id(2)}  # after the masks were shared: 4 reports < t = 5
    result = run_round(
        tmp_path,
        monkeypatch,
        n,
        threshold=t,
        drop=lambda stage, nid: stage == Stage.COLLECT_MASKED_VECTORS and nid in dropped,
    )
    assert not result.strategy.aggregated  # Flower's workflow halts: no sum is unmasked
    assert not any(r._stage == Stage.UNMASK for r in result.grid.received)
    mu_total = _mu_total(1.0, 1.0)
    for i in range(n):
        records, filt, state = ledger_records(tmp_path, i)
        (rec,) = records  # one round, one charge: the charge of its own report, nothing more
        l1, l2sq = integer_norms(result.captured.k[node_id(i)])
        np.testing.assert_array_equal(rec.charge, skellam_charge(filt, l1, l2_up(l2sq), mu_total))
        np.testing.assert_array_equal(state, filt.spend(np.zeros_like(state), rec.charge))
