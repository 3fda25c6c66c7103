"""Aggregation of filtered, noisy client reports: a plain mean, checked reports, public tallies.

Flower's ``FedAvg`` weights every reply by its ``num-examples`` metric, which is private here (it
is the size of a client's data and carries no noise; DESIGN.md section 1). This strategy takes a
plain mean over the valid reports instead and never reads anything from a reply but the noisy
update and its public status.

Per round (``FilteredMeanStrategy``):

* ``sample``: all nodes, or ``ceil(fraction * n)`` of them drawn without replacement.
* ``train_messages``: the model, the training settings and the round request
  (``fedfilter.client.wire.request_record``) to each sampled node.
* ``tally``: every reply is a *report* (status ``report``, one ArrayRecord with exactly the model's
  keys and shapes, the reply dtypes of ``fedfilter.client.mechanism.reply_dtype``, finite, and a norm a
  genuine noisy report can have), a *marker*
  (status ``left``, no arrays) or *dropped* (an error, anything malformed, a second reply from one
  node). A bad reply never fails the round.
* the aggregate: the mean of the reports, released only if there is at least one report, and in
  ``distributed`` placement only if at least ``min-reports`` arrived (fewer reports carry less than
  the full noise: the round is dropped, DESIGN.md section 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fedfilter.client.mechanism import reply_dtype
from fedfilter.client.release import RoundSpec
from fedfilter.client.round_rules import added_noise_std, model_step, reports_needed
from fedfilter.client.wire import (
    ARRAYS_RECORD,
    REQUEST_RECORD,
    STATUS_LEFT,
    STATUS_RECORD,
    STATUS_REPORT,
    request_record,
)

__all__ = ["FilteredMeanStrategy", "RoundTally", "classify_reply", "plain_mean", "report_norm_bound"]

# A report is noise of standard deviation s per coordinate plus at most `clip` of signal. Its norm
# exceeds clip + s (sqrt(d) + t) with probability at most exp(-t^2 / 2) (Gaussian concentration of
# the norm, a 1-Lipschitz function: Boucheron, Lugosi & Massart 2013, Theorem 5.6); t = 10 gives
# about 2e-22, so a genuine report is essentially never dropped.
_NORM_SLACK_T = 10.0


def report_norm_bound(*, clip: float, noise_std: float, dim: int) -> float:
    """The largest norm a genuine report can have (but with probability < 2e-22)."""
    return clip + noise_std * (math.sqrt(dim) + _NORM_SLACK_T)


@dataclass
class RoundTally:
    """What one round's replies amount to (public, round-level counts)."""

    reports: list[list[np.ndarray]] = field(default_factory=list)
    markers: int = 0
    dropped: int = 0
    reasons: list[str] = field(default_factory=list)  # why replies were dropped, for the log


def classify_reply(
    msg: Message, keys: Sequence[str], template: Sequence[np.ndarray], norm_bound: float
) -> tuple[str, list[np.ndarray] | None, str]:
    """``("report", arrays, "")``, ``("marker", None, "")`` or ``("dropped", None, reason)``."""
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
    norm = math.sqrt(sum(float(np.sum(np.square(a, dtype=np.float64))) for a in arrays))
    if norm > norm_bound:
        return "dropped", None, f"the report's norm {norm:.4g} exceeds what noise can explain ({norm_bound:.4g})"
    return "report", arrays, ""


