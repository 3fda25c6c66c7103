"""A Grid that delivers each message to an in-process ClientApp: Flower's SecAgg+ protocol (server
workflow and client mod, all four stages) runs in one process, without Ray, deterministically.

Tests use it to look at everything the coordinator receives (``received``), to drop nodes at a
chosen stage (``drop(stage, node_id) -> bool``: that node's reply is lost, as if it went offline),
and to read each node's ``Context`` afterwards. Not a simulation engine: one message at a time.
``record=False`` keeps neither list (a benchmark: a coordinator keeps no message after its round, and
thousands of retained messages a round make Python's full garbage collections more frequent and
slower, a cost no real wire has).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS, Key
from flwr.common.serde import message_from_proto, message_to_proto
from flwr.supercore.task_identity import TaskIdentity

SERVER_NODE = 1


def stage_of(message: Message) -> str:
    """The SecAgg+ stage a train message carries, or its message type."""
    # content.get, not the config_records view (Flower rebuilds that at every access)
    configs = message.content.get(RECORD_KEY_CONFIGS) if message.has_content() else None
    if isinstance(configs, ConfigRecord) and Key.STAGE in configs:
        return str(configs[Key.STAGE])
    return message.metadata.message_type


@dataclass
class _Run:
    run_id: int
    fab_id: str = ""
    fab_version: str = ""
    fab_hash: str = ""
    override_config: dict = field(default_factory=dict)


class LoopbackGrid:
    """``apps[node_id]`` answers that node's messages with ``contexts[node_id]`` (kept across stages)."""

    def __init__(
        self,
        apps: dict[int, Callable[[Message, Context], Message]],
        node_configs: dict[int, dict[str, Any]] | None = None,
        *,
        run_id: int = 7,
        drop: Callable[[str, int], bool] | None = None,
        record: bool = True,
    ) -> None:
        self.apps = dict(apps)
        self.record = record
        self.run = _Run(run_id)
        self.drop = drop or (lambda stage, nid: False)
        self.contexts = {
            nid: Context(
                run_id=run_id,
                node_id=nid,
                node_config=dict((node_configs or {}).get(nid, {})),
                state=RecordDict(),
                run_config={},
            )
            for nid in self.apps
        }
        self.sent: list[Message] = []
        self.received: list[Message] = []
        self.count = 0  # messages sent (message ids are unique with or without record)
        # Messages built by server code read the process's task identity (a ServerApp process has it).
        TaskIdentity._run_id = run_id
        TaskIdentity._node_id = SERVER_NODE
        TaskIdentity._task_id = 1

    def set_run(self, run) -> None:  # pragma: no cover - the loopback has one run
        self.run = run

    def get_node_ids(self) -> Iterable[int]:
        return list(self.apps)

    def create_message(self, content, message_type, dst_node_id, group_id, ttl=None) -> Message:
        return Message(content=content, dst_node_id=dst_node_id, message_type=message_type, group_id=group_id)

    def push_messages(self, messages):  # pragma: no cover - send_and_receive is what Flower calls
        raise NotImplementedError("LoopbackGrid delivers through send_and_receive only")

    def pull_messages(self, message_ids):  # pragma: no cover
        raise NotImplementedError("LoopbackGrid delivers through send_and_receive only")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        replies = []
        for i, msg in enumerate(messages):
            nid = int(msg.metadata.dst_node_id)
            stage = stage_of(msg)
            self.count += 1
            if self.record:
                self.sent.append(msg)
            msg.metadata.__dict__["_message_id"] = f"m{self.count}-{i}"
            msg.metadata.__dict__["_src_node_id"] = SERVER_NODE
            msg.metadata.__dict__["_run_id"] = self.run.run_id
            if nid not in self.apps:
                continue
            # Through the wire format, as in both engines: each node gets its own copy (Flower's
            # workflow shares one RecordDict among the messages of a stage, and the mod mutates it).
            delivered = message_from_proto(message_to_proto(msg))
            reply = self.apps[nid](delivered, self.contexts[nid])
            reply.metadata.__dict__["_src_node_id"] = nid
            reply.metadata.__dict__["_dst_node_id"] = SERVER_NODE
            if self.drop(stage, nid):
                continue
            reply = message_from_proto(message_to_proto(reply))
            if self.record:
                self.received.append(reply)
            replies.append(reply)
        return replies
