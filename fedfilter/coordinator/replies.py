"""Checking replies to a round request: reports, markers and dropped replies, and their plain mean.

Flower's ``FedAvg`` weights every reply by its ``num-examples`` metric, which is private here (it
is the size of a client's data and carries no noise). The coordinator never
reads anything from a reply but the noisy update and its public status:

* a *report*: status ``report``, one ArrayRecord with exactly the model's keys and shapes, the
  reply dtypes of ``fedfilter.protocol.wire.reply_dtype``, finite, and a norm a genuine noisy
  report can have (``report_norm_bound``);
* a *marker*: status ``left``, no arrays;
* *dropped*: an error, anything malformed, a reply from a node not asked, a second reply from one
  node. A bad reply never fails the round.

``fedfilter.coordinator.strategy.IndividualFilterStrategy`` (the Flower strategy wrapper) and the
simulation engine's conformance test use these functions.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from fedfilter.protocol.refusals import CODE_PATTERN, REFUSALS, refusal_code
from fedfilter.protocol.wire import ARRAYS_RECORD, STATUS_LEFT, STATUS_RECORD, STATUS_REPORT, reply_dtype

__all__ = [
    "RoundTally",
    "classify_reply",
    "plain_mean",
    "report_norm_bound",
    "tally_replies",
    "l2_norm",
    "refusal_of",
    "describe_refusals",
    "refusal_text",
    "keep_refusal_text",
]

# Refusals the coordinator recognises without a device's code (the device runs no fedfilter mod).
NO_FILTER_MOD = "no-filter-mod"
_COORDINATOR_REFUSALS = {
    NO_FILTER_MOD: (
        "replies without fedfilter's status: the device's ClientApp lacks the filter, "
        "ClientApp(mods=[individual_filter_mod])"
    ),
}

# The distinct texts of one refusal code kept per round and per run (the log names the device's own
# words, e.g. the min-noise-multiplier its owner set), and the longest shown.
MAX_REFUSAL_TEXTS = 3
MAX_REFUSAL_TEXT_CHARS = 300

# A report is noise of standard deviation s per coordinate plus at most `clip` of signal. Its norm
# exceeds clip + s (sqrt(d) + t) with probability at most exp(-t^2 / 2) (Gaussian concentration of
# the norm, a 1-Lipschitz function: Boucheron, Lugosi & Massart 2013, Theorem 5.6); t = 10 gives
# about 2e-22, so a genuine report is essentially never dropped.
_NORM_SLACK_T = 10.0


def report_norm_bound(*, clip: float, noise_std: float, dim: int) -> float:
    """The largest norm a genuine report can have (but with probability < 2e-22).

    Parameters
    ----------
    clip : float
        The round's clipping norm (the signal a report can carry).
    noise_std : float
        The noise standard deviation per coordinate.
    dim : int
        The number of released coordinates.

    Returns
    -------
    float
        ``clip + noise_std * (sqrt(dim) + 10)``.

    Examples
    --------
    >>> report_norm_bound(clip=1.0, noise_std=0.5, dim=100)
    11.0
    """
    return clip + noise_std * (math.sqrt(dim) + _NORM_SLACK_T)


@dataclass
class RoundTally:
    """What one round's replies amount to (public, round-level counts).

    Attributes
    ----------
    reports : list of list of numpy.ndarray
        The accepted reports, each in the model's key order.
    report_sources : list of int
        The node of each report, same order (kept in memory only).
    markers : int
        Replies with status ``left``.
    dropped : int
        Replies that count for nothing (errors, malformed, unasked or repeated).
    reasons : list of str
        Why replies were dropped, for the log.
    refusals : dict of str to int
        Refusal code -> number of replies (public counts).
    refusal_texts : dict of str to list of str
        Refusal code -> the distinct texts the devices sent with it (at most ``MAX_REFUSAL_TEXTS``), for
        the operator's log only: a device's refusal text depends on the request and its owner's settings.

    Examples
    --------
    >>> RoundTally(markers=2).markers
    2
    """

    reports: list[list[np.ndarray]] = field(default_factory=list)
    report_sources: list[int] = field(default_factory=list)  # node of each report, same order (in memory only)
    markers: int = 0
    dropped: int = 0
    reasons: list[str] = field(default_factory=list)  # why replies were dropped, for the log
    refusals: dict[str, int] = field(default_factory=dict)  # refusal code -> replies (public counts)
    refusal_texts: dict[str, list[str]] = field(default_factory=dict)  # code -> the devices' texts (log only)


def classify_reply(
    msg: Message, keys: Sequence[str], template: Sequence[np.ndarray], norm_bound: float
) -> tuple[str, list[np.ndarray] | None, str]:
    """``("report", arrays, "")``, ``("marker", None, "")`` or ``("dropped", None, reason)``.

    Parameters
    ----------
    msg : flwr.app.Message
        One reply.
    keys : sequence of str
        The model's array keys, in order.
    template : sequence of numpy.ndarray
        The model's arrays (their dtypes and shapes).
    norm_bound : float
        The largest norm a report may have (``report_norm_bound``).

    Returns
    -------
    tuple of (str, list of numpy.ndarray or None, str)
        The kind of reply, the report's arrays and, for a dropped reply, why.

    Examples
    --------
    >>> import time
    >>> from flwr.app import ArrayRecord, ConfigRecord, Metadata, RecordDict
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=7, dst_node_id=0, reply_to_message_id="q",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> content = RecordDict({"fedfilter.status": ConfigRecord({"status": "report"}),
    ...                       "arrays": ArrayRecord([np.full(4, 0.5, np.float32)])})
    >>> classify_reply(Message(content, metadata=meta), ["0"], [np.zeros(4, np.float32)], 10.0)
    ('report', [array([0.5, 0.5, 0.5, 0.5], dtype=float32)], '')
    >>> classify_reply(Message(content, metadata=meta), ["0"], [np.zeros(4, np.float32)], 0.5)[2]
    "the report's norm 1 exceeds what noise can explain (0.5)"
    """
    if msg.has_error():
        return "dropped", None, f"error reply (code {msg.error.code})"
    content = msg.content
    status_record = content.config_records.get(STATUS_RECORD)
    status = status_record.get("status") if status_record is not None else None
    array_records = list(content.array_records.items())
    if status == STATUS_LEFT:
        if array_records:
            return "dropped", None, "a 'left' marker that carries arrays"
        return "marker", None, ""
    if status != STATUS_REPORT:
        return "dropped", None, f"unknown status {status!r}"
    if len(array_records) != 1 or array_records[0][0] != ARRAYS_RECORD:
        return "dropped", None, f"a report must hold exactly one ArrayRecord {ARRAYS_RECORD!r}"
    record = array_records[0][1]
    if list(record.keys()) != list(keys):
        return "dropped", None, "the report's array keys differ from the model's"
    arrays = []
    for key, like in zip(keys, template):
        item, dtype = record[key], reply_dtype(like.dtype)
        if item.dtype != str(dtype) or tuple(item.shape) != like.shape:
            return "dropped", None, f"array {key!r} has dtype {item.dtype} and shape {tuple(item.shape)}"
        try:
            a = item.numpy()
        except Exception as err:  # noqa: BLE001 - malformed bytes: drop, do not fail the round
            return "dropped", None, f"array {key!r} cannot be decoded ({type(err).__name__})"
        if a.dtype != dtype or a.shape != like.shape:
            return "dropped", None, f"array {key!r} decodes to dtype {a.dtype}, shape {a.shape}"
        if not np.all(np.isfinite(a)):
            return "dropped", None, f"array {key!r} holds NaN or inf"
        arrays.append(a)
    norm = l2_norm(arrays)
    if norm > norm_bound:
        return "dropped", None, f"the report's norm {norm:.4g} exceeds what noise can explain ({norm_bound:.4g})"
    return "report", arrays, ""


def plain_mean(reports: Sequence[Sequence[np.ndarray]], template: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The unweighted mean of the reports, accumulated in float64, in the model's dtypes.

    Parameters
    ----------
    reports : sequence of sequence of numpy.ndarray
        The accepted reports (at least one).
    template : sequence of numpy.ndarray
        The model's arrays (the dtypes of the result).

    Returns
    -------
    list of numpy.ndarray
        The mean, one array per model array.

    Examples
    --------
    >>> plain_mean([[np.ones(2, np.float32)], [np.zeros(2, np.float32)]], [np.zeros(2, np.float32)])
    [array([0.5, 0.5], dtype=float32)]
    """
    if not reports:
        raise ValueError("plain_mean needs at least one report. Found 0.")
    total = [np.zeros(t.shape, dtype=np.float64) for t in template]
    for report in reports:
        for acc, a in zip(total, report):
            acc += a
    return [(acc / len(reports)).astype(t.dtype) for acc, t in zip(total, template)]


