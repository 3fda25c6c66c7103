"""One training round of ``IndividualFilterStrategy``: one object per placement, built when the round
opens and dropped once it is released, so the strategy keeps nothing of a round between Flower's calls.

Each round object is built with everything its round needs (the run's ``RoundSettings``, the
round's request, the global arrays, the training config, the grid, the inner strategy and the run's
``RunLog``) and says:

* what it asks: ``ask()``, the messages Flower's loop may send in the clear;
* what it collects: ``collect()``;
* what it releases: ``release(collected)``, a ``RoundRelease`` (the inner strategy's arrays, ``None``
  if the round is dropped, the round's public ``RoundOutcome`` and its ``PublicRoundRecord``).

``LocalRound`` (local placement) asks each sampled node for a noisy report with the inner strategy's
messages plus the round request, collects the replies through ``grid.send_and_receive``, sorts them
(``replies.tally_replies``: a bad reply never fails the round) and releases the plain mean of the
reports. ``SecureRound`` (distributed placement) asks nothing in the clear: its messages travel
inside SecAgg+'s masked-vector stage (``secagg.secure_round.run_secure_round``), which collects only
the sum of the devices' integer reports; it releases ``decode_sum(sum) * grid_step(clip) / n`` only
when the sum holds at least ``min_reports`` reports. Either way the inner strategy steps from the
released mean (``inner_strategy.inner_step``). ``open_round`` builds the one for the placement.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from fedfilter.coordinator.inner_strategy import inner_step
from fedfilter.coordinator.participation import ASKED_BEYOND_PLAN, AskCounter
from fedfilter.coordinator.replies import l2_norm, plain_mean, report_norm_bound, tally_replies
from fedfilter.coordinator.run_log import RoundOutcome, RunLog
from fedfilter.coordinator.secagg import secure_round
from fedfilter.coordinator.secagg.secure_round import AUTO_SHARES, SecureSum, released_mean
from fedfilter.protocol.adaptive_clip import (
    AdaptiveClipping,
    bit_scale,
    released_vector_spec,
    unclipped_fraction,
    update_noise_multiplier,
)
from fedfilter.protocol.request import RoundSpec
from fedfilter.protocol.rules import added_noise_std, reports_needed
from fedfilter.protocol.wire import CLIP_BIT_KEY, REPLY_DTYPE, REQUEST_RECORD, request_proto, request_record
from fedfilter.protos import fedfilter_pb2

__all__ = ["LocalRound", "RoundRelease", "RoundSettings", "SecureRound", "open_round"]


@dataclass(frozen=True)
class RoundSettings:
    """The run's settings every round of ``IndividualFilterStrategy`` uses (checked by the strategy).

    Parameters
    ----------
    noise_multiplier : float
        The accounted ``z``: the request's with a fixed clip; with adaptive clipping the report's
        ``z_eff`` (bit included), from which each round's request derives the update's ``z``.
    clip : float
        This round's ``C``.
    placement : str
        ``"local"`` or ``"distributed"``.
    min_reports : int
        The fewest reports a released distributed sum holds.
    message_ttl_s : float or None, default None
        The TTL of every train message (``None``: the inner strategy's, Flower's default).
    secagg_num_shares : int, float or str, default "auto"
        Distributed placement: the SecAgg+ neighbourhood (``secure_round.check_num_shares``).
    secagg_colluders : int, default 0
        Distributed placement: the colluders the SecAgg+ threshold leaves room for.
    adaptive : AdaptiveClipping or None, default None
        Adaptive clipping (``protocol/adaptive_clip.py``); ``None``: the clip is fixed.
    planned_asks : int, default 0
        The plan's asks per device, sent with every request: devices that sample themselves spread
        their budgets over them (0: none).
    expected_rate : float, default 1.0
        The plan's mean rate at which devices put their update in a reply: the released mean is the
        plain mean divided by it (1: the plain mean).

    Examples
    --------
    >>> s = RoundSettings(noise_multiplier=1.0, clip=0.5, placement="local", min_reports=1)
    >>> s.spec("run", 3).round_id, s.noise_std(), s.reports_needed()
    (3, 0.5, 1)
    """

    noise_multiplier: float
    clip: float
    placement: str
    min_reports: int
    message_ttl_s: float | None = None
    secagg_num_shares: int | float | str = AUTO_SHARES
    secagg_colluders: int = 0
    adaptive: AdaptiveClipping | None = None
    planned_asks: int = 0
    expected_rate: float = 1.0

    def clipped_count_stddev(self, asked: int) -> float:
        """Adaptive clipping's ``sigma_b`` for a round that asks ``asked`` devices (0: a fixed clip).

        The setting's own, or ``asked / 20`` (Andrew et al. 2021 and Flower's default).

        Parameters
        ----------
        asked : int
            The devices the round asks.

        Examples
        --------
        >>> RoundSettings(1.0, 0.5, "local", 1, adaptive=AdaptiveClipping()).clipped_count_stddev(200)
        10.0
        """
        return 0.0 if self.adaptive is None else self.adaptive.stddev_for(asked)

    def spec(self, run_id: str, round_id: int, asked: int = 1) -> RoundSpec:
        """The round request of round ``round_id`` of run ``run_id``, for a round asking ``asked`` devices.

        With adaptive clipping the request's ``z`` is the update's, ``update_noise_multiplier(z_eff,
        sigma_b)``, so that the report, bit included, carries the accounted ``z_eff``.

        Parameters
        ----------
        run_id : str
            The run the devices account under.
        round_id : int
            The server round.
        asked : int, default 1
            The devices the round asks (sets the default ``sigma_b``).

        Raises
        ------
        ValueError
            With adaptive clipping, when ``z_eff >= 2 sigma_b`` (the bit alone would cost more than a round).

        Examples
        --------
        >>> RoundSettings(1.0, 0.5, "distributed", 4).spec("r", 2).min_reports
        4
        >>> spec = RoundSettings(1.0, 0.5, "local", 1, adaptive=AdaptiveClipping()).spec("r", 2, asked=200)
        >>> spec.clipped_count_stddev, round(spec.noise_multiplier, 6)
        (10.0, 1.001252)
        """
        sigma_b = self.clipped_count_stddev(asked)
        z = update_noise_multiplier(self.noise_multiplier, sigma_b) if sigma_b else self.noise_multiplier
        return RoundSpec(
            run_id=run_id,
            round_id=int(round_id),
            noise_multiplier=z,
            clip=self.clip,
            placement=self.placement,
            min_reports=self.min_reports,
            clipped_count_stddev=sigma_b,
            planned_asks=self.planned_asks,
        )

    def noise_std(self) -> float:
        """The std of the noise each report carries (``protocol.rules.added_noise_std``).

        Examples
        --------
        >>> RoundSettings(1.0, 0.5, "distributed", 4).noise_std()
        0.25
        """
        return added_noise_std(self.noise_multiplier, self.clip, self.placement, self.min_reports)

    def reports_needed(self) -> int:
        """The fewest reports a released round holds (``protocol.rules.reports_needed``).

        Examples
        --------
        >>> RoundSettings(1.0, 0.5, "distributed", 4).reports_needed()
        4
        """
        return reports_needed(self.placement, self.min_reports)


@dataclass
class RoundRelease:
    """What one round released: the inner strategy's arrays (``None``: dropped, the model stays), the
    round's public outcome and its public record (without the server-side metrics, known later).

    Parameters
    ----------
    arrays : ArrayRecord or None
        The inner strategy's step from the released mean, in the model's keys and dtypes.
    outcome : RoundOutcome
        The round's public counts.
    record : fedfilter_pb2.PublicRoundRecord
        The round's public record.
    unclipped_fraction : float or None, default None
        Adaptive clipping: the fraction of reports within the clip the released mean estimates.

    Examples
    --------
    >>> from fedfilter.coordinator.run_log import RoundOutcome
    >>> r = RoundRelease(None, RoundOutcome(round_id=1, sampled=3, reports=2, markers=1), None)
    >>> dict(r.metrics())
    {'reports-received': 2, 'markers-received': 1, 'replies-dropped': 0, 'released': 0}
    """

    arrays: ArrayRecord | None
    outcome: RoundOutcome
    record: Any  # fedfilter_pb2.PublicRoundRecord
    unclipped_fraction: float | None = None  # adaptive clipping: the released estimate (public)

    def metrics(self) -> MetricRecord:
        """The round's train metrics in Flower's ``Result`` (public counts only).

        Examples
        --------
        >>> from fedfilter.coordinator.run_log import RoundOutcome
        >>> RoundRelease(None, RoundOutcome(round_id=1, sampled=0), None).metrics()["released"]
        0
        """
        o = self.outcome
        return MetricRecord(
            {
                "reports-received": o.reports,
                "markers-received": o.markers,
                "replies-dropped": o.dropped,
                "released": int(o.released),
            }
        )


class _Round:
    """What both placements share: the request added to the inner strategy's messages, the model's
    keys and template, and the round's public record."""

    def __init__(
        self,
        settings: RoundSettings,
        *,
        run_id: str,
        server_round: int,
        arrays: ArrayRecord,
        config: ConfigRecord,
        grid: Grid,
        inner: Strategy,
        run_log: RunLog,
        timeout: float | None = None,
        asks: AskCounter | None = None,
    ) -> None:
        self.started_at = time.time()
        self.settings, self.grid, self.inner, self.run_log, self.timeout = settings, grid, inner, run_log, timeout
        self.round_id = int(server_round)
        self.keys = list(arrays.keys())
        self.template = [arrays[k].numpy() for k in self.keys]
        # The public record repeats the training settings sent, when the config names them.
        self.request_extra: dict[str, Any] = {
            "local_epochs": _int_or_zero(config.get("local-epochs")),
            "learning_rate": _float_or_zero(config.get("lr")),
        }
        messages = list(inner.configure_train(server_round, arrays, config, grid))
        self.asked_beyond_plan: int | None = None
        if asks is not None:  # the plan's participation: which nodes, and asks counted (participation.py)
            messages, self.asked_beyond_plan = asks.take(messages, grid.get_node_ids(), round_id=self.round_id)
        self.spec = settings.spec(run_id, server_round, asked=len(messages))
        # The report vector: the model's arrays and, with adaptive clipping, the clip bit's after them.
        self.released_spec = released_vector_spec(self.spec)
        self.adaptive = self.spec.clipped_count_stddev > 0
        bit = ([CLIP_BIT_KEY], [np.zeros(1, dtype=REPLY_DTYPE)]) if self.adaptive else ([], [])
        self.report_keys, self.report_template = self.keys + bit[0], self.template + bit[1]
        # The mean's dtypes: the model's, and the bit's mean kept in float64 (as the engine keeps it).
        self.mean_template = self.template + ([np.zeros(1, dtype=np.float64)] if self.adaptive else [])
        request = request_record(self.spec)
        for msg in messages:
            content = RecordDict(dict(msg.content.items()))  # a copy: inner strategies share one RecordDict
            content[REQUEST_RECORD] = request
            msg.content = content
            if settings.message_ttl_s is not None:
                msg.metadata.ttl = float(settings.message_ttl_s)
        self.messages = messages
        self.asked = [int(m.metadata.dst_node_id) for m in messages]

    def _split(self, mean: list[np.ndarray]) -> tuple[list[np.ndarray], float | None]:
        """The released mean's model part, and with adaptive clipping the fraction of reports within
        the clip that its bit coordinate (kept in float64, as the engine keeps it) estimates
        (``adaptive_clip.unclipped_fraction``)."""
        if not self.adaptive:
            return mean, None
        c = bit_scale(self.spec.noise_multiplier, self.spec.clip, self.spec.clipped_count_stddev)
        return mean[:-1], unclipped_fraction(float(np.asarray(mean[-1], dtype=np.float64)[0]), c)

    def _step(self, carrier: Message, mean: list[np.ndarray], outcome: RoundOutcome) -> ArrayRecord:
        """Mark the round released and return the inner strategy's step from ``mean`` (divided by the
        plan's expected rate when devices sample themselves: each report carries its update with that
        probability on average)."""
        rate = self.settings.expected_rate
        if rate != 1.0:
            mean = [np.asarray(m / rate, dtype=m.dtype) for m in mean]
        outcome.released = True
        outcome.aggregate_norm = l2_norm(mean)
        # The mean's noise is divided by the rate too: the figure the norm is read against follows it.
        outcome.expected_noise_norm = self.run_log.expected_noise_norm(self.template, outcome.reports) / rate
        self.run_log.handing_mean(outcome)  # explains the inner strategy's "Received 1 results"
        return inner_step(self.inner, self.round_id, carrier, self.keys, self.template, mean)

    def _released(
        self, outcome: RoundOutcome, arrays: ArrayRecord | None, fraction: float | None = None
    ) -> RoundRelease:
        record = fedfilter_pb2.PublicRoundRecord(
            run_id=self.spec.run_id,
            round_id=outcome.round_id,
            request=request_proto(self.spec, **self.request_extra),
            clients_sampled=outcome.sampled,
            reports_received=outcome.reports,
            markers_received=outcome.markers,
            replies_dropped=outcome.dropped,
            released=outcome.released,
            aggregate_norm=outcome.aggregate_norm if math.isfinite(outcome.aggregate_norm) else 0.0,
            expected_noise_norm=outcome.expected_noise_norm,
            started_at_unix=self.started_at,
            unclipped_fraction=fraction if fraction is not None and math.isfinite(fraction) else 0.0,
        )
        if self.asked_beyond_plan is not None:
            record.metrics[ASKED_BEYOND_PLAN] = float(self.asked_beyond_plan)
        self.run_log.round(outcome, self.template)
        return RoundRelease(arrays, outcome, record, fraction)


