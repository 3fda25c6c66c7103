"""Flower messages for tests, as a SuperNode delivers them to a ClientApp.

The one place the tests set Flower's message metadata (``Metadata``: run, nodes, ids, ttl) and
Flower's process identity (``TaskIdentity``, which a Message built by server code reads; flwr 1.42 has
no public setter for it, so ``task_identity`` patches its class attributes for one test).
"""

from __future__ import annotations

import time

import pytest
from flwr.app import Message, Metadata, RecordDict
from flwr.supercore.task_identity import TaskIdentity


def delivered(
    content: RecordDict,
    *,
    message_type: str = "train",
    run_id: int = 7,
    src_node_id: int = 1,
    dst_node_id: int = 42,
    message_id: str = "m",
    group_id: str = "1",
    ttl: float = 3600.0,
) -> Message:
    """``content`` as the coordinator's message reaches node ``dst_node_id`` (sent just now)."""
    meta = Metadata(
        run_id=run_id,
        message_id=message_id,
        src_node_id=src_node_id,
        dst_node_id=dst_node_id,
        reply_to_message_id="",
        group_id=group_id,
        created_at=time.time(),
        ttl=ttl,
        message_type=message_type,
    )
    return Message(content=content, metadata=meta)


def task_identity(monkeypatch: pytest.MonkeyPatch, *, run_id: int = 7, node_id: int = 1, task_id: int = 1) -> None:
    """Give this test's process the ids a ServerApp process has (messages built outside one need them)."""
    monkeypatch.setattr(TaskIdentity, "_run_id", run_id)
    monkeypatch.setattr(TaskIdentity, "_node_id", node_id)
    monkeypatch.setattr(TaskIdentity, "_task_id", task_id)