def l2_norm(arrays: Sequence[np.ndarray]) -> float:
    """The L2 norm of a list of arrays, accumulated in float64.

    Parameters
    ----------
    arrays : sequence of numpy.ndarray
        The arrays, taken together as one vector.

    Returns
    -------
    float
        Their joint L2 norm.

    Examples
    --------
    >>> l2_norm([np.array([3.0]), np.array([4.0])])
    5.0
    """
    return math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))


def tally_replies(
    replies: Iterable[Message],
    asked: Iterable[int],
    keys: Sequence[str],
    template: Sequence[np.ndarray],
    norm_bound: float,
) -> RoundTally:
    """Sort one round's replies; only the first reply of each node that was asked can count.

    Parameters
    ----------
    replies : iterable of flwr.app.Message
        The round's replies.
    asked : iterable of int
        The nodes the round asked.
    keys : sequence of str
        The model's array keys, in order.
    template : sequence of numpy.ndarray
        The model's arrays (their dtypes and shapes).
    norm_bound : float
        The largest norm a report may have (``report_norm_bound``).

    Returns
    -------
    RoundTally
        The accepted reports and the public counts.

    Examples
    --------
    >>> import time
    >>> from flwr.app import ConfigRecord, Metadata, RecordDict
    >>> def left(node):
    ...     meta = Metadata(run_id=1, message_id="m", src_node_id=node, dst_node_id=0, reply_to_message_id="q",
    ...                     group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    ...     return Message(RecordDict({"fedfilter.status": ConfigRecord({"status": "left"})}), metadata=meta)
    >>> tally = tally_replies([left(7), left(7), left(99)], [7, 8], ["0"], [np.zeros(4, np.float32)], 10.0)
    >>> tally.markers, tally.dropped
    (1, 2)
    """
    expected, seen = {int(n) for n in asked}, set()
    out = RoundTally()
    for msg in replies:
        src = int(msg.metadata.src_node_id)
        if src not in expected or src in seen:
            out.dropped += 1
            out.reasons.append("a reply from a node not asked, or a second reply")
            continue
        seen.add(src)
        kind, arrays, reason = classify_reply(msg, keys, template, norm_bound)
        if kind == "report" and arrays is not None:
            out.reports.append(arrays)
            out.report_sources.append(src)
        elif kind == "marker":
            out.markers += 1
        else:
            out.dropped += 1
            code = refusal_of(msg)
            if code is not None:
                out.refusals[code] = out.refusals.get(code, 0) + 1
                keep_refusal_text(out.refusal_texts, code, refusal_text(msg))
            else:
                out.reasons.append(reason)
    return out


