"""What the coordinator receives from devices under SecAgg+: masked vectors and constants, nothing else,
the same for a device that contributes, one whose budget is spent, and (as an error) one that leaves."""

from __future__ import annotations

import numpy as np
from flwr.common import bytes_to_ndarray
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key, Stage
from harness.secagg_loopback import stage_of
from helpers.secagg import DTYPES, KEYS, RUN, ledger_records, node_config, node_id, run_round

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.release import FilteredClient
from fedfilter.client.secagg.mod import reply_masked
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.client.settings.policy import ClientPolicy
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.secagg.grid import encode_report
from fedfilter.protocol.wire import CONSISTENCY_STAGE

EXHAUSTED = 2
FLOATING = [j for j, d in enumerate(DTYPES) if np.dtype(d).kind == "f"]


def exhaust(tmp_path, i: int, **over) -> None:
    """Device i's owner enrols it with a small budget that local rounds then spend entirely."""
    config = node_config(tmp_path, i, **{"budget-epsilon": 0.05, **over})
    enrol_device(config)
    ledger = BudgetLedger.open(tmp_path / f"dev{i}")
    try:
        client = FilteredClient(ledger, ClientPolicy(min_noise_multiplier=0.5))
        for r in range(50):
            if client.release(RoundSpec("earlier", r, 0.5, 1.0), [np.full(10, 5.0)]).status != "contributed":
                break
        assert ledger.filter.allowance(ledger.state(), noise_std=1.0) <= 1e-3
    finally:
        ledger.close()


def structure(reply):
    """Every record name, its kind and its clear values, with the masked vectors reduced to their
    sizes: what must not differ between devices."""
    out = []
    for name, record in sorted(reply.content.items()):
        if name == RECORD_KEY_CONFIGS:
            masked = record[Key.MASKED_PARAMETERS]
            out.append((name, type(record).__name__, sorted(record.keys()), [len(b) for b in masked]))
        else:
            out.append(
                (name, type(record).__name__, sorted(dict(record).items()) if hasattr(record, "items") else None)
            )
    return out


def test_the_coordinator_sees_masked_vectors_and_constants_only(tmp_path, monkeypatch):
    exhaust(tmp_path, EXHAUSTED)
    n = 6
    result = run_round(tmp_path, monkeypatch, n, node_over={EXHAUSTED: {"budget-epsilon": 0.05}})
    assert result.strategy.aggregated and len(result.strategy.results) == n
    assert not reply_masked()  # the mark lives only inside secaggplus_mod's call of the inner handler

    # No message the coordinator received, at any stage, holds an array in the clear.
    assert result.grid.received
    for reply in result.grid.received:
        assert not reply.has_error()
        assert all(len(record) == 0 for record in reply.content.array_records.values())

    collect = {int(r.metadata.src_node_id): r for r in result.collect_replies()}
    assert len(collect) == n
    contributing = structure(collect[node_id(0)])
    for nid, reply in collect.items():
        assert structure(reply) == contributing, nid  # byte-for-byte the same shape, the same constants
        assert set(reply.content.keys()) == {
            "fitres.parameters",
            "fitres.metrics",
            "fitres.num_examples",
            "fitres.status",
            RECORD_KEY_CONFIGS,
        }
        assert dict(reply.content["fitres.num_examples"]) == {"num_examples": 1}
        assert dict(reply.content["fitres.metrics"]) == {}
        assert len(reply.content.metric_records) == 1  # num_examples = 1, nothing else
        # The masked vectors are not the device's quantized report (y mod q): the masks hide it.
        q = result.settings["quantization_range"]
        masked = [bytes_to_ndarray(b) for b in reply.content[RECORD_KEY_CONFIGS][Key.MASKED_PARAMETERS]]
        assert len(masked) == len(KEYS) + 1  # Flower's weight factor, then every model array
        masked = masked[1:]
        for j, y in zip(FLOATING, result.captured.y[nid]):
            quantized = encode_report([y], q)[0] + q // 2
            assert masked[j].shape == y.shape and not np.array_equal(masked[j], quantized)
    statuses = {i: ledger_records(tmp_path, i)[0][-1].status for i in range(n)}
    assert statuses[EXHAUSTED] == "noise-only"
    assert all(s == "contributed" for i, s in statuses.items() if i != EXHAUSTED)
    # The exhausted device's integer update is zero: its report is pure Skellam noise.
    assert all(not np.any(k) for k in result.captured.k[node_id(EXHAUSTED)])
    assert any(np.any(k) for k in result.captured.k[node_id(0)])


def test_a_leaving_device_drops_out_with_an_error_and_the_round_still_completes(tmp_path, monkeypatch):
    exhaust(tmp_path, EXHAUSTED, **{"after-exhaustion": "leave"})
    n = 6
    over = {EXHAUSTED: {"budget-epsilon": 0.05, "after-exhaustion": "leave"}}
    result = run_round(tmp_path, monkeypatch, n, threshold=4, node_over=over)
    assert result.strategy.aggregated and len(result.strategy.results) == n - 1
    errors = [r for r in result.grid.received if r.has_error()]
    assert [int(r.metadata.src_node_id) for r in errors] == [node_id(EXHAUSTED)]
    assert "leaves" in errors[0].error.reason
    assert node_id(EXHAUSTED) in result.trainer.calls  # it trained like everyone (its time must not tell)
    assert node_id(EXHAUSTED) not in result.captured.y  # and drew no noise: nothing left the device
    records = ledger_records(tmp_path, EXHAUSTED)[0]
    assert (records[-1].run_id, records[-1].status) == (RUN, "left")
    assert np.all(records[-1].charge == 0)


def test_collect_stage_replies_hold_the_legacy_layout_secaggplus_mod_reads(tmp_path, monkeypatch):
    result = run_round(tmp_path, monkeypatch, 4, threshold=3)
    for reply in result.collect_replies():
        assert reply.content["fitres.status"]["code"] == 0
        assert reply.content[RECORD_KEY_CONFIGS].keys() == {Key.MASKED_PARAMETERS}
    assert {r._stage for r in result.grid.received} == set(Stage.all()) | {CONSISTENCY_STAGE}


def test_the_reply_hold_applies_under_secure_aggregation(tmp_path, monkeypatch):
    import time

    n, hold = 3, 0.4
    over = {i: {"reply-hold-s": hold} for i in range(n)}
    timings = []
    original = run_round.__globals__["secure_aggregation_mod"]

    def timed(msg, ctx, call_next):
        stage, start = stage_of(msg), time.monotonic()
        out = original(msg, ctx, call_next)
        if stage == Stage.COLLECT_MASKED_VECTORS:
            timings.append(time.monotonic() - start)
        return out

    from fedfilter.client.filter_mod import individual_filter_mod

    result = run_round(tmp_path, monkeypatch, n, threshold=2, node_over=over, mods=[timed, individual_filter_mod])
    assert result.strategy.aggregated and len(result.collect_replies()) == n
    assert len(timings) == n and min(timings) >= hold
