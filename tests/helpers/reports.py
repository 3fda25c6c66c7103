"""A valid public round record, the one the public ledger and the public report tests both write."""

from __future__ import annotations

from fedfilter.protos import fedfilter_pb2


def make_record(run_id: str, round_id: int, **overrides) -> fedfilter_pb2.PublicRoundRecord:
    request = fedfilter_pb2.RoundRequest(
        run_id=run_id,
        round_id=round_id,
        noise_multiplier=1.1,
        clip=1.0,
        placement=fedfilter_pb2.LOCAL,
        local_epochs=1,
        learning_rate=0.05,
    )
    fields = dict(
        run_id=run_id,
        round_id=round_id,
        request=request,
        clients_sampled=10,
        reports_received=8,
        markers_received=1,
        replies_dropped=1,
        released=True,
        aggregate_norm=3.25,
        started_at_unix=1_700_000_000.0 + round_id,
        finished_at_unix=1_700_000_000.5 + round_id,
        wall_time_s=0.5,
    )
    fields.update(overrides)
    record = fedfilter_pb2.PublicRoundRecord(**fields)
    record.metrics["accuracy"] = 0.5 + round_id / 100
    record.metrics["loss"] = 1.0 / round_id
    return record
