"""The device's error reply: ``fedfilter[<code>]: <text>`` (``protocol/refusals.py``), logged on the device."""

from __future__ import annotations

import logging

from flwr.app import Error, Message

from fedfilter.protocol.flower_api import ErrorCode
from fedfilter.protocol.refusals import refusal_reason

__all__ = ["ERROR_CODE", "refusal"]

log = logging.getLogger("fedfilter.client")

# Every refusal is Flower's MOD_FAILED_PRECONDITION (6); the reason's code says more.
ERROR_CODE = ErrorCode.MOD_FAILED_PRECONDITION


def refusal(msg: Message, code: str, text: str) -> Message:
    """An error reply to ``msg`` whose reason is ``fedfilter[<code>]: <text>``.

    Parameters
    ----------
    msg : Message
        The message refused.
    code : str
        A refusal code of ``fedfilter.protocol.refusals.REFUSALS``.
    text : str
        What the coordinator is told: a function of the request and the settings only.

    Examples
    --------
    >>> import time
    >>> from flwr.app import Metadata, RecordDict
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> refusal(Message(RecordDict(), metadata=meta), "replay", "round request refused.").error.reason
    'fedfilter[replay]: round request refused.'
    """
    reason = refusal_reason(code, text)
    log.warning("fedfilter mod: %s", reason)
    return Message(Error(code=ERROR_CODE, reason=reason), reply_to=msg)
