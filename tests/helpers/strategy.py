"""A fake Flower grid and a wrapped strategy for driving ``IndividualFilterStrategy`` by hand.

``FakeGrid`` answers every message with the replies ``_client`` builds; ``wrap`` wraps an inner
strategy with this module's noise multiplier ``Z`` and clip ``CLIP``; the autouse fixture
``_task_identity`` gives messages built outside a ServerApp the run, node and task ids Flower needs.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, ConfigRecord, Error, Message, MetricRecord, RecordDict
from flwr.serverapp.strategy import FedAvg

from fedfilter.coordinator.strategy import IndividualFilterStrategy
from fedfilter.protocol.wire import ARRAYS_RECORD, STATUS_RECORD
from helpers.flower_messages import task_identity

KEYS = ["w", "b", "steps"]
SHAPES = [(3, 4), (4,), ()]
Z, CLIP = 1.0, 0.5  # noise std 0.5 per coordinate; a genuine report's norm stays below 0.5 + 0.5 * (4 + 10)
NODES = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]


@pytest.fixture(autouse=True)
def _task_identity(monkeypatch):
    # Messages are built outside a ServerApp process here, which would have its Flower ids set.
    # Autouse only where a test module imports it (by name): see test_strategy_wrapper.py.
    task_identity(monkeypatch)


class FakeGrid:
    """Nodes, a run id, and replies from ``client(message) -> reply or None`` for each message sent."""

    def __init__(self, nodes=NODES, client=None, run_id=7):
        self.nodes, self.client, self.sent = list(nodes), client, []

        class _Run:
            pass

        self.run = _Run()
        self.run.run_id = run_id

    def get_node_ids(self):
        return list(self.nodes)

    def send_and_receive(self, messages, *, timeout=None):
        messages = list(messages)
        self.sent.append(messages)
        replies = [self.client(m) for m in messages]
        return [r for r in replies if r is not None]


def global_arrays():
    rng = np.random.default_rng(1)
    return [rng.normal(0, 1, SHAPES[0]).astype(np.float32), rng.normal(0, 1, SHAPES[1]).astype(np.float32), np.int64(5)]


def as_record(arrays, keys=KEYS):
    return ArrayRecord({k: Array(np.array(a, order="C")) for k, a in zip(keys, arrays)})  # keeps 0-d arrays 0-d


def noisy_update(seed, scale=0.5):
    rng = np.random.default_rng(seed)
    w = rng.normal(0, scale, SHAPES[0]).astype(np.float32)
    b = rng.normal(0, scale, SHAPES[1]).astype(np.float32)
    return [w, b, np.zeros((), np.int64)]  # integer arrays travel as zeros in the model's dtype


def report(msg, update, keys=KEYS, status="report", metrics=None):
    content = RecordDict({STATUS_RECORD: ConfigRecord({"status": status})})
    if update is not None:
        content[ARRAYS_RECORD] = as_record(update, keys)
    if metrics is not None:
        content["metrics"] = MetricRecord(metrics)
    return Message(content, reply_to=msg)


def marker(msg):
    return report(msg, None, status="left")


def error_reply(msg):
    return Message(Error(code=6, reason="client failed"), reply_to=msg)


def wrap(inner=None, **kwargs):
    inner = inner if inner is not None else FedAvg(min_available_nodes=1, min_train_nodes=1)
    settings = dict(noise_multiplier=Z, clip=CLIP, run_name="run-w")
    settings.update(kwargs)
    return IndividualFilterStrategy(inner, **settings)


def _client(fail_nodes=(), leave_nodes=()):
    """Replies as devices would: a noisy update, a marker or an error."""

    def reply(msg):
        node = msg.metadata.dst_node_id
        if node in fail_nodes:
            return error_reply(msg)
        if node in leave_nodes:
            return marker(msg)
        return report(msg, noisy_update(node * 100 + msg.content["config"]["server-round"]))

    return reply
