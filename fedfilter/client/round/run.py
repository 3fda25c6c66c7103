"""One train round on the device, stage by stage: admit, then under the ledger train and release, then reply.

From admission on, the reply depends on the ledger (budget state, replays) and on training: every
reply, refusals included, waits for the owner's hold (``client/flower/reply_timing.py``). The ledger
is held for the whole round (one message at a time per device ledger in this process), and the order
within it is the invariant: the placement's checks, training, the durable spend, and only then noise.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable

from flwr.app import Context, Message

from fedfilter.client.flower.ledger_cache import cached_ledger, forget_ledger
from fedfilter.client.flower.reply_timing import ReplyHold
from fedfilter.client.ledger.budget import BudgetLedger
from fedfilter.client.ledger.storage import (
    LedgerError,
    LedgerMissingError,
    LedgerUnavailableError,
    ReplayError,
    storage_error,
)
from fedfilter.client.release import Release
from fedfilter.client.round.admit import admit
from fedfilter.client.round.admitted import AdmittedRound
from fedfilter.client.round.placement import Placement
from fedfilter.client.round.refusal import refusal
from fedfilter.client.round.release import release_update
from fedfilter.client.round.train import train
from fedfilter.client.settings.node_config import DeviceConfig, EnrolmentMismatch
from fedfilter.protocol.request import RoundSpecError

__all__ = ["run_round"]

log = logging.getLogger("fedfilter.client")

Handler = Callable[[Message, Context], Message]


def run_round(msg: Message, context: Context, call_next: Handler, placement: Placement, hold: ReplyHold) -> Message:
    """The reply to one train message under ``placement`` (chosen by the caller, once).

    Parameters
    ----------
    msg, context : Message, Context
        The train message and the node's context, as the mod received them.
    call_next : callable
        The inner handler (the app's training).
    placement : Placement
        The round's placement.
    hold : ReplyHold
        Started when the message reached the mod; armed here once the round reaches the ledger.

    Examples
    --------
    >>> import tempfile, time
    >>> import numpy as np
    >>> from flwr.app import Array, ArrayRecord, Metadata, RecordDict
    >>> from fedfilter.client.round.placement import LocalPlacement
    >>> from fedfilter.client.settings.node_config import enrol_device
    >>> from fedfilter.protocol.request import RoundSpec
    >>> from fedfilter.protocol.wire import REQUEST_RECORD, request_record
    >>> settings = {"ledger-dir": tempfile.mkdtemp(), "client-id": "a", "budget-epsilon": 4.0,
    ...             "budget-delta": 1e-5, "reply-hold-s": 0}
    >>> _ = enrol_device(settings)
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> content = RecordDict({"arrays": ArrayRecord({"w": Array(np.zeros(3, np.float32))}),
    ...                       REQUEST_RECORD: request_record(RoundSpec("run", 1, 1.0, 1.0))})
    >>> ctx = Context(run_id=1, node_id=2, node_config=settings, state=RecordDict(), run_config={})
    >>> trained = lambda msg, ctx: Message(RecordDict({"arrays": msg.content["arrays"]}), reply_to=msg)
    >>> reply = run_round(Message(content, metadata=meta), ctx, trained, LocalPlacement(), ReplyHold())
    >>> reply.content["fedfilter.status"]["status"]
    'report'
    """
    admitted = admit(msg, context, placement)
    if isinstance(admitted, Message):  # refused before the ledger: depends on the request and settings only
        return admitted
    hold.arm(admitted.hold_s)
    released = _under_ledger(msg, context, call_next, placement, admitted)
    if isinstance(released, Message):
        return released
    return placement.reply(msg, admitted, released)


class _RefusedBeforeTraining(RoundSpecError):
    """A request the device can judge only with its ledger open, refused before any training."""


def _filtered(
    ledger: BudgetLedger, msg: Message, context: Context, call_next: Handler, placement: Placement, admitted
) -> Release | None:
    """Check, train, spend durably and noise one round; ``None`` if the round was answered before."""
    spec = admitted.spec
    if ledger.has_release(spec.run_id, spec.round_id):
        return None
    try:
        placement.check_ledger(ledger)  # refused before training: nothing spent
    except RoundSpecError as err:
        raise _RefusedBeforeTraining(str(err), code=err.code) from None
    # Always train, whatever the budget: a noise-only reply must take as long as a real one.
    update = train(call_next, msg, context, admitted)
    return release_update(ledger, admitted, placement, update)


def _under_ledger(
    msg: Message, context: Context, call_next: Handler, placement: Placement, admitted: AdmittedRound
) -> Release | Message:
    """The round's release with the device's ledger held, or the refusal (the ledger's, a replay's)."""
    device, spec = admitted.device, admitted.spec
    released = None
    for _ in range(3):  # a ledger closed by another thread between lookup and use is reopened
        try:
            key, entry = cached_ledger(device)
        except EnrolmentMismatch as err:  # the owner's settings against the enrolment: names only
            log.error("fedfilter mod: %s", err)
            return refusal(msg, "device-settings", f"{err.public} Nothing was trained, spent or released.")
        except (LedgerError, OSError, ValueError, sqlite3.Error) as err:  # fail closed until the owner acts
            log.error("fedfilter mod: cannot open the budget ledger: %s", err)
            return refusal(
                msg, _ledger_code(err), f"{_ledger_cause(device, err)}; nothing was trained, spent or released."
            )
        try:
            with entry.held():  # one message at a time per device ledger in this process
                if entry.closed:
                    continue
                released = _filtered(entry.ledger, msg, context, call_next, placement, admitted)
        except _RefusedBeforeTraining as err:
            return refusal(msg, err.code, f"{err} Nothing was trained, spent or released.")
        except ReplayError as err:  # a concurrent duplicate of this round got there first
            return refusal(msg, "replay", f"round request refused: {err}")
        except (LedgerError, sqlite3.Error) as err:  # lost spends, a full or read-only disk: nothing released
            log.error("fedfilter mod: the budget ledger failed: %s", err)
            forget_ledger(key, entry)
            return refusal(msg, _ledger_code(err), f"{_ledger_cause(device, err)}; nothing was released.")
        except BaseException:
            forget_ledger(key, entry)
            raise
        break
    if released is None:
        return refusal(
            msg,
            "replay",
            f"round request refused: round-id={spec.round_id} of run-id="
            f"{spec.run_id!r} was already answered; a repeated round gets no second release.",
        )
    return released


def _ledger_cause(device: DeviceConfig, err: BaseException) -> str:
    """What the error reply says about a ledger failure: its kind only (``LedgerError.public``), never
    paths, spends or budget; the full message goes to the device's log."""
    if isinstance(err, sqlite3.Error | OSError):
        err = storage_error(device.ledger_dir, err)
    if isinstance(err, LedgerError):
        return f"{err.public} (details in the device's log)"
    if isinstance(err, ValueError):
        return "this device's budget ledger does not match its settings (details in the device's log)"
    return f"{LedgerError.public} (details in the device's log)"


def _ledger_code(err: BaseException) -> str:
    """The refusal code of a ledger failure, by its kind (``protocol/refusals.py``)."""
    if isinstance(err, LedgerMissingError):
        return "not-enrolled"
    if isinstance(err, LedgerUnavailableError):
        return "ledger-refused"
    if isinstance(err, ValueError):
        return "device-settings"
    return "ledger-failed"
