"""Hand-built Flower messages, node Contexts and an inner handler for calling the filter mod directly.

No Flower engine runs: a test builds a train message with ``train_message(spec(...))``, a node with
``context(tmp_path)`` (enrolled by its owner, reply hold off) and calls ``individual_filter_mod``
around ``Handler()``, which counts its calls (``calls == 0``: nothing trained).
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.schema import LEDGER_FILE
from fedfilter.client.settings.node_config import enrol_device
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record
from helpers.flower_messages import delivered

KEYS = ["w", "b"]
SHAPES = [(40, 50), (50,)]


def model_arrays(value: float = 0.0) -> list[np.ndarray]:
    return [np.full(s, value, dtype=np.float32) for s in SHAPES]


def train_message(
    spec: RoundSpec | None, *, arrays=None, message_type="train", request=None, message_id="m"
) -> Message:
    arrays = model_arrays(0.5) if arrays is None else arrays
    content = RecordDict({ARRAYS_RECORD: ArrayRecord({k: Array(a) for k, a in zip(KEYS, arrays)})})
    if request is not None:
        content[REQUEST_RECORD] = request
    elif spec is not None:
        content[REQUEST_RECORD] = request_record(spec)
    return delivered(content, message_type=message_type, message_id=message_id)


def spec(round_id=1, *, run_id="run-a", z=1.0, clip=1.0, placement="local", m=1) -> RoundSpec:
    return RoundSpec(
        run_id=run_id, round_id=round_id, noise_multiplier=z, clip=clip, placement=placement, min_reports=m
    )


def context(tmp_path, *, enrol: bool = True, **node) -> Context:
    """A node's Context; its owner enrols the device first (the mod itself never enrols).

    Timing protection off (reply-hold-s = 0) so these tests stay fast: tests/client/flower/test_reply_timing.py
    covers the hold.
    """
    config = {
        "ledger-dir": str(tmp_path / "ledger"),
        "client-id": "alice",
        "budget-epsilon": 4.0,
        "budget-delta": 1e-5,
        "reply-hold-s": 0,
        **node,
    }
    if enrol and not (tmp_path / "ledger" / LEDGER_FILE).exists():
        try:
            enrol_device(config)
        except ValueError:
            pass  # invalid settings: the test is about the mod refusing them
    return Context(run_id=7, node_id=42, node_config=config, state=RecordDict(), run_config={})


class Handler:
    """An inner ClientApp handler: adds ``step`` to every weight and reports its example count."""

    def __init__(self, step: float = 1.0, fail: bool = False, nan: bool = False):
        self.step, self.fail, self.nan, self.calls = step, fail, nan, 0

    def __call__(self, msg: Message, ctx: Context) -> Message:
        self.calls += 1
        if self.fail:
            raise RuntimeError("private path /home/alice/data.csv not found")
        record = next(iter(msg.content.array_records.values()))
        new = {k: Array((record[k].numpy() + self.step).astype(np.float32)) for k in record.keys()}
        if self.nan:
            new["w"] = Array(np.full(SHAPES[0], np.nan, dtype=np.float32))
        content = RecordDict(
            {"arrays": ArrayRecord(new), "metrics": MetricRecord({"num-examples": 1234, "train-loss": 0.3})}
        )
        return Message(content, reply_to=msg)


def records(tmp_path):
    ledger = BudgetLedger.open(tmp_path / "ledger")
    try:
        return ledger.records(), ledger.spent_epsilon(), ledger.enrolment.epsilon
    finally:
        ledger.close()