def refusal_of(msg: Message) -> str | None:
    """The refusal a dropped reply stands for: the device's code (``protocol/refusals.py``), Flower's
    error code for other errors, ``no-filter-mod`` for a reply without fedfilter's status; ``None``
    for a malformed report (logged by its reason instead).

    Parameters
    ----------
    msg : flwr.app.Message
        A reply that was dropped.

    Returns
    -------
    str or None
        The refusal code, or ``None``.

    Examples
    --------
    >>> import time
    >>> from flwr.app import ArrayRecord, Metadata, RecordDict
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=7, dst_node_id=0, reply_to_message_id="q",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> refusal_of(Message(RecordDict({"arrays": ArrayRecord([np.zeros(4, np.float32)])}), metadata=meta))
    'no-filter-mod'
    """
    if msg.has_error():
        return refusal_code(msg.error.reason) or f"flower-error-{msg.error.code}"
    status_record = msg.content.config_records.get(STATUS_RECORD)
    if status_record is None:
        return NO_FILTER_MOD
    return None


def refusal_text(msg: Message) -> str:
    """What a device said with its refusal: the error reason without its ``fedfilter[<code>]: `` prefix
    (and without the ``round request refused: `` every request check begins with), cut to
    ``MAX_REFUSAL_TEXT_CHARS``; empty for a reply that is not an error.

    Parameters
    ----------
    msg : flwr.app.Message
        A dropped reply.

    Returns
    -------
    str
        The device's text.

    Examples
    --------
    >>> import time
    >>> from flwr.app import Error, Metadata
    >>> meta = Metadata(run_id=1, message_id="m", src_node_id=7, dst_node_id=0, reply_to_message_id="q",
    ...                 group_id="1", created_at=time.time(), ttl=60.0, message_type="train")
    >>> reason = "fedfilter[replay]: round request refused: round 3 was already answered."
    >>> refusal_text(Message(Error(code=6, reason=reason), metadata=meta))
    'round 3 was already answered.'
    """
    if not msg.has_error():
        return ""
    text = CODE_PATTERN.sub("", msg.error.reason or "", count=1).removeprefix("round request refused: ").strip()
    return text if len(text) <= MAX_REFUSAL_TEXT_CHARS else text[: MAX_REFUSAL_TEXT_CHARS - 3] + "..."