class LocalRound(_Round):
    """A local-placement round: each sampled node asked in the clear, its noisy report checked, the
    plain mean of the reports released.

    Parameters
    ----------
    settings : RoundSettings
        The run's settings.
    run_id : str
        The run the devices account under.
    server_round : int
        The round.
    arrays : ArrayRecord
        The global model sent.
    config : ConfigRecord
        The training config the inner strategy sends.
    grid : Grid
        Flower's grid (sampling and transport).
    inner : Strategy
        The wrapped strategy: it builds the messages and steps from the released mean.
    run_log : RunLog
        The run's log (the round's outcome is logged there when released).
    timeout : float or None, default None
        How long ``collect`` waits for replies.
    asks : AskCounter or None, default None
        The run's participation: re-addresses the messages (balanced passes) and counts the asks.

    Examples
    --------
    >>> training = LocalRound(settings, run_id="r", server_round=1, arrays=arrays, config=config,
    ...                       grid=grid, inner=FedAvg(), run_log=run_log)  # doctest: +SKIP
    >>> released = training.release(training.collect())  # doctest: +SKIP
    """

    def ask(self) -> list[Message]:
        """The inner strategy's messages, each with the round request: sent in the clear.

        Returns
        -------
        list of Message
            The train messages.

        Examples
        --------
        >>> messages = training.ask()  # doctest: +SKIP
        """
        return self.messages

    def collect(self) -> list[Message]:
        """The replies to ``ask()``, through the grid.

        Returns
        -------
        list of Message
            The replies that arrived within ``timeout``.

        Examples
        --------
        >>> replies = training.collect()  # doctest: +SKIP
        """
        return list(self.grid.send_and_receive(self.messages, timeout=self.timeout))

    def release(self, replies: Iterable[Message]) -> RoundRelease:
        """The plain mean of the checked reports, or nothing below ``reports_needed``.

        Parameters
        ----------
        replies : iterable of Message
            The replies collected.

        Returns
        -------
        RoundRelease
            The inner strategy's step (``None`` if dropped), the outcome and the public record.

        Examples
        --------
        >>> released = training.release(training.collect())  # doctest: +SKIP
        >>> released.outcome.released  # doctest: +SKIP
        True
        """
        replies = list(replies)
        bound = report_norm_bound(
            clip=self.released_spec.clip,
            noise_std=added_noise_std(
                self.spec.noise_multiplier, self.spec.clip, self.spec.placement, self.spec.min_reports
            ),
            dim=sum(int(t.size) for t in self.report_template),
        )
        tally = tally_replies(replies, self.asked, self.report_keys, self.report_template, bound)
        outcome = RoundOutcome(
            round_id=self.round_id,
            sampled=len(self.asked),
            reports=len(tally.reports),
            markers=tally.markers,
            dropped=tally.dropped,
            reasons=tally.reasons,
            refusals=tally.refusals,
            refusal_texts=tally.refusal_texts,
        )
        arrays: ArrayRecord | None = None
        fraction = None
        if tally.reports and len(tally.reports) >= self.settings.reports_needed():
            mean, fraction = self._split(plain_mean(tally.reports, self.mean_template))
            first = next(m for m in replies if int(m.metadata.src_node_id) == tally.report_sources[0])
            arrays = self._step(first, mean, outcome)
        return self._released(outcome, arrays, fraction)

    def run(self) -> RoundRelease:
        """The whole round: ask, collect, release.

        Returns
        -------
        RoundRelease
            What the round released.

        Examples
        --------
        >>> released = training.run()  # doctest: +SKIP
        """
        return self.release(self.collect())

    def aggregate(self, replies: Iterable[Message]) -> RoundRelease:
        """Flower's ``aggregate_train`` for this round: release the replies Flower's loop collected.

        Parameters
        ----------
        replies : iterable of Message
            The replies to ``ask()``.

        Returns
        -------
        RoundRelease
            What the round released.

        Examples
        --------
        >>> released = training.aggregate(grid.send_and_receive(training.ask()))  # doctest: +SKIP
        """
        return self.release(replies)


