"""The device's own filter around an approved ClientApp, whatever mods the app lists.

The device runtime (``client/runtime/runner.py``) calls every approved app only through
``device_handler``: ``individual_filter_mod`` outermost (and ``secure_aggregation_mod`` before it when
the owner enables distributed placement), exactly once (``client/flower/mod_once.py``: copies the app lists
itself pass the message on), and only for the message types the owner allows: ``train`` (SecAgg+'s
stages are train messages) unless the owner adds more. ``evaluate`` stays refused by the filter mod
even then; ``query`` answers are outside the filter, so only the owner can let them through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from flwr.app import Context, Error, Message

from fedfilter.client.filter_mod import individual_filter_mod
from fedfilter.client.secagg.mod import secure_aggregation_mod
from fedfilter.protocol.flower_api import RECORD_KEY_CONFIGS, ErrorCode
from fedfilter.protocol.refusals import refusal_reason

Handler = Callable[[Message, Context], Message]

ALWAYS_ALLOWED = frozenset({"train"})
# Message categories an owner may add (`fedfilter supernode --allow-message-type`): what Flower routes.
ALLOWABLE = frozenset({"evaluate", "query"})
ERROR_CODE = ErrorCode.MOD_FAILED_PRECONDITION


def allowed_types(extra: Iterable[str] = ()) -> frozenset[str]:
    """``train`` plus the owner's additions; an unknown category is an error naming it.

    Parameters
    ----------
    extra : iterable of str, optional
        The owner's ``--allow-message-type`` values (``evaluate``, ``query``).

    Returns
    -------
    frozenset of str
        The message categories the device answers.

    Examples
    --------
    >>> sorted(allowed_types(["evaluate"]))
    ['evaluate', 'train']
    >>> allowed_types(["train"]) == ALWAYS_ALLOWED
    True
    """
    extra = [e.strip() for e in extra]
    unknown = sorted(set(extra) - ALLOWABLE - ALWAYS_ALLOWED)
    if unknown:
        raise ValueError(f"--allow-message-type must be one of {', '.join(sorted(ALLOWABLE))}. Found {unknown}.")
    return ALWAYS_ALLOWED | frozenset(extra)


def _refuse(msg: Message, reason: str) -> Message:
    return Message(Error(code=ERROR_CODE, reason=reason), reply_to=msg)


def device_handler(app: Handler, *, secure_aggregation: bool, allowed: frozenset[str] = ALWAYS_ALLOWED) -> Handler:
    """``app`` (a loaded, approved ClientApp) behind the device's gate and its own mods.

    Parameters
    ----------
    app : callable
        The approved app's handler ``(msg, context) -> Message``.
    secure_aggregation : bool
        Whether the owner enabled distributed placement (``secure_aggregation_mod`` goes first).
    allowed : frozenset of str, optional
        The message categories the device answers (``allowed_types``).

    Returns
    -------
    callable
        The handler the runtime calls for every message.

    Examples
    --------
    >>> import time
    >>> from flwr.app import Metadata, RecordDict
    >>> handler = device_handler(lambda msg, context: msg, secure_aggregation=False)
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="query")
    >>> ctx = Context(run_id=1, node_id=2, node_config={}, state=RecordDict(), run_config={})
    >>> handler(Message(RecordDict(), metadata=meta), ctx).error.reason[:50]
    'fedfilter: this device answers train messages only'
    """
    mods = ([secure_aggregation_mod] if secure_aggregation else []) + [individual_filter_mod]

    def with_mods(msg: Message, context: Context) -> Message:
        call = app
        for mod in reversed(mods):  # the first listed is the outermost, as in Flower's ClientApp
            call = _bind(mod, call)
        return call(msg, context)

    def handle(msg: Message, context: Context) -> Message:
        category = msg.metadata.message_type.split(".", 1)[0]
        if category not in allowed:
            return _refuse(
                msg,
                f"fedfilter: this device answers {', '.join(sorted(allowed))} messages only; "
                f"message type {msg.metadata.message_type!r} is refused (its owner allows more with "
                "`fedfilter supernode --allow-message-type`). Nothing was run or spent.",
            )
        if (
            not secure_aggregation
            and category == "train"
            and msg.has_content()
            and RECORD_KEY_CONFIGS in msg.content.config_records
        ):
            return _refuse(
                msg,
                refusal_reason(
                    "secagg-not-enabled",
                    "this device's owner has not enabled distributed placement (SecAgg+ rounds; "
                    "`fedfilter supernode --secure-aggregation`). Nothing was run or spent.",
                ),
            )
        return with_mods(msg, context)

    return handle


def _bind(mod: Callable[[Message, Context, Handler], Message], call_next: Handler) -> Handler:
    return lambda msg, context: mod(msg, context, call_next)