def keep_refusal_text(texts: dict[str, list[str]], code: str, text: str) -> None:
    """Add ``text`` to the distinct texts of ``code`` (at most ``MAX_REFUSAL_TEXTS`` kept).

    Parameters
    ----------
    texts : dict of str to list of str
        Code -> texts, updated in place.
    code : str
        The refusal code.
    text : str
        A device's text (an empty one is not kept).

    Examples
    --------
    >>> texts = {}
    >>> for t in ["a", "a", "b", "c", "d", ""]:
    ...     keep_refusal_text(texts, "replay", t)
    >>> texts
    {'replay': ['a', 'b', 'c']}
    """
    kept = texts.setdefault(code, [])
    if text and text not in kept and len(kept) < MAX_REFUSAL_TEXTS:
        kept.append(text)


def describe_refusals(counts: dict[str, int], texts: dict[str, list[str]] | None = None) -> list[str]:
    """One line per refusal code, most frequent first: ``"10 refused: not-enrolled (what it means, the fix)"``,
    each followed by a line of what the devices said with it, when ``texts`` has any (e.g. the
    ``min-noise-multiplier`` their owners set).

    Parameters
    ----------
    counts : dict of str to int
        Refusal code -> number of replies (``RoundTally.refusals``).
    texts : dict of str to list of str, optional
        Refusal code -> the devices' distinct texts (``RoundTally.refusal_texts``).

    Returns
    -------
    list of str
        One line per code, and one per code with texts.

    Examples
    --------
    >>> for line in describe_refusals({"replay": 1, "made-up": 3}, {"replay": ["round 3 was already answered."]}):
    ...     print(line)
    3 refused: made-up (unknown code)
    1 refused: replay (the round was already answered (a repeated round gets no second release))
      replay, as the devices said it: 'round 3 was already answered.'
    """
    lines = []
    for code, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        meaning = REFUSALS.get(code) or _COORDINATOR_REFUSALS.get(code)
        if meaning is None and code.startswith("flower-error-"):
            meaning = "Flower's error reply (the ClientApp raised, the reply expired or the node is gone)"
        lines.append(f"{n} refused: {code} ({meaning or 'unknown code'})")
        said = (texts or {}).get(code)
        if said:
            lines.append(f"  {code}, as the devices said it: " + " | ".join(repr(s) for s in said))
    return lines
