"""A hand-driven round, without Flower's Strategy loop: for probes and tests that build raw messages.

Test scaffolding, not part of the package: the built-in ServerApp and Flower users run
``fedfilter.coordinator.strategy.IndividualFilterStrategy`` (a Flower ``Strategy`` wrapper). This
class is for code that drives rounds message by message
(``tests/cli/test_flower_simulation.py``'s probe coordinator sends deliberately bad requests, which
the wrapper refuses to build; ``tests/client/test_flower_mod.py``). It samples
``ceil(fraction * n)`` nodes, builds the train messages with the round request, tallies replies
(``fedfilter.coordinator.replies``) and steps the model ``w + server_lr * mean``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MessageType, RecordDict

from fedfilter.checks import positive_finite
from fedfilter.coordinator.replies import RoundTally, l2_norm, plain_mean, report_norm_bound, tally_replies
from fedfilter.protocol.request import PLACEMENTS, RoundSpec
from fedfilter.protocol.rules import added_noise_std, model_step, reports_needed
from fedfilter.protocol.wire import ARRAYS_RECORD, REQUEST_RECORD, request_record

__all__ = ["FilteredMeanStrategy"]


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
            if problem := positive_finite(name, getattr(self, name)):
                problems.append(problem)
        if not (0 < self.fraction <= 1):
            problems.append(f"fraction must be in (0, 1]. Found {self.fraction!r}.")
        if self.placement not in PLACEMENTS:
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
        return tally_replies(replies, sampled, keys, template, bound)

    def released(self, tally: RoundTally) -> bool:
        return len(tally.reports) >= reports_needed(self.placement, self.min_reports)

    def step(self, weights: Sequence[np.ndarray], tally: RoundTally) -> tuple[list[np.ndarray], float]:
        """New weights and the noisy mean's norm; the weights unchanged if the round is dropped."""
        if not self.released(tally):
            return [w.copy() for w in weights], 0.0
        mean = plain_mean(tally.reports, weights)
        norm = l2_norm(mean)
        return model_step(weights, mean, self.server_lr), norm
