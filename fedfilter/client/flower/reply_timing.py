"""Hold a device's reply until a time that only the device owner's setting decides.

How long a round takes on the device depends on its data (examples x local epochs) and on its
budget state (an exhausted filter does different work). A coordinator sees that time three ways:
when the reply arrives, and the reply's ``metadata.created_at`` and ``metadata.ttl``, which
Flower sets from the clock when the reply ``Message`` is constructed (flwr 1.41,
``flwr/app/message/message.py``: ``created_at=now()``, ``ttl = request.created_at + request.ttl -
now``). Every other reply metadata field is copied from the request (run id, node and task ids,
group id, message type, reply-to id) or assigned later as the whole message's hash (message id).

So once a round has reached the device's budget ledger, its reply (a report, a marker, an error,
or an exception) is held until

    arrival + k * hold,   k = the smallest integer >= 1 such that the device's work is done,

where ``arrival`` is when the train message reached the mod and ``hold`` is the owner's
``reply-hold-s``; then the reply is rebuilt from its content, so its metadata is stamped after
the hold. A round that overruns the hold replies at the next whole multiple: the coordinator then
learns only how many whole periods the work took (``k > 1`` reveals a slow round, whether from
the device's data or its hardware), not the time itself. The device logs a warning when it
happens: its owner should raise ``reply-hold-s``.

Not covered (README, "Timing"): what happens before the message reaches the mod (process start-up,
loading the app, mods listed before this one: independent of the data, but it shows the device's
speed), the scheduler's jitter after the hold, and a device that misses its deadline.
"""

from __future__ import annotations

import gc
import logging
import math
import time
from collections.abc import Callable

from flwr.app import Message

from fedfilter.client.settings.node_config import DEFAULT_REPLY_HOLD_S

__all__ = [
    "held_deadline",
    "ReplyHold",
    "timing_protection",
]

log = logging.getLogger("fedfilter.client")


def held_deadline(arrival: float, now: float, hold: float) -> float:
    """``arrival + k * hold`` for the smallest integer ``k >= 1`` with the deadline not before ``now``.

    Parameters
    ----------
    arrival : float
        When the message reached the mod (clock seconds).
    now : float
        The time the device's work is done.
    hold : float
        The owner's ``reply-hold-s`` (positive).

    Returns
    -------
    float
        When the reply may leave.

    Examples
    --------
    >>> held_deadline(10.0, 10.5, 2.0)
    12.0
    >>> held_deadline(10.0, 12.5, 2.0)  # overran one hold: the next whole multiple
    14.0
    """
    periods = max(1, math.ceil((now - arrival) / hold))
    return arrival + periods * hold


class ReplyHold:
    """Started when a message reaches the mod; armed once the round touches the ledger.

    Parameters
    ----------
    clock : callable, optional
        Monotonic seconds (``time.monotonic``); read once here as the arrival time.
    sleep : callable, optional
        How to wait (``time.sleep``).

    Examples
    --------
    >>> now = [100.0]
    >>> hold = ReplyHold(clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    >>> hold.armed
    False
    >>> hold.arm(5.0)
    >>> hold.armed
    True
    """

    def __init__(self, *, clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep):
        self._clock, self._sleep = clock, sleep
        self.arrival = clock()
        self.hold_s = 0.0  # not armed: replies leave at once

    def arm(self, hold_s: float) -> None:
        """From here on every reply waits for the hold (``0``: timing protection off).

        Parameters
        ----------
        hold_s : float
            The owner's ``reply-hold-s`` in seconds.

        Examples
        --------
        >>> hold = ReplyHold()
        >>> hold.arm(60.0)
        >>> hold.hold_s
        60.0
        """
        self.hold_s = float(hold_s)

    @property
    def armed(self) -> bool:
        """Whether replies wait for the hold.

        Returns
        -------
        bool
            True once ``arm`` was given a positive hold.

        Examples
        --------
        >>> hold = ReplyHold()
        >>> hold.armed
        False
        >>> hold.arm(0)  # timing protection off
        >>> hold.armed
        False
        """
        return self.hold_s > 0

    def wait(self) -> None:
        """Sleep until the held deadline; a no-op unless armed.

        Examples
        --------
        >>> now = [100.0]
        >>> hold = ReplyHold(clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        >>> hold.arm(5.0)
        >>> now[0] = 103.0  # the work took 3 s
        >>> hold.wait()
        >>> now[0]
        105.0
        """
        if not self.armed:
            return
        # A collection triggered by the round's own allocations must not land after the hold:
        # emptying the young generations here (about 0.1 ms; a full collection with torch loaded
        # takes about 150 ms) leaves the reply's construction hundreds of allocations from one.
        gc.collect(1)
        deadline = held_deadline(self.arrival, self._clock(), self.hold_s)
        if deadline > self.arrival + self.hold_s:
            log.warning(
                "fedfilter: this round took longer than reply-hold-s=%g s; its reply waits "
                "until %g s after arrival, which shows the coordinator a slow round. Raise "
                "reply-hold-s.",
                self.hold_s,
                deadline - self.arrival,
            )
        while (left := deadline - self._clock()) > 0:
            self._sleep(left)

    def reply(self, reply: Message, request: Message) -> Message:
        """``reply`` itself when not armed; else the same content or error, stamped after the hold.

        Parameters
        ----------
        reply : Message
            The reply the round built.
        request : Message
            The train message it answers.

        Returns
        -------
        Message
            ``reply``, or a copy of it built after the hold.

        Examples
        --------
        >>> import time
        >>> from flwr.app import Metadata, RecordDict
        >>> meta = Metadata(run_id=1, message_id="m", src_node_id=1, dst_node_id=2, reply_to_message_id="",
        ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
        >>> request = Message(RecordDict(), metadata=meta)
        >>> answer = Message(RecordDict(), reply_to=request)
        >>> now = [100.0]
        >>> hold = ReplyHold(clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
        >>> hold.reply(answer, request) is answer  # not armed
        True
        >>> hold.arm(5.0)
        >>> held = hold.reply(answer, request)
        >>> held is answer, now[0]
        (False, 105.0)
        """
        if not self.armed:
            return reply
        self.wait()
        if reply.has_error():
            return Message(reply.error, reply_to=request)
        return Message(reply.content, reply_to=request)


def timing_protection(hold_s: float) -> str:
    """One line for a command's output and summary: is the reply hold on, and what it means.

    Parameters
    ----------
    hold_s : float
        The owner's ``reply-hold-s`` (``0``: off).

    Returns
    -------
    str
        The line.

    Examples
    --------
    >>> timing_protection(60.0)
    'on: every reply is held for a whole multiple of reply-hold-s = 60 s after its request arrived'
    >>> timing_protection(0)[:27]
    'off (reply-hold-s = 0): rep'
    """
    if hold_s > 0:
        return f"on: every reply is held for a whole multiple of reply-hold-s = {hold_s:g} s after its request arrived"
    return (
        "off (reply-hold-s = 0): reply times and metadata.created_at may reveal each device's data "
        f"size and budget state; deployed devices hold replies for {DEFAULT_REPLY_HOLD_S:g} s by default"
    )