class SecureRound(_Round):
    """A distributed-placement round through Flower's SecAgg+: nothing asked in the clear, only the
    sum of the reports collected, its mean released when it holds at least ``min_reports`` reports.

    Parameters
    ----------
    settings : RoundSettings
        The run's settings (``secagg_num_shares``, ``secagg_colluders`` choose the graph).
    run_id : str
        The run the devices account under.
    server_round : int
        The round.
    arrays : ArrayRecord
        The global model sent (inside the masked stage).
    config : ConfigRecord
        The training config the inner strategy sends.
    grid : Grid
        Flower's grid.
    inner : Strategy
        The wrapped strategy.
    run_log : RunLog
        The run's log.
    timeout : float or None, default None
        Each SecAgg+ stage's wait.
    asks : AskCounter or None, default None
        The run's participation (as for ``LocalRound``).

    Raises
    ------
    RuntimeError
        When the inner strategy addressed a node twice (SecAgg+ holds one vector per node).

    Examples
    --------
    >>> training = SecureRound(settings, run_id="r", server_round=1, arrays=arrays, config=config,
    ...                        grid=grid, inner=FedAvg(), run_log=run_log)  # doctest: +SKIP
    >>> training.ask()  # doctest: +SKIP
    []
    """

    def __init__(self, settings: RoundSettings, **kwargs: Any) -> None:
        super().__init__(settings, **kwargs)
        if len(set(self.asked)) != len(self.asked):
            raise RuntimeError(f"the inner strategy addressed a node twice: {sorted(self.asked)}.")

    def ask(self) -> list[Message]:
        """Nothing in the clear: the messages go inside SecAgg+'s masked-vector stage (``collect``).

        Returns
        -------
        list of Message
            Always empty.

        Examples
        --------
        >>> training.ask()  # doctest: +SKIP
        []
        """
        return []

    def collect(self) -> SecureSum:
        """SecAgg+ over the sampled nodes: the unmasked sum and its counts, never one report.

        Returns
        -------
        SecureSum
            The sum of the integer reports and the round's public counts.

        Examples
        --------
        >>> secure = training.collect()  # doctest: +SKIP
        """
        return secure_round.run_secure_round(
            self.grid,
            {int(m.metadata.dst_node_id): m.content for m in self.messages},
            server_round=self.round_id,
            min_reports=self.settings.min_reports,
            num_shares=self.settings.secagg_num_shares,
            colluders=self.settings.secagg_colluders,
            timeout=self.timeout,
        )

    def release(self, secure: SecureSum, stray: Iterable[Message] = ()) -> RoundRelease:
        """The mean of the sum when it holds at least ``min_reports`` reports; ``stray`` replies (sent
        outside SecAgg+) are dropped, never averaged.

        Parameters
        ----------
        secure : SecureSum
            What ``collect`` got.
        stray : iterable of Message, default ()
            Replies that reached the coordinator outside SecAgg+.

        Returns
        -------
        RoundRelease
            The inner strategy's step (``None`` below ``min_reports``), the outcome and the public record.

        Examples
        --------
        >>> released = training.release(training.collect())  # doctest: +SKIP
        """
        stray = list(stray)
        n = secure.reports
        outcome = RoundOutcome(
            round_id=self.round_id,
            sampled=secure.sampled,
            reports=n,
            dropped=secure.sampled - n + len(stray),
            reasons=[secure.reason] if secure.reason else [],
            refusals=secure.refusals,
        )
        if stray:
            outcome.reasons.append("a reply outside secure aggregation in a distributed round")
        arrays: ArrayRecord | None = None
        fraction = None
        mean, reason = released_mean(
            secure,
            template=self.report_template,
            clip=self.released_spec.clip,  # the devices' grid step follows the report's norm bound
            min_reports=self.settings.min_reports,
        )
        if reason:
            outcome.reasons.append(reason)
        if mean is not None:
            mean, fraction = self._split(mean)
            # No single reply exists: the first instruction carries the released mean (its metadata only).
            arrays = self._step(self.messages[0], mean, outcome)
        return self._released(outcome, arrays, fraction)

    def run(self) -> RoundRelease:
        """The whole round: SecAgg+ (its masked stage asks), then the release of the sum.

        Returns
        -------
        RoundRelease
            What the round released.

        Examples
        --------
        >>> released = training.run()  # doctest: +SKIP
        """
        return self.release(self.collect())

    def aggregate(self, replies: Iterable[Message]) -> RoundRelease:
        """Flower's ``aggregate_train`` for this round: SecAgg+ runs now; Flower's replies are strays.

        Parameters
        ----------
        replies : iterable of Message
            What Flower's loop collected for ``ask()`` (nothing, unless a node replied out of turn).

        Returns
        -------
        RoundRelease
            What the round released.

        Examples
        --------
        >>> released = training.aggregate([])  # doctest: +SKIP
        """
        return self.release(self.collect(), stray=replies)


def open_round(settings: RoundSettings, **kwargs: Any) -> LocalRound | SecureRound:
    """The round object of ``settings.placement``, built with ``kwargs`` (``LocalRound``'s parameters).

    Parameters
    ----------
    settings : RoundSettings
        The run's settings.
    **kwargs
        ``run_id``, ``server_round``, ``arrays``, ``config``, ``grid``, ``inner``, ``run_log``, ``timeout``, ``asks``.

    Examples
    --------
    >>> open_round(settings, run_id="r", server_round=1, arrays=arrays, config=config,
    ...            grid=grid, inner=FedAvg(), run_log=run_log)  # doctest: +SKIP
    """
    kind = SecureRound if settings.placement == "distributed" else LocalRound
    return kind(settings, **kwargs)


def _int_or_zero(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def _float_or_zero(value: Any) -> float:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else 0.0