def plain_mean(reports: Sequence[Sequence[np.ndarray]], template: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The unweighted mean of the reports, accumulated in float64, in the model's dtypes."""
    if not reports:
        raise ValueError("plain_mean needs at least one report. Found 0.")
    total = [np.zeros(t.shape, dtype=np.float64) for t in template]
    for report in reports:
        for acc, a in zip(total, report):
            acc += a
    return [(acc / len(reports)).astype(t.dtype) for acc, t in zip(total, template)]


@dataclass(frozen=True)
class FilteredMeanStrategy:
    """Sampling, requests and a plain-mean aggregate over filtered reports."""

    noise_multiplier: float
    clip: float
    placement: str = "local"
    min_reports: int = 1
    fraction: float = 1.0
    server_lr: float = 1.0
    ttl_s: float = 3600.0

    def __post_init__(self):
        problems = []
        for name in ("noise_multiplier", "clip", "server_lr", "ttl_s"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                problems.append(f"{name} must be a finite number > 0. Found {v!r}.")
        if not (0 < self.fraction <= 1):
            problems.append(f"fraction must be in (0, 1]. Found {self.fraction!r}.")
        if self.placement not in ("local", "distributed"):
            problems.append(f"placement must be 'local' or 'distributed'. Found {self.placement!r}.")
        if isinstance(self.min_reports, bool) or not isinstance(self.min_reports, int) or self.min_reports < 1:
            problems.append(f"min_reports must be an integer >= 1. Found {self.min_reports!r}.")
        if problems:
            raise ValueError(" ".join(problems))

    def spec(self, run_id: str, round_id: int) -> RoundSpec:
        return RoundSpec(
            run_id=run_id,
            round_id=round_id,
            noise_multiplier=self.noise_multiplier,
            clip=self.clip,
            placement=self.placement,
            min_reports=self.min_reports,
        )

    def sample(self, node_ids: Iterable[int], rng: np.random.Generator) -> list[int]:
        nodes = sorted(node_ids)
        if self.fraction >= 1 or not nodes:
            return nodes
        k = max(1, math.ceil(self.fraction * len(nodes)))
        return sorted(int(n) for n in rng.choice(nodes, size=k, replace=False))

    def train_messages(
        self,
        spec: RoundSpec,
        node_ids: Sequence[int],
        keys: Sequence[str],
        weights: Sequence[np.ndarray],
        train_config: dict,
    ) -> list[Message]:
        model = ArrayRecord({k: Array(np.array(w, order="C")) for k, w in zip(keys, weights)})
        messages = []
        for node_id in node_ids:
            content = RecordDict(
                {
                    ARRAYS_RECORD: model,
                    "config": ConfigRecord(dict(train_config)),
                    REQUEST_RECORD: request_record(spec),
                }
            )
            messages.append(
                Message(
                    content,
                    dst_node_id=int(node_id),
                    message_type=MessageType.TRAIN,
                    group_id=str(spec.round_id),
                    ttl=self.ttl_s,
                )
            )
        return messages

    def per_client_noise_std(self) -> float:
        return added_noise_std(self.noise_multiplier, self.clip, self.placement, self.min_reports)

    def tally(
        self, replies: Iterable[Message], sampled: Sequence[int], keys: Sequence[str], template: Sequence[np.ndarray]
    ) -> RoundTally:
        bound = report_norm_bound(
            clip=self.clip, noise_std=self.per_client_noise_std(), dim=sum(int(t.size) for t in template)
        )
        expected, seen = set(int(n) for n in sampled), set()
        out = RoundTally()
        for msg in replies:
            src = int(msg.metadata.src_node_id)
            if src not in expected or src in seen:
                out.dropped += 1
                out.reasons.append("a reply from a node not asked, or a second reply")
                continue
            seen.add(src)
            kind, arrays, reason = classify_reply(msg, keys, template, bound)
            if kind == "report":
                out.reports.append(arrays)
            elif kind == "marker":
                out.markers += 1
            else:
                out.dropped += 1
                out.reasons.append(reason)
        return out

    def released(self, tally: RoundTally) -> bool:
        return len(tally.reports) >= reports_needed(self.placement, self.min_reports)

    def step(self, weights: Sequence[np.ndarray], tally: RoundTally) -> tuple[list[np.ndarray], float]:
        """New weights and the noisy mean's norm; the weights unchanged if the round is dropped."""
        if not self.released(tally):
            return [w.copy() for w in weights], 0.0
        mean = plain_mean(tally.reports, weights)
        norm = math.sqrt(sum(float(np.sum(np.square(m, dtype=np.float64))) for m in mean))
        return model_step(weights, mean, self.server_lr), norm
